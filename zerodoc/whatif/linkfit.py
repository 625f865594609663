"""Link models fitted to a run's own collectives: time per call = latency + wire bytes / bus
bandwidth, per collective kind and group size, by weighted least squares over the run's
(bytes per call, seconds per call) points (one point per rank, unit and phase, weighted by
its calls), with the residual spread as the uncertainty.

Wire bytes are the nccl-tests bus convention (`zerodoc.model.busbw`): bytes x (n-1)/n for
all-gather and reduce-scatter, x 2(n-1)/n for all-reduce, so a fitted bandwidth carries over
to another group size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..model import RunSnapshot, busbw


def wire_factor(collective: str, n: int) -> float:
    """Bus bytes per algorithm byte of a collective on n ranks (0 for n <= 1)."""
    return busbw(1.0, collective, n)


@dataclass(frozen=True)
class LinkFit:
    """t(bytes) = latency_s + bytes * wire_factor / bandwidth; `resid_s`: the residual
    standard deviation of one call; `se_*`: standard errors of the two coefficients."""

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

    @property
    def bandwidth(self) -> float | None:
        """Bus bandwidth in bytes/s (None: no bytes-dependent part was seen)."""
        return 1.0 / self.seconds_per_wire_byte if self.seconds_per_wire_byte > 0 else None

    def seconds(self, nbytes: float, group_size: int | None = None, *, latency_scale=1.0,
                latency_add=0.0, latency_set=None, bandwidth_scale=1.0, bandwidth_set=None,
                bound: int = 0) -> float:
        """Time of one call of `nbytes` (algorithm bytes) on `group_size` ranks; `bound`
        -1 / +1: the low / high end (one standard error of both coefficients)."""
        n = group_size or self.group_size
        if n <= 1:
            return 0.0
        lat = self.latency_s + bound * self.se_latency_s
        spb = self.seconds_per_wire_byte + bound * self.se_seconds_per_wire_byte
        lat = latency_set if latency_set is not None else lat * latency_scale + latency_add
        spb = max(0.0, spb)
        if bandwidth_set is not None:
            spb = 1.0 / bandwidth_set
        elif bandwidth_scale != 1.0:
            spb = spb / bandwidth_scale
        return max(0.0, lat + nbytes * wire_factor(self.collective, n) * spb)


def _wls(xs, ys, ws):
    """Weighted least squares y = a + b x; (a, b, residual sd, se_a, se_b). Falls back to a
    line through the mean (b = 0) when the sizes do not spread, and to a line through the
    origin (a = 0) when the intercept comes out negative; to b = 0 when the slope does."""
    sw = sum(ws)
    mx = sum(w * x for x, w in zip(xs, ws)) / sw
    my = sum(w * y for y, w in zip(ys, ws)) / sw
    sxx = sum(w * (x - mx) ** 2 for x, w in zip(xs, ws))
    k = len(xs)
    if sxx <= (0.05 * mx) ** 2 * sw or k < 3:  # sizes within ~5 %: no slope to see
        a, b = my, 0.0
    else:
        b = sum(w * (x - mx) * (y - my) for x, y, w in zip(xs, ys, ws)) / sxx
        a = my - b * mx
        if b < 0:
            a, b = my, 0.0
        elif a < 0:
            b = sum(w * x * y for x, y, w in zip(xs, ys, ws)) / \
                max(sum(w * x * x for x, w in zip(xs, ws)), 1e-300)
            a = 0.0
    res = [y - (a + b * x) for x, y in zip(xs, ys)]
    dof = max(1, k - 2)
    resid = math.sqrt(sum(w * r * r for r, w in zip(res, ws)) / sw * k / dof) if k > 1 else 0.0
    se_b = resid / math.sqrt(sxx / (sw / k)) if sxx > 0 and b > 0 else 0.0
    se_a = resid / math.sqrt(k)
    return a, b, resid, se_a, se_b


def fit_links(snapshot: RunSnapshot, ranks=None) -> dict[tuple[str, int], LinkFit]:
    """One `LinkFit` per (collective, group size) from the per-unit totals of `ranks` (all
    ranks with per-unit detail by default). Link-attributable (docs/rules.md): a collective
    ends at about the same moment on every rank, so per unit, phase and collective the time
    per call is the smallest over the ranks (the rank that arrived last waited for the link
    only; the others also waited for it: peer wait, modelled apart)."""
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
    pts: dict[tuple[str, int], list[tuple[float, float, float]]] = {}
    for (_unit, _phase, coll), (n, nbytes, secs, calls) in sorted(best.items()):
        pts.setdefault((coll, n), []).append((nbytes, secs, calls))
    out = {}
    for (coll, n), p in sorted(pts.items()):
        f = wire_factor(coll, n) or 1.0
        xs = [b * f for b, _, _ in p]
        ys = [s for _, s, _ in p]
        ws = [c for _, _, c in p]
        a, b, resid, se_a, se_b = _wls(xs, ys, ws)
        out[(coll, n)] = LinkFit(coll, n, a, b, resid, se_a, se_b, len(p), sum(ws),
                                 min(x for x, _, _ in p), max(x for x, _, _ in p))
    return out
