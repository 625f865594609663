"""Exposed all-gather: prefetch is not keeping up; compute waits for parameters.

Why: FSDP gathers the next unit's parameters while the current one computes. Whatever part of
an all-gather the compute had to wait for is exposed, and exposed time, not total collective
time, is what the step loses.

Evidence: the all-gathers' exposed fraction of the step (link-attributable: per unit and
phase the rank that waited least), the part of it the link baseline does not explain (for
synchronous collectives), the same exposed time as the per-unit table sums it (mean over
ranks; the title gives both, so finding and table add up), and the worst units and phases,
most exposed first, with their exposed / total ratio.
Severity: WARNING / ERROR on the avoidable fraction (exposed_fraction_warn / _crit). When
only the raw fraction is high (synchronous gloo all-gathers at the link's expected speed:
FSDP2's default on CPU) it is an INFO note: there is nothing for prefetch to hide behind.
Predicted: from the step model (`zerodoc.whatif`): synchronous all-gathers made asynchronous
with prefetch depth 1, or asynchronous ones prefetched one unit deeper: the step time and
exposed communication with their ranges. Per-unit `reshard_after_forward=False` on the late
blocks is beyond the model: its saving is the late units' avoidable exposed time.
Fix: FSDP2 knobs: explicit forward / backward prefetch, `reshard_after_forward=False` on the
late blocks whose backward all-gather is exposed, a lower stage (ZD003), HSDP across nodes.
"""

from __future__ import annotations

from ..findings import Severity
from ...humanize import nbytes, pct, secs
from ...whatif import Changes
from .base import effect, finding, whatif_model, grade, model_effects, r6, top

CODE = "ZD004"
NAME = "exposed-all-gather"
SEVERITY = Severity.WARNING
TIER = 2
EXPLAINS = ()


# The same advice in the knobs of the other stacks (FSDP2's is the default text).
FRAMEWORK_FIX = {
    "fsdp1": ("Prefetch: `FullyShardedDataParallel(..., forward_prefetch=True, "
              "backward_prefetch=BackwardPrefetch.BACKWARD_PRE)`; keep `limit_all_gathers=True` "
              "unless memory allows more in flight; `ShardingStrategy.SHARD_GRAD_OP` skips the "
              "backward all-gathers if it fits (ZD003); `HYBRID_SHARD` when the shard group spans "
              "nodes."),
    "deepspeed": ("Prefetch more and keep hot parameters: raise `zero_optimization."
                  "stage3_prefetch_bucket_size` and `stage3_max_reuse_distance`, set "
                  "`stage3_param_persistence_threshold` so small layers stay gathered, enable "
                  "`overlap_comm`; stage 2 if it fits (ZD003)."),
}


def evaluate(ctx) -> list:
    t = ctx.t
    step = ctx.step_seconds
    ag = [v for v in ctx.views("all_gather") if v.count]
    if not ag or step <= 0:
        return []
    exposed = sum(v.exposed_seconds for v in ag)
    avoidable = sum(v.avoidable_seconds for v in ag)
    # what the per-unit table shows (report.unit_rows: mean over ranks, summed over units)
    table = sum(st["ag_exposed_seconds"].mean for st in ctx.unit_stats.units.values()
                if st.get("ag_exposed_seconds") is not None and st["ag_exposed_seconds"].n)
    raw_frac, frac = exposed / step, avoidable / step
    severity = grade(frac, t.exposed_fraction_warn, t.exposed_fraction_crit)
    if severity is None:
        if raw_frac < t.exposed_fraction_warn:
            return []
        severity = Severity.INFO
    worst = [v for v in top(ag, key=lambda v: (v.exposed_seconds, v.avoidable_seconds))
             if v.exposed_ratio >= t.unit_exposed_ratio_warn and v.exposed_seconds > 0]
    late = [v for v in worst if v.phase == "backward"]
    late_units = {v.unit for v in late}
    late_bytes = sum(u.gather_bytes for u in ctx.units if u.name in late_units)
    evidence = {"all_gather_exposed_fraction": r6(raw_frac),
                "all_gather_avoidable_fraction": r6(frac),
                "all_gather_exposed_seconds_per_step": r6(exposed),
                "all_gather_exposed_seconds_per_step_mean_over_ranks": r6(table),
                "step_seconds": r6(step), "synchronous": ctx.sync,
                "worst": [{"unit": v.unit, "phase": v.phase,
                           "exposed_seconds_per_step": r6(v.exposed_seconds),
                           "exposed_ratio": r6(v.exposed_ratio)} for v in worst]}
    framework = ctx.facts.framework if ctx.facts is not None else "fsdp2"
    sums = (f" ({secs(exposed)}/step on the rank that waited least per unit and phase; "
            f"{secs(table)} mean over ranks, as the per-unit table sums it)")
    if ctx.sync:
        title = (f"synchronous all-gathers are {pct(raw_frac)} of the step{sums}: nothing "
                 f"overlaps"
                 + ("" if severity == Severity.INFO
                    else f"; {pct(frac)} is more than the link explains"))
        fix = ("The all-gathers run synchronously (FSDP2's default on gloo/CPU): nothing "
               "overlaps. Make unshard asynchronous (`model._set_unshard_async_op(True)`, "
               "private) and prefetch explicitly: `block.set_modules_to_forward_prefetch("
               "[next_block])`, `block.set_modules_to_backward_prefetch([prev_block])`.")
        fix = FRAMEWORK_FIX.get(framework, fix)
    else:
        title = (f"all-gathers exposed for {pct(frac)} of the step{sums}: prefetch is not "
                 f"keeping up" if severity > Severity.INFO else
                 f"all-gathers exposed for {pct(raw_frac)} of the step{sums}")
        fix = ("Prefetch earlier or deeper: `unit.set_modules_to_forward_prefetch([next, "
               "next_but_one])` and `set_modules_to_backward_prefetch([...])`; "
               "`fully_shard(block, reshard_after_forward=False)` on the late blocks whose "
               "backward all-gather is exposed (they are first in backward); a lower stage "
               "if it fits (ZD003); HSDP (shard within a node, replicate across) when the "
               "shard group spans nodes.")
        fix = FRAMEWORK_FIX.get(framework, fix)
    predicted, effects, whatif = None, (), {}
    model = whatif_model(ctx)
    if ctx.sync:
        hide = min(exposed, ctx.compute_seconds)
        # the step model: asynchronous unshard, prefetch depth 1 (docs/whatif.md)
        timed, text = model_effects(ctx, Changes(prefetch=1))
        whatif = {"whatif": text} if text else {}
        predicted = text or (f"with async unshard and prefetch, up to {secs(hide)}/step of "
                             f"all-gather time can overlap with compute")
        # an upper bound, not a value: only its direction is judged
        effects = (*timed, effect(ctx, "all_gather_exposed_seconds_per_step", "down",
                                  None if timed else exposed - hide))
    elif late:
        saved = sum(v.avoidable_seconds for v in late)
        predicted = (f"reshard_after_forward=False on {', '.join(sorted(late_units))}: "
                     f"about {secs(saved)}/step less exposed time for {nbytes(late_bytes)} "
                     f"more memory held from forward to backward")
        peak = effect(ctx, "peak_memory_bytes", "up", None, cost=True)
        effects = (effect(ctx, "all_gather_exposed_seconds_per_step", "down", exposed - saved),
                   peak and effect(ctx, "peak_memory_bytes", "up", peak.now + late_bytes,
                                   cost=True))
    if not ctx.sync and model is not None:
        # prefetching one unit deeper (the step model); per-unit resharding it cannot express
        depth = model.semantics.prefetch + 1
        timed, text = model_effects(ctx, Changes(prefetch=depth))
        if text:
            whatif = {"whatif": text}
            predicted = "; ".join(x for x in (predicted, text) if x)
            effects = (*timed, *effects)
    return [finding(
        CODE, NAME, severity, title, evidence=evidence,
        threshold={"exposed_fraction_warn": t.exposed_fraction_warn,
                   "exposed_fraction_crit": t.exposed_fraction_crit,
                   "unit_exposed_ratio_warn": t.unit_exposed_ratio_warn},
        fix=fix, predicted=predicted, units=tuple(dict.fromkeys(v.unit for v in worst)),
        cost_seconds_per_step=avoidable, effects=effects, **whatif)]


def applied(before: dict, after: dict) -> str | None:
    """The fix its prediction was made for shows: more prefetching, or asynchronous
    all-gathers where they were synchronous. Fewer units resharded after forward is ZD003's
    fix (all units) or this rule's late-block advice, which the facts cannot tell apart and
    the step model does not predict: not accepted here, so `zerodoc compare` does not judge
    a prefetch prediction against a resharding change (it says so: "not judged")."""
    for key in ("prefetch_forward", "prefetch_backward"):
        b, a = before.get(key), after.get(key)
        if b is not None and a is not None and a > b:  # unknown on a side: not a change
            return f"{key.replace('_', ' ')} {b} -> {a} units"
    if before.get("synchronous_all_gathers") and after.get("synchronous_all_gathers") is False:
        return "all-gathers synchronous -> asynchronous"
    return None
