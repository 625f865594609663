"""Run-log records as Python objects, and the parsing of one JSON line into them.

Plain Python (stdlib only): the writer runs inside training jobs, the readers everywhere.
The format itself is described in `zerodoc.runlog` (and docs/runlog.md).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from ..errors import UserError
from ..runmodel import CommTotals, RankFacts, UnitFacts

SCHEMA = 3
READS = (1, 2, 3)  # schemas this zerodoc reads (3: schema 2 with compact columns, `column`)
MAX_EVENTS = 256  # non-step records kept per rank by the readers (RankLog.events)

# Scalar fields of step / interval / total records: (JSON key, attribute name).
SCALARS = (("step_s", "step_seconds"), ("optimizer_s", "optimizer_seconds"),
           ("framework_s", "framework_seconds"), ("other_s", "other_seconds"),
           ("self_s", "self_seconds"))


class RunLogError(UserError):
    """A run directory or run log that cannot be read; the message says why."""


def rank_log_name(rank: int) -> str:
    return f"rank-{rank:05d}.jsonl"


# Step-level numbers that add up over steps, under the same attribute name on StepRecord,
# StepTotals, UnitsBlock and model.RankWindow: every fold over steps sums exactly these.
SUMMED_SCALARS = ("step_seconds", "optimizer_seconds", "framework_seconds", "other_seconds",
                  "self_seconds", "host_compute_seconds", "launch_checks", "launch_caught_up")


@dataclass
class StepRecord:
    """One step with its full per-unit detail (schema 1 step lines; schema 2 detail files)."""

    step: int
    end_unix: float
    step_seconds: float
    optimizer_seconds: float
    framework_seconds: float
    other_seconds: float
    self_seconds: float
    compute: dict[tuple[str, str], float]
    comm: dict[tuple[str, str, str], CommTotals]
    memory: dict[str, int]
    errors: dict[str, int]
    host_compute_seconds: float = 0.0  # GPU: the host's launch time of the compute rows
    launch_checks: int = 0  # GPU launch-bound probe: segments checked ...
    launch_caught_up: int = 0  # ... and how many found the device already caught up
    # A sampled step (per-unit rows recorded); False: step-level numbers only (its `compute`
    # and `comm` are empty, not zero). Records without the field (older logs): True.
    detail: bool = True
    # K in force: about 1 step in K is sampled. Written on every step since 2026-11-27
    # (before: on sampled steps only, so an older log's K is its newest sample's)
    detail_k: int | None = None
    # The framework's time per unit and phase (part of `framework_seconds`); empty: none
    # recorded (older logs)
    unit_framework: dict[tuple[str, str], float] = field(default_factory=dict)

    @property
    def compute_seconds(self) -> float | None:
        return sum(self.compute.values()) if self.detail else None

    @property
    def exposed_seconds(self) -> float | None:
        return sum(t.exposed_seconds for t in self.comm.values()) if self.detail else None


@dataclass(slots=True)
class StepTotals:
    """One step's totals (a schema-2 step line): no per-unit detail."""

    step: int
    end_unix: float
    step_seconds: float
    optimizer_seconds: float
    framework_seconds: float
    other_seconds: float
    self_seconds: float
    compute_seconds: float | None  # None: not measured (an unsampled step)
    exposed_seconds: float | None
    memory: dict[str, int] | None
    errors: dict[str, int] | None
    host_compute_seconds: float = 0.0
    launch_checks: int = 0
    launch_caught_up: int = 0
    detail: bool = True  # a sampled step (see StepRecord.detail)
    detail_k: int | None = None  # K in force (see StepRecord.detail_k)


class UnitsBlock:
    """Per-unit totals over a run of steps: an `interval` line (steps first..last) or a
    `total` line (every step of the segment up to `last_step`).

    Kept as arrays (`unit_arrays`: compute keys and seconds, comm keys and [count, bytes,
    seconds, exposed, hidden] rows; key tuples shared between ranks), so a thousand ranks'
    intervals are added and compared with numpy; `compute` / `comm` give the dicts."""

    __slots__ = ("kind", "first_step", "last_step", "steps", "end_unix", "step_seconds",
                 "optimizer_seconds", "framework_seconds", "other_seconds", "self_seconds",
                 "max_step_seconds", "unit_arrays", "_dicts", "host_compute_seconds",
                 "launch_checks", "launch_caught_up", "detail_steps", "max_past_warmup",
                 "unit_framework")

    def __init__(self, kind, first_step, last_step, steps, end_unix, step_seconds,
                 optimizer_seconds, framework_seconds, other_seconds, self_seconds,
                 max_step_seconds, unit_arrays):
        self.kind, self.first_step, self.last_step, self.steps = kind, first_step, last_step, steps
        self.end_unix, self.step_seconds = end_unix, step_seconds
        self.optimizer_seconds, self.framework_seconds = optimizer_seconds, framework_seconds
        self.other_seconds, self.self_seconds = other_seconds, self_seconds
        self.max_step_seconds = max_step_seconds
        self.unit_arrays = unit_arrays
        self._dicts = None
        self.host_compute_seconds = 0.0
        self.launch_checks = self.launch_caught_up = 0
        self.detail_steps = steps  # steps the per-unit totals cover (sampled steps)
        self.max_past_warmup: float | None = None  # `total` lines: the longest step after 1
        # the framework's time per (unit, phase) over the steps (empty: not recorded)
        self.unit_framework: dict[tuple[str, str], float] = {}

    def _make(self):
        if self._dicts is None:
            self._dicts = dicts_of(self.unit_arrays)
        return self._dicts

    @property
    def compute(self) -> dict[tuple[str, str], float]:
        return self._make()[0]

    @property
    def comm(self) -> dict[tuple[str, str, str], CommTotals]:
        return self._make()[1]


@dataclass
class RankLog:
    """One segment of one rank's run log, as far as it was read."""

    facts: RankFacts
    steps: list[StepRecord] = field(default_factory=list)  # full per-unit detail (recent)
    totals: list[StepTotals] = field(default_factory=list)  # step lines read (all or a tail)
    blocks: list[UnitsBlock] = field(default_factory=list)  # interval / total lines read
    ended: bool = False  # a clean close was recorded
    interrupted: bool = False  # ... of a run the user stopped (Ctrl-C)
    bad_lines: int = 0  # truncated or malformed lines skipped
    events: list[dict] = field(default_factory=list)  # record types the reader does not use
    segment: int = 0
    segments: int = 1  # segments in this rank's file
    schema: int = SCHEMA
    dropped: int = 0  # records the writer dropped (queue full), as the log says
    lost: int = 0  # records a failed write lost (disk full, read-only, size limit) ...
    lost_steps: int = 0  # ... of which step lines, as the log says (`lost`, `end`)
    write_error: str | None = None  # why those writes failed ("disk full", ...)
    path: str = ""
    header_at: int = 0  # byte offset of this segment's header in the file
    read_to: int = 0  # byte offset after the last complete line read
    torn: bool = False  # the last line read had no newline (counted in bad_lines)
    # a log truncated in place (logrotate's copytruncate; docs/runlog.md): the writer wrote
    # its header again ("truncated in place"), or a follower saw the file shrink; the lines
    # between the cut and that header have no header and are not read: counted here
    truncated: bool = False
    headerless: int = 0
    reopened: str | None = None  # the run directory was deleted / replaced: the header again

    def add_event(self, rec: dict) -> None:
        self.events.append(rec)
        if len(self.events) > MAX_EVENTS:
            del self.events[:-MAX_EVENTS]

    @property
    def last_step(self) -> int:
        """The newest step this log shows (0 before the first one)."""
        cands = [0]
        if self.totals:
            cands.append(self.totals[-1].step)
        if self.steps:
            cands.append(self.steps[-1].step)
        if self.blocks:
            cands.append(self.blocks[-1].last_step)
        return max(cands)

    @property
    def last_unix(self) -> float:
        """When the newest step ended (the header's start time before the first step)."""
        best = (0, self.facts.started_unix)
        if self.totals:
            best = max(best, (self.totals[-1].step, self.totals[-1].end_unix))
        if self.steps:
            best = max(best, (self.steps[-1].step, self.steps[-1].end_unix))
        return best[1]


# --------------------------------------------------------------------------------------
# parsing


MAX_WORLD = 1_000_000  # ranks: far beyond any job, small enough to list
MAX_UNITS = 1_000_000
MAX_COUNT = 1 << 62  # counts and bytes: an int64 that no real number reaches


def _vint(v, name: str, lo: int = 0, hi: int = MAX_COUNT) -> int:
    """An int field in [lo, hi] (a whole float such as 3.0 counts; a bool, a string or 2.5
    does not), else ValueError."""
    if type(v) is float and v.is_integer() and lo <= v <= hi:
        return int(v)
    if type(v) is not int or not lo <= v <= hi:
        raise ValueError(f"{name} must be an integer in [{lo}, {hi}], not {v!r:.40}")
    return v


# Rounding slack below 0: interval lines are differences of cumulative float sums, and a
# remainder like other_s is a difference too, so an honest zero can be written as -1e-17.
SLACK = 1e-6


def _vnum(v, name: str, lo: float = 0.0) -> float:
    """A finite number >= lo (less rounding slack), else ValueError (NaN, infinities,
    negative durations)."""
    if type(v) not in (int, float) or not math.isfinite(v) or v < lo - SLACK:
        raise ValueError(f"{name} must be a finite number >= {lo:g}, not {v!r:.40}")
    return float(v)


def _str(v, name: str, optional: bool = False, limit: int = 4096) -> None:
    if v is None and optional:
        return
    if not isinstance(v, str) or len(v) > limit:
        raise ValueError(f"{name} must be a string of at most {limit} characters")


def check_unit(u) -> dict:
    """A header's unit entry, each field checked against its meaning."""
    if not isinstance(u, dict):
        raise ValueError("a unit is not an object")
    _str(u.get("name"), "unit name")
    for k in ("params", "param_bytes", "gather_bytes", "sharded_bytes"):
        _vint(u.get(k), f"unit {k}")
    _vint(u.get("group_size"), "unit group_size", 1, MAX_WORLD)
    _vint(u.get("replicate_size", 1), "unit replicate_size", 1, MAX_WORLD)
    if u.get("tensors") is not None:  # absent in logs before zerodoc recorded it
        _vint(u.get("tensors"), "unit tensors")
    if u.get("reshard_after_forward") not in (True, False, None):
        raise ValueError("unit reshard_after_forward must be true, false or null")
    return u


def check_facts(d: dict) -> None:
    """The header's rank facts checked against their meaning (ValueError says which)."""
    world = _vint(d.get("world_size"), "world_size", 1, MAX_WORLD)
    _vint(d.get("rank"), "rank", 0, world - 1)
    lws = _vint(d.get("local_world_size"), "local_world_size", 1, world)
    _vint(d.get("local_rank"), "local_rank", 0, lws - 1)
    _vnum(d.get("started_unix"), "started_unix")
    _vint(d.get("pid"), "pid", 0, 1 << 31)
    if d.get("zero_stage") is not None:
        _vint(d.get("zero_stage"), "zero_stage", 0, 3)
    if d.get("device_capacity_bytes") is not None:
        _vint(d.get("device_capacity_bytes"), "device_capacity_bytes")
    for k in ("node", "run_id", "framework", "framework_version", "torch_version",
              "device_type", "backend", "param_dtype", "reduce_dtype"):
        _str(d.get(k), k, optional=k not in ("node", "run_id"))
    _str(d.get("metrics_endpoint"), "metrics_endpoint", optional=True, limit=300)
    _str(d.get("job_id"), "job_id", optional=True)  # absent in logs before 2026-11-29
    units = d.get("units")
    if not isinstance(units, list) or len(units) > MAX_UNITS:
        raise ValueError(f"units must be a list of at most {MAX_UNITS:,}")
    mesh = d.get("mesh_shape") or ()
    if not isinstance(mesh, (list, tuple)) or len(mesh) > 8:
        raise ValueError("mesh_shape must be a list of at most 8 sizes")
    for m in mesh:
        _vint(m, "mesh_shape", 1, MAX_WORLD)
    for k in ("hooks", "config"):
        if d.get(k) is not None and not isinstance(d.get(k), dict):
            raise ValueError(f"{k} must be an object")


_UNIT_FACTS: dict[int, tuple] = {}
# What a header's unit may carry; a key a newer zerodoc added is left out, not an error (a
# log written by a newer zerodoc stays readable: before `tensors` an unknown key failed the
# whole header)
_UNIT_KEYS = frozenset(f.name for f in dataclasses.fields(UnitFacts))


def _unit_facts(units: list) -> tuple[UnitFacts, ...]:
    """UnitFacts of a header's `units` (shared between ranks whose headers share the list)."""
    hit = _UNIT_FACTS.get(id(units))
    if hit is not None and hit[0] is units:
        return hit[1]
    out = tuple(UnitFacts(**{k: v for k, v in check_unit(u).items() if k in _UNIT_KEYS})
                for u in units)
    if len(_UNIT_FACTS) > 256:
        _UNIT_FACTS.clear()
    _UNIT_FACTS[id(units)] = (units, out)
    return out


def facts_from_dict(d: dict) -> RankFacts:
    """RankFacts from a header dict (run log header, or a cached scrape)."""
    try:
        check_facts(d)
        units = _unit_facts(d["units"])
        names = {f.name for f in dataclasses.fields(RankFacts)}
        kw = {k: v for k, v in d.items() if k in names}
        kw["units"] = units
        kw["mesh_shape"] = tuple(kw.get("mesh_shape") or ())
        if kw.get("mesh_dim_names") is not None:
            kw["mesh_dim_names"] = tuple(kw["mesh_dim_names"])
        return RankFacts(**kw)
    except (KeyError, TypeError, ValueError) as e:
        raise RunLogError(f"run log header is not a zerodoc schema-{d.get('schema', SCHEMA)} "
                          f"header: {e}") from None


def check_header(head: object, where: str) -> dict:
    """The header dict, or a RunLogError saying precisely what is wrong with it."""
    if not isinstance(head, dict) or head.get("type") != "header":
        raise RunLogError(f"{where}: first line is not a zerodoc header")
    schema = head.get("schema")
    if schema not in READS:
        newer = isinstance(schema, int) and schema > SCHEMA
        raise RunLogError(
            f"{where}: run log schema {schema!r}; this zerodoc reads schemas "
            f"{', '.join(map(str, READS))}"
            + (" (written by a newer zerodoc: upgrade zerodoc to read it)" if newer else ""))
    return head


def step_from_dict(d: dict, unit_names: list[str]) -> StepRecord:
    """A full step record (compute / comm rows refer to units by index)."""
    check_record(d, len(unit_names))
    compute: dict[tuple[str, str], float] = {}
    for u, phase, s in d.get("compute", ()):
        key = (unit_names[u], phase)
        compute[key] = compute.get(key, 0.0) + float(s)
    comm: dict[tuple[str, str, str], CommTotals] = {}
    for u, phase, coll, n, b, s, ex, hid in d.get("comm", ()):
        key = (unit_names[u], phase, coll)
        t = comm.get(key)
        if t is None:  # the common case: one row per key
            comm[key] = CommTotals(int(n), int(b), float(s), float(ex), float(hid))
        else:
            t.add(CommTotals(int(n), int(b), float(s), float(ex), float(hid)))
    framework: dict[tuple[str, str], float] = {}
    for u, phase, s in d.get("framework", ()):
        key = (unit_names[u], phase)
        framework[key] = framework.get(key, 0.0) + float(s)
    k = d.get("detail_k")
    return StepRecord(
        step=int(d["step"]), end_unix=float(d["end_unix"]), step_seconds=float(d["step_s"]),
        optimizer_seconds=_num(d, "optimizer_s"), framework_seconds=_num(d, "framework_s"),
        other_seconds=_num(d, "other_s"), self_seconds=_num(d, "self_s"),
        compute=compute, comm=comm,
        memory={k: int(v) for k, v in d.get("mem", {}).items()},
        errors={k: int(v) for k, v in d.get("errors", {}).items()},
        host_compute_seconds=_num(d, "host_compute_s") if "host_compute_s" in d
        else sum(compute.values()),
        launch_checks=int(d.get("launch", (0, 0))[0]),
        launch_caught_up=int(d.get("launch", (0, 0))[1]),
        detail=d.get("detail") is not False, detail_k=int(k) if k else None,
        unit_framework=framework)


def _num(d: dict, key: str) -> float:
    """A step-level number; absent or null (not measured on an unsampled step): 0."""
    v = d.get(key)
    return 0.0 if v is None else float(v)


def _opt(d: dict, key: str) -> float | None:
    v = d.get(key)
    return None if v is None else float(v)


# Numbers of step / interval / total lines that are durations or times: finite and >= 0
# where present (null: not measured, left to the parser).
_TIMES = ("end_unix", "step_s", "optimizer_s", "framework_s", "other_s", "wait_s", "self_s",
          "compute_s", "exposed_s", "host_compute_s", "max_step_s")


def check_record(d: dict, units: int | None = None) -> None:
    """A step, interval or total line's fields checked against their meaning (ValueError
    says which): times finite and >= 0, step numbers >= 1, counts and bytes non-negative
    integers, unit indices within the header's `units`. The parsers call it first."""
    if not isinstance(d, dict):
        raise ValueError("a record is not an object")
    for k in _TIMES:
        v = d.get(k)
        if v is not None:
            _vnum(v, k)
    for k in ("step", "first", "last"):
        if k in d:
            _vint(d[k], k, 1)
    if "steps" in d:
        _vint(d["steps"], "steps")
    launch = d.get("launch")
    if launch:
        _vint(launch[0], "launch checks")
        _vint(launch[1], "launch caught up")
    for k in ("mem", "errors"):
        for name, v in (d.get(k) or {}).items():
            _vint(v, f"{k} {name!s:.40}")
    if units is None:
        return
    for key in ("compute", "framework"):
        for row in d.get(key, ()):
            _vint(row[0], "unit index", 0, units - 1)
            _vnum(row[2], f"{key} seconds")
    for row in d.get("comm", ()):
        _vint(row[0], "unit index", 0, units - 1)
        _vint(row[3], "count")
        _vint(row[4], "bytes")
        for x in row[5:8]:
            _vnum(x, "comm seconds")


def totals_from_dict(d: dict) -> StepTotals:
    """A step line's totals (schema 2 step line, or a schema 1 step line's totals)."""
    check_record(d)
    mem = d.get("mem")
    errs = d.get("errors")
    launch = d.get("launch") or (0, 0)
    detail = d.get("detail") is not False
    compute = _opt(d, "compute_s") if detail or d.get("compute_s") is not None else None
    if compute is None and detail:
        compute = 0.0
    exposed = _opt(d, "exposed_s")
    if exposed is None and detail:
        exposed = 0.0
    host = _opt(d, "host_compute_s")
    k = d.get("detail_k")
    return StepTotals(
        int(d["step"]), float(d["end_unix"]), float(d["step_s"]),
        _num(d, "optimizer_s"), _num(d, "framework_s"), _num(d, "other_s"), _num(d, "self_s"),
        compute, exposed,
        {k: int(v) for k, v in mem.items()} if mem else None,
        {k: int(v) for k, v in errs.items()} if errs else None,
        host if host is not None else (compute or 0.0), int(launch[0]), int(launch[1]),
        detail, int(k) if k else None)


def totals_of(s: StepRecord) -> StepTotals:
    return StepTotals(s.step, s.end_unix, s.step_seconds, s.optimizer_seconds,
                      s.framework_seconds, s.other_seconds, s.self_seconds, s.compute_seconds,
                      s.exposed_seconds, s.memory or None, s.errors or None,
                      s.host_compute_seconds, s.launch_checks, s.launch_caught_up, s.detail,
                      s.detail_k)


_INTERN: dict[tuple, tuple] = {}


def _intern(keys: tuple) -> tuple:
    """One tuple object for equal key tuples (every rank's blocks share their keys)."""
    got = _INTERN.get(keys)
    if got is None:
        if len(_INTERN) > 4096:
            _INTERN.clear()
            _KEYS.clear()  # keyed by the ids of interned tuples
        got = _INTERN[keys] = keys
    return got


_KEYS: dict[tuple, list] = {}


def _keys(names: tuple, units: list[int], rest: tuple) -> list:
    """[(unit name, *rest) for each unit index], the same tuples for every rank."""
    k = (id(names), rest, tuple(units))
    got = _KEYS.get(k)
    if got is None:
        if len(_KEYS) > 4096:
            _KEYS.clear()
        if not all(type(u) is int and 0 <= u < len(names) for u in units):
            raise ValueError("unit indices must be integers within the header's units")
        got = _KEYS[k] = [(names[u], *rest) for u in units]
    return got


def unit_column(g: dict) -> list:
    """A `units` group's unit indices: a list, or (schema 3) n for 0..n-1."""
    u = g["unit"]
    if type(u) is int and 0 <= u <= MAX_UNITS:
        return list(range(u))
    return u


def column(g: dict, name: str, units: list) -> list:
    """A per-unit column of a `units` group: a list (one number per unit), or (schema 3,
    the writer's `_compact`) one number for every unit, or the name of the group's column
    it equals ("seconds")."""
    col = g[name]
    if type(col) is str and col != name and col in g and type(g[col]) is list:
        col = g[col]
    elif type(col) in (int, float):
        col = [col] * len(units)
    return _same_length(col, units)


def arrays_from_columns(units: dict, unit_names: list[str]) -> tuple:
    """(compute keys, seconds array, comm keys, [K, 5] array) from the columnar `units`
    object of interval / total lines."""
    import numpy as np

    names = _intern(tuple(unit_names))
    ck, cv = [], []
    for g in units.get("compute", ()):
        phase, idx = g["phase"], unit_column(g)
        ck += _keys(names, idx, (phase,))
        cv += column(g, "seconds", idx)
    mk, cols = [], [[], [], [], [], []]
    for g in units.get("comm", ()):
        phase, coll, idx = g["phase"], g["collective"], unit_column(g)
        mk += _keys(names, idx, (phase, coll))
        for i, f in enumerate(("count", "bytes", "seconds", "exposed", "hidden")):
            cols[i] += column(g, f, idx)
    mv = np.array(cols, np.float64).T.reshape(len(mk), 5) if mk else np.zeros((0, 5))
    cv = np.array(cv, np.float64)
    for a in (cv, mv):  # durations, counts and bytes: finite and >= 0
        if a.size and not (np.isfinite(a).all() and (a >= -SLACK).all()):
            raise ValueError("per-unit numbers must be finite and >= 0")
    return _intern(tuple(ck)), cv, _intern(tuple(mk)), mv


def _same_length(col: list, units: list) -> list:
    """A per-unit column (its numbers are checked as an array: finite, >= 0)."""
    if not isinstance(col, list) or not isinstance(units, list) or len(col) != len(units):
        raise ValueError("a per-unit column must hold one number per unit")
    return col


def dicts_of(arrays: tuple) -> tuple[dict, dict]:
    """(compute, comm) dicts from unit arrays."""
    ck, cv, mk, mv = arrays
    compute = dict(zip(ck, cv.tolist()))
    comm = {k: CommTotals(int(r[0]), int(r[1]), r[2], r[3], r[4])
            for k, r in zip(mk, mv.tolist())}
    return compute, comm


def units_from_columns(units: dict, unit_names: list[str]) -> tuple[dict, dict]:
    """(compute, comm) dicts from the columnar `units` object."""
    return dicts_of(arrays_from_columns(units, unit_names))


def block_from_dict(d: dict, unit_names: list[str]) -> UnitsBlock:
    check_record(d, len(unit_names))
    arrays = arrays_from_columns(d.get("units", {}), unit_names)
    kind = d["type"]
    last = int(d["last"] if kind == "interval" else d["step"])
    first = int(d["first"]) if kind == "interval" else 1
    b = UnitsBlock(kind, first, last, int(d["steps"]), float(d.get("end_unix", 0.0)),
                   *(float(d.get(k, 0.0)) for k, _ in SCALARS),
                   float(d.get("max_step_s", 0.0)), arrays)
    launch = d.get("launch") or (0, 0)
    b.host_compute_seconds = float(d.get("host_compute_s", float(arrays[1].sum())))
    b.launch_checks, b.launch_caught_up = int(launch[0]), int(launch[1])
    if d.get("detail_steps") is not None:
        b.detail_steps = int(d["detail_steps"])
    if d.get("max_step_s_past_warmup") is not None:
        b.max_past_warmup = float(d["max_step_s_past_warmup"])
    b.unit_framework = framework_from_columns(d.get("units", {}), unit_names)
    return b


def framework_from_columns(units: dict, unit_names: list[str]) -> dict:
    """The framework's time per (unit, phase) from the columnar `units` object ({}: none
    recorded, as in logs written before it was)."""
    names = _intern(tuple(unit_names))
    out: dict[tuple[str, str], float] = {}
    for g in units.get("framework", ()):
        idx = unit_column(g)
        for key, v in zip(_keys(names, idx, (g["phase"],)), column(g, "seconds", idx)):
            _vnum(v, "framework seconds")
            out[key] = out.get(key, 0.0) + float(v)
    return out
