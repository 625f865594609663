"""Fault rows of issue 32 for the /metrics servers' authentication and request handling
(`bench/chaos.py --only faults`, area "auth").

    rows(tmp) -> [{"fault", "said", "slowdown", "lost", "note"}]

Each row runs the hostile clients of tests/support/hostile.py against real servers: the
in-process server (`server.start`), the sidecar's request loop on a thread of this process
(`hostile.SidecarLoop`: its Authenticator on a clock of the row's, for simulated minutes),
or a sidecar process (`sidecar.SidecarServer`). What is said is what a client read (statuses)
and what the server counted (`zerodoc_exporter_requests_total` by outcome). No training job
runs (slowdown n/a) and no run log is written (lost n/a).
"""

from __future__ import annotations

import socket
import threading
import time
from collections import Counter
from pathlib import Path


def _servers(tmp: Path, cfg):
    from tests.support import hostile
    from tests.support.helpers import gauge_registry
    from zerodoc.exporter import server

    srv = server.start("127.0.0.1", 0, gauge_registry(20), cfg)
    loop = hostile.SidecarLoop(tmp / "side", cfg)
    return srv, loop


def _close(srv, loop) -> None:
    srv.shutdown()
    srv.server_close()
    loop.close()


def _lockout(tmp: Path, cfg) -> dict:
    from tests.test_exporter_security import flood_and_scrape

    srv, loop = _servers(tmp / "lockout", cfg)
    try:
        said = []
        for name, port, auth in (("in-process", srv.server_address[1], srv._auth),
                                 ("sidecar loop", loop.port, loop.auth)):
            st = Counter(flood_and_scrape(port, auth, 15.0, 11))
            said.append(f"{name}: Prometheus {st[200]}/{sum(st.values())} scrapes 200, "
                        f"{auth.hash_checks} hash checks")
        return {"fault": "one wrong password repeated from Prometheus' own address (NAT), "
                         "> 20 per 10 s, from before its first scrape",
                "said": "; ".join(said),
                "note": "11 simulated minutes at a 15 s interval (the Authenticator's clock "
                        "injected), 22 wrong per interval, all from 127.0.0.1"}
    finally:
        _close(srv, loop)


def _guessing(tmp: Path, cfg) -> dict:
    from tests.test_exporter_security import first_login_under_guessing
    from tests.support.helpers import gauge_registry
    from zerodoc.exporter import sidecar
    from zerodoc.exporter.page import Page

    srv, loop = _servers(tmp / "guess", cfg)
    side = sidecar.SidecarServer("127.0.0.1", 0, Page(gauge_registry(20), stamp=lambda: 1,
                                                      max_age_s=1.0), socket.AF_INET, cfg)
    side.start()
    try:
        said, notes = [], []
        for name, port in (("in-process", srv.server_address[1]),
                           ("sidecar process", side.server_address[1])):
            which, took, answers = first_login_under_guessing(port, 6.0)
            again, took2, _a = first_login_under_guessing(
                port, 6.0, tries=1, settled=True, user=("stdlib", "0ther"), source="127.0.2.2")
            said.append(f"{name}: " + (f"at scrape {which} ({took:.2f} s)" if which else
                                       f"NOT in 2 scrapes ({took:.0f} s)") +
                        ", settled: " + (f"at scrape 1 ({took2:.2f} s)" if again else
                                         f"NOT at its first scrape ({took2:.1f} s)"))
            notes.append(f"{name} guessers answered " +
                         ", ".join(f"{k}: {v}" for k, v in sorted(answers.items(), key=str)))
        return {"fault": "40 addresses guessing distinct passwords (known and unknown users), "
                         "a user's first login", "said": "; ".join(said),
                "note": "scrapes 6 s apart from the guessers' start, and once their first "
                        "credentials were checked (settled); " + "; ".join(notes) +
                        " (checks: 2 a second in all)"}
    finally:
        side.shutdown()
        side.server_close()
        _close(srv, loop)


def _fuzz(tmp: Path, cfg) -> dict:
    from tests.support import hostile
    from tests.support.helpers import gauge_registry
    from tests.test_server_fuzz import N, fuzz
    from zerodoc.exporter import limits, server, sidecar
    from zerodoc.exporter.page import Page

    said, notes = [], []
    inproc = server.start("127.0.0.1", 0, gauge_registry(20), cfg,
                          limits=limits.Limits(request_deadline_s=3.0))
    side = sidecar.SidecarServer("127.0.0.1", 0, Page(gauge_registry(20), stamp=lambda: 1,
                                                      max_age_s=1.0), socket.AF_INET, cfg,
                                 limits=limits.Limits(request_deadline_s=3.0))
    side.start()
    try:
        for name, srv in (("in-process", inproc), ("sidecar process", side)):
            port = srv.server_address[1]
            t0 = time.monotonic()
            statuses = fuzz(port)
            took = time.monotonic() - t0
            deadline = time.monotonic() + 30
            while sum(srv.stats.requests.values()) < N and time.monotonic() < deadline:
                time.sleep(0.05)
            counts = {k: v for k, v in srv.stats.requests.items() if v}
            t1 = time.monotonic()
            after = hostile.status_of(hostile.ask(port, hostile.scrape("prometheus", "s3cret")))
            said.append(f"{name}: " + ", ".join(f"{k} {v}" for k, v in counts.items()) +
                        f" (counted {sum(counts.values())} of {N})")
            notes.append(f"{name}: {took:.1f} s; a right scrape after: {after} in "
                         f"{(time.monotonic() - t1) * 1000:.0f} ms; statuses read " +
                         ", ".join(f"{k}: {v}" for k, v in sorted(statuses.items(), key=str)))
        return {"fault": f"fuzz corpus: {N} malformed, truncated, oversized, non-ASCII requests, "
                         "TLS on the plain port, HTTP/2 preface, bare LF (50 addresses)",
                "said": "; ".join(said), "note": "; ".join(notes)}
    finally:
        side.shutdown()
        side.server_close()
        inproc.shutdown()
        inproc.server_close()


def _non_ascii(tmp: Path, cfg) -> dict:
    from tests.support import hostile
    from tests.support.helpers import gauge_registry
    from zerodoc.exporter import sidecar
    from zerodoc.exporter.page import Page

    side = sidecar.SidecarServer("127.0.0.1", 0, Page(gauge_registry(20), stamp=lambda: 1,
                                                      max_age_s=1.0), socket.AF_INET, cfg)
    side.start()
    try:
        port, pid = side.server_address[1], side.proc.pid
        bad = hostile.status_of(hostile.ask(port, b"GET /metrics HTTP/1.0\r\n"
                                            b"Authorization: Basic \xc3\xa9\xc3\xa9\r\n\r\n"))
        ok = hostile.status_of(hostile.ask(port, hostile.scrape("prometheus", "s3cret")))
        alive = side.proc.pid == pid and side.proc.poll() is None
        return {"fault": "Authorization: Basic éé (non-ASCII) to a sidecar",
                "said": f"{bad} (unauthorized); the next right scrape {ok}",
                "note": "the same sidecar process, alive" if alive else "the sidecar exited"}
    finally:
        side.shutdown()
        side.server_close()


def _close_clients(tmp: Path) -> dict:
    from tests.support import hostile
    from tests.support.helpers import gauge_registry
    from zerodoc.exporter import server
    from zerodoc.exporter.closing import CloseSignal

    srv = server.start("127.0.0.1", 0, gauge_registry(20))
    try:
        now = [0.0]
        sig = CloseSignal(clock=lambda: now[0])
        srv.on_scraped = sig.scraped
        port = srv.server_address[1]
        for t in (0.0, 1.0):
            now[0] = t
            hostile.ask(port, hostile.scrape(agent="Prometheus/3"))
        now[0] = 2.0
        out: list = []
        th = threading.Thread(target=lambda: out.append(_call(sig.close)))
        th.start()
        while sig.closed_unix is None:
            time.sleep(0.01)
        now[0] = 3.0
        for i in range(100):
            hostile.ask(port, hostile.scrape(agent=f"curl/{i}"), source=f"127.0.4.{i + 1}")
        hostile.ask(port, hostile.scrape(agent="Prometheus/3"))
        th.join(15)
        got = out[0] if out else "did not return"
        said = f"close() returned after {got:.2f} s" if isinstance(got, float) else \
            f"close() raised {got!r}"
        return {"fault": "100 distinct clients (address, User-Agent) during the close's linger",
                "said": said, "note": "ended by the regular scraper's page after the close"}
    finally:
        srv.shutdown()
        srv.server_close()


def _call(f):
    try:
        return f()
    except Exception as e:  # noqa: BLE001 - the row says it
        return e


def rows(tmp: Path) -> list[dict]:
    from tests.test_exporter_security import users, write_config
    from zerodoc.exporter import webconfig

    # users prometheus (bcrypt) and stdlib (PBKDF2), in the file a sidecar process reads
    cfg = webconfig.load(write_config(tmp / "web.yml", users_=users()))
    out = []
    for make in (lambda: _lockout(tmp, cfg), lambda: _guessing(tmp, cfg),
                 lambda: _fuzz(tmp, cfg), lambda: _non_ascii(tmp, cfg),
                 lambda: _close_clients(tmp)):
        r = make()
        r.setdefault("slowdown", None)
        r.setdefault("lost", None)
        out.append(r)
    return out


if __name__ == "__main__":
    import sys
    import tempfile

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    with tempfile.TemporaryDirectory() as d:
        for r in rows(Path(d)):
            print(r)
