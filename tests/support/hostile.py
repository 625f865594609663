"""Hostile clients of a rank's /metrics server, for tests/test_exporter_security.py,
tests/test_exporter_load.py, tests/test_server_fuzz.py and bench/chaos_auth.py.

- `ask`: one request on one connection, from a chosen loopback address (Linux routes all of
  127.0.0.0/8 to lo: an address per client, no setup), the answer read to its end;
- `Guessers`: many addresses guessing distinct passwords as fast as the server answers, one
  thread and one selector for all of them (no GIL-bound thread per address);
- `SidecarLoop`: the sidecar's own request handling (`exporter.sidecar.Sidecar`) run on a
  thread of this process over a page file, so that a test can put its Authenticator on a
  clock of its own (the sidecar process proper is tested as a process elsewhere);
- `corpus`: a seeded corpus of malformed, truncated, oversized and non-ASCII requests.
"""

from __future__ import annotations

import base64
import os
import random
import selectors
import socket
import ssl
import threading
from collections import Counter
from pathlib import Path

from zerodoc.exporter import limits, sidecar
from zerodoc.exporter.fastpath import response_head

PAGE_BODY = b"# HELP zerodoc_test_value A test gauge.\n# TYPE zerodoc_test_value gauge\n" \
            b"zerodoc_test_value 42.0\n"


def basic(user: str, pw: str) -> bytes:
    return b"Authorization: Basic " + base64.b64encode(f"{user}:{pw}".encode()) + b"\r\n"


def scrape(user: str | None = None, pw: str = "", agent: str = "Prometheus/3.0") -> bytes:
    """A Prometheus-like GET of /metrics (with basic credentials when `user`)."""
    return (b"GET /metrics HTTP/1.1\r\nHost: rank\r\nUser-Agent: " + agent.encode() + b"\r\n"
            + (basic(user, pw) if user is not None else b"") + b"\r\n")


def status_of(answer: bytes) -> int | None:
    """The status code of an HTTP/1.x answer; None for no answer or anything else."""
    if not answer.startswith(b"HTTP/1."):
        return None
    try:
        return int(answer.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return None


def ask(port: int, request: bytes, source: str = "127.0.0.1", timeout: float = 10.0,
        half_close: bool = False, ctx=None) -> bytes:
    """Send `request` from `source` (then shut the sending side when `half_close`), read to
    the end; b"" when the server closed or reset without an answer. `ctx`: TLS."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(timeout)
    out = b""
    try:
        s.bind((source, 0))
        s.connect(("127.0.0.1", port))
        if ctx is not None:
            s = ctx.wrap_socket(s, server_hostname="127.0.0.1")
        s.sendall(request)
        if half_close and ctx is None:
            try:
                s.shutdown(socket.SHUT_WR)
            except OSError:  # the server has closed already: read what it said
                pass
        while True:
            b = s.recv(1 << 16)
            if not b:
                return out
            out += b
    except (ConnectionError, ssl.SSLError):  # reset, or a TLS client answered in plain
        return out
    finally:
        s.close()


class Guessers:
    """`n` addresses (127.0.1.1 ..) each sending one guess after another (distinct passwords,
    for the configured user and for names that are not), each waiting for its answer before
    the next, on one thread. `answers`: their statuses (None: closed without an answer)."""

    def __init__(self, port: int, n: int = 40, users=("prometheus", "admin", "root")):
        self.port, self.n, self.users = port, n, users
        self.answers: Counter = Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="guessers", daemon=True)
        self._k = 0

    def __enter__(self) -> "Guessers":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)

    def total(self) -> int:
        return sum(self.answers.values())

    def _open(self, sel, i: int) -> None:
        self._k += 1
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        s.bind((f"127.0.1.{i + 1}", 0))
        s.connect_ex(("127.0.0.1", self.port))
        user = self.users[self._k % len(self.users)]
        sel.register(s, selectors.EVENT_WRITE, [i, scrape(user, f"guess-{i}-{self._k}"), b""])

    def _run(self) -> None:
        sel = selectors.DefaultSelector()
        for i in range(self.n):
            self._open(sel, i)
        while not self._stop.is_set():
            for key, _ev in sel.select(0.1):
                s, state = key.fileobj, key.data
                if state[1]:  # still sending
                    try:
                        state[1] = state[1][s.send(state[1]):]
                    except BlockingIOError:
                        continue
                    except OSError:
                        state[1] = b""
                    if not state[1]:
                        sel.modify(s, selectors.EVENT_READ, state)
                    continue
                try:
                    b = s.recv(1 << 16)
                except BlockingIOError:
                    continue
                except OSError:
                    b = b""
                if b:
                    state[2] += b
                    continue
                self.answers[status_of(state[2])] += 1
                sel.unregister(s)
                s.close()
                self._open(sel, state[0])
        for key in list(sel.get_map().values()):
            key.fileobj.close()
        sel.close()


class SidecarLoop:
    """The sidecar's request handling on a thread of this process: its listening socket on
    127.0.0.1, its page a fixed file (no rank to ask), `auth` its Authenticator."""

    def __init__(self, folder: Path, cfg=None, lim: limits.Limits | None = None):
        folder.mkdir(parents=True, exist_ok=True)
        answer = response_head("200 OK", [("Content-Type", "text/plain; version=0.0.4")],
                               len(PAGE_BODY)) + PAGE_BODY
        for name in ("text", "own.text"):
            (folder / name).write_bytes(answer)
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self.loop = sidecar.Sidecar(self.listener, folder, os.getppid(), lim or limits.Limits(),
                                    cfg)
        self.auth = self.loop.auth
        self._thread = threading.Thread(target=self.loop.serve, name="sidecar-loop",
                                        daemon=True)
        self._thread.start()

    @property
    def requests(self) -> dict:
        return self.loop.requests

    def close(self) -> None:
        self.loop.gone = True
        self._thread.join(10)
        self.listener.close()


# --- a corpus of hostile requests ------------------------------------------------------
TLS_HELLO = bytes.fromhex(  # the start of a TLS 1.2/1.3 ClientHello record
    "160301020001000" "1fc0303") + bytes(range(32)) + b"\x00\x00\x02\x13\x01\x01\x00"
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def corpus(n: int, seed: int = 32, user: str = "prometheus", right: str = "s3cret") -> list:
    """`n` requests (bytes), each with whether the client half-closes after sending it:
    malformed, truncated, oversized, non-ASCII, binary, TLS on the plain port, the HTTP/2
    preface, bare LF line ends, odd methods and credentials; some right scrapes among them.
    The same `seed`, the same corpus."""
    rng = random.Random(seed)
    good = scrape(user, right)
    heads = [good, scrape(), scrape(user, "wrong"), b"GET /metrics HTTP/1.0\r\n\r\n",
             b"GET /metrics/exporter HTTP/1.0\r\n" + basic(user, right) + b"\r\n"]

    def mutate(req: bytes) -> bytes:
        b = bytearray(req)
        for _ in range(rng.randint(1, 8)):
            op = rng.randrange(5)
            i = rng.randrange(len(b) + 1)
            if op == 0 and b:
                del b[i % len(b)]
            elif op == 1:
                b[i:i] = bytes([rng.randrange(256)])
            elif op == 2 and b:
                b[i % len(b)] = rng.randrange(256)
            elif op == 3:
                b[i:i] = rng.choice([b"\r\n", b"\n", b"\r", b":", b" ", b"\x00", b"\xff",
                                     "é".encode(), b"\t"])
            else:
                j = rng.randrange(len(b) + 1)
                b[i:i] = bytes(b[min(i, j):max(i, j)])[:64]
        return bytes(b)

    truncating = [
        lambda: mutate(rng.choice(heads)),  # bit rot
        lambda: rng.choice(heads)[:rng.randrange(1, len(good))],  # truncated
    ]
    makers = [
        lambda: rng.choice(heads).replace(b"\r\n", b"\n"),  # bare LF
        lambda: b"GET /metrics HTTP/1.0\r\nX: " + b"a" * rng.choice(  # oversized
            [20000, 70000, 200000]) + b"\r\n\r\n",
        lambda: b"GET /metrics HTTP/1.0\r\n" + b"X: y\r\n" * rng.choice([101, 500]) + b"\r\n",
        lambda: b"GET /" + b"m" * rng.choice([5000, 70000]) + b" HTTP/1.0\r\n\r\n",
        lambda: b"GET /metrics HTTP/1.0\r\nAuthorization: Basic " + rng.choice(
            ["éé", "€", "\u2028", "ä" * 40]).encode(rng.choice(["utf-8", "latin-1"]),
                                                   "replace") + b"\r\n\r\n",
        lambda: b"GET /metrics HTTP/1.0\r\n" + basic(rng.choice([user, "é", ""]),
                                                     "pä" + str(rng.random())) + b"\r\n",
        lambda: b"GET /metrics HTTP/1.0\r\nAuthorization: Basic " + base64.b64encode(
            bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40)))) + b"\r\n\r\n",
        lambda: TLS_HELLO + bytes(rng.randrange(256) for _ in range(rng.randrange(0, 400))),
        lambda: H2_PREFACE,
        lambda: bytes(rng.randrange(256) for _ in range(rng.randrange(1, 600))),  # noise
        lambda: rng.choice([b"POST", b"HEAD", b"PUT", b"BREW", b"get", b"G\xc3\xa9T"]) +
        b" /metrics HTTP/1.0\r\n\r\n",
        lambda: b"GET /metrics?name[]=zerodoc_test_value HTTP/1.0\r\n" + basic(user, right)
        + b"\r\n",
        lambda: b"GET /metrics HTTP/1.0\r\n folded: x\r\n\r\n",
        lambda: b"GET /m\xc3\xa9trics HTTP/1.0\r\nAccept: \xff\xfe\r\n\r\n",
        lambda: b"\r\n\r\n",
        lambda: good,
    ]
    out = []
    for _ in range(n):  # what may lack its end is sent half-closed (else: the deadline's)
        if rng.random() < 0.4:
            out.append((rng.choice(truncating)(), True))
        else:
            out.append((rng.choice(makers)(), rng.random() < 0.3))
    return out
