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
import ssl
import urllib.error
import urllib.request
import warnings
from pathlib import Path
from types import SimpleNamespace

import bcrypt  # the dev extra: missing is a failure, not a skip
import pytest

from tests.support import tlsutil
from tests.support.helpers import LiveDemo
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
