"""Text, Markdown and JSON renderings of a `zerodoc compare` document (`compare.compare`).

Numbers stay in base units in the document; only these renderers convert them for people.
"""

from __future__ import annotations

import json

from ..humanize import pct, secs, table, value

LABELS = {
    "step_seconds": "step time",
    "compute_seconds_per_step": "compute / step",
    "exposed_comm_seconds_per_step": "exposed comm / step",
    "comm_compute_ratio": "exposed comm / compute",
    "all_gather_seconds_per_step": "all-gather time / step",
    "all_gather_exposed_seconds_per_step": "all-gather exposed / step",
    "backward_all_gather_exposed_seconds_per_step": "backward all-gather exposed / step",
    "reduce_scatter_seconds_per_step": "reduce-scatter time / step",
    "all_gathers_per_step": "all-gathers / step",
    "all_gather_bytes_per_step": "all-gather bytes / step",
    "backward_all_gather_bytes_per_step": "backward all-gather bytes / step",
    "median_all_gather_bytes": "median all-gather size",
    "large_collective_busbw_bytes_per_second": "busbw (large collectives)",
    "units": "sharded units",
    "largest_unit_param_fraction": "largest unit's share",
    "largest_unit_gather_bytes": "largest unit gathered",
    "peak_memory_bytes": "peak memory (worst rank)",
    "min_headroom_fraction": "headroom (worst rank)",
    "fragmentation_ratio": "fragmentation (worst rank)",
    "peer_wait_seconds_per_step": "peer wait / step",
    "optimizer_and_host_seconds_per_step": "optimizer + host / step",
}
# Shown in text and Markdown (JSON has every observable), plus any a judged effect names.
CORE = ("step_seconds", "compute_seconds_per_step", "exposed_comm_seconds_per_step",
        "comm_compute_ratio", "all_gather_seconds_per_step", "reduce_scatter_seconds_per_step",
        "all_gathers_per_step", "median_all_gather_bytes", "peak_memory_bytes",
        "min_headroom_fraction")


def label(metric: str) -> str:
    return LABELS.get(metric, metric.replace("_per_step", " / step").replace("_", " "))


def fmt(metric: str, v) -> str:
    return value(metric, v) if v is not None else "-"


def _fact(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def _pct_change(x) -> str:
    return "" if x is None else f"{x * 100:+.0f}%"


def _shown(doc: dict) -> list[dict]:
    named = {e["metric"] for f in doc["fixes"] for e in f["effects"]}
    return [m for m in doc["measurements"] if m["metric"] in CORE or m["metric"] in named]


def _effect_cells(e: dict) -> tuple[str, str, str, str]:
    m = e["metric"]
    pred = f"{fmt(m, e['now'])} -> {fmt(m, e['value'])}" if e["value"] is not None else \
        f"{fmt(m, e['now'])}, {e['direction']}"
    if e.get("lo") is not None and e.get("hi") is not None:
        pred += f" ({fmt(m, e['lo'])}-{fmt(m, e['hi'])})"
    obs = f"{fmt(m, e['observed_before'])} -> {fmt(m, e['observed_after'])}"
    ratio = e["ratio"]
    verdict = e["verdict"] + (" (cost)" if e["cost"] else "")
    if e.get("reason"):
        verdict += f" ({e['reason']})"
    elif ratio is not None and not e["cost"] and e["verdict"] not in ("not measurable",):
        verdict += f", {pct(ratio)} of the predicted change"
    return label(m), pred, obs, verdict


def _head(doc: dict) -> list[str]:
    def one(s):
        pu = s["window"].get("per_unit") or {}
        sampled = f"; {pu['text']}" if pu.get("text") else ""
        return (f"run {s['run_id'] or '?'} ({s['framework'] or '?'}, {s['world_size'] or '?'} "
                f"ranks, {s['window']['steps']} steps{sampled})")
    return [f"zerodoc compare: {one(doc['before'])} -> {one(doc['after'])}",
            f"before: {doc['before']['source']}{_live(doc, 'before')}",
            f"after:  {doc['after']['source']}{_live(doc, 'after')}"]


def _live(doc: dict, name: str) -> str:
    """" (LIVE: still being written, N steps so far; ...)" for a run not ended."""
    r = (doc.get("runs") or {}).get(name) or {}
    if not r.get("live"):
        return ""
    return (f"  (LIVE: still being written, {r['steps_so_far']} steps so far; its numbers "
            f"will move and the verdicts are inconclusive)")


def _noise_cell(m: dict) -> str:
    """"+/-12 ms" (measured from the runs' per-step spread) or "+/-5% floor" (not
    measured: a stated floor)."""
    if m.get("noise") is None:
        return "-"
    if m.get("noise_measured"):
        return f"+/-{fmt(m['metric'], m['noise'])}"
    frac = m["noise"] / abs(m["before"]) if m.get("before") else None
    return f"+/-{pct(frac)} floor" if frac is not None else "floor"


def _not_judged(f: dict) -> str:
    why = f" ({f['reason']})" if f.get("reason") else ""
    return f"{f['code']} {f['name']} ({'still present' if f['still_present'] else 'gone'}){why}"


def _units_line(u: dict) -> str:
    bits = [f"{len(u['kept'])} in both"]
    for k in ("removed", "added"):
        if u[k]:
            names = ", ".join(n or "(root)" for n in u[k][:6])
            more = f" +{len(u[k]) - 6} more" if len(u[k]) > 6 else ""
            bits.append(f"{len(u[k])} {k} ({names}{more})")
    return "; ".join(bits)


def _unit_rows(u: dict, n: int = 8) -> list[tuple]:
    """The units in both runs whose exposed all-gather time changed most."""
    def compute(side: dict) -> float:
        return side["compute_forward_seconds_per_step"] + side["compute_backward_seconds_per_step"]

    def pair(r: dict, get) -> str:
        return f"{secs(get(r['before']))} -> {secs(get(r['after']))}"

    key = "all_gather_exposed_seconds_per_step"
    kept = sorted(u["kept"], key=lambda r: -abs(r["after"][key] - r["before"][key]))[:n]
    return [(r["unit"] or "(root)", pair(r, lambda s: s[key]),
             pair(r, lambda s: s["all_gather_seconds_per_step"]), pair(r, compute))
            for r in kept]


def render_text(doc: dict) -> str:
    lines = _head(doc)
    changed = [c for c in doc["configuration"] if c["changed"]]
    lines += ["", "Configuration changed:" if changed else "Configuration: no fact changed"]
    lines += ["  " + x for x in table(("fact", "before", "after"),
                                       [(c["fact"], _fact(c["before"]), _fact(c["after"]))
                                        for c in changed], numbers_right=False)] if changed else []
    lines += ["", "Measurements (per step, link-attributable; a change within the runs' noise, "
              "from each run's per-step spread where measured, else a stated floor, is "
              "no change):"]
    rows = [(label(m["metric"]), fmt(m["metric"], m["before"]), fmt(m["metric"], m["after"]),
             f"{_pct_change(m['change_fraction'])} {m['judgement'] or ''}".strip(),
             _noise_cell(m))
            for m in _shown(doc)]
    lines += ["  " + x for x in table(("metric", "before", "after", "change", "noise"), rows,
                                       numbers_right=False)]
    env = (doc.get("environment") or {}).get("text")
    if env:
        lines.append(f"  Environment: {env}")
    lines += ["", f"Units: {_units_line(doc['units'])}"]
    urows = _unit_rows(doc["units"])
    if urows:
        lines += ["  " + x for x in table(("unit", "AG exposed", "AG time", "compute"), urows,
                                           numbers_right=False)]
    applied = [f for f in doc["fixes"] if f["applied"]]
    lines += ["", "Fixes applied (predicted vs observed):" if applied else
              "Fixes applied: none of BEFORE's fixes shows in AFTER's configuration "
              "(declare one with --applied CODE)"]
    for f in applied:
        lines.append(f"  {f['code']} {f['name']}: {f['verdict'].upper()} "
                     f"(applied: {f['applied']}; finding "
                     f"{'still present' if f['still_present'] else 'gone'})")
        if f.get("reason"):
            lines.append(f"    {f['reason']}")
        if f["effects"]:
            lines += ["    " + x for x in table(("effect", "predicted", "observed", "verdict"),
                                                 [_effect_cells(e) for e in f["effects"]],
                                                 numbers_right=False)]
        else:
            lines.append("    the rule states no machine-readable prediction")
    rest = [f for f in doc["fixes"] if not f["applied"]]
    if rest:
        lines += ["", "Not applied (the fix does not show in the configuration):"]
        lines += [f"  {_not_judged(f)}" for f in rest]
    fd = doc["findings"]
    lines += ["", f"Findings: resolved {', '.join(fd['resolved']) or 'none'}; new "
              f"{', '.join(fd['new']) or 'none'}; persisting {', '.join(fd['persisting']) or 'none'}"]
    return "\n".join(lines) + "\n"


def _md(cells) -> str:
    return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"


def render_markdown(doc: dict) -> str:
    head = _head(doc)
    lines = [f"## {head[0]}", "", f"- {head[1]}", f"- {head[2]}", ""]
    env = (doc.get("environment") or {}).get("text")
    applied = [f for f in doc["fixes"] if f["applied"]]
    if applied:
        lines += ["### Fixes applied: predicted vs observed", ""]
        for f in applied:
            lines += [f"**{f['code']} `{f['name']}`: {f['verdict']}** (applied: {f['applied']}; "
                      f"finding {'still present' if f['still_present'] else 'gone'})", ""]
            if f.get("reason"):
                lines += [f"_{f['reason']}_", ""]
            if f["effects"]:
                lines += [_md(("effect", "predicted", "observed", "verdict")), _md(["---"] * 4)]
                lines += [_md(_effect_cells(e)) for e in f["effects"]]
                lines.append("")
    else:
        lines += ["No fix of BEFORE's findings shows in AFTER's configuration.", ""]
    changed = [c for c in doc["configuration"] if c["changed"]]
    lines += ["### Configuration", ""]
    if changed:
        lines += [_md(("fact", "before", "after")), _md(["---"] * 3)]
        lines += [_md((f"`{c['fact']}`", _fact(c["before"]), _fact(c["after"]))) for c in changed]
    else:
        lines.append("No fact changed.")
    lines += ["", "### Measurements (per step)", "",
              _md(("metric", "before", "after", "change", "noise")), _md(["---"] * 5)]
    lines += [_md((label(m["metric"]), fmt(m["metric"], m["before"]),
                   fmt(m["metric"], m["after"]),
                   f"{_pct_change(m['change_fraction'])} {m['judgement'] or ''}".strip(),
                   _noise_cell(m)))
              for m in _shown(doc)]
    if env:
        lines += ["", f"Environment: {env}"]
    fd = doc["findings"]
    lines += ["", f"Units: {_units_line(doc['units'])}  ",
              f"Findings: resolved {', '.join(fd['resolved']) or 'none'}; new "
              f"{', '.join(fd['new']) or 'none'}; persisting "
              f"{', '.join(fd['persisting']) or 'none'}"]
    rest = [_not_judged(f) for f in doc["fixes"] if not f["applied"]]
    if rest:
        lines.append(f"  \nNot applied: {'; '.join(rest)}")
    return "\n".join(lines) + "\n"


def render_json(doc: dict) -> str:
    return json.dumps(doc, indent=2, default=str) + "\n"


RENDERERS = {"text": render_text, "markdown": render_markdown, "json": render_json}
