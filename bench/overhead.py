"""Overhead of the zerodoc shim on a real FSDP2 job (CPU, gloo), measured A/B in one run.

    python bench/overhead.py [--ranks 2] [--blocks 8] [--pairs 120] [--prefetch]
                             [--scrape-interval 1]

Prints the median step-time ratio instrumented / plain (A and B alternate step by step in the
same processes, order rotating), the shim's own step-end bookkeeping per step, and the /metrics
scrape time of a 128-unit model. Quote medians and ratios: the machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from zerodoc.demo.launch import Job  # noqa: E402
from zerodoc.runlog import read_rank_log  # noqa: E402


def overhead(args, tmp: Path) -> dict:
    out = tmp / "times.json"
    spec = {"model": {"blocks": args.blocks, "hidden": args.hidden, "seq": args.seq,
                      "batch": args.batch, "prefetch": args.prefetch},
            "attach": {"run_dir": str(tmp / "run"), "port": 0,
                       "completion_callbacks": not args.no_completion_callbacks},
            "warmup": 5, "pairs": args.pairs, "out": str(out), "device": args.device}
    job = Job(args.ranks, spec, module="bench.overhead_worker",
              env={"PYTHONPATH": str(Path(__file__).resolve().parent.parent)}).start()
    scraper = Scraper(tmp / "run", args.ranks, args.scrape_interval) \
        if args.scrape_interval > 0 else None
    try:
        codes = job.wait(3600)
    finally:
        if scraper is not None:
            scraper.stop()
    if any(codes):
        raise SystemExit(f"benchmark ranks failed: {job.outputs()}")
    res = json.loads(out.read_text())
    res["scrapes"] = scraper.count if scraper is not None else 0
    return res


class Scraper:
    """What Prometheus does to the ranks during the A/B: every `interval` seconds, fetch each
    rank's /metrics (endpoints from the run log headers), from this process, not the ranks'."""

    def __init__(self, run_dir: Path, ranks: int, interval: float):
        import threading

        self.run_dir, self.ranks, self.interval = run_dir, ranks, interval
        self.count = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _endpoints(self) -> list[str]:
        eps = []
        for r in range(self.ranks):
            p = self.run_dir / f"rank-{r:05d}.jsonl"
            try:
                ep = read_rank_log(p).facts.metrics_endpoint
            except Exception:  # noqa: BLE001 - not written yet
                return []
            if ep:
                eps.append(ep)
        return eps

    def _run(self) -> None:
        eps: list[str] = []
        while not self._stop.wait(self.interval):
            if not eps:
                eps = self._endpoints()
            for ep in eps:
                try:
                    with urllib.request.urlopen(f"http://{ep}/metrics", timeout=10) as r:
                        r.read()
                    self.count += 1
                except OSError:
                    pass

    def stop(self) -> None:
        self._stop.set()
        self._t.join(15)


def scrape_cost(args, tmp: Path) -> dict:
    """Scrape /metrics of a 2-rank job with 128 units while it trains."""
    run = tmp / "scrape"
    spec = {"model": {"blocks": 127, "hidden": 32, "heads": 4, "seq": 16, "batch": 2},
            "attach": {"run_dir": str(run), "port": 0},
            "warmup": 3, "pairs": 3, "out": str(tmp / "scrape.json"), "hold_s": 20}
    job = Job(2, spec, module="bench.overhead_worker",
              env={"PYTHONPATH": str(Path(__file__).resolve().parent.parent)}).start()
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            p = run / "rank-00000.jsonl"
            if p.exists():
                log = read_rank_log(p)
                if len(log.steps) >= 6:
                    break
            time.sleep(0.5)
        ep = log.facts.metrics_endpoint
        n_units = len(log.facts.units)
        times, size, samples = [], 0, 0
        for _ in range(30):
            t0 = time.perf_counter()
            with urllib.request.urlopen(f"http://{ep}/metrics", timeout=10) as r:
                body = r.read()
            times.append(time.perf_counter() - t0)
            size = len(body)
        samples = sum(1 for line in body.decode().splitlines() if line and line[0] != "#")
    finally:
        job.stop()
    return {"units": n_units, "scrape_median_s": statistics.median(times), "bytes": size,
            "samples": samples}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--blocks", type=int, default=8, help="transformer blocks (units = blocks+1)")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--pairs", type=int, default=120, help="A/B step pairs measured")
    p.add_argument("--no-scrape", action="store_true",
                   help="skip the separate 128-unit scrape-cost measurement")
    p.add_argument("--prefetch", action="store_true",
                   help="async unshard + explicit forward/backward prefetch (both models)")
    p.add_argument("--no-completion-callbacks", action="store_true",
                   help="attach with completion_callbacks=False (gloo: no callback per async "
                        "collective; hidden time of early finishers becomes an upper bound)")
    p.add_argument("--scrape-interval", type=float, default=0.0, metavar="S",
                   help="scrape every rank's /metrics every S seconds during the A/B, as "
                        "Prometheus would (0: no scraper)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cuda: 1 rank (NCCL) on one GPU; use e.g. --blocks 20 --hidden 2048 "
                        "--seq 1024 --batch 4 for a >= 1B-parameter bf16 step")
    args = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.device == "cuda":
        args.ranks = 1
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        res = overhead(args, tmp)
        a, b = res["times"]["A"], res["times"]["B"]
        ratio = statistics.median(a) / statistics.median(b)
        pair = statistics.median(x / y for x, y in zip(a, b))
        extra = (", async prefetch" if args.prefetch else "") + \
            (", no completion callbacks" if args.no_completion_callbacks else "") + \
            (f", scraped every {args.scrape_interval:g} s ({res['scrapes']} scrapes)"
             if args.scrape_interval > 0 else "")
        print(f"FSDP2 {'CUDA/nccl' if args.device == 'cuda' else 'CPU/gloo'}, {args.ranks} ranks, {args.blocks + 1} units, {len(a)} A/B pairs{extra}")
        print(f"  median step: instrumented {statistics.median(a) * 1e3:.1f} ms, "
              f"plain {statistics.median(b) * 1e3:.1f} ms")
        print(f"  step-time ratio (median A / median B): {ratio:.4f}")
        print(f"  median of per-pair ratios:             {pair:.4f}")
        selfs = [st.self_seconds for st in read_rank_log(tmp / "run" / "rank-00000.jsonl").steps[2:]]
        print(f"  shim step-end bookkeeping (run log + totals + memory): "
              f"median {statistics.median(selfs) * 1e6:.0f} us/step, "
              f"mean {res['self_s_per_step'] * 1e6:.0f} us/step "
              f"(= {res['self_s_per_step'] / statistics.median(a):.2%} of a step)")
        if not args.no_scrape:
            s = scrape_cost(args, tmp)
            print(f"  /metrics scrape, {s['units']} units: {s['scrape_median_s'] * 1e3:.1f} ms "
                  f"median ({s['samples']} samples, {s['bytes'] / 1024:.0f} KiB)")


if __name__ == "__main__":
    main()
