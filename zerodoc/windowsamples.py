"""Per-unit numbers from sampled steps: how many there are, and what a front end says.

The shim records step-level numbers on every step and the full per-unit detail on sampled
steps only (about 1 in K; the run log's ``"detail": false`` steps have none). A window of
steps then carries per-unit totals over its sampled steps (`RankWindow.detail_steps`), and
every per-unit mean is those totals / ``detail_steps``, never / ``steps``. This module is the
one place that says how many samples are enough, for a window and for each family of rules,
and how that is worded (report, TUI, compare). Plain Python.
"""

from __future__ import annotations

from .runmodel import RankWindow, RunSnapshot

# A window with unsampled steps and fewer sampled steps than this inside it takes its
# per-unit figures from the newest this many samples (the ones before the window too), and
# says so.
MIN_WINDOW_SAMPLES = 3

# Sampled steps (on every active rank) a rule family needs before its rules run. "per-unit":
# rules that read per-unit or per-step compute / communication (one sample gives a whole
# step's per-unit picture); "cross-rank": rules that compare ranks' per-unit numbers, where
# one sample's noise would name a straggler.
MIN_SAMPLES = {"per-unit": 1, "cross-rank": MIN_WINDOW_SAMPLES}

# Rule code -> family (rules not listed read step-level numbers or static facts only and
# run on every step: memory, optimizer, a stopped rank).
RULE_FAMILY = {
    "ZD001": "per-unit", "ZD002": "per-unit", "ZD003": "per-unit", "ZD004": "per-unit",
    "ZD005": "per-unit", "ZD006": "per-unit", "ZD009": "per-unit", "ZD014": "per-unit",
    "ZD010": "cross-rank",
}


def samples(snap: RunSnapshot, ranks=None) -> int:
    """The fewest per-unit samples any of these ranks (default: all) has."""
    ws = [snap.ranks[r] for r in (snap.ranks if ranks is None else ranks) if r in snap.ranks]
    ws = [w for w in ws if w.steps]
    return min((w.per_unit_steps for w in ws), default=0)


def sampled(snap: RunSnapshot) -> bool:
    """Some rank's per-unit numbers come from other steps than its step-level numbers."""
    return any(w.sampled for w in snap.ranks.values() if w.steps)


def every(snap: RunSnapshot) -> int | None:
    """K in force (about 1 step in K is sampled), from the newest sample or the run header."""
    ks = [w.detail_every for w in snap.ranks.values() if w.detail_every]
    if ks:
        return max(ks)
    for w in snap.ranks.values():
        cfg = w.facts.config if isinstance(w.facts.config, dict) else {}
        s = cfg.get("sampling")
        if isinstance(s, dict):
            if s.get("mode") == "every":
                return 1
            if isinstance(s.get("every"), int) and s["every"] > 0:
                return s["every"]
    return None


def coverage(w: RankWindow) -> str:
    """'per-unit: 12 sampled steps of 600' (or of the 3 newest samples before the window)."""
    n = w.per_unit_steps
    if not w.sampled:
        return f"per-unit: every step of {w.steps}"
    if n == 0:
        return f"per-unit: no sampled step yet in {w.steps} steps"
    if n > w.steps or w.window_samples is not None:
        # a run log read at scale: per-unit numbers of its newest interval lines
        return (f"per-unit: {n} steps with per-unit detail in the newest run-log intervals "
                f"(the window: {w.steps} steps)")
    noun = "sampled step" if n == 1 else "sampled steps"
    if w.detail_before:
        inside = n - w.detail_before
        return (f"per-unit: the newest {n} {noun} (up to step {w.detail_last_step}; "
                f"{inside} inside the window of {w.steps})")
    return f"per-unit: {n} {noun} of {w.steps}"


def warmup_text(left_out: int | None, kept: bool, short: bool = False) -> str | None:
    """What a window did with the warm-up step, as the report (and, `short`, the TUI's
    captions) say it. None: the window does not reach step 1, or --include-warmup keeps it
    as asked."""
    if kept:
        return "with warm-up" if short else (
            "warm-up step 1 kept in the per-unit numbers: the run log's per-unit lines cover it "
            "with later steps")
    if left_out:
        return "no warm-up" if short else \
            f"warm-up step {left_out} left out, --include-warmup keeps it"
    return None


def run_warmup(snap: RunSnapshot, short: bool = False) -> str | None:
    """`warmup_text` of a snapshot: kept when any rank's window had to keep it."""
    ws = list(snap.ranks.values())
    return warmup_text(next((w.warmup_left_out for w in ws if w.warmup_left_out), None),
                       any(w.warmup_kept for w in ws), short)


def run_coverage(snap: RunSnapshot, ranks=None) -> str | None:
    """`coverage` of the rank with the fewest samples; None when every step has detail."""
    ws = [snap.ranks[r] for r in (snap.ranks if ranks is None else ranks) if r in snap.ranks]
    ws = [w for w in ws if w.steps]
    if not ws or not any(w.sampled for w in ws):
        return None
    return coverage(min(ws, key=lambda w: (w.per_unit_steps, -w.steps)))


def next_sample(snap: RunSnapshot) -> str:
    """When per-unit numbers are due: 'per-unit detail after the first sampled step, about
    every K steps' (K known), or a note that the run samples."""
    k = every(snap)
    last = max((w.detail_last_step for w in snap.ranks.values()), default=0)
    newest = max((w.last_step for w in snap.ranks.values()), default=0)
    if k and k > 1:
        if last:
            due = max(0, last + k - newest)
            return (f"per-unit detail about every {k} steps: next sample in about {due} "
                    f"step{'s' if due != 1 else ''}")
        return f"per-unit detail after the first sampled step, about every {k} steps"
    return "per-unit detail after the first sampled step"


def waiting(snap: RunSnapshot, ranks=None) -> dict[str, int]:
    """Rule family -> samples still missing before its rules run ({} when none waits, and
    always on a run whose every step has per-unit detail)."""
    ws = [snap.ranks[r] for r in (snap.ranks if ranks is None else ranks) if r in snap.ranks]
    if not any(w.sampled or w.per_unit_steps == 0 for w in ws if w.steps):
        return {}
    have = samples(snap, ranks)
    return {fam: need - have for fam, need in MIN_SAMPLES.items() if have < need}


def waiting_rules(snap: RunSnapshot, ranks=None) -> list[str]:
    """Codes of the rules that wait for samples, in code order."""
    fams = waiting(snap, ranks)
    return sorted(code for code, fam in RULE_FAMILY.items() if fam in fams)
