"""A sample's install / removal of the per-unit instrumentation: the adapter's plan against
`instrument()` (the plan withheld: built anew at every install, as before issue 19's plans).

    OMP_NUM_THREADS=1 PYTHONPATH=. python bench/plan_install.py \
        [--frameworks ddp,zero1,deepspeed-3,deepspeed-2-offload,deepspeed-1] [--port 29561]

One gloo rank in this process (DeepSpeed on its CPU accelerator), a 4-block demo model. Per
framework: attach (detail=2), train 3 steps, then in 3 rounds alternate the two ways, each
`_install_detail` / `_remove_detail` timed alone right after a training step; the median of
35 per round and way is printed.
"""
import argparse
import os
import statistics
import time

_p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
_p.add_argument("--frameworks", default="ddp,zero1,deepspeed-3,deepspeed-2-offload,deepspeed-1")
_p.add_argument("--port", default="29561", help="the gloo rendezvous port")
ARGS = _p.parse_args()
os.environ.update(DS_ACCELERATOR="cpu", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0",
                  MASTER_ADDR="127.0.0.1", MASTER_PORT=ARGS.port)
import tempfile  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import zerodoc  # noqa: E402
from zerodoc.demo import frameworks  # noqa: E402
from zerodoc.demo.transformer import DemoConfig, TinyTransformer, batch, loss_fn  # noqa: E402

dist.init_process_group("gloo")
cfg = DemoConfig(blocks=4, hidden=64, heads=2, vocab=128, seq=16, batch=2)
N, ROUNDS = 35, 3


def build(fw):
    if fw in ("ddp", "zero1"):
        from torch.distributed.optim import ZeroRedundancyOptimizer
        from torch.nn.parallel import DistributedDataParallel as DDP
        torch.manual_seed(0)
        model = DDP(TinyTransformer(cfg))
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW,
                                      lr=1e-3) if fw == "zero1" else \
            torch.optim.AdamW(model.parameters(), lr=1e-3)

        def step(i):
            x, y = batch(cfg, i, 0)
            loss_fn(model(x), y).backward()
            opt.step()
            opt.zero_grad()
        return (model, opt), step
    built = frameworks.build(fw, cfg, {})
    return (built.target,), lambda i: built.train_step(*batch(cfg, i, 0))


def measure(mon, step, use_plan):
    a = mon.adapter
    if use_plan:
        a.__dict__.pop("plan", None)
    else:
        a.plan = lambda *x: None
    mon._plan = None
    if use_plan:
        mon._detail_plan()  # built outside the timing, as attach does
    ins, rem = [], []
    for i in range(N):
        step(100 + i)  # a training step (detail off after it, or taken out below)
        if mon._detail_on:
            mon._remove_detail()
        t0 = time.perf_counter()
        mon._install_detail()
        t1 = time.perf_counter()
        mon._remove_detail()
        t2 = time.perf_counter()
        ins.append(t1 - t0)
        rem.append(t2 - t1)
    return statistics.median(ins) * 1e6, statistics.median(rem) * 1e6


TMP = tempfile.mkdtemp(prefix="zerodoc-plan-bench-")
for fw in ARGS.frameworks.split(","):
    args, step = build(fw)
    mon = zerodoc.attach(*args, run_dir=f"{TMP}/{fw}", port=False,
                         detail=2, stall_after_s=0)
    for i in range(3):
        step(i)
    for r in range(ROUNDS):
        for use_plan in (False, True):
            i_us, r_us = measure(mon, step, use_plan)
            print(f"{fw:22s} round {r} {'plan      ' if use_plan else 'instrument'} "
                  f"install {i_us:7.1f} us  remove {r_us:7.1f} us  units {len(mon.unit_names)}",
                  flush=True)
    mon.close()
dist.destroy_process_group()
os._exit(0)
