"""The /metrics server off loopback: TLS, client certificates and basic auth from a web
configuration file (Prometheus exporter-toolkit format) named by $ZERODOC_WEB_CONFIG_FILE.

Witnesses: a real Prometheus scraping a live 2-rank demo over TLS with its `tls_config` and
`basic_auth` (and failing to without them); Python's ssl client and urllib for the in-process
cases; certificates made by the `openssl` command line; password hashes made by the `bcrypt`
library and passlib's documented PBKDF2 examples.
"""

from __future__ import annotations

import base64
import json
import socket
import ssl
import time
import urllib.error
import urllib.request
import warnings
from pathlib import Path
from types import SimpleNamespace

import bcrypt  # the dev extra: missing is a failure, not a skip
import pytest

from tests.support import hostile, tlsutil
from tests.support.helpers import LiveDemo, wait_until
from tests.support.promserver import PromServer, require_binary
from zerodoc.exporter import server, sidecar, webconfig
from zerodoc.exporter.webconfig import WebConfigError
from zerodoc.shim.hookpoints import HookRegistry


# passlib's documentation examples (passlib.hash.pbkdf2_digest; passlib front page)
PASSLIB_VECTORS = [
    ("password", "$pbkdf2-sha256$6400$0ZrzXitFSGltTQnBWOsdAw$"
                 "Y11AchqV4b0sUisdZd0Xr97KWoymNE0LNNrnEgY4H9M"),
    ("toomanysecrets", "$pbkdf2-sha256$29000$N2YMIWQsBWBMae09x1jrPQ$"
                       "1t8iyB2A.WF/Z5JZv.lfCIhXXN33N23OSgQYThBYRfk"),
]


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    tlsutil.need_openssl()
    d = tmp_path_factory.mktemp("pki")
    ca = tlsutil.make_ca(d, "ca")
    other_ca = tlsutil.make_ca(d, "other-ca")
    return SimpleNamespace(
        dir=d, ca=ca[0],
        server=tlsutil.make_cert(d, "server", ca, "IP:127.0.0.1,DNS:localhost"),
        client=tlsutil.make_cert(d, "client", ca, "DNS:prometheus.test"),
        intruder=tlsutil.make_cert(d, "intruder", other_ca, "DNS:prometheus.test"),
        stranger=tlsutil.make_cert(d, "stranger", ca, "DNS:someone-else.test"),
        ca_pair=ca)


def users() -> dict[str, str]:
    return {"prometheus": bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()
            .replace("$2b$", "$2y$"),  # htpasswd -B writes $2y$
            "stdlib": webconfig.hash_password("0ther", "pbkdf2-sha256", rounds=1000)}


def write_config(path: Path, pki=None, *, client_auth="RequireAndVerifyClientCert",
                 users_=None, extra_tls=None, headers=None) -> Path:
    cfg: dict = {}
    if pki is not None:
        cfg["tls_server_config"] = {"cert_file": str(pki.server[0]),
                                    "key_file": str(pki.server[1]),
                                    "client_auth_type": client_auth,
                                    "client_ca_file": str(pki.ca), **(extra_tls or {})}
    if users_:
        cfg["basic_auth_users"] = users_
    if headers:
        cfg["http_server_config"] = {"headers": headers}
    path.write_text(json.dumps(cfg))  # JSON is YAML
    return path


def registry():
    from prometheus_client import CollectorRegistry, Gauge

    reg = CollectorRegistry()
    Gauge("zerodoc_test_value", "A test gauge.", registry=reg).set(42)
    return reg


def client_ctx(pki, cert=None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki.ca))
    if cert is not None:
        ctx.load_cert_chain(str(cert[0]), str(cert[1]))
    return ctx


def get(url: str, ctx=None, auth: tuple[str, str] | None = None):
    req = urllib.request.Request(url)
    if auth:
        req.add_header("Authorization",
                       "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode())
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
            return r.status, r.read().decode(), r.headers
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(), e.headers


@pytest.fixture
def running(tmp_path, pki):
    servers = []

    def start(cfg):
        srv = server.start("127.0.0.1", 0, registry(), cfg)
        servers.append(srv)
        return srv, f"{srv.scheme}://127.0.0.1:{srv.server_address[1]}/metrics"

    yield start
    for s in servers:
        s.shutdown()
        s.server_close()


def test_tls_with_client_certificate_and_basic_auth(tmp_path, pki, running):
    cfg = webconfig.load(write_config(tmp_path / "web.yml", pki, users_=users(),
                                      headers={"X-Content-Type-Options": "nosniff"}))
    srv, url = running(cfg)
    assert url.startswith("https://")
    ok = client_ctx(pki, pki.client)
    status, body, headers = get(url, ok, ("prometheus", "s3cret"))
    assert status == 200 and "zerodoc_test_value 42.0" in body
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert get(url, ok, ("stdlib", "0ther"))[0] == 200  # the PBKDF2 user
    status, _, headers = get(url, ok)
    assert status == 401 and headers["WWW-Authenticate"].startswith("Basic")
    assert get(url, ok, ("prometheus", "wrong"))[0] == 401
    assert get(url, ok, ("nobody", "s3cret"))[0] == 401
    rejected = srv.rejected
    for ctx in (client_ctx(pki), client_ctx(pki, pki.intruder)):  # no / untrusted client cert
        with pytest.raises((ssl.SSLError, ConnectionError, urllib.error.URLError)):
            get(url, ctx, ("prometheus", "s3cret"))
    with pytest.raises((ConnectionError, urllib.error.URLError, OSError)):
        get(url.replace("https://", "http://"), None, ("prometheus", "s3cret"))
    assert srv.rejected >= rejected + 2


def test_client_allowed_sans(tmp_path, pki, running):
    cfg = webconfig.load(write_config(tmp_path / "web.yml", pki,
                                      extra_tls={"client_allowed_sans": ["prometheus.test"]}))
    _srv, url = running(cfg)
    assert get(url, client_ctx(pki, pki.client))[0] == 200
    with pytest.raises((ssl.SSLError, ConnectionError, urllib.error.URLError, OSError)):
        get(url, client_ctx(pki, pki.stranger))  # signed by the CA, but not an allowed name


def test_basic_auth_without_tls(tmp_path, running):
    cfg = webconfig.load(write_config(tmp_path / "web.yml", users_=users()))
    _srv, url = running(cfg)
    assert url.startswith("http://")
    assert get(url)[0] == 401
    assert get(url, None, ("prometheus", "s3cret"))[0] == 200


def test_rotated_certificate_is_served_without_a_restart(tmp_path, pki, running):
    d = tmp_path / "rot"
    d.mkdir()
    first = tlsutil.make_cert(d, "first", pki.ca_pair, "IP:127.0.0.1")
    cert, key = d / "tls.crt", d / "tls.key"
    cert.write_bytes(first[0].read_bytes())
    key.write_bytes(first[1].read_bytes())
    (d / "web.yml").write_text("tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n")
    _srv, url = running(webconfig.load(d / "web.yml"))  # relative paths: from the file

    def served_serial() -> str:
        import socket

        port = int(url.split(":")[2].split("/")[0])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s, \
                client_ctx(pki).wrap_socket(s, server_hostname="127.0.0.1") as t:
            return t.getpeercert()["serialNumber"].upper()

    assert served_serial() == tlsutil.serial(first[0])
    second = tlsutil.make_cert(d, "second", pki.ca_pair, "IP:127.0.0.1")
    key.write_bytes(second[1].read_bytes())
    cert.write_bytes(second[0].read_bytes())
    assert served_serial() == tlsutil.serial(second[0]) != tlsutil.serial(first[0])


def test_password_hashes():
    for pw, h in PASSLIB_VECTORS:
        assert webconfig.verify_password(pw, h)
        assert not webconfig.verify_password(pw + "x", h)
    h = webconfig.hash_password("pw", "pbkdf2-sha256", rounds=1000)
    assert webconfig.verify_password("pw", h) and not webconfig.verify_password("pW", h)
    b = bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4)).decode()
    for variant in (b, b.replace("$2b$", "$2y$"), b.replace("$2b$", "$2a$")):
        assert webconfig.verify_password("pw", variant)
    assert bcrypt.checkpw(b"pw", webconfig.hash_password("pw", "bcrypt", rounds=4).encode())


@pytest.mark.parametrize("scheme", ["bcrypt", "pbkdf2-sha256"])
def test_hash_password_command(scheme, monkeypatch, capsys, tmp_path):
    import io

    from zerodoc.cli import webconfig as command

    monkeypatch.setattr("sys.stdin", io.StringIO("hunter2\n"))
    assert command.main(["hash-password", "--scheme", scheme]) == 0
    h = capsys.readouterr().out.strip()
    assert webconfig.verify_password("hunter2", h) and not webconfig.verify_password("x", h)
    (tmp_path / "web.yml").write_text(f"basic_auth_users:\n  prometheus: '{h}'\n")
    assert command.main(["check", str(tmp_path / "web.yml")]) == 0
    assert "basic auth users: 1" in capsys.readouterr().out


def test_checks_are_cached_right_and_wrong(monkeypatch):
    calls = []
    real = webconfig.verify_password
    monkeypatch.setattr(webconfig, "verify_password",
                        lambda pw, h: calls.append(pw) or real(pw, h))
    auth = webconfig.Authenticator(users())
    for _ in range(3):
        assert auth.check("prometheus", "s3cret")
        assert not auth.check("prometheus", "nope")
        assert not auth.check("ghost", "s3cret")  # unknown users cost a check too
    # each credential checked once: the right one, the wrong one, the unknown user's
    assert calls == ["s3cret", "nope", "s3cret"] and auth.hash_checks == 3
    # the cache is keyed by a salted hash: no password in it
    keys = b"".join(list(auth._right) + list(auth._wrong))
    assert b"s3cret" not in keys and b"nope" not in keys


@pytest.mark.parametrize("cfg, msg", [
    ({"tls_server_config": {"cert_file": "x"}, "nope": 1}, "unknown key(s) nope"),
    ({"tls_server_config": {"cipher_suites": ["TLS_AES_128_GCM_SHA256"]}}, "not supported"),
    ({"tls_server_config": {"cert_file": "{crt}", "key_file": "{key}",
                            "client_auth_type": "RequireAnyClientCert"}}, "not supported"),
    ({"tls_server_config": {"cert_file": "{crt}", "key_file": "{key}",
                            "client_auth_type": "RequireAndVerifyClientCert"}},
     "needs client_ca_file"),
    ({"tls_server_config": {"cert_file": "/nonexistent.crt", "key_file": "{key}"}},
     "not a readable file"),
    ({"tls_server_config": {"cert_file": "{crt}"}}, "both cert_file and key_file"),
    ({"tls_server_config": {"cert_file": "{crt}", "key_file": "{crt}"}},
     "cannot load the TLS files"),
    ({"tls_server_config": {"cert_file": "{crt}", "key_file": "{key}", "min_version": "SSL3"}},
     "min_version"),
    ({"basic_auth_users": {"u": "plaintext"}}, "plain-text passwords are not accepted"),
    ({"basic_auth_users": {"u": "$pbkdf2-sha256$x"}}, "malformed"),
    ({"http_server_config": {"http3": True}}, "unknown http_server_config"),
])
def test_bad_configuration_is_a_clear_error(tmp_path, pki, cfg, msg):
    text = json.dumps(cfg).replace("{crt}", str(pki.server[0])).replace("{key}",
                                                                        str(pki.server[1]))
    (tmp_path / "web.yml").write_text(text)
    with pytest.raises(WebConfigError, match=msg.replace("(", r"\(").replace(")", r"\)")):
        webconfig.load(tmp_path / "web.yml")


def test_bcrypt_hash_without_bcrypt_installed_is_a_clear_error(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__
    monkeypatch.setattr(builtins, "__import__", lambda name, *a, **k: (
        (_ for _ in ()).throw(ImportError(name)) if name == "bcrypt" else real_import(name, *a,
                                                                                       **k)))
    (tmp_path / "web.yml").write_text(json.dumps({"basic_auth_users": {"u": "$2y$10$abc"}}))
    with pytest.raises(WebConfigError, match=r"zerodoc\[web\]"):
        webconfig.load(tmp_path / "web.yml")


def fake_monitor(local_rank=0):
    return SimpleNamespace(registry=HookRegistry(), rank=local_rank, local_rank=local_rank,
                           local_world_size=1)


def test_broken_config_means_no_server_and_a_warning(tmp_path, monkeypatch):
    (tmp_path / "web.yml").write_text("basic_auth_users: {u: plaintext}\n")
    monkeypatch.setenv(webconfig.ENV, str(tmp_path / "web.yml"))
    m = fake_monitor()
    with pytest.warns(UserWarning, match="not serving /metrics"):
        assert server.serve(m, 0, "127.0.0.1") == (None, None)
    assert m.registry.errors == {"exporter_config": 1}


@pytest.mark.parametrize("config, expect", [
    (None, "without TLS or authentication"),
    ("auth", "clear text"),
    ("tls", None),
])
def test_warning_when_bound_off_loopback(tmp_path, pki, monkeypatch, config, expect):
    monkeypatch.setenv(sidecar.ENV, "0")  # the warnings are the rank's, with a sidecar or not
    if config:
        path = write_config(tmp_path / "web.yml", pki if config == "tls" else None,
                            client_auth="NoClientCert",
                            users_=users() if config == "auth" else None)
        monkeypatch.setenv(webconfig.ENV, str(path))
    else:
        monkeypatch.delenv(webconfig.ENV, raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        srv, endpoint = server.serve(fake_monitor(), 0, "0.0.0.0")
    try:
        assert srv is not None and endpoint.startswith("0.0.0.0:")
        texts = [str(w.message) for w in caught]
        if expect:
            assert any(expect in t for t in texts), texts
        else:
            assert not texts, texts
    finally:
        srv.shutdown()
        srv.server_close()
    with warnings.catch_warnings(record=True) as caught:  # loopback: no warning
        warnings.simplefilter("always")
        srv, _ = server.serve(fake_monitor(), 0, "127.0.0.1")
    srv.shutdown()
    srv.server_close()
    assert not [w for w in caught if "/metrics on" in str(w.message)]


@pytest.mark.slow
def test_prometheus_scrapes_a_live_run_over_tls_with_basic_auth(tmp_path, pki):
    require_binary("prometheus")
    cfg = write_config(tmp_path / "web.yml", pki, users_=users())
    tls = {"ca_file": str(pki.ca), "cert_file": str(pki.client[0]),
           "key_file": str(pki.client[1])}
    auth = {"username": "prometheus", "password": "s3cret"}

    def job(name, **kw):
        return {"job_name": name, "scrape_interval": "1s", "scrape_timeout": "1s",
                "static_configs": [{"targets": demo.endpoints}], **kw}

    with LiveDemo(tmp_path, env={webconfig.ENV: str(cfg)}, name="tlsrun") as demo:
        scrape = [job("good", scheme="https", tls_config=tls, basic_auth=auth),
                  job("no-client-cert", scheme="https", tls_config={"ca_file": str(pki.ca)},
                      basic_auth=auth),
                  job("wrong-password", scheme="https", tls_config=tls,
                      basic_auth={"username": "prometheus", "password": "guess"}),
                  job("plain-http", basic_auth=auth)]
        with PromServer(tmp_path, extra_scrape_configs=scrape) as prom:
            prom.wait_for('up{job="good"} == 1', min_results=2, timeout=60)
            world = prom.wait_for('zerodoc_world_size{job="good"}', min_results=2)
            assert {float(s["value"][1]) for s in world} == {2.0}
            import zerodoc

            prom.wait_for(f'zerodoc_build_info{{job="good",version="{zerodoc.__version__}"}}',
                          min_results=2)
            for bad in ("no-client-cert", "wrong-password", "plain-http"):
                down = prom.wait_for(f'up{{job="{bad}"}} == 0', min_results=2)
                assert len(down) == 2, bad
            assert not prom.query('zerodoc_world_size{job!="good"}')
            errors = {t["labels"]["job"]: t["lastError"]
                      for t in prom.api("targets")["activeTargets"]}
            assert "401" in errors["wrong-password"], errors
            assert errors["good"] == "", errors


# --- authentication that a flood cannot turn against Prometheus (issue 32 item 2) --------
def test_non_ascii_basic_credentials_are_refused_not_raised(tmp_path):
    """`Authorization: Basic éé` is not base64 of anything: 401, never an exception (it
    raised ValueError, which ended the sidecar process and left the in-process server's
    connection unanswered, booked as a TLS error)."""
    assert webconfig.basic_credentials("Basic éé") == (None, "")
    auth = webconfig.Authenticator(users())
    assert auth.header_verdict("Basic éé", "10.0.0.1") == "unauthorized"
    request = b"GET /metrics HTTP/1.0\r\nAuthorization: Basic \xc3\xa9\xc3\xa9\r\n\r\n"
    cfg = webconfig.WebConfig(path=Path("web.yml"), users=users())
    errors = []
    srv = server.start("127.0.0.1", 0, registry(), cfg, on_error=errors.append)
    loop = hostile.SidecarLoop(tmp_path / "side", cfg)
    try:
        for port in (srv.server_address[1], loop.port):
            assert hostile.status_of(hostile.ask(port, request)) == 401
            assert hostile.status_of(hostile.ask(port, hostile.scrape("prometheus", "s3cret"))) \
                == 200  # still serving
        assert errors == []
        assert srv.stats.requests["unauthorized"] == 1
        wait_until(lambda: loop.requests["unauthorized"] == 1, 5, "the sidecar's 401 counted")
    finally:
        srv.shutdown()
        srv.server_close()
        loop.close()


def fake_clock(auth: webconfig.Authenticator) -> list:
    """`auth` on a clock of the test's (failure windows, check turns), a full bucket at 0."""
    now = [0.0]
    auth.clock = lambda: now[0]
    auth._refilled = 0.0
    return now


def flood_and_scrape(port: int, auth, interval_s: float, minutes: float, ctx=None) -> list:
    """A client repeating one wrong password from the scraper's own address (127.0.0.1), more
    than FLOOD_LIMIT times in every failure window, from before the scraper's first scrape
    on; the scraper scraping every `interval_s` for `minutes`, on the Authenticator's clock
    (advanced by the test: simulated time). Returns the scraper's statuses."""
    now = fake_clock(auth)
    wrong = hostile.scrape("prometheus", "wrong", agent="stale-config/1")
    statuses = []
    t = 0.0
    while t < minutes * 60:
        for k in range(2):  # the flood in the window before the scrape: FLOOD_LIMIT + 1
            now[0] = t + k * 0.1
            for _ in range(webconfig.FLOOD_LIMIT // 2 + 1):
                hostile.ask(port, wrong, ctx=ctx)  # 401 (429, or unread: the old ways)
        now[0] = t + 1.0
        statuses.append(hostile.status_of(
            hostile.ask(port, hostile.scrape("prometheus", "s3cret"), ctx=ctx)))
        t += interval_s
    return statuses


def test_a_flood_from_the_scrapers_address_never_refuses_the_scraper(tmp_path):
    """Issue 32: a client sharing Prometheus' address (NAT, a mesh proxy) repeating one wrong
    password got Prometheus answered 429 before its request was read (seen at t = 45, 60,
    75 s at a 15 s interval), and its first login refused. Now: the request is read; a
    repeated wrong password guesses nothing and limits nothing; a verified credential is
    served whatever its address did. 11 simulated minutes at a 15 s interval, in-process
    and in the sidecar's loop."""
    cfg = webconfig.WebConfig(path=Path("web.yml"), users=users())
    srv = server.start("127.0.0.1", 0, registry(), cfg)
    loop = hostile.SidecarLoop(tmp_path / "side", cfg)
    try:
        for port, auth in ((srv.server_address[1], srv._auth), (loop.port, loop.auth)):
            statuses = flood_and_scrape(port, auth, 15.0, 11)
            assert statuses == [200] * len(statuses), statuses
            assert auth.hash_checks == 2  # the right password and the wrong one, once each
    finally:
        srv.shutdown()
        srv.server_close()
        loop.close()


def test_over_tls_the_early_refusal_spares_the_handshake_but_never_a_scraper(tmp_path, pki,
                                                                            running):
    """Over TLS an address flooding without a login for QUIET_S is answered 429 before its
    handshake (what that refusal spares); a scraper behind it that logged in within QUIET_S
    of the flood's start is never refused so: Prometheus' default 1 m interval for 11
    simulated minutes. Once the scraper stops, the flood is refused unread."""
    cfg = webconfig.load(write_config(tmp_path / "web.yml", pki, client_auth="NoClientCert",
                                      users_=users()))
    srv, _url = running(cfg)
    port, ctx = srv.server_address[1], client_ctx(pki)
    statuses = flood_and_scrape(port, srv._auth, 60.0, 11, ctx=ctx)
    assert statuses == [200] * len(statuses), statuses
    assert srv.stats.requests["rate_limited"] == 0
    now = [srv._auth.clock()]
    srv._auth.clock = lambda: now[0]
    for _ in range(webconfig.FLOOD_LIMIT + 1):  # QUIET_S later, the flood alone
        hostile.ask(port, hostile.scrape("prometheus", "wrong"), ctx=ctx)
        now[0] += webconfig.QUIET_S / webconfig.FLOOD_LIMIT
    for _ in range(webconfig.FLOOD_LIMIT + 1):  # then a flood again, within one window
        hostile.ask(port, hostile.scrape("prometheus", "wrong"), ctx=ctx)
    assert srv._auth.refuse_early("127.0.0.1")
    refused = srv.stats.requests["rate_limited"]
    assert refused >= 1  # the last of that flood
    # answered before any handshake: a plain read sees the 429 (a TLS client: an error)
    assert hostile.status_of(hostile.ask(port, b"")) == 429
    assert srv.stats.requests["rate_limited"] == refused + 1


def test_check_turns_go_to_the_quiet_address_whatever_the_user_name():
    """The order in which waiting credentials are checked: the address that asked for the
    fewest new credentials lately first. 40 addresses that guessed as fast as they could
    each send one more guess: MAX_WAITING of them wait (more could not be checked within
    their wait), the others are refused. Prometheus' first login arrives last, takes the
    place of the busiest waiter (told 429 at once: its connection is freed) and is checked at
    the next turn. Nothing in the order depends on the user name: a quiet address with an
    unknown user is checked first all the same, its answer that of a wrong password."""
    auth = webconfig.Authenticator(users())
    now = fake_clock(auth)
    for k in range(10):  # the guessers' history: every address asked many times
        for i in range(40):
            auth.verdict(("prometheus", "admin")[i % 2], f"g{i}-{k}", f"10.0.1.{i}")
            now[0] += 0.01
    waiting = {}
    for i in range(40):
        t = object()
        got = auth.attempt("prometheus", f"next{i}", f"10.0.1.{i}", t)
        if got == "wait":
            waiting[i] = t
        else:
            assert got == "rate_limited"

    def retry() -> list:
        return [auth.attempt("prometheus", f"next{i}", f"10.0.1.{i}", t)
                for i, t in waiting.items()]

    # those given a check in the history gave their places to those not given one yet
    waiting = {i: t for (i, t), a in zip(list(waiting.items()), retry()) if a == "wait"}
    assert len(waiting) == webconfig.MAX_WAITING

    prom = object()
    assert auth.attempt("prometheus", "s3cret", "10.0.9.9", prom) == "wait"
    answers = retry()
    assert sorted(answers) == ["rate_limited"] + ["wait"] * (webconfig.MAX_WAITING - 1)
    waiting = {i: t for (i, t), a in zip(list(waiting.items()), answers) if a == "wait"}
    now[0] += 1.0 / webconfig.CHECKS_PER_S  # one turn
    assert retry() == ["wait"] * len(waiting)  # the guessers ask first: not their turn
    assert auth.attempt("prometheus", "s3cret", "10.0.9.9", prom) == "ok"
    # an unknown user from a quiet address: first too, and answered as a wrong password
    ghost = object()
    assert auth.attempt("ghost", "s3cret", "10.0.9.7", ghost) == "wait"
    now[0] += 1.0 / webconfig.CHECKS_PER_S
    assert retry() == ["wait"] * len(waiting)
    checks = auth.hash_checks
    assert auth.attempt("ghost", "s3cret", "10.0.9.7", ghost) == "unauthorized"
    assert auth.hash_checks == checks + 1  # checked against a configured hash all the same


def first_login_under_guessing(port: int, interval_s: float, tries: int = 2,
                               settled: bool = False, user=("prometheus", "s3cret"),
                               source: str = "127.0.2.1") -> tuple:
    """40 addresses guessing distinct passwords (the configured user's and names that are
    not), then Prometheus' scrapes from an address of its own, `interval_s` apart: (the
    number of its scrape that got 200 or None, its seconds from the first try, the
    guessers' answers). The first scrape comes as soon as the guessers have taken every
    check and place (the guessers' first credentials, as new as Prometheus', wait), or with
    `settled` once those first ones have been checked. `user`: whose first login."""
    with hostile.Guessers(port, 40) as g:
        wait_until(lambda: g.total() >= 2 * 40, 60, "the guessers under way")
        if settled:
            wait_until(lambda: g.answers[401] >= webconfig.MAX_WAITING, 60,
                       "the guessers' first credentials checked")
        t0 = time.monotonic()
        for k in range(tries):
            if k:
                time.sleep(max(0.0, t0 + k * interval_s - time.monotonic()))  # its interval
            got = hostile.ask(port, hostile.scrape(*user), source=source)
            if hostile.status_of(got) == 200:
                return k + 1, time.monotonic() - t0, dict(g.answers)
        return None, time.monotonic() - t0, dict(g.answers)


def first_logins_under_guessing(port: int) -> None:
    """Prometheus' first login within two scrape intervals (6 s) of the guessers' start;
    another user's at its first scrape once the guessers' first credentials are checked."""
    which, took, answers = first_login_under_guessing(port, 6.0)
    assert which is not None and took < 2 * 6.0, (which, took, answers)
    assert answers.get(429, 0) > 0 and answers.get(401, 0) > 0, answers
    assert set(answers) <= {401, 429}, answers
    which, took, answers = first_login_under_guessing(
        port, 6.0, tries=1, settled=True, user=("stdlib", "0ther"), source="127.0.2.2")
    assert which == 1 and took < webconfig.CHECK_WAIT_S, (which, took, answers)


def test_forty_addresses_guessing_do_not_keep_prometheus_first_login_out():
    """Issue 32: 40 addresses guessing distinct passwords took every password check (2 a
    second), and Prometheus' first login was refused for 60 s. Now it waits for its turn,
    and its address, which asked least, goes first: it logs in within two scrape intervals
    from the guessers' start (here 6 s apart: the guessers' own first credentials, as new as
    Prometheus' and ahead of it, take MAX_WAITING / CHECKS_PER_S = 5 s), and at its first
    scrape once they have been checked."""
    cfg = webconfig.WebConfig(path=Path("web.yml"), users=users())
    srv = server.start("127.0.0.1", 0, registry(), cfg)
    try:
        first_logins_under_guessing(srv.server_address[1])
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.mark.slow
def test_forty_addresses_guessing_do_not_keep_prometheus_first_login_out_of_the_sidecar(
        tmp_path):
    """The same against a sidecar process (its own loop parks the waiting credential)."""
    from zerodoc.exporter.page import Page

    cfg = webconfig.load(write_config(tmp_path / "web.yml", users_=users()))
    srv = sidecar.SidecarServer("127.0.0.1", 0, Page(registry(), stamp=lambda: 1,
                                                     max_age_s=1.0), socket.AF_INET, cfg)
    srv.start()
    try:
        first_logins_under_guessing(srv.server_address[1])
    finally:
        srv.shutdown()
        srv.server_close()
