"""Configuration of `zerodoc.attach()`: one keyword-only dataclass, validated on creation.

Every option is type-checked in `__post_init__`; a wrong type or value raises TypeError /
ValueError at attach time, naming the option (a user's mistake is said before training
starts, never discovered as a traceback from inside zerodoc later)."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields

from ..exporter import detail
from .sampler import CAP, FLOOR_S  # stdlib only: no torch import

DEFAULT_PORT = 9730


def _bad(key: str, expected: str, value: object) -> None:
    raise TypeError(f"zerodoc.attach(): {key} must be {expected}, not {value!r} "
                    f"({type(value).__name__})")


def _env_seconds(name: str, default: float) -> float:
    raw = os.environ.get(name, "")
    if raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not a number") from None


@dataclass(kw_only=True)
class AttachConfig:
    run_dir: str | None = None
    """Run log directory. Default: $ZERODOC_RUN_DIR, else ./zerodoc-runs/<job id>/ (the job
    identity every rank derives alike: zerodoc/shim/jobid.py)."""
    port: int | bool | None = None
    """Prometheus base port (rank serves base + LOCAL_RANK). None: $ZERODOC_PORT or 9730;
    0: any free port; False: no HTTP server."""
    host: str = "127.0.0.1"
    """Address the /metrics server binds to."""
    enabled: bool = True
    """False (or $ZERODOC_DISABLE=1) makes attach() a no-op monitor."""
    completion_callbacks: bool = True
    """Use the Work's future callback for exact completion times of async collectives
    (gloo). Off: hidden time of early-finishing collectives becomes an upper bound."""
    inject_latency_s: float = 0.0
    """Simulated slow link (a fault injector for tests and the demo, CPU/gloo only): every
    parameter all-gather (FSDP, DeepSpeed), parameter broadcast (ZeRO-1) or gradient
    all-reduce (DDP, FSDP1 NO_SHARD) completes this much later. Never silent: attach warns,
    the run facts and `zerodoc_injected_latency_seconds` show it. $ZERODOC_INJECT_LATENCY_S
    acts only with $ZERODOC_INJECT_LATENCY_ACK=slow-down-this-job (zerodoc/shim/faults.py)."""
    memory_every: int = 50
    """Walk parameters / gradients / optimizer state for memory bytes every N steps."""
    run_log: bool = True
    """Write the per-rank JSON-lines run log."""
    run_log_every: int = 100
    """Run log: per-unit totals are written as one interval line every this many steps ..."""
    run_log_every_seconds: float = 300.0
    """... or every this many seconds, whichever comes first."""
    run_log_detail: bool = True
    """Run log: also keep the steps of the current and the previous interval with their full
    per-unit detail (bounded files under <run_dir>/detail/)."""
    run_log_queue: int = 1024
    """Run log: records the hand-over queue holds; when a slow filesystem fills it, records
    are dropped and counted (zerodoc_runlog_dropped_records_total), never waited for."""
    memory_history: bool = False
    """GPU: record allocator history (bounded) so an OOM dumps a memory snapshot into the
    run directory. Off by default: recording history costs time."""
    reset_peak_memory: bool = False
    """GPU: reset the allocator's peak counters after reading them at each step end, so the
    `peak_*` populations are per-step peaks. Off by default: the reset is global and would
    clobber the peaks the job itself reads (`torch.cuda.max_memory_allocated()`); the peaks
    are then the allocator's since the start (or the job's own last reset)."""
    nvml: bool = True
    """GPU: sample NVML (utilisation, memory, PCIe/NVLink counters, topology) on a
    background thread when nvidia-ml-py is installed."""
    metrics_detail: str = detail.DEFAULT_DETAIL
    """Prometheus detail: "full" (every rank serves per-unit series) or "coarse" (jobs of
    thousands of ranks: per-rank totals, per-unit series from `metrics_unit_ranks` ranks
    only). Not given: $ZERODOC_METRICS_DETAIL, else "full". See docs/metrics.md."""
    metrics_unit_ranks: int = detail.DEFAULT_UNIT_RANKS
    """Coarse mode: how many ranks, spread evenly over the job (rank 0 first), keep their
    per-unit series (0: none). Not given: $ZERODOC_METRICS_UNIT_RANKS, else 8."""
    detail: str | int = "adaptive"
    """Per-unit detail (zerodoc/shim/sampler.py): "adaptive" (steps 2 and 3, then 1 step in
    K, K chosen so the shim's own host time stays within 0.2 % of the median step, lowered
    to give a sample every `detail_floor_s` within `detail_cap`), "every" (every step: short
    diagnostic runs), an int K (1 step in K) or "off" (step-level numbers only). Not given:
    $ZERODOC_DETAIL, else "adaptive". Fault injection (inject_latency_s) forces "every"."""
    detail_floor_s: float = FLOOR_S
    """Adaptive detail: a sampled step at least about every this many seconds (K no larger
    than the largest power of two with K x the median step <= this; about a scrape
    interval), within `detail_cap`. 0: no time floor. Not given: $ZERODOC_DETAIL_FLOOR_S,
    else 15."""
    detail_cap: float = CAP
    """Adaptive detail: the shim's own time on sampled steps (its estimate's upper bound),
    as a fraction of the step time, that the time floor never pushes past (0.01: 1 %). Not
    given: $ZERODOC_DETAIL_CAP, else 0.01."""
    stall_after_s: float = 120.0
    """Watchdog: a rank with no progress for this long (and no step for 3x its slowest step)
    records where it is stuck, once per stall; 0 turns the watchdog thread off. Also
    $ZERODOC_STALL_AFTER_S."""

    def __post_init__(self) -> None:
        # Types first, each error naming the key: these come from user code or the environment.
        if self.run_dir is not None and not isinstance(self.run_dir, (str, os.PathLike)):
            _bad("run_dir", "a path (str or os.PathLike) or None", self.run_dir)
        if self.port is not None and (not isinstance(self.port, (bool, int))
                                      or self.port is True):
            _bad("port", "an int (0: any free port), None or False", self.port)
        if isinstance(self.port, int) and not isinstance(self.port, bool) \
                and not 0 <= self.port <= 65535:
            raise ValueError(f"zerodoc.attach(): port {self.port} is not in 0..65535")
        if not isinstance(self.host, str) or not self.host:
            _bad("host", "a non-empty address string, e.g. '127.0.0.1'", self.host)
        for key in ("enabled", "completion_callbacks", "run_log", "memory_history",
                    "reset_peak_memory", "nvml"):
            if not isinstance(getattr(self, key), bool):
                _bad(key, "True or False", getattr(self, key))
        if isinstance(self.inject_latency_s, bool) or \
                not isinstance(self.inject_latency_s, (int, float)):
            _bad("inject_latency_s", "a number of seconds", self.inject_latency_s)
        if not self.inject_latency_s >= 0 or self.inject_latency_s == float("inf"):
            raise ValueError(f"zerodoc.attach(): inject_latency_s must be a finite number "
                             f">= 0, not {self.inject_latency_s!r}")
        if isinstance(self.memory_every, bool) or not isinstance(self.memory_every, int):
            _bad("memory_every", "an int >= 1 (steps)", self.memory_every)
        if self.memory_every < 1:
            raise ValueError(f"zerodoc.attach(): memory_every must be >= 1, "
                             f"not {self.memory_every}")
        detail.check(self.metrics_detail, self.metrics_unit_ranks)
        if isinstance(self.stall_after_s, bool) or \
                not isinstance(self.stall_after_s, (int, float)):
            _bad("stall_after_s", "a number of seconds (0: no watchdog)", self.stall_after_s)
        if not 0 <= self.stall_after_s < float("inf"):
            raise ValueError(f"zerodoc.attach(): stall_after_s must be a finite number >= 0 "
                             f"(0: no watchdog), not {self.stall_after_s!r}")
        from .sampler import parse  # stdlib only: no torch import

        parse(self.detail)
        v = self.detail_floor_s
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            _bad("detail_floor_s", "a number of seconds (0: no time floor)", v)
        if not 0 <= v < float("inf"):
            raise ValueError(f"zerodoc.attach(): detail_floor_s must be a finite number of "
                             f"seconds >= 0 (0: no time floor), not {v!r}")
        v = self.detail_cap
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            _bad("detail_cap", "a fraction of the step time, e.g. 0.01 for 1 %", v)
        if not 0 < v <= 1:
            raise ValueError(f"zerodoc.attach(): detail_cap must be a fraction of the step "
                             f"time in (0, 1], e.g. 0.01 for 1 %, not {v!r}")
        for key in ("run_log_every", "run_log_queue"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int):
                _bad(key, "an int >= 1", v)
            if v < 1:
                raise ValueError(f"zerodoc.attach(): {key} must be >= 1, not {v}")
        v = self.run_log_every_seconds
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            _bad("run_log_every_seconds", "a number of seconds", v)
        if not 0 < v < float("inf"):
            raise ValueError(f"zerodoc.attach(): run_log_every_seconds must be a finite "
                             f"number > 0, not {v!r}")
        if not isinstance(self.run_log_detail, bool):
            _bad("run_log_detail", "True or False", self.run_log_detail)

    @classmethod
    def from_options(cls, **options) -> "AttachConfig":
        """Options from attach(), completed from the environment."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise TypeError(f"zerodoc.attach(): unknown option(s) {', '.join(unknown)}; "
                            f"known: {', '.join(sorted(known))}")
        if options.get("run_dir") is None and os.environ.get("ZERODOC_RUN_DIR"):
            options["run_dir"] = os.environ["ZERODOC_RUN_DIR"]
        if options.get("port") is None:
            raw = os.environ.get("ZERODOC_PORT", "")
            if raw.lower() in ("off", "false", "none"):
                options["port"] = False
            elif raw:
                try:
                    options["port"] = int(raw)
                except ValueError:
                    raise ValueError(f"ZERODOC_PORT={raw!r} is not a port number") from None
            else:
                options["port"] = DEFAULT_PORT
        if "stall_after_s" not in options:
            options["stall_after_s"] = _env_seconds("ZERODOC_STALL_AFTER_S", 120.0)
        if "inject_latency_s" not in options:
            from .faults import from_env  # stdlib only: no torch import

            options["inject_latency_s"] = from_env(os.environ)
        if "detail" not in options and os.environ.get("ZERODOC_DETAIL", ""):
            options["detail"] = os.environ["ZERODOC_DETAIL"]
        for key, var, default in (("detail_floor_s", "ZERODOC_DETAIL_FLOOR_S", FLOOR_S),
                                  ("detail_cap", "ZERODOC_DETAIL_CAP", CAP)):
            if key not in options:
                options[key] = _env_seconds(var, default)
        options = detail.options_from_env(options)
        if os.environ.get("ZERODOC_DISABLE", "") not in ("", "0"):
            options["enabled"] = False
        return cls(**options)

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}
