"""Slow link: large collectives reach far less bus bandwidth than the link should give.

Why: bus bandwidth (nccl-tests convention) of a collective big enough to be bandwidth-bound
is what the interconnect delivers. Far below the link class's expected figure means a slow or
misrouted path: PCIe instead of NVLink, a cross-node shard group, the wrong NIC, TCP instead
of InfiniBand. Memory is typically fine; step time is what degrades.

Evidence: per collective kind, the aggregate bus bandwidth of the collectives of at least
slow_link_min_bytes (link-attributable: the fastest rank's time, so a straggler's peers are
not blamed on the link), the link class and its expected bandwidth, the exposed time beyond
the link baseline, the memory headroom. Fires below slow_link_busbw_fraction of the link; with
synchronous collectives also below slow_link_costly_busbw_fraction when the time beyond the
link's expected time is at least exposed_fraction_crit of the step (a fixed delay on every
collective: the step waits on the link whatever its bandwidth figure says), unless the
wrapping is too fine (ZD002's condition: at least wrap_fine_min_units units, median
all-gather below wrap_fine_median_bytes): then per-call latency explains the wait.
Severity: ERROR when the exposure beyond the link is >= exposed_fraction_crit of the step,
else WARNING (the engine raises it further to what it explains: ZD003 / ZD004 / ZD006).
Predicted: the step model's (`zerodoc.whatif`) answer for the fix as a change, named in the
text: the slow collectives' latency per call set to the link class's healthy latency
(`thresholds.LINK_LATENCY_S`; the fitted one where that is lower; the range reaching down to
latency 0: the run cannot tell the healthy per-call cost from the delay) at the per-byte cost the
run fitted (a slope the noise hid: 0, its error in the range), the link class's bus bandwidth
where the fit shows a slower one or resolves none (calls all of one size): the step time and
exposed communication with their ranges, the same `zerodoc whatif` gives for that change.
Fix: check the topology and transport; keep the shard group inside a node (HSDP).
"""

from __future__ import annotations

import statistics

from ..findings import Severity
from ...humanize import pct, rate, secs
from ...thresholds import LINK_LATENCY_S
from ...whatif import Changes
from .base import effect, finding, whatif_model, model_effects, r6

CODE = "ZD005"
NAME = "slow-link"
SEVERITY = Severity.WARNING
TIER = 0
EXPLAINS = ("ZD003", "ZD004", "ZD006")


def evaluate(ctx) -> list:
    t = ctx.t
    if not ctx.link_busbw:
        return []
    slow, evidence, cost = [], {}, 0.0
    step = ctx.step_seconds
    sizes = [v.bytes_per_call for v in ctx.views("all_gather") if v.count]
    latency_bound = (len([u for u in ctx.units if u.params > 0]) >= t.wrap_fine_min_units
                     and bool(sizes) and statistics.median(sizes) < t.wrap_fine_median_bytes)
    for coll in ("all_gather", "reduce_scatter", "all_reduce"):
        big = [v for v in ctx.views(coll) if v.count and v.seconds > 0
               and v.bytes_per_call >= t.slow_link_min_bytes]
        if not big:
            continue
        n = max(v.group_size for v in big)
        seconds = sum(v.seconds for v in big)
        bw = sum(v.busbw * v.seconds for v in big) / seconds  # time-weighted = aggregate
        frac = bw / ctx.link_busbw
        evidence[coll] = {"busbw_bytes_per_second": r6(bw), "link_fraction": r6(frac),
                          "collectives_per_step": r6(sum(v.count for v in big)),
                          "group_size": n}
        beyond = sum(max(0.0, v.exposed_seconds - (v.expected_seconds or 0.0)) for v in big)
        costly = (ctx.sync and not latency_bound and step > 0
                  and frac < t.slow_link_costly_busbw_fraction
                  and beyond / step >= t.exposed_fraction_crit)
        if frac < t.slow_link_busbw_fraction or costly:
            slow.append((coll, bw, frac))
            cost += beyond
    if not slow:
        return []
    cost_frac = cost / step if step else 0.0
    severity = Severity.ERROR if cost_frac >= t.exposed_fraction_crit else Severity.WARNING
    w = next(iter(ctx.active.values()), None)
    heads = [h for h in map(ctx.headroom_fraction, ctx.ranks.values()) if h is not None]
    coll, bw, frac = min(slow, key=lambda s: s[2])
    hsdp = ("; the shard group spans nodes: shard within a node and replicate across (HSDP, "
            "`fully_shard(..., mesh=init_device_mesh(dev, (nodes, gpus_per_node)))`)"
            if w is not None and w.facts.world_size > max(1, w.facts.local_world_size) else "")
    # The fix, as the step model's change: the slow collectives' latency per call set to the
    # link class's healthy one (a fixed link still costs that per call; the fitted latency
    # where lower), the range down to 0, and their per-byte cost as the run fitted it, raised
    # to the link class's bus bandwidth where the fit shows a slower one or cannot resolve
    # one (`_class_priced`)
    kinds = sorted({s[0] for s in slow})
    kind = kinds[0] if len(kinds) == 1 else None
    model = whatif_model(ctx)
    fits = [f for (c, _n), f in (model.links.items() if model is not None else ())
            if c in kinds]
    bw_set = ctx.link_busbw if not fits or any(_class_priced(f, ctx.link_busbw)
                                               for f in fits) else None
    healthy = LINK_LATENCY_S.get(ctx.link, 0.0)
    lat = min([healthy, *(f.latency_s for f in fits)])
    change = Changes(latency_set_s=lat, latency_set_low_s=0.0 if lat > 0 else None,
                     latency_kind=kind, bandwidth_set=bw_set, bandwidth_kind=kind)
    timed, model_text = model_effects(ctx, change)
    if not timed:
        timed = [effect(ctx, "exposed_comm_seconds_per_step", "down",
                        sum(v.exposed_seconds for v in ctx.views() if v.count) - cost)]
    return [finding(
        CODE, NAME, severity,
        f"{coll.replace('_', '-')} bus bandwidth {rate(bw)} is {pct(frac)} of the "
        f"{rate(ctx.link_busbw)} expected on {ctx.link}; waiting on it beyond its expected "
        f"time costs {pct(cost_frac)} of the step",
        evidence={"link": ctx.link, "link_busbw_bytes_per_second": ctx.link_busbw,
                  **evidence, "exposed_beyond_link_seconds_per_step": r6(cost),
                  "exposed_beyond_link_fraction": r6(cost_frac),
                  "min_headroom_fraction": r6(min(heads)) if heads else None},
        threshold={"slow_link_busbw_fraction": t.slow_link_busbw_fraction,
                   "slow_link_costly_busbw_fraction": t.slow_link_costly_busbw_fraction,
                   "slow_link_min_bytes": t.slow_link_min_bytes,
                   "exposed_fraction_crit": t.exposed_fraction_crit},
        fix=("Check the path the collectives take: `nvidia-smi topo -m` (NVLink vs PCIe / "
             "SYS), `NCCL_DEBUG=INFO` for the transport (IB vs socket), NCCL_SOCKET_IFNAME / "
             "NCCL_IB_HCA (GLOO_SOCKET_IFNAME for gloo), PCIe link width and other traffic on "
             f"the bus{hsdp}. If the link class is wrong, pass --link."),
        predicted=(_modelled(kinds, bw_set, fits, lat, healthy, model_text) if model_text else
                   f"at the expected {rate(ctx.link_busbw)} the large collectives would "
                   f"expose about {pct(cost_frac)} less of the step"),
        cost_seconds_per_step=cost, link=ctx.link,
        **({"whatif": model_text} if model_text else {}),
        effects=(*timed,
                 effect(ctx, "large_collective_busbw_bytes_per_second", "up",
                        ctx.link_busbw)))]


def _class_priced(fit, link_busbw: float) -> bool:
    """Whether the fixed link's per-byte cost is the link class's figure rather than the
    run's own fit: the fit shows a bus bandwidth below the class's (a path slow per byte:
    PCIe for NVLink), or resolves none (all calls of one size: no slope and no error to
    give it). A slope the noise hid (fitted negative, kept at 0 with its standard error,
    `whatif.linkfit`) is a fit, not a slow path: pricing it at a conservative class figure
    made the prediction hinge on the noise (gloo-cpu: 120 MB/s against the 236-468 MB/s the
    same all-gathers fit when the slope shows, ~100 ms per step apart on the demo)."""
    if fit.bandwidth is not None:
        return fit.bandwidth < link_busbw
    return fit.se_seconds_per_wire_byte <= 0


def _modelled(kinds, bw_set, fits, lat: float, healthy: float, model_text: str) -> str:
    """The rule's predicted text: which change the model was asked (the fix as a what-if,
    the same `zerodoc whatif` answers) and its answer."""
    names = " and ".join(k.replace("_", "-") for k in kinds)
    if bw_set is not None:
        per_byte = f"bus bandwidth at the link class's {rate(bw_set)}"
    elif all(f.bandwidth is None for f in fits):
        per_byte = ("the per-byte cost the run fitted (a slope hidden by the noise: its "
                    "error is in the range)")
    else:
        per_byte = ("the bus bandwidth the run fitted ("
                    + ", ".join(rate(f.bandwidth) for f in fits if f.bandwidth) + ")")
    latency = (f"latency set to the link class's healthy {secs(healthy)} per call"
               if lat >= healthy else
               f"latency kept at the fitted {secs(lat)} per call (below the link class's "
               f"healthy {secs(healthy)})")
    return (f"with the link fixed, modelled as the {names} collectives' fixed delay per call "
            f"removed ({latency}; the range down to latency 0) and {per_byte}; {model_text}")


LINK_FACTS = ("link", "mesh_shape", "local_world_size", "backend", "simulated_link_latency_s")


def applied(before: dict, after: dict) -> str | None:
    """The fix shows as a different path for the collectives: link class, mesh (HSDP),
    ranks per node, backend (or, in the demo and tests, a different simulated latency)."""
    changed = [f"{k} {before.get(k)} -> {after.get(k)}" for k in LINK_FACTS
               if before.get(k) != after.get(k)]
    return "; ".join(changed) or None
