"""Per-unit stats when a rank has no series for a unit (issue 19/22, N1): that rank did not
measure the unit (not sampled there yet, or the unit is absent on it), so it is left out of
the unit's stats, never counted as a zero; numpy over the ranks' windows (run logs,
endpoints: `zerodoc.unitstats`) and PromQL on a Prometheus server give the same numbers.

The pages are real: one scrape of each rank of a live 2-rank demo, served again as they were
(static) except that rank 1's page loses every series of one unit. A real Prometheus scrapes
them; the endpoints source reads the same pages. The witness is rank 0's own per-step numbers
for that unit (from its window), which are the only measurement of it.
"""

from __future__ import annotations

import math
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.support.helpers import LiveDemo, wait_until
from tests.support.promserver import PromServer
from zerodoc.sources import EndpointsSource, PrometheusSource
from zerodoc.unitstats import UNIT_FIELDS, unit_stats

pytestmark = pytest.mark.slow
GONE = "blocks.1"  # rank 1 serves nothing of this unit
RATIOS = ("ag_exposed_fraction", "ag_busbw")


def _scrape(endpoint: str) -> str:
    import urllib.request

    with urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=10) as r:
        return r.read().decode()


class _Pages(ThreadingHTTPServer):
    daemon_threads = True


def _serve(pages: list, i: int) -> tuple[_Pages, str]:
    """Serve `pages[i]` (as it is at each request) on a free port."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            body = pages[i].encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = _Pages(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"127.0.0.1:{srv.server_address[1]}"


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    """Two served pages (rank 1 without GONE's series) and a Prometheus scraping them."""
    tmp = tmp_path_factory.mktemp("unitstats_missing")
    with LiveDemo(tmp, attach={"stall_after_s": 0}) as demo:
        demo.wait_steps(4)
        texts = [_scrape(ep) for ep in demo.endpoints]
    gone = re.compile(r'unit="' + re.escape(GONE) + '"')
    assert gone.search(texts[1])
    texts[1] = "".join(line for line in texts[1].splitlines(keepends=True)
                       if not gone.search(line))
    pages = list(texts)
    servers = [_serve(pages, i) for i in range(len(pages))]
    eps = [ep for _s, ep in servers]
    try:
        with PromServer(tmp, targets=eps) as prom:
            prom.wait_for("zerodoc_run_info", min_results=2, timeout=60)
            # Served after the run: the last step's time is moved to now (the source reads
            # the run as of one scrape interval after its last step, `stamp + 1`; the pages
            # are otherwise as they were): both stamped pages scraped after that time, so
            # that nothing up to it is still to come
            stamp = time.time() + 1.0
            pages[:] = [re.sub(r"^(zerodoc_last_step_timestamp_seconds\{[^}]*\}) \S+$",
                               lambda m: f"{m.group(1)} {stamp!r}", t, flags=re.M)
                        for t in texts]
            assert all(repr(stamp) in t for t in pages)
            series = f"zerodoc_last_step_timestamp_seconds == {stamp!r}"
            prom.wait_for(f"timestamp({series}) > {stamp + 1.0!r}", min_results=2, timeout=60)
            yield eps, prom
    finally:
        for s, _ep in servers:
            s.shutdown()
            s.server_close()


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-12)


def test_a_rank_without_a_units_series_is_left_out_of_its_stats(pages):
    eps, prom = pages
    ends = EndpointsSource(eps, window=None).snapshot()
    assert sorted(ends.ranks) == [0, 1]
    w0, w1 = ends.ranks[0], ends.ranks[1]
    assert {u for u, *_ in w1.comm} and GONE not in {u for u, *_ in w1.comm}
    assert GONE not in {u for u, _p in w1.compute} | {u for u, _p in w1.unit_framework}
    assert GONE in {u for u, *_ in w0.comm}
    ranks = [0, 1]
    numpy_stats = unit_stats(ends, ranks)
    promql = PrometheusSource(prom.url, window=None).snapshot()
    assert sorted(promql.ranks) == ranks and promql.unit_stats.ranks == tuple(ranks)
    prom_stats = promql.unit_stats

    # the witness: rank 0 alone measured GONE; its per-step numbers are the unit's
    steps0 = w0.per_unit_steps
    own = {"ag_seconds": sum(t.seconds for (u, _p, c), t in w0.comm.items()
                             if u == GONE and c == "all_gather") / steps0,
           "compute_seconds": sum(s for (u, _p), s in w0.compute.items() if u == GONE) / steps0,
           "framework_seconds": sum(s for (u, _p), s in w0.unit_framework.items()
                                    if u == GONE) / steps0}
    assert all(v > 0 for v in own.values()), own
    for name, stats in (("numpy", numpy_stats), ("promql", prom_stats)):
        row = stats.units[GONE]
        for f, v in own.items():
            assert _close(row[f].mean, v), (name, f, row[f], v)
        assert row["framework_seconds"].n == 1, (name, row["framework_seconds"])
        for key, s in stats.comm.items():
            if key[0] == GONE:
                assert s["seconds"].n == 1, (name, key, s["seconds"])

    # ... and both ways agree on every unit: the table's means (its maxima differ by design:
    # PromQL's is the sum of the keys' maxima, an upper bound; so do the ratios, per rank
    # first in numpy, of the means in PromQL), the framework's stats, every collective key's
    # stats
    assert set(numpy_stats.units) == set(prom_stats.units)
    bad = []
    for u, row in numpy_stats.units.items():
        for f in UNIT_FIELDS:
            if f in RATIOS:
                continue
            a, b = row[f], prom_stats.units[u][f]
            if (a.n == 0) != (b.n == 0):
                bad.append((u, f, "n", a, b))
            elif a.n and not _close(a.mean, b.mean):
                bad.append((u, f, a, b))
            if f == "framework_seconds" and a.n and (
                    a.n != b.n or not all(_close(getattr(a, x), getattr(b, x))
                                          for x in ("min", "median"))):
                bad.append((u, f, "min/median/n", a, b))
    assert set(numpy_stats.comm) == set(prom_stats.comm)
    for key, st in numpy_stats.comm.items():
        for f, a in st.items():
            b = prom_stats.comm[key][f]
            if a.n != b.n or not all(_close(getattr(a, x), getattr(b, x))
                                     for x in ("mean", "max")):
                bad.append((key, f, a, b))
    assert not bad, bad
