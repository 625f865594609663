"""The /metrics sidecar (zerodoc/exporter/sidecar.py), with real sockets and processes: the
sidecar answers (right and wrong passwords, the page's bytes) while the rank's only exporter
thread is its publisher and the page is rendered per interval, not per request; it holds the
connection cap and the whole-request deadline; it does TLS; the rank's close waits for the
scrapers it reports; it exits with its rank (kill -9) and frees the port; if it cannot start,
the rank serves in-process."""

from __future__ import annotations

import base64
import gzip
import json
import os
import signal
import threading
import socket
import subprocess

import bcrypt  # the dev extra: missing is a failure, not a skip
import pytest

from tests.support.helpers import gauge_registry, job_command, job_env, pids_gone, wait_until
from zerodoc.exporter import limits, sidecar, webconfig
from zerodoc.exporter.page import Page

pytestmark = pytest.mark.slow  # every test starts a sidecar process


def web_config(tmp_path):
    h = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()
    p = tmp_path / "web.yml"
    p.write_text(json.dumps({"basic_auth_users": {"prometheus": h},
                             "http_server_config": {"headers": {"X-Frame-Options": "deny"}}}))
    return webconfig.load(p)


def registry(series: int = 20):
    return gauge_registry(series)


@pytest.fixture
def side(tmp_path):
    made = []

    def go(reg=None, **kw):
        page = Page(reg or registry(), stamp=lambda: 1, max_age_s=1.0)
        srv = sidecar.SidecarServer("127.0.0.1", 0, page, socket.AF_INET, web_config(tmp_path),
                                    limits=limits.Limits(**kw) if kw else None)
        srv.start()
        made.append(srv)
        return srv

    yield go
    for s in made:
        s.shutdown()
        s.server_close()


def ask(port: int, pw: str | None, extra: bytes = b"") -> tuple[str, dict, bytes]:
    head = b"GET /metrics HTTP/1.0\r\n" + extra
    if pw is not None:
        head += b"Authorization: Basic " + base64.b64encode(f"prometheus:{pw}".encode()) + b"\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(head + b"\r\n")
        out = b""
        while True:
            b = s.recv(1 << 16)
            if not b:
                break
            out += b
    h, _, body = out.partition(b"\r\n\r\n")
    lines = h.decode("latin-1").split("\r\n")
    return lines[0], {k.lower(): v.strip() for k, _, v in
                      (ln.partition(":") for ln in lines[1:])}, body


def served(port: int):
    """The answer to a right password, None while it is 503 (no page published yet)."""
    answer = ask(port, "s3cret")
    return None if answer[0].startswith("HTTP/1.0 503 ") else answer


def exporter_threads() -> list[str]:
    return sorted(open(f"/proc/self/task/{t}/comm").read().strip()
                  for t in os.listdir("/proc/self/task")
                  if open(f"/proc/self/task/{t}/comm").read().startswith("zd-metrics"))


def test_the_sidecar_answers_while_the_rank_only_publishes(side):
    from prometheus_client import generate_latest

    reg = registry(50)
    srv = side(reg)
    port = srv.server_address[1]
    status, headers, body = ask(port, "s3cret", b"Accept-Encoding: gzip\r\n")
    assert status == "HTTP/1.0 200 OK" and headers["content-encoding"] == "gzip"
    assert gzip.decompress(body) == generate_latest(reg)
    assert headers["x-frame-options"] == "deny"
    status, headers, body = ask(port, "s3cret",
                                b"Accept: application/openmetrics-text; version=1.0.0\r\n")
    assert headers["content-type"].startswith("application/openmetrics-text")
    assert body.endswith(b"# EOF\n")
    wrong = [ask(port, f"wrong{i}")[0] for i in range(webconfig.FAIL_LIMIT)]
    assert wrong == ["HTTP/1.0 401 Unauthorized"] * webconfig.FAIL_LIMIT  # checked once
    assert ask(port, "a new guess")[0] == "HTTP/1.0 429 Too Many Requests"  # over the limit
    renders = srv.page.renders
    for _ in range(30):
        assert ask(port, "s3cret")[0] == "HTTP/1.0 200 OK"  # a verified one, from any address
    assert srv.page.renders - renders <= 4 * 2  # per interval (a second), not per request
    assert exporter_threads() == ["zd-metrics-pub"]  # no thread of the rank took a connection
    wait_until(lambda: srv.stats.requests["ok"] == 32, 10, "the sidecar's counts in the rank")
    assert srv.stats.requests["unauthorized"] == webconfig.FAIL_LIMIT
    assert srv.stats.requests["rate_limited"] == 1
    assert srv.sidecar_cpu_s > 0


def test_the_rank_learns_who_scraped(side):
    srv = side()
    seen = []
    srv.on_scraped = seen.append
    ask(srv.server_address[1], "s3cret", b"User-Agent: Prometheus/3\r\n")
    wait_until(lambda: seen == [("127.0.0.1", "Prometheus/3")], 10, "the scrape reported")


def test_the_sidecar_holds_the_cap_and_the_deadline(side):
    srv = side(max_connections=2, request_deadline_s=1.0)
    port = srv.server_address[1]
    held = []
    for _ in range(2):  # trickling clients: a request that never ends
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(b"GET /metrics HTTP/1.1\r\n")
        held.append(s)
    wait_until(lambda: ask(port, "s3cret")[0].startswith("HTTP/1.0 503"), 10, "503 over the cap")
    for s in held:
        assert s.recv(64) == b""  # cut off at the deadline
        s.close()
    wait_until(lambda: srv.stats.requests["timed_out"] == 2, 10, "the cut-offs counted")
    assert srv.stats.requests["over_capacity"] >= 1
    assert ask(port, "s3cret")[0] == "HTTP/1.0 200 OK"


def test_the_sidecar_dies_with_its_rank(tmp_path):
    cfg = web_config(tmp_path)
    rank = subprocess.Popen(job_command("sidecar_rank", cfg.path), env=job_env(),
                            stdout=subprocess.PIPE, text=True)
    try:
        port, pid = map(int, rank.stdout.readline().split())
        assert ask(port, "s3cret")[0] == "HTTP/1.0 200 OK"
        rank.send_signal(signal.SIGKILL)
        rank.wait(timeout=10)
        wait_until(lambda: pids_gone([pid]), 10, "the sidecar gone with its rank")

        def free() -> bool:
            with socket.socket() as s:  # as a restarted rank binds (TIME_WAIT allowed)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind(("127.0.0.1", port))
                    return True
                except OSError:
                    return False
        wait_until(free, 10, "the port freed")
    finally:
        rank.kill()
        rank.wait()


def test_the_sidecar_is_the_default_for_basic_auth(tmp_path, monkeypatch):
    monkeypatch.delenv(sidecar.ENV, raising=False)
    monkeypatch.setenv(webconfig.ENV, str(web_config(tmp_path).path))
    assert sidecar.wanted(cfg=webconfig.from_env())
    monkeypatch.setenv(sidecar.ENV, "0")
    assert not sidecar.wanted(cfg=webconfig.from_env())
    monkeypatch.setenv(sidecar.ENV, "1")
    assert sidecar.wanted(cfg=None)


def test_an_unknown_sidecar_setting_is_named_and_the_default_kept(tmp_path):
    cfg = web_config(tmp_path)
    named = r"ZERODOC_EXPORTER_SIDECAR='maybe' is not 1/0.*by a sidecar"
    with pytest.warns(UserWarning, match=named):
        assert sidecar.wanted(env={sidecar.ENV: "maybe"}, cfg=cfg)
    with pytest.warns(UserWarning, match=r"'2'.*in-process"):
        assert not sidecar.wanted(env={sidecar.ENV: "2"}, cfg=None)


def test_a_live_run_with_basic_auth_serves_from_sidecars(tmp_path):
    """serve() in a real 2-rank job: each rank has a zd-sidecar child serving its page; the
    sidecars end with the job."""
    from tests.support.helpers import LiveDemo

    cfg = web_config(tmp_path)
    env = {webconfig.ENV: str(cfg.path)}
    with LiveDemo(tmp_path, env=env) as demo:
        def sidecars() -> list[int]:
            kids = []
            for p in demo.job.procs:  # started by the publisher thread: its children
                for tid in os.listdir(f"/proc/{p.pid}/task"):
                    for kid in open(f"/proc/{p.pid}/task/{tid}/children").read().split():
                        if open(f"/proc/{kid}/comm").read().startswith("zd-sidecar"):
                            kids.append(int(kid))
            return kids if len(kids) == 2 else []
        kids = wait_until(sidecars, 20, "a named sidecar per rank")
        for ep in demo.endpoints:
            port = int(ep.rsplit(":", 1)[1])
            # 503 until the rank's first page is published (its collector's facts come after
            # the server starts), then the page
            status, _h, body = wait_until(lambda: served(port), 10, "the first page")
            assert status == "HTTP/1.0 200 OK" and b"zerodoc_" in body
            assert ask(port, "nope")[0] == "HTTP/1.0 401 Unauthorized"
    wait_until(lambda: pids_gone(kids), 15, "the sidecars gone with the job")


def test_the_sidecar_imports_neither_torch_nor_prometheus_client():
    import sys

    out = subprocess.run([sys.executable, "-c", "import sys, zerodoc.exporter.sidecar; print("
                          "sorted({m.split('.')[0] for m in sys.modules} & "
                          "{'torch', 'prometheus_client', 'numpy'}))"],
                         env=job_env(), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr


def test_a_sidecar_that_cannot_start_means_in_process(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from zerodoc.exporter import server
    from zerodoc.shim.hookpoints import HookRegistry

    monkeypatch.setenv(webconfig.ENV, str(web_config(tmp_path).path))
    monkeypatch.setattr(sidecar.sys, "executable", str(tmp_path / "no-such-python"))
    monitor = SimpleNamespace(registry=HookRegistry(), rank=0, local_rank=0, local_world_size=1)
    with pytest.warns(UserWarning, match="cannot start the /metrics sidecar"):
        srv, endpoint = server.serve(monitor, 0, "127.0.0.1")
    try:
        assert isinstance(srv, server.MetricsServer) and endpoint.startswith("127.0.0.1:")
    finally:
        srv.shutdown()
        srv.server_close()


def test_the_sidecar_does_tls_with_client_certificates(tmp_path):
    """TLS in the sidecar: the handshake there (a client certificate from the CA required),
    then the password, then the page; a client without a certificate gets no page."""
    import ssl

    from tests.support import tlsutil

    tlsutil.need_openssl()
    ca = tlsutil.make_ca(tmp_path, "ca")
    cert = tlsutil.make_cert(tmp_path, "server", ca, "IP:127.0.0.1,DNS:localhost")
    client = tlsutil.make_cert(tmp_path, "client", ca, "DNS:prometheus.test")
    h = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()
    path = tmp_path / "web.yml"
    path.write_text(json.dumps({
        "tls_server_config": {"cert_file": str(cert[0]), "key_file": str(cert[1]),
                              "client_auth_type": "RequireAndVerifyClientCert",
                              "client_ca_file": str(ca[0])},
        "basic_auth_users": {"prometheus": h}}))
    cfg = webconfig.load(path)
    assert sidecar.wanted(env={}, cfg=cfg)
    srv = sidecar.SidecarServer("127.0.0.1", 0, Page(registry(), stamp=lambda: 1, max_age_s=1),
                                socket.AF_INET, cfg)
    srv.start()
    try:
        assert srv.scheme == "https"
        port = srv.server_address[1]

        def https(ctx, pw):
            with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
                    ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
                s.sendall(b"GET /metrics HTTP/1.0\r\nAuthorization: Basic "
                          + base64.b64encode(f"prometheus:{pw}".encode()) + b"\r\n\r\n")
                out = b""
                while True:
                    b = s.recv(65536)
                    if not b:
                        return out
                    out += b

        ok = ssl.create_default_context(cafile=str(ca[0]))
        ok.load_cert_chain(str(client[0]), str(client[1]))
        assert wait_until(lambda: not https(ok, "s3cret").startswith(b"HTTP/1.0 503 "), 10,
                          "the first page")
        answer = https(ok, "s3cret")
        assert answer.startswith(b"HTTP/1.0 200 OK") and b"zerodoc_test_value" in answer
        assert https(ok, "nope").startswith(b"HTTP/1.0 401 ")
        anonymous = ssl.create_default_context(cafile=str(ca[0]))
        try:  # TLS 1.3: the refusal may come at the first read rather than the handshake
            got = https(anonymous, "s3cret")
        except (ssl.SSLError, OSError):
            got = b""
        assert not got.startswith(b"HTTP/1.0 200"), got
        assert https(ok, "s3cret").startswith(b"HTTP/1.0 200 OK")  # the loop carried on
    finally:
        srv.shutdown()
        srv.server_close()


def test_the_close_waits_for_a_regular_scraper_through_the_sidecar(side):
    """closing.CloseSignal with a sidecar: the close returns once the regular scraper fetched a
    page published after it (reported by the sidecar), well before its linger."""
    import time

    from zerodoc.exporter.closing import CloseSignal

    now = [100.0]
    signal_ = CloseSignal(clock=lambda: now[0])
    srv = side()
    srv.on_scraped, srv.close_signal = signal_.scraped, signal_
    port = srv.server_address[1]
    for n, t in enumerate((100.0, 103.0), 1):  # a scraper every 3 s, as the signal sees it
        now[0] = t
        wait_until(lambda: served(port), 10, "a page")
        wait_until(lambda: [len(v) for v in signal_._seen.values()] == [n], 10, "reported")
    now[0] = 104.0
    done = {}
    closer = threading.Thread(target=lambda: done.update(waited=signal_.close(linger_s=30)))
    closer.start()
    wait_until(lambda: srv._closed_mtime is not None, 10, "the closed page published")
    now[0] = 105.0
    t0 = time.monotonic()
    assert served(port) is not None  # the regular scraper comes back after the close
    closer.join(timeout=20)
    assert not closer.is_alive() and done["waited"] < 9  # its linger: 3 x 3 s
    assert time.monotonic() - t0 < 5


def thread_cpu_s(thread: threading.Thread) -> float:
    """A thread's CPU clock (ns resolution), read from another thread."""
    import time

    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


def test_an_idle_sidecar_costs_the_rank_nothing(side):
    """After a scrape nobody asks: the publisher renders nothing and sleeps on its pipe (the
    build before rendered six variants a second and woke four times a second)."""
    import time

    srv = side()
    port = srv.server_address[1]
    wait_until(lambda: served(port), 10, "a page")
    wait_until(lambda: srv.stats.requests["ok"] == 1, 10, "the sidecar's counts in the rank")
    renders, page_renders = dict(srv.renders), srv.page.renders
    cpu0, t0 = thread_cpu_s(srv.thread), time.monotonic()
    wait_until(lambda: time.monotonic() - t0 >= 3.0, 10, "3 s without a request")
    cpu = thread_cpu_s(srv.thread) - cpu0
    assert srv.renders == renders and srv.page.renders == page_renders
    assert cpu < 0.002, f"the idle publisher took {cpu * 1e3:.2f} ms of CPU in 3 s"
    assert srv.thread.is_alive()


def test_a_scrape_gets_a_page_rendered_after_its_request(tmp_path, side):
    """The page's values are those of the moment of the scrape (a step counter changed just
    before it), not of a page published up to a second earlier."""
    import time

    from prometheus_client import CollectorRegistry, Gauge

    reg = CollectorRegistry()
    step = Gauge("zerodoc_test_step", "A step counter.", registry=reg)
    srv = side(reg)
    port = srv.server_address[1]
    for n in range(1, 4):
        text = srv.folder / "text"
        # the last page is older than max_age: the scrape must ask the rank for a new one
        wait_until(lambda: not text.exists() or
                   time.time_ns() - text.stat().st_mtime_ns > srv.max_age_s * 1e9, 10,
                   "the page older than max_age")
        step.set(n)
        status, headers, body = wait_until(lambda: served(port), 10, "a page")
        assert f"zerodoc_test_step {float(n)}".encode() in body, body
        assert "x-zerodoc-page" not in headers  # fresh, not the stale fallback
    assert srv.renders["text"] == 3 and srv.renders["om"] == 0  # only the variant asked for


def test_a_flood_costs_one_render_per_variant_per_max_age(side):
    import time

    srv = side()
    port = srv.server_address[1]
    t0 = time.monotonic()
    for _ in range(50):
        assert ask(port, "s3cret", b"Accept-Encoding: gzip\r\n")[0] == "HTTP/1.0 200 OK"
    for _ in range(50):
        assert ask(port, "s3cret")[0] == "HTTP/1.0 200 OK"
    intervals = (time.monotonic() - t0) / srv.max_age_s
    assert 1 <= srv.renders["text.gz"] <= intervals + 1, (srv.renders, intervals)
    assert 1 <= srv.renders["text"] <= intervals + 1, (srv.renders, intervals)
    assert srv.renders["om"] == srv.renders["own.text"] == 0


def test_a_busy_rank_gets_the_last_page_marked_stale(side):
    """The rank cannot render in time (here: its publisher is stuck in a render, as behind a
    training thread holding the GIL): the sidecar answers with the page it has, marked."""
    import time

    srv = side()
    port = srv.server_address[1]
    assert wait_until(lambda: served(port), 10, "a page")[0] == "HTTP/1.0 200 OK"
    text = srv.folder / "text"
    wait_until(lambda: time.time_ns() - text.stat().st_mtime_ns > srv.max_age_s * 1e9, 10,
               "the page older than max_age")
    release = threading.Event()
    real = srv.page.bake
    srv.page.bake = lambda *a: (release.wait(20), real(*a))[1]
    try:
        t0 = time.monotonic()
        status, headers, body = ask(port, "s3cret")
        waited = time.monotonic() - t0
        assert status == "HTTP/1.0 200 OK" and headers["x-zerodoc-page"] == "stale"
        assert b"zerodoc_test_value" in body and 0.4 < waited < 5
    finally:
        release.set()
    wait_until(lambda: srv.stale_served >= 1, 10, "the stale answer counted")


def test_the_sidecar_exits_at_the_end_of_the_ranks_pipe(tmp_path):
    """Its rank alive (no PDEATHSIG, the parent check passes) but the rank's end of the ack
    pipe closed: the sidecar exits (and a live pipe keeps it up)."""
    import select
    import sys

    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(8)
    ask_r, ask_w = os.pipe()
    done_r, done_w = os.pipe()
    proc = subprocess.Popen([sys.executable, "-m", "zerodoc.exporter.sidecar", "--fd",
                             str(ls.fileno()), "--dir", str(tmp_path), "--parent",
                             str(os.getpid()), "--ask-fd", str(ask_w), "--done-fd",
                             str(done_r)], pass_fds=(ls.fileno(), ask_w, done_r), env=job_env())
    os.close(ask_w)
    os.close(done_r)
    try:
        with socket.create_connection(ls.getsockname(), timeout=10) as s:  # it serves
            s.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
            asked = b""  # it asks the rank for the page (after its first "stats" maybe)
            while b"text\n" not in asked:
                assert select.select([ask_r], [], [], 10)[0], "no request for the page"
                asked += os.read(ask_r, 64)
            assert set(asked.split()) <= {b"text", b"stats"}, asked
        assert proc.poll() is None
        os.close(done_w)
        proc.wait(timeout=10)
        assert proc.returncode == 0
    finally:
        proc.kill()
        proc.wait()
        os.close(ask_r)
        ls.close()


def test_a_killed_sidecar_is_said_once_and_started_again(tmp_path):
    """A sidecar killed under the rank: the publisher, asleep on the pipe, wakes at its EOF
    within a second (no polling), reaps it, says why once (the signal, no traceback), and
    starts a new one on the same socket: the port answers again, the counts go on."""
    import time

    exits, errors = [], []
    srv = sidecar.SidecarServer("127.0.0.1", 0, Page(registry(), stamp=lambda: 1, max_age_s=1),
                                socket.AF_INET, web_config(tmp_path), on_error=errors.append,
                                on_sidecar=exits.append)
    srv.start()
    try:
        port = srv.server_address[1]
        wait_until(lambda: served(port), 10, "a page")
        wait_until(lambda: srv.stats.requests["ok"] >= 1, 10, "the first sidecar's count")
        first = srv.proc
        first.send_signal(signal.SIGKILL)
        t0 = time.monotonic()
        wait_until(lambda: exits, 5, "the exit seen")
        assert time.monotonic() - t0 < 1.0
        assert [type(e).__name__ for e in exits] == ["SidecarExit"]
        said = str(exits[0])
        assert "SIGKILL" in said and "restarted at once" in said and "Traceback" not in said
        assert pids_gone([first.pid]) and first.returncode == -signal.SIGKILL  # reaped
        assert srv.proc is not first and srv.proc.poll() is None
        assert wait_until(lambda: served(port), 10, "the new sidecar's page")[0] == \
            "HTTP/1.0 200 OK"
        wait_until(lambda: srv.stats.requests["ok"] >= 2, 10, "the counts carried on")
        assert srv.exits == 1 and errors == []
    finally:
        srv.shutdown()
        srv.server_close()
