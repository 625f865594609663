"""Prometheus exposition of one rank: a custom collector over the monitor's totals.

`collect()` builds metric families from the latest cumulative totals at scrape time (nothing
is registered at import, the registry is injected); the per-unit ones only when a step end
changed the totals. The page is encoded by `page.py` (unchanged families and gzip reused).
Metric names, types, help and labels come from `zerodoc.catalog`; how many series a rank
serves (its detail level, the run's facts on rank 0 only) is counted by `zerodoc.ops.cardinality`.
The HTTP server that serves it (ports, TLS, basic auth) is `server.py`.
"""

from __future__ import annotations

import os
import platform

os.environ.setdefault("PROMETHEUS_DISABLE_CREATED_SERIES", "True")

from prometheus_client.core import (  # noqa: E402
    CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, InfoMetricFamily,
)

from ..version import __version__  # noqa: E402
from ..catalog import (  # noqa: E402
    BY_NAME, RANK_COMPUTE, RANK_EXPOSED, RANK_LABELS, STEP_BUCKETS,
)
from ..catalog import folds as folded_on  # noqa: E402
from . import detail  # noqa: E402
from .closing import CloseSignal  # noqa: E402

# Keys of the memory dict that are not byte populations, and where they go.
GPU_SERIES = {
    "alloc_retries": "zerodoc_gpu_alloc_retries_total",
    "ooms": "zerodoc_gpu_ooms_total",
    "gpu_utilization_ratio": "zerodoc_gpu_utilization_ratio",
}
NOT_POPULATIONS = {"capacity", "headroom", "ooms_observed", "pcie_tx_bytes_per_second",
                   "pcie_rx_bytes_per_second", *GPU_SERIES}


def _family(name: str, extra_labels: tuple[str, ...] = ()):
    m = BY_NAME[name]
    labels = list(RANK_LABELS) + list(extra_labels or m.labels)
    if m.type == "counter":
        # CounterMetricFamily appends _total itself.
        return CounterMetricFamily(name.removesuffix("_total"), m.help, labels=labels)
    if m.type == "gauge":
        return GaugeMetricFamily(name, m.help, labels=labels, unit="")
    raise ValueError(name)


def _sample(name: str, rl: list, value):
    """A family holding one sample of a rank-labelled metric."""
    f = _family(name)
    f.add_metric(rl, value)
    return f


class ZerodocCollector:
    """Yields zerodoc's families for one rank from `monitor.totals` at scrape time.

    What a rank serves depends on its detail level (`zerodoc.exporter.detail`): per-unit
    series on every rank (`full`) or only on the ranks of the unit sample (`coarse`; the
    others serve them summed over units), and the run's per-unit facts on rank 0 only, as the
    framework's time per unit (every other rank: summed over units, per phase)."""

    def __init__(self, monitor):
        self.m = monitor
        if getattr(monitor, "close_signal", None) is None:
            monitor.close_signal = CloseSignal()
        self.closing = monitor.close_signal
        # Families that change only at a step end (the per-unit totals, keyed by the
        # monitor's fold count) or never (the run's unit facts): built once, handed out
        # again as the same objects, which the page cache (`page.py`) does not re-encode.
        self._units_key = self._facts_of = None
        self._units_cache: tuple[list, int] = ([], 0)
        self._facts_cache: list = []

    def stamp(self) -> tuple:
        """Changes whenever the page must be rendered anew rather than served as it was (a
        step end, the close, a stall starting or ending, a counted error); cheap. A step end
        is the step index: the fold count moves on detail steps only, and a page keyed by it
        alone froze every step-level series (zerodoc_last_step, the step histogram, memory)
        between samples in the default mode (issue 31)."""
        m = self.m
        wd = getattr(m, "watchdog", None)
        errors = getattr(getattr(m, "registry", None), "errors", None) or {}
        return (getattr(m, "step_index", None), getattr(m, "_folds", None),
                self.closing.closed_unix,
                None if wd is None else (wd.count, wd.current is None),
                sum(errors.values()))

    def describe(self):
        return []  # no collect() at registration time

    def collect(self):
        m = self.m
        facts, tot = m.facts, m.totals
        cfg = getattr(m, "cfg", None)
        level = getattr(cfg, "metrics_detail", detail.DEFAULT_DETAIL)
        unit_detail = detail.has_unit_detail(
            level, facts.rank, facts.world_size,
            getattr(cfg, "metrics_unit_ranks", detail.DEFAULT_UNIT_RANKS))
        rl = [str(facts.rank), str(facts.local_rank), facts.node]
        if self.closing.closed_unix is not None:
            yield _sample("zerodoc_run_closed_timestamp_seconds", rl, self.closing.closed_unix)
        writer = getattr(m, "_writer", None)
        if writer is not None:
            yield _sample("zerodoc_runlog_dropped_records_total", rl, writer.dropped)
            if writer.lost:  # served once a record was lost (cardinality.Shape.lost)
                yield _sample("zerodoc_runlog_records_lost_total", rl, writer.lost)

        h = HistogramMetricFamily("zerodoc_step_duration_seconds",
                                  BY_NAME["zerodoc_step_duration_seconds"].help, labels=RANK_LABELS)
        cum, buckets = 0, []
        counts = list(m.hist_counts)
        for le, n in zip(STEP_BUCKETS, counts):
            cum += n
            buckets.append((repr(float(le)), cum))
        buckets.append(("+Inf", tot.steps))
        h.add_metric(rl, buckets, tot.step_seconds)
        yield h

        for name, value in (
            ("zerodoc_last_step", tot.last_step),
            ("zerodoc_last_step_seconds", tot.last_step_seconds),
            ("zerodoc_last_step_timestamp_seconds", tot.updated_unix),
            ("zerodoc_world_size", facts.world_size),
            ("zerodoc_injected_latency_seconds",
             float(facts.config.get("inject_latency_s", 0) or 0)),
        ):
            yield _sample(name, rl, value)
        for name, value in (
            ("zerodoc_optimizer_seconds_total", tot.optimizer_seconds),
            ("zerodoc_other_seconds_total", tot.other_seconds),
            ("zerodoc_framework_seconds_total", tot.framework_seconds),
            ("zerodoc_self_seconds_total", tot.self_seconds),
            ("zerodoc_compute_host_seconds_total", tot.host_compute_seconds),
            ("zerodoc_launch_segments_total", tot.launch_checks),
            ("zerodoc_launch_caught_up_total", tot.launch_caught_up),
        ):
            yield _sample(name, rl, value)
        # the steps the per-unit counters cover: the sampled ones (every step without sampling)
        yield _sample("zerodoc_detail_steps_total", rl, tot.per_unit_steps)

        folds = getattr(m, "_folds", None)  # read before the totals: a fold ends by bumping it
        key = (folds, unit_detail, tuple(rl))
        if folds is None or key != self._units_key:
            compute, comm = list(tot.compute.items()), list(tot.comm.items())
            fw = list(tot.unit_framework.items())
            if unit_detail:
                fams = list(_per_unit(rl, compute, comm))
            else:
                fams = list(_rank_totals(rl, compute, comm))
            # the framework's time per unit: rank 0's alone (catalog scope `unit_rank0`)
            per_unit_fw = not folded_on("unit_rank0", rank0=facts.rank == 0,
                                        unit_detail=unit_detail)
            fams.append(_framework(rl, fw, per_unit_fw))
            full = len(compute) + 4 * len(comm) + len(fw)
            folded = full - sum(len(f.samples) for f in fams)
            # the rank-level totals, at every detail level (catalog RANK_COMPUTE): not folded
            fams += list(_rank_level(rl, compute, comm))
            self._units_cache, self._units_key = (fams, folded), key
        fams, folded = self._units_cache
        yield from fams

        mem = _family("zerodoc_memory_bytes")
        for pop, b in list(tot.memory.items()):
            if pop not in NOT_POPULATIONS:
                mem.add_metric(rl + [pop], b)
        yield mem
        for key, name in GPU_SERIES.items():
            if key in tot.memory:
                yield _sample(name, rl, tot.memory[key])
        pcie = [(d, tot.memory[f"pcie_{d}_bytes_per_second"]) for d in ("tx", "rx")
                if f"pcie_{d}_bytes_per_second" in tot.memory]
        if pcie:
            g = _family("zerodoc_gpu_pcie_bytes_per_second")
            for d, v in pcie:
                g.add_metric(rl + [d], v)
            yield g
        if "capacity" in tot.memory:
            yield _sample("zerodoc_device_memory_capacity_bytes", rl, tot.memory["capacity"])
            yield _sample("zerodoc_memory_headroom_bytes", rl, tot.memory["headroom"])

        info = InfoMetricFamily("zerodoc_run", BY_NAME["zerodoc_run"].help,
                                labels=list(RANK_LABELS))
        info.add_metric(rl, {
            "framework": facts.framework, "framework_version": facts.framework_version,
            "torch_version": facts.torch_version, "device_type": facts.device_type,
            "backend": facts.backend, "zero_stage": str(facts.zero_stage or ""),
            "param_dtype": facts.param_dtype, "reduce_dtype": facts.reduce_dtype,
            "mesh_shape": "x".join(str(x) for x in facts.mesh_shape), "run_id": facts.run_id,
            "job_id": facts.job_id or "", "link": str(facts.config.get("link", "")),
            "metrics_detail": level,
        })
        yield info

        if self._facts_of is not facts:  # RankFacts is immutable
            self._facts_cache = list(_unit_facts(rl, facts.units))
            self._facts_of = facts
        unit_facts = self._facts_cache
        if facts.rank == 0:
            yield from unit_facts
        yield _sample("zerodoc_local_world_size", rl, facts.local_world_size)

        wd = getattr(m, "watchdog", None)
        if wd is not None:
            yield _sample("zerodoc_stalls_total", rl, wd.count)
            cur = wd.current
            g = _family("zerodoc_stall_since_timestamp_seconds")
            if cur is not None:
                g.add_metric(rl + [cur.get("unit") or "", cur.get("phase") or "",
                                   cur.get("collective") or ""], cur["since_unix"])
            yield g

        errs = _family("zerodoc_errors_total")
        for hook, n in list(m.registry.errors.items()):
            errs.add_metric(rl + [hook], n)
        yield errs
        avail = _family("zerodoc_hook_available")
        for hook, status in list(m.registry.status.items()):
            avail.add_metric(rl + [hook], 1 if status == "ok" else 0)
        yield avail
        omitted = _family("zerodoc_exporter_omitted_series")
        omitted.add_metric(rl + ["unit_facts"],
                           0 if facts.rank == 0 else sum(len(f.samples) for f in unit_facts))
        omitted.add_metric(rl + ["unit_detail"], folded)
        yield omitted
        build = InfoMetricFamily("zerodoc_build", BY_NAME["zerodoc_build"].help,
                                 labels=list(RANK_LABELS))
        build.add_metric(rl, {"version": __version__,
                              "python_version": platform.python_version()})
        yield build


class ServerCollector:
    """The /metrics server's own counters (`/metrics/exporter`: outside the rank's /metrics
    page and its series budget): requests by outcome and the server threads' CPU time."""

    def __init__(self, monitor, stats):
        self.m, self.stats = monitor, stats

    def collect(self):
        f = self.m.facts
        rl = [str(f.rank), str(f.local_rank), f.node]
        req = _family("zerodoc_exporter_requests_total")
        for outcome, n in list(self.stats.requests.items()):
            req.add_metric(rl + [outcome], n)
        yield req
        yield _sample("zerodoc_exporter_cpu_seconds_total", rl, self.stats.cpu_seconds())


def _per_unit(rl: list[str], compute: list, comm: list):
    """The per-unit series of one rank (full detail)."""
    comp = _family("zerodoc_compute_seconds_total")
    for (unit, phase), s in compute:
        comp.add_metric(rl + [unit, phase], s)
    yield comp
    calls = _family("zerodoc_collective_calls_total")
    nbytes = _family("zerodoc_collective_bytes_total")
    secs = _family("zerodoc_collective_seconds_total")
    exposed = _family("zerodoc_collective_exposed_seconds_total")
    for (unit, phase, coll), t in comm:
        lv = rl + [unit, phase, coll]
        calls.add_metric(lv, t.count)
        nbytes.add_metric(lv, t.bytes)
        secs.add_metric(lv, t.seconds)
        exposed.add_metric(lv, t.exposed_seconds)
    yield from (calls, nbytes, secs, exposed)


def _rank_level(rl: list[str], compute: list, comm: list):
    """The rank's compute per phase and exposed collective time per (phase, collective),
    summed over its units (catalog RANK_COMPUTE, RANK_EXPOSED)."""
    comp: dict[str, float] = {}
    for (_unit, phase), s in compute:
        comp[phase] = comp.get(phase, 0.0) + s
    exposed: dict[tuple[str, str], float] = {}
    for (_unit, phase, coll), t in comm:
        exposed[(phase, coll)] = exposed.get((phase, coll), 0.0) + t.exposed_seconds
    f = _family(RANK_COMPUTE)
    for phase, s in comp.items():
        f.add_metric(rl + [phase], s)
    yield f
    f = _family(RANK_EXPOSED)
    for (phase, coll), s in exposed.items():
        f.add_metric(rl + [phase, coll], s)
    yield f


def _by_phase(rl: list[str], name: str, rows: list):
    """A (unit, phase)-keyed metric summed over units, without the `unit` label."""
    by_phase: dict[str, float] = {}
    for (_unit, phase), s in rows:
        by_phase[phase] = by_phase.get(phase, 0.0) + s
    f = _family(name, ("phase",))
    for phase, s in by_phase.items():
        f.add_metric(rl + [phase], s)
    return f


def _framework(rl: list[str], rows: list, per_unit: bool):
    """zerodoc_framework_unit_seconds_total: per unit and phase (rank 0), or summed over
    units per phase (every other rank: the same framework code runs on each, and 2 series
    per unit on every rank broke the series budget; its run log keeps them per unit)."""
    name = "zerodoc_framework_unit_seconds_total"
    if not per_unit:
        return _by_phase(rl, name, rows)
    f = _family(name)
    for (unit, phase), s in rows:
        f.add_metric(rl + [unit, phase], s)
    return f


def _rank_totals(rl: list[str], compute: list, comm: list):
    """The same metrics summed over units, without the `unit` label (coarse detail)."""
    yield _by_phase(rl, "zerodoc_compute_seconds_total", compute)
    sums: dict[tuple[str, str], list] = {}
    for (_unit, phase, coll), t in comm:
        a = sums.setdefault((phase, coll), [0, 0, 0.0, 0.0])
        a[0] += t.count
        a[1] += t.bytes
        a[2] += t.seconds
        a[3] += t.exposed_seconds
    labels = ("phase", "collective")
    fams = [_family(name, labels) for name in (
        "zerodoc_collective_calls_total", "zerodoc_collective_bytes_total",
        "zerodoc_collective_seconds_total", "zerodoc_collective_exposed_seconds_total")]
    for (phase, coll), a in sums.items():
        for f, v in zip(fams, a):
            f.add_metric(rl + [phase, coll], v)
    yield from fams


def _unit_facts(rl: list[str], units):
    """The run's per-unit facts (served by rank 0 only)."""
    params = _family("zerodoc_unit_parameters")
    pbytes = _family("zerodoc_unit_parameter_bytes")
    reshard = _family("zerodoc_unit_reshard_after_forward")
    index = _family("zerodoc_unit_index")
    group = _family("zerodoc_unit_group_size")
    sharded = _family("zerodoc_unit_sharded_bytes")
    stored = _family("zerodoc_unit_stored_parameter_bytes")
    tensors = _family("zerodoc_unit_parameter_tensors")
    dtype = InfoMetricFamily("zerodoc_unit_dtype", BY_NAME["zerodoc_unit_dtype"].help,
                             labels=list(RANK_LABELS) + ["unit"])
    for i, u in enumerate(units):
        lv = rl + [u.name]
        params.add_metric(lv, u.params)
        pbytes.add_metric(lv, u.gather_bytes)
        if u.reshard_after_forward is not None:
            reshard.add_metric(lv, 1 if u.reshard_after_forward else 0)
        index.add_metric(lv, i)
        group.add_metric(lv, u.group_size)
        sharded.add_metric(lv, u.sharded_bytes)
        stored.add_metric(lv, u.param_bytes)
        if u.tensors is not None:
            tensors.add_metric(lv, u.tensors)
        dtype.add_metric(lv, {"param_dtype": u.param_dtype, "reduce_dtype": u.reduce_dtype})
    yield from (params, pbytes, reshard, index, group, sharded, stored, tensors, dtype)
