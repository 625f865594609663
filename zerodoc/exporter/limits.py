"""What keeps the /metrics server from reaching the training job it runs in.

The server (`server.py`) runs inside the training process: every connection it holds is a
file descriptor of that process, every CPU second it spends is taken from it (and holds its
GIL). Here:

- `Limits`: at most `max_connections` connections are handled at once; one over that is
  answered a canned `503` from the accepting thread without reading the request, and
  closed, so HTTP clients can never hold more than `max_connections` descriptors of the rank
  (the run log, the checkpoints and the collectives keep theirs). Every connection has a
  whole-request deadline (`request_deadline_s`, TLS handshake included): a client that
  trickles its request a byte at a time, or does not read the answer, is cut off then.
- `Workers`: a small pool of daemon threads that handle the connections the accepting loop
  does not answer itself (TLS, requests not whole on arrival, large answers: `fastpath.py`),
  started on demand up to the cap, leaving after a minute idle.
- `Deadlines`: one thread that shuts down connections past their deadline (idle while
  there are none).
- `name_thread`: the server's OS threads are named `zd-metrics*` (what a witness outside the
  process reads in /proc/PID/task/*/comm).
- `Stats`: requests by outcome (`catalog.EXPORTER_OUTCOMES`) and the CPU time of the server's own threads (per-thread CPU
  clocks), served as `zerodoc_exporter_requests_total` and
  `zerodoc_exporter_cpu_seconds_total`.

Standard library only (and zerodoc's catalog, itself standard library only).
"""

from __future__ import annotations

import ctypes
import queue
import socket
import threading
import time
from dataclasses import dataclass

from ..catalog import EXPORTER_OUTCOMES as OUTCOMES  # the one list (the catalog's)


def error_outcome(code: int) -> str:
    """The outcome an error answer of this HTTP status is counted under."""
    return "too_large" if code in (413, 414, 431) else "bad_request"


def _canned(status: str, body: bytes, retry_after: int) -> bytes:
    return (b"HTTP/1.0 %s\r\nContent-Type: text/plain; charset=utf-8\r\nRetry-After: %d\r\n"
            b"Connection: close\r\nContent-Length: %d\r\n\r\n%s"
            % (status.encode(), retry_after, len(body), body))


BUSY_RESPONSE = _canned("503 Service Unavailable",
                        b"503 too many connections to this rank's /metrics\n", 1)
LIMITED_RESPONSE = _canned("429 Too Many Requests", b"429 too many failed logins\n", 10)


@dataclass(frozen=True)
class Limits:
    max_connections: int = 64
    request_deadline_s: float = 10.0
    worker_idle_s: float = 60.0


class Stats:
    """Requests by outcome and the server threads' CPU seconds (each thread adds its own)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.requests = dict.fromkeys(OUTCOMES, 0)
        self._cpu_done = 0.0  # seconds of threads' CPU already added
        self._live: dict[int, float] = {}  # long-lived thread -> its CPU clock at last report
        self._clocks: dict[int, int] = {}  # long-lived thread -> its CPU clock's id (read here)

    def count(self, outcome: str, n: int = 1) -> None:
        with self._lock:
            self.requests[outcome] += n

    def set_counts(self, counts: dict) -> None:
        """Requests by outcome as counted elsewhere (the sidecar process's)."""
        with self._lock:
            self.requests.update(counts)

    def add_cpu(self, seconds: float) -> None:
        with self._lock:
            self._cpu_done += seconds

    def report_thread(self) -> None:
        """Called by a long-lived server thread: its CPU clock so far."""
        t = time.thread_time()
        with self._lock:
            self._live[threading.get_ident()] = t

    def watch_thread(self) -> bool:
        """Called once by a long-lived server thread: its CPU clock is read by `cpu_seconds`
        from then on (nothing for the thread to do per request). False where the clock of
        another thread cannot be read: the thread calls `report_thread` itself then."""
        try:
            clock = time.pthread_getcpuclockid(threading.get_ident())
            time.clock_gettime(clock)
        except (AttributeError, OSError):
            return False
        with self._lock:
            self._clocks[threading.get_ident()] = clock
        return True

    def thread_done(self) -> None:
        """Called by a watched or reporting thread as it ends: its CPU is added for good."""
        t = time.thread_time()
        me = threading.get_ident()
        with self._lock:
            self._clocks.pop(me, None)
            self._live.pop(me, None)
            self._cpu_done += t

    def cpu_seconds(self) -> float:
        with self._lock:
            for ident, clock in self._clocks.items():
                try:
                    self._live[ident] = time.clock_gettime(clock)
                except OSError:  # ended without thread_done(): its last reading stays
                    pass
            return self._cpu_done + sum(self._live.values())


def name_thread(name: str) -> None:
    """Name the calling OS thread (/proc/PID/task/TID/comm, 15 bytes), so that tools outside
    the process can tell the server's threads apart; nothing where that is not possible."""
    try:
        ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass


class Workers:
    """Daemon threads that run `handle(*job)` for accepted connections: as many as
    are busy at once (at most the cap), reused, each leaving after `idle_s` without work."""

    def __init__(self, handle, stats: Stats, idle_s: float, name: str = "zd-metrics-work"):
        self.handle, self.stats, self.idle_s, self.name = handle, stats, idle_s, name
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0
        self.threads = 0

    def submit(self, *job) -> None:
        """Run `handle(*job)` on a worker thread."""
        with self._lock:
            spawn = self._idle == 0
            if spawn:
                self.threads += 1
            else:
                self._idle -= 1
        self._jobs.put(job)
        if spawn:
            threading.Thread(target=self._run, name=self.name, daemon=True).start()

    def stop(self) -> None:
        """Idle threads leave now, busy ones after their connection."""
        for _ in range(self.threads):
            self._jobs.put(None)

    def _run(self) -> None:
        name_thread(self.name)
        last = time.thread_time()
        try:
            while True:
                try:
                    job = self._jobs.get(timeout=self.idle_s)
                    if job is None:  # stop()
                        return
                except queue.Empty:
                    with self._lock:
                        if self._idle > 0:  # nobody counted on this thread: leave
                            self._idle -= 1
                            self.threads -= 1
                            return
                    continue  # a job was handed to this thread while it timed out
                try:
                    self.handle(*job)
                finally:
                    now = time.thread_time()
                    self.stats.add_cpu(now - last)
                    last = now
                    with self._lock:
                        self._idle += 1
        finally:
            self.stats.add_cpu(time.thread_time() - last)


class Deadlines:
    """Shuts down connections still open at their deadline (one thread, started on first use)."""

    def __init__(self, stats: Stats, name: str = "zd-metrics-dead"):
        self.stats, self.name = stats, name
        self._cond = threading.Condition()
        self._open: dict[int, list] = {}  # key -> [deadline, socket]
        self._thread: threading.Thread | None = None
        self._next = 0
        self._wake_at: float | None = None  # when the thread wakes next (None: idle)
        self._stopped = False

    def add(self, sock, seconds: float) -> int:
        with self._cond:
            self._next += 1
            key = self._next
            deadline = time.monotonic() + seconds
            self._open[key] = [deadline, sock]
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            if self._wake_at is None or deadline < self._wake_at:
                self._cond.notify()  # else it wakes early enough: no wake-up per connection
            return key

    def swap(self, key: int, sock) -> None:
        """The connection is now `sock` (its TLS wrapper)."""
        with self._cond:
            if key in self._open:
                self._open[key][1] = sock

    def done(self, key: int) -> bool:
        """The connection is finished (call before closing it). False if it was cut off."""
        with self._cond:
            return self._open.pop(key, None) is not None

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()

    def _run(self) -> None:
        name_thread(self.name)
        watched = self.stats.watch_thread()
        while not self._stopped:
            with self._cond:
                now = time.monotonic()
                late = [k for k, (d, _s) in self._open.items() if d <= now]
                for k in late:
                    _d, sock = self._open.pop(k)
                    try:  # the plain socket's shutdown, under a TLS wrapper too
                        socket.socket.shutdown(sock, socket.SHUT_RDWR)
                    except OSError:
                        pass
                    self.stats.count("timed_out")
                self._wake_at = min((d for d, _s in self._open.values()), default=None)
                self._cond.wait(None if self._wake_at is None
                                else max(0.01, self._wake_at - now))
            if not watched:
                self.stats.report_thread()
        self.stats.thread_done()


def refuse(sock, response: bytes = BUSY_RESPONSE) -> None:
    """Answer `response` (503) and close, from the accepting thread: never blocks, reads
    nothing but what has already arrived (so that the close does not reset the connection
    under the answer)."""
    try:
        try:
            sock.recv(65536, socket.MSG_DONTWAIT)
        except OSError:
            pass
        # the answer and the FIN in one segment, the FIN before the close: a request that
        # arrives after the read resets the connection only once the answer is out
        sock.send(response, socket.MSG_DONTWAIT | getattr(socket, "MSG_MORE", 0))
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    finally:
        sock.close()
