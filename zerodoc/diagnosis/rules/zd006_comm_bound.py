"""Comm-bound: exposed communication is comparable to the compute it should hide behind.

Why: when exposed collectives take as long as the compute, the step is limited by the
network, not the accelerator; throughput scales with the link instead of the hardware.
The compute-to-exposed-communication ratio is the number to watch, not whether it fits.

Evidence: exposed communication (all collectives, link-attributable: per unit and phase the
rank that waited least, zerodoc.measures; the title says so beside the figure) per step,
compute per step, their ratio; for synchronous collectives, the part the link baseline does not explain.
Severity: WARNING / ERROR on the avoidable ratio (comm_compute_ratio_warn / _crit). With
synchronous collectives (gloo: the link explains part of the time) the raw ratio still scales
it: INFO between comm_compute_ratio_warn and _crit, WARNING at or above comm_compute_ratio_crit
(exposed communication longer than the compute: comm-bound whatever the link's share; the
slow-link rule, ZD005, says when the link is the cause). Without per-unit detail (not yet
written, or a source without it) the ranks' own totals give the raw ratio, graded the same.
Fix: more compute per byte (bigger micro-batch, longer sequences), fewer bytes (lower
stage), a faster link or HSDP.
"""

from __future__ import annotations

from ..findings import Severity
from ...humanize import secs
from .base import effect, finding, grade, r6

CODE = "ZD006"
NAME = "comm-bound"
SEVERITY = Severity.WARNING
TIER = 2
EXPLAINS = ()


def evaluate(ctx) -> list:
    t = ctx.t
    compute = ctx.compute_seconds
    views = [v for v in ctx.views() if v.count]
    if compute <= 0:
        return []
    if views:
        exposed = sum(v.exposed_seconds for v in views)
        avoidable = sum(v.avoidable_seconds for v in views)
        sync = ctx.sync
    else:  # no per-unit detail: the ranks' totals (median rank), nothing known avoidable
        exposed = ctx.median(w.exposed_seconds / w.steps for w in ctx.active.values())
        avoidable, sync = 0.0, True
    raw, ratio = exposed / compute, avoidable / compute
    severity = grade(ratio, t.comm_compute_ratio_warn, t.comm_compute_ratio_crit)
    if severity is None:
        if raw < t.comm_compute_ratio_warn:
            return []
        # synchronous: the link explains part of it, but past crit the step is comm-bound
        severity = Severity.WARNING if sync and raw >= t.comm_compute_ratio_crit \
            else Severity.INFO
    avoidable_led = ratio >= t.comm_compute_ratio_warn
    shown = ratio if avoidable_led else raw
    what = "beyond what the link explains " if sync and avoidable_led else ""
    return [finding(
        CODE, NAME, severity,
        f"exposed communication {what}is {shown:.2f}x the compute "
        f"({secs(avoidable if what else exposed)} vs {secs(compute)} per step, "
        f"{'link-attributable' if views else 'median rank'})"
        + ("" if views else "; ranks' totals: no per-unit detail yet"),
        evidence={"exposed_comm_seconds_per_step": r6(exposed),
                  "avoidable_comm_seconds_per_step": r6(avoidable),
                  "compute_seconds_per_step": r6(compute),
                  "comm_compute_ratio": r6(raw), "avoidable_comm_compute_ratio": r6(ratio),
                  "synchronous": sync, "per_unit_detail": bool(views)},
        threshold={"comm_compute_ratio_warn": t.comm_compute_ratio_warn,
                   "comm_compute_ratio_crit": t.comm_compute_ratio_crit},
        fix=("Give each byte more compute: a bigger micro-batch or longer sequences per "
             "rank (gradient accumulation keeps the global batch), fewer bytes per step "
             "(a lower ZeRO stage if it fits, ZD003), or a faster link / HSDP."),
        predicted=(f"doubling the micro-batch roughly doubles compute per step for the same "
                   f"traffic: ratio about {shown / 2:.2f}"),
        cost_seconds_per_step=avoidable,
        effects=(effect(ctx, "comm_compute_ratio", "down", raw / 2),))]


def applied(before: dict, after: dict) -> str | None:
    """The prediction is for a bigger micro-batch (compute doubled for the same traffic),
    which does not show in the facts: declare it (`zerodoc compare --applied ZD006`). A lower
    stage (ZD003's fix) or a faster path (ZD005's) is another change with its own
    prediction: not accepted here, so `zerodoc compare` does not judge this one against it."""
    return None
