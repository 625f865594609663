"""The Prometheus source: a server that scrapes the ranks (for clusters), read through its
HTTP API with the work done server-side.

- **One run, selected on the server.** The runs are `count by (run_id)` of
  `zerodoc_run_info`; the one shown is `run_id` (`--run-id`) or the one whose last step is
  newest. Its series are then selected with a matcher in every query: `run_id="..."` when
  the series carry the label (the file_sd targets zerodoc writes, or a relabelled
  remote-write), else the run's `instance`s.
- **Aggregated over ranks in PromQL.** Per rank only its step-level numbers (a few series
  each; compute and exposed time from the rank's own totals over its units,
  `zerodoc_rank_compute_seconds_total` and `zerodoc_rank_collective_exposed_seconds_total`:
  5 series a rank for FSDP2 instead of its ~400 per-unit ones, issue 20 item 17; summed over the
  per-unit series with `sum by (rank)` only for ranks that do not serve them, i.e. an older
  zerodoc, or when told to with `rank_series=False`); per unit, phase
  and collective the min / median / mean / max of the per-step numbers over ranks
  (`zerodoc.unitstats`). A rank's own per-unit numbers are fetched only if a front end asks
  for them (one rank's series).
- **Windows.** `increase(...[W])` with W about `window` steps long (at least four scrape
  intervals), evaluated at the run's last sample: a run that ended shows its last steps,
  as the run log does. `window` None: the cumulative counters (all steps).
- **Per-unit stats from the recording rules** when the server has them for the run (the
  rules `rules/zerodoc-recording.yml` ships, `zerodoc.ops.alerts.recording.unit_stat_rules`, and
  series labelled with `run_id`, as zerodoc's file_sd targets are): a few series per unit,
  computed by the server once per evaluation, over the rules' rate window
  (`UnitStats.window_s`; the report says so). Same numbers as the raw queries below over
  that window, at a fraction of the cost (issue 20 item 17).
- **Else per-unit stats are the costly part** (one query per field and aggregation, each over
  ranks x units x phases x collectives series: 40-45 s of a 2-core Prometheus at 1,024 ranks
  x 81 units, against 2.5 s for everything per rank). The first snapshot computes them; a
  source kept across refreshes (the TUI) then reuses them until they are older than
  `unit_reuse` times what they cost, and recomputes them on a background thread meanwhile
  (a refresh never waits for them again; `UnitStats.fetched_unix` says when they were
  computed and the TUI shows their age), so its load on the server stays bounded. The
  per-rank numbers are fetched fresh every time. A change of run or of the ranks reporting
  recomputes them at once.
- **VictoriaMetrics** (single node or vmselect; `zerodoc stack --engine victoria`) answers the
  same queries: its buildinfo carries no Prometheus version. It ingests a scrape's samples
  over a second or two, not at once, so a query near "now" can see part of a scrape (one
  counter's new sample, not its divisor's); it hides the last `-search.latencyOffset` (30 s
  by default; its /flags page says) by moving such queries back, each by its own amount. The
  source therefore evaluates a snapshot no later than now minus that offset: one time for
  every query, and every sample up to it in (docs/operations.md, "VictoriaMetrics").
- **Ended and missing ranks.** Ended: the rank served the exporter's closed signal, or its
  target left service discovery (a clean close removes the file_sd target) while it was
  up. Stale: its target is down, or no step for `stale_after_s`. Missing: below the world
  size and not in Prometheus at all.
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
import urllib.error
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

from ..catalog import (
    ASYNC_ALL_GATHER, RANK_COMPUTE, RANK_EXPOSED, RULE_WINDOW, UNIT_COMPUTE, UNIT_FRAMEWORK,
    UNIT_RANKS, UNIT_STAT,
)
from ..errors import UserError
from ..runmodel import CommTotals, LazyRankWindow, RankWindow, RunSnapshot
from ..runlog import missing
from ..unitstats import FIELDS, NONE, UNIT_FIELDS, Stat, UnitStats
from .endpoints import fetch, why
from .rundir import STALE_AFTER_S
from .samples import (
    ROUTES, Cumulative, add_sample, facts_of, series_of, share_unit_facts,
)

_STEPS = series_of("scalar", "steps")[0]  # the step histogram's _count
_DETAIL = series_of("scalar", "detail_steps")[0]  # sampled steps (absent: every step)
_STEP_SUM = series_of("scalar", "step_seconds")[0]
_TIMESTAMP = series_of("scalar", "updated_unix")[0]
_RUN_INFO = series_of("info")[0]
_CLOSED = series_of("closed")[0]
_COMPUTE = series_of("compute")[0]
_FRAMEWORK = series_of("framework")[0]  # the framework's time per unit and phase
_COMM = {ROUTES[n][1]: n for n in series_of("comm")}  # field -> series
_STAT_AGGS = {"min": "min", "mean": "avg", "max": "max", "median": "quantile"}
# per field, the aggregations the rules, report and TUI read (zerodoc.unitstats)
_NEEDED = {"count": ("median", "mean", "max"), "bytes": ("median", "mean", "max"),
           "seconds": ("min", "mean", "max"), "exposed": ("min", "mean", "max"),
           "hidden": ("min", "max")}
# Per-unit stats are reused while younger than this many times their own cost (module
# docstring): a client spends at most ~1/(1 + UNIT_REUSE) of its time on them.
UNIT_REUSE = 4.0
# ... and queried two at a time: each holds every rank's per-unit series in the server's
# memory while it runs (1,024 ranks x 81 units on a 2-core Prometheus: eight at once peaked
# at 11.1 GB resident, two at 5.1 GB, in the same 45 s).
UNIT_QUERY_WORKERS = 2
# Each of those takes ~10 s there: they (and the per-rank sums over units) get this long; the
# source's own timeout_s (10 s by default) is for finding out that a server is away.
UNIT_QUERY_TIMEOUT_S = 120.0


def _duration(text: str) -> float | None:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h)", text.strip())
    if not m:
        return None
    return float(m.group(1)) * {"ms": 1e-3, "s": 1, "m": 60, "h": 3600}[m.group(2)]


def _quote(v: str) -> str:
    return json.dumps(v)  # a PromQL string literal: double quotes, backslash escapes


class PrometheusSource:
    """A Prometheus server that scrapes the ranks (see the module docstring)."""

    def __init__(self, url: str, window: int | None = 20, *, timeout_s: float = 10.0,
                 stale_after_s: float = STALE_AFTER_S, lookback: str = "15m",
                 run_id: str | None = None, unit_reuse: float = UNIT_REUSE,
                 recorded: bool = True, rank_series: bool = True):
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise UserError(f"{url!r} is not an http(s) URL of a Prometheus server")
        if _duration(lookback) is None:
            raise UserError(f"lookback {lookback!r}: expected a duration like 15m or 2h")
        self.url = url.rstrip("/")
        self.window = window
        self.timeout_s = timeout_s
        self.stale_after_s = stale_after_s
        self.lookback = lookback
        self.run_id = run_id
        self.description = f"Prometheus {self.url}" + (f" run {run_id}" if run_id else "")
        self.queries = 0  # HTTP queries made (the bench reports them)
        self.settle_s = 0.0  # how far before now a snapshot is evaluated (VictoriaMetrics)
        self.unit_reuse = unit_reuse
        self.recorded = recorded  # per-unit stats from the recording rules where they exist
        self.rank_series = rank_series  # per-rank totals from the rank-level series
        self._units_cache: tuple | None = None  # (key, UnitStats, monotonic when, cost s)
        self._units_next: list = []  # [(key, ...) or an exception] from the background
        self._units_busy = False
        self._check()

    # -- HTTP --------------------------------------------------------------------------
    def _get(self, path: str, *, timeout_s: float | None = None, **params) -> dict:
        url = f"{self.url}/api/v1/{path}"
        timeout_s = timeout_s or self.timeout_s
        body_data = urllib.parse.urlencode(params).encode() if params else None
        not_prom = f"{self.url} does not look like a Prometheus server (/api/v1/{path}: "
        self.queries += 1
        try:  # POST: a run's instance list can make a long query
            body = json.loads(fetch(url, timeout_s, data=body_data)
                              if body_data else fetch(url, timeout_s))
        except urllib.error.HTTPError as e:
            detail = ""
            try:
                detail = json.loads(e.read()).get("error", "")
            except (ValueError, OSError, AttributeError):
                pass
            if e.code == 400 and detail:
                raise UserError(f"Prometheus {self.url} rejected a query: {detail}") from None
            raise UserError(f"{not_prom}HTTP {e.code}); for a rank's own /metrics pass "
                            "host:port without http://") from None
        except ValueError:
            raise UserError(f"{not_prom}not JSON)") from None
        except OSError as e:
            raise UserError(f"cannot reach {self.description.split()[0]} at {self.url}: "
                            f"{why(e)}") from None
        if not isinstance(body, dict) or body.get("status") != "success":
            raise UserError(f"{not_prom}{str(body)[:120]})")
        return body["data"]

    def _check(self) -> None:
        info = self._get("status/buildinfo")
        if isinstance(info, dict) and not info.get("version"):  # VictoriaMetrics: {}
            self.settle_s = self._latency_offset()
            self.description = self.description.replace("Prometheus", "VictoriaMetrics", 1)

    def _latency_offset(self) -> float:
        """VictoriaMetrics' -search.latencyOffset in seconds, from its /flags page (only the
        flags set are listed there: its default, 30 s, when absent or unreadable)."""
        parts = urllib.parse.urlsplit(self.url)
        try:
            text = fetch(f"{parts.scheme}://{parts.netloc}/flags", self.timeout_s).decode()
        except (OSError, ValueError, UnicodeDecodeError):
            return 30.0
        m = re.search(r'^-search\.latencyOffset="?([^"\s]+)', text, re.M)
        got = _duration(m.group(1)) if m else None
        return 30.0 if got is None else got

    def _query(self, expr: str, at: float | None = None,
               timeout_s: float | None = None) -> list[tuple[dict, float]]:
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        if timeout_s:  # the server gives up too (Prometheus' own default: 2m)
            params["timeout"] = f"{timeout_s:g}s"
        data = self._get("query", timeout_s=timeout_s, **params)
        # NaN is no value: a recorded per-step rule divides by the sampled steps' rate, 0/0
        # when its window held no sampled step (adaptive K: one step in up to 1024): such a
        # series reads as absent (not measured), never as a number
        return [(r["metric"], v) for r in data.get("result", ())
                if math.isfinite(v := float(r["value"][1]))]

    def _many(self, exprs: dict, at: float | None, workers: int = 8,
              timeout_s: float | None = None) -> dict:
        # its threads named after the caller's: a profile tells a refresh's queries from
        # the background per-unit stats' (bench/scale_twolevel.py)
        with ThreadPoolExecutor(max_workers=max(1, min(workers, len(exprs))),
                                thread_name_prefix=threading.current_thread().name) as pool:
            futs = {k: pool.submit(self._query, e, at, timeout_s) for k, e in exprs.items()}
            return {k: f.result() for k, f in futs.items()}

    def _scrape_interval(self, sel: str) -> float:
        """Seconds between two samples of the run's series (one series' last samples)."""
        for extra in (', rank="0"', ""):  # one series is enough: rank 0's, if it has one
            try:
                data = self._get("query", query=f"{_TIMESTAMP}{{{sel}{extra}}}[5m]")
            except UserError:
                return 15.0
            for r in data.get("result", ())[:1]:
                ts = [float(t) for t, _v in r.get("values", ())]
                gaps = sorted(b - a for a, b in zip(ts, ts[1:]) if b > a)
                if gaps:
                    return gaps[len(gaps) // 2]
        return 15.0

    # -- which run -----------------------------------------------------------------------
    def runs(self) -> dict[str, int]:
        """run_id -> ranks, for every run with series in the lookback."""
        lb = self.lookback
        return {m.get("run_id", ""): int(v) for m, v in
                self._query(f"count by (run_id) (last_over_time({_RUN_INFO}[{lb}]))")}

    def _selector(self, run: str) -> str:
        """A matcher selecting the run's series on the server."""
        lb, q = self.lookback, _quote(run)
        labelled = self._query(f"count(last_over_time({_TIMESTAMP}{{run_id={q}}}[{lb}]))")
        if labelled and labelled[0][1] > 0:
            return f"run_id={q}"
        inst = sorted({m.get("instance", "") for m, _v in
                       self._query(f"last_over_time({_RUN_INFO}{{run_id={q}}}[{lb}])")})
        return "instance=~" + _quote("|".join(re.escape(i) for i in inst))

    def _pick_run(self) -> tuple[str, str]:
        runs = self.runs()
        if not runs:
            raise UserError(f"no zerodoc series in Prometheus {self.url} over the last "
                            f"{self.lookback} (is it scraping the ranks' /metrics?)")
        if self.run_id is not None:
            if self.run_id not in runs:
                raise UserError(f"run {self.run_id!r} not in Prometheus {self.url} "
                                f"(runs: {', '.join(sorted(runs))})")
            return self.run_id, self._selector(self.run_id)
        if len(runs) == 1:
            run = next(iter(runs))
            return run, self._selector(run)
        best = None
        for run in runs:
            sel = self._selector(run)
            ts = self._query(f"max(last_over_time({_TIMESTAMP}{{{sel}}}[{self.lookback}]))")
            t = ts[0][1] if ts else 0.0
            if best is None or t > best[0]:
                best = (t, run, sel)
        return best[1], best[2]

    # -- snapshot ------------------------------------------------------------------------
    def snapshot(self, at: float | None = None) -> RunSnapshot:
        """The run as of now, or as of the Unix time `at` (its samples up to then)."""
        lb = self.lookback
        run, sel = self._pick_run()
        head = self._many({
            "end": f"max(last_over_time({_TIMESTAMP}{{{sel}}}[{lb}]))",
            "sum": f"sum(last_over_time({_STEP_SUM}{{{sel}}}[{lb}]))",
            "count": f"sum(last_over_time({_STEPS}{{{sel}}}[{lb}]))",
        }, at)
        last = head["end"][0][1] if head["end"] else time.time()
        cnt = head["count"][0][1] if head["count"] else 0.0
        mean = head["sum"][0][1] / cnt if cnt else 1.0
        interval = self._scrape_interval(sel)
        asked, now = at, time.time() if at is None else at
        # evaluate where the run's samples end (one scrape after its last step): a live run's
        # latest steps, an ended run's last ones, whenever asked; never in the part of the
        # past a VictoriaMetrics may still be ingesting (module docstring)
        at = min(now, last + interval, time.time() - self.settle_s)
        span = None
        if self.window:
            span = int(max(self.window * mean, 4 * interval) + 0.999)

        def rng(name: str, extra: str = "") -> str:
            s = f"{name}{{{sel}{extra}}}"
            return f"increase({s}[{span}s])" if span else f"last_over_time({s}[{lb}])"

        def level(name: str, extra: str = "") -> str:
            return f"last_over_time({name}{{{sel}{extra}}}[{lb}])"

        exprs = {}
        for name, (kind, _arg, windowed) in ROUTES.items():
            if kind in ("compute", "comm", "framework", "unit", "unit_info", "stall"):
                continue  # per unit: aggregated below; unit facts from one rank; stalls: now
            exprs[name] = rng(name) if windowed else level(name)
        totals_from = self._rank_total_exprs(rng)
        exprs.update(totals_from[self.rank_series])
        res = self._many(exprs, at, timeout_s=max(self.timeout_s, UNIT_QUERY_TIMEOUT_S))
        got: dict[int, Cumulative] = {}
        for name in ROUTES:
            for m, v in res.get(name, ()):
                add_sample(got, name, m, v)
                r = m.get("rank", "")
                if r.isdigit() and int(r) in got and m.get("instance"):
                    got[int(r)].endpoint = m["instance"]
        got = {r: c for r, c in got.items() if "run_id" in c.labels}
        if not got:
            raise UserError(f"run {run!r} in Prometheus {self.url}: no zerodoc series over "
                            f"the last {lb}")
        lowest = min(got)
        units = self._many({n: level(n, f', rank="{lowest}"')
                            for n, (k, _a, _w) in ROUTES.items() if k in ("unit", "unit_info")},
                           at)
        for name, rows in units.items():
            for m, v in rows:
                add_sample(got, name, m, v)
        share_unit_facts(got)
        for name in series_of("stall"):  # present only while a rank is stuck: now, not lately
            for m, v in self._query(f"{name}{{{sel}}}"):
                add_sample(got, name, m, v)
        totals = {k: {int(m["rank"]): v for m, v in res[k] if m.get("rank", "").isdigit()}
                  for k in ("compute_total", "exposed_total")}
        # a rank with steps but without the rank-level series (an older zerodoc): its sums
        # over units (a rank that serves them has compute; collectives it may lack)
        if self.rank_series and any(r not in totals["compute_total"]
                                    for r, c in got.items() if c.steps):
            raw = self._many(totals_from[False], at,
                             timeout_s=max(self.timeout_s, UNIT_QUERY_TIMEOUT_S))
            for k, rows in raw.items():
                for m, v in rows:
                    if m.get("rank", "").isdigit():
                        totals[k].setdefault(int(m["rank"]), v)

        snap = RunSnapshot(source=self.description)
        for rank, c in sorted(got.items()):
            snap.ranks[rank] = self._window(c, sel, span, at, totals, rank)
            if c.stall_record():
                snap.stalls[rank] = c.stall_record()
        ranks = tuple(sorted(r for r, w in snap.ranks.items() if w.steps))
        snap.unit_stats = self._unit_stats_reused((run, ranks, self.window), sel, rng, at,
                                                  ranks, snap)
        note = _median_note(snap.unit_stats)
        if note:
            snap.log_notes.append(note)
        # a rank's last step is judged against the newest time the store answers for
        self._states(snap, got, sel, asked, min(now, time.time() - self.settle_s), interval)
        snap.missing_ranks = missing(snap)
        return snap

    @staticmethod
    def _rank_total_exprs(rng) -> dict:
        """Per rank, compute and exposed collective time summed over its units: {True: from
        the rank-level series (a few per rank), False: from the per-unit series (every one
        of them: 1.4-6.8 s a query at 1,024 ranks x 81 units on a 2-core server)}."""
        return {True: {"compute_total": f"sum by (rank) ({rng(RANK_COMPUTE)})",
                       "exposed_total": f"sum by (rank) ({rng(RANK_EXPOSED)})"},
                False: {"compute_total": f"sum by (rank) ({rng(_COMPUTE)})",
                        "exposed_total": f"sum by (rank) ({rng(_COMM['exposed_seconds'])})"}}

    def _window(self, c: Cumulative, sel: str, span, at, totals, rank) -> RankWindow:
        from .samples import window_of

        facts = facts_of(c)
        base = window_of(facts, c)
        w = LazyRankWindow(facts=facts, loader=lambda: self._rank_units(sel, span, at, rank))
        for f in ("steps", "first_step", "last_step", "step_seconds", "last_step_seconds",
                  "max_step_seconds", "optimizer_seconds", "framework_seconds",
                  "other_seconds", "self_seconds", "updated_unix", "memory", "errors",
                  "detail_steps"):
            setattr(w, f, getattr(base, f))
        # sums over units: over the sampled steps, scaled to the window's steps
        w.compute_total = w.to_window(totals["compute_total"].get(rank, 0.0))
        w.exposed_total = w.to_window(totals["exposed_total"].get(rank, 0.0))
        return w

    def _rank_units(self, sel: str, span, at, rank: int):
        """One rank's per-unit numbers (when a front end asks for them)."""
        extra = f', rank="{rank}"'

        def rng(name: str) -> str:
            s = f"{name}{{{sel}{extra}}}"
            return f"increase({s}[{span}s])" if span else f"last_over_time({s}[{self.lookback}])"

        names = [_COMPUTE, _FRAMEWORK, *_COMM.values()]
        res = self._many({n: rng(n) for n in names}, at)
        c: dict[int, Cumulative] = {}
        for n in names:
            for m, v in res[n]:
                add_sample(c, n, m, v)
        cur = c.get(rank)
        if cur is None:
            return {}, {}, {}
        from .samples import window_of

        w = window_of(facts_of(cur), cur)
        return w.compute, w.comm, w.unit_framework

    def _unit_stats_reused(self, key: tuple, sel: str, rng, at, ranks: tuple,
                           snap: RunSnapshot) -> UnitStats:
        """The per-unit stats for `key` (run, ranks, window): computed now if none are cached
        for it, else the cached ones, recomputed in the background once they are older than
        `unit_reuse` x their cost (module docstring)."""
        if self._units_next:  # a background computation finished
            done = self._units_next.pop()
            if isinstance(done, tuple) and done[0] == key:
                self._units_cache = done
        c = self._units_cache
        if c is None or c[0] != key:
            self._units_cache = c = self._compute_unit_stats(key, sel, rng, at, ranks, snap)
        elif time.monotonic() - c[2] >= self.unit_reuse * c[3] and not self._units_busy:
            self._units_busy = True

            def work():
                try:
                    self._units_next.append(
                        self._compute_unit_stats(key, sel, rng, at, ranks, snap))
                except Exception as e:  # noqa: BLE001 - kept, the cached ones stay shown
                    self._units_next.append(e)
                finally:
                    self._units_busy = False
            threading.Thread(target=work, name="zerodoc-unit-stats", daemon=True).start()
        return c[1]

    def _compute_unit_stats(self, key: tuple, sel: str, rng, at, ranks: tuple,
                            snap: RunSnapshot) -> tuple:
        t0 = time.monotonic()
        stats = self._unit_stats(sel, rng, at, ranks, snap)
        stats.fetched_unix = time.time()
        return key, stats, t0, time.monotonic() - t0

    def _rules_window(self, sel: str, at) -> float | None:
        """The rate window of the recording rules' per-unit stats for this run, or None when
        the server has none for it (no rules loaded, or series without a run_id label)."""
        if not self.recorded or not sel.startswith("run_id="):
            return None
        lb = self.lookback
        res = self._many({"w": f"max(last_over_time({RULE_WINDOW}{{{sel}}}[{lb}]))",
                          "n": f"count(last_over_time({UNIT_RANKS}{{{sel}}}[{lb}]))"}, at)
        if not res["w"] or not res["n"] or res["n"][0][1] <= 0:
            return None
        return res["w"][0][1]

    def _unit_stats(self, sel: str, rng, at, ranks: tuple, snap: RunSnapshot) -> UnitStats:
        """Per (unit, phase, collective): per-step numbers' stats over ranks, in PromQL: read
        from the recording rules where the server has them, else aggregated here."""
        window_s = self._rules_window(sel, at)
        exprs = self._recorded_exprs(sel) if window_s else self._raw_exprs(rng)
        if window_s and not self._recorded_framework(sel, at):
            # rules deployed before the framework's series (zerodoc upgraded first): the
            # framework's stats from the raw series, never "not recorded" for that reason
            exprs.update({k: v for k, v in self._raw_exprs(rng).items() if k[0] == "framework"})
        out = self._unit_stats_of(exprs, at, ranks, snap)
        out.window_s = window_s
        return out

    def _recorded_framework(self, sel: str, at) -> bool:
        """The server's rules record the framework's time per unit for this run."""
        name = UNIT_FRAMEWORK["n"]
        return bool(self._query(f"count(last_over_time({name}{{{sel}}}[{self.lookback}]))",
                                at))

    def _recorded_exprs(self, sel: str) -> dict:
        """The per-unit stats' queries on the recording rules (module docstring): the latest
        value of each recorded series (max over scrape jobs holding the same run); a median
        only while the rules still record it beside its mean."""
        lb = self.lookback

        def last(name: str, by: str = "unit, phase, collective") -> str:
            return f"max by ({by}) (last_over_time({name}{{{sel}}}[{lb}]))"

        def median(name: str, mean: str, by: str = "unit, phase, collective") -> str:
            # the one stat the rules record only where they can (two-level: where every
            # rank agrees): one they stopped recording would read for the whole lookback as
            # its last value (one recorded while a rack's ranks had not arrived, all equal,
            # then none once they differ; seen in test_twolevel). Kept only where it
            # was recorded in every evaluation in the lookback that recorded the mean (one
            # group: one timestamp per evaluation) but at most one: the evaluation being
            # written (a server commits each rule's samples on their own, the mean first);
            # else the mean stands in, with the note
            m, n = f"{name}{{{sel}}}[{lb}]", f"{mean}{{{sel}}}[{lb}]"
            return (f"max by ({by}) (last_over_time({m})\n  and (count_over_time({m}) + 1 >= "
                    f"count_over_time({n})))")

        exprs = {(f, a): median(UNIT_STAT[f][1][a], UNIT_STAT[f][1]["mean"]) if a == "median"
                 else last(UNIT_STAT[f][1][a]) for f, aggs in _NEEDED.items() for a in aggs}
        exprs[("n", "")] = last(UNIT_RANKS)
        for a, name in UNIT_COMPUTE.items():
            exprs[("compute", a)] = last(name, "unit, phase")
        for a, name in UNIT_FRAMEWORK.items():
            exprs[("framework", a)] = median(name, UNIT_FRAMEWORK["mean"], "unit") \
                if a == "median" else last(name, "unit")
        exprs[("hidden_any", "")] = f"sum(last_over_time({ASYNC_ALL_GATHER}{{{sel}}}[{lb}]))"
        return exprs

    def _raw_exprs(self, rng) -> dict:
        """The per-unit stats' queries over every rank's raw per-unit series."""
        # per step of the steps the per-unit counters cover: the sampled ones where the
        # ranks count them (a rank with none in the window has no divisor: its per-step
        # figures are absent, not 0, and it is not counted among the ranks), else every step
        detail = rng(_DETAIL)
        steps = (f"on (rank) group_left () (({detail} > 0) or "
                 f"({rng(_STEPS)} unless on (rank) {detail}))")
        per = {f: f"({rng(_COMM[a])}) / {steps}" for f, a in
               (("count", "count"), ("bytes", "bytes"), ("seconds", "seconds"),
                ("exposed", "exposed_seconds"))}
        per["hidden"] = f"({rng(_COMM['seconds'])} - {rng(_COMM['exposed_seconds'])}) / {steps}"
        by = "by (unit, phase, collective)"
        exprs = {}
        for f, aggs in _NEEDED.items():
            for a in aggs:
                fn = _STAT_AGGS[a]
                exprs[(f, a)] = f"{fn} {by} (0.5, {per[f]})" if a == "median" else \
                    f"{fn} {by} ({per[f]})"
        exprs[("n", "")] = f"count {by} ({per['count']})"
        cper = f"({rng(_COMPUTE)}) / {steps}"
        exprs[("compute", "mean")] = f"avg by (unit, phase) ({cper})"
        exprs[("compute", "max")] = f"max by (unit, phase) ({cper})"
        # the framework's time per unit: a rank's phases summed, per step, then over the ranks
        # (a coarse rank's sum over units comes out as unit "": not a unit, left out below)
        fper = f"sum by (rank, unit) ({rng(_FRAMEWORK)}) / {steps}"
        for a in ("min", "median", "mean", "max"):
            fn = _STAT_AGGS[a]
            exprs[("framework", a)] = f"{fn} by (unit) (0.5, {fper})" if a == "median" else \
                f"{fn} by (unit) ({fper})"
        exprs[("framework", "n")] = f"count by (unit) ({fper})"
        ag = ', collective="all_gather"'
        secs, exposed = rng(_COMM["seconds"], ag), rng(_COMM["exposed_seconds"], ag)
        exprs[("hidden_any", "")] = f"count(({secs} - {exposed}) > (0.01 * {secs} + 1e-6))"
        return exprs

    def _unit_stats_of(self, exprs: dict, at, ranks: tuple, snap: RunSnapshot) -> UnitStats:
        res = self._many(exprs, at, UNIT_QUERY_WORKERS,
                         max(self.timeout_s, UNIT_QUERY_TIMEOUT_S))
        vals: dict[tuple, dict] = {}
        for (f, a), rows in res.items():
            if f in ("compute", "framework", "hidden_any"):
                continue
            for m, v in rows:
                key = (m.get("unit", ""), m.get("phase", ""), m.get("collective", ""))
                vals.setdefault(key, {})[(f, a)] = v
        out = UnitStats(ranks=ranks)
        for key, d in vals.items():
            if not any((f, "mean") in d for f in FIELDS):
                continue  # no rank measured it in the window (0/0: no sampled step), not 0
            n = int(d.get(("n", ""), 0))
            out.comm[key] = {f: Stat(d.get((f, "min"), d.get((f, "median"), 0.0)),
                                     d.get((f, "median"), d.get((f, "mean"), 0.0)),
                                     d.get((f, "mean"), 0.0), d.get((f, "max"), 0.0), n)
                             for f in FIELDS}
        comp: dict[tuple, dict] = {}
        for a in ("mean", "max"):
            for m, v in res[("compute", a)]:
                comp.setdefault((m.get("unit", ""), m.get("phase", "")), {})[a] = v
        timed = any(k[2] == "all_gather" and s["seconds"].max > 0 for k, s in out.comm.items())
        hidden = res[("hidden_any", "")]
        out.sync = timed and not (hidden and hidden[0][1] > 0)
        first = snap.any_rank
        order = [u.name for u in first.facts.units] if first else []
        groups = {u.name: u.group_size for u in first.facts.units} if first else {}
        fw: dict[str, dict] = {}
        for a in ("min", "median", "mean", "max", "n"):
            for m, v in res.get(("framework", a), ()):
                if m.get("unit"):
                    fw.setdefault(m["unit"], {})[a] = v
        out.units = _unit_table(out.comm, comp, order, groups,
                                first.facts.world_size if first else 1, fw)
        out.order = tuple(order)
        out.medians_unrecorded = _medians_unrecorded(vals, fw)
        return out

    def _states(self, snap: RunSnapshot, got: dict, sel: str, at: float | None, now: float,
                interval: float) -> None:
        """ended / stale per rank (see the module docstring)."""
        lb = self.lookback
        res = self._many({"last_up": f"last_over_time(up{{{sel}}}[{lb}])",
                          "up": f"up{{{sel}}}"}, at)  # at: None (now) unless asked
        last_up = {m.get("instance"): v for m, v in res["last_up"]}
        up_now = {m.get("instance"): v for m, v in res["up"]}
        for rank, c in got.items():
            w = snap.ranks[rank]
            inst = c.endpoint
            if c.closed_unix is not None or (inst not in up_now and last_up.get(inst) == 1.0):
                snap.ended_ranks.add(rank)
            elif up_now.get(inst, 1.0) == 0 or (
                    w.updated_unix and now - w.updated_unix > self.stale_after_s):
                snap.stale_ranks.add(rank)


def _medians_unrecorded(vals: dict, framework: dict) -> dict[str, int]:
    """{field: how many keys} whose median over ranks the store does not hold while their
    mean is there: the two-level layout's central rules record a median only where every
    rank of every rack has the same number (it does not combine across racks;
    zerodoc.ops.alerts.twolevel). Those medians read as the mean (`Stat`), and the report
    says so (`_median_note`)."""
    out: dict[str, int] = {}
    for d in vals.values():
        for f, aggs in _NEEDED.items():
            if "median" in aggs and (f, "mean") in d and (f, "median") not in d:
                out[f] = out.get(f, 0) + 1
    n = sum(1 for f in framework.values() if "mean" in f and "median" not in f)
    if n:
        out["framework"] = n
    return out


def _median_note(stats) -> str | None:
    missing = getattr(stats, "medians_unrecorded", None)
    if not missing:
        return None
    what = ", ".join(f"{f} ({n})" for f, n in sorted(missing.items()))
    return (f"per-unit medians over ranks not in the store for {what}: shown as the mean "
            "(a two-level layout records a median only where every rank has the same "
            "number; medians do not combine across racks)")


def _unit_table(comm: dict, comp: dict, order: list[str], groups: dict,
                world: int, framework: dict | None = None) -> dict[str, dict[str, Stat]]:
    """Per-unit table values from per-key stats (means add up over phases exactly; the
    worst of a unit is taken as the sum of its keys' worst, an upper bound); the framework's
    time per unit as aggregated over the ranks (`framework`: unit -> {min, median, mean,
    max, n}; a unit without it: unknown)."""
    framework = framework or {}
    from ..runmodel import busbw

    acc: dict[str, dict[str, list[float]]] = {}

    def add(u: str, f: str, mean: float, mx: float) -> None:
        a = acc.setdefault(u, {}).setdefault(f, [0.0, 0.0])
        a[0] += mean
        a[1] += mx

    for (u, _p, c), s in comm.items():
        if c == "all_gather":
            add(u, "ag_count", s["count"].mean, s["count"].max)
            add(u, "ag_bytes", s["bytes"].mean, s["bytes"].max)
            add(u, "ag_seconds", s["seconds"].mean, s["seconds"].max)
            add(u, "ag_exposed_seconds", s["exposed"].mean, s["exposed"].max)
        elif c == "reduce_scatter":
            add(u, "rs_seconds", s["seconds"].mean, s["seconds"].max)
            add(u, "rs_exposed_seconds", s["exposed"].mean, s["exposed"].max)
        elif c == "all_reduce":
            add(u, "ar_count", s["count"].mean, s["count"].max)
            add(u, "ar_bytes", s["bytes"].mean, s["bytes"].max)
            add(u, "ar_seconds", s["seconds"].mean, s["seconds"].max)
            add(u, "ar_exposed_seconds", s["exposed"].mean, s["exposed"].max)
    for (u, p), d in comp.items():
        add(u, "compute_seconds", d.get("mean", 0.0), d.get("max", 0.0))
        if p in ("forward", "backward"):
            add(u, f"compute_{p}", d.get("mean", 0.0), d.get("max", 0.0))
    out: dict[str, dict[str, Stat]] = {}
    for u in list(order) + [x for x in (*acc, *framework) if x not in order]:
        a = acc.get(u, {})
        row = {}
        for f in UNIT_FIELDS:
            if f in a:
                mean, mx = a[f]
                row[f] = Stat(mean, mean, mean, mx, 1)
            else:
                # a unit no rank has series of: not measured (NONE), as from a run
                # directory; one measured without this collective: none of it (0)
                row[f] = NONE if not a or f in ("ag_exposed_fraction", "ag_busbw",
                                                "framework_seconds") else \
                    Stat(0.0, 0.0, 0.0, 0.0, 1)
        sec, exp, b = a.get("ag_seconds"), a.get("ag_exposed_seconds"), a.get("ag_bytes")
        if sec and sec[0] > 0:
            frac = exp[0] / sec[0] if exp else 0.0
            row["ag_exposed_fraction"] = Stat(frac, frac, frac, frac, 1)
            bw = busbw(b[0] / sec[0], "all_gather", groups.get(u, world)) if b else 0.0
            worst = busbw(b[0] / sec[1], "all_gather", groups.get(u, world)) \
                if b and sec[1] > 0 else bw
            row["ag_busbw"] = Stat(worst, bw, bw, bw, 1)
        f = framework.get(u)
        if f and int(f.get("n", 0)) > 0:
            row["framework_seconds"] = Stat(f.get("min", 0.0),
                                            f.get("median", f.get("mean", 0.0)),
                                            f.get("mean", 0.0), f.get("max", 0.0), int(f["n"]))
        out[u] = row
    return out


__all__ = ["PrometheusSource"]
_ = CommTotals  # re-exported type for readers of this module's windows
