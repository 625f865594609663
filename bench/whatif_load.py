"""The host's load beneath a what-if (issue 22), measured without zerodoc: the demo model under
FSDP2 on 2 gloo ranks with no shim installed, wrapped per linear (A of the merge case) and per
block (B) alternately, back to back. Per step and rank: the wall time, the main thread's time
on a CPU, and its time runnable but waiting for one (the run-queue delay, from
/proc/thread-self/schedstat); the rest of the wall time the thread slept (waiting for its peer
and the collectives). The same two for the Linear layers' own forwards (the same ops in both
wrappings). Over the steps after the warm-up; per configuration the slower rank.

    python bench/whatif_load.py [--pairs 2] [--steps 12] [--warmup 3]

What it tells: whether B needs more CPU work than A (a model error: merged units computing
slower) or the same work waited longer for a CPU (the load, which a model of A cannot see).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCHEDSTAT = "/proc/thread-self/schedstat"


def _sched() -> tuple[float, float]:
    """(seconds on a CPU, seconds runnable waiting for one) of the calling thread."""
    with open(SCHEDSTAT) as f:
        run, wait, _ = f.read().split()
    return int(run) / 1e9, int(wait) / 1e9


def _worker(rank: int, wrap: str, steps: int, warmup: int, port: int, out: str) -> None:
    import warnings

    import torch
    import torch.distributed as dist

    warnings.filterwarnings("ignore", message=".*returned a view tensor")  # the demo's FSDPLinear
    sys.path.insert(0, str(ROOT))
    from zerodoc.demo.transformer import DemoConfig, batch, build, loss_fn

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    cfg = DemoConfig(wrap=wrap)
    model = build(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    # The same ops in both wrappings: every Linear's own forward (after FSDP's pre-forward,
    # whose hooks were registered first, before its post-forward): on CPU and run queue
    span = [0.0, 0.0]
    opened: list = []

    def pre(_m, _a):
        opened.append(_sched())

    def post(_m, _a, _o):
        c0, q0 = opened.pop()
        c1, q1 = _sched()
        span[0] += c1 - c0
        span[1] += q1 - q0
    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            m.register_forward_pre_hook(pre)
            m.register_forward_hook(post, prepend=True)
    rows = []
    for s in range(steps):
        x, y = batch(cfg, s, rank)
        span[:] = [0.0, 0.0]
        t0, (c0, q0) = time.perf_counter(), _sched()
        loss_fn(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        t1, (c1, q1) = time.perf_counter(), _sched()
        rows.append((t1 - t0, c1 - c0, q1 - q0, *span))
    kept = rows[warmup:]
    Path(f"{out}-{rank}.json").write_text(json.dumps(
        [sum(r[i] for r in kept) / len(kept) for i in range(5)]))
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(wrap: str, steps: int, warmup: int, tmp: Path) -> dict:
    """One 2-rank run; the slower rank's means per step (seconds)."""
    import torch.multiprocessing as mp

    out = str(tmp / f"{wrap}-{time.monotonic_ns()}")
    load = os.getloadavg()[0]
    mp.spawn(_worker, args=(wrap, steps, warmup, _free_port(), out), nprocs=2)
    ranks = [json.loads(Path(f"{out}-{r}.json").read_text()) for r in range(2)]
    wall, cpu, runq, lin_cpu, lin_runq = max(ranks, key=lambda r: r[0])
    return {"wrap": wrap, "load": load, "wall": wall, "cpu": cpu, "runq": runq,
            "slept": max(0.0, wall - cpu - runq), "lin_cpu": lin_cpu, "lin_runq": lin_runq}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args(argv)
    if not os.path.exists(SCHEDSTAT):
        print(f"bench/whatif_load.py: {SCHEDSTAT} is missing (Linux with schedstats needed)",
              file=sys.stderr)
        return 2
    if args.steps - args.warmup < 2 or args.pairs < 1:
        print("bench/whatif_load.py: --steps must exceed --warmup by 2, --pairs >= 1",
              file=sys.stderr)
        return 2
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    print(f"per step, the slower rank, ms ({args.steps} steps, first {args.warmup} left out); "
          f"{os.cpu_count()} cores")
    print(f"{'pair':>4} {'wrap':>7} {'load':>5} {'wall':>7} {'on CPU':>7} {'run queue':>10} "
          f"{'slept':>7}   Linear forwards: {'on CPU':>7} {'run queue':>10}")
    with tempfile.TemporaryDirectory() as t:
        for i in range(args.pairs):
            for wrap in ("linear", "block"):
                r = run(wrap, args.steps, args.warmup, Path(t))
                print(f"{i + 1:>4} {wrap:>7} {r['load']:5.1f} {r['wall'] * 1e3:7.0f} "
                      f"{r['cpu'] * 1e3:7.0f} {r['runq'] * 1e3:10.0f} {r['slept'] * 1e3:7.0f}   "
                      f"{'':16} {r['lin_cpu'] * 1e3:7.1f} {r['lin_runq'] * 1e3:10.1f}",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
