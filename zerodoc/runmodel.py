"""The run model: what every zerodoc front end reads.

Plain Python, no torch. A run is a set of ranks; each rank has static facts (`RankFacts`)
and totals over a window of steps (`RankWindow`): per unit and phase the compute time, per
unit, phase and collective the `CommTotals`. The shim keeps a cumulative window (all steps
since attach) that the Prometheus exporter serves; the run log reader builds windows from
the last K steps; other sources (a scrape, a Prometheus server) build the same shape.

All fields are in base units: seconds, bytes, plain counts.
"""

from __future__ import annotations

import hashlib
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
    # parameter tensors the unit shards (FSDP's copy-in / copy-out and gradient work is per
    # tensor); None: not recorded (older run logs, sources without it)
    tensors: int | None = None

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
    # the job identity every rank derives alike (zerodoc/shim/jobid.py); None: a log from
    # before it was written
    job_id: str | None = None

    def unit(self, name: str) -> UnitFacts | None:
        """The unit named `name` (the first, should two share it), by an index built on first
        use: the step model asks once per unit and collective of every rank (81 units x 1,024
        ranks: a linear search each was 1.8 s of a diagnosis)."""
        index = self.__dict__.get("_unit_index")
        if index is None:  # frozen: set beside the fields, never compared or shown
            index = {}
            for u in self.units:
                index.setdefault(u.name, u)
            object.__setattr__(self, "_unit_index", index)
        return index.get(name)


@dataclass
class DeviceTotals:
    """What a GPU profiler trace shows of the device over a window's steps: seconds of the
    union of kernel intervals (all streams) per category within the steps' spans, as
    HolisticTraceAnalysis's temporal breakdown, and the communication kernels by kind."""

    busy_seconds: float = 0.0  # any kernel or memory copy / set running
    compute_seconds: float = 0.0  # compute kernels (includes optimizer and framework work)
    comm_seconds: float = 0.0  # communication kernels
    exposed_comm_seconds: float = 0.0  # communication while no compute kernel ran
    comm_kernels: dict[str, int] = field(default_factory=dict)  # kind -> kernels counted
    kernels_outside_steps: int = 0  # communication kernels of the trace outside every step


@dataclass
class RankWindow:
    """Totals for one rank over a window of steps (or since the start)."""

    facts: RankFacts
    steps: int = 0
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
    # The framework's own time per unit and phase (its hooks: copy-in / copy-out, gradient
    # copies), over the per-unit steps like `compute`; part of `framework_seconds` (the rest
    # belongs to no unit). Empty: not recorded (older run logs, sources without it).
    unit_framework: dict[UnitPhase, float] = field(default_factory=dict)
    memory: dict[str, int] = field(default_factory=dict)  # population -> bytes (latest)
    errors: dict[str, int] = field(default_factory=dict)  # hook -> count (cumulative)
    step_times: list[float] = field(default_factory=list)  # per step, when the source has them
    # the exposed communication of each step that measured it (the sampled steps), when the
    # source has it per step (run logs, profiler traces; not Prometheus or /metrics)
    exposed_times: list[float] = field(default_factory=list)
    # Sources that know the totals without the per-unit detail (run-log step lines, a
    # Prometheus sum over units) set these, over the window's `steps`; None: from `compute`
    # / `comm` (see `compute_seconds`).
    compute_total: float | None = None
    exposed_total: float | None = None
    # Steps the per-unit `compute` / `comm` totals cover, when not the same steps as the rest:
    # the sampled steps (only 1 in K steps records per-unit detail, zerodoc.windowsamples), or a
    # run log read at scale (per-unit numbers of the latest interval, step totals of the last
    # `steps` steps). None: all `steps`. 0: no per-unit detail yet.
    detail_steps: int | None = None
    # How many of the `detail_steps` lie before `first_step` (a window with too few samples
    # of its own takes the newest ones before it: zerodoc.windowsamples.MIN_WINDOW_SAMPLES).
    detail_before: int = 0
    detail_last_step: int = 0  # the newest step with per-unit detail (0: none / unknown)
    detail_every: int | None = None  # K: about 1 step in K is sampled (None: unknown)
    # Sampled steps among the window's own `steps` where the per-unit totals cover others
    # (a run log read at scale: intervals); None: detail_steps - detail_before.
    window_samples: int | None = None
    # Profiler traces with device activity: device time over the window's steps (unions of
    # kernel intervals within the steps' spans, zerodoc.trace), None for every other source.
    device: "DeviceTotals | None" = None
    # The warm-up step (step 1: compile, allocator, first all-gathers) this window leaves out
    # although its span would cover it (`skip_warmup`); None: nothing left out.
    warmup_left_out: int | None = None
    # The window starts at the warm-up step although `skip_warmup` asked to leave it out:
    # the run log's interval or total lines it was read from cover step 1 together with
    # later steps (a log written before the warm-up interval line, or all steps from a
    # `total` line), so it cannot be taken out. The front ends say so.
    warmup_kept: bool = False
    # The sampled steps the per-unit numbers come from, ((step, end_unix), ...) oldest first
    # (the run-log readers set it: zerodoc.windowsamples.set_sample_steps); None: unknown (a
    # source without per-step records: interval lines read at scale, Prometheus, endpoints).
    sample_steps: tuple | None = None

    # --- derived numbers everyone wants -----------------------------------------------
    @property
    def compute_seconds(self) -> float:
        """Compute over the window's `steps` (estimated from the sampled steps when only
        some carry per-unit detail: their sum scaled to `steps`)."""
        if self.compute_total is not None:
            return self.compute_total
        return self.to_window(sum(self.compute.values()))

    @property
    def exposed_seconds(self) -> float:
        """Exposed communication over the window's `steps` (as `compute_seconds`)."""
        if self.exposed_total is not None:
            return self.exposed_total
        return self.to_window(sum(c.exposed_seconds for c in self.comm.values()))

    def to_window(self, per_unit_total: float) -> float:
        """A total over the per-unit steps (`detail_steps`) scaled to the window's `steps`."""
        n = self.per_unit_steps
        if n == self.steps:
            return per_unit_total
        return per_unit_total * self.steps / n if n else 0.0

    @property
    def per_unit_steps(self) -> int:
        """The steps to divide the per-unit totals (`compute`, `comm`) by: the steps they
        cover (see `detail_steps`), never simply `steps`."""
        return self.steps if self.detail_steps is None else self.detail_steps

    @property
    def unit_detail(self) -> bool:
        """Per-unit numbers were measured (at least one sampled step)."""
        return self.per_unit_steps > 0

    def per_sampled_step(self, x: float) -> float | None:
        """A window sum of a number measured on sampled steps only (host launch time of the
        compute, framework time: none on unsampled steps) per step of those inside the
        window (None: none inside it); per step when every step is sampled."""
        if not self.sampled:
            return x / (self.steps or 1)
        inside = self.per_unit_steps - self.detail_before if self.window_samples is None \
            else self.window_samples
        if inside == self.steps:
            return x / (self.steps or 1)
        return x / inside if inside > 0 else None

    def unit_key(self) -> tuple:
        """What the per-unit numbers hold (`compute`, `comm`, `unit_framework` and the steps
        they cover), to compare: a reader that keeps what it derived from them alone (the
        step model's `UnitPart`) reuses it while the key is equal. Per-step numbers (step
        times, optimizer, ...) are not in it."""
        return ("dicts", self.per_unit_steps, tuple(self.compute.items()),
                tuple((k, c.count, c.bytes, c.seconds, c.exposed_seconds, c.hidden_seconds)
                      for k, c in self.comm.items()),
                tuple(self.unit_framework.items()))

    @property
    def sampled(self) -> bool:
        """Per-unit numbers cover other steps than the step-level ones (sampled steps, or
        samples from before the window)."""
        return self.per_unit_steps != self.steps or self.detail_before > 0

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


@dataclass
class RunSnapshot:
    """All ranks of one run, as seen from one source at one moment."""

    source: str  # run dir path, endpoint list, or Prometheus URL
    ranks: dict[int, RankWindow] = field(default_factory=dict)
    stale_ranks: set[int] = field(default_factory=set)  # stopped reporting, no clean end
    # Ranks whose run recorded a clean close (run log "end"; the exporter's "closed" signal).
    ended_ranks: set[int] = field(default_factory=set)
    # ... of them, those the user stopped (Ctrl-C: the run log's end says "interrupted").
    interrupted_ranks: set[int] = field(default_factory=set)
    missing_ranks: set[int] = field(default_factory=set)  # world_size promises, none shows
    # rank -> the watchdog's last record for it ({"type": "stall", "state": "stuck" |
    # "resumed" | "failed", "step", "since_unix", "unit", "phase", "collective", ...};
    # zerodoc/shim/watchdog.py); ranks with none are absent
    stalls: dict[int, dict] = field(default_factory=dict)
    # Per-unit numbers across ranks, when the source aggregated them (zerodoc.unitstats);
    # None: computed from the ranks' own per-unit totals when needed.
    unit_stats: object | None = None
    # What the run logs say about themselves, one line each: records lost to failed writes,
    # records dropped, lines skipped (zerodoc.runlog.reader.log_notes); empty: nothing.
    log_notes: list[str] = field(default_factory=list)
    # The source held logs or endpoints of more than one job (their ranks never merged):
    # {"shown": {...}, "left_out": [...]} (zerodoc.runlog.segments.one_job); None: one job.
    jobs: dict | None = None

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
    run log read at scale) or by `loader()` -> (compute, comm, unit_framework) (one rank's
    series fetched from Prometheus). Readers that aggregate over ranks use `unit_arrays`
    directly."""

    def __init__(self, *a, loader=None, unit_arrays=None, **kw):
        super().__init__(*a, **kw)
        self._loader = loader
        self.unit_arrays = unit_arrays
        self._arrays_key = None  # `unit_key` of the arrays the dicts were read from
        if unit_arrays is not None:
            self._compute = self._comm = None

    def _load(self) -> None:
        if self._loader is not None:
            loader, self._loader = self._loader, None
            self._compute, self._comm, self._unit_framework = loader()
        elif self.unit_arrays is not None and self._comm is None:
            self._arrays_key = self.unit_key()
            ck, cv, mk, mv = self.unit_arrays
            self._compute = dict(zip(ck, cv.tolist()))
            self._comm = {k: CommTotals(int(r[0]), int(r[1]), r[2], r[3], r[4])
                          for k, r in zip(mk, mv.tolist())}
            self.unit_arrays = None  # the dicts are the truth now (a reader may change them)

    def unit_key(self) -> tuple:
        """`RankWindow.unit_key` from the arrays: their keys and a digest of their values
        (~0.02 ms a rank at 81 units, where the dicts' key takes ~0.3 ms), the same before
        and after the dicts are read from them (one rank's window is fitted again while its
        log is quiet). The dicts read from the arrays are the window's own: no reader writes
        to them (the readers that sum per-unit totals build new windows)."""
        if self._arrays_key is not None:
            return self._arrays_key
        if self.unit_arrays is None or self._loader is not None:
            return super().unit_key()
        ck, cv, mk, mv = self.unit_arrays
        digest = hashlib.blake2b(cv.tobytes(), digest_size=16)
        digest.update(mv.tobytes())
        return ("arrays", self.per_unit_steps, ck, mk, digest.digest(),
                tuple(self.unit_framework.items()))

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

    @property
    def unit_framework(self) -> dict[UnitPhase, float]:
        if self._loader is not None:  # the run log's arrays keep it as a dict already
            self._load()
        return self._unit_framework

    @unit_framework.setter
    def unit_framework(self, v) -> None:
        self._unit_framework = v
