"""The GPU hot path's host cost, on CPU, per kind of step (issue 19's tiers).

    python bench/gpu_hotpath.py [--units 21] [--steps 100] [--rounds 5]

FSDP2's CUDA stream behaviour on the CUDA stand-in (`zerodoc/testing/fakefsdp2.py` over
`zerodoc/testing/cudasim.py`: the same stand-in the GPU-semantics tests use) drives the real
monitor: `zerodoc.attach()` on the fake model (its adapter is the real FSDP2 wiring,
`zerodoc.shim.fsdp2.build_plan`, over the fake's units), with the GPU path's device recorder
and collective timer on stand-in events. Two twins: A with zerodoc, B without. Each round
runs a block of unsampled steps of A (per-unit detail off: only the always-on tier), a
block of sampled ones (per-unit hooks and wrappers installed for the whole block) and a block
of single samples as a run has them (every second step of A a detail step: the step before it
installs the per-unit instrumentation at its end, the detail step removes it at its own), each
step of A paired with a step of B run right before or after it (a single sample: A's two
steps with two of B's; the order alternates), so that the machine's drift cancels in the
pair's difference.

Printed, one JSON object (times: the training thread's CPU time, `time.thread_time`):
- `unsampled_python_us`: zerodoc's own Python time on an unsampled step, measured around the
  only zerodoc code such a step enters (the optimizer's pre- and post-hooks, the step end in
  the latter: `unsampled_zerodoc_calls_in_forward_backward`, counted with sys.setprofile, is
  the witness that nothing else is entered), median over steps; the sampler adaptive, as
  by default, with a K no step reaches; `_mean_us` the mean (it
  carries the memory re-reads, every `memory_every` steps or second).
- `sampled_python_us`: A - B on sampled steps (the hooks are spread over forward and
  backward), the median of the paired differences.
- `*_ab_us`: the median of the paired differences A - B, with `*_ab_ci95_us` (the 95 %
  interval of that median, from order statistics) and `*_ab_rounds_us` (the lowest and highest
  round's median): what the A/B resolves. `plain_step_spread_us`: B's step, 10th-90th
  percentile.
- `unsampled_python_us` less `timing_probe_us` per hook call (the timing wrapper's own cost,
  an empty call through it). Python figures less `counting_us_per_cuda_call` per CUDA call
  of zerodoc's (the counting wrapper's cost outside what it times, from a wrapped no-op),
  and less `*_standin_us`, the stand-in's own Python time inside the CUDA
  calls zerodoc made (those calls are charged at 3 us each below); `*_python_raw_us` before.
- `*_cuda_calls`: event records + queries + elapsed-time reads per step made by zerodoc
  (A's count - B's, exact: the stand-in counts every call);
- `*_cost_us`: Python us + 3 us per CUDA call, with the issue's targets (unsampled <= 30 us
  at 21 units and <= 60 at 81; sampled <= 1.5 ms at 21 and <= 5 ms at 81) and `*_ok`.
- `unsampled_gc_passes_in_zerodoc_per_step` (garbage-collector passes that started inside
  the timed zerodoc code, gc.callbacks) and `gc_passes_per_step` {A, B} over the unsampled
  blocks.
- `step_end_us`: the same unsampled-step code (`optimizer.step()` with zerodoc's hooks,
  no model) in a tight loop and after touching 0.25 to 16 MB of other memory: the cost of
  that code when the caches no longer hold it (the model's own work between two step ends
  does that, more of it the larger the model), with the stand-in's calls included.
- `install_us` / `remove_us`: installing / removing the per-unit instrumentation once
  (`Monitor._install_detail` / `_remove_detail` alone, right after a block of steps: the
  caches hold little of it, as in a run; medians, less the stand-in's time in their CUDA
  calls; `install_cuda_calls`: the device clock's opening mark), paid by every sample.
- `per_sample_python_us`: what one sample costs as the sampler sees it (`Monitor._tiers`:
  the install, the detail step, its removal, and the read-back of its tail on the steps after
  it), measured on the single samples: the median of A's two steps less B's two, less the
  stand-in's time and the counting's cost, less `unsampled_python_us` (the step before the
  sample would pay that anyway); `per_sample_cuda_calls` likewise; `per_sample_cost_us` =
  Python + 3 us a CUDA call, judged against the sampled target (`per_sample_ok`);
  `per_sample_ab_*` its A/B spread. `per_sample_sum_us`: the sum of the parts measured apart
  (install + `sampled_cost_us` + removal, each with its CUDA calls): the same quantity
  through another route. `sampled_cost_us` is the detail step alone, with the
  instrumentation installed for a whole block of steps (install and removal amortised
  away).
Figures from this machine's CPU: they show the host cost a GPU step would pay.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from time import perf_counter

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from zerodoc.testing.syncwatch import python_calls  # noqa: E402

TARGETS = {21: (30.0, 1500.0), 81: (60.0, 5000.0)}
US_PER_CUDA_CALL = 3.0


class Counter:
    """Counts the stand-in's event records, queries and elapsed-time reads (the calls made
    from outside the stand-in: its `elapsed_time` queries both events itself), and the time
    spent inside them (`t`, and `t_direct`: the part inside the directly timed zerodoc
    code): the stand-in's Python stands for the CUDA call, which the per-step cost charges
    at 3 us a call, so it is not zerodoc's Python time. Timed with perf_counter (~40 ns a
    read): a call lasts under a microsecond, and a thread-CPU clock read (~0.5 us, a system
    call) would cost more than the call and be charged to zerodoc."""

    def __init__(self):
        self.n = 0
        self.depth = 0
        self.t = 0.0
        self.t_direct = 0.0
        self.n_direct = 0
        self.direct = False  # inside the directly timed zerodoc code

    def wrap(self, orig):
        def wrapped(*a, **k):
            if self.depth:
                return orig(*a, **k)
            self.n += 1
            self.depth = 1
            t = perf_counter()
            try:
                return orig(*a, **k)
            finally:
                dt = perf_counter() - t
                self.t += dt
                if self.direct:
                    self.t_direct += dt
                    self.n_direct += 1
                self.depth = 0
        return wrapped

    def install(self):
        from zerodoc.testing import cudasim

        cls = cudasim.SimEvent
        for name in ("record", "query", "elapsed_time"):
            setattr(cls, name, self.wrap(getattr(cls, name)))
        self.outside_s = self.calibrate()

    def calibrate(self, n: int = 20000) -> float:
        """The counting's own cost per call that lands outside `t` (so on whoever made the
        call): a wrapped no-op's thread time less a bare one's (the wrapper's whole cost),
        less one clock read (the part of it inside `t`). Thread CPU times, best of 5."""
        def bare():
            return None
        w = self.wrap(bare)

        def loop(fn) -> float:
            c = time.thread_time()
            for _ in range(n):
                fn()
            return time.thread_time() - c
        n0, t0 = self.n, self.t
        best = min(loop(w) - loop(bare) - loop(perf_counter) for _ in range(5)) / n
        self.n, self.t = n0, t0
        return max(0.0, best)


def ci95(xs: list[float]) -> tuple[float, float]:
    """Distribution-free 95 % interval of the median of `xs` (order statistics)."""
    xs = sorted(xs)
    n = len(xs)
    k = max(0, math.floor(n / 2 - 0.98 * math.sqrt(n)))
    return xs[k], xs[min(n - 1, n - 1 - k)]


class GcWatch:
    """Garbage-collector passes, by where they started: inside the timed zerodoc code or
    not (gc.callbacks)."""

    def __init__(self, counter: "Counter"):
        self.counter = counter
        self.inside = self.total = 0
        gc.callbacks.append(self.cb)

    def cb(self, phase, info):
        if phase == "start":
            self.total += 1
            self.inside += self.counter.direct

    def close(self):
        gc.callbacks.remove(self.cb)


def zerodoc_calls(fn) -> int:
    """Python calls into zerodoc (not its test stand-ins) while `fn` runs (sys.setprofile)."""
    return python_calls(fn)


def step_end_cold(opt, direct: list, hook_calls: list, probe_s: float,
                  n: int = 200) -> dict:
    """The unsampled step's zerodoc code (the optimizer hooks, the step end) without the
    model: `optimizer.step()` alone, in a tight loop and after the thread touched M MB of
    other memory (a bytearray, one write per 64-byte line, and a walk over M MB of Python
    objects): what the same code costs when the caches no longer hold it. Medians, us."""
    def once() -> float:
        d0, h0 = direct[0], hook_calls[0]
        opt.step()
        return direct[0] - d0 - probe_s * (hook_calls[0] - h0)

    out = {"tight": round(statistics.median(once() for _ in range(n)) * 1e6, 1)}
    for mb in (0.25, 1, 4, 16):
        size = int(mb * 2**20)
        buf = bytearray(size)
        zeros = bytes(len(range(0, size, 64)))
        objs = [object() for _ in range(size // 16)]  # 16 bytes each
        ts = []
        for _ in range(n // 4):
            buf[::64] = zeros
            for _o in objs:
                pass
            ts.append(once())
        out[f"after_{mb:g}MB"] = round(statistics.median(ts) * 1e6, 1)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--units", type=int, default=21, help="sharded units (root + blocks)")
    ap.add_argument("--steps", type=int, default=100, help="A/B step pairs per block")
    ap.add_argument("--rounds", type=int, default=5, help="blocks of each kind")
    args = ap.parse_args(argv)
    if args.units < 2 or args.steps < 4 or args.rounds < 1:
        print("gpu_hotpath: --units >= 2, --steps >= 4, --rounds >= 1", file=sys.stderr)
        return 2
    torch.set_num_threads(1)

    from zerodoc.shim import hookpoints as hp
    from zerodoc.shim import monitor as monmod
    from zerodoc.shim.sampler import Sampler
    from zerodoc.testing import simmonitor

    counter = Counter()
    counter.install()
    queue: list = []

    # zerodoc's own code on an unsampled step, timed directly (wrappers on the class, so the
    # bound methods attach() registers are the timed ones)
    direct = [0.0]
    hook_calls = [0]

    def timed_call(orig, self, a):
        hook_calls[0] += 1
        t = time.thread_time()
        counter.direct = True
        try:
            return orig(self, *a)
        finally:
            counter.direct = False
            direct[0] += time.thread_time() - t

    for name in ("_root_pre", "_opt_pre", "_opt_post"):
        def timed(self, *a, _orig=getattr(monmod.Monitor, name)):
            return timed_call(_orig, self, a)
        setattr(monmod.Monitor, name, timed)

    # What the direct timing costs by itself (a thread-CPU clock read is a system call,
    # ~0.5 us, and one falls inside each timed span): an empty call through the same
    # wrapper, subtracted once per hook call.
    def noop(self):
        return None
    probe = []
    for _ in range(2000):
        d0 = direct[0]
        timed_call(noop, None, ())
        probe.append(direct[0] - d0)
    probe_s = statistics.median(probe)
    direct[0] = 0.0
    hook_calls[0] = 0

    sim_a, fsdp_a, opt_a = simmonitor.build(args.units)
    sim_b, fsdp_b, opt_b = simmonitor.build(args.units)
    tmp = tempfile.mkdtemp(prefix="zd-gpu-hotpath-")
    mon, real_queue = simmonitor.attach(sim_a, fsdp_a, opt_a, "off", os.path.join(tmp, "run"),
                                        queue)
    hp.queue_autograd_callback = queue.append  # autograd callbacks: the fake runs them
    twins = {"A": (sim_a, fsdp_a, opt_a), "B": (sim_b, fsdp_b, opt_b)}

    def fwd_bwd(twin: str) -> None:
        twins[twin][1].step(queue)

    def rest(twin: str) -> None:
        sim, _fsdp, opt = twins[twin]
        sim.kernel(0.5, "optimizer")
        opt.step()
        sim.drain()  # the job waits for its step (loss.item()): the host stays one step ahead at most
        # the stand-in's op log is the tests' witness; here it would only grow (and make the
        # garbage collector's passes, charged to whichever twin triggers them, grow with it)
        sim.ops.clear()
        sim.stalls.clear()

    def step(twin: str) -> tuple[float, float, int, float, float]:
        """One step: (thread s, direct s less the timing's and the counting's own cost,
        CUDA calls, stand-in s, stand-in s in direct)."""
        d0, n0, s0, sd0, h0 = direct[0], counter.n, counter.t, counter.t_direct, hook_calls[0]
        nd0 = counter.n_direct
        t = time.thread_time()
        fwd_bwd(twin)
        rest(twin)
        t = time.thread_time() - t
        nd = counter.n_direct - nd0  # the CUDA calls inside the direct timing
        return (t, direct[0] - d0 - probe_s * (hook_calls[0] - h0) - counter.outside_s * nd,
                counter.n - n0, counter.t - s0, counter.t_direct - sd0)

    def block(n: int, run=step) -> list[tuple[tuple, tuple]]:
        """n pairs (A's `run`, B's `run`: a step), the order alternating."""
        gc.collect()
        out = []
        for i in range(n):
            if i % 2:
                b = run("B")
                a = run("A")
            else:
                a = run("A")
                b = run("B")
            out.append((a, b))
        return out

    def two(twin: str) -> tuple:
        """Two steps as one (their figures summed): a single sample's pair of steps."""
        x, y = step(twin), step(twin)
        return tuple(p + q for p, q in zip(x, y))

    class Alternate(Sampler):
        """Adaptive, as a job runs by default (its step end feeds the sampler), but every
        second step from `base` on a detail step: single samples between unsampled steps."""

        base = 0

        def due(self, step: int) -> bool:
            return (step - self.base) % 2 == 1

    class Never(Sampler):
        """Adaptive (the step end feeds it), no step due: the always-on tier alone."""

        def due(self, step: int) -> bool:
            Sampler.due(self, step)  # its cost, as an unsampled step of a job pays it
            return False

    def set_kind(kind: str) -> tuple[float, int]:
        """Switch A to `kind`: (the thread time and the CUDA calls of the install or removal
        it took, if any)."""
        if kind == "sampled":
            mon.sampler = Sampler("every", "bench")
        elif kind == "single":
            mon.sampler = Alternate("adaptive", "bench")
            # the next step installs at its end, the one after it is the detail step
            mon.sampler.base = mon.step_index + 1
        else:
            # adaptive, as a job runs by default (its step end feeds the sampler: one CPU
            # clock read, the position lookup), with no step of the bench sampled: setting
            # K = 2^40 no longer holds since issue 31 (before its first cost estimate the
            # sampler sets K from the floor: one detail step in the block, 1295 calls)
            mon.sampler = Never("adaptive", "bench")
        n, s = counter.n, counter.t
        t = time.thread_time()
        if kind == "sampled" and not mon._detail_on:
            mon._install_detail()
        elif kind != "sampled" and mon._detail_on:
            mon._remove_detail()
        t = time.thread_time() - t
        n = counter.n - n  # its CUDA calls: charged at 3 us each, not as Python
        return t - (counter.t - s) - counter.outside_s * n, n

    for kind in ("sampled", "single", "unsampled"):  # warm-up
        set_kind(kind)
        # single: A's step that installs at its end and its detail step, against two of B's
        block(max(4, args.steps // 4), two if kind == "single" else step)
    res: dict[str, list] = {"unsampled": [], "sampled": [], "single": []}
    install, remove = [], []
    gcw = GcWatch(counter)
    gc_unsampled = [0, 0]  # passes inside zerodoc, all passes (unsampled blocks)
    for _ in range(args.rounds):
        set_kind("unsampled")
        g0, gi0 = gcw.total, gcw.inside
        res["unsampled"].append(block(args.steps))
        gc_unsampled[0] += gcw.inside - gi0
        gc_unsampled[1] += gcw.total - g0
        install.append(set_kind("sampled"))
        res["sampled"].append(block(args.steps))
        remove.append(set_kind("single"))
        res["single"].append(block(max(4, args.steps // 2), two))
    gcw.close()
    # the witness: zerodoc's Python calls inside an unsampled step's forward and backward
    set_kind("unsampled")
    rest("A")
    inside = []
    for _ in range(5):
        inside.append(zerodoc_calls(lambda: fwd_bwd("A")))
        rest("A")
    # garbage-collector passes per step, A and B apart (unsampled steps, one twin at a time)
    gc_per_step = {}
    for twin in ("A", "B"):
        gc.collect()
        gcw = GcWatch(counter)
        for _ in range(args.steps):
            step(twin)
        gcw.close()
        gc_per_step[twin] = round(gcw.total / args.steps, 3)
    cold = step_end_cold(opt_a, direct, hook_calls, probe_s)
    mon.close()
    hp.queue_autograd_callback = real_queue

    us = 1e6
    med = statistics.median
    plain = [p[1][0] for r in res["unsampled"] + res["sampled"] for p in r]
    qs = statistics.quantiles(plain, n=10)
    out = {"units": args.units, "pairs_per_block": args.steps, "rounds": args.rounds,
           "plain_step_us": round(med(plain) * us, 1),
           "plain_step_spread_us": [round(qs[0] * us, 1), round(qs[-1] * us, 1)]}
    for kind in ("unsampled", "sampled"):
        pairs = [p for r in res[kind] for p in r]
        diffs = [a[0] - b[0] for a, b in pairs]
        lo, hi = ci95(diffs)
        rounds = [med(a[0] - b[0] for a, b in r) for r in res[kind]]
        out[f"{kind}_ab_us"] = round(med(diffs) * us, 1)
        out[f"{kind}_ab_ci95_us"] = [round(lo * us, 1), round(hi * us, 1)]
        out[f"{kind}_ab_rounds_us"] = [round(min(rounds) * us, 1), round(max(rounds) * us, 1)]
        calls = med(a[2] - b[2] for a, b in pairs)
        if kind == "unsampled":
            # measured around the only zerodoc code such a step enters, less the stand-in's
            # own time in the CUDA calls zerodoc made there (charged as 3 us a call below)
            own = [a[1] - a[4] for a, _b in pairs]
            raw = med(a[1] for a, _b in pairs)
            standin = med(a[4] for a, _b in pairs)
            py = med(own)
            # the mean keeps the rare costly steps (memory re-reads); the stand-in's time,
            # a wall clock (a preemption inside a call would inflate it), by its median
            out["unsampled_python_mean_us"] = round(
                (statistics.fmean(a[1] for a, _b in pairs) - standin) * us, 1)
            out["unsampled_python_p90_us"] = round(statistics.quantiles(own, n=10)[-1] * us, 1)
        else:  # A - B (the hooks are spread over forward and backward)
            own = [(a[0] - a[3]) - (b[0] - b[3]) - counter.outside_s * (a[2] - b[2])
                   for a, b in pairs]
            raw = med(diffs)
            standin = med(a[3] - b[3] for a, b in pairs)
            py = med(own)
            lo, hi = ci95(own)
            out["sampled_python_ci95_us"] = [round(lo * us, 1), round(hi * us, 1)]
        out[f"{kind}_python_raw_us"] = round(raw * us, 1)
        out[f"{kind}_standin_us"] = round(standin * us, 1)
        out[f"{kind}_python_us"] = round(py * us, 1)
        out[f"{kind}_cuda_calls"] = calls
        out[f"{kind}_cost_us"] = round(py * us + US_PER_CUDA_CALL * calls, 1)
    n_unsampled = args.rounds * args.steps
    out["step_end_us"] = cold
    out["timing_probe_us"] = round(probe_s * us, 2)
    out["counting_us_per_cuda_call"] = round(counter.outside_s * us, 3)
    out["unsampled_zerodoc_calls_in_forward_backward"] = max(inside)
    out["unsampled_gc_passes_in_zerodoc_per_step"] = round(gc_unsampled[0] / n_unsampled, 3)
    out["gc_passes_per_step"] = gc_per_step
    out["install_us"] = round(med(t for t, _n in install) * us, 1)
    out["remove_us"] = round(med(t for t, _n in remove) * us, 1)
    out["install_cuda_calls"] = med(n for _t, n in install)
    out["remove_cuda_calls"] = med(n for _t, n in remove)
    # one sample as the sampler sees it: A's two steps (the install at the first one's end,
    # the detail step, its removal) less B's two, less the unsampled step's own cost
    pairs = [p for r in res["single"] for p in r]
    diffs = [a[0] - b[0] for a, b in pairs]
    own = [(a[0] - a[3]) - (b[0] - b[3]) - counter.outside_s * (a[2] - b[2])
           for a, b in pairs]
    base_us = out["unsampled_python_us"]
    lo, hi = ci95(diffs)
    rounds = [med(a[0] - b[0] for a, b in r) for r in res["single"]]
    out["per_sample_ab_us"] = round(med(diffs) * us, 1)
    out["per_sample_ab_ci95_us"] = [round(lo * us, 1), round(hi * us, 1)]
    out["per_sample_ab_rounds_us"] = [round(min(rounds) * us, 1), round(max(rounds) * us, 1)]
    lo, hi = ci95(own)
    out["per_sample_python_ci95_us"] = [round(lo * us - base_us, 1), round(hi * us - base_us, 1)]
    out["per_sample_python_us"] = round(med(own) * us - base_us, 1)
    out["per_sample_cuda_calls"] = med(a[2] - b[2] for a, b in pairs) - \
        out["unsampled_cuda_calls"]
    out["per_sample_cost_us"] = round(out["per_sample_python_us"] + US_PER_CUDA_CALL *
                                      out["per_sample_cuda_calls"], 1)
    out["per_sample_sum_us"] = round(
        out["install_us"] + out["sampled_cost_us"] + out["remove_us"] + US_PER_CUDA_CALL *
        (out["install_cuda_calls"] + out["remove_cuda_calls"]), 1)
    target = TARGETS.get(args.units)
    if target:
        out["unsampled_target_us"], out["sampled_target_us"] = target
        out["unsampled_ok"] = out["unsampled_cost_us"] <= target[0]
        out["sampled_ok"] = out["sampled_cost_us"] <= target[1]
        out["per_sample_ok"] = out["per_sample_cost_us"] <= target[1]
    out["note"] = ("thread CPU time on this machine; per step cost = Python us + 3 us per "
                   "CUDA call; unsampled_python_us: inside zerodoc's code, sampled: A - B; "
                   "both less the stand-in's time in zerodoc's CUDA calls; *_ab_us: median "
                   "of A - B over interleaved pairs, ci95 its interval; per_sample: install "
                   "+ detail step + removal on single samples between unsampled steps")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
