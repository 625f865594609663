"""Per-unit numbers across ranks, computed once per snapshot: what the rules, the report and
the TUI's aggregated views read instead of walking every rank's per-unit dicts.

Every number is *per step* (a rank's window totals / the steps they cover). For each
(unit, phase, collective) the min / median / mean / max over the ranks that have it; for
each unit the table values (all-gather over all phases, reduce-scatter, compute) over the
given ranks that measured the unit (a rank without any series of it, e.g. not sampled there
yet or the unit absent on it, is left out: not measured, never a zero; a rank that measured
the unit counts a collective it has no series of as 0), and ratios (exposed fraction, bus
bandwidth) taken per rank first, then aggregated over the ranks where they are defined. The
framework's time per unit is over the ranks that have it for the unit. So the means agree
with the Prometheus source's PromQL (`sources/prometheus.py`), which aggregates each series
over the ranks that have it, where every rank that measured a unit has the same collectives
of it (as SPMD training does); where one such rank lacks a collective another has, numpy
counts it 0 there and PromQL leaves it out (review rev3 S2).

A source that aggregates on its side (Prometheus, in PromQL) sets `RunSnapshot.unit_stats`;
otherwise `unit_stats()` builds them from the ranks' windows with numpy, caching each
rank's row while its per-unit totals are the same objects (a run log read at scale keeps
them until the next interval line).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .catalog import RANK_TOTAL_UNIT  # a coarse rank's totals over units: no unit
from .runmodel import RankWindow, RunSnapshot, busbw


FIELDS = ("count", "bytes", "seconds", "exposed", "hidden")
UNIT_FIELDS = ("ag_count", "ag_bytes", "ag_seconds", "ag_exposed_seconds",
               "ag_exposed_fraction", "ag_busbw", "rs_seconds", "rs_exposed_seconds",
               "compute_forward", "compute_backward", "compute_seconds",
               # all-reduce (DDP's gradient buckets, ZeRO-1/2, FSDP1 NO_SHARD, grad norms)
               "ar_count", "ar_bytes", "ar_seconds", "ar_exposed_seconds",
               # the framework's own time (its hooks: copy-in / copy-out, gradient copies);
               # unknown (Stat n = 0) where no rank recorded it per unit (older run logs)
               "framework_seconds")


@dataclass(frozen=True)
class Stat:
    """One number across ranks: min, median, mean, max over `n` ranks (n = 0: unknown)."""

    min: float
    median: float
    mean: float
    max: float
    n: int

    @staticmethod
    def of(values) -> "Stat":
        vs = sorted(v for v in values if v is not None and not math.isnan(v))
        if not vs:
            return NONE
        k = len(vs)
        med = vs[k // 2] if k % 2 else (vs[k // 2 - 1] + vs[k // 2]) / 2
        return Stat(vs[0], med, sum(vs) / k, vs[-1], k)

    def get(self, how: str) -> float | None:
        return None if self.n == 0 else getattr(self, how)


NONE = Stat(0.0, 0.0, 0.0, 0.0, 0)


@dataclass
class UnitStats:
    ranks: tuple[int, ...]
    comm: dict[tuple[str, str, str], dict[str, Stat]] = field(default_factory=dict)
    units: dict[str, dict[str, Stat]] = field(default_factory=dict)
    sync: bool = False  # all-gathers were timed and not one second of them was hidden
    order: tuple[str, ...] = ()  # units in model order
    # when a source computed them (wall clock); None: from the snapshot's own per-unit data.
    # A source may reuse them across refreshes (sources/prometheus.py): their age.
    fetched_unix: float | None = None
    # the span they cover when it is not the snapshot's window: the rate window of the
    # Prometheus recording rules they were read from (sources/prometheus.py); None: the window
    window_s: float | None = None


def unit_stats(snap: RunSnapshot, ranks) -> UnitStats:
    """The stats over `ranks` (a list of ranks of `snap`), cached on the snapshot."""
    key = tuple(ranks)
    given = snap.unit_stats
    if isinstance(given, UnitStats) and (len(key) > 1 or set(key) == set(given.ranks)):
        return given  # aggregated by the source (over the ranks that reported in its window)
    cache = snap.__dict__.setdefault("_unit_stats_cache", {})
    got = cache.get(key)
    if got is None:
        got = cache[key] = from_windows([snap.ranks[r] for r in key], key)
    return got


# --------------------------------------------------------------------------------------
# from per-rank windows (numpy)

_CACHE: dict = {"key": None, "refs": None, "stats": None}


def _arrays(w: RankWindow) -> tuple:
    """(compute keys, seconds, comm keys, [K, 5] rows) of one rank's window totals: the
    arrays a run log read at scale already holds, else built from the dicts."""
    import numpy as np

    arr = getattr(w, "unit_arrays", None)
    if arr is not None:
        return arr
    comm = {k: t for k, t in w.comm.items() if k[0] != RANK_TOTAL_UNIT}
    compute = {k: v for k, v in w.compute.items() if k[0] != RANK_TOTAL_UNIT}
    mv = np.array([(t.count, t.bytes, t.seconds, t.exposed_seconds, t.hidden_seconds)
                   for t in comm.values()], np.float64).reshape(len(comm), 5)
    return tuple(compute), np.fromiter(compute.values(), np.float64, len(compute)), \
        tuple(comm), mv


def from_windows(windows: list[RankWindow], ranks: tuple[int, ...]) -> UnitStats:
    """The stats of these windows, cached while every rank's per-unit totals are the same
    objects (a run log read at scale: until the next interval line)."""
    srcs = [getattr(w, "unit_arrays", None) for w in windows]
    key = (ranks, tuple(id(a) if a is not None else (id(w.comm), id(w.compute), w.steps)
                        for a, w in zip(srcs, windows)),
           tuple(w.per_unit_steps for w in windows))
    if _CACHE["key"] == key:
        return _CACHE["stats"]
    out = _compute(windows, ranks)
    _CACHE.update(key=key, refs=(srcs, [(w.comm, w.compute) for w in windows
                                        if getattr(w, "unit_arrays", None) is None]),
                  stats=out)
    return out


def _compute(windows: list[RankWindow], ranks: tuple[int, ...]) -> UnitStats:
    import warnings

    import numpy as np

    out = UnitStats(ranks=ranks)
    if not windows:
        return out
    facts = windows[0].facts
    order = [u.name for u in facts.units]
    groups = {u.name: u.group_size for u in facts.units}
    arrs = [_arrays(w) for w in windows]
    steps = np.array([max(1, w.per_unit_steps or 1) for w in windows], np.float64)
    R = len(arrs)
    # comm: [R, K, 5] per step, NaN where a rank does not have the key
    mk0 = arrs[0][2]
    if all(a[2] is mk0 or a[2] == mk0 for a in arrs):
        mkeys = [k for k in mk0 if k[0] != RANK_TOTAL_UNIT]
        keep = [i for i, k in enumerate(mk0) if k[0] != RANK_TOTAL_UNIT]
        tot = np.stack([a[3] for a in arrs])[:, keep, :] if mk0 else np.zeros((R, 0, 5))
    else:
        pos: dict = {}
        for a in arrs:
            for k in a[2]:
                if k[0] != RANK_TOTAL_UNIT and k not in pos:
                    pos[k] = len(pos)
        mkeys = list(pos)
        tot = np.full((R, len(mkeys), 5), np.nan)
        for i, a in enumerate(arrs):
            idx = [(j, pos[k]) for j, k in enumerate(a[2]) if k in pos]
            if idx:
                src, dst = zip(*idx)
                tot[i, list(dst)] = a[3][list(src)]
    K = len(mkeys)
    per = tot / steps[:, None, None]
    if K:
        have = ~np.isnan(per[:, :, 0])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            if have.all():
                mins, meds = per.min(0), np.median(per, 0)
                means, maxs = per.mean(0), per.max(0)
            else:
                mins, meds = np.nanmin(per, 0), np.nanmedian(per, 0)
                means, maxs = np.nanmean(per, 0), np.nanmax(per, 0)
        ns = have.sum(0).tolist()
        mins, meds, means, maxs = (x.tolist() for x in (mins, meds, means, maxs))
        for j, k in enumerate(mkeys):
            out.comm[k] = {f: Stat(mins[j][x], meds[j][x], means[j][x], maxs[j][x], ns[j])
                           for x, f in enumerate(FIELDS)}
        ag = [j for j, k in enumerate(mkeys) if k[2] == "all_gather"]
        if ag:
            secs = np.nan_to_num(tot[:, ag, 2], nan=0.0)
            hid = np.nan_to_num(tot[:, ag, 4], nan=0.0)
            timed = (secs > 0).any()
            out.sync = bool(timed) and not bool((hid > 0.01 * secs + 1e-6)[secs > 0].any())
    # per-unit table values: [R, U] per field
    names = list(order)
    seen = set(names)
    for k in mkeys:
        if k[0] not in seen:
            seen.add(k[0])
            names.append(k[0])
    ckeys_all = [a[0] for a in arrs]
    for ck in {id(c): c for c in ckeys_all}.values():
        for (u, _p) in ck:
            if u != RANK_TOTAL_UNIT and u not in seen:
                seen.add(u)
                names.append(u)
    U = len(names)
    ui = {u: i for i, u in enumerate(names)}
    t = {}
    z = np.nan_to_num(per, nan=0.0)
    for f, coll, col in (("ag_count", "all_gather", 0), ("ag_bytes", "all_gather", 1),
                         ("ag_seconds", "all_gather", 2), ("ag_exposed_seconds", "all_gather", 3),
                         ("rs_seconds", "reduce_scatter", 2),
                         ("rs_exposed_seconds", "reduce_scatter", 3),
                         ("ar_count", "all_reduce", 0), ("ar_bytes", "all_reduce", 1),
                         ("ar_seconds", "all_reduce", 2), ("ar_exposed_seconds", "all_reduce", 3)):
        m = np.zeros((R, U))
        cols = [j for j, k in enumerate(mkeys) if k[2] == coll]
        if cols:
            dst = np.array([ui[mkeys[j][0]] for j in cols])
            np.add.at(m.T, dst, z[:, cols, col].T)
        t[f] = m
    # which ranks measured each unit (any collective, compute or framework series of it): a
    # rank that did not (not sampled there yet, or the unit absent on it) is left out of the
    # unit's stats, never counted as a zero; a rank that measured the unit and has no series
    # of one of its collectives did measure none of them (0). Counted per (rank, unit).
    seen_n = np.zeros((R, U))
    if K:
        np.add.at(seen_n.T, np.array([ui[k[0]] for k in mkeys]), have.T.astype(np.float64))
    ck0 = arrs[0][0]
    if all(a[0] is ck0 or a[0] == ck0 for a in arrs):  # every rank the same keys: stack
        cmat = np.stack([a[1] for a in arrs]) / steps[:, None] if ck0 else np.zeros((R, 0))
        ckeys = list(ck0)
        chave = np.ones(cmat.shape, bool)
    else:
        cpos: dict = {}
        for a in arrs:
            for k in a[0]:
                cpos.setdefault(k, len(cpos))
        ckeys = list(cpos)
        cmat = np.zeros((R, len(ckeys)))
        chave = np.zeros((R, len(ckeys)), bool)
        for i, a in enumerate(arrs):
            if a[0]:
                cols = [cpos[k] for k in a[0]]
                cmat[i, cols] = a[1] / steps[i]
                chave[i, cols] = True
    for f, phases in (("compute_seconds", None), ("compute_forward", "forward"),
                      ("compute_backward", "backward")):
        m = np.zeros((R, U))
        cols = [j for j, (u, p) in enumerate(ckeys) if u != RANK_TOTAL_UNIT
                and (phases is None or p == phases)]
        if cols:
            dst = np.array([ui[ckeys[j][0]] for j in cols])
            np.add.at(m.T, dst, cmat[:, cols].T)
            if phases is None:
                np.add.at(seen_n.T, dst, chave[:, cols].T.astype(np.float64))
        t[f] = m
    # the framework's time: a rank without it for a unit is left out of that unit's (older
    # run logs have none; a coarse rank's sum over units, RANK_TOTAL_UNIT, says nothing per
    # unit), as PromQL leaves out a rank without the unit's series
    fi: list = []
    fj: list = []
    fv: list = []
    for i, w in enumerate(windows):
        for (u, _p), v in w.unit_framework.items():
            j = ui.get(u)
            if j is not None:
                fi.append(i)
                fj.append(j)
                fv.append(v)
    fw = np.full((R, U), np.nan)
    fw_have = np.zeros((R, U), bool)
    if fv:
        fi_a, fj_a = np.array(fi), np.array(fj)
        fw_sum = np.zeros((R, U))
        np.add.at(fw_sum, (fi_a, fj_a), np.array(fv) / steps[fi_a])
        fw_have[fi_a, fj_a] = True
        fw[fw_have] = fw_sum[fw_have]
    measured = (seen_n > 0) | fw_have
    if not measured.all():
        for m in t.values():
            m[~measured] = np.nan
    t["framework_seconds"] = fw
    with np.errstate(divide="ignore", invalid="ignore"):
        sec = t["ag_seconds"]
        t["ag_exposed_fraction"] = np.where(sec > 0, t["ag_exposed_seconds"] / sec, np.nan)
        algbw = np.where(sec > 0, t["ag_bytes"] / sec, np.nan)
    factor = np.array([busbw(1.0, "all_gather", groups.get(u, facts.world_size)) for u in names])
    t["ag_busbw"] = algbw * factor
    cols = {f: _column_stats(t[f]) for f in UNIT_FIELDS}
    for j, u in enumerate(names):
        out.units[u] = {f: cols[f][j] for f in UNIT_FIELDS}
    out.order = tuple(names)
    return out


def _column_stats(m) -> list[Stat]:
    """Stat per column of a [R, U] matrix, NaN cells left out."""
    import warnings

    import numpy as np

    have = ~np.isnan(m)
    n = have.sum(0).tolist()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        if have.all():
            mn, md, me, mx = m.min(0), np.median(m, 0), m.mean(0), m.max(0)
        else:
            mn, md, me, mx = np.nanmin(m, 0), np.nanmedian(m, 0), np.nanmean(m, 0), \
                np.nanmax(m, 0)
    mn, md, me, mx = (x.tolist() for x in (mn, md, me, mx))
    return [Stat(mn[j], md[j], me[j], mx[j], n[j]) if n[j] else NONE for j in range(len(n))]
