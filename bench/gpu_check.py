"""One command to check zerodoc's GPU numbers against the PyTorch profiler on a real GPU.

    PYTHONPATH=. python bench/gpu_check.py [--out DIR] [--quick]

Needs one CUDA GPU and NCCL (torch >= 2.9; written against 2.11), nothing to install. Without
CUDA it exits with status 2 and one line saying so. Sections (each independent: one that
fails reports and the others still run):

1. fsdp2/<setup> for setup in implicit (FSDP2's defaults: implicit prefetch), async-explicit
   (async unshard + explicit forward / backward prefetch), no-reshard
   (reshard_after_forward=False): a ~1.1 B-parameter bf16 transformer, FSDP2 at world size 1
   with NCCL (its all-gathers re-enabled, see zerodoc/testing/gpusetup.py), a known slow link
   injected on the device before the all-gathers of chosen units (`torch.cuda._sleep` on the
   collective's stream), zerodoc attached. Several steps are profiled; per unit and phase
   zerodoc's collective time, exposed time and compute time are compared with the
   profiler's CUDA kernel trace of the same steps (zerodoc/testing/tracewitness.py). FAIL
   where they differ by more than max(5 %, 0.2 ms).
2. sync: the instrumented job under `torch.cuda.set_sync_debug_mode("error")`, plus the
   explicit synchronisations the mode misses, counted by who made them
   (zerodoc/testing/syncwatch.py). FAIL on any made by zerodoc.
3. overhead: two twins of the same job in one process, A with zerodoc attached once (default
   adaptive sampling, run until its K settled), B plain, alternated in blocks of steps
   (A B B A ...): the ratio of mean step times with its 95 % bootstrap interval over the block
   pairs (PASS: the whole interval <= 1.003; one that straddles it is "not resolved"). A
   sample installed for A's next step is taken out while B's block runs (`ab_blocks`).
4. memory: zerodoc's allocator populations; the job's own peak is not reset by zerodoc.
5. nvml: the link class zerodoc infers.
6. fsdp1 and ddp-zero1 at world size 1 (FSDP1 turns FULL_SHARD into NO_SHARD at world size 1:
   its gradient all-reduce; DDP + ZeroRedundancyOptimizer: bucket all-reduces, broadcasts):
   zerodoc's collective totals against the trace, syncs by origin.

Output: tables on stdout, everything in DIR/gpu_check.json (and the traces, gzipped).
Exit status: 0 all PASS, 1 a FAIL or an ERROR, 2 no CUDA.
"""

from __future__ import annotations

import argparse
import copy
import gzip
import json
import os
import random
import shutil
import socket
import statistics
import sys
import time
import traceback

SETUPS = ("implicit", "async-explicit", "no-reshard")
DELAYS_MS = {"blocks.3": 2.0, "blocks.9": 6.0, "blocks.15": 12.0}  # the known slow link
WARM_AFTER_ATTACH = 2  # overhead: steady state, as over a week-long run
BASE_DELAY_MS = 0.25  # every other unit's link: a device op the profiler can see (world size 1)
OVERHEAD_TARGET = 1.003
OVERHEAD_RESOLVE = 0.003  # the interval's width at most this: 1.000 and 1.003 told apart
OVERHEAD_MIN_PAIRS = 8  # fewer block pairs: too few resamples for a bootstrap interval


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Check:
    def __init__(self, args):
        self.args = args
        self.out = os.path.abspath(args.out)
        self.results: list[dict] = []
        self.warmup = 2 if args.quick else 4
        self.profiled = 2 if args.quick else 4

    def section(self, name: str, fn, *a) -> None:
        t0 = time.perf_counter()
        res = {"section": name, "status": "ERROR", "tables": [], "notes": []}
        try:
            fn(res, *a)
        except Exception as e:  # report, go on with the next section
            res["status"] = "ERROR"
            res["error"] = f"{type(e).__name__}: {e}"
            res["traceback"] = traceback.format_exc(limit=8)
        finally:
            _cleanup()
        res["seconds"] = round(time.perf_counter() - t0, 1)
        self.results.append(res)
        print_section(res)


def _cleanup() -> None:
    import gc

    import torch

    gc.collect()
    torch.cuda.empty_cache()


def print_section(res: dict) -> None:
    print(f"\n=== {res['section']}: {res['status']} ({res.get('seconds', '?')} s)")
    for t in res["tables"]:
        print(f"--- {t['title']}")
        cols = t["columns"]
        rows = [[_fmt(x) for x in r] for r in t["rows"]]
        widths = [max(len(str(c)), *(len(r[i]) for r in rows)) if rows else len(str(c))
                  for i, c in enumerate(cols)]
        print("  ".join(str(c).ljust(w) for c, w in zip(cols, widths)))
        for r in rows:
            print("  ".join(x.ljust(w) for x, w in zip(r, widths)))
    for n in res.get("notes", []):
        print(f"  note: {n}")
    if res.get("error"):
        print(f"  error: {res['error']}")
        print("  " + res.get("traceback", "").replace("\n", "\n  "))


def _fmt(x) -> str:
    if isinstance(x, float):
        return f"{x * 1e3:.3f} ms" if abs(x) < 100 else f"{x:.4g}"
    return str(x)


# --- FSDP2 vs the profiler ---------------------------------------------------------------


def _attach(model, opt, run_dir: str):
    import zerodoc

    mon = zerodoc.attach(model, opt, run_dir=run_dir, port=False, nvml=False)
    if not hasattr(mon, "timer"):  # the no-op monitor: attach failed and said why above
        raise RuntimeError("zerodoc.attach returned the no-op monitor (its warning above "
                           "says why); nothing to check")
    return mon


def _ours(totals, names: list[str], phase: str) -> dict:
    out = {}
    for n in names:
        c = totals.comm.get((n, phase, "all_gather"))
        out[n] = {"collective": c.seconds if c else 0.0, "exposed": c.exposed_seconds if c
                  else 0.0, "compute": totals.compute.get((n, phase), 0.0)}
    return out


def _diff(a: dict, b: dict) -> dict:
    return {n: {q: b[n][q] - a[n].get(q, 0.0) for q in b[n]} for n in b}


def fsdp2_section(ck: Check, res: dict, setup: str) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from zerodoc.testing.gpusetup import (
        batch, build_model, n_params, shard_fsdp2, train_step, world_size_1_all_gathers,
    )
    from zerodoc.testing.tracewitness import Trace, compare, gap_rows, launch_gaps, witness

    dev = torch.device("cuda", torch.cuda.current_device())
    model = build_model(dev)
    n = n_params(model)
    res["notes"].append(f"{n / 1e9:.2f} B parameters, bf16; injected delays (ms): {DELAYS_MS}, "
                        f"{BASE_DELAY_MS} on every other unit")
    assert n >= 1e9, n
    with world_size_1_all_gathers():
        units = shard_fsdp2(model, setup, dict(DELAYS_MS), ck.cpm, BASE_DELAY_MS)
        names = [u or "(root)" for u in units]
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5, foreach=True)
        mon = _attach(model, opt, os.path.join(ck.out, "runs", f"fsdp2-{setup}"))
        try:
            if not getattr(mon.timer, "device", False):
                raise RuntimeError(f"zerodoc did not take the CUDA path ({type(mon).__name__})")
            for i in range(ck.warmup):
                train_step(model, opt, batch(dev, i))
            torch.cuda.synchronize()  # the check's own syncs, outside the measured steps
            mon.flush()
            before = {p: _ours(mon.totals, names, p) for p in ("forward", "backward")}
            gap0 = {p: launch_gaps(mon, p) for p in ("forward", "backward")}
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for i in range(ck.profiled):
                    train_step(model, opt, batch(dev, 100 + i))
                torch.cuda.synchronize()
            mon.flush()
            after = {p: _ours(mon.totals, names, p) for p in ("forward", "backward")}
            gap1 = {p: launch_gaps(mon, p) for p in ("forward", "backward")}
            errors = dict(mon.registry.errors)
        finally:
            mon.close()
    path = os.path.join(ck.out, f"trace-fsdp2-{setup}.json")
    prof.export_chrome_trace(path)
    tr = Trace.load(path)
    _gzip(path)
    cs = tr.guess_compute_stream("")
    if cs is None:
        raise RuntimeError("no FSDP annotations for the root in the trace")
    children = {"": [u for u in units if u]}
    all_ok = True
    for phase in ("forward", "backward"):
        ours_fqn = {u: v for u, v in zip(units, _diff(before[phase], after[phase]).values())}
        theirs = witness(tr, units, children, phase, cs)
        rows, ok = compare(ours_fqn, theirs)
        gap = {u: gap1[phase].get(n, 0.0) - gap0[phase].get(n, 0.0)
               for u, n in zip(units, names)}
        rows += gap_rows(ours_fqn, theirs, gap)
        rows = [[r[0] or "(root)", *r[1:]] for r in rows]
        all_ok &= ok and bool(rows)
        res["tables"].append({"title": f"fsdp2 {setup} {phase}: zerodoc vs profiler over "
                                       f"{ck.profiled} steps (compute stream {cs})",
                              "columns": ["unit", "quantity", "zerodoc", "profiler", "diff",
                                          ""], "rows": rows})
    if errors:
        res["notes"].append(f"zerodoc errors counted: {errors}")
        all_ok = False
    res["status"] = "PASS" if all_ok else "FAIL"


def _gzip(path: str) -> None:
    with open(path, "rb") as f, gzip.open(path + ".gz", "wb") as g:
        shutil.copyfileobj(f, g)
    os.remove(path)


# --- no synchronisation ---------------------------------------------------------------------


def sync_section(ck: Check, res: dict) -> None:
    import torch

    from zerodoc.testing.gpusetup import (
        batch, build_model, shard_fsdp2, train_step, world_size_1_all_gathers,
    )
    from zerodoc.testing.syncwatch import SyncWatch

    dev = torch.device("cuda", torch.cuda.current_device())
    model = build_model(dev)
    with world_size_1_all_gathers():
        shard_fsdp2(model, "implicit", DELAYS_MS, ck.cpm)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5, foreach=True)
        peak0 = None
        for i in range(2):
            train_step(model, opt, batch(dev, i))
        torch.cuda.synchronize()
        peak0 = torch.cuda.max_memory_allocated()
        mon = _attach(model, opt, os.path.join(ck.out, "runs", "sync"))
        caught = None
        try:
            ids = [batch(dev, 10 + i) for i in range(4)]  # host->device copies made before
            torch.cuda.synchronize()
            with SyncWatch() as watch:
                torch.cuda.set_sync_debug_mode("error")
                try:
                    for x in ids:
                        train_step(model, opt, x)
                except RuntimeError as e:
                    caught = f"{e}"
                finally:
                    torch.cuda.set_sync_debug_mode(0)
            torch.cuda.synchronize()
            mon.flush()
            mem = dict(mon.totals.memory)
            errors = dict(mon.registry.errors)
        finally:
            mon.close()
        peak1 = torch.cuda.max_memory_allocated()
    rows = [[origin, n] for origin, n in sorted(watch.counts.items())] or [["(none)", 0]]
    res["tables"].append({"title": "explicit syncs during 4 instrumented steps, by origin",
                          "columns": ["origin", "calls"], "rows": rows})
    res["notes"].append("set_sync_debug_mode('error'): " + (caught or "no synchronising op"))
    if errors:
        res["notes"].append(f"zerodoc errors counted (a sync caught inside a hook?): {errors}")
    ok = caught is None and not watch.by("zerodoc") and not errors
    # memory: zerodoc never resets the job's peak
    res["tables"].append({
        "title": "allocator populations (zerodoc, last step) and the job's own peak",
        "columns": ["population", "bytes"],
        "rows": [[k, v] for k, v in sorted(mem.items())] + [
            ["torch max_memory_allocated before attach", peak0],
            ["torch max_memory_allocated after 4 instrumented steps", peak1]]})
    if peak1 < peak0:
        res["notes"].append("the job's peak went DOWN while zerodoc was attached: reset")
        ok = False
    for pop in ("allocated", "reserved", "peak_allocated", "peak_reserved", "capacity",
                "headroom"):
        if not mem.get(pop):
            res["notes"].append(f"population {pop} missing or zero")
            ok = False
    res["status"] = "PASS" if ok else "FAIL"


# --- overhead ------------------------------------------------------------------------------


def park_sample(mon) -> bool:
    """At the end of the zerodoc twin's block: take out the per-unit instrumentation that
    the end of A's last step installed for A's next step (a detail step due), so that B's
    block runs without any of it: FSDP2's class-level `_prefetch_unshard` wrapper would pass
    B's prefetches through A's recorder, and on a GPU the device clock's opening mark would
    span B's block. Returns whether one was taken out (`unpark_sample` puts it back before
    A's next block: the same steps get detail, none is added or skipped)."""
    if not getattr(mon, "_detail_on", False):
        return False
    mon._remove_detail()
    return True


def unpark_sample(mon, parked: bool) -> None:
    """Before the zerodoc twin's next block: put back what `park_sample` took out."""
    if parked and not mon._detail_on:
        mon._install_detail()


def ab_blocks(run: dict, mon, blocks: int, sync, on_block=None) -> dict[str, list[float]]:
    """The A/B's timed blocks, A B B A A B ... (no drift favours one side): `run[name]()`
    runs one block of twin `name`'s steps and returns how many; each block is timed between
    two `sync()` calls (the steps inside run as a job's do). Returns each twin's mean step
    time per block. The block boundary is clean: a sample installed for A's next step at the
    end of an A block is parked (outside the timed spans) while B's block runs. A paid its
    install inside its block, as in a run without B; the removal and the reinstall are
    outside both twins' timed spans. A detail step's read-back still pending at the end of
    an A block stays A's: it is read at A's next step ends. `on_block(name)` is called
    before each block and `on_block("-")` after it (the garbage collector's accounting)."""
    times: dict[str, list[float]] = {"A": [], "B": []}
    parked = False
    try:
        for b in range(blocks):
            for name in (("A", "B") if b % 2 == 0 else ("B", "A")):
                if name == "A":
                    unpark_sample(mon, parked)
                    parked = False
                if on_block is not None:
                    on_block(name)
                sync()
                t0 = time.perf_counter()
                n = run[name]()
                sync()
                times[name].append((time.perf_counter() - t0) / n)
                if on_block is not None:
                    on_block("-")
                if name == "A":
                    parked = park_sample(mon)
    finally:
        unpark_sample(mon, parked)  # A's next step gets its detail, as scheduled
    return times


def block_ratio(a: list[float], b: list[float], boot: int = 4000, seed: int = 0) -> dict:
    """The overhead of A over B from paired blocks (A's i-th block of steps run beside B's
    i-th, the order alternating): the ratio of the mean step times, sum(a) / sum(b), with its
    95 % bootstrap interval over the pairs (resampled with replacement; percentile). A mean,
    not a median: zerodoc's sampled steps are rare and dear, a median of blocks or steps would
    leave them out. The interval is what the A/B resolves: its width, not the point, says
    whether 0.3 % can be told from 0."""
    n = len(a)
    if n != len(b) or n < 2:
        raise ValueError(f"block_ratio: {len(a)} and {len(b)} blocks; need >= 2 pairs")
    rng = random.Random(seed)
    rs = []
    for _ in range(boot):
        idx = [rng.randrange(n) for _ in range(n)]
        rs.append(sum(a[i] for i in idx) / sum(b[i] for i in idx))
    rs.sort()
    lo, hi = rs[int(0.025 * boot)], rs[int(0.975 * boot) - 1]
    return {"ratio": sum(a) / sum(b), "lo": lo, "hi": hi, "pairs": n}


def overhead_verdict(st: dict, target: float = OVERHEAD_TARGET,
                     resolve: float = OVERHEAD_RESOLVE) -> tuple[str, str]:
    """PASS: the whole 95 % interval is within the target (hi <= target), from at least
    OVERHEAD_MIN_PAIRS block pairs. FAIL otherwise,
    saying which: over the target (the whole interval above it), or not resolved (the
    interval straddles the target: more blocks narrow it; its width is printed, and an
    interval wider than `resolve` cannot tell 1.000 from 1.003 at all)."""
    width = st["hi"] - st["lo"]
    if st["pairs"] < OVERHEAD_MIN_PAIRS:
        return "FAIL", (f"not resolved: {st['pairs']} block pairs, fewer than "
                        f"{OVERHEAD_MIN_PAIRS} for an interval; run more blocks "
                        f"(--overhead-blocks)")
    if st["hi"] <= target:
        return "PASS", ""
    if st["lo"] > target:
        return "FAIL", f"over the target: the whole 95 % interval is above {target}"
    wide = f", wider than {resolve * 100:.1f} %" if width > resolve else ""
    return "FAIL", (f"not resolved: the 95 % interval {st['lo']:.4f} .. {st['hi']:.4f} "
                    f"({width * 100:.2f} % wide{wide}) straddles {target}; run more blocks "
                    f"(--overhead-blocks)")


def cuda_call_costs(n: int = 2000) -> dict:
    """Host time of the CUDA calls zerodoc makes on a detail step, each in a tight loop on
    an idle stream (medians, us): zerodoc's record path (`cuda.fast_record`), torch's
    `Event.record()`, `elapsed_time()` and `query()` of completed events."""
    import torch

    from zerodoc.shim import cuda

    evs = [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)]
    rec = cuda.fast_record()
    out = {}

    def timed(fn) -> float:
        ts = []
        for i in range(n):
            t = time.perf_counter()
            fn(i)
            ts.append(time.perf_counter() - t)
        return statistics.median(ts) * 1e6

    if rec is not None:
        out["record (zerodoc's fast_record)"] = timed(lambda i: rec(evs[i]))
    torch.cuda.synchronize()
    out["Event.record()"] = timed(lambda i: evs[i].record())
    evs[n].record()
    torch.cuda.synchronize()
    out["Event.elapsed_time()"] = timed(lambda i: evs[i].elapsed_time(evs[i + 1]))
    out["Event.query()"] = timed(lambda i: evs[i].query())
    return out


def overhead_section(ck: Check, res: dict) -> None:
    """Steady-state overhead, A/B in one process: twin A (zerodoc attached once, the default
    adaptive sampling) and twin B (plain), the same model, data and sharding, alternating in
    blocks of steps (A B B A ...) after A ran long enough for its sampling rate K to settle.
    Each block is timed between two synchronisations (the steps inside it run as a job's do).
    The ratio of mean step times with its 95 % interval (`block_ratio`)."""
    import gc

    import torch

    from zerodoc.testing.gpusetup import (
        batch, build_model, shard_fsdp2, train_step, world_size_1_all_gathers,
    )

    a_ = ck.args
    blocks = a_.overhead_blocks or (12 if a_.quick else 40)
    per = a_.overhead_steps or (8 if a_.quick else 16)
    warm_s = a_.overhead_warm if a_.overhead_warm is not None else (15.0 if a_.quick else 60.0)
    dev = torch.device("cuda", torch.cuda.current_device())
    ids = [batch(dev, i) for i in range(per)]
    gc_t = {"A": [0, 0.0], "B": [0, 0.0]}  # passes, seconds, by the block they started in
    cur = ["-"]
    gc_start = [0.0]

    def settled(ks: list) -> bool:
        return len(ks) >= 8 and max(ks[-4:]) <= 2 * min(ks[-4:])

    def gc_cb(phase, info):
        if phase == "start":
            gc_start[0] = time.perf_counter()
        elif cur[0] in gc_t:
            gc_t[cur[0]][0] += 1
            gc_t[cur[0]][1] += time.perf_counter() - gc_start[0]

    with world_size_1_all_gathers():
        twins = {}
        for name in ("A", "B"):
            m = build_model(dev)
            shard_fsdp2(m, "implicit", {}, ck.cpm)  # no injected delay: the plain step
            twins[name] = (m, torch.optim.AdamW(m.parameters(), lr=1e-5, foreach=True))
        for name in ("B", "A"):
            for x in ids[:2]:
                train_step(*twins[name], x)
        mon = _attach(*twins["A"], os.path.join(ck.out, "runs", "overhead"))
        gc.callbacks.append(gc_cb)
        try:
            # steady state: A alone until K settled (at least 8 detail steps, the last 4
            # within a factor of 2: adaptive K is a power of two and steps by one near the
            # budget's edge) or warm_s passed
            ks, t_end, i = [], time.perf_counter() + warm_s, 0
            while time.perf_counter() < t_end:
                d0 = mon.totals.detail_steps
                train_step(*twins["A"], ids[i % per])
                i += 1
                if mon.totals.detail_steps > d0:
                    ks.append(mon.sampler.k)
                    if settled(ks):
                        break
            torch.cuda.synchronize()
            warm = {"steps": i, "detail_steps": len(ks), "k_after": ks[-8:],
                    "settled": settled(ks)}
            d0, s0 = mon.totals.detail_steps, mon.step_index

            def block(name: str):
                def steps() -> int:
                    for x in ids:
                        train_step(*twins[name], x)
                    return per
                return steps

            times = ab_blocks({"A": block("A"), "B": block("B")}, mon, blocks,
                              torch.cuda.synchronize, on_block=lambda n: cur.__setitem__(0, n))
            detail = mon.totals.detail_steps - d0
            steps = mon.step_index - s0
            k_end = mon.sampler.k
            sm = mon.sampler
            med = statistics.median
            sample = {"own_s": sm.own_s, "own_hi_s": sm.own_hi_s,
                      "thread_excess_s": med(sm._xs_cpu) if sm._xs_cpu else None,
                      "process_excess_s": med(sm._xs_out) if sm._xs_out else None,
                      "samples": len(sm._xs_cpu),
                      "median_step_s": med(sm._steps) if sm._steps else None}
            calls = cuda_call_costs()
        finally:
            gc.callbacks.remove(gc_cb)
            mon.close()
    st = block_ratio(times["A"], times["B"])
    status, why = overhead_verdict(st)
    a, b = statistics.mean(times["A"]), statistics.mean(times["B"])
    res["tables"].append({
        "title": f"step time, mean of {blocks} blocks of {per} steps per twin (A B B A ...), "
                 f"after A's warm-up of {warm['steps']} steps",
        "columns": ["", "value", ""],
        "rows": [["plain twin (B)", b, f"{len(times['B'])} blocks"],
                 ["zerodoc twin (A)", a, f"{len(times['A'])} blocks"],
                 ["ratio A / B", f"{st['ratio']:.4f}", f"target <= {OVERHEAD_TARGET}"],
                 ["95 % interval", f"{st['lo']:.4f} .. {st['hi']:.4f}",
                  f"width {100 * (st['hi'] - st['lo']):.2f} % (PASS: all of it <= "
                  f"{OVERHEAD_TARGET})"],
                 ["detail steps in A's timed steps", f"{detail} of {steps}",
                  f"K at the end {k_end}"],
                 ["K over the warm-up's last detail steps", str(warm["k_after"]),
                  "settled" if warm["settled"] else f"not settled in {warm_s:g} s"],
                 ["gc passes / seconds in A's blocks", f"{gc_t['A'][0]} / "
                  f"{gc_t['A'][1]:.4f}", "a pass lands where the allocations crossed the "
                  "threshold: A's garbage can be collected in B's blocks"],
                 ["gc passes / seconds in B's blocks", f"{gc_t['B'][0]} / "
                  f"{gc_t['B'][1]:.4f}", ""]]})
    res["tables"].append({
        "title": f"one sample's host cost as the sampler measured it (median excess of a "
                 f"detail step over the plain steps, {sample['samples']} samples; issue 19's "
                 f"per-sample target: 1.5 ms at 21 units)",
        "columns": ["", "value"],
        "rows": [["training thread's CPU", sample["thread_excess_s"]],
                 ["process's CPU (all threads)", sample["process_excess_s"]],
                 ["estimate / its upper bound (K is set from the bound)",
                  f"{_fmt(sample['own_s'])} / {_fmt(sample['own_hi_s'])}"],
                 ["median step as the sampler saw it", sample["median_step_s"]]]})
    res["tables"].append({
        "title": "CUDA calls, host time each (median of 2,000 on an idle stream; "
                 "bench/gpu_hotpath.py prices each at 3 us)",
        "columns": ["call", "us"],
        "rows": [[k, f"{v:.2f}"] for k, v in calls.items()]})
    res["overhead"] = {**st, "a_step_s": a, "b_step_s": b, "blocks": blocks, "per": per,
                       "detail_steps": detail, "steps": steps, "k_end": k_end, "warm": warm,
                       "gc": gc_t, "sample": sample, "cuda_call_us": calls}
    res["status"] = status
    if why:
        res["notes"].append(why)
    if not warm["settled"]:
        res["notes"].append("K had not settled when the timed blocks began: the ratio may "
                            "not be the steady state's (--overhead-warm)")


def nvml_section(ck: Check, res: dict) -> None:
    from zerodoc.shim import hookpoints as hp
    from zerodoc.shim.nvml import NvmlSampler

    reg = hp.HookRegistry()
    s = NvmlSampler.start(reg)
    if s is None:
        res["notes"].append(f"NVML unavailable: {reg.status.get('nvml')}")
        res["status"] = "FAIL"
        return
    try:
        time.sleep(1.5)
        sample = s.latest()
    finally:
        s.stop()
    res["tables"].append({"title": "NVML", "columns": ["what", "value"],
                          "rows": [["link class", s.link_class],
                                   *[[k, f"{v:.4g}"] for k, v in sorted(sample.items())]]})
    res["status"] = "PASS" if s.link_class != "unknown" else "FAIL"


# --- FSDP1, DDP + ZeRO-1 at world size 1 -----------------------------------------------------


def _patched_collective(name: str, label: str, delay_ms: float, cpm: float):
    """Wrap torch.distributed.<name>: the check's device delay on the collective's stream,
    annotated for the trace (async: on a side stream the process group's stream waits on)."""
    import torch
    import torch.distributed as dist

    orig = getattr(dist, name)
    side = torch.cuda.Stream()

    def call(*args, **kwargs):
        with torch.profiler.record_function(f"gpu_check::link ({label})"):
            if not kwargs.get("async_op", False):
                torch.cuda._sleep(int(delay_ms * cpm))
                return orig(*args, **kwargs)
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                torch.cuda._sleep(int(delay_ms * cpm))
                return orig(*args, **kwargs)
    setattr(dist, name, call)
    return lambda: setattr(dist, name, orig)


def _link_total(tr, label: str, exclude_stream) -> float:
    from zerodoc.testing.tracewitness import Span

    total = 0.0
    for s in tr.named("gpu_check::link", label):
        ops = tr.launched_in(Span("", s.start, s.end, None), exclude_stream=exclude_stream)
        if ops:
            total += max(o.end for o in ops) - min(o.start for o in ops)
    return total / 1e6


def _framework_run(ck: Check, res: dict, kind: str) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from zerodoc.testing.gpusetup import Block, batch, build_model, train_step
    from zerodoc.testing.tracewitness import Trace, launch_gap_total
    from zerodoc.testing.syncwatch import SyncWatch

    dev = torch.device("cuda", torch.cuda.current_device())
    model = build_model(dev)
    if kind == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({Block}), device_id=dev,
                     use_orig_params=True)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5, foreach=True)
        coll, phase = "all_reduce", "backward"
        undo = _patched_collective("all_reduce", "fsdp1", 1.0, ck.cpm)
    else:
        from torch.distributed.optim import ZeroRedundancyOptimizer
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(model, device_ids=[dev.index])
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW,
                                      lr=1e-5)
        coll, phase = "all_reduce", "backward"
        undo = _patched_collective("all_reduce", "ddp", 0.5, ck.cpm)
    try:
        mon = _attach(model, opt, os.path.join(ck.out, "runs", kind))
        try:
            for i in range(ck.warmup):
                train_step(model, opt, batch(dev, i))
            torch.cuda.synchronize()
            mon.flush()
            before = copy.deepcopy(mon.totals.comm)
            gap0 = launch_gap_total(mon, coll, phase)
            with SyncWatch() as watch, profile(
                    activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for i in range(ck.profiled):
                    train_step(model, opt, batch(dev, 100 + i))
                torch.cuda.synchronize()
            mon.flush()
            after = copy.deepcopy(mon.totals.comm)
            gap = launch_gap_total(mon, coll, phase) - gap0
            framework = mon.facts.framework
        finally:
            mon.close()
    finally:
        undo()
    path = os.path.join(ck.out, f"trace-{kind}.json")
    prof.export_chrome_trace(path)
    tr = Trace.load(path)
    _gzip(path)

    def total(d, c):
        return sum(t.seconds for (u, p, cc), t in d.items() if cc == c and p == phase)
    ours = total(after, coll) - total(before, coll)
    cs = _busiest_stream(tr)
    theirs = _link_total(tr, kind if kind == "fsdp1" else "ddp", cs)
    tol = max(0.05 * theirs, 0.0002 * ck.profiled)
    ok = abs(ours - theirs) <= tol and theirs > 0
    rows = [[f"{framework} {coll} ({phase}), all units", ours, theirs, ours - theirs,
             "ok" if ok else "FAIL"],
            [f"{framework} {coll} ({phase}), incl. launch gap (not judged)", ours + gap, theirs,
             ours + gap - theirs, "info"]]
    res["tables"].append({"title": f"{kind}: collective time over {ck.profiled} steps",
                          "columns": ["what", "zerodoc", "profiler", "diff", ""],
                          "rows": rows})
    res["tables"].append({"title": "explicit syncs by origin (C++ ones, e.g. DDP's stats "
                                   "logger, are not visible here)",
                          "columns": ["origin", "calls"],
                          "rows": [[o, n] for o, n in sorted(watch.counts.items())]
                          or [["(none)", 0]]})
    if watch.by("zerodoc"):
        ok = False
        res["notes"].append(f"zerodoc synchronised: {watch.by('zerodoc')[:3]}")
    res["status"] = "PASS" if ok else "FAIL"


def _busiest_stream(tr):
    busy: dict = {}
    for op in tr.ops:
        busy[op.stream] = busy.get(op.stream, 0.0) + op.end - op.start
    return max(busy, key=busy.get) if busy else None


def fsdp1_section(ck: Check, res: dict) -> None:
    _framework_run(ck, res, "fsdp1")


def ddp_section(ck: Check, res: dict) -> None:
    _framework_run(ck, res, "ddp-zero1")


# --- main --------------------------------------------------------------------------------------


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="gpu-check-out", help="output directory (JSON, traces)")
    ap.add_argument("--quick", action="store_true", help="fewer steps (about a minute)")
    ap.add_argument("--only", default="", help="comma-separated section names to run")
    ap.add_argument("--overhead-blocks", type=int, default=0,
                    help="overhead: blocks per twin (default 40; 12 with --quick)")
    ap.add_argument("--overhead-steps", type=int, default=0,
                    help="overhead: steps per block (default 16; 8 with --quick)")
    ap.add_argument("--overhead-warm", type=float, default=None,
                    help="overhead: seconds at most for the zerodoc twin's sampling rate to "
                         "settle before timing (default 60; 15 with --quick)")
    args = ap.parse_args(argv)
    if args.overhead_blocks < 0 or 0 < args.overhead_blocks < OVERHEAD_MIN_PAIRS or \
            args.overhead_steps < 0 or (args.overhead_warm is not None and args.overhead_warm < 0):
        ap.error(f"--overhead-blocks must be 0 (the default) or >= {OVERHEAD_MIN_PAIRS}, "
                 "--overhead-steps and --overhead-warm >= 0")
    try:
        import torch
        import torch.distributed as dist
    except Exception as e:  # noqa: BLE001
        print(f"gpu_check: cannot import torch ({e})")
        return 2
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device here (torch.cuda.is_available() is False); run it on "
              "a GPU machine: PYTHONPATH=. python bench/gpu_check.py")
        return 2
    if not dist.is_nccl_available():
        print("gpu_check: this torch has no NCCL backend")
        return 2
    os.makedirs(args.out, exist_ok=True)
    ck = Check(args)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), RANK="0",
                      WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
    torch.cuda.set_device(0)
    t0 = time.perf_counter()
    dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
    from zerodoc.testing.gpusetup import calibrate_cycles_per_ms

    ck.cpm = calibrate_cycles_per_ms()
    env = {"torch": torch.__version__, "cuda": torch.version.cuda,
           "nccl": ".".join(map(str, torch.cuda.nccl.version())),
           "device": torch.cuda.get_device_name(0), "python": sys.version.split()[0],
           "sleep_cycles_per_ms": round(ck.cpm)}
    print("gpu_check:", json.dumps(env))
    only = {s for s in args.only.split(",") if s}
    plan = [(f"fsdp2/{s}", fsdp2_section, s) for s in SETUPS] + [
        ("sync+memory", sync_section), ("overhead", overhead_section), ("nvml", nvml_section),
        ("fsdp1", fsdp1_section), ("ddp-zero1", ddp_section)]
    for name, fn, *a in plan:
        if only and name not in only and name.split("/")[0] not in only:
            continue
        ck.section(name, lambda res, *x, _fn=fn: _fn(ck, res, *x), *a)
    try:
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        pass
    summary = {r["section"]: r["status"] for r in ck.results}
    report = {"env": env, "summary": summary, "seconds": round(time.perf_counter() - t0, 1),
              "sections": ck.results}
    path = os.path.join(args.out, "gpu_check.json")
    with open(path, "w") as f:
        json.dump(report, f, indent=1, default=str)
    print(f"\ngpu_check summary: {json.dumps(summary)} ({report['seconds']} s) -> {path}")
    return 0 if all(s == "PASS" for s in summary.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
