"""Low headroom / OOM risk: peak memory close to the device's capacity.

Why: headroom (capacity - peak reserved) is what an operator watches, not "it fits": an
allocation spike (a longer batch, a fragmentation hiccup) turns a run near capacity into an
OOM, and allocation retries mean the allocator is already flushing its cache to survive.

Evidence: per rank capacity, peak, headroom fraction (the worst rank), allocation retries and
OOMs when the GPU allocator reports them (memory `alloc_retries`, `ooms` / `ooms_observed`).
Fix: more sharding (a higher stage or more ranks), activation checkpointing, a smaller
micro-batch; `zerodoc plan` shows what each stage needs.
"""

from __future__ import annotations

from ..findings import Severity
from ...humanize import nbytes, pct
from .base import effect, finding, r6

CODE = "ZD007"
NAME = "low-headroom"
SEVERITY = Severity.WARNING
TIER = 1
EXPLAINS = ()


def evaluate(ctx) -> list:
    t = ctx.t
    rows = []
    for r, w in ctx.ranks.items():
        cap, peak = ctx.capacity(w), ctx.peak(w)
        retries = int(w.memory.get("alloc_retries", 0))
        ooms = int(max(w.memory.get("ooms", 0), w.memory.get("ooms_observed", 0),
                       w.memory.get("num_ooms", 0)))
        if not cap or peak is None:
            if retries or ooms:
                rows.append((r, None, None, None, retries, ooms))
            continue
        rows.append((r, cap, peak, (cap - peak) / cap, retries, ooms))
    if not rows:
        return []
    known = [x for x in rows if x[3] is not None]
    worst = min(known, key=lambda x: (x[3], -x[4] - x[5])) if known else rows[0]
    retries = max(x[4] for x in rows)
    ooms = max(x[5] for x in rows)
    frac = worst[3]
    severity = None
    if frac is not None and frac < t.headroom_fraction_crit or ooms:
        severity = Severity.ERROR
    elif frac is not None and frac < t.headroom_fraction_warn or retries:
        severity = Severity.WARNING
    if severity is None:
        return []
    r, cap, peak = worst[0], worst[1], worst[2]
    bits = []
    if frac is not None:
        bits.append(f"rank {r} peaks at {nbytes(peak)} of {nbytes(cap)} ({pct(frac)} free)")
    if retries:
        bits.append(f"{retries} allocation retries")
    if ooms:
        bits.append(f"{ooms} OOMs")
    low = [x[0] for x in rows if (x[3] is not None and x[3] < t.headroom_fraction_warn)
           or x[4] or x[5]]
    predicted, effects = None, ()
    if cap and peak is not None and peak > (1 - t.headroom_fraction_warn) * cap:
        need = peak - (1 - t.headroom_fraction_warn) * cap
        predicted = (f"{nbytes(need)} must come off rank {r}'s peak for "
                     f"{pct(t.headroom_fraction_warn)} headroom")
        effects = (effect(ctx, "min_headroom_fraction", "up", t.headroom_fraction_warn),
                   effect(ctx, "peak_memory_bytes", "down", peak - need))
        inp = ctx.plan_input()
        if inp is not None and ctx.stage != "zero3" and ctx.group_size > 1:
            from ...planner import plan

            pl = plan(inp)
            freed = pl.stage(ctx.stage).total_bytes - pl.stage("zero3").total_bytes
            predicted += f"; ZeRO-3 would free about {nbytes(freed)} (planner)"
    return [finding(
        CODE, NAME, severity, "memory headroom low: " + ", ".join(bits),
        evidence={"rank": r, "capacity_bytes": cap, "peak_bytes": peak,
                  "headroom_fraction": r6(frac) if frac is not None else None,
                  "alloc_retries": retries, "ooms": ooms},
        threshold={"headroom_fraction_warn": t.headroom_fraction_warn,
                   "headroom_fraction_crit": t.headroom_fraction_crit},
        fix=("Lower the peak: shard more (a higher stage, more ranks), activation "
             "checkpointing, a smaller micro-batch; look at fragmentation (ZD012) first if "
             "reserved is far above allocated. `zerodoc plan` shows each stage's memory."),
        predicted=predicted, ranks=low, effects=effects)]


def applied(before: dict, after: dict) -> str | None:
    """More sharding shows in the facts (a higher stage, more ranks); activation
    checkpointing or a smaller micro-batch do not (declare them with --applied)."""
    order = {"dp": 0, "zero1": 1, "zero2": 2, "zero3": 3}
    if order.get(after.get("stage"), 0) > order.get(before.get("stage"), 0):
        return f"stage {before.get('stage')} -> {after.get('stage')}"
    if (after.get("world_size") or 0) > (before.get("world_size") or 0):
        return f"world size {before.get('world_size')} -> {after.get('world_size')}"
    return None
