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


def set_sample_steps(w: RankWindow, records) -> None:
    """Name the sampled steps a window's per-unit numbers come from (the readers call it):
    `w.sample_steps`, ((step, end_unix), ...) oldest first. Unknown (None) where a source
    has no per-step records (interval lines read at scale, Prometheus)."""
    w.sample_steps = tuple((int(s.step), float(s.end_unix)) for s in records)


def sample_steps(w: RankWindow) -> tuple | None:
    """((step, end_unix), ...) the window's per-unit numbers come from, or None: unknown."""
    return w.sample_steps


def in_window(w: RankWindow) -> int:
    """Sampled steps inside the window's own steps (not those taken from before it)."""
    if w.window_samples is not None:
        return w.window_samples
    return w.per_unit_steps - w.detail_before if w.sampled else w.steps


def step_list(steps) -> str:
    """'12, 23, 30' (a long list: its first two, '...', its last two)."""
    steps = [str(s) for s in steps]
    return ", ".join(steps if len(steps) <= 5 else steps[:2] + ["..."] + steps[-2:])


def before_text(w: RankWindow) -> str | None:
    """Where per-unit numbers come from before the window: 'from steps 12, 23, 30, all
    before the window (31-50), the newest 40 s before step 50' ('from steps 40, 50, 60;
    step 40 before the window (41-60), 12 s before step 60' when some are inside it); None:
    none do (or the steps are unknown)."""
    from .humanize import duration

    got = sample_steps(w)
    if not w.detail_before or not got:
        return None
    out = [s for s, _ in got if s < w.first_step]
    newest = max(t for s, t in got if s < w.first_step)
    age = f"{duration(max(0.0, w.updated_unix - newest))} before step {w.last_step}" \
        if w.updated_unix else f"up to step {out[-1]}"
    span = f"before the window ({w.first_step}-{w.last_step})"
    if len(out) == len(got):
        return f"from steps {step_list(out)}, all {span}, the newest {age}"
    noun = "step" if len(out) == 1 else "steps"
    return (f"from steps {step_list(s for s, _ in got)}; {noun} {step_list(out)} {span}, "
            f"{'the newest ' if len(out) > 1 else ''}{age}")


def coverage(w: RankWindow) -> str:
    """'per-unit: 12 sampled steps of 600' (or of the 3 newest samples before the window,
    with their steps and age)."""
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
        where = before_text(w) or f"up to step {w.detail_last_step}"
        return (f"per-unit: the newest {n} {noun} ({where}; "
                f"{inside} inside the window of {w.steps})")
    got = sample_steps(w)
    if got and n <= 5:
        return f"per-unit: {n} {noun} of {w.steps} (steps {step_list(s for s, _ in got)})"
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


def _windows(snap: RunSnapshot, ranks=None) -> list[RankWindow]:
    return [snap.ranks[r] for r in (snap.ranks if ranks is None else ranks)
            if r in snap.ranks and snap.ranks[r].steps]


def different_steps(snap: RunSnapshot, ranks=None) -> dict[int, tuple] | None:
    """rank -> its sampled steps, when the ranks' per-unit numbers come from different
    steps (a cross-rank comparison would compare different steps: not evaluated); None:
    the same steps on every rank, or unknown."""
    got = {}
    for r in (sorted(snap.ranks) if ranks is None else ranks):
        w = snap.ranks.get(r)
        if w is None or not w.steps or not w.sampled:
            continue
        s = sample_steps(w)
        if s is None:
            return None
        got[r] = tuple(x for x, _ in s)
    return got if len(set(got.values())) > 1 else None


def waiting(snap: RunSnapshot, ranks=None) -> dict[str, int]:
    """Rule family -> samples still missing before its rules run ({} when none waits, and
    always on a run whose every step has per-unit detail). The cross-rank family also
    waits (1 missing) while the ranks' samples are different steps: ranks are compared
    over the same steps or not at all."""
    ws = _windows(snap, ranks)
    if not any(w.sampled or w.per_unit_steps == 0 for w in ws):
        return {}
    have = samples(snap, ranks)
    out = {fam: need - have for fam, need in MIN_SAMPLES.items() if have < need}
    if "cross-rank" not in out and different_steps(snap, ranks):
        out["cross-rank"] = 1
    return out


def waiting_rules(snap: RunSnapshot, ranks=None) -> list[str]:
    """Codes of the rules that wait for samples, in code order."""
    fams = waiting(snap, ranks)
    return sorted(code for code, fam in RULE_FAMILY.items() if fam in fams)


def not_evaluated(snap: RunSnapshot, ranks=None) -> str | None:
    """Why the waiting rules did not run, as the front ends say it: 'not evaluated: 0
    sampled steps in the window (2 before it: steps 2, 30), ZD010 need 3'; None: every
    rule ran."""
    codes = waiting_rules(snap, ranks)
    if not codes:
        return None
    ws = _windows(snap, ranks)
    fams = waiting(snap, ranks)
    have = samples(snap, ranks)
    diff = different_steps(snap, ranks)
    inside = min((in_window(w) for w in ws), default=0)
    w = min(ws, key=lambda x: (x.per_unit_steps, -x.steps)) if ws else None
    got = sample_steps(w) if w is not None else None
    before = have - inside
    if before > 0 and got:
        where = f" ({before} before it: step{'s' if before != 1 else ''} " \
            f"{step_list(s for s, _ in got[:before])})"
    else:
        where = f" ({before} before it)" if before > 0 else ""
    parts = []
    for fam in ("per-unit", "cross-rank"):
        if fam not in fams:
            continue
        fc = [c for c in codes if RULE_FAMILY[c] == fam]
        need = MIN_SAMPLES[fam]
        if have >= need and diff:
            shown = "; ".join(f"rank {r}: {step_list(s) or 'none'}" for r, s in
                              list(diff.items())[:4])
            parts.append(f"{', '.join(fc)} compare ranks over the same steps, and the ranks' "
                         f"samples are different steps ({shown})")
        else:
            parts.append(f"{', '.join(fc)} need{'s' if len(fc) == 1 else ''} {need}")
    noun = "sampled step" if inside == 1 else "sampled steps"
    return f"not evaluated: {inside} {noun} in the window{where}; " + "; ".join(parts)
