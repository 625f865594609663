"""Over-staging: ZeRO-3 while ZeRO-2 would fit with headroom, and the all-gathers cost time.

Why: ZeRO-3 shards the parameters too, which costs a second all-gather per unit in backward
(3Ψ of traffic per step instead of 2Ψ). That buys memory; when ZeRO-2 already fits with room
to spare, the memory is not needed and the extra all-gathers are pure cost.

Evidence: the stage, the planner's ZeRO-2 memory and the headroom it would leave (measured
peak + the planner's state difference), the all-gathers' avoidable exposed fraction of the
step, the backward all-gathers' bytes and exposed time (what ZeRO-2 would save).
Only fires when the run really gathers parameters again in backward: a run whose measured
backward all-gathers are zero (a root-only FSDP2 wrap: FSDP2 never reshards the root) is
already ZeRO-2-like, whatever a unit's recorded setting says.
Severity: WARNING when communication costs avoidable time: the all-gathers' avoidable
exposed fraction of the step >= exposed_fraction_warn, or avoidable exposed communication /
compute >= comm_compute_ratio_warn (docs/rules.md, "avoidable"); then the lower stage is the
first fix. INFO otherwise (the stage costs traffic but no measurable time), e.g. a healthy
gloo run on CPU, whose synchronous all-gathers run at the link's speed.
Predicted: no backward all-gathers; the step time and exposed communication from the step
model (`zerodoc.whatif`, reshard after forward off) with their ranges; the peak memory of
ZeRO-2 from the planner (a cost).
Fix: step down to ZeRO-2: FSDP2 `reshard_after_forward=False` (ZeRO-2-like), FSDP1
`SHARD_GRAD_OP`, DeepSpeed stage 2; the prediction also names the lowest stage that fits,
as `zerodoc plan --run` does.
"""

from __future__ import annotations

from ..findings import Severity
from ...humanize import nbytes, pct, secs
from ...whatif import Changes
from .base import effect, finding, model_effects, r6

CODE = "ZD003"
NAME = "over-staging"
SEVERITY = Severity.WARNING
TIER = 1
EXPLAINS = ("ZD004", "ZD006")


def evaluate(ctx) -> list:
    t = ctx.t
    if not ctx.zero3 or ctx.group_size < 2:
        return []
    inp = ctx.plan_input()
    if inp is None or inp.device_memory_bytes is None:
        return []
    from ...planner import plan

    p = plan(inp)
    z2, z3 = p.stage("zero2"), p.stage("zero3")
    cap = inp.device_memory_bytes
    # Measured peak + what ZeRO-2 adds in model states (activations are the same on both).
    peaks = [ctx.peak(w) for w in ctx.ranks.values()]
    peaks = [x for x in peaks if x]
    if peaks:
        z2_peak = max(peaks) + (z2.total_bytes - z3.total_bytes)
    else:
        z2_peak = z2.total_bytes
    z2_free = cap - z2_peak
    if z2_free < t.overstaging_headroom_fraction * cap:
        return []
    ag = ctx.views("all_gather")
    bwd = [v for v in ag if v.phase == "backward"]
    bwd_bytes = sum(v.bytes for v in bwd)
    if bwd_bytes <= 0:
        # Measured: nothing is gathered again in backward (already ZeRO-2-like, e.g. a
        # root-only FSDP2 wrap), or no all-gather was measured at all: nothing to say.
        return []
    step = ctx.step_seconds
    avoidable = sum(v.avoidable_seconds for v in ag)
    frac = avoidable / step if step else 0.0
    comm = sum(v.avoidable_seconds for v in ctx.views())
    ratio = comm / ctx.compute_seconds if ctx.compute_seconds else 0.0
    saving = sum(v.avoidable_seconds for v in bwd)
    costly = frac >= t.exposed_fraction_warn or ratio >= t.comm_compute_ratio_warn
    severity = Severity.WARNING if costly else Severity.INFO
    bwd_exposed = sum(v.exposed_seconds for v in bwd)
    if not costly:
        how = (f"ZeRO-2 would drop the backward all-gathers ({secs(bwd_exposed)}/step, at the "
               f"link's speed)" if bwd_exposed else "the extra all-gathers are hidden")
    elif frac >= t.exposed_fraction_warn:
        how = f"all-gathers expose {pct(frac)} of the step"
    else:
        how = f"exposed communication is {ratio:.2f}x the compute"
    # step time and exposed communication with reshard after forward off: the step model
    timed, model_text = model_effects(ctx, Changes(reshard_after_forward=False))
    if not timed:
        timed = [effect(ctx, "exposed_comm_seconds_per_step", "down",
                        sum(v.exposed_seconds for v in ctx.views() if v.count) - bwd_exposed)]
    low = p.lowest_fitting_stage
    lowest = (f"; the lowest stage that fits is {p.stage(low).label} ({p.stage(low).pytorch})"
              if low not in (None, "zero2", "zero3") else "")
    return [finding(
        CODE, NAME, severity,
        f"ZeRO-3 while ZeRO-2 fits with {pct(z2_free / cap)} free: {how}",
        evidence={"zero_stage": 3, "zero2_peak_bytes": int(z2_peak),
                  "zero2_headroom_fraction": r6(z2_free / cap), "capacity_bytes": int(cap),
                  "zero2_model_states_bytes": z2.model_states_bytes,
                  "zero3_model_states_bytes": z3.model_states_bytes,
                  "all_gather_avoidable_fraction": r6(frac),
                  "avoidable_comm_compute_ratio": r6(ratio),
                  "backward_all_gather_bytes_per_step": int(bwd_bytes),
                  "backward_all_gather_exposed_seconds_per_step": r6(bwd_exposed)},
        threshold={"overstaging_headroom_fraction": t.overstaging_headroom_fraction,
                   "exposed_fraction_warn": t.exposed_fraction_warn,
                   "comm_compute_ratio_warn": t.comm_compute_ratio_warn},
        fix=("Step down to ZeRO-2, which fits: FSDP2 `fully_shard(..., "
             "reshard_after_forward=False)` (ZeRO-2-like: parameters stay gathered from "
             "forward to backward), FSDP1 `ShardingStrategy.SHARD_GRAD_OP`, DeepSpeed "
             "`zero_optimization.stage: 2`. `zerodoc plan --run RUN_DIR` shows every stage "
             "and the lowest that fits."),
        predicted=(f"{z2.label} ({z2.pytorch}): {nbytes(z2_peak)} peak per rank, fits "
                   f"({nbytes(z2_free)} free); traffic {z3.comm_psi}Ψ -> {z2.comm_psi}Ψ per "
                   f"step: no backward all-gathers ({nbytes(bwd_bytes)}/step, "
                   f"{secs(bwd_exposed)}/step exposed now){lowest}"
                   + (f"; {model_text}" if model_text else "")),
        cost_seconds_per_step=saving, **({"whatif": model_text} if model_text else {}),
        effects=(effect(ctx, "backward_all_gather_bytes_per_step", "down", 0.0),
                 effect(ctx, "backward_all_gather_exposed_seconds_per_step", "down", 0.0),
                 *timed,
                 effect(ctx, "peak_memory_bytes", "up", z2_peak, cost=True)))]


def applied(before: dict, after: dict) -> str | None:
    """The fix shows as a lower stage: fewer units resharded after forward (FSDP2
    reshard_after_forward=False, FSDP1 SHARD_GRAD_OP, DeepSpeed stage 2)."""
    if before.get("stage") == "zero3" and after.get("stage") != "zero3":
        return f"stage {before['stage']} -> {after.get('stage')}"
    b, a = before.get("resharded_unit_fraction"), after.get("resharded_unit_fraction")
    if b and a is not None and a < b:
        return f"share of units resharded after forward {pct(b)} -> {pct(a)}"
    return None
