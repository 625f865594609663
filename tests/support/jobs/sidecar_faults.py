"""A rank that serves /metrics (sidecar or in-process) under the faults of issue 32 item 1.

    python tests/support/jobs/sidecar_faults.py MODE WEB_CONFIG

MODE:
- `fds-sidecar`: every descriptor the server opens is >= 1024 (RLIMIT_NOFILE raised, 1100
  taken first); prints `PORT MIN_FD`, then serves a page whose `zerodoc_last_step` grows at
  each render until stdin closes;
- `fds-inproc`: the in-process server, its descriptors >= 1024, runs out of descriptors
  (EMFILE at accept: its loop pauses) and gets them back; prints one JSON line: what its
  accepting loop did and whether the waiting client was answered;
- `pages`: a sidecar rank whose page changes at every render (as /dev/shm is under test by
  the caller: full, read-only); prints `PORT`, then answers stdin lines: `fill PATH` (fill
  that file system: a file until ENOSPC), `free PATH` (remove it), `state` (one JSON line:
  the pages' folder, moves, exits, what zerodoc said);
- `exit`: prints `SIDECAR_PID` and returns, no shutdown (the interpreter's exit);
- `serve`: `server.serve()` as attach() calls it (basic auth: sidecar mode); prints one JSON
  line: the server's class, its port, the warnings;
- `fork`: `inproc` or `sidecar` as the second word of MODE (`fork-inproc`): forks a child
  that sleeps (a DataLoader worker), prints `PORT CHILD_PID`, waits to be killed.
"""

from __future__ import annotations

import json
import os
import resource
import socket
import sys
import threading
import time


def page_registry():
    from prometheus_client import CollectorRegistry, Gauge

    reg = CollectorRegistry()
    step = [0]

    def grow() -> int:
        step[0] += 1
        return step[0]
    Gauge("zerodoc_last_step", "Renders so far.", registry=reg).set_function(grow)
    Gauge("zerodoc_test_padding", "Bytes.", ["i"], registry=reg)
    for i in range(200):  # a page of ~10 KB
        reg._names_to_collectors["zerodoc_test_padding"].labels(str(i)).set(i)
    return reg


def sidecar_server(cfg, said=None):
    from zerodoc.exporter import sidecar
    from zerodoc.exporter.page import Page

    return sidecar.SidecarServer("127.0.0.1", 0, Page(page_registry()), socket.AF_INET, cfg,
                                 on_error=said, on_sidecar=said)


def high_fds() -> list[int]:
    """Take descriptors up to 1100, so that whatever is opened next is above 1024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    held = []
    while not held or held[-1] < 1100:
        held.append(os.open(os.devnull, os.O_RDONLY))
    return held


def fds_sidecar(cfg) -> None:
    high_fds()
    srv = sidecar_server(cfg)
    srv.start()
    print(srv.server_address[1], min(srv._ask_r, srv._done_w, srv._err_r, srv._wake_r),
          flush=True)
    sys.stdin.read()
    srv.shutdown()
    srv.server_close()


class Counting:
    """The listening socket, its accept() failures counted (the real accept runs)."""

    def __init__(self, sock):
        self.sock, self.failed = sock, 0

    def accept(self):
        try:
            return self.sock.accept()
        except OSError:
            self.failed += 1
            raise

    def __getattr__(self, name):
        return getattr(self.sock, name)


def fds_inproc(cfg) -> None:
    from zerodoc.exporter import server

    high_fds()
    srv = server.start("127.0.0.1", 0, page_registry())
    loop = srv._loop
    counting = loop.listener = Counting(loop.listener)
    thread = [t for t in threading.enumerate() if t.name == "zerodoc-metrics"][0]
    client = socket.socket()
    client.settimeout(5)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    fillers = []
    resource.setrlimit(resource.RLIMIT_NOFILE, (client.fileno() + 1, hard))
    while True:  # every free number below the limit taken: the next accept gets EMFILE
        try:
            fillers.append(os.dup(0))
        except OSError:
            break
    client.connect(srv.server_address)
    client.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
    deadline = time.monotonic() + 10
    while counting.failed < 2 and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)  # the loop's own pace: a failed accept, its pause, another
    failed, alive = counting.failed, thread.is_alive()
    for fd in fillers:
        os.close(fd)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:
        answer = client.recv(64)
    except OSError as e:
        answer = repr(e).encode()
    print(json.dumps({"failed_accepts": failed, "loop_alive": alive,
                      "answer": answer.decode("latin-1"), "wake_fd": loop._wake_r.fileno()}),
          flush=True)


def pages(cfg) -> None:
    said: list[str] = []
    srv = sidecar_server(cfg, lambda e: said.append(f"{type(e).__name__}: {e}"))
    try:
        srv.start()
    except OSError as e:
        print(json.dumps({"error": str(e)}), flush=True)
        return
    print(srv.server_address[1], flush=True)
    for line in sys.stdin:
        cmd, _, arg = line.strip().partition(" ")
        if cmd == "fill":
            fd = os.open(arg, os.O_WRONLY | os.O_CREAT)
            try:
                while True:
                    os.write(fd, b"\0" * 4096)
            except OSError:  # ENOSPC: full
                os.close(fd)
            print("filled", flush=True)
        elif cmd == "free":
            os.unlink(arg)
            print("freed", flush=True)
        elif cmd == "state":
            print(json.dumps({"folder": str(srv.folder), "moves": srv.moves,
                              "exits": srv.exits, "said": said,
                              "sidecar_alive": srv.proc.poll() is None}), flush=True)


def at_exit(cfg) -> None:
    srv = sidecar_server(cfg)
    srv.start()
    print(srv.proc.pid, flush=True)


def serve(cfg) -> None:
    import warnings
    from types import SimpleNamespace

    from zerodoc.exporter import server, webconfig
    from zerodoc.shim.hookpoints import HookRegistry

    os.environ[webconfig.ENV] = str(cfg.path)
    monitor = SimpleNamespace(registry=HookRegistry(), rank=0, local_rank=0,
                              local_world_size=1)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        srv, endpoint = server.serve(monitor, 0, "127.0.0.1")
    print(json.dumps({"server": type(srv).__name__, "endpoint": endpoint,
                      "warned": [str(w.message) for w in said]}), flush=True)
    sys.stdin.read()


def fork(cfg, kind: str) -> None:
    if kind == "sidecar":
        srv = sidecar_server(cfg)
        srv.start()
    else:
        from zerodoc.exporter import server

        srv = server.start("127.0.0.1", 0, page_registry())
    pid = os.fork()
    if pid == 0:  # a DataLoader worker, alive after its rank (the test ends it)
        time.sleep(300)
        os._exit(0)
    print(srv.server_address[1], pid, flush=True)
    threading.Event().wait()


def main() -> None:
    from zerodoc.exporter import webconfig

    mode, cfg = sys.argv[1], webconfig.load(sys.argv[2])
    if mode.startswith("fork-"):
        fork(cfg, mode.split("-", 1)[1])
    else:
        {"fds-sidecar": fds_sidecar, "fds-inproc": fds_inproc, "pages": pages,
         "exit": at_exit, "serve": serve}[mode](cfg)


if __name__ == "__main__":
    main()
