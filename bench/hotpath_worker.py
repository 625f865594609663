"""Rank of the hot-path micro-benchmark (`bench/hotpath.py`): one real FSDP2 job (gloo), an
instrumented model (A) and a plain twin (B).

1. A/B steps, alternated (a full garbage collection before each, outside the measurement):
   per step wall time, the training thread's CPU time and the process's CPU time or, under
   callgrind (`spec["instructions"]`, rank 0 runs in valgrind), its instructions.
2. Calls per step: every zerodoc function the training thread enters during one step of A
   (a profile hook counts them; clock reads too).
3. Cost per call of each piece (`hotpath_micro.pieces`) on the real objects, with this job's
   last step's accumulators for the step end, and of the /metrics page.
Rank 0 writes the numbers as JSON; rank 1 only takes part in the steps.
"""

from __future__ import annotations

import copy
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.hotpath_micro import CpuMeter, InstructionMeter, page_cost, pieces  # noqa: E402


def _step(model, opt, x, y, loss_fn):
    loss_fn(model(x), y).backward()
    opt.step()
    opt.zero_grad()


def ab_steps(models, opts, cfg, pairs: int, rank: int, batch, loss_fn, dist,
             meter=None) -> dict:
    """Alternate A and B steps (order rotating); per step: wall, thread CPU, process CPU,
    garbage collection (CPU, runs) and, with an `InstructionMeter`, instructions."""
    import gc

    out = {k: {"wall": [], "thread": [], "process": [], "gc": [], "gcn": [], "instr": []}
           for k in ("A", "B")}
    gc_t = [0.0, 0, 0.0]

    def on_gc(phase, info):
        if phase == "start":
            gc_t[2] = time.thread_time()
        else:
            gc_t[0] += time.thread_time() - gc_t[2]
            gc_t[1] += 1
    gc.callbacks.append(on_gc)
    order = ["A", "B"]
    for i in range(pairs):
        for k in order:
            x, y = batch(cfg, i, rank)
            gc.collect()  # every step starts from the same collector state
            dist.barrier()
            gc_t[0] = gc_t[1] = 0
            w0, t0, p0 = time.perf_counter(), time.thread_time(), time.process_time()
            if meter is not None:
                out[k]["instr"].append(meter.once(
                    lambda: _step(models[k], opts[k], x, y, loss_fn)))
            else:
                _step(models[k], opts[k], x, y, loss_fn)
            out[k]["wall"].append(time.perf_counter() - w0)
            out[k]["thread"].append(time.thread_time() - t0)
            out[k]["process"].append(time.process_time() - p0)
            out[k]["gc"].append(gc_t[0])
            out[k]["gcn"].append(gc_t[1])
        order.reverse()
    gc.callbacks.remove(on_gc)
    return out


def count_calls(model, opt, x, y, loss_fn) -> tuple[dict, int]:
    """Calls per step of zerodoc's functions on the training thread (and its clock reads)."""
    import time as _time

    calls: Counter = Counter()
    clock = 0
    pc = _time.perf_counter

    def prof(frame, event, arg):
        nonlocal clock
        code = frame.f_code
        if "/zerodoc/" not in code.co_filename:
            return
        if event == "call":
            mod = os.path.basename(code.co_filename)[:-3]
            calls[f"{mod}.{code.co_qualname.replace('.<locals>', '')}"] += 1
        elif event == "c_call" and arg is pc:
            clock += 1

    sys.setprofile(prof)
    try:
        _step(model, opt, x, y, loss_fn)
    finally:
        sys.setprofile(None)
    return dict(calls), clock


def main() -> None:
    spec = json.loads(sys.argv[1])
    out_file = spec.get("instructions")
    if out_file and os.environ.get("RANK") == "0" and not os.environ.get("ZD_IN_VALGRIND"):
        # Rank 0 runs in callgrind, instrumented only inside the measured windows.
        os.environ.update(ZD_IN_VALGRIND="1", PYTHONHASHSEED="0")
        argv = ["valgrind", "--tool=callgrind", "--instr-atstart=no",
                f"--callgrind-out-file={out_file}", sys.executable, "-m",
                "bench.hotpath_worker", sys.argv[1]]
        os.execvp(argv[0], argv)

    import torch
    import torch.distributed as dist

    import zerodoc
    from zerodoc.demo.transformer import DemoConfig, batch, build, loss_fn

    torch.set_num_threads(1)
    import datetime

    dist.init_process_group("gloo", timeout=datetime.timedelta(hours=3))  # callgrind is slow
    rank = dist.get_rank()
    cfg = DemoConfig(**spec["model"])
    models = {k: build(cfg) for k in ("A", "B")}
    opts = {k: torch.optim.AdamW(m.parameters(), lr=1e-4) for k, m in models.items()}
    mon = zerodoc.attach(models["A"], opts["A"], **spec["attach"])
    x, y = batch(cfg, 0, rank)
    for _ in range(3):
        for k in ("A", "B"):
            _step(models[k], opts[k], x, y, loss_fn)
    result: dict = {"units": len(mon.unit_names), "prefetch": cfg.prefetch}
    meter = CpuMeter()
    if spec.get("instructions"):
        meter = InstructionMeter(spec["instructions"]) if rank == 0 else None
    result["meter"] = getattr(meter, "unit", None)
    if not spec.get("collect_only"):
        result["ab"] = ab_steps(models, opts, cfg, spec["pairs"], rank, batch, loss_fn, dist,
                                meter if spec.get("instructions") else None)
        # One real step of A: its calls, and its accumulators as the step end saw them.
        seen = {}
        drain = mon.rec.drain

        def spy(now, **kw):
            acc, comm = drain(now, **kw)
            seen["state"] = (list(acc), copy.deepcopy(comm))
            return acc, comm
        mon.rec.drain = spy
        calls, clock = count_calls(models["A"], opts["A"], x, y, loss_fn)
        del mon.rec.drain
        result["calls"], result["clock_reads"] = calls, clock
        dist.barrier()
        if rank == 0:
            result["micro"] = pieces(mon, 1, seen["state"], meter)
    dist.barrier()
    if rank == 0:
        result["collect"] = page_cost(mon, meter)
    dist.barrier()
    mon.close()
    if rank == 0:
        with open(spec["out"], "w") as f:
            json.dump(result, f)
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
