"""What can be observed about a run, by name: the vocabulary of predictions and comparisons.

A rule's predicted effect (`Predicted.metric`) names one of `OBSERVABLES`; `zerodoc compare`
reads the same observable on the run before and after the fix, so a prediction and its
outcome are measured alike. Values are per step and link-attributable where the rules are
(docs/rules.md, "How the rules read a run"), in base units; None when the run does not show
it (no all-gathers, no memory numbers).

`config_facts()` gives the configuration facts a fix can change (wrap, stage, reshard,
prefetch, dtypes, world size, framework, link); rules recognise their fix being applied from
them (`applied(before, after)` in a rule module). Plain Python.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable

from .context import HOST_TRANSFERS, Context


@dataclass(frozen=True)
class Observable:
    name: str
    unit: str  # seconds | bytes | ratio | count | bytes_per_second
    # "down" | "up": which way is an improvement; "fix": it depends on the fix (more, smaller
    # units are ZD001's fix and fewer, larger ones ZD002's): `compare` takes the direction
    # an applied fix predicted, and with none only says it changed
    better: str
    help: str
    read: Callable[[Context], float | None]


def _sum(views, attr: str) -> float | None:
    views = [v for v in views if v.count]
    return sum(getattr(v, attr) for v in views) if views else None


def _median_call_bytes(ctx: Context) -> float | None:
    sizes = [v.bytes_per_call for v in ctx.views("all_gather") if v.count]
    return statistics.median(sizes) if sizes else None


def _peak(ctx: Context) -> float | None:
    peaks = [p for p in map(ctx.peak, ctx.ranks.values()) if p is not None]
    return float(max(peaks)) if peaks else None


def _headroom(ctx: Context) -> float | None:
    fr = [h for h in map(ctx.headroom_fraction, ctx.ranks.values()) if h is not None]
    return min(fr) if fr else None


def _largest_fraction(ctx: Context) -> float | None:
    big, total = ctx.largest_unit, ctx.total_params
    return big.params / total if big is not None and total > 0 else None


def _peer_wait(ctx: Context) -> float | None:
    """Exposed time per step the median rank waits beyond the rank that waited least."""
    exp = [w.exposed_seconds / w.steps for w in ctx.active.values()]
    return statistics.median(exp) - min(exp) if len(exp) >= 2 else None


def _fragmentation(ctx: Context) -> float | None:
    out = []
    for w in ctx.ranks.values():
        m = w.memory
        reserved = m.get("peak_reserved") or m.get("reserved")
        allocated = m.get("peak_allocated") if m.get("peak_reserved") else m.get("allocated")
        if reserved and allocated is not None:
            out.append((reserved - allocated) / reserved)
    return max(out) if out else None


def _large_busbw(ctx: Context) -> float | None:
    big = [v for v in ctx.views() if v.count and v.seconds > 0
           and v.collective in ("all_gather", "reduce_scatter", "all_reduce")
           and v.bytes_per_call >= ctx.t.slow_link_min_bytes]
    s = sum(v.seconds for v in big)
    return sum(v.busbw * v.seconds for v in big) / s if s else None


def _offload(ctx: Context) -> float | None:
    if not ctx.active:
        return None
    opt = ctx.median(w.optimizer_seconds / w.steps for w in ctx.active.values())
    return opt + sum(v.seconds for v in ctx.views() if v.collective in HOST_TRANSFERS)


def _ratio(ctx: Context) -> float | None:
    ex = _sum(ctx.views(), "exposed_seconds")
    return ex / ctx.compute_seconds if ex is not None and ctx.compute_seconds > 0 else None


_LIST = (
    Observable("step_seconds", "seconds", "down", "step time (median over ranks of the mean)",
               lambda c: c.step_seconds or None),
    Observable("compute_seconds_per_step", "seconds", "down",
               "compute in the sharded units per step (median over ranks)",
               lambda c: c.compute_seconds or None),
    Observable("exposed_comm_seconds_per_step", "seconds", "down",
               "exposed communication per step, all collectives (link-attributable)",
               lambda c: _sum(c.views(), "exposed_seconds")),
    Observable("comm_compute_ratio", "ratio", "down", "exposed communication / compute",
               _ratio),
    Observable("all_gather_seconds_per_step", "seconds", "down",
               "all-gather time per step, issue to completion (link-attributable)",
               lambda c: _sum(c.views("all_gather"), "seconds")),
    Observable("all_gather_exposed_seconds_per_step", "seconds", "down",
               "all-gather time the compute waited for, per step",
               lambda c: _sum(c.views("all_gather"), "exposed_seconds")),
    Observable("backward_all_gather_exposed_seconds_per_step", "seconds", "down",
               "exposed time of the backward all-gathers (ZeRO-3's re-gathers) per step",
               lambda c: _sum(c.views("all_gather", "backward"), "exposed_seconds") or 0.0
               if c.views("all_gather") else None),
    Observable("reduce_scatter_seconds_per_step", "seconds", "down",
               "reduce-scatter time per step (link-attributable)",
               lambda c: _sum(c.views("reduce_scatter"), "seconds")),
    Observable("all_gathers_per_step", "count", "down", "all-gather calls per step",
               lambda c: _sum(c.views("all_gather"), "count")),
    Observable("all_gather_bytes_per_step", "bytes", "down", "all-gathered bytes per step",
               lambda c: _sum(c.views("all_gather"), "bytes")),
    Observable("backward_all_gather_bytes_per_step", "bytes", "down",
               "bytes all-gathered again in backward per step",
               lambda c: _sum(c.views("all_gather", "backward"), "bytes") or 0.0
               if c.views("all_gather") else None),
    Observable("median_all_gather_bytes", "bytes", "fix", "median bytes of one all-gather",
               _median_call_bytes),
    Observable("large_collective_busbw_bytes_per_second", "bytes_per_second", "up",
               "aggregate bus bandwidth of the collectives of at least slow_link_min_bytes",
               _large_busbw),
    Observable("units", "count", "fix", "sharded units with parameters",
               lambda c: float(len([u for u in c.units if u.params > 0])) if c.units else None),
    Observable("largest_unit_param_fraction", "ratio", "down",
               "share of all parameters in the largest unit", _largest_fraction),
    Observable("largest_unit_gather_bytes", "bytes", "down",
               "bytes of the largest unit gathered whole",
               lambda c: float(c.largest_unit.gather_bytes) if c.largest_unit else None),
    Observable("peak_memory_bytes", "bytes", "down",
               "peak memory of the worst rank (allocator peak reserved on a GPU, else peak "
               "resident)", _peak),
    Observable("min_headroom_fraction", "ratio", "up",
               "(capacity - peak) / capacity of the worst rank", _headroom),
    Observable("fragmentation_ratio", "ratio", "down",
               "(reserved - allocated) / reserved of the worst rank", _fragmentation),
    Observable("peer_wait_seconds_per_step", "seconds", "down",
               "exposed time the median rank waits beyond the rank that waited least",
               _peer_wait),
    Observable("optimizer_and_host_seconds_per_step", "seconds", "down",
               "optimizer step plus host transfers per step", _offload),
)
OBSERVABLES: dict[str, Observable] = {o.name: o for o in _LIST}


def observe(ctx: Context, name: str) -> float | None:
    """One observable of a prepared run (KeyError for an unknown name: a rule bug)."""
    if not ctx.active and name not in ("units", "largest_unit_param_fraction",
                                       "largest_unit_gather_bytes"):
        return None
    v = OBSERVABLES[name].read(ctx)
    return None if v is None else float(v)


def observe_all(ctx: Context) -> dict[str, float | None]:
    return {name: observe(ctx, name) for name in OBSERVABLES}


# --------------------------------------------------------------------------------------
# configuration facts


def _prefetch(cfg: dict) -> dict | None:
    p = cfg.get("prefetch")
    return p if isinstance(p, dict) else None


def config_facts(ctx: Context) -> dict[str, object]:
    """The facts of a run a fix can change, as plain values (docs/compare.md lists them)."""
    f = ctx.facts
    if f is None:
        return {}
    cfg = f.config if isinstance(f.config, dict) else {}
    units = [u for u in ctx.units if u.params > 0]
    reshard = {u.reshard_after_forward for u in units if u.reshard_after_forward is not None}
    params = sorted(u.params for u in units)
    pf = _prefetch(cfg)
    return {
        "framework": f.framework,
        "world_size": f.world_size,
        "local_world_size": f.local_world_size,
        "backend": f.backend,
        "device_type": f.device_type,
        "mesh_shape": "x".join(map(str, f.mesh_shape)) or None,
        "zero_stage": f.zero_stage,
        "stage": ctx.stage,
        "units": len(units),
        "median_unit_params": int(statistics.median(params)) if params else None,
        "largest_unit": (ctx.largest_unit.name or "(root)") if ctx.largest_unit else None,
        "largest_unit_param_fraction": round(_largest_fraction(ctx) or 0.0, 4)
        if units else None,
        "reshard_after_forward": ("mixed" if len(reshard) > 1 else
                                  (next(iter(reshard)) if reshard else None)),
        "resharded_unit_fraction": round(sum(1 for u in units if u.reshard_after_forward)
                                         / len(units), 4) if units else None,
        "prefetch_forward": pf.get("forward") if pf else None,
        "prefetch_backward": pf.get("backward") if pf else None,
        "unshard_async": pf.get("unshard_async") if pf else None,
        "synchronous_all_gathers": ctx.sync if ctx.views("all_gather") else None,
        "param_dtype": ",".join(sorted({u.param_dtype for u in units if u.param_dtype}))
        or f.param_dtype or None,
        "reduce_dtype": ",".join(sorted({u.reduce_dtype for u in units if u.reduce_dtype}))
        or f.reduce_dtype or None,
        "compute_dtype": cfg.get("compute_dtype") or cfg.get("autocast_dtype"),
        "offload": ctx.offload,
        "link": ctx.link,
        "simulated_link_latency_s": cfg.get("inject_latency_s") or 0.0,
        "alloc_conf": cfg.get("alloc_conf"),
    }
