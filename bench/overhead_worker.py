"""Rank of the overhead benchmark: two identical FSDP2 models in one job, one instrumented
(A) and one not (B), stepped alternately A B B A A B ... so both see the same machine noise.

While A steps, byte `rank` of the flag file (when the spec names one) is 1, so a scraper
outside can scrape only during A steps (its cost is the instrumented job's, not the plain one's).
"""

from __future__ import annotations

import json
import mmap
import os
import sys
import time


def main() -> None:
    import torch
    import torch.distributed as dist

    import zerodoc
    from zerodoc.demo.transformer import DemoConfig, batch, build, loss_fn

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
    if spec.get("control"):  # null test: nothing attached, A and B are both plain
        mon = zerodoc.attach(models["A"], opts["A"], enabled=False)
    else:
        mon = zerodoc.attach(models["A"], opts["A"], **spec["attach"])
        if spec.get("halve_budget") and hasattr(mon, "sampler"):
            # The monitor's step runs from one A step end to the next: a B step lies in
            # between, so its median step is about twice a job's and the detail budget
            # (a share of it) twice as generous; halved, K is the one the job alone gets.
            mon.sampler.budget /= 2
    flag = None
    if spec.get("flag_file"):
        with open(spec["flag_file"], "r+b") as f:
            flag = mmap.mmap(f.fileno(), 0)
    times = {"A": [], "B": []}
    cpu = {"A": [], "B": []}
    # A, B, A, B, ...: each step follows one of the other model's and a barrier, the same
    # for both, and the monitor's step (A's step end to the next) always spans one B step
    # and one A step. (A rotating order, ABBA..., made the monitor's steps bimodal, one A
    # step or A + two B steps, and the adaptive sampler's medians of them meaningless: K
    # jumped between 2 and 1024 from run to run.)
    order = ["A", "B"]
    for i in range(spec["warmup"] + spec["pairs"]):
        for k in order:
            x, y = batch(cfg, i, rank)
            if cuda:
                x, y = x.cuda(), y.cuda()
                torch.cuda.synchronize()  # bench boundary only, outside the timed step
            dist.barrier()
            if flag is not None and k == "A":
                flag[rank] = 1
            t0, c0 = time.perf_counter(), time.thread_time()
            loss_fn(models[k](x), y).backward()
            opts[k].step()
            opts[k].zero_grad()
            if cuda:
                torch.cuda.synchronize()
            dt, dc = time.perf_counter() - t0, time.thread_time() - c0
            if flag is not None:
                flag[rank] = 0
            if i >= spec["warmup"]:
                times[k].append(dt)
                cpu[k].append(dc)
    tot = getattr(mon, "totals", None)
    self_s = tot.self_seconds / max(1, tot.steps) if tot is not None else 0.0
    sampler = getattr(mon, "sampler", None)
    sampling = None if sampler is None else {
        "k": sampler.k, "own_s": sampler.own_s, "own_hi_s": sampler.own_hi_s,
        "samples": len(getattr(sampler, "_xs_cpu", ())),
        "excess_cpu_s": list(getattr(sampler, "_xs_cpu", ())),
        "excess_proc_s": list(getattr(sampler, "_xs_out", ()))}
    if spec.get("hold_s"):
        time.sleep(spec["hold_s"])  # keep /metrics up for the scrape benchmark
    mon.close()
    if rank == 0:
        with open(spec["out"], "w") as f:
            json.dump({"times": times, "cpu": cpu, "self_s_per_step": self_s,
                       "sampling": sampling}, f)
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
