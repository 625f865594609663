"""The run-directory source: a run's logs, live or finished, followed incrementally.

Reads only what a window needs: each rank's tail on the first snapshot (never a whole
week-long log), then what was appended. Small runs (up to `DETAIL_MAX_RANKS` ranks) are
read with full per-step detail, so windows are exactly the last N steps; bigger runs from
the step lines and the per-unit interval lines (`zerodoc.runlog.follow`): step-level
numbers over the last N steps, per-unit numbers over the newest interval(s)
(`RankWindow.detail_steps` says how many steps those cover).
"""

from __future__ import annotations

from pathlib import Path

from ..errors import UserError
from ..runmodel import LazyRankWindow, RankWindow, RunSnapshot
from ..runlog import (
    DETAIL_DIR, RunFollower, RunLogError, load_run, log_window, rank_logs, read_rank_tail,
)
from ..runlog.reader import _latest, exposed_times, newest_k, rank_log_names, unit_part
from ..thresholds import DEFAULT

STALE_AFTER_S = DEFAULT.stale_after_seconds
DETAIL_MAX_RANKS = 64


class _Running:
    """Running sums of one rank's last `window` step lines (refolded every `window`
    evictions, so float drift stays bounded)."""

    def __init__(self, facts, window: int, skip_warmup: bool = False):
        from collections import deque

        self.facts, self.window = facts, window
        self.skip_warmup = skip_warmup  # step 1 leaves once a later step is in
        self.warmup_dropped = False
        self.steps: deque = deque()
        self.sums = [0.0] * 11
        self.last = 0
        self.evictions = 0

    @staticmethod
    def _vals(t) -> tuple:
        measured = t.compute_seconds is not None  # not on an unsampled step
        return (t.step_seconds, t.optimizer_seconds, t.framework_seconds, t.other_seconds,
                t.self_seconds, t.compute_seconds or 0.0, t.exposed_seconds or 0.0,
                t.host_compute_seconds, t.launch_checks, t.launch_caught_up, float(measured))

    def add(self, totals) -> None:
        new = [t for t in totals[-self.window:] if t.step > self.last]
        for t in new:
            self.steps.append(t)
            for i, v in enumerate(self._vals(t)):
                self.sums[i] += v
            if len(self.steps) > self.window:
                for i, v in enumerate(self._vals(self.steps.popleft())):
                    self.sums[i] -= v
                self.evictions += 1
        if new:
            self.last = new[-1].step
        if self.skip_warmup and len(self.steps) >= 2 and self.steps[0].step == 1:
            for i, v in enumerate(self._vals(self.steps.popleft())):
                self.sums[i] -= v
            self.warmup_dropped = True
        if self.evictions >= self.window:
            self.evictions = 0
            self.sums = [sum(col) for col in zip(*map(self._vals, self.steps))] or [0.0] * 11

    def fill(self, w: RankWindow) -> None:
        if not self.steps:
            return
        s = self.sums
        w.steps = len(self.steps)
        w.first_step, w.last_step = self.steps[0].step, self.steps[-1].step
        (w.step_seconds, w.optimizer_seconds, w.framework_seconds, w.other_seconds,
         w.self_seconds, w.compute_total, w.exposed_total, w.host_compute_seconds) = s[:8]
        w.launch_checks, w.launch_caught_up = int(s[8]), int(s[9])
        measured = int(round(s[10]))  # compute / exposed: sampled steps, scaled to all
        w.window_samples = measured
        if measured != w.steps:
            scale = w.steps / measured if measured else None
            w.compute_total = w.compute_total * scale if scale else None
            w.exposed_total = w.exposed_total * scale if scale else None
        w.step_times = [t.step_seconds for t in self.steps]
        w.exposed_times = exposed_times(self.steps)
        w.last_step_seconds = w.step_times[-1]
        w.max_step_seconds = max(w.step_times)
        w.updated_unix = self.steps[-1].end_unix
        if self.warmup_dropped and w.first_step == 2:
            w.warmup_left_out = 1


class RunDirSource:
    """A run directory (live or finished). `segment`: an older segment of a reused run
    directory (a number, or -2 for the one before the newest); None: the newest.
    `detail`: read full per-step detail (None: when the run has at most DETAIL_MAX_RANKS
    ranks and keeps detail files; decided again on each snapshot until it has, so a front
    end opened before the job wrote anything reads the detail as soon as it appears).
    `wait`: a run directory that does not exist yet is waited for (each snapshot says so
    until it appears) instead of refused."""

    def __init__(self, run_dir: str | Path, window: int | None = 20, *,
                 stale_after_s: float = STALE_AFTER_S, segment: int | None = None,
                 detail: bool | None = None, skip_warmup: bool = False, wait: bool = False):
        self.run_dir = Path(run_dir)
        if not wait and not self.run_dir.is_dir():
            raise UserError(f"no run directory at {self.run_dir}")
        self.window = window
        self.skip_warmup = skip_warmup  # a short run's window leaves step 1 out (log_window)
        self.stale_after_s = stale_after_s
        self.segment = segment
        self._auto_detail = detail is None
        self.description = f"run log {self.run_dir}" + \
            (f" (segment {segment})" if segment is not None else "")
        self._fixed: RunSnapshot | None = None
        self._follow(bool(detail) if detail is not None else self._has_detail())
        # per-step points (step, step s, exposed s, compute s) since the last snapshot, for
        # a front end's history (the TUI's sparklines)
        self.points: dict[int, list[tuple[int, float, float | None, float | None]]] = {}

    def _has_detail(self) -> bool:
        """Small runs that keep their detail files: read them."""
        return self.run_dir.is_dir() and \
            len(rank_log_names(self.run_dir)) <= DETAIL_MAX_RANKS and \
            any((self.run_dir / DETAIL_DIR).glob("*.jsonl"))

    def _follow(self, detail: bool) -> None:
        """(Re)start following, with or without the full per-step detail."""
        self.detail = detail
        old = getattr(self, "follower", None)
        if old is not None:
            old.close()  # the logs it kept open
        # Bounded memory on long runs: a few windows of step records per rank.
        window = self.window
        self.follower = RunFollower(self.run_dir, keep=4 * window if window else 1024,
                                    detail=detail, window=window)
        self._windows: dict[int, tuple[tuple, RankWindow]] = {}
        self._units: dict[int, tuple] = {}
        self._runs: dict[int, _Running] = {}
        self._sliding = None
    def snapshot(self) -> RunSnapshot:
        if self.segment is not None:  # an older segment does not change: read it once
            if self._fixed is None:
                self._fixed = load_run(self.run_dir, self.window, float("inf"),
                                       segment=self.segment, skip_warmup=self.skip_warmup)
            return self._fixed
        if not self.run_dir.is_dir():
            raise RunLogError(f"waiting for {self.run_dir} (no run directory yet)")
        if self._auto_detail and not self.detail and self._has_detail():
            self._follow(True)  # the job has written its first detail: read it from now on
        new = self.follower.poll()
        logs = self.follower.logs
        if not logs:
            self._explain_empty()
        for rank, s in new:
            self.points.setdefault(rank, []).append(
                (s.step, s.step_seconds, s.exposed_seconds, s.compute_seconds))
        snap = RunSnapshot(source=str(self.run_dir))
        if self.detail and self.window:
            from ..runlog.sliding import SlidingWindows

            if self._sliding is None:
                self._sliding = SlidingWindows(self.window, self.skip_warmup)
            snap.ranks = self._sliding.update(logs)
            for log in logs.values():  # the windows keep their own compact copy
                if len(log.steps) > 1:
                    del log.steps[:-1]
        else:
            snap.ranks = {r: self._window(r, log) for r, log in sorted(logs.items())}
        self.follower.annotate(snap, self.stale_after_s)  # ended / stale / missing, stalls
        return snap

    def close(self) -> None:
        """Close the run logs the follower keeps open (the TUI calls it when it quits)."""
        self.follower.close()

    def take_points(self) -> dict[int, list[tuple[int, float, float, float]]]:
        pts, self.points = self.points, {}
        return pts

    def _window(self, rank: int, log) -> RankWindow:
        """The rank's window, rebuilt only when its log changed: step-level numbers as
        running sums over the last `window` step lines, per-unit totals (arrays) kept until
        a new interval line arrives."""
        ver = (log.last_step, len(log.totals), len(log.blocks), log.ended,
               id(log.blocks[-1]) if log.blocks else None, len(log.steps))
        hit = self._windows.get(rank)
        if hit is not None and hit[0] == ver:
            return hit[1]
        if self.detail or self.window is None:
            w = log_window(log, self.window, detail=self.detail,
                           skip_warmup=self.skip_warmup)
        else:
            ukey = (len(log.blocks), id(log.blocks[-1]) if log.blocks else None)
            u = self._units.get(rank)
            if u is None or u[0] != ukey:
                u = self._units[rank] = (ukey, *unit_part(log, self.window, self.skip_warmup))
            run = self._runs.get(rank)
            if run is None or run.facts is not log.facts:
                run = self._runs[rank] = _Running(log.facts, self.window, self.skip_warmup)
            run.add(log.totals)
            w = LazyRankWindow(facts=log.facts, unit_arrays=u[1])
            run.fill(w)
            w.detail_steps = u[2] if u[1] is not None else 0
            if u[3]:  # the per-unit numbers hold step 1: say so, not that it was left out
                w.warmup_kept, w.warmup_left_out = True, None
            w.memory = _latest(log, "memory")
            w.errors = _latest(log, "errors")
            w.detail_every = newest_k(log.totals)  # K in force (None: an older log's lines)
        self._windows[rank] = (ver, w)
        return w

    def _explain_empty(self) -> None:
        paths = rank_logs(self.run_dir)
        if not paths:
            raise RunLogError(f"{self.run_dir} holds no rank-*.jsonl run logs")
        for p in paths:
            # raises the precise reason (empty, not JSON, wrong schema), reading only the end
            read_rank_tail(p, 1, detail=False)
        raise RunLogError(f"{self.run_dir}: no readable run log header yet")
