"""Where a RunSnapshot comes from: a run directory, rank endpoints, or a Prometheus server.

Every front end (report, TUI, demo) asks `open_source(spec)` for a `Source` and calls
`snapshot()` whenever it wants fresh numbers. The same run gives the same findings from each
source (tests/test_sources.py), because all three build the same `RankWindow`s:

- `RunDirSource`: the run logs; the window is each rank's last `window` steps.
- `EndpointsSource`: scrapes each rank's `/metrics`. The exporter serves cumulative counters,
  so a window is the difference between this scrape and the newest earlier scrape at least
  `window` steps older; until one exists (the first call) it is everything since the start.
  Static facts are rebuilt from `zerodoc_run_info`, `zerodoc_world_size` and the
  `zerodoc_unit_*` gauges (served by rank 0 only: every rank gets the lowest serving
  rank's). A coarse rank's series without a `unit` label are its totals over units
  (keys `catalog.RANK_TOTAL_UNIT`).
- `PrometheusSource`: the same series through the HTTP API: `increase(...[W])` with W about
  `window` steps long (`last_over_time` of the cumulative counters when `window` is None, or
  when no step landed in W: an ended run).

Ranks that stopped reporting are listed in `snapshot.stale_ranks` (a run log with no clean
end and no step for `stale_after_s`; an endpoint that does not answer; a rank the world size
promises but no source shows).
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from .catalog import RANK_TOTAL_UNIT
from .errors import UserError
from .model import CommTotals, RankFacts, RankWindow, RunSnapshot, UnitFacts
from .runlog import RunFollower, RunLogError, latest_run, rank_logs, read_rank_log
from .stalls import STALL_GAUGE, stall_from_gauge
from .thresholds import DEFAULT

STALE_AFTER_S = DEFAULT.stale_after_seconds


class Source(Protocol):
    description: str

    def snapshot(self) -> RunSnapshot:
        """Current numbers: each rank's totals over the recent window."""


# --------------------------------------------------------------------------------------
# run directory


class RunDirSource:
    """A run directory (live or finished), followed incrementally."""

    def __init__(self, run_dir: str | Path, window: int | None = 20, *,
                 stale_after_s: float = STALE_AFTER_S):
        self.run_dir = Path(run_dir)
        if not self.run_dir.is_dir():
            raise UserError(f"no run directory at {self.run_dir}")
        self.window = window
        self.stale_after_s = stale_after_s
        # Bounded memory on long runs: a few windows of step records per rank.
        self.follower = RunFollower(self.run_dir, keep=4 * window if window else None)
        self.description = f"run log {self.run_dir}"

    def snapshot(self) -> RunSnapshot:
        self.follower.poll()
        snap = self.follower.snapshot(self.window)
        if not snap.ranks:
            self._explain_empty()
        now = time.time()
        for rank, log in self.follower.logs.items():
            last = log.steps[-1].end_unix if log.steps else log.facts.started_unix
            if log.ended:
                snap.ended_ranks.add(rank)
            elif now - last > self.stale_after_s:
                snap.stale_ranks.add(rank)
        return snap

    def _explain_empty(self) -> None:
        paths = rank_logs(self.run_dir)
        if not paths:
            raise RunLogError(f"{self.run_dir} holds no rank-*.jsonl run logs")
        for p in paths:
            read_rank_log(p)  # raises the precise reason (empty, not JSON, wrong schema)
        raise RunLogError(f"{self.run_dir}: no readable run log header yet")


# --------------------------------------------------------------------------------------
# samples (name, labels, value) -> per-rank cumulative totals: shared by the scrape sources

# Cumulative counters a window is taken of; everything else is a level (latest value).
WINDOWED = ("zerodoc_step_duration_seconds_sum", "zerodoc_step_duration_seconds_count",
            "zerodoc_optimizer_seconds_total", "zerodoc_other_seconds_total",
            "zerodoc_framework_seconds_total", "zerodoc_self_seconds_total",
            "zerodoc_compute_seconds_total", "zerodoc_collective_calls_total",
            "zerodoc_collective_bytes_total", "zerodoc_collective_seconds_total",
            "zerodoc_collective_exposed_seconds_total")
LEVELS = ("zerodoc_last_step", "zerodoc_last_step_seconds", "zerodoc_last_step_timestamp_seconds",
          "zerodoc_memory_bytes", "zerodoc_device_memory_capacity_bytes",
          "zerodoc_memory_headroom_bytes", "zerodoc_gpu_alloc_retries_total",
          "zerodoc_gpu_ooms_total", "zerodoc_errors_total", "zerodoc_hook_available",
          "zerodoc_run_info", "zerodoc_world_size", "zerodoc_local_world_size",
          "zerodoc_unit_parameters", "zerodoc_unit_parameter_bytes",
          "zerodoc_unit_reshard_after_forward", "zerodoc_unit_index", "zerodoc_unit_group_size",
          "zerodoc_unit_sharded_bytes", "zerodoc_unit_stored_parameter_bytes",
          "zerodoc_unit_dtype_info", STALL_GAUGE)
_SCALARS = {"zerodoc_optimizer_seconds_total": "optimizer_seconds",
            "zerodoc_other_seconds_total": "other_seconds",
            "zerodoc_framework_seconds_total": "framework_seconds",
            "zerodoc_self_seconds_total": "self_seconds",
            "zerodoc_step_duration_seconds_sum": "step_seconds",
            "zerodoc_step_duration_seconds_count": "steps",
            "zerodoc_last_step": "last_step", "zerodoc_last_step_seconds": "last_step_seconds",
            "zerodoc_last_step_timestamp_seconds": "updated_unix",
            "zerodoc_world_size": "world_size", "zerodoc_local_world_size": "local_world_size"}
_COMM = {"zerodoc_collective_calls_total": "count", "zerodoc_collective_bytes_total": "bytes",
         "zerodoc_collective_seconds_total": "seconds",
         "zerodoc_collective_exposed_seconds_total": "exposed_seconds"}
_MEMORY = {"zerodoc_device_memory_capacity_bytes": "capacity",
           "zerodoc_memory_headroom_bytes": "headroom",
           "zerodoc_gpu_alloc_retries_total": "alloc_retries", "zerodoc_gpu_ooms_total": "ooms"}
_UNIT = {"zerodoc_unit_parameters": "params", "zerodoc_unit_parameter_bytes": "gather_bytes",
         "zerodoc_unit_reshard_after_forward": "reshard", "zerodoc_unit_index": "index",
         "zerodoc_unit_group_size": "group_size", "zerodoc_unit_sharded_bytes": "sharded_bytes",
         "zerodoc_unit_stored_parameter_bytes": "param_bytes"}


@dataclass
class Cumulative:
    """One rank's counters since attach (or over a Prometheus range), plus its levels."""

    rank: int
    labels: dict = field(default_factory=dict)  # rank labels + zerodoc_run_info labels
    scalars: dict = field(default_factory=dict)
    compute: dict = field(default_factory=dict)
    comm: dict = field(default_factory=dict)  # (unit, phase, coll) -> {count, bytes, ...}
    memory: dict = field(default_factory=dict)
    errors: dict = field(default_factory=dict)
    hooks: dict = field(default_factory=dict)
    units: dict = field(default_factory=dict)  # unit -> {params, gather_bytes, ...}
    endpoint: str | None = None
    stall: tuple | None = None  # (labels, since_unix) of the watchdog's gauge, while stuck

    def stall_record(self) -> dict | None:
        return stall_from_gauge(self.rank, self.stall[0], self.stall[1],
                                int(self.scalars.get("last_step", 0))) if self.stall else None

    @property
    def steps(self) -> int:
        return int(round(self.scalars.get("steps", 0)))

    @property
    def key(self) -> tuple:
        return (self.labels.get("run_id"), self.labels.get("node"))


def add_sample(out: dict[int, Cumulative], name: str, labels: dict, value: float) -> None:
    """Fold one sample of a zerodoc series into `out` (rank -> Cumulative)."""
    if "rank" not in labels or value != value:  # no rank label, or NaN
        return
    try:
        rank = int(labels["rank"])
    except ValueError:
        return
    c = out.setdefault(rank, Cumulative(rank))
    for k in ("local_rank", "node"):
        if k in labels:
            c.labels[k] = labels[k]
    if name in _SCALARS:
        c.scalars[_SCALARS[name]] = value
    elif name == "zerodoc_compute_seconds_total":
        c.compute[(labels.get("unit", RANK_TOTAL_UNIT), labels["phase"])] = value
    elif name in _COMM:
        c.comm.setdefault((labels.get("unit", RANK_TOTAL_UNIT), labels["phase"],
                           labels["collective"]), {})[_COMM[name]] = value
    elif name == "zerodoc_memory_bytes":
        c.memory[labels["population"]] = int(value)
    elif name in _MEMORY:
        c.memory[_MEMORY[name]] = int(value)
    elif name == "zerodoc_errors_total":
        c.errors[labels["hook"]] = int(value)
    elif name == "zerodoc_hook_available":
        c.hooks[labels["hook"]] = "ok" if value else "missing"
    elif name == "zerodoc_run_info":
        c.labels.update({k: v for k, v in labels.items()
                         if k not in ("rank", "job", "instance", "__name__")})
    elif name in _UNIT:
        c.units.setdefault(labels["unit"], {})[_UNIT[name]] = value
    elif name == STALL_GAUGE:
        c.stall = (labels, value)
    elif name == "zerodoc_unit_dtype_info":
        u = c.units.setdefault(labels["unit"], {})
        u["param_dtype"], u["reduce_dtype"] = labels.get("param_dtype", ""), \
            labels.get("reduce_dtype", "")


def share_unit_facts(ranks: dict[int, Cumulative]) -> dict[int, Cumulative]:
    """Per-unit facts are served by rank 0 only: give every rank those of the lowest rank
    that serves them."""
    src = next((c.units for _r, c in sorted(ranks.items()) if c.units), None)
    if src:
        for c in ranks.values():
            if not c.units:
                c.units = src
    return ranks


def facts_of(c: Cumulative) -> RankFacts:
    """RankFacts rebuilt from the exported series."""
    lb, sc = c.labels, c.scalars
    world = int(sc.get("world_size", 1))
    units = []
    for name, u in sorted(c.units.items(), key=lambda kv: (kv[1].get("index", 1e9), kv[0])):
        group = int(u.get("group_size", world) or world)
        gather = int(u.get("gather_bytes", 0))
        rs = u.get("reshard")
        units.append(UnitFacts(
            name=name, params=int(u.get("params", 0)),
            param_bytes=int(u.get("param_bytes", gather)), gather_bytes=gather,
            sharded_bytes=int(u.get("sharded_bytes", -(-gather // max(1, group)))),
            reshard_after_forward=None if rs is None else bool(rs), group_size=group,
            param_dtype=u.get("param_dtype", lb.get("param_dtype", "")),
            reduce_dtype=u.get("reduce_dtype", lb.get("reduce_dtype", ""))))
    stage = lb.get("zero_stage", "")
    return RankFacts(
        rank=c.rank, local_rank=int(lb.get("local_rank", c.rank)), world_size=world,
        local_world_size=int(sc.get("local_world_size", world)), node=lb.get("node", ""),
        run_id=lb.get("run_id", ""), framework=lb.get("framework", ""),
        framework_version=lb.get("framework_version", ""),
        torch_version=lb.get("torch_version", ""), device_type=lb.get("device_type", ""),
        backend=lb.get("backend", ""), zero_stage=int(stage) if stage.isdigit() else None,
        mesh_shape=tuple(int(x) for x in lb.get("mesh_shape", "").split("x") if x.isdigit()),
        mesh_dim_names=None, param_dtype=lb.get("param_dtype", ""),
        reduce_dtype=lb.get("reduce_dtype", ""), units=tuple(units),
        device_capacity_bytes=c.memory.get("capacity"), started_unix=0.0, pid=0,
        metrics_endpoint=c.endpoint, hooks=dict(c.hooks),
        config={"link": lb["link"]} if lb.get("link") else {})


def window_of(facts: RankFacts, cur: Cumulative, base: Cumulative | None = None) -> RankWindow:
    """RankWindow = cur - base (base None: cur as is, i.e. since the start)."""
    def d(a: float, b: float) -> float:
        return max(0.0, a - b)

    bs = base.scalars if base else {}
    sc = cur.scalars
    w = RankWindow(facts=facts)
    w.steps = max(0, cur.steps - (base.steps if base else 0))
    w.last_step = int(sc.get("last_step", 0))
    w.first_step = max(1, w.last_step - w.steps + 1) if w.steps else w.last_step
    w.step_seconds = d(sc.get("step_seconds", 0.0), bs.get("step_seconds", 0.0))
    w.last_step_seconds = w.max_step_seconds = sc.get("last_step_seconds", 0.0)
    for k in ("optimizer_seconds", "framework_seconds", "other_seconds", "self_seconds"):
        setattr(w, k, d(sc.get(k, 0.0), bs.get(k, 0.0)))
    w.updated_unix = sc.get("updated_unix", 0.0)
    for k, v in cur.compute.items():
        s = d(v, base.compute.get(k, 0.0) if base else 0.0)
        if s > 0:
            w.compute[k] = s
    for k, v in cur.comm.items():
        b = base.comm.get(k, {}) if base else {}
        count = int(round(d(v.get("count", 0), b.get("count", 0))))
        if count <= 0:
            continue
        secs = d(v.get("seconds", 0.0), b.get("seconds", 0.0))
        exposed = min(secs, d(v.get("exposed_seconds", 0.0), b.get("exposed_seconds", 0.0)))
        w.comm[k] = CommTotals(count, int(round(d(v.get("bytes", 0), b.get("bytes", 0)))),
                               secs, exposed, max(0.0, secs - exposed))
    w.memory = dict(cur.memory)
    w.errors = dict(cur.errors)
    return w


# --------------------------------------------------------------------------------------
# rank endpoints

_ENDPOINT = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})(?:-(\d{1,5}))?")


def is_endpoint_spec(spec: str) -> bool:
    return all(_ENDPOINT.fullmatch(p.strip()) for p in spec.split(",")) if spec else False


def parse_endpoints(spec: str) -> list[str]:
    """"h:9730,h2:9731" or "h:9730-9737" -> ["h:9730", ...]."""
    out: list[str] = []
    for part in spec.split(","):
        m = _ENDPOINT.fullmatch(part.strip())
        if not m:
            raise UserError(f"endpoint {part.strip()!r}: expected host:port or host:first-last")
        host, a = m.group(1), int(m.group(2))
        b = int(m.group(3) or a)
        if not 0 < a <= b <= 65535 or b - a >= 1024:
            raise UserError(f"endpoint {part.strip()!r}: ports must be 1-65535, first <= last, "
                            "at most 1024 of them")
        out += [f"{host}:{p}" for p in range(a, b + 1)]
    return list(dict.fromkeys(out))


def _fetch(url: str, timeout: float) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read()


def _why(e: BaseException) -> str:
    if isinstance(e, urllib.error.HTTPError):
        return f"HTTP {e.code}"
    if isinstance(e, urllib.error.URLError):
        return str(getattr(e.reason, "strerror", None) or e.reason)
    return str(getattr(e, "strerror", None) or e) or type(e).__name__


def parse_exposition(text: str, endpoint: str | None = None) -> dict[int, Cumulative]:
    """The zerodoc samples of one /metrics page, per rank."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[int, Cumulative] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.startswith("zerodoc_"):
                add_sample(out, s.name, s.labels, s.value)
    for c in out.values():
        c.endpoint = endpoint
    return {r: c for r, c in out.items() if c.units or "run_id" in c.labels}


class EndpointsSource:
    """Each rank's `/metrics`, scraped directly (see the module docstring for windows)."""

    def __init__(self, spec: str | list[str], window: int | None = 20, *,
                 timeout_s: float = 3.0, stale_after_s: float = STALE_AFTER_S):
        self.endpoints = parse_endpoints(spec if isinstance(spec, str) else ",".join(spec))
        self.window = window
        self.timeout_s = timeout_s
        self.stale_after_s = stale_after_s
        self.description = f"endpoints {spec if isinstance(spec, str) else ','.join(spec)}"
        self.unreachable: dict[str, str] = {}  # endpoint -> why, after the last snapshot
        self._history: dict[int, list[Cumulative]] = {}
        self._last: dict[int, RankWindow] = {}

    def _scrape(self, ep: str):
        try:
            text = _fetch(f"http://{ep}/metrics", self.timeout_s).decode("utf-8", "replace")
        except (OSError, ValueError) as e:
            return ep, None, _why(e)
        try:
            ranks = parse_exposition(text, ep)
        except (ValueError, KeyError, IndexError) as e:
            return ep, None, f"not a Prometheus exposition ({e})"
        return ep, ranks, None if ranks else "no zerodoc metrics there"

    def snapshot(self) -> RunSnapshot:
        with ThreadPoolExecutor(max_workers=min(16, len(self.endpoints))) as pool:
            results = list(pool.map(self._scrape, self.endpoints))
        got: dict[int, Cumulative] = {}
        self.unreachable = {ep: why for ep, ranks, why in results if ranks is None}
        for _ep, ranks, _why_ in results:
            got.update(ranks or {})
        share_unit_facts(got)
        if not got:
            detail = "; ".join(f"{ep} ({why})" for ep, why in list(self.unreachable.items())[:4])
            more = len(self.unreachable) - 4
            raise UserError(f"no zerodoc rank answered at {len(self.endpoints)} endpoint(s): "
                            f"{detail}{f'; and {more} more' if more > 0 else ''}")
        snap = RunSnapshot(source=self.description)
        for rank, cur in sorted(got.items()):
            hist = self._history.setdefault(rank, [])
            if hist and (cur.steps < hist[-1].steps or cur.key != hist[-1].key):
                hist.clear()  # the rank restarted: its counters did too
            base = None
            if self.window:
                older = [h for h in hist if h.steps <= cur.steps - self.window]
                base = older[-1] if older else None
                if base is not None:
                    del hist[:hist.index(base)]
            else:
                hist.clear()
            hist.append(cur)
            snap.ranks[rank] = self._last[rank] = window_of(facts_of(cur), cur, base)
            if cur.stall_record():
                snap.stalls[rank] = cur.stall_record()
        now = time.time()
        for rank, w in self._last.items():
            if rank not in got:
                snap.ranks[rank] = w
                snap.stale_ranks.add(rank)
        world = max(w.facts.world_size for w in snap.ranks.values())
        snap.stale_ranks |= set(range(world)) - set(snap.ranks)
        for rank, w in snap.ranks.items():
            if w.updated_unix and now - w.updated_unix > self.stale_after_s:
                snap.stale_ranks.add(rank)
        return snap


# --------------------------------------------------------------------------------------
# Prometheus HTTP API


class PrometheusSource:
    """A Prometheus server that scrapes the ranks (for clusters)."""

    def __init__(self, url: str, window: int | None = 20, *, timeout_s: float = 5.0,
                 stale_after_s: float = STALE_AFTER_S, lookback: str = "15m",
                 run_id: str | None = None):
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise UserError(f"{url!r} is not an http(s) URL of a Prometheus server")
        self.url = url.rstrip("/")
        self.window = window
        self.timeout_s = timeout_s
        self.stale_after_s = stale_after_s
        self.lookback = lookback
        self.run_id = run_id
        self.description = f"Prometheus {self.url}"
        self._check()

    def _get(self, path: str, **params) -> dict:
        url = f"{self.url}/api/v1/{path}" + ("?" + urllib.parse.urlencode(params) if params else "")
        not_prom = f"{self.url} does not look like a Prometheus server (GET /api/v1/{path}: "
        try:
            body = json.loads(_fetch(url, self.timeout_s))
        except urllib.error.HTTPError as e:
            raise UserError(f"{not_prom}HTTP {e.code}); for a rank's own /metrics pass "
                            "host:port without http://") from None
        except ValueError:
            raise UserError(f"{not_prom}not JSON)") from None
        except OSError as e:
            raise UserError(f"cannot reach Prometheus at {self.url}: {_why(e)}") from None
        if not isinstance(body, dict) or body.get("status") != "success":
            raise UserError(f"{not_prom}{str(body)[:120]})")
        return body["data"]

    def _check(self) -> None:
        self._get("status/buildinfo")

    def _query(self, expr: str) -> list[tuple[dict, float]]:
        data = self._get("query", query=expr)
        return [(r["metric"], float(r["value"][1])) for r in data.get("result", ())]

    def _scrape_interval(self) -> float:
        try:
            targets = self._get("targets", state="active").get("activeTargets", [])
            ivs = [_duration(t.get("scrapeInterval", "")) for t in targets]
            return max([x for x in ivs if x] or [15.0])
        except UserError:
            return 15.0

    def snapshot(self) -> RunSnapshot:
        lb = self.lookback
        info = self._query(f"last_over_time(zerodoc_run_info[{lb}])")
        if not info:
            raise UserError(f"no zerodoc series in Prometheus {self.url} over the last {lb} "
                            "(is it scraping the ranks' /metrics?)")
        ts = {m.get("instance"): v for m, v in
              self._query(f"last_over_time(zerodoc_last_step_timestamp_seconds[{lb}])")}
        runs: dict[str, set] = {}
        for m, _v in info:
            runs.setdefault(m.get("run_id", ""), set()).add(m.get("instance"))
        if self.run_id is not None:
            if self.run_id not in runs:
                raise UserError(f"run {self.run_id!r} not in Prometheus {self.url} "
                                f"(runs: {', '.join(sorted(runs))})")
            run = self.run_id
        else:
            run = max(runs, key=lambda r: max(ts.get(i, 0.0) for i in runs[r]))
        instances = runs[run]
        span = None
        if self.window:
            cnt = sum(v for m, v in self._query(
                f"last_over_time(zerodoc_step_duration_seconds_count[{lb}])")
                if m.get("instance") in instances)
            tot = sum(v for m, v in self._query(
                f"last_over_time(zerodoc_step_duration_seconds_sum[{lb}])")
                if m.get("instance") in instances)
            mean = tot / cnt if cnt else 1.0
            span = max(self.window * mean, 4 * self._scrape_interval())
        got = self._collect(instances, span)
        if span is not None and not any(c.steps for c in got.values()):
            got = self._collect(instances, None)  # nothing in the window: an ended run
        snap = RunSnapshot(source=self.description)
        for rank, c in sorted(got.items()):
            snap.ranks[rank] = window_of(facts_of(c), c)
            if c.stall_record():
                snap.stalls[rank] = c.stall_record()
        up = {m.get("instance"): v for m, v in self._query("up")}
        now = time.time()
        for rank, c in got.items():
            inst = c.endpoint
            w = snap.ranks[rank]
            if up.get(inst, 1.0) == 0 or (w.updated_unix and
                                          now - w.updated_unix > self.stale_after_s):
                snap.stale_ranks.add(rank)
        if snap.ranks:
            world = max(w.facts.world_size for w in snap.ranks.values())
            snap.stale_ranks |= set(range(world)) - set(snap.ranks)
        return snap

    def _collect(self, instances: set, span: float | None) -> dict[int, Cumulative]:
        out: dict[int, Cumulative] = {}
        for name in WINDOWED + LEVELS:
            if span is not None and name in WINDOWED:
                expr = f"increase({name}[{int(span + 0.999)}s])"
            elif name == STALL_GAUGE:  # present only while a rank is stuck: now, not lately
                expr = name
            else:
                expr = f"last_over_time({name}[{self.lookback}])"
            for m, v in self._query(expr):
                if m.get("instance") in instances:
                    add_sample(out, name, m, v)
                    if "rank" in m and m["rank"].isdigit() and int(m["rank"]) in out:
                        out[int(m["rank"])].endpoint = m.get("instance")
        return share_unit_facts(
            {r: c for r, c in out.items() if c.units or "run_id" in c.labels})


def _duration(text: str) -> float | None:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h)", text.strip())
    if not m:
        return None
    return float(m.group(1)) * {"ms": 1e-3, "s": 1, "m": 60, "h": 3600}[m.group(2)]


# --------------------------------------------------------------------------------------


def open_source(spec: str | None, window: int | None = 20, *,
                stale_after_s: float = STALE_AFTER_S, trace_facts: dict | None = None) -> Source:
    """A source from a command-line SOURCE: a run directory; `http(s)://...` a Prometheus
    server; `host:port[,host:port...]` or `host:first-last` rank endpoints; PyTorch profiler
    traces (a directory of them, a file, files separated by commas; `trace_facts`: see
    `zerodoc.trace.TraceFacts`); None the latest local run (under ./zerodoc-runs)."""
    from . import trace  # profiler traces: zerodoc/trace (no heavy import until opened)
    if spec is None:
        trace.refuse_facts(trace_facts)
        return RunDirSource(latest_run(), window, stale_after_s=stale_after_s)
    spec = spec.strip()
    if trace.is_trace_spec(spec):
        return trace.open_traces(spec, window, **(trace_facts or {}))
    trace.refuse_facts(trace_facts)
    if Path(spec).is_dir():
        return RunDirSource(spec, window, stale_after_s=stale_after_s)
    if spec.startswith(("http://", "https://")):
        return PrometheusSource(spec, window, stale_after_s=stale_after_s)
    if is_endpoint_spec(spec):
        return EndpointsSource(spec, window, stale_after_s=stale_after_s)
    if "/" in spec or spec.startswith("."):
        raise UserError(f"no run directory at {spec}")
    raise UserError(f"{spec!r} is neither a run directory, a Prometheus URL (http://...) "
                    "nor rank endpoints (host:port, host:port,host:port or host:9730-9737)")
