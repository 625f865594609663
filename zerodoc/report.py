"""`zerodoc report`: the findings, the per-unit table and the step breakdown of one run.

`build_report()` turns a snapshot and its findings into one plain dict (the JSON document,
schema 1, documented in docs/report.md); `render_text`, `render_markdown` and `render_json`
print it. Numbers stay in base units in the dict; only the text and Markdown renderers
convert them for people. Plain Python: no torch.
"""

from __future__ import annotations

import json
import time
from dataclasses import fields

from .diagnosis import Finding, Severity
from .humanize import nbytes, pct, rate, secs, table, value
from .measures import exposed_summary, live_text
from .runmodel import RunSnapshot
from .windowsamples import every, next_sample, run_coverage, warmup_text
from .thresholds import LINK_BUSBW, Thresholds

SCHEMA = 1
SEVERITIES = [s.name.lower() for s in sorted(Severity, reverse=True)]


def _r(x: float | None) -> float | None:
    return None if x is None else float(f"{x:.6g}")


def finding_dict(f: Finding) -> dict:
    extra = dict(f.extra)
    return {
        "code": f.code, "name": f.name, "severity": f.severity.name.lower(), "title": f.title,
        "evidence": f.evidence, "threshold": f.threshold, "fix": f.fix,
        "predicted": f.predicted, "predicted_effects": [e.as_dict() for e in f.effects],
        "history": extra.pop("history", None), "ranks": list(f.ranks), "units": list(f.units),
        "doc": f.doc,
        "cost_seconds_per_step": _r(float(extra.pop("cost_seconds_per_step", 0.0))),
        "explains": list(extra.pop("explains", [])),
        "explained_by": list(extra.pop("explained_by", [])),
        "extra": extra,
    }


def unit_rows(snap: RunSnapshot) -> list[dict]:
    """Per unit, per step, mean over the fresh ranks (all ranks when every one is stale)."""
    from .measures import unit_busbw
    from .unitstats import unit_stats

    ranks = _fresh(snap)
    first = snap.any_rank
    if first is None:
        return []
    stats_all = unit_stats(snap, ranks) if ranks else None
    stats = stats_all.units if ranks else {}
    rows = []
    for u in first.facts.units:
        st = stats.get(u.name, {})
        fw = st.get("framework_seconds")

        def mean(f: str) -> float | None:
            s = st.get(f)
            # a unit no rank has measured yet: None, never 0 (docs/report.md)
            return s.mean if s is not None and s.n else None

        a = {k: mean(f) for k, f in (("ag_n", "ag_count"), ("ag_b", "ag_bytes"),
                                     ("ag_s", "ag_seconds"), ("ag_e", "ag_exposed_seconds"),
                                     ("rs_s", "rs_seconds"), ("rs_e", "rs_exposed_seconds"),
                                     ("fwd", "compute_forward"), ("bwd", "compute_backward"),
                                     ("ar_n", "ar_count"), ("ar_b", "ar_bytes"),
                                     ("ar_s", "ar_seconds"), ("ar_e", "ar_exposed_seconds"))}
        rows.append({
            "unit": u.name, "params": u.params,
            "all_gather_count_per_step": _r(a["ag_n"]),
            "all_gather_bytes_per_step": _r(a["ag_b"]),
            "all_gather_seconds_per_step": _r(a["ag_s"]),
            "all_gather_exposed_seconds_per_step": _r(a["ag_e"]),
            "all_gather_exposed_fraction": _r(a["ag_e"] / a["ag_s"]) if a["ag_s"] else None,
            # one definition with the TUI's and Prometheus's (zerodoc.measures)
            "all_gather_busbw_bytes_per_second":
                _r(unit_busbw(stats_all, u.name, u.group_size)) if a["ag_s"] else None,
            "compute_forward_seconds_per_step": _r(a["fwd"]),
            "compute_backward_seconds_per_step": _r(a["bwd"]),
            "reduce_scatter_seconds_per_step": _r(a["rs_s"]),
            "reduce_scatter_exposed_seconds_per_step": _r(a["rs_e"]),
            "all_reduce_count_per_step": _r(a["ar_n"]),
            "all_reduce_bytes_per_step": _r(a["ar_b"]),
            "all_reduce_seconds_per_step": _r(a["ar_s"]),
            "all_reduce_exposed_seconds_per_step": _r(a["ar_e"]),
            # null where no rank recorded it per unit (older run logs, a coarse rank)
            "framework_seconds_per_step": _r(fw.mean) if fw is not None and fw.n else None,
        })
    return rows


def _fresh(snap: RunSnapshot) -> list[int]:
    """The ranks the per-unit table is over: fresh ones with steps (all when all stale)."""
    return [r for r, w in snap.ranks.items() if r not in snap.stale_ranks and w.steps] or \
        [r for r, w in snap.ranks.items() if w.steps]


def per_unit_coverage(snap: RunSnapshot) -> dict:
    """How many steps the per-unit numbers come from (the rank with the fewest samples):
    `detail_steps` of `steps`, `before_window` of them before the window's first step
    (fewer than MIN_WINDOW_SAMPLES inside it), `every` (K: about 1 step in K is sampled) and
    the sentence the renderers print."""
    ranks = _fresh(snap)
    ws = [snap.ranks[r] for r in ranks]
    if not ws:
        return {"sampled": False, "detail_steps": 0, "steps": 0, "before_window": 0,
                "every": None, "text": None}
    w = min(ws, key=lambda x: (x.per_unit_steps, -x.steps))
    on = any(x.sampled for x in ws)
    return {"sampled": on, "detail_steps": w.per_unit_steps, "steps": w.steps,
            "before_window": w.detail_before, "every": every(snap),
            "text": run_coverage(snap, ranks) if on else None,
            "next": next_sample(snap) if on and w.per_unit_steps == 0 else None}


def step_rows(snap: RunSnapshot) -> list[dict]:
    """The step breakdown per rank, per step: step = compute + exposed comm + optimizer +
    framework + other (+ zerodoc's own time, which is not shown). Under sampling compute,
    exposed comm and framework are the sampled steps' means, the rest every window step's
    (`breakdown_steps` says so)."""
    from .measures import exposed_per_step

    rows = []
    for r, w in sorted(snap.ranks.items()):
        n = w.steps or 1
        # compute, exposed comm and framework time are measured on sampled steps only:
        # their means over those (None before the first sample)
        m = w.per_unit_steps > 0
        framework = w.per_sampled_step(w.framework_seconds)
        rows.append({
            "rank": r, "stale": r in snap.stale_ranks, "steps": w.steps,
            "detail_steps": w.per_unit_steps,
            "first_step": w.first_step, "last_step": w.last_step,
            "step_seconds": _r(w.step_seconds / n),
            "compute_seconds": _r(w.compute_seconds / n) if m else None,
            "exposed_comm_seconds": _r(exposed_per_step(w)),
            "optimizer_seconds": _r(w.optimizer_seconds / n),
            "framework_seconds": _r(framework),
            "other_seconds": _r(w.other_seconds / n),
            "exposed_fraction": _r(w.exposed_fraction) if m else None,
        })
    return rows


def build_report(snap: RunSnapshot, findings: list[Finding], *, source: str,
                 thresholds: Thresholds, link: str | None, window: int | None,
                 generated_unix: float | None = None) -> dict:
    from .version import __version__
    from .diagnosis import waiting
    from .diagnosis.coverage import data_problems
    from .trace.scope import DUMPS_SOURCE, device_rows, scope, source_of

    dumps = source_of(snap) == DUMPS_SOURCE
    if dumps:  # no link class is involved in who stopped, and no timings to grade by it
        link = None
    first = snap.any_rank
    f = first.facts if first else None
    counts = {s: 0 for s in SEVERITIES}
    for x in findings:
        counts[x.severity.name.lower()] += 1
    worst = max((x.severity for x in findings), default=None)
    run = None
    if f is not None:
        run = {"run_id": f.run_id, "framework": f.framework,
               "framework_version": f.framework_version, "torch_version": f.torch_version,
               "device_type": f.device_type, "backend": f.backend, "zero_stage": f.zero_stage,
               "world_size": f.world_size, "param_dtype": f.param_dtype,
               "reduce_dtype": f.reduce_dtype, "units": len(f.units),
               "params": sum(u.params for u in f.units)}
    return {
        "schema": SCHEMA,
        "generator": f"zerodoc {__version__}",
        "generated_unix": round(generated_unix if generated_unix is not None else time.time(), 3),
        "source": source,
        "run": run,
        "link": {"class": link, "expected_busbw_bytes_per_second": LINK_BUSBW.get(link)}
        if link else None,
        "window": {"steps_requested": window,
                   "steps": min((w.steps for w in snap.ranks.values()), default=0),
                   "first_step": min((w.first_step for w in snap.ranks.values()), default=0),
                   "last_step": max((w.last_step for w in snap.ranks.values()), default=0),
                   "warmup_left_out": next((w.warmup_left_out for w in snap.ranks.values()
                                            if w.warmup_left_out), None),
                   "warmup_kept": any(w.warmup_kept for w in snap.ranks.values()),
                   "per_unit": per_unit_coverage(snap)},
        "ranks": sorted(snap.ranks),
        "stale_ranks": sorted(snap.stale_ranks),
        "stopped": stopped(findings),
        "summary": {"worst_severity": worst.name.lower() if worst is not None else None,
                    "counts": counts, "top": findings[0].code if findings else None},
        "findings": [finding_dict(x) for x in findings],
        "units": unit_rows(snap),
        "steps": [] if dumps else step_rows(snap),  # dumps: no step, never rows of zeros
        "thresholds": {fl.name: getattr(thresholds, fl.name) for fl in fields(thresholds)},
        # added within schema 1
        "ended_ranks": sorted(snap.ended_ranks),
        "data_problems": [{"kind": p.kind, "message": p.message, "fix": p.fix}
                          for p in data_problems(snap)],
        "missing_ranks": sorted(snap.missing_ranks),
        "interrupted_ranks": sorted(snap.interrupted_ranks),
        "log_notes": list(getattr(snap, "log_notes", ())),
        "trace_scope": scope(snap),
        "device": [{k: _r(v) if isinstance(v, float) else v for k, v in row.items()}
                   for row in device_rows(snap)],
        "waiting": waiting(snap),  # rules waiting for sampled steps (zerodoc.windowsamples)
        "notes": notes(snap),
        # added within schema 1 (issue 31): exposed communication per step under each
        # definition (zerodoc.measures), which steps the step breakdown's parts come from,
        # "LIVE: still being written (step 37, last write 2 s ago)" (None: finished)
        # rounded as every figure of the document is (the same run read two ways, e.g. rank
        # series or sums over units, agrees number for number)
        "exposed_comm": {k: _r(v) if isinstance(v, float) else v for k, v in exposed_summary(
            snap, _fresh(snap), _context(snap, thresholds, link)).items()},
        "breakdown_steps": breakdown_steps(snap),
        "live": live_text(snap, generated_unix),
        # added within schema 1 (issue 34): what the source is: "run" (run log, endpoints,
        # Prometheus), "profiler trace" (Kineto, Nsight Systems), "flight-recorder dumps"
        "source_kind": {DUMPS_SOURCE: DUMPS_KIND}.get(source_of(snap), source_of(snap)) or "run",
    }


DUMPS_KIND = "flight-recorder dumps"
DUMPS_TEXT = ("flight-recorder dumps hold each rank's last collectives, no timings: no per-unit "
              "or per-step figures (a zerodoc run log or a profiler trace of the job has them)")


def _is_dumps(rep: dict) -> bool:
    return rep.get("source_kind") == DUMPS_KIND


def _context(snap: RunSnapshot, thresholds: Thresholds, link: str | None):
    """The rules' view of the run (link-attributable figures), None when it has no data."""
    from .diagnosis import Context
    from .errors import UserError

    try:
        return Context(snap, thresholds, link=link) if snap.ranks else None
    except UserError:
        return None


def breakdown_steps(snap: RunSnapshot) -> dict | None:
    """Which steps the step breakdown's parts come from, when not all from the same ones:
    {"every_step": [columns], "sampled_steps": [columns], "text"}; None when every step has
    per-unit detail (the parts add up over the same steps)."""
    from .windowsamples import run_coverage

    ranks = _fresh(snap)
    cov = run_coverage(snap, ranks)
    if cov is None:
        return None
    w = [snap.ranks[r] for r in ranks]
    first = min((x.first_step for x in w), default=0)
    last = max((x.last_step for x in w), default=0)
    return {"every_step": ["step_seconds", "optimizer_seconds", "other_seconds"],
            "sampled_steps": ["compute_seconds", "exposed_comm_seconds", "framework_seconds"],
            "text": f"step, optimizer and other: every step of the window ({first}-{last}); "
                    f"compute, exposed comm and framework: the means of the sampled steps "
                    f"named above, so the parts need not add up to the step"}


def notes(snap: RunSnapshot) -> list[str]:
    """What the tables do not show: an FSDP request that the framework turned into DDP
    (`zerodoc.integrations.common.fsdp_requested`); per-unit numbers that cover another span
    than the window (read from Prometheus recording rules); the ranks of one job shown where
    the source held several (`snap.jobs`: `zerodoc.runlog.segments.one_job`)."""
    first = snap.any_rank
    cfg = first.facts.config if first is not None and isinstance(first.facts.config, dict) \
        else {}
    out = []
    if cfg.get("fsdp_requested") and first.facts.framework == "ddp":
        out.append(f"asked for FSDP, running DDP: no sharding ({cfg['fsdp_requested']})")
    jobs = snap.jobs
    if jobs:  # a run directory or endpoints holding more than one job: one is shown
        from .runlog.segments import jobs_note

        out += jobs_note(jobs)
    span = getattr(snap.unit_stats, "window_s", None)
    if span:
        out.append(f"per-unit numbers: the Prometheus recording rules' last {span:g} s (the "
                   "step breakdown: the window above)")
    return out


def stopped(findings: list[Finding]) -> dict | None:
    """The banner of a run whose ranks stopped (rule ZD013), or None."""
    f = next((x for x in findings if x.code == "ZD013"), None)
    if f is None:
        return None
    e = f.evidence
    return {"title": f.title, "severity": f.severity.name.lower(), "rank": e.get("rank"),
            "state": e.get("state"), "step": e.get("step"), "unit": e.get("unit"),
            "phase": e.get("phase"), "collective": e.get("collective"),
            "waiting_ranks": e.get("waiting_ranks", []), "ranks": e.get("ranks", []),
            "process_group": e.get("process_group"), "sequence": e.get("sequence"),
            "confidence": e.get("confidence")}


def render_json(rep: dict) -> str:
    return json.dumps(rep, indent=2, default=str) + "\n"


# --------------------------------------------------------------------------------------
# text and Markdown

UNIT_HEAD = ("unit", "params", "AG/step", "AG bytes", "AG time", "exposed", "exp %", "busbw",
             "fwd", "bwd", "RS time")
# All-reduce columns, shown when a unit all-reduces (DDP, ZeRO-1/2, FSDP1 NO_SHARD): without
# them a DDP run's table read `(model) ... 0 B 0 s` (issue 20, item 6).
AR_HEAD = ("AR/step", "AR bytes", "AR time", "AR exposed")
STEP_HEAD = ("rank", "steps", "step", "compute", "exposed comm", "optimizer", "framework",
             "other")


def _count(n: int) -> str:
    for scale, s in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:.3g}{s}"
    return str(n)


def _unit_cells(u: dict) -> tuple[str, ...]:
    n = u["all_gather_count_per_step"]
    return (u["unit"], _count(u["params"]), "-" if n is None else f"{n:g}",
            nbytes(u["all_gather_bytes_per_step"]), secs(u["all_gather_seconds_per_step"]),
            secs(u["all_gather_exposed_seconds_per_step"]), pct(u["all_gather_exposed_fraction"]),
            rate(u["all_gather_busbw_bytes_per_second"]),
            secs(u["compute_forward_seconds_per_step"]),
            secs(u["compute_backward_seconds_per_step"]),
            secs(u["reduce_scatter_seconds_per_step"]))


def _has_all_reduce(rep: dict) -> bool:
    return any(u.get("all_reduce_count_per_step") for u in rep["units"])


def _unit_table(rep: dict) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """The per-unit table's head and rows (with the all-reduce columns when there is any)."""
    if not _has_all_reduce(rep):
        return UNIT_HEAD, [_unit_cells(u) for u in rep["units"]]
    return UNIT_HEAD + AR_HEAD, [
        _unit_cells(u) + (f"{u['all_reduce_count_per_step']:g}",
                          nbytes(u["all_reduce_bytes_per_step"]),
                          secs(u["all_reduce_seconds_per_step"]),
                          secs(u["all_reduce_exposed_seconds_per_step"]))
        for u in rep["units"]]


def _step_cells(s: dict) -> tuple[str, ...]:
    return (f"{s['rank']}{' (stale)' if s['stale'] else ''}", str(s["steps"]),
            secs(s["step_seconds"]), secs(s["compute_seconds"]),
            f"{secs(s['exposed_comm_seconds'])} ({pct(s['exposed_fraction'])})",
            secs(s["optimizer_seconds"]), secs(s["framework_seconds"]), secs(s["other_seconds"]))


def _header(rep: dict) -> list[str]:
    run, link, win = rep["run"] or {}, rep["link"], rep["window"]
    bits = [f"run {run.get('run_id') or '?'}", run.get("framework") or "?",
            f"{run.get('world_size', '?')} ranks"]
    if _is_dumps(rep):  # dumps do not say the framework; they hold no step window
        bits.pop(1)
    if run.get("zero_stage"):
        bits.append(f"ZeRO-{run['zero_stage']}")
    bits.append(f"{run.get('backend', '?')}/{run.get('device_type', '?')}")
    if link:
        bits.append(f"link {link['class']} ({rate(link['expected_busbw_bytes_per_second'])} "
                    f"expected)")
    req = win["steps_requested"]
    warm = warmup_text(win.get("warmup_left_out"), bool(win.get("warmup_kept")))
    warm = f"; {warm}" if warm else ""
    wtxt = (f"last {req} steps" if req else "all steps") + \
        f" ({win['steps']} steps, {win['first_step']}-{win['last_step']}{warm})"
    if _is_dumps(rep):
        wtxt = "each rank's last collectives (no steps)"
    lines = ["zerodoc report: " + " | ".join(bits), f"source: {rep['source']}; window: {wtxt}"]
    if rep.get("live"):
        lines.append(f"{rep['live']}: its numbers may still move")
    pu = win.get("per_unit") or {}
    if pu.get("text"):
        lines.append(pu["text"] + (f" (about 1 step in {pu['every']} is sampled)"
                                   if pu.get("every") and pu["every"] > 1 else ""))
    if rep["stale_ranks"] and not _is_dumps(rep):  # dumps: every rank stopped writing
        lines.append(f"stale ranks (stopped reporting): "
                     f"{', '.join(map(str, rep['stale_ranks']))}")
    if rep.get("stopped"):
        lines.append(f"RUN STOPPED: {rep['stopped']['title']}")
    elif rep.get("interrupted_ranks") and set(rep["ended_ranks"]) >= set(rep["ranks"]):
        lines.append(f"run stopped by the user (Ctrl-C) after step {win['last_step']}: "
                     f"every rank ended cleanly")
    if rep.get("missing_ranks"):
        lines.append(f"missing ranks (the world size has them, the source shows none): "
                     f"{_ranges(rep['missing_ranks'])}")
    lines += [f"NOTE: {n}" for n in rep.get("notes", ())]
    return lines


def _ranges(ranks: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2, 5" (a thousand missing ranks stay one line)."""
    out, start, prev = [], None, None
    for r in ranks:
        if start is None:
            start = prev = r
        elif r == prev + 1:
            prev = r
        else:
            out.append(f"{start}-{prev}" if prev > start else str(start))
            start = prev = r
    if start is not None:
        out.append(f"{start}-{prev}" if prev > start else str(start))
    return ", ".join(out)


def _summary(rep: dict) -> str:
    c = rep["summary"]["counts"]
    parts = [f"{n} {s}" for s, n in c.items() if n]
    wait = rep.get("waiting")
    if wait:  # never a bare "none" when rules did not run (issue 31)
        parts.append(f"{len(wait['rules'])} rule{'s' if len(wait['rules']) != 1 else ''} "
                     "not evaluated")
        return ("none from the rules that ran; " if not c or not any(c.values()) else "") + \
            ", ".join(parts)
    return ", ".join(parts) if parts else "none"


def _evidence(d: dict) -> str:
    return ", ".join(f"{k}={value(k, v)}" for k, v in d.items())


def _no_findings(rep: dict) -> str:
    if _is_dumps(rep):
        return ("no findings: the dumps show no rank behind another in any process group; "
                "they hold no timings, so this says nothing of speed or memory")
    if rep["data_problems"]:
        return "no findings, because the rules had no data to read (see above): not an all-clear"
    if rep.get("trace_scope"):
        return ("no findings in what the traces show (steps, collectives, ranks); they show no "
                "per-unit detail (see Profiler traces below)")
    if rep.get("waiting"):
        return (f"no findings from the rules that ran; {', '.join(rep['waiting']['rules'])} "
                "were not evaluated (see above): not an all-clear")
    pu = rep["window"].get("per_unit") or {}
    if pu.get("sampled") and pu.get("detail_steps") and \
            pu.get("before_window") == pu.get("detail_steps"):
        # no sample inside the window: its per-unit rules read older steps (issue 31)
        return ("no findings; the per-unit rules read sampled steps from before the window "
                "(see above), none inside it: not an all-clear for the window")
    return "no findings: nothing the rules know of is wrong"


def _waiting(rep: dict) -> str | None:
    w = rep.get("waiting")
    if not w:
        return None
    return f"{w.get('text') or ', '.join(w['rules']) + ' not evaluated'}; {w['message']}"


def _unit_title(rep: dict) -> str:
    pu = rep["window"].get("per_unit") or {}
    return "Per unit (per step, mean over ranks" + \
        (f"; {pu['text']})" if pu.get("text") else ")")


def _no_units(rep: dict) -> str | None:
    pu = rep["window"].get("per_unit") or {}
    if pu.get("sampled") and not pu.get("detail_steps"):
        return f"no per-unit numbers yet: {pu.get('next') or 'no sampled step yet'}"
    return None


def render_text(rep: dict) -> str:
    lines = _header(rep)
    if rep["data_problems"]:
        lines += ["", "NO DATA: this report cannot vouch for the run"]
        for p in rep["data_problems"]:
            lines.append(f"  - {p['message']}")
            if p["fix"]:
                lines.append(f"    fix: {p['fix']}")
    if rep.get("log_notes"):
        lines += ["", "Dumps" if _is_dumps(rep) else "Run log"] + \
            [f"  - {n}" for n in rep["log_notes"]]
    lines += ["", f"Findings: {_summary(rep)}"]
    if _waiting(rep):
        lines.append(f"  {_waiting(rep)}")
    for f in rep["findings"]:
        lines.append(f"  {f['severity'].upper():8} {f['code']} {f['name']}: {f['title']}")
        lines.append(f"           evidence: {_evidence(f['evidence'])}")
        lines.append(f"           threshold: {_evidence(f['threshold'])}")
        if f["explained_by"]:
            lines.append(f"           explained by: {', '.join(f['explained_by'])}")
        lines.append(f"           fix: {f['fix']}")
        if f["predicted"]:
            lines.append(f"           predicted: {f['predicted']}")
        if f.get("history"):
            lines.append(f"           history: {f['history']['text']}")
        lines.append(f"           docs: {f['doc']}")
    if not rep["findings"]:
        lines.append(f"  {_no_findings(rep)}")
    if _is_dumps(rep):
        return "\n".join(lines + ["", DUMPS_TEXT[0].upper() + DUMPS_TEXT[1:] + "."]) + "\n"
    lines += ["", _unit_title(rep)]
    if _no_units(rep):
        lines.append(f"  {_no_units(rep)}")
    else:
        lines += ["  " + x for x in table(*_unit_table(rep))]
    lines += ["", "Step breakdown (per step)"]
    lines += ["  " + x for x in table(STEP_HEAD, [_step_cells(s) for s in rep["steps"]])]
    lines += ["  " + x for x in _breakdown_notes(rep)]
    lines += _trace_lines(rep)
    return "\n".join(lines) + "\n"


def exposed_text(e: dict | None) -> str | None:
    """'exposed comm per step: 61.7 ms mean over ranks, 62.7 ms worst rank (all
    collectives); 58 ms link-attributable (...): over ...' — each definition named beside its
    number (zerodoc.measures); None before any rank measured it."""
    if not e or e.get("mean_over_ranks") is None:
        return None
    d = e["definitions"]
    out = (f"exposed comm per step: {secs(e['mean_over_ranks'])} mean over ranks, "
           f"{secs(e['worst_rank'])} worst rank ({d['mean_over_ranks'].split(',')[0]})")
    if e.get("link_attributable") is not None:
        out += (f"; {secs(e['link_attributable'])} {d['link_attributable']} (per unit the rank "
                f"that waited least: what ZD006 grades and compare observes)")
    return out + f"; over {e['covers']}"


def _breakdown_notes(rep: dict) -> list[str]:
    out = [exposed_text(rep.get("exposed_comm"))]
    b = rep.get("breakdown_steps")
    if b:
        out.append(b["text"])
    return [x for x in out if x]


def _trace_lines(rep: dict) -> list[str]:
    """Profiler traces: what they let zerodoc say, and the device time read."""
    from .trace.scope import text

    return text(rep.get("trace_scope"), rep.get("device") or [], secs, table)


def _md_row(cells) -> str:
    return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"


def render_markdown(rep: dict) -> str:
    head = _header(rep)
    lines = [f"# {head[0]}", "", *[f"{x}  " for x in head[1:]], ""]
    if rep["data_problems"]:
        lines += ["## No data: this report cannot vouch for the run", ""]
        lines += [f"- {p['message']}" + (f" (fix: {p['fix']})" if p["fix"] else "")
                  for p in rep["data_problems"]]
        lines.append("")
    if rep.get("log_notes"):
        lines += ["## Dumps" if _is_dumps(rep) else "## Run log", ""] + \
            [f"- {n}" for n in rep["log_notes"]] + [""]
    lines += [f"## Findings ({_summary(rep)})", ""]
    if _waiting(rep):
        lines += [_waiting(rep)[0].upper() + _waiting(rep)[1:] + ".", ""]
    for f in rep["findings"]:
        lines.append(f"### {f['severity'].upper()} {f['code']} `{f['name']}`: {f['title']}")
        lines.append("")
        lines.append(f"- **evidence**: {_evidence(f['evidence'])}")
        lines.append(f"- **threshold**: {_evidence(f['threshold'])}")
        if f["explained_by"]:
            lines.append(f"- **explained by**: {', '.join(f['explained_by'])}")
        lines.append(f"- **fix**: {f['fix']}")
        if f["predicted"]:
            lines.append(f"- **predicted**: {f['predicted']}")
        if f.get("history"):
            lines.append(f"- **history**: {f['history']['text']}")
        lines.append(f"- **docs**: [{f['doc']}]({f['doc']})")
        lines.append("")
    if not rep["findings"]:
        lines += [_no_findings(rep)[0].upper() + _no_findings(rep)[1:] + ".", ""]
    if _is_dumps(rep):
        return "\n".join(lines + [DUMPS_TEXT[0].upper() + DUMPS_TEXT[1:] + "."]) + "\n"
    lines += [f"## {_unit_title(rep)}", ""]
    if _no_units(rep):
        lines += [_no_units(rep)[0].upper() + _no_units(rep)[1:] + "."]
    else:
        head, rows = _unit_table(rep)
        lines += [_md_row(head), _md_row(["---"] * len(head))]
        lines += [_md_row(r) for r in rows]
    lines += ["", "## Step breakdown (per step)", "", _md_row(STEP_HEAD),
              _md_row(["---"] * len(STEP_HEAD))]
    lines += [_md_row(_step_cells(s)) for s in rep["steps"]]
    lines += ["", *[f"{x}  " for x in _breakdown_notes(rep)]] if _breakdown_notes(rep) else []
    extra = _trace_lines(rep)
    if extra:
        lines += ["", "## Profiler traces", "", "```", *extra[1:], "```"]
    return "\n".join(lines) + "\n"


RENDERERS = {"text": render_text, "markdown": render_markdown, "json": render_json}

__all__ = ["SCHEMA", "build_report", "render_text", "render_markdown", "render_json",
           "RENDERERS", "finding_dict", "unit_rows", "step_rows"]
