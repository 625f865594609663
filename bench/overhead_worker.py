"""Rank of the overhead benchmark: two identical FSDP2 models in one job, one instrumented
(A) and one not (B), stepped alternately A B B A A B ... so both see the same machine noise."""

from __future__ import annotations

import json
import os
import sys
import time


def main() -> None:
    import torch
    import torch.distributed as dist

    import zerodoc
    from zerodoc.demo.model import DemoConfig, batch, build, loss_fn

    spec = json.loads(sys.argv[1])
    torch.set_num_threads(1)
    cuda = spec.get("device") == "cuda"
    dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()
    cfg = DemoConfig(**spec["model"])
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        with torch.device("cuda"):
            models = {k: build(cfg).to(torch.bfloat16) for k in ("A", "B")}
    else:
        models = {k: build(cfg) for k in ("A", "B")}
    opts = {k: torch.optim.AdamW(m.parameters(), lr=1e-4) for k, m in models.items()}
    mon = zerodoc.attach(models["A"], opts["A"], **spec["attach"])
    times = {"A": [], "B": []}
    order = ["A", "B"]
    for i in range(spec["warmup"] + spec["pairs"]):
        for k in order:
            x, y = batch(cfg, i, rank)
            if cuda:
                x, y = x.cuda(), y.cuda()
                torch.cuda.synchronize()  # bench boundary only, outside the timed step
            dist.barrier()
            t0 = time.perf_counter()
            loss_fn(models[k](x), y).backward()
            opts[k].step()
            opts[k].zero_grad()
            if cuda:
                torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            if i >= spec["warmup"]:
                times[k].append(dt)
        order.reverse()  # rotate who goes first
    self_s = mon.totals.self_seconds / max(1, mon.totals.steps)
    if spec.get("hold_s"):
        time.sleep(spec["hold_s"])  # keep /metrics up for the scrape benchmark
    mon.close()
    if rank == 0:
        with open(spec["out"], "w") as f:
            json.dump({"times": times, "self_s_per_step": self_s}, f)
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
