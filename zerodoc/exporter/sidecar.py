"""The /metrics server out of the training process: a sidecar process per rank.

Every connection served from inside the training process costs it the wake-up of a thread,
the kernel's TCP work and the interpreter's (and its GIL): ~130-250 us of CPU per request on
the 2-core bench box, above issue 20 item 12's budget of 100 us (docs/reliability.md). In
sidecar mode the rank serves no connection at all:

- the rank binds and listens (so a port in use is reported by the rank, as before), then
  starts `python -m zerodoc.exporter.sidecar` (this module: standard library only, no torch,
  no prometheus_client) with the listening socket passed by descriptor (`pass_fds`);
- the rank renders nothing until a client asks. The sidecar, asked for a variant (text
  0.0.4 / OpenMetrics 1.0.0, plain / gzip, the `/metrics/exporter` page) not acked by the
  rank within `max_age` (1 s, on the monotonic clock: never the file's mtime against a wall
  clock NTP may step back) or missing, writes "variant\n" to a pipe (non-blocking: a full
  pipe holds requests already) and parks the connection; the rank's publisher thread
  (`SidecarServer` below, thread `zd-metrics-pub`), blocked in poll on that pipe,
  renders that variant only (`page.Page` reuses what did not change), writes it as a whole
  HTTP answer to a file under /dev/shm (written beside, renamed: a reader sees the old file
  or the new one; an unchanged page gets a new mtime only), and acks "variant\n" on a
  second pipe the sidecar watches in its epoll, which then serves the parked connections
  ("!variant": it could not be written, the last page is served marked stale; "@folder":
  the pages moved there, off a full or read-only /dev/shm).
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
  listening socket then closes with it. The rank sees the sidecar's exit as its pipe's EOF
  and starts another (`SidecarServer`: supervised, with a back-off); a fault while serving
  one connection closes that connection only (`Sidecar._fault`).

Default: the sidecar when basic auth or TLS is configured (a protected port is one meant to
be reached beyond loopback); `ZERODOC_EXPORTER_SIDECAR=1` or `0` forces it on or off. With TLS
the sidecar does the handshakes (non-blocking, a step per wake-up, under the deadline; the
certificate files re-read when they change, client certificates and `client_allowed_sans`
checked as in the rank). If the sidecar cannot start, the rank serves in-process and says so.
"""

from __future__ import annotations

import argparse
import atexit
import ctypes
import errno
import fcntl
import json
import os
import select
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from pathlib import Path

from . import webconfig
from .fastpath import (
    DEFER_ACCEPT_S, MAX_HEAD, NOT_HTTP, canned, defer_accept, head_end, looks_like_http,
    parse_head, response_head,
)
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
TOO_LARGE = canned("431 Request Header Fields Too Large", [], "431 request head too large\n")
CHECK = "\0check"  # a parked connection's "variant" while its credential waits for a check


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
    __slots__ = ("sock", "client", "deadline", "buf", "out", "shaking", "parked", "agent",
                 "outcome", "check_by")

    def __init__(self, sock, client, deadline):
        self.sock, self.client, self.deadline = sock, client, deadline
        self.buf, self.out, self.shaking = b"", None, False
        # (variant, answered stale after) while it waits for a page; (CHECK, next try)
        # while its credential waits for a check, until `check_by`
        self.parked: tuple | None = None
        self.agent = ""
        self.outcome = "ok"  # what its answer is counted as once it is out
        self.check_by = 0.0


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
        self.inodes: dict[str, int] = {}  # variant -> its file's inode when read
        self.fresh: dict[str, float] = {}  # variant -> monotonic time of the rank's last ack
        self.rest = b""  # a partial line from the rank's ack pipe
        self.complained: set = set()  # stats-file write failures said (by errno)
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
            for fd, _ev in self.ep.poll(max(0.0, min(1.0, nearest - now))):
                newest = next(reversed(self.conns), None)
                try:
                    self._dispatch(fd)
                except Exception as e:  # noqa: BLE001 - one connection never ends the sidecar
                    self._fault(self._culprit(fd, newest), e)
            now = time.monotonic()
            for c in [c for c in self.conns.values() if c.deadline <= now]:
                self._count("timed_out")
                self._close(c, shut=True)
            for c in [c for c in self.conns.values() if c.parked and c.parked[1] <= now]:
                try:
                    self._answer(c, c.parked[0], stale=True)  # the rank is busy: the last page
                except Exception as e:  # noqa: BLE001 - as above
                    self._fault(c, e)
            if now - last_check >= 1.0:
                last_check = now
                if os.getppid() != self.parent:  # the rank is gone (PDEATHSIG missed)
                    return
            if self.dirty and now - self.written >= STATS_EVERY_S:
                self._write_stats(now)

    def _dispatch(self, fd: int) -> None:
        if fd == self.listener.fileno():
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

    def _culprit(self, fd: int, newest: int | None) -> "_Conn | None":
        """The connection a fault came from: the one woken, or (the listener woken: a fault
        while a new connection was first read) the one accepted last in this wake."""
        if fd != self.listener.fileno():
            return self.conns.get(fd)
        last = next(reversed(self.conns), None)
        return self.conns[last] if last is not None and last != newest else None

    def _fault(self, c: "_Conn | None", e: Exception) -> None:
        """A fault of zerodoc's while serving one connection (a request nobody foresaw): that
        connection is closed, the fault counted by the rank (one `request:` line on stderr,
        read there: zerodoc_errors_total{hook="sidecar"}), and the loop carries on."""
        who = f" from {c.client}" if c is not None else ""
        _complain(f"a connection{who} failed: {type(e).__name__}: {e}", "request")
        if c is not None:
            try:
                self._close(c)
            except Exception:  # noqa: BLE001 - closed as far as it goes
                self.conns.pop(c.sock.fileno(), None)

    def _fresh(self, name: str) -> bool:
        """Is the published `name` young enough to serve without asking the rank? Its age is
        the time since the rank's ack for it, on this host's monotonic clock: never the file's
        mtime against the wall clock, which NTP may step back (a page then served as fresh for
        as long as the step)."""
        if self.ask_fd is None:
            return True  # no rank to ask: the file is what there is
        return time.monotonic() - self.fresh.get(name, -1e18) < self.max_age_ns / 1e9

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
            elif self.tls is not None and self.auth is not None and \
                    self.auth.refuse_early(addr[0]):  # spares a flood the handshake
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
        except OSError:  # reset
            data = None
        if not data:
            if data is not None and c.buf:  # its end came mid-head: answered (it may read)
                self._send(c, BAD_REQUEST, "bad_request")
            else:
                self._count("client_gone")
                self._close(c)
            return
        c.buf += data
        if not looks_like_http(c.buf):  # TLS on the plain port, binary: no line end comes
            self._send(c, NOT_HTTP, "bad_request")
        elif head_end(c.buf) >= 0:
            self._request(c)
        elif len(c.buf) > MAX_HEAD:
            self._send(c, TOO_LARGE, "too_large")
        # else: wait for the rest, under the deadline

    def _request(self, c: _Conn) -> None:
        """A whole request head in `c.buf`: answer it, or park it (its page, its check)."""
        head = parse_head(c.buf)
        if head is None:
            self._send(c, BAD_REQUEST, "bad_request")
            return
        method, path, headers = head
        if method != "GET":
            self._send(c, NOT_ALLOWED, "bad_request")
            return
        if "?" in path and "name[]" in path:
            self._send(c, NO_FILTER, "bad_request")
            return
        verdict = self._verdict(headers.get("authorization"), c)
        if verdict == "wait":  # its turn to be checked comes (webconfig.Authenticator)
            now = time.monotonic()
            if not c.check_by:
                c.check_by = now + webconfig.CHECK_WAIT_S
            c.parked = (CHECK, min(c.check_by, now + max(0.01, self.auth.turn_in())))
            self.ep.modify(c.sock.fileno(), 0)  # only a hang-up wakes us for it now
            return
        if verdict != "ok":
            self._send(c, self.unauthorized if verdict == "unauthorized" else self.limited,
                       verdict)
            return
        name = variant(path, headers.get("accept"), headers.get("accept-encoding"))
        c.agent = headers.get("user-agent", "")
        got = self._file(name)
        if got is not None and self._fresh(name):
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
        """The rank's acks, a line each, in order: "name" (published now: fresh from this
        moment, the parked connections served), "!name" (it could not be written: they get
        the last page, marked stale), "@folder" (the pages are written there from now on: the
        rank moved them off a full or read-only file system)."""
        try:
            data = os.read(self.done_fd, 4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:  # EOF: the rank is gone
            self.gone = True
            return
        lines = (self.rest + data).split(b"\n")
        self.rest = lines.pop()
        now = time.monotonic()
        for line in lines:
            text = line.decode("utf-8", "replace")
            if text.startswith("@"):
                self.folder, self.files = Path(text[1:]), {}
                continue
            failed = text.startswith("!")
            name = text.lstrip("!")
            if not name:
                continue
            self.asked.pop(name, None)
            if not failed:
                self.fresh[name] = now
            for c in self.parked.pop(name, []):
                if c.parked is not None:
                    try:
                        self._answer(c, name, stale=failed)
                    except Exception as e:  # noqa: BLE001 - as in serve
                        self._fault(c, e)

    def _answer(self, c: _Conn, name: str, stale: bool = False) -> None:
        """The published file of `name` (marked stale when it is), or 503 while none. `name`
        CHECK: a credential's turn to be checked may have come (the serve loop's call at the
        time it parked for); 429 once it waited `webconfig.CHECK_WAIT_S`."""
        if name == CHECK:
            c.parked = None
            if time.monotonic() >= c.check_by:
                self.auth.leave(c)
                self._send(c, self.limited, "rate_limited")
            else:
                self._request(c)
            return
        if c.parked is not None:
            waiting = self.parked.get(name, [])
            if c in waiting:
                waiting.remove(c)
            c.parked = None
        got = self._file(name)
        if got is None:
            self._send(c, NOT_READY, "not_ready")
            return
        mtime, answer = got
        if stale or not self._fresh(name):
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

    def _verdict(self, header: str | None, c: _Conn) -> str:
        """The Authenticator's `attempt` (never blocks the loop: "wait" for a turn)."""
        return "ok" if self.auth is None else self.auth.header_attempt(header, c.client, c)

    def _file(self, name: str) -> tuple | None:
        path = self.folder / name
        try:
            st = os.stat(path)
        except OSError:
            return None
        hit = self.files.get(name)
        if hit is None or hit[0] != st.st_mtime_ns or self.inodes.get(name) != st.st_ino:
            try:  # a new file (written beside, renamed) has a new inode whatever the clock
                hit = self.files[name] = (st.st_mtime_ns, path.read_bytes())
                self.inodes[name] = st.st_ino
            except OSError:
                return None
        return hit

    def _send(self, c: _Conn, answer: bytes, outcome: str) -> None:
        """Send `answer`; once it is out it is counted as `outcome` (a client gone before:
        `client_gone`, one cut off: `timed_out`; one count a connection)."""
        c.outcome = outcome
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
            self._count(c.outcome)
            self._close(c, shut=True)

    def _close(self, c: _Conn, shut: bool = False) -> None:
        if self.auth is not None:
            self.auth.leave(c)  # its place among the credentials waiting for a check
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
        """The counts to the rank (a file it reads at the "stats" line). A full or read-only
        file system: said once (per errno), retried at the next interval, the sidecar serves
        on; the rank moves the folder when its own writes fail there too."""
        self.written = now
        data = {"requests": self.requests, "cpu_s": time.process_time(), "pid": os.getpid(),
                "stale": self.stale,
                "scraped": [[a, ua, n, m] for (a, ua), (n, m) in self.scraped.items()]}
        try:
            _write_atomic(self.folder / "stats.json", json.dumps(data).encode())
        except OSError as e:
            if e.errno not in self.complained:
                self.complained.add(e.errno)
                _complain(f"cannot write its counts in {self.folder}: {e.strerror or e}",
                          "stats")
            return
        self.dirty = False
        if self.ask_fd is not None:
            self._tell("stats")  # the rank reads it on this wake-up


def _complain(e, kind: str = "tls") -> None:
    """One line to the rank (our stderr, a pipe it drains while we run): "kind: text", kind
    `tls` (webconfig.TLSContext's: the certificate files, counted as the in-process server
    counts them) or `request` / `stats` (counted under the sidecar's own hook). Non-blocking
    (main() sets it so): a rank too busy to read loses lines, the sidecar never waits."""
    line = (f"{kind}: " + " ".join(str(e).split())[:400] + "\n").encode("utf-8", "replace")
    try:
        os.write(2, line)
    except OSError:  # full (the rank is busy) or closed (it is gone)
        pass


def _write_atomic(path: Path, data: bytes) -> None:
    """Write beside, then rename: a reader sees the old file or the new one. A failed write
    (ENOSPC) leaves neither a partial file nor the `.new` one (it would hold the space)."""
    tmp = path.with_name(path.name + ".new")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _die_with_parent(parent: int) -> bool:
    """SIGKILL when the parent (thread) that started us dies; False if it already has."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    return os.getppid() == parent


def off_the_ranks_cores() -> set:
    """Run on the cores the rank is not pinned to (numactl, taskset, a launcher's
    --cpu-bind: the sidecar inherits the pinning) where the machine (and its cpuset) has any:
    its TLS handshakes and password checks, before any authentication, then never take the
    training's cores. An unpinned rank's sidecar keeps every core, as the rank does. Not
    SCHED_IDLE: behind a rank that keeps its core busy it would never run, and scrapes time
    out. Returns the cores it runs on."""
    try:
        pinned = os.sched_getaffinity(0)
        others = set(range(os.cpu_count() or 1)) - pinned
        if others:
            os.sched_setaffinity(0, others)  # EINVAL: none of them is in our cpuset
        return os.sched_getaffinity(0)
    except (AttributeError, OSError):
        return set()


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
    p.add_argument("--own-stderr", action="store_true",
                   help="stderr is a pipe of our own, drained by the rank: made non-blocking")
    a = p.parse_args(argv)
    # Ctrl-C in a terminal is the rank's to handle (it tells us to exit at its shutdown); we
    # run in a session of our own too, so a terminal's SIGINT does not reach us at all
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if not _die_with_parent(a.parent):
        return 0
    name_thread("zd-sidecar")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    if a.own_stderr:  # never a description shared with others (a terminal's, pytest's)
        os.set_blocking(2, False)  # our complaints never wait for a busy rank (_complain)
    off_the_ranks_cores()
    try:
        cfg = webconfig.load(a.web_config) if a.web_config else None
    except webconfig.WebConfigError as e:
        _complain(e, "config")
        return 2
    listener = socket.socket(fileno=a.fd)
    Sidecar(listener, Path(a.dir), a.parent, Limits(a.max_connections, a.deadline),
            cfg, a.ask_fd, a.done_fd, a.max_age).serve()
    return 0


# ------------------------------------------------------------------------ the rank's side
FOLDER_PREFIX = "zerodoc-metrics-"  # + the rank's pid + "-" + random: a sweep tells whose
RESTART_BACKOFF_S = (0.0, 0.5, 1.0, 2.0, 4.0, 8.0)  # after the 1st, 2nd, ... exit in a row
STEADY_S = 60.0  # a sidecar that ran this long: its exit is the first in a row again
SPAWN_TRIES = 3  # restarts in a row that cannot start the process: the port is given up
MOVE_ERRNOS = frozenset({errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EACCES, errno.EPERM,
                         errno.ENOENT, errno.EIO})  # a page write failing so: another folder


def folder_places() -> list[str]:
    """Where the pages are written, in order of preference: /dev/shm (memory, no disk), then
    the temporary directory ($TMPDIR, /tmp): a full or read-only /dev/shm (Docker's is 64 MB,
    and NCCL uses it) moves them there."""
    places = ["/dev/shm"] if os.path.isdir("/dev/shm") else []
    tmp = tempfile.gettempdir()
    return places + ([tmp] if tmp not in places else [])


def sweep(places) -> list[str]:
    """Remove the page folders of ranks that are gone (a rank killed with -9 cannot remove its
    own, nor can its sidecar, killed with it): `zerodoc-metrics-<pid>-*` whose lock is free.
    The lock (flock on `lock`, held by the live rank) and not the pid decides where it exists:
    a rank in another pid namespace sharing /dev/shm holds it too. Returns what it removed."""
    removed = []
    for place in places:
        try:
            entries = list(os.scandir(place))
        except OSError:
            continue
        for entry in entries:
            parts = entry.name[len(FOLDER_PREFIX):].split("-", 1)
            if not entry.name.startswith(FOLDER_PREFIX) or not parts[0].isdigit() or \
                    int(parts[0]) == os.getpid() or not _owner_gone(entry.path, int(parts[0])):
                continue
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry.path)
    return removed


def _owner_gone(folder: str, pid: int) -> bool:
    try:
        fd = os.open(os.path.join(folder, "lock"), os.O_RDWR)
    except FileNotFoundError:  # no lock (yet): by the pid alone
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except OSError:  # EPERM: alive, another user's
            pass
        return False
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:  # held: its rank lives
        return False
    finally:
        os.close(fd)


def _cause(code: int | None, said: list[str]) -> str:
    """How the sidecar ended, in words: the signal or the status, and its last line that is
    neither a traceback's framing nor a complaint already counted (e.g. `ValueError: ...`)."""
    if code is None:
        how = "ended"
    elif code < 0:
        try:
            how = f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            how = f"was killed by signal {-code}"
    else:
        how = f"exited with status {code}"
    words = [ln for ln in said if ln.strip() and not ln[:1].isspace() and
             not ln.startswith("Traceback ") and ln.split(":", 1)[0] not in ("tls", "request",
                                                                             "stats")]
    return how + (f" ({words[-1][:300]})" if words else "")


_LIVE: "weakref.WeakSet" = weakref.WeakSet()  # this process's sidecar servers


def _in_forked_child() -> None:
    """A process forked from the rank (a DataLoader worker) holds none of the server's
    descriptors: the port is the rank's alone, freed when the rank goes."""
    for srv in list(_LIVE):
        srv._forget()


def _at_exit() -> None:
    """A rank that exits without shutting its server down (no close()) stops and reaps its
    sidecar first: else it dies of PDEATHSIG after the rank and lingers as a zombie under a
    parent that does not reap (a container's PID 1)."""
    for srv in list(_LIVE):
        srv.shutdown()
        srv.server_close()


os.register_at_fork(after_in_child=_in_forked_child)
atexit.register(_at_exit)  # before the monitor's (atexit is LIFO: it closes first)


class SidecarExit(RuntimeError):
    """The sidecar process ended (or could not start again): counted, said once."""


class SidecarServer:
    """What `server.serve` holds in sidecar mode: the rank's listening socket, the sidecar
    process, and the publisher thread (named `zd-metrics-pub`: its CPU is what serving
    /metrics costs the rank now, counted in `stats` as the in-process server's threads).

    The publisher sleeps in poll() on the pipes from the sidecar (no timeout): it wakes for a
    request for a variant (renders that one, writes its file, acks on the second pipe), for
    "stats" (the sidecar's counts changed), for a line on the sidecar's stderr (drained as it
    comes: a complaint, counted), for the close signal (publishes the closed page) and for
    `shutdown`; an idle sidecar costs the rank nothing. It supervises the sidecar: an exit is
    seen at once (the pipe's end), reaped, counted and said once with its cause
    (`on_sidecar`), and the sidecar started again after `RESTART_BACKOFF_S` (the listening
    socket, kept by the rank, holds the connections meanwhile); a sidecar that cannot be
    started `SPAWN_TRIES` times in a row gives the port up (scrapes refused, not left
    unanswered). A page write that fails (full or read-only file system) moves the pages to
    the next of `places` (`folder_places`)."""

    def __init__(self, host: str, port: int, page, family: int, cfg=None,
                 limits: Limits | None = None, on_error=None, own_page=None,
                 max_age_s: float = 1.0, on_sidecar=None, places=None):
        self.page, self.cfg, self.limits = page, cfg, limits or Limits()
        self.scheme = "https" if cfg is not None and cfg.tls else "http"
        self.max_age_s = max_age_s  # a variant is rendered at most this often (on request)
        self.own_page = own_page
        self.on_error = on_error or (lambda e: None)  # the certificate files, renders
        self.on_sidecar = on_sidecar or self.on_error  # its exits, faults, folder moves
        self.places = list(places) if places is not None else folder_places()
        self.on_scraped = None
        self._signal = None
        self.stats = Stats()
        self.sidecar_cpu_s = 0.0
        self.stale_served = 0  # the sidecar's answers with a page older than max_age_s
        self.renders: dict[str, int] = dict.fromkeys(VARIANTS, 0)  # variant -> renders
        self.exits = 0  # the sidecar's exits seen (each followed by a restart)
        self.moves = 0  # the pages moved to another folder
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
        self.folder: Path | None = None
        self._lock_fd = -1
        self._owner = os.getpid()
        self._stop = self._closed = False
        self._seen: dict[tuple, int] = {}
        self._last: dict[str, tuple] = {}  # variant -> what was written last
        self._tried: dict[str, float] = {}  # variant -> when it was last rendered (or tried)
        self._failed: set = set()  # variants whose last write failed
        self._lines: list[str] = []  # "@folder" lines for the next ack
        self._closed_mtime: int | None = None  # first page written after the close signal
        self._stats_mtime = 0
        self._started = time.monotonic()
        self.proc = None
        self.thread: threading.Thread | None = None
        self._ok = False  # a page was published
        self._spawned = 0.0
        self._in_row = 0  # exits (or failed starts) in a row: the back-off's step
        self._spawn_failures = 0
        self._restart_at: float | None = None
        self._said: list[str] = []  # the sidecar's last stderr lines (its last words)
        self._err_rest = self._rest = b""  # partial lines of its stderr, of its requests
        self._base = dict.fromkeys(OUTCOMES, 0)  # counts of the sidecars that ended
        self._now = dict.fromkeys(OUTCOMES, 0)  # the running sidecar's
        self._base_cpu = self._now_cpu = 0.0
        self._base_stale = self._now_stale = 0
        # the sidecar's requests (it writes), the rank's acks (it reads), its stderr (drained),
        # the rank's own wake
        self._ask_r = self._done_w = self._err_r = -1
        self._spawning: tuple = ()  # a sidecar's pipe ends while it is being started
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        _LIVE.add(self)

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
        """Remove dead ranks' folders, make ours (OSError: no place takes a file), start the
        publisher thread, which starts the sidecar (OSError/RuntimeError here when it cannot)
        and so is the thread its PDEATHSIG watches: the sidecar lives as long as the
        publisher, whatever thread called this. Nothing is rendered until a client asks for a
        page (503 until the first one is ready); failures are reported once a page was
        published, or after `QUIET_START_S`."""
        sweep(self.places)
        self._make_folder(self.places)
        started, failed = threading.Event(), []

        def run() -> None:
            try:
                self._spawn()
            except Exception as e:  # noqa: BLE001 - raised in start()
                failed.append(e)
                return
            finally:
                started.set()
            self._run()

        self.thread = threading.Thread(target=run, name="zerodoc-metrics-pub", daemon=True)
        self.thread.start()
        started.wait()
        if failed:
            raise failed[0]

    def _make_folder(self, places) -> None:
        """A fresh folder for the pages in the first of `places` that takes a file (a probe
        written and removed), locked (`sweep`); the old one removed. OSError if none does."""
        err: OSError | None = None
        for place in places:
            folder = None
            try:
                folder = Path(tempfile.mkdtemp(prefix=f"{FOLDER_PREFIX}{os.getpid()}-",
                                               dir=place))
                lock = os.open(folder / "lock", os.O_RDWR | os.O_CREAT, 0o600)
                fcntl.flock(lock, fcntl.LOCK_EX)
                _write_atomic(folder / "probe", b"\0" * 4096)  # a page's worth: ENOSPC here
                os.unlink(folder / "probe")
            except OSError as e:
                err = e
                if folder is not None:
                    shutil.rmtree(folder, ignore_errors=True)
                continue
            old, old_lock = self.folder, self._lock_fd
            self.folder, self._lock_fd = folder, lock
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
                os.close(old_lock)
            return
        raise err or OSError(errno.ENOENT, "no folder for the /metrics pages")

    def _move(self, e: OSError) -> bool:
        """The pages could not be written in the folder (full, read-only, removed): into a
        new one, in the other places first; the sidecar told with the ack ("@folder")."""
        old = self.folder
        here = str(old.parent) if old is not None else None
        try:
            self._make_folder([p for p in self.places if p != here] + [here])
        except OSError:
            return False
        self._lines.append(f"@{self.folder}")
        self._last.clear()
        self.moves += 1
        self.on_sidecar(RuntimeError(f"/metrics pages cannot be written in {old} "
                                     f"({e.strerror or e}); moved to {self.folder}"))
        return True

    def _spawn(self) -> None:
        """Start a sidecar on the listening socket, with fresh pipes (OSError/RuntimeError
        when it cannot start). In a session of its own: a terminal's Ctrl-C is the rank's."""
        ask_r, ask_w = os.pipe()
        done_r, done_w = os.pipe()
        self._spawning = (ask_r, ask_w, done_r, done_w)
        cmd = [sys.executable, "-m", "zerodoc.exporter.sidecar", "--fd",
               str(self.socket.fileno()), "--dir", str(self.folder), "--parent",
               str(os.getpid()), "--max-connections", str(self.limits.max_connections),
               "--deadline", str(self.limits.request_deadline_s),
               "--ask-fd", str(ask_w), "--done-fd", str(done_r),
               "--max-age", str(self.max_age_s), "--own-stderr"]
        if self.cfg is not None and self.cfg.path is not None:
            cmd += ["--web-config", str(self.cfg.path)]
        root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ)
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"]
                                    if env.get("PYTHONPATH") else "")
        try:
            proc = subprocess.Popen(cmd, pass_fds=(self.socket.fileno(), ask_w, done_r),
                                    env=env, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                    close_fds=True, start_new_session=True)
        except BaseException:
            for fd in self._spawning:
                os.close(fd)
            self._spawning = ()
            raise
        for fd in (ask_w, done_r):  # the sidecar's ends: its exit is our EOF
            os.close(fd)
        self._spawning = ()
        os.set_blocking(done_w, False)
        os.set_blocking(proc.stderr.fileno(), False)
        self._close_pipes()
        self.proc, self._ask_r, self._done_w = proc, ask_r, done_w
        self._err_r = proc.stderr.fileno()
        self._spawned = time.monotonic()
        self._said, self._err_rest, self._rest = [], b"", b""
        if self.folder is not None:
            self._lines = [ln for ln in self._lines if not ln.startswith("@")]  # it has it

    def _close_fds(self, *names: str) -> None:
        """Close the descriptors held in these attributes (each set to -1 first: once)."""
        for name in names:
            fd = getattr(self, name)
            if fd >= 0:
                setattr(self, name, -1)
                try:
                    os.close(fd)
                except OSError:
                    pass

    def _close_pipes(self) -> None:
        self._close_fds("_ask_r", "_done_w")
        if self.proc is not None and self.proc.stderr is not None:
            self.proc.stderr.close()
        self._err_r = -1

    @property
    def active(self) -> int:
        return 0  # connections are the sidecar's

    def publish(self, names=VARIANTS) -> None:
        """Write these variants of the page, each as a whole HTTP answer (a file rewritten
        only when its bytes changed, else its time set: the close signal's page is told by
        it). OSError when a write fails."""
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
            self._failed.add(name)
            if self._last.get(name) != key or not old:
                self._last.pop(name, None)
                _write_atomic(path, head + body)
                self._last[name] = key
            else:
                os.utime(path)
            self._failed.discard(name)
            if name == "text" and self._closed_mtime is None and self._closing():
                self._closed_mtime = self._mtime(path)

    def _publish(self, names) -> None:
        """`publish`, moved to another folder and done again there when the folder fails."""
        try:
            self.publish(names)
        except OSError as e:
            if e.errno not in MOVE_ERRNOS or not self._move(e):
                raise
            self.publish(names)

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
        poller, polled = None, None
        try:
            while not self._stop:
                timeout = None
                if self._restart_at is not None:
                    timeout = self._restart_at - time.monotonic()
                    if timeout <= 0:
                        self._restart()
                        continue
                fds = tuple(fd for fd in (self._wake_r, self._ask_r, self._err_r) if fd >= 0)
                if fds != polled:  # poll, never select: a descriptor may be >= 1024
                    poller, polled = select.poll(), fds
                    for fd in fds:
                        poller.register(fd, select.POLLIN)
                ready = {fd for fd, _ev in poller.poll(
                    None if timeout is None else max(1, int(timeout * 1000)))}
                try:
                    self._woken(ready)
                except Exception as e:  # noqa: BLE001 - never into the training job
                    self.on_sidecar(e)
                if not watched:
                    self.stats.report_thread()
        finally:
            self.stats.thread_done()

    def _woken(self, ready: set) -> None:
        if self._wake_r in ready:
            os.read(self._wake_r, 4096)
        if self._stop:
            return
        if self._err_r in ready:
            self._drain_err()
        asked: set = set()
        if self._ask_r in ready:
            data = os.read(self._ask_r, 4096)
            if not data:  # EOF: the sidecar is gone
                self._exited()
                return
            lines = (self._rest + data).split(b"\n")
            self._rest = lines.pop()
            asked = {ln.decode("ascii", "replace") for ln in lines}
        self._serve_requests(asked)

    def _drain_err(self) -> None:
        """The sidecar's stderr, read as it comes (never left to fill its pipe): `tls:` lines
        to on_error (as the in-process server's), `request:` / `stats:` to on_sidecar, the
        rest kept as its last words (its exit's cause)."""
        while self._err_r >= 0:
            try:
                data = os.read(self._err_r, 65536)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:  # its end closed: it is exiting (the ask pipe's EOF says so)
                if self.proc is not None and self.proc.stderr is not None:
                    self.proc.stderr.close()
                self._err_r = -1
                return
            lines = (self._err_rest + data).split(b"\n")
            self._err_rest = lines.pop()[-4096:]
            for raw in lines:
                line = raw.decode("utf-8", "replace").rstrip()
                kind, _, text = line.partition(": ")
                if kind == "tls":
                    self.on_error(RuntimeError(text))
                elif kind in ("request", "stats"):
                    self.on_sidecar(RuntimeError(f"/metrics sidecar: {text}"))
                elif line:
                    self._said = (self._said + [line])[-20:]

    def _exited(self) -> None:
        """The sidecar ended: reaped, its counts kept, said with its cause, restarted after the
        back-off (at once after a steady run)."""
        proc = self.proc
        try:
            code = proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # its pipe closed, the process not (yet) gone
            proc.kill()
            code = proc.wait()
        self._drain_err()
        if self._err_rest:
            self._said.append(self._err_rest.decode("utf-8", "replace"))
        self._close_pipes()
        self._fold_counts()
        if self._stop:
            return
        lived = time.monotonic() - self._spawned
        self._in_row = 1 if lived >= STEADY_S else self._in_row + 1
        delay = RESTART_BACKOFF_S[min(self._in_row, len(RESTART_BACKOFF_S)) - 1]
        self.exits += 1
        self._restart_at = time.monotonic() + delay
        self.on_sidecar(SidecarExit(
            f"/metrics sidecar (pid {proc.pid}) {_cause(code, self._said)} after {lived:.1f} s;"
            f" restarted {'at once' if not delay else f'in {delay:g} s'}"))

    def _restart(self) -> None:
        self._restart_at = None
        try:
            self._spawn()
            self._spawn_failures = 0
            return
        except Exception as e:  # noqa: BLE001 - said, tried again, then the port given up
            self._spawn_failures += 1
            failure = e
        if self._spawn_failures >= SPAWN_TRIES:
            self.on_sidecar(SidecarExit(
                f"cannot start the /metrics sidecar again ({failure}); port "
                f"{self.server_address[1]} closed: scrapes are refused, not left unanswered"))
            self.socket.close()
            self._stop = True
            return
        self._in_row += 1
        self._restart_at = time.monotonic() + \
            RESTART_BACKOFF_S[min(self._in_row, len(RESTART_BACKOFF_S)) - 1]
        self.on_sidecar(SidecarExit(f"cannot start the /metrics sidecar again ({failure}); "
                                    "trying again"))

    def _fold_counts(self) -> None:
        """An ended sidecar's counts stay in the rank's (its successor counts from 0)."""
        for k in OUTCOMES:
            self._base[k] += self._now[k]
        self._now = dict.fromkeys(OUTCOMES, 0)
        self._base_cpu += self._now_cpu
        self._base_stale += self._now_stale
        self._now_cpu, self._now_stale = 0.0, 0
        self._seen.clear()
        self._stats_mtime = 0

    def _serve_requests(self, asked: set) -> None:
        """Render what the sidecar asked for (each variant once; not again within half of
        max_age: a request that waited in the pipe while it was rendered), ack each ("!name"
        when it could not be written); the closed page when the close came; the stats."""
        now = time.monotonic()
        published: list[str] = []
        try:
            if self._closed_mtime is None and self._closing():
                self._publish(VARIANTS)
                published = list(VARIANTS)
                self._ok = True
            names = [n for n in VARIANTS if n in asked and
                     now - self._tried.get(n, -1e9) >= self.max_age_s / 2]
            try:
                if names:
                    self._publish(names)
                    self._ok = True
            finally:
                done = [n for n in VARIANTS if n in asked or n in published]
                lines = self._lines + [("!" if n in self._failed else "") + n for n in done]
                if lines:
                    try:
                        os.write(self._done_w, "\n".join(lines).encode() + b"\n")
                        self._lines = []
                    except OSError:  # full or closed: the sidecar answers them stale
                        pass
            if "stats" in asked:
                self.read_stats()
        except Exception as e:  # noqa: BLE001 - never into the training job
            if self._ok or now - self._started >= QUIET_START_S:
                self.on_error(e)

    def read_stats(self) -> None:
        """The sidecar's counts (requests by outcome, its CPU) and scrapes (closing.py), on
        top of those of the sidecars before it."""
        path = self.folder / "stats.json"
        mtime = self._mtime(path)
        if mtime == self._stats_mtime:
            return
        self._stats_mtime = mtime
        try:
            data = json.loads(path.read_bytes())
        except (OSError, ValueError):
            return
        self._now = {k: int(data.get("requests", {}).get(k, 0)) for k in OUTCOMES}
        self.stats.set_counts({k: self._base[k] + self._now[k] for k in OUTCOMES})
        self._now_cpu = float(data.get("cpu_s", 0.0))
        self._now_stale = int(data.get("stale", 0))
        self.sidecar_cpu_s = self._base_cpu + self._now_cpu
        self.stale_served = self._base_stale + self._now_stale
        seen = self.on_scraped
        for addr, ua, n, page_mtime in data.get("scraped", []):
            key = (addr, ua)
            if n > self._seen.get(key, 0):
                self._seen[key] = n
                closed = self._closed_mtime
                if seen is not None and (closed is None or page_mtime >= closed):
                    seen(key)

    def _forget(self) -> None:
        """In a forked child: close this server's descriptors (the port, the pipes, the
        folder's lock), touch nothing else (the sidecar and the folder are the rank's)."""
        self._owner = -1
        for fd in (self._ask_r, self._done_w, self._err_r, self._wake_r, self._wake_w,
                   self._lock_fd, *self._spawning):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        try:
            self.socket.close()
        except OSError:
            pass

    def shutdown(self) -> None:
        if os.getpid() != self._owner:
            return  # a forked child: the sidecar is its parent's
        self._stop = True
        self.wake()
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join(timeout=5)
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def server_close(self) -> None:
        if os.getpid() != self._owner or self._closed:
            return
        self._closed = True
        _LIVE.discard(self)
        self.socket.close()
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join(timeout=5)
        self._close_pipes()
        self._close_fds("_wake_r", "_wake_w", "_lock_fd")


if __name__ == "__main__":
    sys.exit(main())
