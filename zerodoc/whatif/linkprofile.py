"""A link profile: the measured shape of a collective's time against its size on one host
class (backend, group size, host), written by `zerodoc linkprobe` and read by `zerodoc whatif
--link-profile` (docs/whatif.md, "The link profile").

A run's own link fit (`linkfit`) is a line through the run's calls; a change that makes
larger calls (merged units) prices them by extending that line, which misses a link whose
cost per byte grows past some size (gloo on a CPU host: past the cache). The profile has
that shape, measured over a size sweep: beyond the run's largest call the model takes the
run's fit at its largest call plus the profile's increase from there (`ProfileLink`).

Sizes are algorithm bytes per call as the run log counts them: the all-gather's output, the
reduce-scatter's input, the all-reduce's tensor.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass

from ..errors import UserError
from .linkfit import LinkFit, wire_factor

KIND = "zerodoc-link-profile"
SCHEMA = 1
# the collectives a profile may hold (the run log's names) and the torch call that runs each
PROBED = ("all_gather", "reduce_scatter", "all_reduce")


@dataclass(frozen=True)
class Curve:
    """One collective's measured time per call against its algorithm bytes: sizes ascending,
    the median over the repetitions made non-decreasing (`monotone`), and its standard
    error."""

    collective: str
    group_size: int
    nbytes: tuple[float, ...]
    median_s: tuple[float, ...]
    se_s: tuple[float, ...]

    def _wire(self) -> list[float]:
        f = wire_factor(self.collective, self.group_size) or 1.0
        return [b * f for b in self.nbytes]

    def at_wire(self, x: float) -> tuple[float, float]:
        """(time, its standard error) at x wire bytes: piecewise linear between the measured
        sizes; beyond the largest (or below the smallest) along the nearest segment, its
        error growing with the distance in segments (no measurement says what is there)."""
        xs, ys, es = self._wire(), self.median_s, self.se_s
        if len(xs) == 1:
            return ys[0], es[0]
        i = 0
        while i < len(xs) - 2 and x > xs[i + 1]:
            i += 1
        x0, x1 = xs[i], xs[i + 1]
        w = (x - x0) / (x1 - x0)
        y = ys[i] + w * (ys[i + 1] - ys[i])
        if 0.0 <= w <= 1.0:
            return y, math.hypot((1 - w) * es[i], w * es[i + 1])
        # outside the sweep: the segment's ends' errors, scaled by how far out it reaches
        far = abs(w - 1.0) if w > 1 else abs(w)
        return y, math.hypot(es[i], es[i + 1]) * (1 + far)

    def tail_slope(self, k: int = 3) -> tuple[float, float]:
        """(seconds per wire byte, its standard error) over the sweep's last `k` sizes, by
        least squares: the slope beyond the sweep. Not the last segment's alone: the medians
        made non-decreasing can pool a noisy last size into a flat segment, which would price
        every larger call at nothing more (review rev4 M3)."""
        xs, ys, es = self._wire()[-k:], self.median_s[-k:], self.se_s[-k:]
        if len(xs) < 2:
            return 0.0, 0.0
        xb, yb = sum(xs) / len(xs), sum(ys) / len(ys)
        sxx = sum((x - xb) ** 2 for x in xs)
        if sxx <= 0:
            return 0.0, 0.0
        b = sum((x - xb) * (y - yb) for x, y in zip(xs, ys)) / sxx
        se = math.sqrt(sum(((x - xb) * e) ** 2 for x, e in zip(xs, es))) / sxx
        return max(0.0, b), se

    @property
    def max_wire(self) -> float:
        return self._wire()[-1]


@dataclass(frozen=True)
class LinkProfile:
    path: str
    backend: str
    group_size: int
    host: str
    curves: dict[str, Curve]


def monotone(ys: list[float], es: list[float] | None = None):
    """The non-decreasing sequence nearest to `ys` in least squares (pool adjacent
    violators): a larger call does not take less time, and a median that says so is the
    sweep's noise, which would otherwise give a negative increase beyond some size.
    With `es` (the medians' standard errors): (values, their standard errors), a pooled
    value being the mean of k medians, its error that of their mean (sqrt(sum of their
    errors squared) / k) and never below the size's own (the pooling is the sweep's noise
    showing: it does not make a noisy size more certain)."""
    blocks: list[list[float]] = []  # [sum, count, sum of squared errors]
    for i, y in enumerate(ys):
        blocks.append([y, 1, (es[i] ** 2) if es is not None else 0.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            s, c, v = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += c
            blocks[-1][2] += v
    vals = [s / c for s, c, _v in blocks for _ in range(int(c))]
    if es is None:
        return vals
    pooled = [math.sqrt(v) / c for _s, c, v in blocks for _ in range(int(c))]
    return vals, [max(e, p) for e, p in zip(es, pooled)]


def _bad(path: str, why: str) -> UserError:
    return UserError(f"--link-profile {path}: {why}")


# plausible bounds (a profile is a small measured table): bytes per call up to 10 TB, times
# and their errors up to an hour
LIMITS = {"bytes": 1e13, "median_s": 3600.0, "se_s": 3600.0}
MAX_FILE_BYTES = 16 << 20


def _positive(v, path: str, what: str) -> float:
    try:
        ok = not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v) \
            and 0 <= v <= LIMITS.get(what.rsplit(" ", 1)[-1], math.inf)
    except OverflowError:  # an integer too large for a float
        ok = False
    if not ok:
        bound = LIMITS.get(what.rsplit(" ", 1)[-1])
        raise _bad(path, f"{what} must be a finite number >= 0"
                   + (f" and <= {bound:g}" if bound else "") + f", not {str(v)[:40]}")
    return float(v)


def profile_from_dict(doc, path: str = "profile") -> LinkProfile:
    """A `LinkProfile` from its JSON document (UserError, one line, on anything wrong)."""
    if not isinstance(doc, dict) or doc.get("kind") != KIND:
        raise _bad(path, f"not a link profile (no \"kind\": \"{KIND}\"; write one with "
                         "zerodoc linkprobe)")
    if isinstance(doc.get("schema"), bool) or doc.get("schema") != SCHEMA:
        raise _bad(path, f"schema {doc.get('schema')!r} is not {SCHEMA}")
    n = doc.get("group_size")
    if isinstance(n, bool) or not isinstance(n, int) or not 2 <= n <= 1 << 24:
        raise _bad(path, f"group_size must be an integer from 2 to {1 << 24}, not {str(n)[:40]}")
    colls = doc.get("collectives")
    if not isinstance(colls, dict) or not colls:
        raise _bad(path, "no collectives measured")
    curves = {}
    for name, rows in colls.items():
        if name not in PROBED:
            raise _bad(path, f"unknown collective {name!r} (known: {', '.join(PROBED)})")
        if not isinstance(rows, list) or len(rows) < 2:
            raise _bad(path, f"{name}: needs 2 or more sizes")
        pts = []
        for row in rows:
            if not isinstance(row, dict):
                raise _bad(path, f"{name}: a size is not an object: {row!r}")
            b = _positive(row.get("bytes"), path, f"{name} bytes")
            pts.append((b, _positive(row.get("median_s"), path, f"{name} median_s"),
                        _positive(row.get("se_s", 0.0), path, f"{name} se_s")))
        pts.sort()
        if any(b1 <= b0 for (b0, _, _), (b1, _, _) in zip(pts, pts[1:])) or pts[0][0] <= 0:
            raise _bad(path, f"{name}: sizes must be > 0 and distinct")
        med, se = monotone([p[1] for p in pts], [p[2] for p in pts])
        curves[name] = Curve(name, n, tuple(p[0] for p in pts), tuple(med), tuple(se))
    return LinkProfile(path, str(doc.get("backend", "?")), n, str(doc.get("host", "?")),
                       curves)


def load_profile(path: str) -> LinkProfile:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read(MAX_FILE_BYTES + 1)
        if len(text) > MAX_FILE_BYTES:
            raise _bad(path, f"over {MAX_FILE_BYTES >> 20} MB: not a link profile")
        doc = json.loads(text)
    except FileNotFoundError:
        raise _bad(path, "no such file") from None
    except IsADirectoryError:
        raise _bad(path, "is a directory, not a file") from None
    except OSError as e:
        raise _bad(path, f"cannot read: {e.strerror or e}") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise _bad(path, f"not JSON ({str(e).splitlines()[0][:80]})") from None
    except RecursionError:
        raise _bad(path, "not JSON (nested too deeply)") from None
    return profile_from_dict(doc, path)


@dataclass(frozen=True)
class ProfileLink:
    """A run's link fit, with a profile's shape beyond the run's largest call.

    Within the run's sizes: the fit, untouched (the replay of the run does not move). Beyond
    its largest call x_max (wire bytes): t(x) = fit(x_max) + s (P(x) - P(x_max)), P the
    profile's curve, s its scale to the run's link. s is 1 (the profile measured on the
    run's host class) unless the run's own calls reject that: the ratio r of the fit's slope
    to the profile's over the run's sizes, with its standard error (both slopes' errors);
    where r is more than Z standard errors from 1 the run's link differs from the profile's
    host class and s = r.
    The range: the fit's own error at x_max, the profile's errors at both sizes, and s from
    min(1, r - Z se) to max(1, r + Z se) (the run's calls cannot tell those apart)."""

    fit: LinkFit
    curve: Curve
    z: float = 2.0

    @property
    def x_max(self) -> float:
        return self.fit.max_bytes * (wire_factor(self.fit.collective, self.fit.group_size)
                                     or 1.0)

    @property
    def x_min(self) -> float:
        return self.fit.min_bytes * (wire_factor(self.fit.collective, self.fit.group_size)
                                     or 1.0)

    @functools.cached_property
    def scale(self) -> tuple[float, float, float]:
        """(s, low, high), computed once per ProfileLink: the profile's scale to the run's
        link and its range. The profile's slope over the run's sizes p (its secant) and its
        error come from its medians at the run's smallest and largest call; where p is not
        resolved (within Z errors of 0: a flat stretch of the sweep), the ratio would divide
        by noise and s stays 1."""
        x0, x1 = self.x_min, self.x_max
        if x1 <= x0:  # one size in the run: nothing to compare
            return 1.0, 1.0, 1.0
        (y0, e0), (y1, e1) = self.curve.at_wire(x0), self.curve.at_wire(x1)
        p, se_p = (y1 - y0) / (x1 - x0), math.hypot(e0, e1) / (x1 - x0)
        resolved = p > 0 and p > self.z * se_p
        if not resolved:
            if se_p <= 0:  # flat and exact: nothing to scale
                return 1.0, 1.0, 1.0
            # not resolved: s stays 1, and the range is the resolved one's at the edge of
            # resolution (p = Z se_p), so that a noisier profile never gives a narrower
            # range (review rev4 S4: it collapsed to [1, 1])
            p = self.z * se_p
        r = self.fit.seconds_per_wire_byte / p
        se = math.hypot(self.fit.se_seconds_per_wire_byte / p, r * se_p / p)
        s = 1.0 if not resolved or abs(r - 1.0) <= self.z * se else r
        return s, max(0.0, min(1.0, s, r - self.z * se)), max(1.0, s, r + self.z * se)

    def beyond(self, x: float) -> bool:
        return x > self.x_max * (1 + 1e-9)

    def beyond_bytes(self, nbytes: float) -> bool:
        """A call of `nbytes` (bytes per call) is larger than the run's largest."""
        return nbytes > self.fit.max_bytes * (1 + 1e-9)

    def at(self, x: float) -> tuple[float, float]:
        """The profile at x wire bytes (time, standard error); beyond its sweep along its
        last sizes' slope (`Curve.tail_slope`), never flatter than the run's own line (in
        the run's terms: the line's slope over the scale), its error growing with the
        distance by the slope's."""
        c = self.curve
        xm = c.max_wire
        if x <= xm:
            return c.at_wire(x)
        ym, em = c.at_wire(xm)
        b, se_b = c.tail_slope()
        s = self.scale[0]
        if s > 0:
            b = max(b, self.fit.seconds_per_wire_byte / s)
        return ym + b * (x - xm), math.hypot(em, se_b * (x - xm))

    def increment(self, x: float, bound: float = 0) -> float:
        """The profile's part beyond x_max (seconds), its low / high end at bound -Z / +Z."""
        y1, e1 = self.at(x)
        y0, e0 = self.at(self.x_max)
        d = y1 - y0
        s, lo, hi = self.scale
        if not bound:
            return max(0.0, s * d)
        e = math.hypot(e0, e1) * abs(bound)
        if bound < 0:
            return max(0.0, lo * (d - e))
        return max(0.0, hi * (d + e))
