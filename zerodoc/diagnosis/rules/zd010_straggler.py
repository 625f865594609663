"""Straggler: one rank computes much slower than the others, and they all wait for it.

Why: data-parallel ranks meet at every collective, so the slowest rank sets the step time.
The others spend the difference waiting inside collectives, which looks like exposed
communication on them; it is the straggler's fault, not the link's (the link and exposure
rules read the rank that waited least for exactly this reason).

Evidence: compute per step of every rank, the worst rank's ratio to the median of the others,
the peer wait it causes (the others' exposed time minus its own, per step).
Severity: WARNING when the ratio passes straggler_ratio_warn and the peer wait is at least
exposed_fraction_warn of the step; INFO when the others do not measurably wait (a slower
rank whose time is hidden costs nothing yet).
Fix: find what differs on that rank: input imbalance (variable sequence lengths), thermal or
power throttling, a noisy neighbour on its CPU cores, a degraded link on its node.
"""

from __future__ import annotations

import bisect
import statistics

from ..findings import Severity
from ...humanize import secs
from .base import effect, finding, r6

CODE = "ZD010"
NAME = "straggler"
SEVERITY = Severity.WARNING
TIER = 0
EXPLAINS = ()  # exposure rules already read the rank that waited least


def evaluate(ctx) -> list:
    t = ctx.t
    ranks = {r: w for r, w in ctx.active.items() if w.compute_seconds > 0}
    if len(ranks) < 2:
        return []
    comp = {r: w.compute_seconds / w.steps for r, w in ranks.items()}
    exp = {r: w.exposed_seconds / w.steps for r, w in ranks.items()}
    step = {r: w.mean_step_seconds for r, w in ranks.items()}

    ordered = sorted(comp.values())

    def ratio(r):
        # the median of the others: the sorted values without one copy of this rank's (a
        # sort once, not one per rank: a thousand ranks)
        i = bisect.bisect_left(ordered, comp[r])
        n = len(ordered) - 1

        def at(k: int) -> float:
            return ordered[k] if k < i else ordered[k + 1]

        m = at(n // 2) if n % 2 else (at(n // 2 - 1) + at(n // 2)) / 2
        return comp[r] / m if m > 0 else 0.0

    worst = max(comp, key=ratio)
    q = ratio(worst)
    if q < t.straggler_ratio_warn:
        return []
    others = [k for k in ranks if k != worst]
    wait = statistics.median(max(0.0, exp[k] - exp[worst]) for k in others)
    step_s = ctx.step_seconds
    severity = Severity.WARNING if step_s and wait / step_s >= t.exposed_fraction_warn \
        else Severity.INFO
    return [finding(
        CODE, NAME, severity,
        f"rank {worst} computes {q:.2f}x slower than the others; they wait {secs(wait)} per "
        f"step for it (not the link's fault)",
        evidence={"rank": worst, "compute_ratio": r6(q),
                  "compute_seconds_per_step": {str(r): r6(c) for r, c in comp.items()},
                  "step_seconds": {str(r): r6(s) for r, s in step.items()},
                  "peer_wait_seconds_per_step": r6(wait),
                  "peer_wait_fraction": r6(wait / step_s) if step_s else 0.0},
        threshold={"straggler_ratio_warn": t.straggler_ratio_warn,
                   "exposed_fraction_warn": t.exposed_fraction_warn},
        fix=(f"Compare rank {worst} with the others: input imbalance (sequence lengths, "
             "a slow data loader worker), thermal / power throttling (`nvidia-smi -q -d "
             "PERFORMANCE`), other processes on its cores or GPU, a degraded link on its node."),
        predicted=f"at the others' speed every rank gets back about {secs(wait)} per step",
        ranks=(worst,), cost_seconds_per_step=wait,
        effects=(effect(ctx, "peer_wait_seconds_per_step", "down", 0.0),
                 effect(ctx, "step_seconds", "down", step_s - wait)))]


def applied(before: dict, after: dict) -> str | None:
    """What makes one rank slow (inputs, throttling, neighbours) is not a configuration fact:
    declare the fix with `zerodoc compare --applied ZD010`."""
    return None
