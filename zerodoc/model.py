"""The run model: what every zerodoc front end reads.

Plain Python, no torch. A run is a set of ranks; each rank has static facts (`RankFacts`)
and totals over a window of steps (`RankWindow`): per unit and phase the compute time, per
unit, phase and collective the `CommTotals`. The shim keeps a cumulative window (all steps
since attach) that the Prometheus exporter serves; the run log reader builds windows from
the last K steps; other sources (a scrape, a Prometheus server) build the same shape.

All fields are in base units: seconds, bytes, plain counts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

UnitPhase = tuple[str, str]  # (unit, phase)
UnitPhaseColl = tuple[str, str, str]  # (unit, phase, collective)


@dataclass
class CommTotals:
    """Totals of one kind of collective for one unit and phase."""

    count: int = 0
    bytes: int = 0
    seconds: float = 0.0  # issue -> completion
    exposed_seconds: float = 0.0  # the compute waited for this part
    hidden_seconds: float = 0.0  # overlapped with compute (measured, not derived)

    def add(self, other: "CommTotals") -> None:
        self.add_row((other.count, other.bytes, other.seconds, other.exposed_seconds,
                      other.hidden_seconds))

    def add_row(self, row) -> None:
        """Add (count, bytes, seconds, exposed, hidden): the recorder's accumulator row."""
        count, nbytes, seconds, exposed, hidden = row
        self.count += count
        self.bytes += nbytes
        self.seconds += seconds
        self.exposed_seconds += exposed
        self.hidden_seconds += hidden

    def copy(self) -> "CommTotals":
        return CommTotals(self.count, self.bytes, self.seconds, self.exposed_seconds,
                          self.hidden_seconds)

    @property
    def algbw_bytes_per_second(self) -> float:
        return self.bytes / self.seconds if self.seconds > 0 else 0.0

    def busbw_bytes_per_second(self, collective: str, group_size: int) -> float:
        return busbw(self.algbw_bytes_per_second, collective, group_size)

    @property
    def exposed_ratio(self) -> float:
        return self.exposed_seconds / self.seconds if self.seconds > 0 else 0.0


def busbw(algbw: float, collective: str, n: int) -> float:
    """Bus bandwidth from algorithm bandwidth, nccl-tests conventions (docs/rules.md, "The
    numbers, and how they are defined")."""
    if n <= 1:
        return 0.0
    if collective == "all_reduce":
        return algbw * 2 * (n - 1) / n
    if collective == "broadcast":
        return algbw
    return algbw * (n - 1) / n  # all_gather, reduce_scatter


@dataclass(frozen=True)
class UnitFacts:
    """Static facts about one sharded unit (a module the framework sharded)."""

    name: str  # module path; "" is reported as "(root)"
    params: int  # unsharded parameter count
    param_bytes: int  # unsharded bytes in the original dtype
    gather_bytes: int  # unsharded bytes in the dtype used for the all-gather
    sharded_bytes: int  # this rank's local shard bytes
    reshard_after_forward: bool | None  # None: framework does not say
    group_size: int  # ranks in the all-gather / reduce-scatter group
    param_dtype: str = ""
    reduce_dtype: str = ""
    replicate_size: int = 1  # HSDP: ranks in the replicate (all-reduce) group

    def collective_group_size(self, collective: str) -> int:
        """Ranks taking part in one collective of this unit (for busbw)."""
        return self.replicate_size if collective == "all_reduce" else self.group_size


@dataclass(frozen=True)
class RankFacts:
    """Static facts of one rank, written once (run log header, `zerodoc_run_info`)."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node: str
    run_id: str
    framework: str  # fsdp2 | fsdp1 | zero1 | deepspeed | none
    framework_version: str
    torch_version: str
    device_type: str  # cpu | cuda
    backend: str  # gloo | nccl | none
    zero_stage: int | None  # equivalent ZeRO stage (3: params resharded, 2: kept, ...)
    mesh_shape: tuple[int, ...]
    mesh_dim_names: tuple[str, ...] | None
    param_dtype: str
    reduce_dtype: str
    units: tuple[UnitFacts, ...]
    device_capacity_bytes: int | None
    started_unix: float
    pid: int
    metrics_endpoint: str | None = None  # "host:port" the rank serves /metrics on
    hooks: dict[str, str] = field(default_factory=dict)  # hook point -> "ok" | reason missing
    config: dict[str, object] = field(default_factory=dict)

    def unit(self, name: str) -> UnitFacts | None:
        for u in self.units:
            if u.name == name:
                return u
        return None


@dataclass
class RankWindow:
    """Totals for one rank over a window of steps (or since the start)."""

    facts: RankFacts
    steps: int = 0
    # Steps whose per-unit numbers are in `compute` / `comm` (and in framework, other, host
    # compute and launch totals): the detail steps (zerodoc/shim/sampling.py). The step-level
    # totals (step time, optimizer, memory) cover all `steps`.
    detail_steps: int = 0
    first_step: int = 0
    last_step: int = 0
    step_seconds: float = 0.0
    last_step_seconds: float = 0.0
    max_step_seconds: float = 0.0
    optimizer_seconds: float = 0.0
    framework_seconds: float = 0.0
    other_seconds: float = 0.0
    self_seconds: float = 0.0
    # GPU: compute is device time; the host's time launching it is kept apart, with the
    # launch-bound probe (unit compute segments checked / already running on the device).
    host_compute_seconds: float = 0.0
    launch_checks: int = 0
    launch_caught_up: int = 0
    updated_unix: float = 0.0
    compute: dict[UnitPhase, float] = field(default_factory=dict)
    comm: dict[UnitPhaseColl, CommTotals] = field(default_factory=dict)
    memory: dict[str, int] = field(default_factory=dict)  # population -> bytes (latest)
    errors: dict[str, int] = field(default_factory=dict)  # hook -> count (cumulative)
    step_times: list[float] = field(default_factory=list)  # per step, when the source has them
    # Sources that know the totals without the per-unit detail (run-log step lines, a
    # Prometheus sum over units) set these; None: summed from `compute` / `comm`.
    compute_total: float | None = None
    exposed_total: float | None = None
    # Steps the per-unit `compute` / `comm` totals cover, when not the same steps as the rest
    # (a run log read at scale: per-unit numbers of the latest interval, step totals of the
    # last `steps` steps). None: `steps`.
    unit_steps: int | None = None

    # --- derived numbers everyone wants -----------------------------------------------
    @property
    def compute_seconds(self) -> float:
        if self.compute_total is not None:
            return self.compute_total
        return sum(self.compute.values())

    @property
    def exposed_seconds(self) -> float:
        if self.exposed_total is not None:
            return self.exposed_total
        return sum(c.exposed_seconds for c in self.comm.values())

    @property
    def per_unit_steps(self) -> int:
        """The steps to divide the per-unit totals by (see `unit_steps`)."""
        return self.steps if self.unit_steps is None else self.unit_steps

    @property
    def comm_seconds(self) -> float:
        return sum(c.seconds for c in self.comm.values())

    @property
    def mean_step_seconds(self) -> float:
        return self.step_seconds / self.steps if self.steps else 0.0

    @property
    def exposed_fraction(self) -> float:
        """Exposed communication / step time."""
        return self.exposed_seconds / self.step_seconds if self.step_seconds > 0 else 0.0

    @property
    def comm_compute_ratio(self) -> float:
        """Exposed communication / compute (the number that says comm-bound)."""
        c = self.compute_seconds
        return self.exposed_seconds / c if c > 0 else 0.0

    @property
    def headroom_bytes(self) -> int | None:
        return self.memory.get("headroom")

    def unit_comm(self, unit: str, collective: str, phase: str | None = None) -> CommTotals:
        """Totals of one collective of one unit, over one phase or all phases."""
        out = CommTotals()
        for (u, p, c), t in self.comm.items():
            if u == unit and c == collective and (phase is None or p == phase):
                out.add(t)
        return out

    def unit_compute(self, unit: str, phase: str | None = None) -> float:
        return sum(s for (u, p), s in self.compute.items()
                   if u == unit and (phase is None or p == phase))


@dataclass
class RunSnapshot:
    """All ranks of one run, as seen from one source at one moment."""

    source: str  # run dir path, endpoint list, or Prometheus URL
    ranks: dict[int, RankWindow] = field(default_factory=dict)
    stale_ranks: set[int] = field(default_factory=set)  # stopped reporting, no clean end
    # Ranks whose run recorded a clean close (run log "end"; the exporter's "closed" signal).
    ended_ranks: set[int] = field(default_factory=set)
    missing_ranks: set[int] = field(default_factory=set)  # world_size promises, none shows
    # rank -> the watchdog's last record for it ({"type": "stall", "state": "stuck" |
    # "resumed" | "failed", "step", "since_unix", "unit", "phase", "collective", ...};
    # zerodoc/shim/watchdog.py); ranks with none are absent
    stalls: dict[int, dict] = field(default_factory=dict)
    # Per-unit numbers across ranks, when the source aggregated them (zerodoc.unitstats);
    # None: computed from the ranks' own per-unit totals when needed.
    unit_stats: object | None = None

    @property
    def any_rank(self) -> RankWindow | None:
        return self.ranks[min(self.ranks)] if self.ranks else None

    @property
    def units(self) -> list[str]:
        r = self.any_rank
        return [u.name for u in r.facts.units] if r else []


class LazyRankWindow(RankWindow):
    """A RankWindow whose per-unit dicts are built when first read: from `unit_arrays`
    (compute keys, seconds, comm keys, [count, bytes, seconds, exposed, hidden] rows; the
    run log read at scale) or by `loader()` -> (compute, comm) (one rank's series fetched
    from Prometheus). Readers that aggregate over ranks use `unit_arrays` directly."""

    def __init__(self, *a, loader=None, unit_arrays=None, **kw):
        super().__init__(*a, **kw)
        self._loader = loader
        self.unit_arrays = unit_arrays
        if unit_arrays is not None:
            self._compute = self._comm = None

    def _load(self) -> None:
        if self._loader is not None:
            loader, self._loader = self._loader, None
            self._compute, self._comm = loader()
        elif self.unit_arrays is not None and self._comm is None:
            ck, cv, mk, mv = self.unit_arrays
            self._compute = dict(zip(ck, cv.tolist()))
            self._comm = {k: CommTotals(int(r[0]), int(r[1]), r[2], r[3], r[4])
                          for k, r in zip(mk, mv.tolist())}
            self.unit_arrays = None  # the dicts are the truth now (a reader may change them)

    @property
    def compute(self) -> dict[UnitPhase, float]:
        self._load()
        return self._compute

    @compute.setter
    def compute(self, v) -> None:
        self._compute = v

    @property
    def comm(self) -> dict[UnitPhaseColl, CommTotals]:
        self._load()
        return self._comm

    @comm.setter
    def comm(self, v) -> None:
        self._comm = v

    def set_arrays(self, arrays) -> None:
        """Per-unit totals from arrays (the dicts follow on first read)."""
        self.unit_arrays = arrays
        self._compute = self._comm = None
