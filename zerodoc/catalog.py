"""The metric catalog: every Prometheus series zerodoc exports, as data.

One table drives the exporter (`zerodoc.exporter.prometheus`), the generated docs
(`docs/metrics.md`, `python -m zerodoc.catalog`), and the test that every PromQL expression
in `dashboards/` and `rules/` names a catalogued metric.

Conventions: base units (seconds, bytes), cumulative counters for time and bytes so any
window is a `rate()`, gauges for levels. Every series also carries the rank labels
`rank`, `local_rank`, `node`; the extra labels listed per metric are bounded (unit = the
sharded module's path, phase, collective, population, hook).
"""

from __future__ import annotations

from dataclasses import dataclass

RANK_LABELS: tuple[str, ...] = ("rank", "local_rank", "node")

PHASES: tuple[str, ...] = ("forward", "backward", "optimizer")
COLLECTIVES: tuple[str, ...] = ("all_gather", "reduce_scatter", "all_reduce", "broadcast")

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
           "Wall time of training steps (optimizer step to optimizer step)."),
    Metric("zerodoc_last_step", "gauge", "",
           "Index of the last completed step."),
    Metric("zerodoc_last_step_seconds", "gauge", "seconds",
           "Wall time of the last completed step."),
    Metric("zerodoc_last_step_timestamp_seconds", "gauge", "seconds",
           "Unix time at which the last step completed (staleness check)."),
    Metric("zerodoc_optimizer_seconds_total", "counter", "seconds",
           "Time spent in optimizer.step()."),
    Metric("zerodoc_other_seconds_total", "counter", "seconds",
           "Step time outside sharded units, collective waits and the optimizer "
           "(data loading, loss, FSDP bookkeeping)."),
    Metric("zerodoc_framework_seconds_total", "counter", "seconds",
           "Time inside the sharding framework's own hooks, excluding collective waits."),
    # --- per unit, per phase --------------------------------------------------------------
    Metric("zerodoc_compute_seconds_total", "counter", "seconds",
           "Compute time of a sharded unit's own layers (children units excluded).",
           ("unit", "phase")),
    Metric("zerodoc_collective_calls_total", "counter", "",
           "Collectives issued for a sharded unit.", ("unit", "phase", "collective")),
    Metric("zerodoc_collective_bytes_total", "counter", "bytes",
           "Bytes of the collective's full buffer (nccl-tests size: all-gather output, "
           "reduce-scatter input).", ("unit", "phase", "collective")),
    Metric("zerodoc_collective_seconds_total", "counter", "seconds",
           "Collective time from issue to completion.", ("unit", "phase", "collective")),
    Metric("zerodoc_collective_exposed_seconds_total", "counter", "seconds",
           "Part of the collective's time the compute had to wait for (not hidden).",
           ("unit", "phase", "collective")),
    Metric("zerodoc_collective_busbw_bytes_per_second", "gauge", "bytes_per_second",
           "Bus bandwidth of the collective over the last step (nccl-tests convention).",
           ("unit", "phase", "collective")),
    # --- memory -------------------------------------------------------------------------
    Metric("zerodoc_memory_bytes", "gauge", "bytes",
           "Memory by population: sharded_parameters, gradients, optimizer_state, "
           "process_resident, process_peak_resident (+ device populations on GPU).",
           ("population",)),
    Metric("zerodoc_device_memory_capacity_bytes", "gauge", "bytes",
           "Memory available to this rank: the GPU's total memory, or on CPU an equal share "
           "of host memory per local rank."),
    Metric("zerodoc_memory_headroom_bytes", "gauge", "bytes",
           "Capacity minus peak reserved (GPU) or peak resident (CPU) memory."),
    # --- GPU (CUDA allocator, NVML); absent on CPU runs ----------------------------------
    Metric("zerodoc_gpu_alloc_retries_total", "counter", "",
           "CUDA caching-allocator retries (cudaMalloc failed, cache flushed, retried)."),
    Metric("zerodoc_gpu_ooms_total", "counter", "",
           "CUDA out-of-memory errors raised by the caching allocator."),
    Metric("zerodoc_gpu_utilization_ratio", "gauge", "ratio",
           "GPU utilisation reported by NVML (0-1)."),
    Metric("zerodoc_gpu_pcie_bytes_per_second", "gauge", "bytes_per_second",
           "PCIe throughput reported by NVML.", ("direction",)),
    # --- static facts -------------------------------------------------------------------
    Metric("zerodoc_run", "info", "",
           "Static facts of the run: framework, versions, device, dtypes, mesh.",
           ("framework", "framework_version", "torch_version", "device_type", "backend",
            "zero_stage", "param_dtype", "reduce_dtype", "mesh_shape", "run_id", "link")),
    Metric("zerodoc_world_size", "gauge", "", "Number of ranks in the job."),
    Metric("zerodoc_unit_parameters", "gauge", "",
           "Parameters of a sharded unit (unsharded count).", ("unit",)),
    Metric("zerodoc_unit_parameter_bytes", "gauge", "bytes",
           "Unsharded parameter bytes of a unit in its gathered dtype.", ("unit",)),
    Metric("zerodoc_unit_reshard_after_forward", "gauge", "",
           "1 if the unit frees its gathered parameters after forward (ZeRO-3-like), "
           "0 if it keeps them for backward (ZeRO-2-like).", ("unit",)),
    Metric("zerodoc_local_world_size", "gauge", "", "Number of ranks on this rank's node."),
    Metric("zerodoc_unit_index", "gauge", "",
           "Position of the unit in the model's module order (0: outermost).", ("unit",)),
    Metric("zerodoc_unit_group_size", "gauge", "",
           "Ranks in the unit's all-gather / reduce-scatter group.", ("unit",)),
    Metric("zerodoc_unit_sharded_bytes", "gauge", "bytes",
           "This rank's shard of the unit's parameters, in their stored dtype.", ("unit",)),
    Metric("zerodoc_unit_stored_parameter_bytes", "gauge", "bytes",
           "Unsharded parameter bytes of a unit in its stored (original) dtype.", ("unit",)),
    Metric("zerodoc_unit_dtype", "info", "",
           "A unit's all-gather (parameter) dtype and gradient reduce dtype.",
           ("unit", "param_dtype", "reduce_dtype")),
    # --- zerodoc's own health -----------------------------------------------------------
    Metric("zerodoc_self_seconds_total", "counter", "seconds",
           "Time zerodoc itself spent at step boundaries (bookkeeping, run log, memory "
           "sampling)."),
    Metric("zerodoc_errors_total", "counter", "",
           "Internal zerodoc errors caught and counted (the training job carried on).",
           ("hook",)),
    Metric("zerodoc_hook_available", "gauge", "",
           "1 if a torch hook point zerodoc relies on was found, 0 if missing.", ("hook",)),
)

BY_NAME: dict[str, Metric] = {m.name: m for m in CATALOG}


def all_series_names() -> set[str]:
    """Every series name a scrape of zerodoc can contain."""
    return {s for m in CATALOG for s in m.series_names}


def markdown() -> str:
    """The catalog as a Markdown table (docs/metrics.md is generated from this)."""
    lines = [
        "# zerodoc metrics",
        "",
        "Generated by `python -m zerodoc.catalog` from `zerodoc/catalog.py`; do not edit by hand.",
        "",
        f"Every series carries the labels `{'`, `'.join(RANK_LABELS)}`.",
        "",
        "| name | type | unit | extra labels | help |",
        "|---|---|---|---|---|",
    ]
    for m in CATALOG:
        labels = ", ".join(f"`{x}`" for x in m.labels) or "—"
        lines.append(f"| `{m.name}` | {m.type} | {m.unit or '—'} | {labels} | {m.help} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
