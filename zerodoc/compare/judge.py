"""`zerodoc compare BEFORE AFTER`: did the fix do what was predicted?

`side()` diagnoses one run (any source `open_source()` accepts); `compare()` turns two sides
into one plain dict (the JSON document, schema 1, docs/compare.md):

- **configuration**: the facts a fix can change (`observables.config_facts`), before and
  after;
- **measurements**: every observable (`observables.OBSERVABLES`) before and after, judged
  against the runs' own noise (`noise.py`: each run's per-step spread): within noise,
  better / worse, or "environment" when no configuration fact changed (a rerun: never
  better or worse);
- **units**: per sharded unit (matched by name) the per-step numbers of both runs;
- **fixes**: for each finding of BEFORE, whether its fix was applied (the rule's
  `applied(before, after)` over the facts, or `--applied CODE`) and, if so, each predicted
  effect (`Finding.effects`) against what AFTER shows, with a verdict; judged only against
  the change it was made for (another rule's fix applied instead, or with it: "not judged");
- **runs**: whether each run is still being written (its verdicts then inconclusive);
- **findings**: resolved (gone in AFTER), new, persisting.

Verdicts (per effect; the finding's is its main effect's, docs/compare.md "Verdicts") can
fail: a prediction with a range (the step model's, `zerodoc.whatif`) is confirmed when the
observed value falls inside a range that excludes the value before, or inside one that holds
it with the change the predicted way beyond the noise; missed when outside by more than the
noise; else inconclusive, with the reason. One without a range by its size, beyond the
noise: observed change / predicted change >= 0.75 confirmed, >= 0.25 partly, else not
confirmed; the other way beyond the noise "made worse"; within the noise inconclusive (not
confirmed when the predicted value lies beyond it). A peak-memory prediction on a CPU run
smaller than the process's memory beyond its model states (the runtime) is "cannot judge on
CPU". Measurements whose good direction depends on the fix (observable `better` "fix": unit
count, median all-gather size) are judged in the direction an applied fix predicted.
Plain Python: no torch.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, fields

from ..diagnosis import BY_CODE, Context, Finding, diagnose
from ..diagnosis.findings import Predicted
from ..humanize import nbytes, value
from ..diagnosis.observables import OBSERVABLES, config_facts, observe_all
from ..runmodel import RunSnapshot
from ..report import finding_dict, per_unit_coverage, unit_rows
from ..thresholds import DEFAULT, Thresholds
from .noise import TIME_FLOOR, half_width, live, measured

SCHEMA = 1
# the floor (relative to the value before) for what the runs give no per-step spread of:
# counts, bytes, memory (`--noise`); times use the runs' own noise (noise.py)
NOISE = 0.05
CONFIRMED, PARTLY, NOT_CONFIRMED, WORSE, UNKNOWN, CANNOT_JUDGE, MISSED = (
    "confirmed", "partly", "not confirmed", "made worse", "not measurable",
    "cannot judge on CPU", "missed")
INCONCLUSIVE, NOT_JUDGED = "inconclusive", "not judged"
WITHIN_NOISE, ENVIRONMENT = "within noise", "environment"  # measurements' judgements
VERDICTS = (CONFIRMED, PARTLY, NOT_CONFIRMED, MISSED, WORSE, INCONCLUSIVE, NOT_JUDGED, UNKNOWN)
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


def _signed(metric: str, x: float) -> str:
    return ("+" if x >= 0 else "-") + value(metric, abs(x))


def judge(e: Predicted, before: float | None, after: float | None,
          noise: float | None = None) -> dict:
    """Predicted vs observed for one effect (docs/compare.md, "Verdicts"). `noise`: the
    half-width (the metric's unit) within which `before` and `after` differ by the runs'
    noise alone (`noise.half_width`); None: the floor, NOISE x the value before."""
    out = {**e.as_dict(), "observed_before": _r(before), "observed_after": _r(after),
           "predicted_change": None, "observed_change": None, "ratio": None, "noise": None}
    if before is None or after is None:
        return {**out, "verdict": UNKNOWN}
    m = e.metric
    hw = noise if noise is not None else NOISE * max(abs(before), abs(e.now or 0.0), 1e-12)
    d_obs = after - before
    sign = -1.0 if e.direction == "down" else 1.0
    moved = sign * d_obs  # > 0: the way the fix was predicted to move it
    out.update(noise=_r(hw), observed_change=_r(d_obs))
    d_pred = None
    if e.value is not None:
        d_pred = e.value - (e.now if e.now is not None else before)
        out["predicted_change"] = _r(d_pred)
        if abs(d_pred) > 1e-12:
            out["ratio"] = _r(d_obs / d_pred)
    within = f"the change {_signed(m, d_obs)} is within the runs' noise (+/-{value(m, hw)})"
    beyond = abs(d_obs) > hw
    if e.lo is not None and e.hi is not None and not e.cost:
        return {**out, **_by_range(e, before, after, hw, moved, beyond, within)}
    if e.cost:  # a price: as predicted when it is no higher than predicted (+ noise)
        limit = sign * d_pred if d_pred is not None else 0.0
        verdict = CONFIRMED if moved <= max(limit * 1.25, 0.0) + hw else WORSE
        return {**out, "verdict": verdict}
    if moved < -hw:
        return {**out, "verdict": WORSE, "reason": f"moved the other way: "
                f"{_signed(m, d_obs)}, beyond the runs' noise (+/-{value(m, hw)})"}
    if not beyond:
        if d_pred is not None and abs(before + d_pred - after) > hw:
            return {**out, "verdict": NOT_CONFIRMED,
                    "reason": f"{within}; {_signed(m, d_pred)} was predicted"}
        return {**out, "verdict": INCONCLUSIVE, "reason": within}
    if out["ratio"] is None or abs(d_pred or 0.0) <= hw:
        verdict = CONFIRMED  # only the direction was predicted (or a change within noise)
    elif out["ratio"] >= CONFIRM_RATIO:
        verdict = CONFIRMED
    elif out["ratio"] >= PARTLY_RATIO:
        verdict = PARTLY
    else:
        verdict = NOT_CONFIRMED
    return {**out, "verdict": verdict}


def _by_range(e: Predicted, before: float, after: float, hw: float, moved: float,
              beyond: bool, within: str) -> dict:
    """A prediction with a range: confirmed inside it when it excludes the value before (or
    the change went the predicted way beyond the noise), missed when it lies outside by
    more than the noise, else inconclusive."""
    m = e.metric
    rng = f"{value(m, e.lo)}-{value(m, e.hi)}"
    seen = f"observed {value(m, after)}"
    if e.lo <= after <= e.hi:
        if not e.lo <= before <= e.hi:
            return {"verdict": CONFIRMED, "reason": f"{seen}, inside {rng}"}
        holds = (f"{seen}, inside {rng}, but the range holds the before-value "
                 f"{value(m, before)}")
        if beyond and moved > 0:
            return {"verdict": CONFIRMED, "reason": f"{holds}; the change "
                    f"{_signed(m, after - before)} is the predicted way and beyond the runs' "
                    f"noise (+/-{value(m, hw)})"}
        why = within if not beyond else f"it moved the other way ({_signed(m, after - before)})"
        return {"verdict": INCONCLUSIVE,
                "reason": f"{holds}: cannot tell a win from no change; {why}"}
    outside = e.lo - after if after < e.lo else after - e.hi
    if outside > hw:
        return {"verdict": MISSED, "reason": f"{seen}, predicted {rng}"}
    return {"verdict": INCONCLUSIVE, "reason": f"{seen}, {value(m, outside)} outside {rng}: "
            f"within the runs' noise (+/-{value(m, hw)})"}


def overall(effects: list[dict]) -> str:
    """A fix's verdict: its main effect's, lowered to "partly" when another benefit did not
    follow; "made worse" when the main effect went the wrong way; a main effect outside its
    predicted range ("missed") stays missed unless another benefit was confirmed; an
    inconclusive main effect leaves the fix inconclusive unless another benefit was made
    worse or missed (an inconclusive other one does not lower it); every effect not judged:
    not judged."""
    gains = [e for e in effects if not e["cost"] and e["verdict"] not in (UNKNOWN, CANNOT_JUDGE)]
    if not gains:
        return UNKNOWN
    if all(e["verdict"] == NOT_JUDGED for e in gains):
        return NOT_JUDGED
    gains = [e for e in gains if e["verdict"] != NOT_JUDGED]
    main = gains[0]["verdict"]
    rest = [e["verdict"] for e in gains[1:] if e["verdict"] != INCONCLUSIVE]
    if main == INCONCLUSIVE:  # another benefit that failed still says so
        return next((v for v in (WORSE, MISSED) if v in rest), INCONCLUSIVE)
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


def _change(name: str, b: float | None, a: float | None, noise: dict,
            fix_dirs: dict[str, tuple[str, str]], configured: bool) -> dict:
    """One measurement, judged against the runs' noise (`noise`: `noise.half_width`).
    `fix_dirs`: metric -> (direction, code) the applied fixes predicted; it decides the
    observables whose good direction depends on the fix. `configured`: a configuration fact
    changed (or a fix was declared): without, a change beyond the noise is the
    environment's, never better or worse."""
    obs = OBSERVABLES[name]
    better, by = obs.better, None
    if better == "fix":
        better, by = fix_dirs.get(name, (None, None))
    row = {"metric": name, "unit": obs.unit, "better": better, "before": _r(b),
           "after": _r(a), "change": None, "change_fraction": None, "judgement": None,
           "better_from": by, "noise": _r(noise["half_width"]) if b is not None else None,
           "noise_from": noise["from"], "noise_measured": noise["measured"]}
    if b is None or a is None:
        return row
    row["change"] = _r(a - b)
    row["change_fraction"] = _r((a - b) / b) if b else None
    if abs(a - b) <= noise["half_width"]:
        row["judgement"] = WITHIN_NOISE
    elif not configured:
        row["judgement"] = ENVIRONMENT
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


def _judge_effect(e: Predicted, before: Side, after: Side, noise: dict) -> dict:
    """judge() with the runs' noise of the effect's metric, except a peak-memory prediction
    process memory cannot resolve."""
    hw = noise[e.metric]["half_width"] if e.metric in noise else None
    out = judge(e, before.observed.get(e.metric), after.observed.get(e.metric), hw)
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


_WHATIF = re.compile(r"what-if \((.+?)\): step ")


def predicted_for(f: Finding) -> str:
    """The change a finding's prediction was made for: the step model's change (the
    what-if text's parenthesis, `rules.base.model_effects`) and the rule's own (its predicted
    text's head), else the rule's fix."""
    parts = []
    head = (f.predicted or "").split(": ")[0]
    if head and not head.startswith("what-if"):
        parts.append(head)
    m = _WHATIF.match(str(f.extra.get("whatif") or ""))
    if m:
        parts.append(m.group(1))
    return "; ".join(parts) or f"{f.code}'s fix"


def applied_changes(before: dict, after: dict) -> dict[str, tuple[str, frozenset]]:
    """Every rule's fix that shows in the facts: code -> (what changed, its facts). Its facts:
    the changed facts without which the rule's `applied()` says something else (or nothing),
    so two rules that read one change (ZD005's and ZD008's mesh) name the same change."""
    changed = [k for k in dict.fromkeys([*before, *after]) if before.get(k) != after.get(k)]
    out = {}
    for code, rule in BY_CODE.items():
        reason = rule.applied(before, after) if rule.applied is not None else None
        if reason:
            keys = frozenset(k for k in changed
                             if rule.applied(before, {**after, k: before.get(k)}) != reason)
            out[code] = (reason, keys)
    return out


def _others(changes: dict[str, tuple[str, frozenset]], code: str) -> str:
    """The applied changes that are not this fix's: their facts apart from its facts (each
    change shown once)."""
    seen = set(changes[code][1]) if code in changes else set()
    out = []
    for c, (reason, keys) in changes.items():
        if c != code and not keys & seen:
            seen |= keys
            out.append(f"{reason} ({c}'s fix)")
    return "; ".join(out)


def _fix(f: Finding, before: Side, after: Side, declared: set[str], noise: dict,
         changes: dict[str, tuple[str, frozenset]], live: str | None) -> dict:
    """One finding of BEFORE: its fix applied or not and, if applied, each effect judged.
    Judged only against the change it was made for: another fix applied instead leaves it
    not judged, and so does another applied with it (the observed change is both's).
    `live`: why every verdict is inconclusive (a run still being written), or None."""
    reason = changes[f.code][0] if f.code in changes else None
    by = "facts" if reason else None
    if reason is None and f.code in declared:
        reason, by = "declared with --applied", "user"
    d = finding_dict(f)
    entry = {"code": f.code, "name": f.name, "severity": d["severity"], "title": f.title,
             "fix": f.fix, "predicted": f.predicted, "predicted_for": predicted_for(f),
             "applied": reason, "applied_by": by,
             "still_present": any(g.code == f.code for g in after.findings),
             "effects": [], "verdict": None, "reason": None}
    others = _others(changes, f.code)
    if reason is None:
        if others:
            entry.update(verdict=NOT_JUDGED, reason=f"not judged: the applied change is "
                         f"{others}, the prediction was for {entry['predicted_for']}")
        return entry
    effects = [_judge_effect(e, before, after, noise) for e in f.effects]
    why = (f"the applied changes are {reason} and {others}, the prediction was for "
           f"{entry['predicted_for']} alone") if others else live
    for e in effects if why else ():
        if e["verdict"] in (UNKNOWN, CANNOT_JUDGE):
            continue
        e["verdict_as_it_stands"] = e["verdict"]
        e["verdict"] = NOT_JUDGED if others else INCONCLUSIVE
        e["reason"] = why + (f"; as it stands: {e['verdict_as_it_stands']}" if not others
                             else "")
    entry["effects"] = effects
    entry["verdict"] = overall(effects) if effects else UNKNOWN
    # the fix's reason names its verdict (the effects' sit beside theirs)
    entry["reason"] = why and f"{'not judged' if others else INCONCLUSIVE}: {why}"
    return entry


def _environment(measurements: list[dict], configured: bool) -> dict:
    """What the compute did: a compute shift beyond the noise with no configuration change
    is the environment's (the host's load), never the job's."""
    comp = next((m for m in measurements if m["metric"] == "compute_seconds_per_step"), None)
    frac = comp["change_fraction"] if comp else None
    beyond = bool(comp and comp["judgement"] not in (None, WITHIN_NOISE))
    text = None
    moved = f"compute {frac * 100:+.0f} %" if frac is not None else None
    noise = f"+/-{value('compute_seconds', comp['noise'])}" if comp and comp["noise"] else \
        "+/-0: not measured"
    if not configured:
        text = (f"{moved} with no configuration change: the host's load, not the job"
                if beyond else "no configuration change and compute within the runs' noise "
                f"({noise}): a rerun") + "; no measurement is judged better or worse"
    elif beyond and moved:
        text = (f"{moved}, beyond the runs' noise ({noise}): the change's own effect or the "
                f"host's load; compare cannot tell them apart")
    return {"configuration_changed": configured, "compute_change_fraction": frac,
            "compute_beyond_noise": beyond, "text": text}


def _live_reason(runs: dict) -> str | None:
    bits = [f"{name.upper()} is still being written ({r['steps_so_far']} steps so far)"
            for name, r in runs.items() if r["live"]]
    return " and ".join(bits) or None


def compare(before: Side, after: Side, *, applied: set[str] | frozenset = frozenset(),
            noise: float = NOISE, thresholds: Thresholds = DEFAULT,
            generated_unix: float | None = None) -> dict:
    """The comparison document (schema 1, docs/compare.md). `noise`: the floor for what
    the runs give no per-step spread of (`noise.py`)."""
    from ..version import __version__

    facts = [{"fact": k, "before": before.facts.get(k), "after": after.facts.get(k),
              "changed": None not in (before.facts.get(k), after.facts.get(k))
              and before.facts.get(k) != after.facts.get(k)}  # unknown on a side: not a change
             for k in dict.fromkeys([*before.facts, *after.facts])]
    configured = any(c["changed"] for c in facts) or bool(applied)
    runs = {"before": live(before.snapshot), "after": live(after.snapshot)}
    per_step = measured(before.snapshot, after.snapshot)
    bo = before.observed
    widths = {n: half_width(n, bo.get(n), per_step, noise, bo.get("step_seconds"),
                            bo.get("exposed_comm_seconds_per_step")) for n in OBSERVABLES}
    changes = applied_changes(before.facts, after.facts)
    fixes = [_fix(f, before, after, set(applied), widths, changes, _live_reason(runs))
             for f in before.findings if f.code not in NO_FIX]
    fix_dirs: dict[str, tuple[str, str]] = {}
    for x in fixes:
        for e in x["effects"] if x["applied"] else ():
            if not e["cost"]:
                fix_dirs.setdefault(e["metric"], (e["direction"], x["code"]))
    measurements = [_change(n, bo.get(n), after.observed.get(n), widths[n], fix_dirs,
                            configured)
                    for n in OBSERVABLES
                    if bo.get(n) is not None or after.observed.get(n) is not None]
    bc = {f.code for f in before.findings}
    ac = {f.code for f in after.findings}
    judged = [x for x in fixes if x["applied"]]
    counts = {v: sum(1 for x in fixes if x["verdict"] == v) for v in VERDICTS}
    step = next((m for m in measurements if m["metric"] == "step_seconds"), None)
    return {
        "schema": SCHEMA,
        "generator": f"zerodoc {__version__}",
        "generated_unix": round(generated_unix if generated_unix is not None else time.time(), 3),
        "before": before.run,
        "after": after.run,
        "runs": runs,
        "noise_fraction": noise,
        "noise": {"per_step": per_step, "time_floor_fraction": TIME_FLOOR},
        "configuration": facts,
        "environment": _environment(measurements, configured),
        "measurements": measurements,
        "units": _units(before.snapshot, after.snapshot),
        "fixes": fixes,
        "findings": {"resolved": sorted(bc - ac), "new": sorted(ac - bc),
                     "persisting": sorted(bc & ac),
                     "before": [finding_dict(f) for f in before.findings],
                     "after": [finding_dict(f) for f in after.findings]},
        "summary": {"applied": len(judged), "verdicts": counts,
                    "step_seconds_change_fraction": step["change_fraction"] if step else None,
                    "live": any(r["live"] for r in runs.values()),
                    "worse": any(x["verdict"] == WORSE for x in judged)
                    or bool(step and step["judgement"] == "worse")},
        "thresholds": {fl.name: getattr(thresholds, fl.name) for fl in fields(thresholds)},
    }


__all__ = ["SCHEMA", "NOISE", "Side", "side", "judge", "overall", "compare", "predicted_for",
           "applied_changes", "CONFIRMED", "PARTLY", "NOT_CONFIRMED", "MISSED", "WORSE",
           "UNKNOWN", "CANNOT_JUDGE", "INCONCLUSIVE", "NOT_JUDGED", "VERDICTS", "WITHIN_NOISE",
           "ENVIRONMENT"]
