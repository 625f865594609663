"""Sliding per-rank windows over a followed run directory, updated incrementally.

`RunFollower.snapshot()` refolds every rank's last K steps on each call; at 64 ranks × 128
units that is ~0.5 s of Python per refresh, too slow to refresh twice a second. Here each
new step is added to running totals and the step that leaves the window is subtracted, so a
refresh costs one step per rank that advanced, as a few numpy operations. Steps are kept in
a compact form (float arrays instead of hundreds of small objects per step), which keeps the
heap small enough that the garbage collector does not stall refreshes. Ranks that did not
advance keep their `RankWindow` object (front ends use identity to skip work). The totals are
refolded from scratch every `window` evictions, in the same order `window_from_steps` adds,
so float drift stays bounded; results equal `window_from_steps(facts, steps[-window:])` up to
rounding.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from ..runmodel import CommTotals, RankWindow
from ..windowsamples import MIN_WINDOW_SAMPLES, set_sample_steps
from .records import RankLog, StepRecord


class _Keys:
    """An ordered, growing set of keys with their positions in the running-total arrays."""

    def __init__(self):
        self.keys: list = []
        self.pos: dict = {}
        self._index: dict[tuple, np.ndarray] = {}  # a step's key tuple -> positions

    def index(self, keys: tuple) -> np.ndarray:
        idx = self._index.get(keys)
        if idx is None:
            for k in keys:
                if k not in self.pos:
                    self.pos[k] = len(self.keys)
                    self.keys.append(k)
            idx = self._index[keys] = np.fromiter((self.pos[k] for k in keys), np.intp,
                                                  len(keys))
        return idx


def _framework_key(k: tuple) -> tuple:
    """The key of a unit's framework time among the compute keys: (unit, phase, "framework")
    beside the compute's (unit, phase)."""
    return (*k, "framework")


def _split(keys, vals) -> tuple[dict, dict]:
    """(compute, framework per unit) from the compute arrays' keys and values."""
    compute, framework = {}, {}
    for k, v in zip(keys, vals):
        if len(k) == 2:
            compute[k] = compute.get(k, 0.0) + v
        else:
            framework[k[:2]] = framework.get(k[:2], 0.0) + v
    return compute, framework


class _Step:
    """One step record, compact: its key tuples (shared between steps) and float arrays
    (the framework's time per unit rides with the compute, keyed `_framework_key`)."""

    __slots__ = ("step", "end_unix", "scalars", "ckeys", "cvals", "mkeys", "mvals", "memory",
                 "errors", "detail", "detail_k", "exposed")

    def __init__(self, s: StepRecord, ckeys: tuple, mkeys: tuple):
        self.step = s.step
        self.end_unix = s.end_unix
        self.scalars = np.array((s.step_seconds, s.optimizer_seconds, s.framework_seconds,
                                 s.other_seconds, s.self_seconds, s.host_compute_seconds,
                                 s.launch_checks, s.launch_caught_up))
        self.ckeys = ckeys
        self.cvals = np.fromiter((*s.compute.values(), *s.unit_framework.values()),
                                 np.float64, len(ckeys))
        self.mkeys = mkeys
        m = []
        for t in s.comm.values():
            m += (t.count, t.bytes, t.seconds, t.exposed_seconds, t.hidden_seconds)
        self.mvals = np.array(m, np.float64).reshape(len(mkeys), 5)
        self.exposed = float(self.mvals[:, 3].sum())  # the step's exposed communication
        self.memory = s.memory or None
        self.errors = s.errors or None
        self.detail = s.detail  # a sampled step (an unsampled one has no keys)
        self.detail_k = s.detail_k


class _RankTotals:
    """Running totals as arrays; counts and bytes are exact in float64 below 2**53."""

    def __init__(self, window: int | None, skip_warmup: bool = False):
        self.window = window
        self.skip_warmup = skip_warmup
        self.warmup_dropped = False
        self.steps: deque[_Step] = deque()
        self.evictions = 0
        self.last_step: int | None = None  # newest step number taken from the log
        # the newest sampled steps (one more than needed: the warm-up step 1 among them is
        # left out of a window that does not hold it, `_usable`)
        self.samples: deque[_Step] = deque(maxlen=MIN_WINDOW_SAMPLES + 1)
        self.sampled = 0  # sampled steps inside the window
        self._interned: dict[tuple, tuple] = {}
        self._reset()

    def _reset(self) -> None:
        self.ck, self.mk = _Keys(), _Keys()
        self.csum = np.zeros(0)
        self.cn = np.zeros(0, np.intp)  # steps in the window that carry each key
        self.msum = np.zeros((0, 5))
        self.mn = np.zeros(0, np.intp)
        self.sums = np.zeros(8)  # step, optimizer, framework, other, self, host compute s;
        # launch checks, caught up

    def _intern(self, keys: tuple) -> tuple:
        return self._interned.setdefault(keys, keys)

    def _apply(self, s: _Step, sign: int) -> None:
        ci, mi = self.ck.index(s.ckeys), self.mk.index(s.mkeys)
        if len(self.ck.keys) > len(self.csum):
            grow = len(self.ck.keys) - len(self.csum)
            self.csum = np.concatenate((self.csum, np.zeros(grow)))
            self.cn = np.concatenate((self.cn, np.zeros(grow, np.intp)))
        if len(self.mk.keys) > len(self.msum):
            grow = len(self.mk.keys) - len(self.msum)
            self.msum = np.concatenate((self.msum, np.zeros((grow, 5))))
            self.mn = np.concatenate((self.mn, np.zeros(grow, np.intp)))
        # a step never repeats a key, so fancy-index += is a plain element-wise add
        self.sampled += sign * s.detail
        if sign > 0:
            self.sums += s.scalars
            self.csum[ci] += s.cvals
            self.msum[mi] += s.mvals
        else:
            self.sums -= s.scalars
            self.csum[ci] -= s.cvals
            self.msum[mi] -= s.mvals
        self.cn[ci] += sign
        self.mn[mi] += sign

    def _refold(self) -> None:
        self._reset()
        self.sampled = 0
        for s in self.steps:
            self._apply(s, +1)

    def add(self, new: list[StepRecord]) -> None:
        def compact(rec: StepRecord) -> _Step:
            ckeys = tuple(rec.compute)
            if rec.unit_framework:
                ckeys += tuple(_framework_key(k) for k in rec.unit_framework)
            return _Step(rec, self._intern(ckeys), self._intern(tuple(rec.comm)))

        self.samples.extend(compact(s) for s in new[-64 * MIN_WINDOW_SAMPLES:] if s.detail)
        if self.window and len(new) >= self.window:  # a long gap (first load): fold the tail
            self.steps = deque(compact(s) for s in new[-self.window:])
            self._refold()
            self._drop_warmup()
            return
        for rec in new:
            s = compact(rec)
            self.steps.append(s)
            self._apply(s, +1)
            if self.window and len(self.steps) > self.window:
                self._apply(self.steps.popleft(), -1)
                self.evictions += 1
        if self.window and self.evictions >= self.window:
            self.evictions = 0
            self._refold()
        self._drop_warmup()

    def _drop_warmup(self) -> None:
        """`skip_warmup`: step 1 leaves the window as soon as a later step is in it."""
        if self.skip_warmup and len(self.steps) >= 2 and self.steps[0].step == 1:
            self._apply(self.steps.popleft(), -1)
            self.warmup_dropped = True

    def to_window(self, log: RankLog) -> RankWindow:
        w = RankWindow(facts=log.facts)
        if not self.steps:
            return w
        first, last = self.steps[0], self.steps[-1]
        w.steps = len(self.steps)
        w.first_step, w.last_step = first.step, last.step
        (w.step_seconds, w.optimizer_seconds, w.framework_seconds, w.other_seconds,
         w.self_seconds, w.host_compute_seconds, checks, caught) = self.sums.tolist()
        w.launch_checks, w.launch_caught_up = int(round(checks)), int(round(caught))
        w.step_times = [float(s.scalars[0]) for s in self.steps]
        w.exposed_times = [s.exposed for s in self.steps if s.detail]
        w.last_step_seconds = w.step_times[-1]
        w.max_step_seconds = max(w.step_times)
        w.updated_unix = last.end_unix
        if self.warmup_dropped and first.step == 2 and \
                (self.window is None or len(self.steps) < self.window):
            w.warmup_left_out = 1
        cn = self.cn.tolist()
        keep = [(k, v) for k, v, n in zip(self.ck.keys, self.csum.tolist(), cn) if n > 0]
        w.compute, w.unit_framework = _split([k for k, _ in keep], [v for _, v in keep])
        mn = self.mn.tolist()
        w.comm = {k: CommTotals(int(r[0]), int(r[1]), r[2], r[3], r[4])
                  for k, r, n in zip(self.mk.keys, self.msum.tolist(), mn) if n > 0}
        w.detail_steps = self.sampled
        newest = self.samples[-1] if self.samples else None
        w.detail_last_step = newest.step if newest else 0
        # K in force: the newest step's that says it (every step since 2026-11-27), else
        # the newest sample's (older logs)
        w.detail_every = next((s.detail_k for s in reversed(self.steps) if s.detail_k),
                              newest.detail_k if newest else None)
        set_sample_steps(w, [s for s in self.steps if s.detail])
        if self.sampled < min(MIN_WINDOW_SAMPLES, w.steps) and \
                len(self._usable(w)) > self.sampled:
            self._from_samples(w)
        for s in reversed(self.steps):  # latest non-empty, as window_from_steps does
            if s.memory:
                w.memory = dict(s.memory)
                break
        for s in reversed(self.steps):
            if s.errors:
                w.errors = dict(s.errors)
                break
        return w


    def _usable(self, w: RankWindow) -> list[_Step]:
        """The newest MIN_WINDOW_SAMPLES samples a window may take: not the warm-up step 1
        when the window does not hold it (as `reader.per_unit_from_samples`)."""
        return [s for s in self.samples if not (self.skip_warmup and s.step == 1
                                                and w.first_step > 1)][-MIN_WINDOW_SAMPLES:]

    def _from_samples(self, w: RankWindow) -> None:
        """Per-unit totals of the newest MIN_WINDOW_SAMPLES sampled steps, those before the
        window too (a window with fewer samples of its own; `detail_before` says so)."""
        samples = self._usable(w)
        w.comm = {}
        w.compute, w.unit_framework = _split(
            [k for s in samples for k in s.ckeys],
            [v for s in samples for v in s.cvals.tolist()])
        for s in samples:
            for k, r in zip(s.mkeys, s.mvals.tolist()):
                w.comm.setdefault(k, CommTotals()).add(
                    CommTotals(int(r[0]), int(r[1]), r[2], r[3], r[4]))
        w.detail_steps = len(samples)
        w.detail_before = sum(1 for s in samples if s.step < w.first_step)
        w.exposed_times = [s.exposed for s in samples]  # the figures the mean is from
        set_sample_steps(w, samples)


def new_records(steps: list[StepRecord], last_step: int | None) -> list[StepRecord]:
    """The records after step `last_step` (all when None). By step number, not position,
    so a log whose old records were dropped from the front still reads right."""
    if last_step is None:
        return list(steps)
    i = len(steps)
    while i > 0 and steps[i - 1].step > last_step:
        i -= 1
    return steps[i:]


class SlidingWindows:
    """Per-rank `RankWindow`s over the last `window` steps (None: all) of each `RankLog`."""

    def __init__(self, window: int | None = 20, skip_warmup: bool = False):
        self.window = window
        self.skip_warmup = skip_warmup  # leave step 1 (warm-up) out once a later step exists
        self._totals: dict[int, _RankTotals] = {}
        self._windows: dict[int, RankWindow] = {}
        self._facts: dict[int, object] = {}

    def update(self, logs: dict[int, RankLog]) -> dict[int, RankWindow]:
        """Windows for every rank in `logs`; only ranks with new steps are rebuilt."""
        out: dict[int, RankWindow] = {}
        for rank, log in logs.items():
            t = self._totals.get(rank)
            if t is None or self._facts.get(rank) is not log.facts:
                # new rank, or its log restarted with a new header
                t = self._totals[rank] = _RankTotals(self.window, self.skip_warmup)
                self._facts[rank] = log.facts
                self._windows.pop(rank, None)
            new = new_records(log.steps, t.last_step)
            if new or rank not in self._windows:
                if new:
                    t.last_step = new[-1].step
                    t.add(new)
                self._windows[rank] = t.to_window(log)
            out[rank] = self._windows[rank]
        return out
