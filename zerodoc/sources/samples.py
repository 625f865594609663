"""Exported samples (name, labels, value) -> per-rank cumulative totals -> `RankWindow`s.
Shared by the endpoints and Prometheus sources.

Which series a source reads and where each goes in the run model is the metric catalog's
`into` column (`zerodoc.catalog`): nothing here names a metric.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..catalog import CATALOG, RANK_LABELS, RANK_TOTAL_UNIT
from ..runmodel import CommTotals, RankFacts, RankWindow, UnitFacts



def _routes() -> dict[str, tuple[str, str, bool]]:
    """Series name -> (kind, argument, windowed) from the catalog's `into` column."""
    out: dict[str, tuple[str, str, bool]] = {}
    for m in CATALOG:
        if not m.into:
            continue
        kind, _, arg = m.into.partition(":")
        if kind == "histogram":
            s, c = arg.split(",")
            out[f"{m.name}_sum"] = ("scalar", s, True)
            out[f"{m.name}_count"] = ("scalar", c, True)
            continue
        name = f"{m.name}_info" if m.type == "info" else m.name
        out[name] = (kind, arg, m.type == "counter"
                     and kind in ("scalar", "compute", "comm", "framework"))
    return out


ROUTES = _routes()
WINDOWED = tuple(n for n, r in ROUTES.items() if r[2])  # a window is taken of these
LEVELS = tuple(n for n, r in ROUTES.items() if not r[2])  # the latest value counts
_DROP_LABELS = {"rank", "job", "instance", "__name__", *RANK_LABELS}


def series_of(kind: str, arg: str | None = None) -> list[str]:
    """Names of the series filed as `kind` (and `arg`)."""
    return [n for n, (k, a, _w) in ROUTES.items() if k == kind and (arg is None or a == arg)]


@dataclass
class Cumulative:
    """One rank's counters since attach (or over a Prometheus range), plus its levels."""

    rank: int
    labels: dict = field(default_factory=dict)  # rank labels + zerodoc_run_info labels
    scalars: dict = field(default_factory=dict)
    compute: dict = field(default_factory=dict)
    comm: dict = field(default_factory=dict)  # (unit, phase, coll) -> {count, bytes, ...}
    framework: dict = field(default_factory=dict)  # (unit, phase) -> the framework's seconds
    memory: dict = field(default_factory=dict)
    errors: dict = field(default_factory=dict)
    hooks: dict = field(default_factory=dict)
    units: dict = field(default_factory=dict)  # unit -> {params, gather_bytes, ...}
    endpoint: str | None = None
    closed_unix: float | None = None  # the exporter's "closed" signal
    stall: tuple | None = None  # (labels, since_unix) of the watchdog's gauge, while stuck

    def stall_record(self) -> dict | None:
        from ..stalls import stall_from_gauge

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
    route = ROUTES.get(name)
    if route is None or "rank" not in labels or value != value:  # unknown, no rank, NaN
        return
    try:
        rank = int(labels["rank"])
    except ValueError:
        return
    c = out.setdefault(rank, Cumulative(rank))
    for k in ("local_rank", "node"):
        if k in labels:
            c.labels[k] = labels[k]
    kind, arg, _w = route
    if kind == "scalar":
        c.scalars[arg] = value
    elif kind == "compute":
        c.compute[(labels.get("unit", RANK_TOTAL_UNIT), labels["phase"])] = value
    elif kind == "framework":
        c.framework[(labels.get("unit", RANK_TOTAL_UNIT), labels["phase"])] = value
    elif kind == "comm":
        c.comm.setdefault((labels.get("unit", RANK_TOTAL_UNIT), labels["phase"],
                           labels["collective"]), {})[arg] = value
    elif kind == "memory":
        key = labels[arg[1:-1]] if arg.startswith("{") else arg
        c.memory[key] = int(value)
    elif kind == "errors":
        c.errors[labels["hook"]] = int(value)
    elif kind == "hooks":
        c.hooks[labels["hook"]] = "ok" if value else "missing"
    elif kind == "info":
        c.labels.update({k: v for k, v in labels.items() if k not in _DROP_LABELS})
    elif kind == "unit":
        c.units.setdefault(labels["unit"], {})[arg] = value
    elif kind == "unit_info":
        u = c.units.setdefault(labels["unit"], {})
        u["param_dtype"] = labels.get("param_dtype", "")
        u["reduce_dtype"] = labels.get("reduce_dtype", "")
    elif kind == "closed":
        if value > 0:
            c.closed_unix = value
    elif kind == "stall":
        c.stall = (labels, value)


def share_unit_facts(ranks: dict[int, Cumulative]) -> dict[int, Cumulative]:
    """Per-unit facts are served by one rank (rank 0): give every rank those of the lowest
    rank that serves them."""
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
            reduce_dtype=u.get("reduce_dtype", lb.get("reduce_dtype", "")),
            tensors=int(u["tensors"]) if u.get("tensors") is not None else None))
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
        config={"link": lb["link"]} if lb.get("link") else {},
        job_id=lb.get("job_id") or None)


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
    for k in ("optimizer_seconds", "framework_seconds", "other_seconds", "self_seconds",
              "host_compute_seconds"):
        setattr(w, k, d(sc.get(k, 0.0), bs.get(k, 0.0)))
    for k in ("launch_checks", "launch_caught_up"):
        setattr(w, k, int(round(d(sc.get(k, 0), bs.get(k, 0)))))
    if "detail_steps" in sc:  # sampled steps: the per-unit counters cover these
        w.detail_steps = min(w.steps, int(round(d(sc["detail_steps"],
                                                  bs.get("detail_steps", 0)))))
    w.updated_unix = sc.get("updated_unix", 0.0)
    for k, v in cur.compute.items():
        s = d(v, base.compute.get(k, 0.0) if base else 0.0)
        if s > 0:
            w.compute[k] = s
    for k, v in cur.framework.items():
        s = d(v, base.framework.get(k, 0.0) if base else 0.0)
        if s > 0:
            w.unit_framework[k] = s
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
