"""The /metrics server's accepting loop: one thread, epoll, answers made of prebuilt bytes.

Every request the server answers costs the training process it runs in CPU time (and its GIL).
Measured on the 2-core bench box (bench/chaos.py), a request through `http.server` (a worker
thread woken per connection, the request read through a buffered file, the answer written
through another) cost 280-600 us of the server threads' CPU, where a bare Python
accept / read / answer / close costs 70-170 us. So a plain-HTTP connection is served here, on
the accepting thread, without a thread switch and without a file object:

- the listening socket is non-blocking under a level-triggered epoll: one accept per wake;
- what the client already sent is read with one non-blocking `recv`; a complete, well-formed
  `GET` head (`parse_head`: request line, `Name: value` lines ending in CRLF, within
  `MAX_HEAD` bytes and `page.MAX_HEADERS` lines) is answered at once: `401` and `429` from
  bytes built when the server starts, `200` from the page's cached body (`page.Page.bake`)
  behind a head cached per body length and headers; the answer and the connection's end go
  out in one segment (`MSG_MORE`, then `close`);
- a connection whose request has not arrived yet when it is accepted waits in the epoll
  (`watch`, under its whole-request deadline) and is answered the same way once it has;
- anything else is handed to the worker threads with the bytes already read (`Handoff`): a
  request not complete in its first read (a slow or trickling client: its whole-request
  deadline goes with it), another method, a `name[]` query, a malformed head (the full
  parser answers 400/431), TLS connections (the handshake needs a blocking thread), an
  answer larger than the socket took at once (the rest is sent there).

Standard library only.
"""

from __future__ import annotations

import io
import select
import socket


MAX_HEADERS = 100  # as http.client's
MAX_HEAD = 16384  # a longer request head is left to the full parser (it allows 64 KiB lines)
READ_MAX = MAX_HEAD + 1
BACKOFF_S = 0.05  # out of file descriptors: accept again after this long
SEND_FLAGS = socket.MSG_DONTWAIT | getattr(socket, "MSG_MORE", 0)
# TCP_DEFER_ACCEPT (Linux): the kernel completes the handshake but wakes `accept` only once
# the request's first bytes have arrived, or after this long without any (then the
# connection is accepted as before, and its whole-request deadline starts)
DEFER_ACCEPT_S = 1


def defer_accept(listener: socket.socket) -> bool:
    """Set TCP_DEFER_ACCEPT on `listener` where the platform has it; False where not."""
    opt = getattr(socket, "TCP_DEFER_ACCEPT", None)
    if opt is None:
        return False
    try:
        listener.setsockopt(socket.IPPROTO_TCP, opt, DEFER_ACCEPT_S)
    except OSError:
        return False
    return True


def head_end(data: bytes) -> int:
    """Where the request head at the start of `data` ends (the index after its empty line),
    -1 while it is not whole. Lines end in CRLF or a bare LF, as the standard library's
    parser reads them (a client sending bare LFs is answered, not left to its deadline)."""
    i = data.find(b"\n")
    while i >= 0:
        j = i + 1
        if data[j:j + 1] == b"\n":
            return j + 1
        if data[j:j + 2] == b"\r\n":
            return j + 2
        i = data.find(b"\n", j)
    return -1


def looks_like_http(data: bytes) -> bool:
    """`data` (a connection's first bytes) can begin an HTTP/1 request: a method's letters.
    Not so a TLS ClientHello on the plain port (0x16), SSLv2 (0x80), binary noise: those
    are answered 400 at once instead of waiting for a line end that never comes."""
    return bool(data) and data[:1].isalpha() and data[:1].isupper()


def parse_head(data: bytes) -> tuple[str, str, dict[str, str]] | None:
    """(method, path, headers by lower-cased name) of a complete, well-formed HTTP/1.x
    request head at the start of `data`; None for anything else (left to the full parser)."""
    end = head_end(data)
    if end < 0 or end > MAX_HEAD:
        return None
    lines = [ln[:-1] if ln.endswith("\r") else ln
             for ln in data[:end].decode("iso-8859-1").split("\n")[:-2]]
    words = lines[0].split()
    if len(words) != 3 or not words[2].startswith("HTTP/1.") or len(lines) > MAX_HEADERS + 1:
        return None
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name[0] in " \t" or name != name.strip() or "\r" in line:
            return None  # folded, bare or odd lines: the full parser decides
        headers[name.lower()] = value.strip()
    return words[0], words[1], headers


def response_head(status: str, headers, length: int) -> bytes:
    lines = [f"HTTP/1.0 {status}"] + [f"{k}: {v}" for k, v in headers]
    lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def canned(status: str, headers, body: str) -> bytes:
    data = body.encode()
    return response_head(status, list(headers) + [
        ("Content-Type", "text/plain; charset=utf-8")], len(data)) + data


NOT_HTTP = canned("400 Bad Request", [], "400 not an HTTP/1 request (this port speaks "
                  "HTTP/1.x: TLS to a plain port, or HTTP/2?)\n")


class Handoff(io.RawIOBase):
    """A connection's byte stream for the full handler: the bytes the loop already read,
    then the socket's (what `socket.makefile` would give, with a prefix)."""

    def __init__(self, prefix: bytes, sock: socket.socket):
        self._prefix, self._sock = memoryview(prefix), sock

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        if self._prefix:
            n = min(len(b), len(self._prefix))
            b[:n] = self._prefix[:n]
            self._prefix = self._prefix[n:]
            return n
        return self._sock.recv_into(b)


class Loop:
    """epoll over the listening socket and a wake-up pair; `serve(take, tick)` calls
    `take(conn, addr)` for each accepted connection until `stop()`."""

    def __init__(self, listener: socket.socket):
        self.listener = listener
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._stopping = self._closed = False
        self._ep = select.epoll()
        self._alone = select.poll()  # the wake-up pair alone (out of descriptors: a pause)
        self._alone.register(self._wake_r.fileno(), select.POLLIN)
        self._watched: dict[int, tuple] = {}  # fd -> (socket, callback): waiting to be read
        self.waits = 0  # connections accepted before their request arrived (watched)

    def watch(self, sock: socket.socket, callback) -> None:
        """Call `callback()` (on the loop) once `sock` is readable, or closed, or shut down.
        Only from the loop's own thread."""
        fd = sock.fileno()
        self.waits += 1
        self._watched[fd] = (sock, callback)
        self._ep.register(fd, select.EPOLLIN)

    def serve(self, take, tick=None) -> None:
        """Run until `stop()`: accept and `take` every connection, `tick()` (if any) after
        each wake-up."""
        try:
            self._serve(take, tick)
        except (OSError, ValueError):
            if not self._closed:  # a fault of this loop's own, not a client's: raise
                raise
            # closed under it (server_close() without shutdown(), or before it started)

    def _serve(self, take, tick) -> None:
        self.listener.setblocking(False)
        ep = self._ep
        listening = self.listener.fileno()
        ep.register(listening, select.EPOLLIN)
        ep.register(self._wake_r.fileno(), select.EPOLLIN)
        wake = self._wake_r.fileno()
        backoff = False
        while not self._stopping:
            if backoff:  # the listener stays readable: wait on the wake-up pair alone
                self._alone.poll(BACKOFF_S * 1000)  # poll, never select: fds >= 1024
                self._drain()
                backoff = False
                fds = [listening]
            else:
                fds = [fd for fd, _ev in ep.poll()]
            for fd in fds:
                if self._stopping:
                    break
                if fd == wake:
                    self._drain()
                elif fd in self._watched:
                    _sock, callback = self._watched.pop(fd)
                    ep.unregister(fd)
                    callback()
                elif fd == listening:
                    try:  # one per wake: the epoll is level-triggered (no failed accept)
                        conn, addr = self.listener.accept()
                    except BlockingIOError:
                        continue
                    except OSError:  # out of descriptors (EMFILE) or aborted: retry soon
                        backoff = True
                        continue
                    take(conn, addr)
            if tick is not None:
                tick()

    def _drain(self) -> None:
        try:
            self._wake_r.recv(64)
        except OSError:  # nothing to drain
            pass

    def stop(self) -> None:
        self._stopping = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass

    def close(self) -> None:
        """The connections still waiting are closed (and the loop, if it still runs)."""
        self._closed = self._stopping = True
        for sock, _cb in self._watched.values():
            sock.close()
        self._watched.clear()
        self._ep.close()
        self._wake_r.close()
        self._wake_w.close()
