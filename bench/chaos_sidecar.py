"""Fault rows of issue 32 for the /metrics sidecar (`bench/chaos.py --only faults`).

    rows(tmp) -> [{"fault", "said", "slowdown", "lost", "note"}]

Each row serves a page from a real sidecar (`zerodoc.exporter.sidecar.SidecarServer` in this
process, or a rank process from tests/support/jobs/sidecar_faults.py), injects one fault and
scrapes with the right password: what zerodoc said (the message counted under
`zerodoc_errors_total{hook="sidecar"}`, or what it did), whether /metrics came back, and the
seconds from the fault to the first 200 with a fresh page (`zerodoc_last_step` moved). No
training job runs here (slowdown n/a) and no run log is written (lost n/a).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path


def _scrape(port: int, extra: bytes = b"", timeout: float = 10.0) -> bytes:
    import base64

    head = (b"GET /metrics HTTP/1.0\r\nAuthorization: Basic " +
            base64.b64encode(b"prometheus:s3cret") + b"\r\n" + extra + b"\r\n")
    out = b""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(head)
            while True:
                b = s.recv(1 << 16)
                if not b:
                    break
                out += b
    except OSError:
        pass
    return out


def _step(answer: bytes) -> float | None:
    if not answer.startswith(b"HTTP/1.0 200 "):
        return None
    m = re.search(rb"\nzerodoc_last_step (\S+)", answer)
    return float(m.group(1)) if m else None


def _until(cond, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.02)
    return None


def _back(port: int, after: float | None, t0: float, timeout: float = 15.0) -> str:
    """Seconds from t0 to the first 200 whose step is above `after`, or "never"."""
    got = _until(lambda: (_step(_scrape(port, timeout=2)) or -1) > (after or 0), timeout)
    return f"/metrics back (fresh page) in {time.monotonic() - t0:.2f} s" if got else \
        f"/metrics NOT back within {timeout:g} s"


def _cfg(tmp: Path):
    import bcrypt

    from zerodoc.exporter import webconfig

    p = tmp / "web.yml"
    p.write_text(json.dumps({"basic_auth_users": {"prometheus": bcrypt.hashpw(
        b"s3cret", bcrypt.gensalt(rounds=4)).decode()}}))
    return webconfig.load(p)


def _server(tmp: Path, said: list, **kw):
    from tests.support.jobs.sidecar_faults import page_registry
    from zerodoc.exporter import sidecar
    from zerodoc.exporter.page import Page

    srv = sidecar.SidecarServer("127.0.0.1", 0, Page(page_registry()), socket.AF_INET,
                                _cfg(tmp), on_error=said.append, on_sidecar=said.append, **kw)
    srv.start()
    return srv


def _first(said: list) -> str:
    return str(said[0])[:200] if said else "nothing"


def _killed(tmp: Path) -> dict:
    said: list = []
    srv = _server(tmp, said)
    try:
        port = srv.server_address[1]
        before = _step(_until(lambda: _scrape(port) if _step(_scrape(port)) else None, 10)
                       or b"")
        t0 = time.monotonic()
        srv.proc.send_signal(signal.SIGKILL)
        note = _back(port, before, t0)
        return {"fault": "sidecar killed (SIGKILL)", "said": _first(said),
                "note": f"{note}; exits counted {srv.exits}"}
    finally:
        srv.shutdown()
        srv.server_close()


def _injected(tmp: Path, header: bytes, fault: str, count: int) -> dict:
    from tests.test_sidecar_faults import INJECT as folder  # holds its sitecustomize.py

    old = {k: os.environ.get(k) for k in ("PYTHONPATH", "ZD_TEST_FAULT")}
    os.environ["PYTHONPATH"] = os.pathsep.join([str(folder)] + [v for v in [old["PYTHONPATH"]]
                                                                 if v])
    os.environ["ZD_TEST_FAULT"] = "1"
    said: list = []
    try:
        srv = _server(tmp, said)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    try:
        port = srv.server_address[1]
        _until(lambda: _step(_scrape(port)), 10)
        t0 = time.monotonic()
        answered = sum(_scrape(port, header + b": 1\r\n", timeout=5).startswith(b"HTTP/1.0 200")
                       for _ in range(count))
        took = time.monotonic() - t0
        ok = _step(_scrape(port)) is not None
        return {"fault": fault, "said": _first(said) if header == b"X-Boom" else
                f"{answered}/{count} answered 200",
                "note": f"next scrape {'200' if ok else 'FAILED'}; sidecar exits {srv.exits}, "
                        f"{count} requests in {took:.2f} s"}
    finally:
        srv.shutdown()
        srv.server_close()


def _clock(tmp: Path) -> dict:
    said: list = []
    srv = _server(tmp, said)
    try:
        port = srv.server_address[1]
        before = _step(_until(lambda: _scrape(port) if _step(_scrape(port)) else None, 10)
                       or b"")
        ahead = time.time_ns() + 3600 * 10**9  # the wall clock stepped back an hour
        os.utime(srv.folder / "text", ns=(ahead, ahead))
        t0 = time.monotonic()
        return {"fault": "wall clock stepped back 1 h (page mtime 1 h ahead)",
                "said": "nothing (nothing wrong: page age is monotonic)",
                "note": _back(port, before, t0).replace("back", "moved")}
    finally:
        srv.shutdown()
        srv.server_close()


def _job(tmp: Path, mode: str, pre: list | None = None, mounts: str | None = None):
    from tests.support.helpers import job_command, job_env

    env = job_env()
    env["TMPDIR"] = str(tmp)
    cmd = job_command("sidecar_faults", mode, _cfg(tmp).path)
    if mounts:
        cmd = ["unshare", "-rm", "sh", "-c", f"{mounts} && exec {' '.join(cmd)}"]
    return subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _tell(rank, line: str):
    rank.stdin.write(line + "\n")
    rank.stdin.flush()
    out = rank.stdout.readline()
    return json.loads(out) if out.startswith("{") else out.strip()


def _shm_full(tmp: Path) -> dict:
    rank = _job(tmp, "pages", mounts="mount -t tmpfs -o size=256k none /dev/shm")
    try:
        port = int(rank.stdout.readline())
        before = _step(_until(lambda: _scrape(port) if _step(_scrape(port)) else None, 10)
                       or b"")
        t0 = time.monotonic()
        _tell(rank, "fill /dev/shm/filler")
        note = _back(port, (before or 0) + 1, t0)
        state = _tell(rank, "state")
        said = next((s for s in state["said"] if "moved" in s), "; ".join(state["said"]))
        return {"fault": "/dev/shm full mid-run (256 KB tmpfs filled)", "said": said[:200],
                "note": f"{note}; pages now in {Path(state['folder']).parent}; sidecar "
                        f"exits {state['exits']}"}
    finally:
        rank.kill()
        rank.wait()


def _shm_ro(tmp: Path) -> dict:
    t0 = time.monotonic()
    rank = _job(tmp, "pages", mounts="mount -t tmpfs -o ro,size=1m none /dev/shm")
    try:
        first = rank.stdout.readline()
        if first.startswith("{") or not first.strip():
            return {"fault": "/dev/shm read-only at start", "said": first.strip()[:200],
                    "note": "no /metrics"}
        port = int(first)
        note = _back(port, None, t0)
        state = _tell(rank, "state")
        return {"fault": "/dev/shm read-only at start",
                "said": f"nothing; pages written in {Path(state['folder']).parent}",
                "note": note.replace("back", "up") + " (from the rank's start)"}
    finally:
        rank.kill()
        rank.wait()


def _fds(tmp: Path) -> dict:
    rank = _job(tmp, "fds-sidecar")
    try:
        port, low = map(int, rank.stdout.readline().split())
        t0 = time.monotonic()
        first = _step(_until(lambda: _scrape(port) if _step(_scrape(port)) else None, 10)
                      or b"")
        note = _back(port, first, time.monotonic())
        return {"fault": "descriptors >= 1024 (publisher's pipes from fd "
                         f"{low})", "said": "nothing (poll, not select)",
                "note": f"first page in {time.monotonic() - t0:.2f} s; then {note}"}
    finally:
        rank.stdin.close()
        rank.wait(timeout=20)


def _one(fn, tmp: Path, *a) -> dict:
    name = fn.__name__.strip("_")
    d = tmp / name
    d.mkdir(parents=True, exist_ok=True)
    try:
        row = fn(d, *a)
    except Exception as e:  # noqa: BLE001 - a row that says so
        row = {"fault": name, "said": f"row failed: {type(e).__name__}: {e}"[:200], "note": ""}
    row.setdefault("slowdown", None)
    row.setdefault("lost", None)
    return row


def rows(tmp: Path) -> list[dict]:
    return [_one(_killed, tmp),
            _one(_injected, tmp, b"X-Boom", "a request that raises inside the sidecar", 3),
            _one(_injected, tmp, b"X-Complain",
                 "sidecar complaining 4 KB per connection, 100 connections (stderr)", 100),
            _one(_shm_full, tmp), _one(_shm_ro, tmp), _one(_fds, tmp), _one(_clock, tmp)]


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        for r in rows(Path(d)):
            print(json.dumps(r))
