"""Wrap too fine: many tiny sharded units; the all-gathers are latency-bound.

Why: every unit is one all-gather (two under ZeRO-3) and one reduce-scatter per step. When
units are small (every Linear its own unit) each collective costs mostly its fixed latency:
thousands of small calls, low bus bandwidth, and exposure that no link upgrade fixes.

Evidence: number of units, median all-gather size, all-gathers per step, their bus bandwidth
against the large ones (or the link's), exposed time of the small ones. The title calls them
latency-bound only when the evidence shows it: their bus bandwidth below
LATENCY_BOUND_FRACTION (half) of the reference; otherwise it names the count of calls.
Fix: wrap at block granularity (`fully_shard` each block of the model's block list, named
from the run, not each Linear).
Predicted: wrapping by parent module (the unit names' parents) gives that many units; the
exposed communication and the step time after the fix come from the step model fitted to the
run (`zerodoc.whatif`, `--merge blocks`, or every K units with K the units per parent), with
their ranges. Without a model (no per-unit detail) each collective is modelled as a fixed
latency plus its bytes at the reference bus bandwidth (the large collectives', else the
link's): calls x latency + bytes / bandwidth.
"""

from __future__ import annotations

import statistics

from ..findings import Severity
from ...humanize import nbytes, rate, secs
from ...whatif import Changes
from .base import effect, finding, model_effects, r6

CODE = "ZD002"
NAME = "wrap-too-fine"
SEVERITY = Severity.WARNING
TIER = 0
EXPLAINS = ("ZD003", "ZD004", "ZD006")
# The title says "latency-bound" when the small all-gathers reach less than this share of the
# reference bus bandwidth (the large all-gathers', or the link's). Wording, not firing.
LATENCY_BOUND_FRACTION = 0.5


def _parent(name: str) -> str:
    return name.rsplit(".", 1)[0] if "." in name else "(root)"


def latency_model(views, group_size: int, ref_busbw: float) -> tuple[float, float] | None:
    """(latency per call, bandwidth part per step) fitted to the measured time of `views`:
    time = calls x latency + bytes x (n-1)/n / busbw (all-gather / reduce-scatter)."""
    calls = sum(v.count for v in views)
    if not calls or ref_busbw <= 0 or group_size < 2:
        return None
    seconds = sum(v.seconds for v in views)
    bw_part = sum(v.bytes for v in views) * (group_size - 1) / group_size / ref_busbw
    return max(0.0, (seconds - bw_part) / calls), min(bw_part, seconds)


def evaluate(ctx) -> list:
    if not ctx.gathers_per_unit:
        return []  # nothing is gathered per unit: wrapping is moot
    t = ctx.t
    units = [u for u in ctx.units if u.params > 0]
    if len(units) < t.wrap_fine_min_units or ctx.group_size < 2:
        return []
    ag = ctx.views("all_gather")
    sizes = [v.bytes_per_call for v in ag if v.count] or [u.gather_bytes for u in units]
    median = statistics.median(sizes)
    if median >= t.wrap_fine_median_bytes:
        return []
    small = [v for v in ag if v.bytes_per_call < t.wrap_fine_median_bytes]
    large = [v for v in ag if v.bytes_per_call >= t.wrap_fine_median_bytes]
    calls = sum(v.count for v in ag)

    def agg_bw(vs):
        s = sum(v.seconds for v in vs)
        return sum(v.bytes for v in vs) / s * (ctx.group_size - 1) / ctx.group_size if s else 0.0

    small_bw = agg_bw(small)
    ref_bw = agg_bw(large) if large else (ctx.link_busbw or 0.0)
    exposed = sum(v.exposed_seconds for v in small)
    cost = sum(v.avoidable_seconds for v in small) + sum(
        v.avoidable_seconds for v in ctx.views("reduce_scatter")
        if v.bytes_per_call < t.wrap_fine_median_bytes)
    parents = {_parent(u.name) for u in units}
    per_parent = sum(u.gather_bytes for u in units) / max(1, len(parents))
    evidence = {"units": len(units), "median_all_gather_bytes": int(median),
                "all_gathers_per_step": r6(calls),
                "small_all_gather_busbw_bytes_per_second": r6(small_bw),
                "reference_busbw_bytes_per_second": r6(ref_bw),
                "small_all_gather_exposed_seconds_per_step": r6(exposed)}
    # "Latency-bound" is a claim about the evidence: the small all-gathers reach only a
    # fraction of the bandwidth the large ones (or the link) reach.
    latency_bound = ref_bw > 0 and small_bw < LATENCY_BOUND_FRACTION * ref_bw
    if ref_bw > 0:
        evidence["small_to_reference_busbw_ratio"] = r6(small_bw / ref_bw)
    if latency_bound:
        why = f"latency-bound ({rate(small_bw)} bus bandwidth vs {rate(ref_bw)})"
    else:
        why = f"{calls:.0f} all-gathers per step, each paying its fixed per-call cost"
    if ctx.step_seconds:
        evidence["small_all_gather_exposed_fraction"] = r6(exposed / ctx.step_seconds)
    keep = len(parents) / len(units)  # share of the calls left after wrapping by parent
    # The step model (zerodoc.whatif): the units merged per block (or every K, K the units
    # per parent module), compute summed, one call of the summed bytes priced by the link fit.
    k = max(2, round(len(units) / max(1, len(parents))))
    change = Changes(merge="blocks" if ctx.block_container is not None else k)
    effects, timing = model_effects(ctx, change)
    whatif = {"whatif": timing} if timing else {}
    if timing is None:  # no model: the per-rule latency fit (calls x latency + bytes / bw)
        timing = ""
        saved_exposed = 0.0
        for coll in ("all_gather", "reduce_scatter"):
            views = [v for v in ctx.views(coll) if v.count]
            fit = latency_model(views, ctx.group_size, ref_bw)
            if fit is None:
                continue
            lat, bw_part = fit
            now = sum(v.seconds for v in views)
            after = sum(v.count for v in views) * keep * lat + bw_part
            ratio = sum(v.exposed_seconds for v in views) / now if now else 0.0
            saved_exposed += max(0.0, now - after) * ratio
            effects.append(effect(ctx, f"{coll}_seconds_per_step", "down", after))
            if coll == "all_gather":
                evidence["all_gather_latency_seconds"] = r6(lat)
                timing = f"; all-gather time {secs(now)} -> about {secs(after)} per step"
        ex_now = sum(v.exposed_seconds for v in ctx.views() if v.count)
        effects.append(effect(ctx, "exposed_comm_seconds_per_step", "down",
                              ex_now - saved_exposed))
    else:
        timing = f"; {timing}"
    effects += [effect(ctx, "all_gathers_per_step", "down", calls * keep),
                effect(ctx, "median_all_gather_bytes", "up", per_parent)]
    return [finding(
        CODE, NAME, SEVERITY,
        f"{len(units)} sharded units with a median all-gather of {nbytes(median)}: {why}",
        evidence=evidence,
        threshold={"wrap_fine_min_units": t.wrap_fine_min_units,
                   "wrap_fine_median_bytes": t.wrap_fine_median_bytes},
        fix=(f"Wrap at block granularity: `for block in {ctx.blocks_expr()}: "
             "fully_shard(block)`, then `fully_shard(model)`, instead of every Linear; a "
             "block's layers are then gathered in one collective."),
        predicted=(f"wrapping by parent module: {len(units)} -> {len(parents)} units, "
                   f"about {nbytes(per_parent)} per all-gather instead of {nbytes(median)}, "
                   f"{calls:.0f} -> about {calls * keep:.0f} all-gathers per step{timing}"),
        effects=effects, units=tuple(u.name for u in units[:8]), cost_seconds_per_step=cost,
        **whatif)]


def applied(before: dict, after: dict) -> str | None:
    """The fix shows as fewer, larger units."""
    bu, au = before.get("units"), after.get("units")
    bm, am = before.get("median_unit_params"), after.get("median_unit_params")
    if bu and au and au < bu and bm and am and am > bm:
        return f"units {bu} -> {au}, median unit {bm:,} -> {am:,} parameters"
    return None
