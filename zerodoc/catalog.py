"""The metric catalog: every Prometheus series zerodoc exports, as data.

One table drives the exporter (`zerodoc.exporter.prometheus`), the generated docs
(`docs/metrics.md`, `python -m zerodoc.cli.metrics_doc`), the series budget
(`zerodoc.ops.cardinality`: how many series a rank serves, per detail level) and the test that every PromQL expression
in `dashboards/` and `rules/` names a catalogued metric.

Conventions: base units (seconds, bytes), cumulative counters for time and bytes so any
window is a `rate()`, gauges for levels, nothing derivable exported twice (bus bandwidth is
bytes / seconds x the collective's factor: the recording rules compute it) but the rank's
compute and exposed collective time summed over its units (a few series that spare every
per-rank query the sum over all per-unit series). Every series
also carries the rank labels `rank`, `local_rank`, `node`; the extra labels listed per
metric are bounded (unit = the sharded module's path, phase, collective, population, hook).

Each metric has a scope: `rank` (every rank serves it), `unit` (per-unit detail: in coarse
mode the ranks outside the unit sample serve it summed over units, without the `unit`
label), `unit_rank0` (per-unit detail served per unit by rank 0 only, every other rank
serving it summed over units as a coarse rank does: the framework's time per unit, the
same framework code on every rank, which served per unit by every rank broke the series
budget), `run` (a per-unit fact
of the run, served by rank 0 only) or `server` (the /metrics
server's own counters, served by every rank on `/metrics/exporter`, not in its `/metrics`
page: outside the series budget).
"""

from __future__ import annotations

from dataclasses import dataclass

RANK_LABELS: tuple[str, ...] = ("rank", "local_rank", "node")
# Where a source files a coarse rank's series that carry no `unit` label (its totals over
# units): RankWindow keys (RANK_TOTAL_UNIT, phase[, collective]); never a unit's name.
RANK_TOTAL_UNIT = ""

PHASES: tuple[str, ...] = ("forward", "backward", "optimizer")
COLLECTIVES: tuple[str, ...] = ("all_gather", "reduce_scatter", "all_reduce", "broadcast")

# Rank-level totals of the per-unit counters, served by every rank at every detail level: the
# Prometheus source's per-rank figures and the per-rank recording rules read these few
# series instead of summing a rank's per-unit ones (issue 20 item 17: at 1,024 ranks x 81
# units those sums took 1.4-6.8 s a query). Not read from a scrape (`into` ""): a scrape
# source sums the per-unit series it holds anyway.
RANK_COMPUTE = "zerodoc_rank_compute_seconds_total"
RANK_EXPOSED = "zerodoc_rank_collective_exposed_seconds_total"

# zerodoc_exporter_requests_total{outcome}: every answer of a rank's /metrics server (and
# every connection it ended without one) is counted under one of these (exporter/limits.py).
EXPORTER_OUTCOMES: tuple[str, ...] = (
    "ok", "unauthorized", "rate_limited", "over_capacity", "timed_out", "client_gone",
    "bad_request", "too_large", "not_ready",
)

# Step-time histogram buckets (seconds): 1 ms .. ~2 min.
STEP_BUCKETS: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
)


@dataclass(frozen=True)
class Metric:
    name: str
    type: str  # counter | gauge | histogram | info
    unit: str  # seconds | bytes | ratio | bytes_per_second | "" (a count or a flag)
    help: str
    labels: tuple[str, ...] = ()
    scope: str = "rank"  # rank | unit | run | server (see the module docstring)
    per: str = ""
    """What its number of series per rank grows with: a `cardinality.Shape` field ("": one)."""
    into: str = ""
    """Where the sources (`zerodoc.sources`) file its samples in the run model: `scalar:ATTR`
    (a per-rank number; counters are windowed, gauges are levels), `histogram:SUM,COUNT`,
    `compute` (per unit, phase), `comm:FIELD` (per unit, phase, collective), `memory:KEY`
    (`memory:{population}`: keyed by that label), `framework` (per unit, phase: the
    framework's time per unit), `errors`, `hooks`, `info` (labels of
    the rank's facts), `unit:FIELD` / `unit_info` (per-unit facts), `closed`; "" not read."""

    @property
    def series_names(self) -> tuple[str, ...]:
        """Names as they appear in a scrape (histograms expand to three series)."""
        if self.type == "histogram":
            return (f"{self.name}_bucket", f"{self.name}_sum", f"{self.name}_count")
        if self.type == "info":
            return (f"{self.name}_info",)
        return (self.name,)


CATALOG: tuple[Metric, ...] = (
    # --- per step, per rank -------------------------------------------------------------
    Metric("zerodoc_step_duration_seconds", "histogram", "seconds",
           "Wall time of training steps (optimizer step to optimizer step).", into="histogram:step_seconds,steps"),
    Metric("zerodoc_detail_steps_total", "counter", "",
           "Steps with per-unit detail (1 in K, sampled; attach option detail): the steps the "
           "per-unit compute and collective totals come from, and framework, other and host "
           "compute time. Step time, optimizer time and memory cover every step.",
           into="scalar:detail_steps"),
    Metric("zerodoc_last_step", "gauge", "",
           "Index of the last completed step.", into="scalar:last_step"),
    Metric("zerodoc_last_step_seconds", "gauge", "seconds",
           "Wall time of the last completed step.", into="scalar:last_step_seconds"),
    Metric("zerodoc_last_step_timestamp_seconds", "gauge", "seconds",
           "Unix time at which the last step completed (staleness check).", into="scalar:updated_unix"),
    Metric("zerodoc_optimizer_seconds_total", "counter", "seconds",
           "Time spent in optimizer.step().", into="scalar:optimizer_seconds"),
    Metric("zerodoc_other_seconds_total", "counter", "seconds",
           "Step time outside sharded units, collective waits and the optimizer "
           "(data loading, loss, FSDP bookkeeping).", into="scalar:other_seconds"),
    Metric("zerodoc_framework_seconds_total", "counter", "seconds",
           "Time inside the sharding framework's own hooks, excluding collective waits.", into="scalar:framework_seconds"),
    # --- per unit, per phase --------------------------------------------------------------
    Metric("zerodoc_compute_seconds_total", "counter", "seconds",
           "Compute time of a sharded unit's own layers (children units excluded); on GPU the "
           "device time on the compute stream between the unit's hook points.",
           ("unit", "phase"), scope="unit", per="unit_phase_keys", into="compute"),
    Metric("zerodoc_framework_unit_seconds_total", "counter", "seconds",
           "Time inside the sharding framework's own hooks charged to a sharded unit (its "
           "copy-in / copy-out, gradient copies, resharding; collective waits excluded), from "
           "the detail steps like zerodoc_compute_seconds_total; part of "
           "zerodoc_framework_seconds_total (the rest belongs to no unit). Per unit from "
           "rank 0 only (the same framework code runs on every rank; 162 series a rank at 81 "
           "units broke the series budget); every other rank serves its sum over units per "
           "phase, without the unit label. Every rank's run log keeps it per unit.",
           ("unit", "phase"), scope="unit_rank0", per="unit_framework_keys", into="framework"),
    Metric("zerodoc_compute_host_seconds_total", "counter", "seconds",
           "Host (CPU) time spent launching the units' compute. On GPU beside the device time "
           "of zerodoc_compute_seconds_total (launch time close to device time: a "
           "launch-bound job); on CPU equal to it.", into="scalar:host_compute_seconds"),
    Metric("zerodoc_launch_segments_total", "counter", "",
           "GPU: unit compute segments probed for launch-boundness (one in four stretches "
           "of a unit's own compute, rotating over units and phases).",
           into="scalar:launch_checks"),
    Metric("zerodoc_launch_caught_up_total", "counter", "",
           "GPU: probed segments the device had already started before the host finished "
           "launching them (the device was keeping pace with the host).", into="scalar:launch_caught_up"),
    Metric("zerodoc_collective_calls_total", "counter", "",
           "Collectives issued for a sharded unit.", ("unit", "phase", "collective"),
           scope="unit", per="unit_collective_keys", into="comm:count"),
    Metric("zerodoc_collective_bytes_total", "counter", "bytes",
           "Bytes of the collective's full buffer (nccl-tests size: all-gather output, "
           "reduce-scatter input).", ("unit", "phase", "collective"), scope="unit",
           per="unit_collective_keys", into="comm:bytes"),
    Metric("zerodoc_collective_seconds_total", "counter", "seconds",
           "Collective time on its own stream (GPU: the device, from the stream reaching it to "
           "its end; CPU: issue to completion).", ("unit", "phase", "collective"),
           scope="unit", per="unit_collective_keys", into="comm:seconds"),
    Metric("zerodoc_collective_exposed_seconds_total", "counter", "seconds",
           "Part of the collective's time the compute had to wait for (not hidden).",
           ("unit", "phase", "collective"), scope="unit", per="unit_collective_keys", into="comm:exposed_seconds"),
    # --- per rank: the per-unit counters above summed over this rank's units --------------
    Metric(RANK_COMPUTE, "counter", "seconds",
           "zerodoc_compute_seconds_total summed over the rank's units, per phase (the same "
           "steps): what a per-rank query reads instead of summing every per-unit series.",
           ("phase",), per="phases", into=""),
    Metric(RANK_EXPOSED, "counter", "seconds",
           "zerodoc_collective_exposed_seconds_total summed over the rank's units, per phase "
           "and collective (the same steps): what a per-rank query reads instead of summing "
           "every per-unit series.", ("phase", "collective"), per="collectives", into=""),
    # --- memory -------------------------------------------------------------------------
    Metric("zerodoc_memory_bytes", "gauge", "bytes",
           "Memory by population: sharded_parameters, gradients, optimizer_state, "
           "process_resident, process_peak_resident (+ on GPU allocated, reserved, "
           "inactive_split and peak_allocated / peak_reserved: the allocator's peaks since "
           "the job started or last reset them; per-step peaks only with the attach option "
           "reset_peak_memory).",
           ("population",), per="populations", into="memory:{population}"),
    Metric("zerodoc_device_memory_capacity_bytes", "gauge", "bytes",
           "Memory available to this rank: the GPU's total memory, or on CPU an equal share "
           "of host memory per local rank.", into="memory:capacity"),
    Metric("zerodoc_memory_headroom_bytes", "gauge", "bytes",
           "Capacity minus peak reserved (GPU) or peak resident (CPU) memory.", into="memory:headroom"),
    # --- GPU (CUDA allocator, NVML); absent on CPU runs ----------------------------------
    Metric("zerodoc_gpu_alloc_retries_total", "counter", "",
           "CUDA caching-allocator retries (cudaMalloc failed, cache flushed, retried).",
           per="gpu", into="memory:alloc_retries"),
    Metric("zerodoc_gpu_ooms_total", "counter", "",
           "CUDA out-of-memory errors raised by the caching allocator.", per="gpu", into="memory:ooms"),
    Metric("zerodoc_gpu_utilization_ratio", "gauge", "ratio",
           "GPU utilisation reported by NVML (0-1).", per="gpu"),
    Metric("zerodoc_gpu_pcie_bytes_per_second", "gauge", "bytes_per_second",
           "PCIe throughput reported by NVML.", ("direction",), per="pcie_directions"),
    # --- static facts -------------------------------------------------------------------
    Metric("zerodoc_run", "info", "",
           "Static facts of the run: framework, versions, device, dtypes, mesh, the job's "
           "identity (job_id: one value for every rank of one job, zerodoc/shim/jobid.py).",
           ("framework", "framework_version", "torch_version", "device_type", "backend",
            "zero_stage", "param_dtype", "reduce_dtype", "mesh_shape", "run_id", "job_id",
            "link", "metrics_detail"), into="info"),
    Metric("zerodoc_world_size", "gauge", "", "Number of ranks in the job.", into="scalar:world_size"),
    Metric("zerodoc_unit_parameters", "gauge", "",
           "Parameters of a sharded unit (unsharded count).", ("unit",), scope="run", per="units", into="unit:params"),
    Metric("zerodoc_unit_parameter_bytes", "gauge", "bytes",
           "Unsharded parameter bytes of a unit in its gathered dtype.", ("unit",),
           scope="run", per="units", into="unit:gather_bytes"),
    Metric("zerodoc_unit_reshard_after_forward", "gauge", "",
           "1 if the unit frees its gathered parameters after forward (ZeRO-3-like), "
           "0 if it keeps them for backward (ZeRO-2-like).", ("unit",), scope="run", per="units", into="unit:reshard"),
    Metric("zerodoc_local_world_size", "gauge", "", "Number of ranks on this rank's node.", into="scalar:local_world_size"),
    Metric("zerodoc_unit_index", "gauge", "",
           "Position of the unit in the model's module order (0: outermost).", ("unit",),
           scope="run", per="units", into="unit:index"),
    Metric("zerodoc_unit_group_size", "gauge", "",
           "Ranks in the unit's all-gather / reduce-scatter group.", ("unit",), scope="run",
           per="units", into="unit:group_size"),
    Metric("zerodoc_unit_sharded_bytes", "gauge", "bytes",
           "Rank 0's shard of the unit's parameters, in their stored dtype (other ranks' "
           "shards differ by padding at most).", ("unit",), scope="run", per="units", into="unit:sharded_bytes"),
    Metric("zerodoc_unit_stored_parameter_bytes", "gauge", "bytes",
           "Unsharded parameter bytes of a unit in its stored (original) dtype.", ("unit",),
           scope="run", per="units", into="unit:param_bytes"),
    Metric("zerodoc_unit_parameter_tensors", "gauge", "",
           "Parameter tensors a unit shards (the framework's copy-in / copy-out and gradient "
           "work is per tensor; FSDP2, FSDP1); absent where not recorded.", ("unit",),
           scope="run", per="units", into="unit:tensors"),
    Metric("zerodoc_unit_dtype", "info", "",
           "A unit's all-gather (parameter) dtype and gradient reduce dtype.",
           ("unit", "param_dtype", "reduce_dtype"), scope="run", per="units", into="unit_info"),
    # --- the watchdog (stuck ranks) -----------------------------------------------------
    Metric("zerodoc_stalls_total", "counter", "",
           "Stalls the watchdog detected on this rank: no progress for the stall threshold "
           "and no step for 3x the slowest step."),
    Metric("zerodoc_stall_since_timestamp_seconds", "gauge", "seconds",
           "Unix time this rank stopped making progress, present only while it is stuck; "
           "unit, phase and collective say where (collective empty: not inside a collective, "
           "i.e. the rank others wait for).", ("unit", "phase", "collective"), per="stalled",
           into="stall"),
    # --- zerodoc's own health -----------------------------------------------------------
    Metric("zerodoc_self_seconds_total", "counter", "seconds",
           "Time zerodoc itself spent at step boundaries (bookkeeping, run log, memory "
           "sampling).", into="scalar:self_seconds"),
    Metric("zerodoc_injected_latency_seconds", "gauge", "seconds",
           "Fault injection in force: the delay given to every parameter all-gather (0: "
           "none). Non-zero only in tests and demos (attach option inject_latency_s)."),
    Metric("zerodoc_errors_total", "counter", "",
           "Internal zerodoc errors caught and counted (the training job carried on).",
           ("hook",), per="errors", into="errors"),
    Metric("zerodoc_run_closed_timestamp_seconds", "gauge", "seconds",
           "Unix time of the rank's clean close(); served only once closed (the exporter "
           "stays up until one more scrape, a few seconds at most, so scrapers see it).",
           per="closed", into="closed"),
    Metric("zerodoc_runlog_dropped_records_total", "counter", "",
           "Run-log records dropped because the writer's queue was full (a slow filesystem); "
           "the training step never waits for the run log."),
    Metric("zerodoc_runlog_records_lost_total", "counter", "",
           "Run-log records lost because a write failed (disk full, a read-only filesystem, a "
           "file-size limit), because the rank keeps no log (something other than a regular "
           "file in its place, a run directory another live job writes), or because the run "
           "directory was deleted under the writer; served once one was lost. Each record is "
           "written whole or not at all, and the loss is also written to the log once it "
           "takes writes again.",
           per="lost"),
    Metric("zerodoc_hook_available", "gauge", "",
           "1 if a torch hook point zerodoc relies on was found, 0 if missing.", ("hook",),
           per="hooks", into="hooks"),
    Metric("zerodoc_exporter_omitted_series", "gauge", "",
           "Series this rank leaves out of its scrape, by reason: unit_facts (per-unit facts, "
           "served by rank 0 only), unit_detail (per-unit series folded into this rank's "
           "totals: coarse mode's, and on every rank but rank 0 the framework's time per "
           "unit).", ("reason",), per="omit_reasons"),
    Metric("zerodoc_exporter_requests_total", "counter", "",
           "Requests to this rank's /metrics server by outcome: ok (a page served), "
           "unauthorized, rate_limited (429: too many failed logins, no password checked), "
           "over_capacity (503: too many connections at once, the request not read), "
           "timed_out (cut off at the whole-request deadline), client_gone (the client "
           "closed or reset the connection), bad_request (400, 405, 501: not a request for "
           "a page: malformed, another method, TLS on the plain port, HTTP/2), too_large "
           "(431, 414: a request head over the limits), not_ready (503: no page rendered "
           "yet).", ("outcome",), scope="server", per="exporter_outcomes"),
    Metric("zerodoc_exporter_cpu_seconds_total", "counter", "seconds",
           "CPU time of this rank's /metrics server threads (accepting, TLS, password checks, "
           "rendering, sending), from their per-thread CPU clocks: what serving /metrics "
           "took from the training process.", scope="server"),
    Metric("zerodoc_build", "info", "",
           "The zerodoc version serving these metrics and the Python it runs on "
           "(zerodoc_build_info, always 1).", ("version", "python_version")),
)

BY_NAME: dict[str, Metric] = {m.name: m for m in CATALOG}


def all_series_names() -> set[str]:
    """Every series name a scrape of zerodoc can contain."""
    return {s for m in CATALOG for s in m.series_names}


# Recorded series: the names the recording rules (zerodoc.ops.alerts.recording) write and the
# Prometheus source (zerodoc.sources.prometheus) reads, defined here once.
# What the Prometheus source reads per unit, phase and collective (zerodoc.unitstats fields):
# field -> (per-step numerator, the recorded names by aggregation). min of seconds / exposed
# and median of bytes are the link-attributable views below, recorded once.
UNIT_STAT = {
    "count": ("zerodoc_collective_calls_total",
              {"median": "unit_job:zerodoc_collective_calls:per_step_median",
               "mean": "unit_job:zerodoc_collective_calls:per_step_mean",
               "max": "unit_job:zerodoc_collective_calls:per_step_max"}),
    "bytes": ("zerodoc_collective_bytes_total",
              {"median": "unit_job:zerodoc_collective_bytes:per_step",
               "mean": "unit_job:zerodoc_collective_bytes:per_step_mean",
               "max": "unit_job:zerodoc_collective_bytes:per_step_max"}),
    "seconds": ("zerodoc_collective_seconds_total",
                {"min": "unit_job:zerodoc_collective_seconds:per_step",
                 "mean": "unit_job:zerodoc_collective_seconds:per_step_mean",
                 "max": "unit_job:zerodoc_collective_seconds:per_step_max"}),
    "exposed": ("zerodoc_collective_exposed_seconds_total",
                {"min": "unit_job:zerodoc_collective_exposed_seconds:per_step",
                 "mean": "unit_job:zerodoc_collective_exposed_seconds:per_step_mean",
                 "max": "unit_job:zerodoc_collective_exposed_seconds:per_step_max"}),
    "hidden": (None, {"min": "unit_job:zerodoc_collective_hidden_seconds:per_step_min",
                      "max": "unit_job:zerodoc_collective_hidden_seconds:per_step_max"}),
}
UNIT_RANKS = "unit_job:zerodoc_collective_ranks:count"
UNIT_COMPUTE = {"mean": "unit_phase_job:zerodoc_compute_seconds:per_step_mean",
                "max": "unit_phase_job:zerodoc_compute_seconds:per_step_max"}
# The framework's time per unit (summed over its phases), per step of a rank's detail steps,
# over the ranks that serve it per unit (`n`: how many); zerodoc.unitstats' framework_seconds.
UNIT_FRAMEWORK = {a: f"unit_job:zerodoc_framework_unit_seconds:per_step_{a}"
                  for a in ("min", "median", "mean", "max")}
UNIT_FRAMEWORK["n"] = "unit_job:zerodoc_framework_unit_seconds:ranks"
ASYNC_ALL_GATHER = "job:zerodoc_all_gather:asynchronous"
RULE_WINDOW = "job:zerodoc_recording_window:seconds"


SCOPES = {"rank": "every rank", "unit": "every rank; coarse: per-rank total",
          "unit_rank0": "rank 0 per unit; other ranks (and coarse): per-rank total",
          "run": "rank 0 only", "server": "every rank, on `/metrics/exporter`"}


def folds(scope: str, *, rank0: bool, unit_detail: bool) -> bool:
    """A metric of this scope is served summed over units (no `unit` label) by such a rank:
    `unit` ones outside the unit sample, `unit_rank0` ones on every rank but rank 0 too. The
    exporter (`exporter.prometheus`) and the series budget (`ops.cardinality`) ask it here,
    where the scopes are defined."""
    return scope == "unit" and not unit_detail or \
        scope == "unit_rank0" and not (rank0 and unit_detail)
