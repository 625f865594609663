"""The diagnosis facade: `diagnose(snapshot)` -> findings, most severe / most costly first.

    from zerodoc.diagnosis import diagnose, RULES
    from zerodoc.sources import open_source

    findings = diagnose(open_source("zerodoc-runs/demo-...").snapshot())
    for f in findings:
        print(f.severity.name, f.code, f.title)

Each rule (`RULES`, one module per rule under `zerodoc/diagnosis/rules/`, documented in
docs/rules.md) reads the snapshot and returns `Finding`s carrying the evidence (base-unit
numbers), the threshold applied, a fix and, where the planner can compute it, the predicted
effect. Plain Python: no torch, no Textual.
"""

from __future__ import annotations

from ..runmodel import RunSnapshot
from ..thresholds import DEFAULT, LINK_BUSBW, Thresholds
from .context import Context, infer_link
from .findings import Finding, Severity
from .rules import BY_CODE, RULES, Rule

__all__ = ["diagnose", "waiting", "RULES", "Rule", "Finding", "Severity", "Context", "infer_link",
           "LINK_BUSBW", "BY_CODE"]


def diagnose(snapshot: RunSnapshot, thresholds: Thresholds = DEFAULT, *,
             link: str | None = None, device_memory_bytes=None,
             link_profile=None) -> list[Finding]:
    """Findings for one snapshot, sorted most severe first (then causes before symptoms,
    then the costlier first).

    Args:
        snapshot: any source's `RunSnapshot`; stale ranks are left out of the comparisons
            (unless every rank is stale).
        thresholds: the numbers the rules apply (`zerodoc.thresholds.Thresholds`).
        link: link class for the bandwidth rules (a key of `thresholds.LINK_BUSBW`);
            default: inferred from the run (gloo on CPU -> "gloo-cpu", NCCL -> "pcie" within
            a node, "ethernet" across nodes; conservative lower bounds).
        device_memory_bytes: overrides the capacity the ranks report (the memory rules and
            the planner's "fits").
        link_profile: a `zerodoc.whatif.linkprofile.LinkProfile` (`zerodoc linkprobe`): the
            rules' predicted effects price calls beyond the run's sizes with it, as
            `zerodoc whatif --link-profile` does; None: along the run's fitted line.

    Raises `UserError` for an unknown link class; a rule that fails becomes a ZD000 INFO
    finding rather than an exception. Rules that need per-unit detail wait until the
    active ranks have enough sampled steps (`zerodoc.windowsamples.MIN_SAMPLES`, `waiting`): a
    run that samples gives no per-unit findings before its first sample, never findings from
    zeros.
    """
    from ..windowsamples import waiting_rules
    from .engine import evaluate

    if not snapshot.ranks:
        return []
    ctx = Context(snapshot, thresholds, link=link, device_memory_bytes=device_memory_bytes,
                  link_profile=link_profile)
    wait = set(waiting_rules(snapshot, list(ctx.active)))
    return evaluate(ctx, [r for r in RULES if r.code not in wait] if wait else None)


def waiting(snapshot: RunSnapshot) -> dict | None:
    """What the rules wait for, or None: {"rules": [codes], "samples": sampled steps so far,
    "in_window": of them inside the window, "message": "per-unit detail after the first
    sampled step, about every K steps", "text": "not evaluated: 0 sampled steps in the
    window (2 before it: steps 2, 30); ZD010 need 3"}; the report and the TUI show it where
    findings would be, never an all-clear."""
    from ..windowsamples import in_window, next_sample, not_evaluated, samples, waiting_rules

    fresh = list(Context(snapshot).active) if snapshot.ranks else []
    if not fresh:
        return None
    codes = waiting_rules(snapshot, fresh)
    if not codes:
        return None
    return {"rules": codes, "samples": samples(snapshot, fresh),
            "in_window": min(in_window(snapshot.ranks[r]) for r in fresh),
            "message": next_sample(snapshot), "text": not_evaluated(snapshot, fresh)}
