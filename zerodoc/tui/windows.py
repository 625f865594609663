"""Sliding per-rank windows over a followed run directory, updated incrementally.

`RunFollower.snapshot()` refolds every rank's last K steps on each call; at 64 ranks × 128
units that is ~0.5 s of Python per refresh on a laptop core, too slow to refresh twice a
second. Here each new step is added to running totals and the step that leaves the window is
subtracted, so a refresh costs one step per rank that advanced. Ranks that did not advance
keep their `RankWindow` object (front ends may use identity to skip work). The totals are
refolded exactly with `window_from_steps` every `window` evictions so float drift stays
bounded. Results equal `window_from_steps(facts, steps[-window:])` up to float rounding.
"""

from __future__ import annotations

from collections import deque

from ..model import CommTotals, RankWindow
from ..runlog import RankLog, StepRecord, window_from_steps


class _RankTotals:
    def __init__(self, window: int | None):
        self.window = window
        self.steps: deque[StepRecord] = deque()
        self.compute: dict[tuple[str, str], float] = {}
        self.comm: dict[tuple[str, str, str], CommTotals] = {}
        self.sums = [0.0] * 5  # step, optimizer, framework, other, self seconds
        self.evictions = 0
        self.seen = 0  # records taken from the log so far

    def _apply(self, s: StepRecord, sign: int) -> None:
        sums = self.sums
        sums[0] += sign * s.step_seconds
        sums[1] += sign * s.optimizer_seconds
        sums[2] += sign * s.framework_seconds
        sums[3] += sign * s.other_seconds
        sums[4] += sign * s.self_seconds
        compute = self.compute
        for k, v in s.compute.items():
            compute[k] = compute.get(k, 0.0) + sign * v
        comm = self.comm
        for k, t in s.comm.items():
            c = comm.get(k)
            if c is None:
                c = comm[k] = CommTotals()
            c.count += sign * t.count
            c.bytes += sign * t.bytes
            c.seconds += sign * t.seconds
            c.exposed_seconds += sign * t.exposed_seconds
            c.hidden_seconds += sign * t.hidden_seconds

    def _refold(self, log: RankLog) -> None:
        w = window_from_steps(log.facts, self.steps)
        self.compute = dict(w.compute)
        self.comm = {k: t.copy() for k, t in w.comm.items()}
        self.sums = [w.step_seconds, w.optimizer_seconds, w.framework_seconds,
                     w.other_seconds, w.self_seconds]

    def add(self, log: RankLog, new: list[StepRecord]) -> None:
        if self.window and len(new) >= self.window:
            # a long gap (first load): fold the tail exactly, no add/subtract
            self.steps = deque(new[-self.window:])
            self._refold(log)
            return
        for s in new:
            self.steps.append(s)
            self._apply(s, +1)
            if self.window and len(self.steps) > self.window:
                self._apply(self.steps.popleft(), -1)
                self.evictions += 1
        if self.window and self.evictions >= self.window:
            self.evictions = 0
            self._refold(log)

    def to_window(self, log: RankLog) -> RankWindow:
        w = RankWindow(facts=log.facts)
        if not self.steps:
            return w
        first, last = self.steps[0], self.steps[-1]
        w.steps = len(self.steps)
        w.first_step, w.last_step = first.step, last.step
        (w.step_seconds, w.optimizer_seconds, w.framework_seconds, w.other_seconds,
         w.self_seconds) = self.sums
        w.last_step_seconds = last.step_seconds
        w.step_times = [s.step_seconds for s in self.steps]
        w.max_step_seconds = max(w.step_times)
        w.updated_unix = last.end_unix
        w.compute = dict(self.compute)
        w.comm = {k: t.copy() for k, t in self.comm.items()}
        for s in reversed(self.steps):  # latest non-empty, as window_from_steps does
            if s.memory:
                w.memory = dict(s.memory)
                break
        for s in reversed(self.steps):
            if s.errors:
                w.errors = dict(s.errors)
                break
        return w


class SlidingWindows:
    """Per-rank `RankWindow`s over the last `window` steps of each `RankLog` in `logs`."""

    def __init__(self, window: int | None = 20):
        self.window = window
        self._totals: dict[int, _RankTotals] = {}
        self._windows: dict[int, RankWindow] = {}
        self._facts: dict[int, object] = {}

    def update(self, logs: dict[int, RankLog]) -> dict[int, RankWindow]:
        """Windows for every rank in `logs`; only ranks with new steps are rebuilt."""
        out: dict[int, RankWindow] = {}
        for rank, log in logs.items():
            t = self._totals.get(rank)
            if t is None or self._facts.get(rank) is not log.facts or t.seen > len(log.steps):
                # new rank, or its log restarted with a new header
                t = self._totals[rank] = _RankTotals(self.window)
                self._facts[rank] = log.facts
                self._windows.pop(rank, None)
            if t.seen < len(log.steps) or rank not in self._windows:
                new = log.steps[t.seen:]
                t.seen = len(log.steps)
                t.add(log, new)
                self._windows[rank] = t.to_window(log)
            out[rank] = self._windows[rank]
        return out
