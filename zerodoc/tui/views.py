"""View models: a `Frame` turned into the rows and lines each screen shows.

Plain Python (no Textual), so the numbers on screen are testable without a terminal. This
selects, aggregates across ranks (mean / worst / one rank), sorts and formats; it does not
diagnose — findings come from the rules engine, and thresholds only pick a colour.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from ..measures import EXPOSED_ALL, exposed_per_step
from ..windowsamples import next_sample, run_coverage, run_warmup, samples
from ..thresholds import DEFAULT as T
from .. import humanize as fmt
from .feed import Frame, UnitTotals

MEAN, WORST = "mean", "worst"
Scope = str | int  # MEAN, WORST or a rank


def scope_label(scope: Scope, frame: Frame | None = None) -> str:
    if scope == MEAN:
        n = len(scope_ranks(frame, scope)) if frame else 0
        return f"mean of {n} rank{'s' if n != 1 else ''}" if frame else "mean over ranks"
    if scope == WORST:
        return "worst rank per column"
    return f"rank {scope}"


def scope_ranks(frame: Frame, scope: Scope) -> list[int]:
    """The ranks a view aggregates: one rank, or the fresh ones that have finished a step."""
    if isinstance(scope, int):
        return [scope] if scope in frame.snapshot.ranks else []
    fresh = frame.fresh_ranks
    return [r for r in fresh if frame.snapshot.ranks[r].steps] or fresh


def _agg(values: list[float], scope: Scope, worst: str = "max") -> float | None:
    values = [v for v in values if v is not None]
    if not values:
        return None
    if scope == WORST:
        return max(values) if worst == "max" else min(values)
    if scope == MEAN:
        return sum(values) / len(values)
    return values[0]


# --------------------------------------------------------------------------------------
# tables


@dataclass(frozen=True)
class Column:
    key: str
    label: str
    numeric: bool = True
    worst: str = "max"  # which end is bad: "max" or "min" (sort default puts it first)
    sortable: bool = True


@dataclass(frozen=True)
class Table:
    columns: tuple[Column, ...]
    rows: tuple[tuple[str, tuple[str, ...]], ...]  # (row key, cells)
    caption: str = ""

    def cell(self, row_key: str, column_key: str) -> str:
        i = [c.key for c in self.columns].index(column_key)
        for k, cells in self.rows:
            if k == row_key:
                return cells[i]
        raise KeyError(row_key)


def _sorted(rows: list[tuple[str, tuple[str, ...], dict]], col: Column, reverse: bool):
    """Worst first by default; text columns A→Z; missing values last either way."""
    def key(row):
        v = row[2].get(col.key)
        return v is None, v

    present = [r for r in rows if r[2].get(col.key) is not None]
    missing = [r for r in rows if r[2].get(col.key) is None]
    desc = (col.numeric and col.worst == "max") != reverse
    present.sort(key=key, reverse=desc)
    return present + missing


UNIT_COLUMNS = (
    Column("unit", "Unit", numeric=False),
    Column("params", "Params"),
    Column("ag_mb", "AG MB"),
    Column("ag_ms", "AG ms"),
    Column("exposed_ms", "Exposed ms"),
    Column("exposed_pct", "Exp %"),
    Column("busbw", "busbw", worst="min"),  # labelled per cell: MB/s on CPU, GB/s on GPUs
    Column("compute_ms", "Compute ms"),
    Column("rs_ms", "RS ms"),
    Column("reshard", "Reshard", numeric=False, sortable=False),
)
# All-reduce (DDP's gradient buckets, ZeRO-1/2, FSDP1 NO_SHARD): shown, after "RS ms", only
# when some unit all-reduces, so that an FSDP table keeps its columns
AR_COLUMNS = (Column("ar_ms", "AR ms"), Column("ar_exposed_ms", "AR exp ms"))
UNIT_SORTS = ("exposed_ms", "ag_ms", "ag_mb", "busbw", "compute_ms", "exposed_pct", "rs_ms",
              "ar_ms", "ar_exposed_ms", "unit", "params")
_UNIT_FIELDS = ("ag_bytes", "ag_seconds", "ag_exposed_seconds", "ag_exposed_fraction",
                "ag_busbw", "compute_seconds", "rs_seconds", "ar_seconds", "ar_exposed_seconds")


def unit_values(frame: Frame, scope: Scope) -> dict[str, dict[str, float | None]]:
    """Per unit: the numbers of the unit table in base units, aggregated over `scope`
    (mean / worst over ranks from `zerodoc.unitstats`, computed once per frame)."""
    ranks = scope_ranks(frame, scope)
    if ranks and samples(frame.snapshot, ranks) == 0:  # no sampled step yet: not measured
        names = [u.name for u in frame.snapshot.ranks[ranks[0]].facts.units]
        return {n: dict.fromkeys(_UNIT_FIELDS) for n in names}
    if isinstance(scope, int):
        return _rank_unit_values(frame, ranks)
    if not ranks:
        return {}
    from ..measures import unit_busbw
    from ..unitstats import unit_stats

    stats = unit_stats(frame.snapshot, ranks)
    how = "mean" if scope == MEAN else "max"
    facts = frame.snapshot.ranks[ranks[0]].facts
    groups, world = {u.name: u.group_size for u in facts.units}, facts.world_size
    out = {}
    for name in stats.order:
        st = stats.units.get(name, {})

        def agg(f: str, worst: str = "max") -> float | None:
            s = st.get(f)
            if s is None or s.n == 0:
                return None
            return s.get("min" if how == "max" and worst == "min" else how)

        out[name] = {
            "ag_bytes": agg("ag_bytes"), "ag_seconds": agg("ag_seconds"),
            "ag_exposed_seconds": agg("ag_exposed_seconds"),
            "ag_exposed_fraction": agg("ag_exposed_fraction"),
            "ag_busbw": unit_busbw(stats, name, groups.get(name, world),
                                   "min" if how == "max" else "mean"),
            "compute_seconds": agg("compute_seconds"), "rs_seconds": agg("rs_seconds"),
            "ar_seconds": agg("ar_seconds"), "ar_exposed_seconds": agg("ar_exposed_seconds"),
        }
    return out


def _rank_unit_values(frame: Frame, ranks: list[int]) -> dict[str, dict[str, float | None]]:
    """One rank's own per-unit numbers."""
    out = {}
    for r in ranks:
        names = [u.name for u in frame.snapshot.ranks[r].facts.units]
        totals = frame.units.get(r, {})
        names += [n for n in totals if n not in names]
        empty = UnitTotals()
        for name in names:
            t = totals.get(name, empty)
            out[name] = {
                "ag_bytes": t.ag_bytes, "ag_seconds": t.ag_seconds,
                "ag_exposed_seconds": t.ag_exposed_seconds,
                "ag_exposed_fraction": t.ag_exposed_fraction, "ag_busbw": t.ag_busbw,
                "compute_seconds": t.compute_seconds, "rs_seconds": t.rs_seconds,
                "ar_seconds": t.ar_seconds, "ar_exposed_seconds": t.ar_exposed_seconds,
            }
    return out


def unit_table(frame: Frame, scope: Scope, sort: str = "exposed_ms",
               reverse: bool = False) -> Table:
    vals = unit_values(frame, scope)
    ar = any(v.get("ar_seconds") for v in vals.values())  # some unit all-reduces
    columns = UNIT_COLUMNS[:-1] + AR_COLUMNS + UNIT_COLUMNS[-1:] if ar else UNIT_COLUMNS
    if not ar and sort in ("ar_ms", "ar_exposed_ms"):
        sort = "exposed_ms"
    facts = {}
    for r in scope_ranks(frame, scope)[:1]:
        facts = {u.name: u for u in frame.snapshot.ranks[r].facts.units}
    rows = []
    for name, v in vals.items():
        f = facts.get(name)
        reshard = "-" if f is None or f.reshard_after_forward is None else \
            ("yes" if f.reshard_after_forward else "no")
        sortv = {
            "unit": name, "params": f.params if f else None, "ag_mb": v["ag_bytes"],
            "ag_ms": v["ag_seconds"], "exposed_ms": v["ag_exposed_seconds"],
            "exposed_pct": v["ag_exposed_fraction"], "busbw": v["ag_busbw"],
            "compute_ms": v["compute_seconds"], "rs_ms": v["rs_seconds"],
            "ar_ms": v["ar_seconds"], "ar_exposed_ms": v["ar_exposed_seconds"],
        }
        cells = (
            name or "(root)", fmt.count(f.params) if f else "-", fmt.mb_num(v["ag_bytes"]),
            fmt.ms_num(v["ag_seconds"]), fmt.ms_num(v["ag_exposed_seconds"]),
            fmt.pct_num(v["ag_exposed_fraction"]), fmt.bandwidth(v["ag_busbw"]),
            fmt.ms_num(v["compute_seconds"]), fmt.ms_num(v["rs_seconds"]),
            *((fmt.ms_num(v["ar_seconds"]), fmt.ms_num(v["ar_exposed_seconds"])) if ar else ()),
            reshard,
        )
        rows.append((name, cells, sortv))
    col = next(c for c in columns if c.key == sort)
    rows = _sorted(rows, col, reverse)
    n = len(frame.snapshot.ranks)
    cap = (f"{len(rows)} units · {scope_label(scope, frame)} of {n} · per step over the last "
           f"{_window_text(frame)}{_sampled_text(frame, scope)} · sorted by {col.label} "
           f"{_arrow(col, reverse)}")
    return Table(_mark(columns, col, reverse), tuple((k, c) for k, c, _ in rows), cap)


def _sampled_text(frame: Frame, scope: Scope) -> str:
    """' · per-unit: 3 sampled steps of 20' where per-unit numbers come from sampled steps
    ('' when every step has them); before the first sample, when the next is due."""
    ranks = scope_ranks(frame, scope)
    text = run_coverage(frame.snapshot, ranks)
    if text is None:
        return ""
    if samples(frame.snapshot, ranks) == 0:
        return f" · {next_sample(frame.snapshot)}"
    return f" · {text}"


RANK_COLUMNS = (
    Column("rank", "Rank", worst="min"),
    Column("node", "Node", numeric=False),
    Column("state", "State", numeric=False, sortable=False),
    Column("last_step", "Last step", worst="min"),
    Column("step_ms", "Step ms"),
    Column("compute_ms", "Compute ms"),
    Column("exposed_ms", "Exposed ms"),
    Column("exposed_pct", "Exp %"),
    Column("ratio", "Comm/comp"),
    Column("vs_median", "Comp÷median"),
    Column("headroom", "Headroom GB", worst="min"),
)
RANK_SORTS = ("rank", "step_ms", "compute_ms", "exposed_ms", "exposed_pct", "ratio",
              "vs_median", "headroom", "last_step")


def recorded_trace(frame: Frame) -> bool:
    """The frame comes from profiler traces (zerodoc/trace): a recording, not a live run."""
    return any(w.facts.config.get("source") == "profiler trace"
               for w in frame.snapshot.ranks.values())


def rank_state(frame: Frame, r: int) -> str:
    if r in frame.stale:
        return "STALE"
    if r in frame.ended:
        return "ended"
    return "live"


RANK_ROWS = 256  # the rank table shows at most this many rows (the first by its sort)


def _rank_cells(frame: Frame, r: int, w, sortv: dict) -> tuple[str, ...]:
    n, head = w.steps, sortv["headroom"]
    state = rank_state(frame, r)
    if r in frame.stale and w.updated_unix and frame.fetched_unix > w.updated_unix:
        state += f" {fmt.duration(frame.fetched_unix - w.updated_unix)}"  # since its step
    return (
        str(r), w.facts.node or "-", state, str(w.last_step) if n else "-",
        fmt.ms_num(sortv["step_ms"]), fmt.ms_num(sortv["compute_ms"]),
        fmt.ms_num(sortv["exposed_ms"]), fmt.pct_num(sortv["exposed_pct"]),
        fmt.num(sortv["ratio"]), fmt.num(sortv["vs_median"]),
        fmt.gb_num(head),
    )


def rank_table(frame: Frame, sort: str = "rank", reverse: bool = False) -> Table:
    snap = frame.snapshot
    comp = {r: w.compute_seconds / w.steps for r, w in snap.ranks.items()
            if w.steps and w.unit_detail}
    fresh = [comp[r] for r in frame.fresh_ranks if r in comp]
    med = statistics.median(fresh) if fresh else 0.0
    rows = []
    for r, w in snap.ranks.items():
        n = w.steps
        head = w.memory.get("headroom")
        sortv = {
            "rank": r, "node": w.facts.node, "last_step": w.last_step if n else None,
            "step_ms": w.mean_step_seconds if n else None,
            "compute_ms": comp.get(r),
            "exposed_ms": exposed_per_step(w),
            "exposed_pct": w.exposed_fraction if n and w.unit_detail else None,
            "ratio": w.comm_compute_ratio if n and w.unit_detail else None,
            "vs_median": comp[r] / med if r in comp and med > 0 else None,
            "headroom": head,
        }
        rows.append((str(r), w, sortv))
    col = next(c for c in RANK_COLUMNS if c.key == sort)
    rows = _sorted(rows, col, reverse)
    total = len(rows)
    rows = [(k, _rank_cells(frame, int(k), w, v), v)  # formatted: only the rows shown
            for k, w, v in rows[:RANK_ROWS]]  # a thousand rows are not read: the first are
    shown = f"the first {len(rows)} of {total} by this sort; " if total > len(rows) else ""
    stale = len(frame.stale)
    cap = (f"{shown}{total} ranks{f', {stale} stale' if stale else ''} · per step over the last "
           f"{_window_text(frame)}{_sampled_text(frame, MEAN)} · sorted by {col.label} {_arrow(col, reverse)} · "
           f"enter: show this rank in Units")
    return Table(_mark(RANK_COLUMNS, col, reverse), tuple((k, c) for k, c, _ in rows), cap)


FINDING_COLUMNS = (
    Column("severity", "Severity", numeric=False),
    Column("code", "Code", numeric=False),
    Column("title", "Finding", numeric=False),
    Column("where", "Where", numeric=False),
)


def _where(f) -> str:
    parts = []
    if f.units:
        parts.append(", ".join(u or "(root)" for u in f.units[:3])
                     + (f" +{len(f.units) - 3}" if len(f.units) > 3 else ""))
    if f.ranks:
        parts.append("rank " + ",".join(str(r) for r in f.ranks[:4])
                     + (f" +{len(f.ranks) - 4}" if len(f.ranks) > 4 else ""))
    return " · ".join(parts) or "run"


def samples_before_only(frame: Frame) -> str | None:
    """'sampled steps 12, 23, 30 from before the window' when every per-unit figure of the
    fresh ranks comes from before the window (none inside it), else None."""
    from ..windowsamples import sample_steps, step_list

    ws = [frame.snapshot.ranks[r] for r in frame.fresh_ranks if frame.snapshot.ranks[r].steps]
    if not ws or not all(w.sampled and w.per_unit_steps and w.detail_before == w.per_unit_steps
                         for w in ws):
        return None
    got = sample_steps(ws[0])
    return f"sampled steps {step_list(s for s, _ in got)} from before the window" if got \
        else "sampled steps from before the window"


def not_evaluated_text(waiting: dict) -> str:
    """'not evaluated: 0 sampled steps in the window ...; ZD010 needs 3; per-unit detail about
    every 8 steps: next sample in about 5 steps' (`zerodoc.diagnosis.waiting`), where the
    Findings and the Overview would show findings."""
    what = waiting.get("text") or f"{', '.join(waiting['rules'])} not evaluated"
    return f"{what}; {waiting['message']}"


def finding_key(i: int, f) -> str:
    return f"{i}:{f.code}"


def finding_table(frame: Frame) -> Table:
    rows = tuple((finding_key(i, f), (f.severity.name, f.code, f.title, _where(f)))
                 for i, f in enumerate(frame.findings))
    cap = f"{len(rows)} finding{'s' if len(rows) != 1 else ''}, most severe first"
    return Table(FINDING_COLUMNS, rows, cap)


# Evidence a threshold grades where the names differ (threshold stem -> evidence key); any
# other threshold `X_warn` / `X_crit` grades the evidence `X` or `..._X`.
GRADED_ALIASES = {"ZD010": {"straggler_ratio": ("compute_ratio",),
                            "exposed_fraction": ("peer_wait_fraction",)},
                  "ZD005": {"exposed_fraction": ("exposed_beyond_link_fraction",)},
                  # graded on the avoidable part (docs/rules.md, "avoidable"), shown beside
                  # the exposed fraction it is part of
                  "ZD004": {"exposed_fraction": ("all_gather_exposed_fraction",
                                                 "all_gather_avoidable_fraction")},
                  "ZD003": {"exposed_fraction": ("all_gather_avoidable_fraction",)}}


def graded_on(f) -> str | None:
    """The figures a finding's severity was graded on, beside their thresholds, as the TUI
    shows them next to the severity: 'comm compute ratio 1.17, avoidable comm compute ratio
    0.42; threshold warn 0.5, crit 1.0'. None: no threshold names an evidence figure."""
    alias = GRADED_ALIASES.get(f.code, {})
    stems: dict[str, list[str]] = {}
    for k in f.threshold:
        stem = k.removesuffix("_warn").removesuffix("_crit")
        if stem != k:
            stems.setdefault(stem, []).append(k)
    parts = []
    for stem, keys in stems.items():
        figs = [(ek, ev) for ek, ev in f.evidence.items()
                if isinstance(ev, (int, float)) and not isinstance(ev, bool)
                and (ek in alias.get(stem, ()) or ek == stem or ek.endswith("_" + stem))]
        if not figs:
            continue
        lim = ", ".join(f"{k.rsplit('_', 1)[1]} {fmt.evidence_value(k, f.threshold[k])}"
                        for k in keys)
        shown = ", ".join(f"{fmt.label(ek)} {fmt.evidence_value(ek, ev)}" for ek, ev in figs)
        parts.append(f"{shown}; threshold {lim}")
    return " · ".join(parts) or None


def severity_text(f) -> str:
    """'WARNING (compute ratio 1.30; threshold warn 1.25)': the severity with the figure it
    was graded on (issue 31), or the bare severity."""
    g = graded_on(f)
    return f"{f.severity.name} ({g})" if g else f.severity.name


def finding_detail(f) -> list[tuple[str, str]]:
    """(label, text) lines: what, evidence, threshold, fix, predicted effect, the what-if of
    the fix from the step model (rules ZD002-ZD005, `extra["whatif"]`)."""
    lines = [("", f"{severity_text(f)} {f.code} {f.name}"), ("", f.title)]
    for k, v in f.evidence.items():
        lines.append(("evidence", f"{fmt.label(k)} = {fmt.evidence_value(k, v)}"))
    for k, v in f.threshold.items():
        lines.append(("threshold", f"{fmt.label(k)} = {fmt.evidence_value(k, v)}"))
    lines.append(("fix", f.fix))
    whatif = f.extra.get("whatif") if isinstance(f.extra, dict) else None
    predicted = f.predicted
    if whatif and predicted:  # the model's answer on a line of its own
        predicted = predicted.replace(f"; {whatif}", "").replace(whatif, "").strip("; ")
    if predicted:
        lines.append(("predicted", predicted))
    if whatif:
        lines.append(("what-if", whatif.removeprefix("what-if ")))
    hist = f.extra.get("history") if isinstance(f.extra, dict) else None
    if hist:
        lines.append(("history", hist["text"]))
    if f.units or f.ranks:
        lines.append(("where", _where(f)))
    if f.doc:
        lines.append(("docs", f.doc))
    return lines


def live_banner(frame: Frame | None, now: float | None = None) -> str | None:
    """'LIVE: still being written (step 37, last write 2 s ago)' (`zerodoc.measures`) for the
    title of every view, None for a finished run or a recorded trace."""
    if frame is None or not frame.snapshot.ranks or recorded_trace(frame):
        return None
    from ..measures import live_text

    return live_text(frame.snapshot, now)


def stopped_banner(frame: Frame | None) -> str | None:
    """The stopped-run finding (ZD013) as one line for the top of every view, or None."""
    if frame is None:
        return None
    f = next((x for x in frame.findings if x.code == "ZD013"), None)
    return f"STOPPED: {f.title}" if f is not None else None


def _mark(columns: tuple[Column, ...], sort: Column, reverse: bool) -> tuple[Column, ...]:
    """The columns with the sort arrow on the sorted one's label."""
    return tuple(Column(c.key, f"{c.label} {_arrow(c, reverse)}", c.numeric, c.worst, c.sortable)
                 if c.key == sort.key else c for c in columns)


def _arrow(col: Column, reverse: bool) -> str:
    desc = (col.numeric and col.worst == "max") != reverse
    return "▼" if desc else "▲"


def _window_text(frame: Frame) -> str:
    steps = [w.steps for w in frame.snapshot.ranks.values() if w.steps]
    n = max(steps) if steps else 0
    warm = run_warmup(frame.snapshot, short=True)
    return f"{n} step{'s' if n != 1 else ''}" + (f" ({warm})" if warm else "")


# --------------------------------------------------------------------------------------
# overview


TRACE_DEVICE_ROWS = 8  # ranks of the device-time table the overview shows


def trace_scope(frame: Frame) -> dict | None:
    """Profiler traces without sharded units: what zerodoc can and cannot say from them (the
    report's `trace_scope`); None for every other source."""
    from ..trace.scope import scope

    return scope(frame.snapshot) if frame.snapshot.ranks else None


def trace_lines(frame: Frame) -> list[str]:
    """Profiler traces: what they let zerodoc say and the device time read, the lines
    `zerodoc report` prints under its step breakdown ([] for every other source)."""
    from ..trace.scope import device_rows, is_trace, text

    snap = frame.snapshot
    if not snap.ranks or not is_trace(snap):
        return []
    rows = device_rows(snap)
    lines = text(trace_scope(frame), rows[:TRACE_DEVICE_ROWS], fmt.secs, fmt.table)
    while lines and not lines[0]:
        lines.pop(0)
    if len(rows) > TRACE_DEVICE_ROWS:  # the overview does not scroll: the rest in the report
        lines.append(f"  ... and {len(rows) - TRACE_DEVICE_ROWS} more ranks: `zerodoc report` "
                     f"lists every rank")
    return lines


@dataclass(frozen=True)
class Headline:
    label: str
    value: str
    detail: str
    level: str = ""  # "", "ok", "warn", "crit"


def _level(v: float | None, warn: float, crit: float | None = None, low_bad=False) -> str:
    if v is None:
        return ""
    if low_bad:
        return "crit" if crit is not None and v < crit else "warn" if v < warn else "ok"
    return "crit" if crit is not None and v >= crit else "warn" if v >= warn else "ok"


def headlines(frame: Frame, scope: Scope) -> list[Headline]:
    snap = frame.snapshot
    ranks = [r for r in scope_ranks(frame, scope) if snap.ranks[r].steps]
    out: list[Headline] = []
    if not ranks:
        why = ("the run ended without a completed step" if frame.run_ended
               else "waiting for the first step")
        return [Headline("Step time", "-", why)]
    ws = {r: snap.ranks[r] for r in ranks}
    slowest = max(ranks, key=lambda r: ws[r].mean_step_seconds)
    step = _agg([ws[r].mean_step_seconds for r in ranks], scope)
    last = _agg([ws[r].last_step_seconds for r in ranks], scope)
    who = f"rank {slowest} slowest" if len(ranks) > 1 else f"rank {slowest}"
    out.append(Headline("Step time", fmt.duration(step),
                        f"{who} · last {fmt.duration(last)} · mean of {_window_text(frame)}"))
    measured = [r for r in ranks if ws[r].unit_detail]
    if not measured:  # sampled steps only, none yet: say when, never 0 %
        due = next_sample(snap)
        out += [Headline("Exposed comm", "-", due), Headline("Comm/compute", "-", due),
                Headline("Worst unit", "-", due)]
        out.append(_worst_rank(frame))
        out.append(_headroom(frame, scope))
        return out
    sampled = _sampled_text(frame, scope)
    ef = _agg([ws[r].exposed_fraction for r in measured], scope)
    ex = _agg([exposed_per_step(ws[r]) for r in measured], scope)
    # the definition beside the number: all collectives (the report's step breakdown), not
    # ZD006's link-attributable part (zerodoc.measures)
    how = {MEAN: "mean over ranks", WORST: "worst rank"}.get(scope, f"rank {scope}")
    out.append(Headline("Exposed comm", fmt.percent(ef),
                        f"of step time · {fmt.duration(ex)}/step the compute waited "
                        f"({EXPOSED_ALL}, {how}){sampled}",
                        _level(ef, T.exposed_fraction_warn, T.exposed_fraction_crit)))
    ratio = _agg([ws[r].comm_compute_ratio for r in measured], scope)
    comp = _agg([ws[r].compute_seconds / ws[r].steps for r in measured], scope)
    bound = "comm-bound" if ratio is not None and ratio >= T.comm_compute_ratio_warn \
        else "compute-bound"
    if not isinstance(scope, int) and frame.diagnose_error is None:
        # the whole run: the label is the rules' (ZD006), so "comm-bound" always has a
        # finding beside it and a number just past the line without one does not
        z6 = next((f for f in frame.findings if f.code == "ZD006"), None)
        bound = f"comm-bound ({z6.code})" if z6 is not None else "compute-bound"
    out.append(Headline("Comm/compute", fmt.num(ratio),
                        f"exposed comm ÷ compute ({fmt.duration(comp)}/step) · {bound}",
                        _level(ratio, T.comm_compute_ratio_warn, T.comm_compute_ratio_crit)))
    uv = unit_values(frame, scope)
    timed = [(n, v) for n, v in uv.items() if v["ag_exposed_seconds"]]
    if timed:
        name, v = max(timed, key=lambda kv: kv[1]["ag_exposed_seconds"])
        out.append(Headline(
            "Worst unit", name or "(root)",
            f"{fmt.duration(v['ag_exposed_seconds'])}/step exposed all-gather · "
            f"{fmt.percent(v['ag_exposed_fraction'])} of its {fmt.duration(v['ag_seconds'])} · "
            f"busbw {fmt.bandwidth(v['ag_busbw'])}",
            _level(v["ag_exposed_fraction"], T.unit_exposed_ratio_warn)))
    else:
        out.append(Headline("Worst unit", "-", "no all-gather timed"))
    out.append(_worst_rank(frame))
    out.append(_headroom(frame, scope))
    return out


def _worst_rank(frame: Frame) -> Headline:
    snap = frame.snapshot
    comp = {r: snap.ranks[r].compute_seconds / snap.ranks[r].steps
            for r in frame.fresh_ranks if snap.ranks[r].steps and snap.ranks[r].unit_detail}
    slow = None
    if comp:
        r = max(comp, key=comp.get)
        med = statistics.median(comp.values())
        slow = r, (comp[r] / med if med > 0 else None)
    if frame.stale:  # a rank that stopped outranks a slow one
        r = min(frame.stale)
        more = f" (+{len(frame.stale) - 1} more)" if len(frame.stale) > 1 else ""
        detail = f"{frame.stale[r]}{more}"
        if slow is not None and slow[0] not in frame.stale:
            detail += f" · slowest live: rank {slow[0]}, compute {fmt.num(slow[1])}× median"
        return Headline("Worst rank", f"rank {r} STALE", detail, "crit")
    if slow is None:
        steps = any(snap.ranks[r].steps for r in frame.fresh_ranks)
        return Headline("Worst rank", "-", next_sample(snap) if steps else "no steps yet")
    r, ratio = slow
    w = snap.ranks[r]
    return Headline("Worst rank", f"rank {r}",
                    f"compute {fmt.num(ratio)}× the median rank · step "
                    f"{fmt.duration(w.mean_step_seconds)} · exposed {fmt.percent(w.exposed_fraction)}",
                    _level(ratio, T.straggler_ratio_warn))


def _headroom(frame: Frame, scope: Scope) -> Headline:
    per = headroom_per_rank(frame)
    ranks = set(scope_ranks(frame, scope))
    known = [h for h in per if h[0] in ranks and h[1] is not None]
    if not known:
        return Headline("Headroom", "-", "not reported by this source")
    r, head, cap, frac = min(known, key=lambda h: h[1])
    detail = f"lowest: rank {r}" + (f" · {fmt.percent(frac)} of {fmt.size(cap)}" if cap else "")
    return Headline("Headroom", fmt.size(head), detail,
                    _level(frac, T.headroom_fraction_warn, T.headroom_fraction_crit,
                           low_bad=True))


def headroom_per_rank(frame: Frame) -> list[tuple[int, int | None, int | None, float | None]]:
    """(rank, headroom bytes, capacity bytes, headroom / capacity) for every rank."""
    out = []
    for r, w in frame.snapshot.ranks.items():
        head = w.memory.get("headroom")
        cap = w.memory.get("capacity") or w.facts.device_capacity_bytes
        out.append((r, head, cap, head / cap if head is not None and cap else None))
    return out


SPARK_BARS = "▁▂▃▄▅▆▇█"


def spark_cells(values: list[float | None], width: int) -> str:
    """A sparkline as text, one cell per step (more steps than cells: consecutive steps
    share a cell, their largest value), newest at the right. A step without a value (an
    unsampled step's exposed comm or compute) is a blank cell: a gap, never the previous
    sample repeated (issue 31); a cell of steps none of which has one is blank too."""
    width = max(1, width)
    n = len(values)
    if n == 0:
        return ""
    per = -(-n // width)  # steps per cell
    cells = []
    start = n - per * (-(-n // per))  # the oldest cell may hold fewer steps
    for i in range(start, n, per):
        got = [v for v in values[max(0, i):i + per] if v is not None]
        cells.append(max(got) if got else None)
    got = [v for v in cells if v is not None]
    lo, hi = (min(got), max(got)) if got else (0.0, 0.0)
    top = len(SPARK_BARS) - 1

    def bar(v: float) -> str:  # scaled from the smallest to the largest, as Sparkline did
        return SPARK_BARS[round((v - lo) / (hi - lo) * top) if hi > lo else top // 2]

    return "".join(" " if v is None else bar(v) for v in cells)


def sparkline_series(frame: Frame, scope: Scope) -> dict[str, list[float]]:
    """Per step, oldest first: step time, exposed comm and compute, aggregated over scope
    (numpy over every rank's points at once: a thousand ranks x 120 steps)."""
    import numpy as np

    ranks = scope_ranks(frame, scope)
    series = [s for s in (frame.history.get(r) for r in ranks) if s is not None and s.steps]
    out: dict[str, list[float]] = {"step": [], "exposed": [], "compute": []}
    if not series:
        return out
    steps = np.concatenate([np.asarray(s.steps, np.int64) for s in series])
    vals = np.concatenate([np.array((s.step_seconds, s.exposed_seconds, s.compute_seconds),
                                    np.float64).T for s in series])
    order = np.argsort(steps, kind="stable")
    steps, vals = steps[order], vals[order]
    uniq, first = np.unique(steps, return_index=True)
    # NaN: not measured (exposed / compute of an unsampled step): left out, a gap if all are
    seen = ~np.isnan(vals)
    if scope == MEAN:
        with np.errstate(invalid="ignore", divide="ignore"):
            agg = np.add.reduceat(np.where(seen, vals, 0.0), first, axis=0) / \
                np.add.reduceat(seen.astype(np.float64), first, axis=0)
    elif scope == WORST:
        agg = np.fmax.reduceat(vals, first, axis=0)
    else:  # one rank: its own points
        agg = vals[first]
    out["step"], out["exposed"], out["compute"] = (
        [None if x != x else x for x in agg[:, i].tolist()] for i in range(3))
    return out
