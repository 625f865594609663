"""What protecting /metrics costs a rank: scrape latency over plain HTTP, TLS, and TLS with a
client certificate and basic auth (bcrypt cost 10, checked once then remembered).

    python bench/exporter_tls.py [--scrapes 200] [--series 1200]

Each scrape is a new connection (as Prometheus' scrapes of an HTTP/1.0 server are), so the TLS
rows include a full handshake per scrape. The registry holds --series gauges (a rank at full
detail serves ~1,200). Needs `openssl` and `bcrypt`. Medians in milliseconds.
"""

from __future__ import annotations

import argparse
import base64
import json
import ssl
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support import tlsutil  # noqa: E402
from zerodoc.exporter import server, webconfig  # noqa: E402


def registry(series: int):
    from prometheus_client import CollectorRegistry, Gauge

    reg = CollectorRegistry()
    g = Gauge("zerodoc_bench_value", "Bench series.", ["i"], registry=reg)
    for i in range(series):
        g.labels(str(i)).set(i)
    return reg


def timed(url: str, n: int, ctx=None, auth: str | None = None) -> float:
    req = urllib.request.Request(url)
    if auth:
        req.add_header("Authorization", auth)
    out = []
    for _ in range(n):
        t = time.perf_counter()
        with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
            r.read()
        out.append(time.perf_counter() - t)
    return statistics.median(out) * 1e3


def main() -> int:
    import bcrypt

    p = argparse.ArgumentParser()
    p.add_argument("--scrapes", type=int, default=200)
    p.add_argument("--series", type=int, default=1200)
    a = p.parse_args()
    d = Path(tempfile.mkdtemp(prefix="zerodoc-tls-bench-"))
    ca = tlsutil.make_ca(d)
    srv_cert = tlsutil.make_cert(d, "server", ca, "IP:127.0.0.1")
    client = tlsutil.make_cert(d, "client", ca, "DNS:prometheus")
    h = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=10)).decode()
    (d / "tls.yml").write_text(json.dumps({"tls_server_config": {
        "cert_file": str(srv_cert[0]), "key_file": str(srv_cert[1])}}))
    (d / "full.yml").write_text(json.dumps({
        "tls_server_config": {"cert_file": str(srv_cert[0]), "key_file": str(srv_cert[1]),
                              "client_auth_type": "RequireAndVerifyClientCert",
                              "client_ca_file": str(ca[0])},
        "basic_auth_users": {"prometheus": h}}))
    reg = registry(a.series)
    ctx = ssl.create_default_context(cafile=str(ca[0]))
    cctx = ssl.create_default_context(cafile=str(ca[0]))
    cctx.load_cert_chain(str(client[0]), str(client[1]))
    auth = "Basic " + base64.b64encode(b"prometheus:s3cret").decode()
    rows = [("plain HTTP", None, None, None),
            ("TLS", webconfig.load(d / "tls.yml"), ctx, None),
            ("TLS + client cert + basic auth (bcrypt 10)", webconfig.load(d / "full.yml"),
             cctx, auth)]
    print(f"/metrics with {a.series} series, {a.scrapes} scrapes, one connection each")
    for name, cfg, c, au in rows:
        s = server.start("127.0.0.1", 0, reg, cfg)
        url = f"{s.scheme}://127.0.0.1:{s.server_address[1]}/metrics"
        try:
            timed(url, 3, c, au)  # warm up (the bcrypt check happens here, once)
            print(f"  {name:<45} median {timed(url, a.scrapes, c, au):6.2f} ms")
        finally:
            s.shutdown()
            s.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
