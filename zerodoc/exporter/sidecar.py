"""The /metrics server out of the training process: a sidecar process per rank.

Every connection served from inside the training process costs it the wake-up of a thread,
the kernel's TCP work and the interpreter's (and its GIL): ~130-250 us of CPU per request on
the 2-core bench box, above issue 20 item 12's budget of 100 us (docs/reliability.md). In
sidecar mode the rank serves no connection at all:

- the rank binds and listens (so a port in use is reported by the rank, as before), then
  starts `python -m zerodoc.exporter.sidecar` (this module: standard library only, no torch,
  no prometheus_client) with the listening socket passed by descriptor (`pass_fds`);
- the rank renders nothing until a client asks. The sidecar, asked for a variant (text
  0.0.4 / OpenMetrics 1.0.0, plain / gzip, the `/metrics/exporter` page) whose file is
  older than `max_age` (1 s) or missing, writes "variant\n" to a pipe (non-blocking: a full
  pipe holds requests already) and parks the connection; the rank's publisher thread
  (`SidecarServer` below, thread `zd-metrics-pub`), blocked on that pipe with no timeout,
  renders that variant only (`page.Page` reuses what did not change), writes it as a whole
  HTTP answer to a file under /dev/shm (written beside, renamed: a reader sees the old file
  or the new one; an unchanged page gets a new mtime only), and acks "variant\n" on a
  second pipe the sidecar watches in its epoll, which then serves the parked connections.
  No fresh page within `FRESH_WAIT_S` (0.5 s: the training thread holds the GIL) means the
  last file, marked `X-Zerodoc-Page: stale` (and counted), or 503 when there is none yet. A
  flood costs the rank at most one render per variant per `max_age`; an idle sidecar costs
  it nothing;
- the sidecar accepts, reads the request, checks the credential (`webconfig.Authenticator`:
  remembered verdicts, failed logins rate-limited), and sends the file's bytes; it holds the
  connection cap (503) and the whole-request deadline itself (a parked connection too);
- what it served, by outcome, its own CPU and who scraped reach the rank through a small
  JSON file it rewrites at most 4 times a second and only when something changed, each
  time with a "stats\n" on the same pipe: the rank reads the file on that wake-up;
- at the close (`closing.CloseSignal.on_close`) the publisher is woken and publishes every
  variant of the closed page at once; `shutdown` wakes it through a pipe of its own;
- it exits when the rank is gone: PR_SET_PDEATHSIG (SIGKILL at the parent thread's death),
  a parent-pid check once a second and the end of the rank's pipe (EOF / EPIPE); the
  listening socket then closes with it. The rank sees the sidecar's exit as its pipe's EOF.

Default: the sidecar when basic auth or TLS is configured (a protected port is one meant to
be reached beyond loopback); `ZERODOC_EXPORTER_SIDECAR=1` or `0` forces it on or off. With TLS
the sidecar does the handshakes (non-blocking, a step per wake-up, under the deadline; the
certificate files re-read when they change, client certificates and `client_allowed_sans`
checked as in the rank). If the sidecar cannot start, the rank serves in-process and says so.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import select
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from . import webconfig
from .fastpath import DEFER_ACCEPT_S, MAX_HEAD, canned, defer_accept, parse_head, response_head
from .limits import (
    BUSY_RESPONSE, LIMITED_RESPONSE, OUTCOMES, Limits, Stats, name_thread, refuse,
)

ENV = "ZERODOC_EXPORTER_SIDECAR"
STATS_EVERY_S = 0.25  # the sidecar rewrites its stats file (and tells the rank) at most this often
FRESH_WAIT_S = 0.5  # a parked request waits this long for the rank's fresh page
QUIET_START_S = 5.0  # a page that cannot be rendered this soon after the start is not an error
STALE_HEADER = b"X-Zerodoc-Page: stale\r\n"  # the rank did not render in time: the last page
OWN_PATH = "/metrics/exporter"
VARIANTS = ("text", "text.gz", "om", "om.gz", "own.text", "own.om")
OM_ACCEPT = "application/openmetrics-text; version=1.0.0"
BAD_REQUEST = canned("400 Bad Request", [], "400 Bad Request\n")
NOT_ALLOWED = canned("405 Method Not Allowed", [("Allow", "GET")], "405 only GET\n")
NO_FILTER = canned("400 Bad Request", [], "400 name[] filters are not served in sidecar mode\n")
NOT_READY = canned("503 Service Unavailable", [("Retry-After", "1")], "503 page not ready\n")


def wanted(env: dict | None = None, cfg=None) -> bool:
    """Serve from a sidecar? `$ZERODOC_EXPORTER_SIDECAR` 1/0, else with basic auth or TLS."""
    raw = (env if env is not None else os.environ).get(ENV, "")
    v = raw.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    default = bool(cfg is not None and (cfg.auth or cfg.tls))
    if v:
        import warnings

        warnings.warn(f"zerodoc: ${ENV}={raw!r} is not 1/0 (true/false, yes/no, on/off); "
                      f"ignored: /metrics is served {'by a sidecar' if default else 'in-process'}"
                      " as without it", stacklevel=3)
    return default


def variant(path: str, accept: str | None, encoding: str | None) -> str:
    """Which published file answers a GET of `path` with these headers (as prometheus_client's
    choose_encoder / gzip_accepted decide, for the formats published)."""
    om = any(a.split(";")[0].strip() == "application/openmetrics-text"
             for a in (accept or "").split(","))
    if path.partition("?")[0] == OWN_PATH:
        return "own.om" if om else "own.text"
    gz = any(a.split(";")[0].strip().lower() == "gzip" for a in (encoding or "").split(","))
    return ("om" if om else "text") + (".gz" if gz else "")


# ------------------------------------------------------------------------ the sidecar process
class _Conn:
    __slots__ = ("sock", "client", "deadline", "buf", "out", "shaking", "parked", "agent")

    def __init__(self, sock, client, deadline):
        self.sock, self.client, self.deadline = sock, client, deadline
        self.buf, self.out, self.shaking = b"", None, False
        self.parked: tuple | None = None  # (variant, answered stale after) while it waits
        self.agent = ""


class Sidecar:
    """The sidecar's loop (in its own process): accept, read, check, answer from the files."""

    def __init__(self, listener: socket.socket, folder: Path, parent: int, limits: Limits,
                 cfg=None, ask_fd: int | None = None, done_fd: int | None = None,
                 max_age_s: float = 1.0):
        self.listener, self.folder, self.parent, self.limits = listener, folder, parent, limits
        # the pipes to the rank: requests ("text\n", "stats\n") out, acks ("text\n") in
        self.ask_fd, self.done_fd, self.max_age_ns = ask_fd, done_fd, int(max_age_s * 1e9)
        self.asked: dict[str, float] = {}  # variant -> when it was asked for, until its ack
        self.parked: dict[str, list] = {}  # variant -> connections waiting for its fresh page
        self.stale = 0  # answers with the last page because no fresh one came in time
        self.gone = False  # the rank's end of a pipe is closed
        self.auth = webconfig.Authenticator(cfg.users) if cfg is not None and cfg.auth else None
        self.cfg = cfg
        self.tls = webconfig.TLSContext(cfg, _complain) if cfg is not None and cfg.tls else None
        extra = list(cfg.headers.items()) if cfg is not None else []
        self.unauthorized = canned("401 Unauthorized", extra + [
            ("WWW-Authenticate", 'Basic realm="zerodoc"')], "401 Unauthorized\n")
        self.limited = canned("429 Too Many Requests", extra + [
            ("Retry-After", str(int(webconfig.FAIL_WINDOW_S)))],
            "429 Too Many Requests: too many failed logins\n")
        self.requests = dict.fromkeys(OUTCOMES, 0)
        self.scraped: dict[tuple, list] = {}  # (address, user agent) -> [pages, last page's mtime]
        self.files: dict[str, tuple] = {}  # variant -> (mtime_ns, bytes)
        self.conns: dict[int, _Conn] = {}
        self.ep = select.epoll()
        self.dirty, self.written = True, 0.0

    def serve(self) -> None:
        ls = self.listener
        ls.setblocking(False)
        self.ep.register(ls.fileno(), select.EPOLLIN)
        if self.done_fd is not None:
            os.set_blocking(self.done_fd, False)
            self.ep.register(self.done_fd, select.EPOLLIN)
        if self.ask_fd is not None:
            os.set_blocking(self.ask_fd, False)
        last_check = time.monotonic()
        while not self.gone:
            now = time.monotonic()
            nearest = min((min(c.deadline, c.parked[1]) if c.parked else c.deadline
                           for c in self.conns.values()), default=now + 1.0)
            if self.dirty:  # counts not yet written: not later than STATS_EVERY_S from now
                nearest = min(nearest, self.written + STATS_EVERY_S)
            for fd, ev in self.ep.poll(max(0.0, min(1.0, nearest - now))):
                if fd == ls.fileno():
                    self._accept()
                elif fd == self.done_fd:
                    self._rendered()
                elif fd in self.conns:
                    c = self.conns[fd]
                    if c.parked is not None:  # hung up while it waited (EPOLLHUP/ERR)
                        self._count("client_gone")
                        self._close(c)
                    elif c.shaking:
                        self._handshake(c)
                    elif c.out is not None:
                        self._write(c)
                    else:
                        self._read(c)
            now = time.monotonic()
            for c in [c for c in self.conns.values() if c.deadline <= now]:
                self._count("timed_out")
                self._close(c, shut=True)
            for c in [c for c in self.conns.values() if c.parked and c.parked[1] <= now]:
                self._answer(c, c.parked[0], stale=True)  # the rank is busy: the last page
            if now - last_check >= 1.0:
                last_check = now
                if os.getppid() != self.parent:  # the rank is gone (PDEATHSIG missed)
                    return
            if self.dirty and now - self.written >= STATS_EVERY_S:
                self._write_stats(now)

    def _count(self, outcome: str) -> None:
        self.requests[outcome] += 1
        self.dirty = True

    def _accept(self) -> None:
        while True:
            try:
                sock, addr = self.listener.accept()
            except BlockingIOError:
                return
            except OSError:  # out of descriptors: the next wake retries
                return
            if len(self.conns) >= self.limits.max_connections:
                self._count("over_capacity")
                refuse(sock, BUSY_RESPONSE)
            elif self.auth is not None and self.auth.refuse_early(addr[0]):
                self._count("rate_limited")
                refuse(sock, LIMITED_RESPONSE)
            else:
                sock.setblocking(False)
                c = _Conn(sock, addr[0], time.monotonic() + self.limits.request_deadline_s)
                self.conns[sock.fileno()] = c
                self.ep.register(sock.fileno(), select.EPOLLIN)
                if self.tls is None:
                    self._read(c)
                    continue
                try:
                    c.sock = self.tls.context().wrap_socket(sock, server_side=True,
                                                            do_handshake_on_connect=False)
                except (ssl.SSLError, OSError):
                    self._close(c)
                    continue
                c.shaking = True
                self._handshake(c)

    def _handshake(self, c: _Conn) -> None:
        """A TLS handshake, a step per wake-up (non-blocking), then the client's names."""
        try:
            c.sock.do_handshake()
        except ssl.SSLWantReadError:
            self.ep.modify(c.sock.fileno(), select.EPOLLIN)
            return
        except ssl.SSLWantWriteError:
            self.ep.modify(c.sock.fileno(), select.EPOLLOUT)
            return
        except (ssl.SSLError, OSError):  # refused (no or a bad client certificate)
            self._close(c)
            return
        if self.cfg.client_allowed_sans and not webconfig.san_allowed(c.sock, self.cfg):
            self._close(c)
            return
        c.shaking = False
        self.ep.modify(c.sock.fileno(), select.EPOLLIN)
        self._read(c)

    def _read(self, c: _Conn) -> None:
        try:
            data = c.sock.recv(MAX_HEAD + 1)
        except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
            return
        except OSError:
            data = b""
        if not data:
            self._count("client_gone")
            self._close(c)
            return
        c.buf += data
        if b"\r\n\r\n" not in c.buf:
            if len(c.buf) > MAX_HEAD:
                self._send(c, BAD_REQUEST, None)
            return  # wait for the rest, under the deadline
        head = parse_head(c.buf)
        if head is None:
            self._send(c, BAD_REQUEST, None)
            return
        method, path, headers = head
        if method != "GET":
            self._send(c, NOT_ALLOWED, None)
            return
        if "?" in path and "name[]" in path:
            self._send(c, NO_FILTER, None)
            return
        verdict = self._verdict(headers.get("authorization"), c.client)
        if verdict != "ok":
            self._send(c, self.unauthorized if verdict == "unauthorized" else self.limited,
                       verdict)
            return
        name = variant(path, headers.get("accept"), headers.get("accept-encoding"))
        c.agent = headers.get("user-agent", "")
        got = self._file(name)
        if self.ask_fd is None or (got is not None and
                                   time.time_ns() - got[0] < self.max_age_ns):
            self._answer(c, name)  # fresh enough (or no rank to ask)
            return
        now = time.monotonic()
        c.parked = (name, now + FRESH_WAIT_S)  # answered at the ack, or stale after that
        self.parked.setdefault(name, []).append(c)
        self.ep.modify(c.sock.fileno(), 0)  # only a hang-up wakes us for it now
        if now - self.asked.get(name, -1e9) >= FRESH_WAIT_S:  # not asked, or long ago
            self.asked[name] = now
            self._tell(name)

    def _tell(self, line: str) -> None:
        """A request to the rank (non-blocking: a full pipe holds requests already)."""
        try:
            os.write(self.ask_fd, line.encode() + b"\n")
        except BlockingIOError:
            pass
        except OSError:  # EPIPE: the rank's end is closed, it is gone
            self.gone = True

    def _rendered(self) -> None:
        """The rank's acks: serve the connections parked for those variants."""
        try:
            data = os.read(self.done_fd, 4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:  # EOF: the rank is gone
            self.gone = True
            return
        for name in set(data.decode("ascii", "replace").split()):
            self.asked.pop(name, None)
            for c in self.parked.pop(name, []):
                if c.parked is not None:
                    self._answer(c, name)

    def _answer(self, c: _Conn, name: str, stale: bool = False) -> None:
        """The published file of `name` (marked stale when it is), or 503 while none."""
        if c.parked is not None:
            waiting = self.parked.get(name, [])
            if c in waiting:
                waiting.remove(c)
            c.parked = None
        got = self._file(name)
        if got is None:
            self._send(c, NOT_READY, None)
            return
        mtime, answer = got
        if stale or (self.ask_fd is not None and time.time_ns() - mtime >= self.max_age_ns):
            self.stale += 1
            i = answer.find(b"\r\n") + 2
            answer = answer[:i] + STALE_HEADER + answer[i:]
        self._send(c, answer, "ok")
        if not name.startswith("own."):
            key = (c.client, c.agent)
            seen = self.scraped.get(key)
            if seen is None:
                if len(self.scraped) > 64:
                    self.scraped.pop(next(iter(self.scraped)))
                seen = self.scraped[key] = [0, 0]
            seen[0] += 1
            seen[1] = mtime

    def _verdict(self, header: str | None, client: str) -> str:
        return "ok" if self.auth is None else self.auth.header_verdict(header, client)

    def _file(self, name: str) -> tuple | None:
        path = self.folder / name
        try:
            mtime = os.stat(path).st_mtime_ns
        except OSError:
            return None
        hit = self.files.get(name)
        if hit is None or hit[0] != mtime:
            try:
                hit = self.files[name] = (mtime, path.read_bytes())
            except OSError:
                return None
        return hit

    def _send(self, c: _Conn, answer: bytes, outcome: str | None) -> None:
        if outcome is not None:
            self._count(outcome)
        c.out = memoryview(answer)
        self.ep.modify(c.sock.fileno(), select.EPOLLOUT)
        self._write(c)

    def _write(self, c: _Conn) -> None:
        try:
            sent = c.sock.send(c.out)  # non-blocking socket (no flags: a TLS one takes none)
        except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
            return
        except OSError:
            self._count("client_gone")
            self._close(c)
            return
        c.out = c.out[sent:]
        if not c.out:
            self._close(c, shut=True)

    def _close(self, c: _Conn, shut: bool = False) -> None:
        if c.parked is not None:
            waiting = self.parked.get(c.parked[0], [])
            if c in waiting:
                waiting.remove(c)
            c.parked = None
        self.conns.pop(c.sock.fileno(), None)
        try:
            self.ep.unregister(c.sock.fileno())
            if shut:
                c.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        c.sock.close()

    def _write_stats(self, now: float) -> None:
        self.dirty, self.written = False, now
        data = {"requests": self.requests, "cpu_s": time.process_time(), "pid": os.getpid(),
                "stale": self.stale,
                "scraped": [[a, ua, n, m] for (a, ua), (n, m) in self.scraped.items()]}
        _write_atomic(self.folder / "stats.json", json.dumps(data).encode())
        if self.ask_fd is not None:
            self._tell("stats")  # the rank reads it on this wake-up


def _complain(e: Exception) -> None:
    print(f"zerodoc sidecar: {e}", file=sys.stderr)


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".new")
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _die_with_parent(parent: int) -> bool:
    """SIGKILL when the parent (thread) that started us dies; False if it already has."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    return os.getppid() == parent


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m zerodoc.exporter.sidecar",
                                description="serve a rank's published /metrics page")
    p.add_argument("--fd", type=int, required=True)
    p.add_argument("--dir", required=True)
    p.add_argument("--parent", type=int, required=True)
    p.add_argument("--max-connections", type=int, default=Limits.max_connections)
    p.add_argument("--deadline", type=float, default=Limits.request_deadline_s)
    p.add_argument("--web-config", default=None)
    p.add_argument("--ask-fd", type=int, default=None, help="pipe to the rank: requests")
    p.add_argument("--done-fd", type=int, default=None, help="pipe from the rank: acks")
    p.add_argument("--max-age", type=float, default=1.0)
    a = p.parse_args(argv)
    if not _die_with_parent(a.parent):
        return 0
    name_thread("zd-sidecar")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        cfg = webconfig.load(a.web_config) if a.web_config else None
    except webconfig.WebConfigError as e:
        print(f"zerodoc sidecar: {e}", file=sys.stderr)
        return 2
    listener = socket.socket(fileno=a.fd)
    Sidecar(listener, Path(a.dir), a.parent, Limits(a.max_connections, a.deadline),
            cfg, a.ask_fd, a.done_fd, a.max_age).serve()
    return 0


# ------------------------------------------------------------------------ the rank's side
class SidecarServer:
    """What `server.serve` holds in sidecar mode: the rank's listening socket, the sidecar
    process, and the publisher thread (named `zd-metrics-pub`: its CPU is what serving
    /metrics costs the rank now, counted in `stats` as the in-process server's threads).

    The publisher blocks on the pipe from the sidecar (no timeout): it wakes for a request
    for a variant (renders that one, writes its file, acks on the second pipe), for "stats"
    (the sidecar's counts changed), for the close signal (publishes the closed page) and for
    `shutdown`; an idle sidecar costs the rank nothing."""

    def __init__(self, host: str, port: int, page, family: int, cfg=None,
                 limits: Limits | None = None, on_error=None, own_page=None,
                 max_age_s: float = 1.0):
        self.page, self.cfg, self.limits = page, cfg, limits or Limits()
        self.scheme = "https" if cfg is not None and cfg.tls else "http"
        self.max_age_s = max_age_s  # a variant is rendered at most this often (on request)
        self.own_page = own_page
        self.on_error = on_error or (lambda e: None)
        self.on_scraped = None
        self._signal = None
        self.stats = Stats()
        self.sidecar_cpu_s = 0.0
        self.stale_served = 0  # the sidecar's answers with a page older than max_age_s
        self.renders: dict[str, int] = dict.fromkeys(VARIANTS, 0)  # variant -> renders
        self.extra = list(cfg.headers.items()) if cfg is not None else []
        ls = socket.socket(family, socket.SOCK_STREAM)
        try:
            ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            ls.bind((host, port))
            ls.listen(64)
        except OSError:
            ls.close()
            raise
        self.socket = ls
        self.deferred = defer_accept(ls)
        self.server_address = ls.getsockname()
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
        self.folder = Path(tempfile.mkdtemp(prefix="zerodoc-metrics-", dir=shm))
        self._stop = False
        self._seen: dict[tuple, int] = {}
        self._last: dict[str, tuple] = {}  # variant -> what was written last
        self._tried: dict[str, float] = {}  # variant -> when it was last rendered (or tried)
        self._closed_mtime: int | None = None  # first page written after the close signal
        self._stats_mtime = 0
        self._started = time.monotonic()
        self.proc = None
        self.thread: threading.Thread | None = None
        self._ok = False  # a page was published
        # the sidecar's requests (it writes), the rank's acks (it reads), the rank's own wake
        self._ask_r, self._ask_w = os.pipe()
        self._done_r, self._done_w = os.pipe()
        self._wake_r, self._wake_w = os.pipe()
        for fd in (self._done_w, self._wake_w):
            os.set_blocking(fd, False)

    @property
    def close_signal(self):
        """closing.CloseSignal: scrapes after the close are counted; its close wakes the
        publisher, which publishes the closed page at once."""
        return self._signal

    @close_signal.setter
    def close_signal(self, signal_) -> None:
        self._signal = signal_
        if signal_ is not None and hasattr(signal_, "on_close"):
            signal_.on_close.append(self.wake)

    def wake(self) -> None:
        try:
            os.write(self._wake_w, b"w")
        except OSError:  # full (a wake is pending) or closed (shut down)
            pass

    def start(self) -> None:
        """Start the sidecar (raises OSError/RuntimeError if it cannot), then the publisher
        thread. Nothing is rendered until a client asks for a page (503 until the first one
        is ready); failures are reported once a page was published, or after
        `QUIET_START_S`."""
        cmd = [sys.executable, "-m", "zerodoc.exporter.sidecar", "--fd",
               str(self.socket.fileno()), "--dir", str(self.folder), "--parent",
               str(os.getpid()), "--max-connections", str(self.limits.max_connections),
               "--deadline", str(self.limits.request_deadline_s),
               "--ask-fd", str(self._ask_w), "--done-fd", str(self._done_r),
               "--max-age", str(self.max_age_s)]
        if self.cfg is not None and self.cfg.path is not None:
            cmd += ["--web-config", str(self.cfg.path)]
        root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ)
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"]
                                    if env.get("PYTHONPATH") else "")
        self.proc = subprocess.Popen(cmd, pass_fds=(self.socket.fileno(), self._ask_w,
                                                    self._done_r), env=env,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, close_fds=True)
        for fd in (self._ask_w, self._done_r):  # the sidecar's ends: its exit is our EOF
            os.close(fd)
        self._ask_w = self._done_r = -1
        self.thread = threading.Thread(target=self._run, name="zerodoc-metrics-pub",
                                       daemon=True)
        self.thread.start()

    @property
    def active(self) -> int:
        return 0  # connections are the sidecar's

    def publish(self, names=VARIANTS) -> None:
        """Write these variants of the page, each as a whole HTTP answer (a file rewritten
        only when its bytes changed, else its time set: the sidecar tells fresh by it)."""
        for name, accept, enc, page in (("text", None, None, self.page),
                                        ("text.gz", None, "gzip", self.page),
                                        ("om", OM_ACCEPT, None, self.page),
                                        ("om.gz", OM_ACCEPT, "gzip", self.page),
                                        ("own.text", None, None, self.own_page),
                                        ("own.om", OM_ACCEPT, None, self.own_page)):
            if page is None or name not in names:
                continue
            self._tried[name] = time.monotonic()
            self.renders[name] += 1
            body, headers = page.bake(accept, enc)
            head = response_head("200 OK", list(headers) + self.extra, len(body))
            path = self.folder / name
            old = self._mtime(path)
            key = (len(body), hash(body), head)
            if self._last.get(name) != key or not old:
                self._last[name] = key
                _write_atomic(path, head + body)
            else:
                os.utime(path)
            if name == "text" and self._closed_mtime is None and self._closing():
                self._closed_mtime = self._mtime(path)

    @staticmethod
    def _mtime(path: Path) -> int:
        try:
            return os.stat(path).st_mtime_ns
        except OSError:
            return 0

    def _closing(self) -> bool:
        return getattr(self._signal, "closed_unix", None) is not None

    def _run(self) -> None:
        name_thread("zd-metrics-pub")
        watched = self.stats.watch_thread()
        rest = b""
        try:
            while True:
                ready, _w, _x = select.select([self._ask_r, self._wake_r], [], [])
                if self._wake_r in ready:
                    os.read(self._wake_r, 4096)
                if self._stop:
                    return
                asked: set = set()
                if self._ask_r in ready:
                    data = os.read(self._ask_r, 4096)
                    if not data:  # EOF: the sidecar is gone
                        self._sidecar_gone()
                        return
                    lines = (rest + data).split(b"\n")
                    rest = lines.pop()
                    asked = {ln.decode("ascii", "replace") for ln in lines}
                self._serve_requests(asked)
                if not watched:
                    self.stats.report_thread()
        finally:
            self.stats.thread_done()

    def _serve_requests(self, asked: set) -> None:
        """Render what the sidecar asked for (each variant once; not again within half of
        max_age: a request that waited in the pipe while it was rendered), ack; the closed
        page when the close came; the stats."""
        now = time.monotonic()
        try:
            if self._closed_mtime is None and self._closing():
                self.publish()
                self._ok = True
            names = [n for n in VARIANTS if n in asked and
                     now - self._tried.get(n, -1e9) >= self.max_age_s / 2]
            try:
                if names:
                    self.publish(names)
                    self._ok = True
            finally:
                done = [n for n in VARIANTS if n in asked]
                if done:
                    try:
                        os.write(self._done_w, "\n".join(done).encode() + b"\n")
                    except OSError:  # full or closed: the sidecar answers them stale
                        pass
            if "stats" in asked:
                self.read_stats()
        except Exception as e:  # noqa: BLE001 - never into the training job
            if self._ok or now - self._started >= QUIET_START_S:
                self.on_error(e)

    def _sidecar_gone(self) -> None:
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        if self._stop:
            return
        err = (self.proc.stderr.read() or b"").decode(errors="replace").strip() \
            if code is not None else ""
        self.on_error(RuntimeError(f"/metrics sidecar exited ({code})"
                                   f"{': ' + err[-200:] if err else ''}"))

    def read_stats(self) -> None:
        """The sidecar's counts (requests by outcome, its CPU) and scrapes (closing.py)."""
        path = self.folder / "stats.json"
        mtime = self._mtime(path)
        if mtime == self._stats_mtime:
            return
        self._stats_mtime = mtime
        try:
            data = json.loads(path.read_bytes())
        except (OSError, ValueError):
            return
        self.stats.set_counts({k: int(data.get("requests", {}).get(k, 0)) for k in OUTCOMES})
        self.sidecar_cpu_s = float(data.get("cpu_s", 0.0))
        self.stale_served = int(data.get("stale", 0))
        seen = self.on_scraped
        for addr, ua, n, page_mtime in data.get("scraped", []):
            key = (addr, ua)
            if n > self._seen.get(key, 0):
                self._seen[key] = n
                closed = self._closed_mtime
                if seen is not None and (closed is None or page_mtime >= closed):
                    seen(key)

    def shutdown(self) -> None:
        self._stop = True
        self.wake()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def server_close(self) -> None:
        self.socket.close()
        for f in self.folder.glob("*"):
            try:
                f.unlink()
            except OSError:
                pass
        try:
            self.folder.rmdir()
        except OSError:
            pass
        if self.proc is not None and self.proc.stderr is not None:
            self.proc.stderr.close()
        if self.thread is not None:
            self.thread.join(timeout=5)
        for name in ("_ask_r", "_ask_w", "_done_r", "_done_w", "_wake_r", "_wake_w"):
            fd = getattr(self, name)
            if fd >= 0:
                setattr(self, name, -1)
                try:
                    os.close(fd)
                except OSError:
                    pass


if __name__ == "__main__":
    sys.exit(main())
