"""Overhead of the zerodoc shim on a real FSDP2 job (CPU, gloo), measured A/B in one run.

    python bench/overhead.py [--ranks 2] [--blocks 8] [--pairs 120] [--prefetch]
                             [--scrape-interval 1.0] [--scrape-during A|both] [--repeat 3]

Prints the median step-time ratio instrumented / plain (A and B alternate step by step in the
same processes, alternating A, B, A, B), the same for the training thread's CPU time per step (less
sensitive to a loaded machine), the shim's own step-end bookkeeping per step, and the /metrics
scrape time of a 128-unit model. Quote medians and ratios: the machine is shared and noisy.

--prefetch: FSDP2 async unshard + explicit forward/backward prefetch (real overlap).
--scrape-interval S: a scraper (this process, Prometheus' headers: OpenMetrics, gzip) fetches
every rank's /metrics every S seconds of A-step time (`--scrape-during A`, default: a real
scrape is the instrumented job's cost, so it lands on A steps only) or of wall time (`both`:
it then slows A and B alike and the ratio cannot see it).

Per-unit detail comes on 1 step in K (docs/gpus.md, "Tiers"), K adaptive by default: the
monitor's step spans an A and a B step here, so the worker halves the sampler's budget (a
share of the median step) to give A the K a job of its own would get. The report says how
many of rank 0's steps had detail and the K at the end, and the sampler's state then: its
estimate of a detail step's own cost, the upper bound K is set from, and the last excesses
of the detail steps over the plain ones (training-thread and process CPU time).
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from zerodoc.demo.launch import Job  # noqa: E402
from zerodoc.runlog import read_rank_log  # noqa: E402
from zerodoc.runlog.records import RunLogError  # noqa: E402


# What Prometheus sends (it prefers OpenMetrics, accepts gzip).
SCRAPE_HEADERS = {
    "Accept": "application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
              "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
    "Accept-Encoding": "gzip",
}


def endpoints(run: Path, ranks: int, job: Job, timeout: float = 600) -> list[str]:
    """Each rank's /metrics endpoint, from its run-log header."""
    deadline = time.monotonic() + timeout
    eps: dict[int, str] = {}
    while len(eps) < ranks and time.monotonic() < deadline and job.running():
        for r in range(ranks):
            p = run / f"rank-{r:05d}.jsonl"
            if r not in eps and p.exists():
                try:
                    ep = read_rank_log(p).facts.metrics_endpoint
                except Exception:  # header not complete yet
                    continue
                if ep:
                    eps[r] = ep
        time.sleep(0.2)
    return [eps[r] for r in sorted(eps)]


class Scraper(threading.Thread):
    """Scrapes every rank's /metrics each `interval` seconds of A-step time (flag byte of
    rank 0 set) or, without a flag, of wall time."""

    def __init__(self, run: Path, job: Job, ranks: int, interval: float, flag):
        super().__init__(daemon=True)
        self.run_dir, self.job, self.ranks = run, job, ranks
        self.interval, self.flag = interval, flag
        self.stop = threading.Event()
        self.latencies: list[float] = []
        self.errors = 0

    def scrape(self, ep: str) -> None:
        req = urllib.request.Request(f"http://{ep}/metrics", headers=SCRAPE_HEADERS)
        t0 = time.perf_counter()
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                r.read()
            self.latencies.append(time.perf_counter() - t0)
        except OSError:
            self.errors += 1

    def run(self) -> None:
        eps = endpoints(self.run_dir, self.ranks, self.job)
        due, last = 0.0, time.monotonic()
        tick = min(0.005, self.interval / 10)
        while not self.stop.wait(tick):
            now = time.monotonic()
            if self.flag is None or self.flag[0]:
                due += now - last
            last = now
            if due >= self.interval:
                due -= self.interval
                scrapes = [threading.Thread(target=self.scrape, args=(ep,)) for ep in eps]
                for t in scrapes:  # targets are scraped concurrently, as Prometheus does
                    t.start()
                for t in scrapes:
                    t.join()


def overhead(args, tmp: Path) -> dict:
    out = tmp / "times.json"
    run = tmp / "run"
    scraping = args.scrape_interval > 0
    flag_file = tmp / "a-steps.flag"
    flag_file.write_bytes(bytes(args.ranks))
    spec = {"model": {"blocks": args.blocks, "hidden": args.hidden, "seq": args.seq,
                      "batch": args.batch, "prefetch": args.prefetch},
            "attach": {"run_dir": str(run), "port": 0,
                       "completion_callbacks": not args.no_completion_callbacks},
            "warmup": 5, "pairs": args.pairs, "out": str(out), "device": args.device,
            "control": args.control, "halve_budget": True,
            "flag_file": str(flag_file) if scraping and args.scrape_during == "A" else None}
    job = Job(args.ranks, spec, module="bench.overhead_worker",
              env={"PYTHONPATH": str(Path(__file__).resolve().parent.parent)}).start()
    scraper = None
    with open(flag_file, "r+b") as f, mmap.mmap(f.fileno(), 0) as flag:
        if scraping:
            scraper = Scraper(run, job, args.ranks, args.scrape_interval,
                              flag if args.scrape_during == "A" else None)
            scraper.start()
        try:
            codes = job.wait(3600)
        finally:
            job.stop()
            if scraper is not None:
                scraper.stop.set()
                scraper.join()
    if any(codes):
        raise SystemExit(f"benchmark ranks failed: {job.outputs()}")
    res = json.loads(out.read_text())
    if scraper is not None:
        res["scrapes"] = {"count": len(scraper.latencies), "errors": scraper.errors,
                          "median_s": statistics.median(scraper.latencies)
                          if scraper.latencies else None}
    return res


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
                try:
                    log = read_rank_log(p)
                except RunLogError:  # created, its header not written yet
                    log = None
                if log is not None and len(log.steps) >= 6:
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


def report(args, res: dict, tmp: Path) -> tuple[float, float, float]:
    a, b = res["times"]["A"], res["times"]["B"]
    ca, cb = res["cpu"]["A"], res["cpu"]["B"]
    med = statistics.median
    ratio = med(a) / med(b)
    pair = med(x / y for x, y in zip(a, b))
    cpu_ratio = med(ca) / med(cb)
    print(f"FSDP2 {'CUDA/nccl' if args.device == 'cuda' else 'CPU/gloo'}, {args.ranks} ranks, "
          f"{args.blocks + 1} units, {len(a)} A/B pairs, prefetch={args.prefetch}"
          + (", no completion callbacks" if args.no_completion_callbacks else "") + ", scraper="
          + (f"every {args.scrape_interval:g} s of {'A-step' if args.scrape_during == 'A' else 'wall'}"
             " time" if args.scrape_interval > 0 else "none"))
    print(f"  median step: instrumented {med(a) * 1e3:.1f} ms, plain {med(b) * 1e3:.1f} ms")
    print(f"  step-time ratio (median A / median B): {ratio:.4f}")
    print(f"  median of per-pair ratios:             {pair:.4f}")
    print(f"  training-thread CPU per step: A {med(ca) * 1e3:.1f} ms, B {med(cb) * 1e3:.1f} ms, "
          f"ratio {cpu_ratio:.4f}")
    if args.device != "cuda" and not args.control:
        steps = read_rank_log(tmp / "run" / "rank-00000.jsonl").steps
        selfs = [st.self_seconds for st in steps[2:]]
        ks = [st.detail_k for st in steps if st.detail and st.detail_k]
        print(f"  per-unit detail (rank 0): {sum(1 for st in steps if st.detail)} of "
              f"{len(steps)} steps (warm-up and pairs), K at the end "
              f"{ks[-1] if ks else '-'}")
        sp = res.get("sampling")
        if sp and sp.get("own_hi_s") is not None:
            print(f"  sampler at the end (rank 0): K {sp['k']}, a detail step's own cost "
                  f"{sp['own_s'] * 1e3:.2f} ms, its upper bound {sp['own_hi_s'] * 1e3:.2f} ms, "
                  f"from {sp['samples']} detail steps (excess over the plain ones, ms: CPU "
                  f"{', '.join(f'{x * 1e3:.1f}' for x in sp['excess_cpu_s'][-8:])}; process "
                  f"{', '.join(f'{x * 1e3:.1f}' for x in sp['excess_proc_s'][-8:])})")
        print(f"  shim step-end bookkeeping (run log + totals + memory): "
              f"median {med(selfs) * 1e6:.0f} us/step, "
              f"mean {res['self_s_per_step'] * 1e6:.0f} us/step "
              f"(= {res['self_s_per_step'] / med(a):.2%} of a step)")
    sc = res.get("scrapes")
    if sc:
        lat = f"{sc['median_s'] * 1e3:.1f} ms median" if sc["median_s"] is not None else "-"
        print(f"  scrapes during the run: {sc['count']} ({lat}, {sc['errors']} failed)")
    return ratio, pair, cpu_ratio


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--blocks", type=int, default=8, help="transformer blocks (units = blocks+1)")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--pairs", type=int, default=120, help="A/B step pairs measured")
    p.add_argument("--prefetch", action="store_true",
                   help="FSDP2 async unshard + explicit forward/backward prefetch")
    p.add_argument("--no-completion-callbacks", action="store_true",
                   help="attach with completion_callbacks=False (gloo: no callback per async "
                        "collective; hidden time of early finishers becomes an upper bound)")
    p.add_argument("--scrape-interval", type=float, default=0.0, metavar="S",
                   help="scrape every rank's /metrics every S seconds during the A/B run "
                        "(0: no scraper)")
    p.add_argument("--scrape-during", choices=("A", "both"), default="A",
                   help="A: the interval runs on A-step time only (default); both: wall time")
    p.add_argument("--repeat", type=int, default=1, help="run the A/B job this many times")
    p.add_argument("--control", action="store_true",
                   help="null test: attach nothing (A is plain too); the ratio shows the "
                        "bench's own bias between the two models")
    p.add_argument("--no-scrape", action="store_true",
                   help="skip the separate 128-unit /metrics latency measurement")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cuda: 1 rank (NCCL) on one GPU; use e.g. --blocks 20 --hidden 2048 "
                        "--seq 1024 --batch 4 for a >= 1B-parameter bf16 step")
    args = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.device == "cuda":
        args.ranks = 1
    runs = []
    with tempfile.TemporaryDirectory() as d:
        for i in range(args.repeat):
            tmp = Path(d) / f"r{i}"
            tmp.mkdir()
            if i:
                print()
            runs.append(report(args, overhead(args, tmp), tmp))
        if args.repeat > 1:
            for name, k in (("step-time ratio", 0), ("per-pair ratio", 1), ("CPU ratio", 2)):
                xs = [r[k] for r in runs]
                print(f"{name} over {len(xs)} runs: median {statistics.median(xs):.4f}, "
                      f"min {min(xs):.4f}, max {max(xs):.4f}")
        if not args.no_scrape:
            s = scrape_cost(args, Path(d))
            print(f"  /metrics scrape, {s['units']} units: {s['scrape_median_s'] * 1e3:.1f} ms "
                  f"median ({s['samples']} samples, {s['bytes'] / 1024:.0f} KiB)")


if __name__ == "__main__":
    main()
