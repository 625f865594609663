"""Wrap too coarse: one sharded unit holds most of the parameters.

Why: ZeRO-3 gathers a whole unit before computing it, so a unit holding most of the model is
gathered whole: the per-rank peak is close to the unsharded model and sharding saves little.
Its all-gather also has nothing to hide behind (no earlier unit's compute to overlap with).
Often the root: `fully_shard(model)` without wrapping the blocks first.

Evidence: the largest unit's parameters and share of all parameters, its gathered bytes, the
number of units, its exposed all-gather time per step.
Fix: `fully_shard` each transformer block first, then the root.
"""

from __future__ import annotations

from ..findings import Severity
from ...humanize import nbytes, pct
from .base import effect, finding, r6

CODE = "ZD001"
NAME = "wrap-too-coarse"
SEVERITY = Severity.WARNING
TIER = 0
EXPLAINS = ("ZD003", "ZD004", "ZD006", "ZD007")


def evaluate(ctx) -> list:
    if not ctx.gathers_per_unit:
        return []  # nothing is gathered per unit: wrapping is moot
    big, total = ctx.largest_unit, ctx.total_params
    if big is None or total <= 0 or ctx.group_size < 2:
        return []
    share = big.params / total
    limit = ctx.t.wrap_coarse_param_fraction
    if share < limit:
        return []
    ag = [v for v in ctx.views("all_gather") if v.unit == big.name]
    exposed = sum(v.exposed_seconds for v in ag)
    cost = sum(v.avoidable_seconds for v in ag)
    name = big.name or "(root)"
    predicted = None
    inp = ctx.plan_input()
    if inp is not None:
        from ...planner import plan

        z3 = ctx.stage == "zero3"
        st = plan(inp).stage("zero3" if z3 else "zero2")
        gathered = st.transient_bytes if z3 and st.transient_bytes else big.gather_bytes
        how = "x2 with prefetch" if z3 else "kept from forward to backward"
        predicted = (f"now each rank holds {nbytes(st.model_states_bytes)} of {st.label} "
                     f"model state plus {nbytes(gathered)} of gathered parameters ({name} "
                     f"whole, {how}); wrapped per block, the gathered part shrinks to about "
                     f"two blocks")
    return [finding(
        CODE, NAME, SEVERITY,
        f"{name} holds {pct(share)} of the parameters: sharding saves little memory and its "
        f"all-gather ({nbytes(big.gather_bytes)}) cannot overlap",
        evidence={"unit": name, "unit_params": big.params, "total_params": total,
                  "param_fraction": r6(share), "unit_gather_bytes": big.gather_bytes,
                  "units": len(ctx.units), "exposed_seconds_per_step": r6(exposed)},
        threshold={"wrap_coarse_param_fraction": limit},
        fix=(f"Shard per block, then the root: `for block in {ctx.blocks_expr()}: "
             "fully_shard(block)` followed by `fully_shard(model)`; each block becomes its own "
             "all-gather, prefetched behind the previous block's compute."),
        predicted=predicted, units=(name,), cost_seconds_per_step=cost,
        effects=(effect(ctx, "largest_unit_param_fraction", "down"),
                 effect(ctx, "largest_unit_gather_bytes", "down"),
                 # more, smaller units: the direction `compare` judges these by
                 effect(ctx, "units", "up"),
                 effect(ctx, "median_all_gather_bytes", "down"),
                 effect(ctx, "peak_memory_bytes", "down")))]


def applied(before: dict, after: dict) -> str | None:
    """The fix shows as more units with a smaller largest one (observables.config_facts)."""
    b, a = before.get("largest_unit_param_fraction"), after.get("largest_unit_param_fraction")
    if b is not None and a is not None and a < b and after.get("units", 0) > before.get("units", 0):
        return (f"units {before['units']} -> {after['units']}, largest unit holds "
                f"{pct(b)} -> {pct(a)} of the parameters")
    return None
