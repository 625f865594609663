"""Per-step history for the sparklines, per rank, bounded.

From a run directory the per-step records are the history. Other sources (a scrape, a
Prometheus server) give only window totals, so the history is kept across refreshes here:
when a rank's last step advances, the point is the difference of two cumulative windows
divided by the steps between them, or the window's mean when the window slides.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from ..runmodel import RankWindow
from ..runlog import StepRecord


_NAN = float("nan")


@dataclass(frozen=True)
class Series:
    """One rank's recent steps, oldest first; seconds per step."""

    steps: tuple[int, ...] = ()
    step_seconds: tuple[float, ...] = ()
    exposed_seconds: tuple[float, ...] = ()
    compute_seconds: tuple[float, ...] = ()


@dataclass
class _Rank:
    points: OrderedDict = field(default_factory=OrderedDict)  # step -> (step, exposed, compute)
    last_step: int | None = None  # newest run log record consumed
    prev: RankWindow | None = None
    series: Series | None = None  # cached until a point is added


class History:
    def __init__(self, length: int = 120):
        self.length = length
        self._ranks: dict[int, _Rank] = {}

    def _rank(self, rank: int) -> _Rank:
        r = self._ranks.get(rank)
        if r is None:
            r = self._ranks[rank] = _Rank()
        return r

    def _put(self, r: _Rank, step: int, point: tuple[float, float, float]) -> None:
        r.points[step] = point
        r.points.move_to_end(step)
        while len(r.points) > self.length:
            r.points.popitem(last=False)
        r.series = None

    def add_records(self, rank: int, records: list[StepRecord]) -> None:
        """Take the records of a rank's run log newer than the last one taken."""
        self.add_points(rank, [(s.step, s.step_seconds, s.exposed_seconds, s.compute_seconds)
                               for s in records])

    def add_points(self, rank: int, points: list[tuple[int, float, float, float]]) -> None:
        """(step, step s, exposed s, compute s) per step, oldest first, newer than the last
        point taken (a step number going back means the rank restarted). Exposed and compute
        None (an unsampled step: not measured) are kept as NaN, shown as gaps."""
        r = self._rank(rank)
        if points and r.last_step is not None and points[-1][0] < r.last_step:
            r.points.clear()  # the log restarted
            r.last_step = None
        for step, step_s, exposed, compute in points[-self.length:]:
            if r.last_step is None or step > r.last_step:
                self._put(r, step, (step_s, _NAN if exposed is None else exposed,
                                    _NAN if compute is None else compute))
        if points:
            r.last_step = max(points[-1][0], r.last_step or 0)

    def add_window(self, rank: int, w: RankWindow) -> None:
        """Derive a point from a window when the rank advanced since the last one."""
        r = self._rank(rank)
        prev = r.prev
        if w.steps == 0 or (prev is not None and w.last_step <= prev.last_step
                            and w.steps <= prev.steps):
            return
        r.prev = w
        exposed, compute, steps = w.exposed_seconds, w.compute_seconds, w.steps
        step_s = w.step_seconds
        if prev is not None and prev.first_step == w.first_step and w.steps > prev.steps:
            # cumulative window: the difference covers exactly the new steps
            steps = w.steps - prev.steps
            exposed -= prev.exposed_seconds
            compute -= prev.compute_seconds
            step_s -= prev.step_seconds
        n = max(1, steps)
        if not w.unit_detail:  # no sampled step yet: exposed and compute not measured
            exposed = compute = _NAN
        if w.step_times and len(w.step_times) == w.steps and \
                w.last_step - w.first_step + 1 == w.steps:
            # per-step times are known: one point per new step (comm/compute spread evenly)
            start = w.last_step - min(steps, len(w.step_times)) + 1
            for step in range(start, w.last_step + 1):
                t = w.step_times[step - w.first_step]
                self._put(r, step, (t, exposed / n, compute / n))
            return
        # a sliding window: its mean, with the last step's own time where the source has it
        step_point = w.last_step_seconds if steps == w.steps and w.last_step_seconds else \
            step_s / n
        self._put(r, w.last_step, (step_point, exposed / n, compute / n))

    def series(self, rank: int) -> Series:
        r = self._ranks.get(rank)
        if r is None:
            return Series()
        if r.series is None:  # zip in C: a thousand ranks gain a point on every refresh
            step_s, exposed, compute = zip(*r.points.values()) if r.points else ((),) * 3
            r.series = Series(steps=tuple(r.points), step_seconds=step_s,
                              exposed_seconds=exposed, compute_seconds=compute)
        return r.series
