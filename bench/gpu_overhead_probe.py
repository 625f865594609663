"""Where zerodoc's cost goes on a GPU step: the overhead section of `gpu_check.py`, split.

    PYTHONPATH=. python bench/gpu_overhead_probe.py [--blocks 6] [--per 4] [--profile]

Same model and setup as the check's overhead section (FSDP2, world size 1 with its
all-gathers re-enabled, no injected delay). Modes alternate in blocks (A B C C B A ...):

- bare: no zerodoc;
- zerodoc: attached with the check's options (no HTTP server, no NVML);
- zerodoc-nolog: the same without the run log (its background writer);
- zerodoc-nodetail: the run log without its per-step detail files.

Per mode, medians per step of: wall (synchronised at block ends), host time to enqueue the
forward + backward (no sync: when it exceeds the device time the job is launch-bound and every
host microsecond counts), the optimizer step's host time, and the device time of forward +
backward and of the optimizer step (CUDA events on the default stream), and the time in
Python's garbage collector (`gc.callbacks`) per step. `--profile`: one more zerodoc block under
cProfile, its top functions by own time.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import os
import pstats
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--blocks", type=int, default=6)
    ap.add_argument("--per", type=int, default=4)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    import torch
    import torch.nn.functional as F

    if not torch.cuda.is_available():
        print("gpu_overhead_probe: no CUDA device")
        return 2
    import torch.distributed as dist

    import zerodoc
    from bench.gpu_check import _free_port
    from zerodoc.testing.gpusetup import (
        batch, build_model, calibrate_cycles_per_ms, shard_fsdp2, world_size_1_all_gathers,
    )

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), RANK="0",
                      WORLD_SIZE="1", LOCAL_RANK="0")
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
    dev = torch.device("cuda", 0)
    cpm = calibrate_cycles_per_ms()
    model = build_model(dev)
    out = tempfile.mkdtemp(prefix="zd-probe-")
    gc_acc = {"t": 0.0, "n": 0, "t0": 0.0}

    def _gc_cb(phase, info):  # the job's own garbage collections, timed
        if phase == "start":
            gc_acc["t0"] = time.perf_counter()
        else:
            gc_acc["t"] += time.perf_counter() - gc_acc["t0"]
            gc_acc["n"] += 1

    gc.callbacks.append(_gc_cb)
    stats = {m: {"wall": [], "host_fb": [], "host_opt": [], "dev_fb": [], "dev_opt": [],
                 "gc": [], "gcs": []}
             for m in ("bare", "zerodoc", "zerodoc-nolog", "zerodoc-nodetail")}
    with world_size_1_all_gathers():
        shard_fsdp2(model, "implicit", {}, cpm)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5, foreach=True)
        ids = [batch(dev, i) for i in range(args.per)]

        def step(x, rec):
            e0, e1, e2 = (torch.cuda.Event(enable_timing=True) for _ in range(3))
            t0 = time.perf_counter()
            e0.record()
            logits = model(x)
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), x.view(-1))
            loss.backward()
            e1.record()
            t1 = time.perf_counter()
            opt.step()
            opt.zero_grad(set_to_none=True)
            e2.record()
            t2 = time.perf_counter()
            rec.append((t1 - t0, t2 - t1, e0, e1, e2))

        for x in ids:
            step(x, [])
        modes = ["bare", "zerodoc", "zerodoc-nolog", "zerodoc-nodetail"]
        order = []
        for i in range(args.blocks):
            order += modes if i % 2 == 0 else modes[::-1]

        def block(mode, prof=None):
            mon = None
            if mode != "bare":
                mon = zerodoc.attach(model, opt, run_dir=os.path.join(out, mode), port=False,
                                     nvml=False, run_log=(mode != "zerodoc-nolog"),
                                     run_log_detail=(mode == "zerodoc"))
                assert hasattr(mon, "timer"), "attach failed"
            try:
                step(ids[0], [])  # attach's first steps (one-off work), not timed
                step(ids[1 % len(ids)], [])
                torch.cuda.synchronize()
                rec = []
                if prof:
                    prof.enable()
                gc_acc["t"], gc_acc["n"] = 0.0, 0
                t0 = time.perf_counter()
                for x in ids:
                    step(x, rec)
                torch.cuda.synchronize()
                wall = (time.perf_counter() - t0) / len(ids)
                gcs = (gc_acc["t"] / len(ids), gc_acc["n"] / len(ids))
                if prof:
                    prof.disable()
            finally:
                if mon is not None:
                    mon.close()
            return wall, rec, gcs

        for mode in order:
            wall, rec, gcs = block(mode)
            s = stats[mode]
            s["wall"].append(wall)
            s["gc"].append(gcs[0])
            s["gcs"].append(gcs[1] / 1e3)  # shown x1000 below: collections per step
            for h_fb, h_opt, e0, e1, e2 in rec:
                s["host_fb"].append(h_fb)
                s["host_opt"].append(h_opt)
                s["dev_fb"].append(e0.elapsed_time(e1) / 1e3)
                s["dev_opt"].append(e1.elapsed_time(e2) / 1e3)
        print(f"gpu_overhead_probe: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, "
              f"{args.blocks} blocks x {args.per} steps per mode (medians per step, ms)")
        print(f"{'mode':17} {'wall':>9} {'host f+b':>9} {'host opt':>9} {'device f+b':>11} "
              f"{'device opt':>11} {'gc ms':>7} {'gc/step':>8}")
        base = statistics.median(stats["bare"]["wall"])
        for m, s in stats.items():
            med = {k: statistics.median(v) * 1e3 for k, v in s.items()}
            print(f"{m:17} {med['wall']:9.3f} {med['host_fb']:9.3f} {med['host_opt']:9.3f} "
                  f"{med['dev_fb']:11.3f} {med['dev_opt']:11.3f} {med['gc']:7.3f} "
                  f"{med['gcs']:8.2f}   ratio "
                  f"{med['wall'] / base / 1e3:.4f}")
        if args.profile:
            prof = cProfile.Profile()
            block("zerodoc", prof)
            for key, n in (("tottime", 35), ("cumulative", 25)):
                buf = io.StringIO()
                pstats.Stats(prof, stream=buf).sort_stats(key).print_stats("zerodoc", n)
                print(f"--- zerodoc's functions by {key} (cProfile, one block)")
                print(buf.getvalue()[-7000:])
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
