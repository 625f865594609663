"""Overhead of the zerodoc shim on a real FSDP2 job (CPU, gloo), measured A/B in one run.

    python bench/overhead.py [--ranks 2] [--blocks 8] [--pairs 120]

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
                      "batch": args.batch},
            "attach": {"run_dir": str(tmp / "run"), "port": 0},
            "warmup": 5, "pairs": args.pairs, "out": str(out), "device": args.device}
    job = Job(args.ranks, spec, module="bench.overhead_worker",
              env={"PYTHONPATH": str(Path(__file__).resolve().parent.parent)}).start()
    codes = job.wait(3600)
    if any(codes):
        raise SystemExit(f"benchmark ranks failed: {job.outputs()}")
    return json.loads(out.read_text())


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
    p.add_argument("--no-scrape", action="store_true")
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
        print(f"FSDP2 {'CUDA/nccl' if args.device == 'cuda' else 'CPU/gloo'}, {args.ranks} ranks, {args.blocks + 1} units, {len(a)} A/B pairs")
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
