"""The hot-path pieces of `bench/hotpath.py`, priced one by one on a monitor's real objects.

Two meters:
- `CpuMeter`: CPU nanoseconds per call (`time.thread_time_ns`, the minimum over repeats);
  a loaded machine inflates it somewhat (caches), never the way it inflates wall time.
- `InstructionMeter`: instructions per call, counted by valgrind's callgrind (the process
  runs under `valgrind --tool=callgrind --instr-atstart=no`; instrumentation is switched on
  around each loop with `callgrind_control`, and a loop of n calls is subtracted from one of
  2n, so the switching itself cancels out). Independent of the machine's load.
"""

from __future__ import annotations

import glob
import os
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

REPEATS = 7


class CpuMeter:
    unit = "ns"
    scale = 1  # small loops are enough

    def per_call(self, fn, n: int) -> float:
        best = float("inf")
        for _ in range(REPEATS):
            t0 = time.thread_time_ns()
            fn(n)
            best = min(best, time.thread_time_ns() - t0)
        return best / n


class InstructionMeter:
    unit = "instr"
    scale = 0.05  # 20x fewer calls: every one is simulated

    def __init__(self, out_file: str):
        self.out = out_file
        self.pid = str(os.getpid())

    def _ctl(self, *args: str) -> None:
        subprocess.run(["callgrind_control", *args, self.pid], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def _window(self, fn, n: int) -> int:
        """Instructions of `fn(n)` (plus the switching)."""
        before = set(glob.glob(self.out + ".*"))
        self._ctl("-z")
        self._ctl("-i", "on")
        fn(n)
        self._ctl("-i", "off")
        self._ctl("-d")
        new = sorted(set(glob.glob(self.out + ".*")) - before, key=os.path.getmtime)
        total = 0
        for line in Path(new[-1]).read_text().splitlines():
            if line.startswith(("totals:", "summary:")):
                total = max(total, int(line.split()[1]))
        return total

    def once(self, fn) -> int:
        """Instructions of one `fn()` (with the switching: ~0.1 M; compare like with like)."""
        return self._window(lambda _n: fn(), 1)

    def per_call(self, fn, n: int) -> float:
        n = max(20, int(n))
        fn(n)  # warm (first calls compile / allocate)
        return (self._window(fn, 2 * n) - self._window(fn, n)) / n


def _forward_hooks(mod) -> list:
    """zerodoc's four forward hooks on `mod`, by name."""
    want = ("outer_pre", "inner_pre", "inner_post", "outer_post")
    found = {}
    for d in (mod._forward_pre_hooks, mod._forward_hooks):
        for h in d.values():
            name = getattr(h, "__name__", "")
            if name in want and "install_forward_hooks" in getattr(h, "__qualname__", ""):
                found[name] = h
    return [found[n] for n in want]


def pieces(mon, unit_idx: int, step_state, meter) -> dict[str, float]:
    """Cost per call of each hot-path piece (unit: `meter.unit`), on the monitor's objects;
    each is the difference to the same loop calling the undecorated thing."""
    import torch
    import torch.distributed as dist
    import torch.nn as nn

    from zerodoc.shim import fsdp2 as f2
    from zerodoc.shim.recorder import B_FRAMEWORK, B_WAIT, unit_bucket

    rec, timer = mon.rec, mon.timer
    res: dict[str, float] = {}
    N = int(20000 * meter.scale)

    def cost(fn, n):
        return meter.per_call(fn, n)

    def loop_empty(n):
        for _ in range(n):
            pass
    base_loop = cost(loop_empty, N)

    # --- recorder ------------------------------------------------------------------
    def push_remove(n):
        p, r = rec.push, rec.remove
        for _ in range(n):
            p(B_WAIT)
            r(B_WAIT)
    res["recorder push+remove (pair)"] = cost(push_remove, N) - base_loop
    ub = unit_bucket(unit_idx, 0)

    def switch2(n):
        s = rec.switch
        rec.push(B_FRAMEWORK)
        for _ in range(n):
            s(B_FRAMEWORK, ub)
            s(ub, B_FRAMEWORK)
        rec.remove(B_FRAMEWORK)
    res["recorder switch"] = (cost(switch2, N) - base_loop) / 2

    # --- forward hooks of a real unit, dispatched by nn.Module ------------------------
    hooks = _forward_hooks(mon.adapter.units[unit_idx].module)

    def module_with(extra: bool):
        m = nn.Identity()
        m.register_forward_pre_hook(lambda mod, args: None)  # FSDP's hooks force the slow path
        if extra:
            m.register_forward_pre_hook(hooks[0], prepend=True)
            m.register_forward_pre_hook(hooks[1])
            m.register_forward_hook(hooks[2], prepend=True)
            m.register_forward_hook(hooks[3])
        return m
    xt = torch.zeros(1)
    mods = {k: module_with(k) for k in (False, True)}

    def fwd(k):
        def run(n):
            m = mods[k]
            for _ in range(n):
                m(xt)
        return run
    res["forward hooks, 4 per unit (in nn.Module dispatch), per unit"] = (
        cost(fwd(True), N // 2) - cost(fwd(False), N // 2))

    # --- backward wrappers (the real wrapper code around a no-op param group) -----------
    def noop(*a, **k):
        return None
    g = SimpleNamespace(pre_backward=noop, post_backward=noop)
    from zerodoc.shim.detailplan import DetailPlan
    plan = DetailPlan(rec, timer)
    f2._wrap_backward(g, unit_idx, rec, timer, mon.registry, plan, [None], None)
    plan.install()

    def bwd(n):
        pre, post = g.pre_backward, g.post_backward
        for _ in range(n):
            pre()
            post()

    def bwd0(n):
        for _ in range(n):
            noop()
            noop()
    res["backward wrappers pre+post, per unit"] = cost(bwd, N) - cost(bwd0, N)

    # --- collectives: the comm wrapper + host timer around a no-op collective -------
    AG, _RS = f2._comm_classes()
    u = mon.adapter.units[unit_idx]
    out_t = torch.empty(max(1, u.facts.gather_bytes // 4))
    in_t = torch.empty(max(1, u.facts.sharded_bytes // 4))
    group = dist.group.WORLD

    def done_work():
        fut = torch.futures.Future()
        fut.set_result(None)
        return torch._C._distributed_c10d._create_work_from_future(fut)

    def sync_comm(output_tensor, input_tensor, group, async_op=False):
        return None

    def async_comm(output_tensor, input_tensor, group, async_op=False):
        return done_work()
    ag_sync = AG(sync_comm, timer, unit_idx)
    ag_async = AG(async_comm, timer, unit_idx)

    def coll(fn, is_async: bool):
        def run(n):
            for _ in range(n):
                w = fn(out_t, in_t, group, async_op=is_async)
                if is_async:
                    w.wait()
        return run
    n = N // 4
    res["collective, blocking (wrapper + timer)"] = (
        cost(coll(ag_sync, False), n) - cost(coll(sync_comm, False), n))
    res["collective, async (wrapper + TimedWork + callback + wait)"] = (
        cost(coll(ag_async, True), n) - cost(coll(async_comm, True), n))

    # --- optimizer hooks and step end with a step's accumulators -----------------------
    acc0, comm0 = step_state
    opt = mon.optimizer

    def restore():
        rec.acc = list(acc0)
        rec.comm = {k: list(v) for k, v in comm0.items()}
        rec.stack = [0]

    def restore_only(n):
        for _ in range(n):
            restore()

    def end_step(n):
        pre, post = mon._opt_pre, mon._opt_post
        for _ in range(n):
            restore()
            pre(opt, (), {})
            post(opt, (), {})
    m = max(20, int(500 * meter.scale * 4))
    restore_cost = cost(restore_only, m)
    res["optimizer pre/post hooks + step end (per step)"] = cost(end_step, m) - restore_cost

    def fold_only(n):
        for _ in range(n):
            restore()
            mon._fold(rec.acc, rec.comm, None)
    res["  of which: fold into totals"] = cost(fold_only, m) - restore_cost

    def memory_only(n):
        for _ in range(n):
            mon._memory(time.perf_counter())
    res["  of which: memory (amortised walk)"] = cost(memory_only, m)
    if mon._writer is not None:
        restore()
        rows = mon._fold(rec.acc, rec.comm, None)
        line = {"type": "step", "step": 1, "compute": rows[0], "comm": rows[1],
                "mem": mon._memory(time.perf_counter())}

        def write_only(n):
            for _ in range(n):
                mon._writer.write(line)
        res["  of which: run-log record write (scalelog's part)"] = cost(write_only, m)
    rec.drain(time.perf_counter())
    return res


def page_cost(mon, meter) -> dict:
    """Cost of one /metrics page: the collector's families, and the whole page as the HTTP
    handler makes it for Prometheus (OpenMetrics, gzip)."""
    from prometheus_client import CollectorRegistry

    from zerodoc.exporter.prometheus import ZerodocCollector

    coll = ZerodocCollector(mon)
    reg = CollectorRegistry(auto_describe=False)
    reg.register(coll)
    bake = _baker(mon, reg)

    def families(n):
        for _ in range(n):
            list(coll.collect())

    def fresh_page(n):  # after a step end: the totals changed
        for _ in range(n):
            _touch(mon)
            bake()

    def same_page(n):  # between step ends
        for _ in range(n):
            bake()
    body = _text(reg)
    samples = sum(1 for ln in body.splitlines() if ln and not ln.startswith(b"#"))
    k = max(3, int(20 * meter.scale * 4))
    touch = meter.per_call(lambda n: [_touch(mon) for _ in range(n)], k)
    return {"unit": meter.unit, "families": meter.per_call(families, k),
            "page_new_step": meter.per_call(fresh_page, k) - touch,
            "page_same_step": meter.per_call(same_page, k),
            "samples": samples, "bytes": len(body)}


PROMETHEUS_ACCEPT = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
                     "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1")


def _baker(mon, reg):
    """What the /metrics handler runs per request for a Prometheus scrape."""
    try:
        from zerodoc.exporter.page import Page
    except ImportError:  # before the page cache: prometheus_client's own handler code
        from prometheus_client.exposition import _bake_output

        return lambda: _bake_output(reg, PROMETHEUS_ACCEPT, "gzip", {}, False)
    page = Page(reg)
    return lambda: page.bake(PROMETHEUS_ACCEPT, "gzip")


def _text(reg) -> bytes:
    from prometheus_client.exposition import generate_latest

    return generate_latest(reg)


def _touch(mon) -> None:
    """What a step end does to the totals the page shows (a new fold)."""
    tot = mon.totals
    for t in tot.comm.values():
        t.seconds += 1e-6
    tot.steps += 1
    if hasattr(mon, "_folds"):
        mon._folds += 1
