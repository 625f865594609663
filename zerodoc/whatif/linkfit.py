"""Link models fitted to a run's own collectives: time per call = latency + wire bytes / bus
bandwidth, per collective kind and group size, by weighted least squares over the run's
(bytes per call, seconds per call) points (one point per rank, unit and phase, weighted by
its calls), with the residual spread as the uncertainty.

Wire bytes are the nccl-tests bus convention (`zerodoc.runmodel.busbw`): bytes x (n-1)/n for
all-gather and reduce-scatter, x 2(n-1)/n for all-reduce, so a fitted bandwidth carries over
to another group size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..runmodel import RunSnapshot, busbw
from .unitgrid import seq_sums


def wire_factor(collective: str, n: int) -> float:
    """Bus bytes per algorithm byte of a collective on n ranks (0 for n <= 1)."""
    return busbw(1.0, collective, n)


@dataclass(frozen=True)
class LinkFit:
    """t(bytes) = latency_s + bytes * wire_factor / bandwidth; `resid_s`: the residual
    standard deviation of one call; `se_latency_s`: the standard error of the fitted line at
    the points' weighted mean size (`mean_wire_bytes`), `se_seconds_per_wire_byte` the
    slope's: the line's standard error at x wire bytes is
    sqrt(se_latency_s^2 + ((x - mean_wire_bytes) * se_seconds_per_wire_byte)^2), small
    where the run's calls were and growing with the distance from them."""

    collective: str
    group_size: int
    latency_s: float
    seconds_per_wire_byte: float  # 1 / bus bandwidth
    resid_s: float
    se_latency_s: float
    se_seconds_per_wire_byte: float
    points: int
    calls: float
    min_bytes: float
    max_bytes: float
    mean_wire_bytes: float = 0.0

    @property
    def bandwidth(self) -> float | None:
        """Bus bandwidth in bytes/s (None: no bytes-dependent part was seen)."""
        return 1.0 / self.seconds_per_wire_byte if self.seconds_per_wire_byte > 0 else None

    def seconds(self, nbytes: float, group_size: int | None = None, *, latency_scale=1.0,
                latency_add=0.0, latency_set=None, latency_set_low=None, bandwidth_scale=1.0,
                bandwidth_set=None, bound: float = 0) -> float:
        """Time of one call of `nbytes` (algorithm bytes) on `group_size` ranks; `bound`
        -Z / +Z: the low / high end (Z standard errors of the line at this size, of the
        parts a change leaves as fitted); `latency_set_low`: the latency a set one's low end
        (bound < 0) takes instead (a set latency that is itself an estimate)."""
        n = group_size or self.group_size
        if n <= 1:
            return 0.0
        x = nbytes * wire_factor(self.collective, n)
        lat, spb = self.latency_s, self.seconds_per_wire_byte
        se_b = self.se_seconds_per_wire_byte
        changed = latency_set is not None or bandwidth_set is not None or \
            latency_scale != 1.0 or bandwidth_scale != 1.0
        if not changed:  # the fitted line: its standard error at x
            se = math.hypot(self.se_latency_s, (x - self.mean_wire_bytes) * se_b)
        else:  # the parts left as fitted keep their own standard errors
            se_lat = 0.0 if latency_set is not None else \
                math.hypot(self.se_latency_s, self.mean_wire_bytes * se_b) * latency_scale
            se_bw = 0.0 if bandwidth_set is not None else x * se_b / bandwidth_scale
            se = math.hypot(se_lat, se_bw)
        if latency_set is not None and latency_set_low is not None and bound < 0:
            latency_set = min(latency_set, latency_set_low)
        lat = latency_set if latency_set is not None else lat * latency_scale + latency_add
        if bandwidth_set is not None:
            spb = 1.0 / bandwidth_set
        elif bandwidth_scale != 1.0:
            spb = spb / bandwidth_scale
        return max(0.0, lat + x * spb + bound * se)


def seq_sum(a) -> float:
    """The sum of a 1-d array from left to right, as Python's `sum` of its floats takes it
    (`unitgrid.seq_sums`): the fits over every rank's units (83 k points at 1,024 ranks x 81
    units) in C, their floats those of the Python sums."""
    return float(seq_sums(np.asarray(a, np.float64)))


def _wls(xs, ys, ws):
    """Weighted least squares y = a + b x; (a, b, residual sd, se of the line at the mean x,
    se_b, the weighted mean x). Falls back to a
    line through the mean (b = 0) when the sizes do not spread, and to a line through the
    origin (a = 0) when the intercept comes out negative; to b = 0 when the slope does.
    Each sum taken left to right (`seq_sum`), each term as the scalar expression would."""
    xs, ys, ws = (np.asarray(v, np.float64) for v in (xs, ys, ws))
    sw = seq_sum(ws)
    mx = seq_sum(ws * xs) / sw
    my = seq_sum(ws * ys) / sw
    sxx = seq_sum(ws * (xs - mx) ** 2)
    k = len(xs)
    spread = not (sxx <= (0.05 * mx) ** 2 * sw or k < 3)
    if not spread:  # sizes within ~5 %: no slope to see
        a, b = my, 0.0
    else:
        b = seq_sum(ws * (xs - mx) * (ys - my)) / sxx
        a = my - b * mx
        if b < 0:  # the noise hides the slope: latency only, the slope's error kept
            a, b = my, 0.0
        elif a < 0:
            b = seq_sum(ws * xs * ys) / max(seq_sum(ws * xs * xs), 1e-300)
            a = 0.0
    res = ys - (a + b * xs)
    dof = max(1, k - 2)
    resid = math.sqrt(seq_sum(ws * res * res) / sw * k / dof) if k > 1 else 0.0
    # the slope's standard error wherever the sizes spread, also when the fitted slope came
    # out negative and fell back to 0: a noise-hidden bandwidth is not an infinite one, and
    # calls priced far beyond the run's sizes (merged units) get the range that says so
    se_b = resid / math.sqrt(sxx / (sw / k)) if spread and sxx > 0 else 0.0
    se_a = resid / math.sqrt(k)
    return a, b, resid, se_a, se_b, mx


def link_points(snapshot: RunSnapshot, ranks=None
                ) -> dict[tuple[str, str, str], tuple[int, float, float, float]]:
    """Per (unit, phase, collective) of `ranks` (all by default): (group size, bytes per
    call, link-attributable seconds per call, calls). Link-attributable (docs/rules.md): a
    collective ends at about the same moment on every rank, so the time per call is the
    smallest over the ranks (the rank that arrived last waited for the link only; the others
    also waited for it: peer wait, modelled apart)."""
    best: dict[tuple[str, str, str], tuple[int, float, float, float]] = {}
    for r, w in sorted(snapshot.ranks.items()):
        if ranks is not None and r not in ranks:
            continue
        groups = {u.name: u for u in w.facts.units}
        for (unit, phase, coll), c in w.comm.items():
            if c.count <= 0 or c.seconds <= 0:
                continue
            u = groups.get(unit)
            n = u.collective_group_size(coll) if u else w.facts.world_size
            row = (n, c.bytes / c.count, c.seconds / c.count, float(c.count))
            key = (unit, phase, coll)
            if key not in best or row[2] < best[key][2]:
                best[key] = row
    return best


def fit_links(snapshot: RunSnapshot, ranks=None) -> dict[tuple[str, int], LinkFit]:
    """One `LinkFit` per (collective, group size) from the per-unit totals of `ranks` (all
    ranks with per-unit detail by default), over their link-attributable points
    (`link_points`)."""
    return links_from_points(link_points(snapshot, ranks))


def links_from_points(best: dict) -> dict[tuple[str, int], LinkFit]:
    """`fit_links` from the link-attributable points (`link_points`)."""
    pts: dict[tuple[str, int], list[tuple[float, float, float]]] = {}
    for (_unit, _phase, coll), (n, nbytes, secs, calls) in sorted(best.items()):
        pts.setdefault((coll, n), []).append((nbytes, secs, calls))
    out = {}
    for (coll, n), p in sorted(pts.items()):
        f = wire_factor(coll, n) or 1.0
        xs = [b * f for b, _, _ in p]
        ys = [s for _, s, _ in p]
        ws = [c for _, _, c in p]
        a, b, resid, se_a, se_b, mx = _wls(xs, ys, ws)
        out[(coll, n)] = LinkFit(coll, n, a, b, resid, se_a, se_b, len(p), sum(ws),
                                 min(x for x, _, _ in p), max(x for x, _, _ in p), mx)
    return out
