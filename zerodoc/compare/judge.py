"""`zerodoc compare BEFORE AFTER`: did the fix do what was predicted?

`side()` diagnoses one run (any source `open_source()` accepts); `compare()` turns two sides
into one plain dict (the JSON document, schema 1, docs/compare.md):

- **configuration**: the facts a fix can change (`observables.config_facts`), before and
  after;
- **measurements**: every observable (`observables.OBSERVABLES`) before and after, judged
  better / worse / same against the noise floor;
- **units**: per sharded unit (matched by name) the per-step numbers of both runs;
- **fixes**: for each finding of BEFORE, whether its fix was applied (the rule's
  `applied(before, after)` over the facts, or `--applied CODE`) and, if so, each predicted
  effect (`Finding.effects`) against what AFTER shows, with a verdict;
- **findings**: resolved (gone in AFTER), new, persisting.

Verdicts (per effect; the finding's is its main effect's, docs/compare.md "Verdicts"): a
prediction with a range (the step model's, `zerodoc.whatif`) is confirmed when the observed
value falls inside it, else missed; one without a range by its size: observed change /
predicted change >= 0.75 confirmed, >= 0.25 partly, else not confirmed;
a change the other way beyond the noise floor is "made worse"; a peak-memory prediction on a
CPU run smaller than the process's memory beyond its model states (the runtime) is "cannot
judge on CPU". Measurements whose good direction depends on the fix (observable `better`
"fix": unit count, median all-gather size) are judged in the direction an applied fix
predicted. Plain Python: no torch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, fields

from ..diagnosis import BY_CODE, Context, Finding, diagnose
from ..diagnosis.findings import Predicted
from ..humanize import nbytes, value
from ..diagnosis.observables import OBSERVABLES, config_facts, observe_all
from ..runmodel import RunSnapshot
from ..report import finding_dict, per_unit_coverage, unit_rows
from ..thresholds import DEFAULT, Thresholds

SCHEMA = 1
NOISE = 0.05  # relative change below which a measurement "did not change"
CONFIRMED, PARTLY, NOT_CONFIRMED, WORSE, UNKNOWN, CANNOT_JUDGE, MISSED = (
    "confirmed", "partly", "not confirmed", "made worse", "not measurable",
    "cannot judge on CPU", "missed")
RUNTIME_DOMINATED = "process memory hides a change of this size"
CONFIRM_RATIO, PARTLY_RATIO = 0.75, 0.25
NO_FIX = {"ZD000", "ZD013"}  # rule errors and stopped runs have no fix to judge


@dataclass
class Side:
    """One run, diagnosed: what `compare()` reads."""

    source: str
    snapshot: RunSnapshot
    findings: list[Finding]
    facts: dict
    observed: dict[str, float | None]
    window: int | None = None

    @property
    def run(self) -> dict:
        w = self.snapshot.any_rank
        f = w.facts if w else None
        steps = [x.steps for x in self.snapshot.ranks.values()]
        return {"source": self.source, "run_id": f.run_id if f else None,
                "framework": f.framework if f else None,
                "world_size": f.world_size if f else None,
                "window": {"steps_requested": self.window, "steps": min(steps, default=0),
                           # how many steps the per-unit numbers come from (sampled steps)
                           "per_unit": per_unit_coverage(self.snapshot)}}


def side(snapshot: RunSnapshot, source: str, *, thresholds: Thresholds = DEFAULT,
         link: str | None = None, device_memory_bytes: int | None = None,
         window: int | None = None, link_profile=None) -> Side:
    findings = diagnose(snapshot, thresholds, link=link, device_memory_bytes=device_memory_bytes,
                        link_profile=link_profile)
    ctx = Context(snapshot, thresholds, link=link, device_memory_bytes=device_memory_bytes)
    return Side(source, snapshot, findings, config_facts(ctx), observe_all(ctx), window)


# --------------------------------------------------------------------------------------
# judging one predicted effect


def _r(x: float | None) -> float | None:
    return None if x is None else float(f"{x:.6g}")


def judge(e: Predicted, before: float | None, after: float | None,
          noise: float = NOISE) -> dict:
    """Predicted vs observed for one effect (docs/compare.md, "Verdicts")."""
    out = {**e.as_dict(), "observed_before": _r(before), "observed_after": _r(after),
           "predicted_change": None, "observed_change": None, "ratio": None}
    if before is None or after is None:
        return {**out, "verdict": UNKNOWN}
    if e.lo is not None and e.hi is not None and not e.cost:
        out["observed_change"] = _r(after - before)
        if e.value is not None:
            out["predicted_change"] = _r(e.value - (e.now if e.now is not None else before))
            if abs(out["predicted_change"]) > 1e-12:
                out["ratio"] = _r((after - before) / out["predicted_change"])
        rng = f"{value(e.metric, e.lo)}-{value(e.metric, e.hi)}"
        if e.lo <= after <= e.hi:
            return {**out, "verdict": CONFIRMED,
                    "reason": f"observed {value(e.metric, after)}, inside {rng}"}
        return {**out, "verdict": MISSED,
                "reason": f"observed {value(e.metric, after)}, predicted {rng}"}
    sign = -1.0 if e.direction == "down" else 1.0
    d_obs = after - before
    floor = noise * max(abs(before), abs(e.now or 0.0), 1e-12)
    moved = sign * d_obs  # > 0: the way the fix was predicted to move it
    out["observed_change"] = _r(d_obs)
    d_pred = None
    if e.value is not None:
        d_pred = e.value - (e.now if e.now is not None else before)
        out["predicted_change"] = _r(d_pred)
        if abs(d_pred) > 1e-12:
            out["ratio"] = _r(d_obs / d_pred)
    if e.cost:  # a price: as predicted when it is no higher than predicted (+ noise)
        limit = sign * d_pred if d_pred is not None else 0.0
        verdict = CONFIRMED if moved <= max(limit * 1.25, 0.0) + floor else WORSE
        return {**out, "verdict": verdict}
    if moved < -floor:
        verdict = WORSE
    elif moved <= floor:
        verdict = NOT_CONFIRMED
    elif out["ratio"] is None or abs(d_pred or 0.0) <= floor:
        verdict = CONFIRMED  # only the direction was predicted (or a change within noise)
    elif out["ratio"] >= CONFIRM_RATIO:
        verdict = CONFIRMED
    elif out["ratio"] >= PARTLY_RATIO:
        verdict = PARTLY
    else:
        verdict = NOT_CONFIRMED
    return {**out, "verdict": verdict}


def overall(effects: list[dict]) -> str:
    """A fix's verdict: its main effect's, lowered to "partly" when another benefit did not
    follow; "made worse" when the main effect went the wrong way; a main effect outside its
    predicted range ("missed") stays missed unless another benefit was confirmed."""
    gains = [e for e in effects if not e["cost"] and e["verdict"] not in (UNKNOWN, CANNOT_JUDGE)]
    if not gains:
        return UNKNOWN
    main, rest = gains[0]["verdict"], [e["verdict"] for e in gains[1:]]
    if main == WORSE:
        return WORSE
    if main == CONFIRMED:
        return CONFIRMED if all(v == CONFIRMED for v in rest) else PARTLY
    if main == PARTLY:
        return PARTLY
    if main == MISSED:
        return PARTLY if CONFIRMED in rest else MISSED
    return PARTLY if CONFIRMED in rest else NOT_CONFIRMED


# --------------------------------------------------------------------------------------
# the comparison


def _change(name: str, b: float | None, a: float | None, noise: float,
            fix_dirs: dict[str, tuple[str, str]]) -> dict:
    """One measurement, judged. `fix_dirs`: metric -> (direction, code) the applied fixes
    predicted; it decides the observables whose good direction depends on the fix."""
    obs = OBSERVABLES[name]
    better, by = obs.better, None
    if better == "fix":
        better, by = fix_dirs.get(name, (None, None))
    row = {"metric": name, "unit": obs.unit, "better": better, "before": _r(b),
           "after": _r(a), "change": None, "change_fraction": None, "judgement": None,
           "better_from": by}
    if b is None or a is None:
        return row
    row["change"] = _r(a - b)
    row["change_fraction"] = _r((a - b) / b) if b else None
    if abs(a - b) <= noise * max(abs(b), 1e-12):
        row["judgement"] = "same"
    elif better is None:  # no fix says which way is good: it changed, that is all
        row["judgement"] = "changed"
    else:
        row["judgement"] = "better" if (a < b) == (better == "down") else "worse"
    return row


def _runtime_bytes(snap: RunSnapshot) -> float | None:
    """On a CPU run (peak memory read from the process, no device allocator): the worst
    rank's peak process memory beyond its model states (parameters, gradients, optimizer
    state): the interpreter, torch and allocator caches. None on a device."""
    worst = None
    for w in snap.ranks.values():
        m = w.memory
        if w.facts.device_type != "cpu" or m.get("peak_reserved"):
            return None
        peak = m.get("process_peak_resident") or m.get("process_resident")
        if not peak:
            continue
        states = sum(m.get(k) or 0 for k in ("sharded_parameters", "gradients",
                                               "optimizer_state"))
        worst = max(worst or 0.0, float(peak - states))
    return worst


def _judge_effect(e: Predicted, before: Side, after: Side, noise: float) -> dict:
    """judge(), except a peak-memory prediction process memory cannot resolve."""
    out = judge(e, before.observed.get(e.metric), after.observed.get(e.metric), noise)
    if e.metric != "peak_memory_bytes" or out["verdict"] == UNKNOWN:
        return out
    runtime = _runtime_bytes(before.snapshot)
    change = abs(out["predicted_change"]) if out["predicted_change"] is not None else None
    if runtime is not None and (change is None or change < runtime):
        out["verdict"] = CANNOT_JUDGE
        out["reason"] = (f"{RUNTIME_DOMINATED}: a predicted change of "
                         f"{'unknown size' if change is None else nbytes(change)} beside "
                         f"{nbytes(runtime)} of runtime")
    return out


def _units(before: RunSnapshot, after: RunSnapshot) -> dict:
    b = {u["unit"]: u for u in unit_rows(before)}
    a = {u["unit"]: u for u in unit_rows(after)}
    keys = ("all_gather_seconds_per_step", "all_gather_exposed_seconds_per_step",
            "all_gather_bytes_per_step", "compute_forward_seconds_per_step",
            "compute_backward_seconds_per_step", "reduce_scatter_seconds_per_step")
    kept = [{"unit": n, "before": {k: b[n][k] for k in keys}, "after": {k: a[n][k] for k in keys}}
            for n in b if n in a]
    return {"kept": kept, "removed": [n for n in b if n not in a],
            "added": [n for n in a if n not in b]}


def _fix(f: Finding, before: Side, after: Side, declared: set[str], noise: float) -> dict:
    rule = BY_CODE.get(f.code)
    reason = None
    if rule is not None and rule.applied is not None:
        reason = rule.applied(before.facts, after.facts)
    by = "facts" if reason else None
    if reason is None and f.code in declared:
        reason, by = "declared with --applied", "user"
    d = finding_dict(f)
    entry = {"code": f.code, "name": f.name, "severity": d["severity"], "title": f.title,
             "fix": f.fix, "predicted": f.predicted, "applied": reason, "applied_by": by,
             "still_present": any(g.code == f.code for g in after.findings),
             "effects": [], "verdict": None}
    if reason is None:
        return entry
    entry["effects"] = [_judge_effect(e, before, after, noise) for e in f.effects]
    entry["verdict"] = overall(entry["effects"]) if entry["effects"] else UNKNOWN
    return entry


def compare(before: Side, after: Side, *, applied: set[str] | frozenset = frozenset(),
            noise: float = NOISE, thresholds: Thresholds = DEFAULT,
            generated_unix: float | None = None) -> dict:
    """The comparison document (schema 1, docs/compare.md)."""
    from ..version import __version__

    facts = [{"fact": k, "before": before.facts.get(k), "after": after.facts.get(k),
              "changed": None not in (before.facts.get(k), after.facts.get(k))
              and before.facts.get(k) != after.facts.get(k)}  # unknown on a side: not a change
             for k in dict.fromkeys([*before.facts, *after.facts])]
    fixes = [_fix(f, before, after, set(applied), noise) for f in before.findings
             if f.code not in NO_FIX]
    fix_dirs: dict[str, tuple[str, str]] = {}
    for x in fixes:
        for e in x["effects"] if x["applied"] else ():
            if not e["cost"]:
                fix_dirs.setdefault(e["metric"], (e["direction"], x["code"]))
    measurements = [_change(n, before.observed.get(n), after.observed.get(n), noise, fix_dirs)
                    for n in OBSERVABLES
                    if before.observed.get(n) is not None or after.observed.get(n) is not None]
    bc = {f.code for f in before.findings}
    ac = {f.code for f in after.findings}
    judged = [x for x in fixes if x["applied"]]
    counts = {v: sum(1 for x in judged if x["verdict"] == v)
              for v in (CONFIRMED, PARTLY, NOT_CONFIRMED, MISSED, WORSE, UNKNOWN)}
    step = next((m for m in measurements if m["metric"] == "step_seconds"), None)
    return {
        "schema": SCHEMA,
        "generator": f"zerodoc {__version__}",
        "generated_unix": round(generated_unix if generated_unix is not None else time.time(), 3),
        "before": before.run,
        "after": after.run,
        "noise_fraction": noise,
        "configuration": facts,
        "measurements": measurements,
        "units": _units(before.snapshot, after.snapshot),
        "fixes": fixes,
        "findings": {"resolved": sorted(bc - ac), "new": sorted(ac - bc),
                     "persisting": sorted(bc & ac),
                     "before": [finding_dict(f) for f in before.findings],
                     "after": [finding_dict(f) for f in after.findings]},
        "summary": {"applied": len(judged), "verdicts": counts,
                    "step_seconds_change_fraction": step["change_fraction"] if step else None,
                    "worse": any(x["verdict"] == WORSE for x in judged)
                    or bool(step and step["judgement"] == "worse")},
        "thresholds": {fl.name: getattr(thresholds, fl.name) for fl in fields(thresholds)},
    }


__all__ = ["SCHEMA", "NOISE", "Side", "side", "judge", "overall", "compare", "CONFIRMED",
           "PARTLY", "NOT_CONFIRMED", "MISSED", "WORSE", "UNKNOWN", "CANNOT_JUDGE"]
