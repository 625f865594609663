"""Prometheus series per rank, measured: a real gloo job, each rank's /metrics scraped.

    python bench/series.py [--blocks 80] [--ranks 2] [--prometheus]

Runs the FSDP2 demo (per-block wrapping: blocks + the root = units; tiny layers, the series
do not depend on their size) twice: at the default detail level and at
`metrics_detail="coarse"` with one rank (rank 0) keeping unit detail. Prints the series each
rank serves, what `zerodoc.ops.cardinality` predicts from the catalog, and the budgets. With
`--prometheus` (needs the `prometheus` binary) a real Prometheus scrapes each job with
zerodoc's rules loaded and the series it holds are counted too: scraped and recorded, per
rank and per run.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.helpers import LiveDemo  # noqa: E402
from tests.support.promserver import PromServer  # noqa: E402
from zerodoc.ops import alerts  # noqa: E402
from zerodoc.ops import cardinality as card  # noqa: E402

TINY = {"hidden": 16, "heads": 2, "vocab": 64, "seq": 8, "batch": 2}
MODES = {"full": {}, "coarse": {"metrics_detail": "coarse", "metrics_unit_ranks": 1}}


def scrape(endpoint: str) -> str:
    with urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=10) as r:
        return r.read().decode()


def in_prometheus(tmp: Path, endpoints: list[str]) -> dict[str, dict[str, int]]:
    """Series a Prometheus with zerodoc's rules holds: {"scraped"|"recorded": {rank: n}}
    (rank "" for the per-run recorded series)."""
    rules = alerts.write_rules(tmp / "rules", opts=alerts.RuleOptions(window="10s"))
    with PromServer(tmp, targets=endpoints, rule_files=[str(p) for p in rules]) as prom:
        prom.wait_for("zerodoc_run_info", min_results=len(endpoints))
        time.sleep(20)  # > 2 windows: every recording rule has data
        out = {}
        for kind, sel in (("scraped", '{__name__=~"zerodoc_.+"}'),
                          ("recorded", '{__name__=~".+:.+"}')):
            res = prom.query(f"count by (rank) ({sel})")
            out[kind] = {s["metric"].get("rank", ""): int(s["value"][1]) for s in res}
    return out


def measure(tmp: Path, blocks: int, ranks: int, prometheus: bool) -> tuple[dict, dict]:
    """({(mode, rank): {series name: count}} from live scrapes, {mode: in_prometheus()})."""
    out, prom = {}, {}
    for mode, attach in MODES.items():
        with LiveDemo(tmp, nprocs=ranks, model={**TINY, "blocks": blocks}, attach=attach,
                      name=f"series-{mode}") as demo:
            demo.wait_steps(3)
            for r, ep in enumerate(demo.endpoints):
                out[(mode, r)] = card.count_exposition(scrape(ep))
            if prometheus:
                (tmp / f"prom-{mode}").mkdir()
                prom[mode] = in_prometheus(tmp / f"prom-{mode}", demo.endpoints)
    return out, prom


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--blocks", type=int, default=card.BUDGET_UNITS - 1)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--prometheus", action="store_true",
                   help="also count the series a Prometheus with zerodoc's rules holds")
    a = p.parse_args(argv)
    if a.blocks < 1 or a.ranks < 2:
        p.error("--blocks must be >= 1 and --ranks >= 2")
    units = a.blocks + 1
    shape = card.Shape(units=units)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        got, prom = measure(Path(tmp), a.blocks, a.ranks, a.prometheus)
    print(f"FSDP2 on CPU, {units} units, {a.ranks} gloo ranks "
          f"(measured in {time.monotonic() - t0:.0f} s)")
    print(f"{'detail':8} {'rank':>4} {'measured':>9} {'catalog':>8}")
    ok = True
    for (mode, r), counts in sorted(got.items()):
        want = card.total(shape, rank0=r == 0, unit_detail=mode == "full" or r == 0)
        n = sum(counts.values())
        ok &= n == want
        print(f"{mode:8} {r:>4} {n:>9,} {want:>8,}")
    full = sum(got[("full", 1)].values())
    coarse = sum(got[("coarse", 1)].values())
    print(f"at {units} units (budget at {card.BUDGET_UNITS}): full {full:,} / "
          f"{card.BUDGET_FULL:,} per rank, coarse {coarse:,} / {card.BUDGET_COARSE} per rank "
          "(ranks other than rank 0)")
    for mode, kinds in prom.items():
        for kind, by_rank in kinds.items():
            ranks = ", ".join(f"rank {r}: {n:,}" if r else f"per run: {n:,}"
                              for r, n in sorted(by_rank.items()))
            print(f"in Prometheus, {mode:6} {kind:8} {ranks}")
    if not ok:
        print("measured != catalog: the exporter serves series the catalog does not count")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
