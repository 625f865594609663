"""Following a live run directory: each `poll()` reads only what was appended since the
last one (the first poll reads each log's tail, never a whole week-long file).

Each log is kept open between polls (a file object, up to half the process's open-file
limit; the others are opened at each poll that finds them grown) and is read only when its
size changed: a poll of a thousand ranks that did not advance costs a directory listing and
a stat per rank. A log whose path now names another file (moved away and written anew) is
read from its tail as a fresh read would, not taken for one truncated in place.

Two modes. With `detail` (small runs) the full per-unit records of new steps are read from
the `detail/` files, so windows are exact over the last steps. Without it (big runs: a
thousand ranks' per-step detail is too much to parse twice a second) only the step lines
and the per-unit interval lines are read; windows then take step-level numbers from the
last steps and per-unit numbers from the newest interval (see `log_window`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..runmodel import RunSnapshot
from .reader import (
    RunLogInvalid, RunLogUnreadable, _take, log_window, rank_log_names, read_rank_tail,
)
from .records import RankLog, RunLogError, StepRecord, StepTotals, step_from_dict
from .scan import MAX_LINE, forward_lines, kind_of
from .segments import one_job, pick_segment
from .writer import DETAIL_DIR, detail_names, open_read


class _Tail:
    """Where one rank's files were read up to."""

    def __init__(self, path: Path):
        self.path = path
        self.ident: tuple[int, int] | None = None  # (st_dev, st_ino) of the file read
        self.file = None  # the log kept open between polls (None: opened when grown)
        self.log: RankLog | None = None
        self.names: list[str] = []
        self.detail_pos: dict[int, tuple[int, int]] = {}  # slot -> (inode, read offset)
        self.problem: str | None = None  # why the log cannot be shown (RunLogUnreadable)
        self.truncated = False  # seen shrinking (truncated in place) while followed
        self.mark: tuple[int, bytes] | None = None  # the bytes just before the read offset


class RunFollower:
    """Follows a run directory. `logs` holds each rank's newest segment as far as read,
    bounded: the last `keep` step records and step lines (None: all read), and the newest
    per-unit lines (the newest `total` and the intervals after it)."""

    def __init__(self, run_dir: str | os.PathLike, keep: int | None = None, *,
                 detail: bool = True, window: int | None = 20):
        self.run_dir = Path(run_dir)
        self.keep = keep
        self.detail = detail
        self.window = window
        self.logs: dict[int, RankLog] = {}
        self._tails: dict[str, _Tail] = {}  # by file name
        self._held = 0  # logs kept open (at most `hold_max`)
        self.hold_max = _hold_max()
        self.jobs: dict | None = None  # one_job's account: logs of other jobs left out

    # -- reading -------------------------------------------------------------------------
    def poll(self) -> list[tuple[int, StepRecord | StepTotals]]:
        """New steps since the last poll as (rank, record): full records with `detail`,
        step totals without."""
        new: list[tuple[int, StepRecord | StepTotals]] = []
        names = rank_log_names(self.run_dir)
        if len(names) != len(self._tails) or any(n not in self._tails for n in names):
            self._release(set(self._tails) - set(names))  # gone: no fd held on them
        for name in names:
            t = self._tails.get(name)
            if t is None:
                t = self._tails[name] = _Tail(self.run_dir / name)
            try:
                new += self._poll_one(t)
                t.problem = None
            except RunLogInvalid:
                raise  # a header with wrong facts: waiting will not mend it
            except RunLogUnreadable as e:
                t.problem = str(e)  # said under "Run log" (annotate); tried again next poll
            except (OSError, RunLogError):
                continue  # not readable yet (no header): the next poll tries again
        logs, self.jobs = one_job([t.log for t in self._tails.values() if t.log is not None])
        current = {id(x) for x in pick_segment(logs)}
        self.logs = {t.log.facts.rank: t.log for t in self._tails.values()
                     if t.log is not None and id(t.log) in current}
        return [(r, s) for r, s in new if r in self.logs]

    def _poll_one(self, t: _Tail) -> list:
        st = os.stat(t.path)
        size = st.st_size
        if t.log is not None and t.ident != (st.st_dev, st.st_ino):
            self._close(t)  # another file at this path (moved away, written anew): read it
            t.log, t.mark = None, None  # from its tail, as a fresh read does
        if t.log is not None and size < t.log.read_to:
            self._cut(t)  # truncated in place: shorter than what was read
        if t.log is None:
            if size == 0:
                return []
            fresh = t.log is None
            t.ident = (st.st_dev, st.st_ino)
            t.log = read_rank_tail(t.path, self._tail_window(), detail=self.detail)
            t.names = [u.name for u in t.log.facts.units]
            t.detail_pos = {}
            if t.log.torn:
                t.log.bad_lines -= 1  # a line still being written: read it next time
            new = [(t.log.facts.rank, s) for s in
                   (t.log.steps if self.detail else t.log.totals)] if fresh else []
            if self.detail:
                self._poll_detail(t)  # positions after what the tail read took
            self._trim(t.log)
            self._remember(t)
            return new
        log = t.log
        out: list = []
        if size > log.read_to:
            f = self._open(t)
            try:
                if not self._same(t, f):  # truncated, and written again past that offset
                    self._cut(t)
                lines, upto, overlong = forward_lines(f, log.read_to, size)
            finally:
                if f is not t.file:
                    f.close()
            log.bad_lines += overlong
            if not lines:
                log.read_to = upto
            else:
                off = log.read_to
                for line in lines:
                    at = off
                    off += len(line) + 1
                    if not line.strip():
                        continue
                    if kind_of(line) == "header" and self._goes_on(log, line):
                        if self.detail:  # what the detail files hold under the old header
                            out += [(log.facts.rank, s) for s in self._poll_detail(t)]
                        log.header_at = at  # the writer's header again: the same segment
                        t.detail_pos = {}  # its detail files are tagged with this one
                        continue
                    if kind_of(line) == "header":  # the rank restarted: a new segment
                        t.log = read_rank_tail(t.path, self._tail_window(), detail=self.detail)
                        t.names = [u.name for u in t.log.facts.units]
                        t.detail_pos = {}
                        if self.detail:
                            self._poll_detail(t)
                        self._trim(t.log)
                        self._remember(t)
                        del at
                        return [(t.log.facts.rank, s) for s in
                                (t.log.steps if self.detail else t.log.totals)]
                    n = len(log.totals)
                    _take(log, line, t.names)
                    if not self.detail and len(log.totals) > n:
                        out.append((log.facts.rank, log.totals[-1]))
                log.read_to = upto
            if lines:  # the bytes that end the last line read, for `_same` next time
                tail = (lines[-1] + b"\n")[-self.MARK:]
                t.mark = (upto - len(tail), tail)
            elif overlong:
                t.mark = None
        if self.detail:
            out += [(log.facts.rank, s) for s in self._poll_detail(t)]
        self._trim(log)
        return out

    MARK = 64  # bytes before the read offset compared at each poll of a grown log

    def _open(self, t: _Tail):
        """The log as a file object: the one kept open (`_poll_one` closes it when the path
        names another file), else opened (and kept, within `hold_max`)."""
        if t.file is not None:
            return t.file
        f = open_read(t.path)
        if self._held < self.hold_max:
            t.file = f
            self._held += 1
        return f

    def _close(self, t: _Tail) -> None:
        if t.file is not None:
            t.file.close()
            t.file = None
            self._held -= 1

    def _release(self, names) -> None:
        """Close the logs of these names (gone from the directory)."""
        for n in names:
            self._close(self._tails[n])

    def close(self) -> None:
        """Close every log kept open."""
        self._release(list(self._tails))

    @staticmethod
    def _cut(t: _Tail) -> None:
        """The log was truncated in place (logrotate's copytruncate): never a stopped rank.
        The lines after the cut continue the segment read so far, from the start of the
        file (the writer's header again among them: `_goes_on`)."""
        t.truncated = t.log.truncated = True
        t.log.read_to = 0
        t.mark = None

    def _remember(self, t: _Tail) -> None:
        """Keep the bytes just before the read offset (`_same` compares them later)."""
        at = max(0, t.log.read_to - self.MARK)
        try:
            f = self._open(t)
            try:
                f.seek(at)
                t.mark = (at, f.read(t.log.read_to - at))
            finally:
                if f is not t.file:
                    f.close()
        except OSError:
            t.mark = None

    @staticmethod
    def _same(t: _Tail, f) -> bool:
        """The bytes before the read offset are those read there (False: the file was
        truncated and written again past that offset)."""
        if t.mark is None:
            return True
        at, was = t.mark
        f.seek(at)
        return f.read(len(was)) == was

    @staticmethod
    def _goes_on(log: RankLog, line: bytes) -> bool:
        """A header the writer wrote again in the segment being read (truncated in place,
        the run directory made again: its `reopened`), not a restart."""
        try:
            d = json.loads(line)
        except (ValueError, UnicodeDecodeError, RecursionError):
            return False
        return isinstance(d, dict) and isinstance(d.get("reopened"), dict) and \
            d.get("segment") == log.segment and d.get("rank") == log.facts.rank and \
            d.get("job_id") == log.facts.job_id

    def _tail_window(self) -> int | None:
        """Steps the first read of a log takes from its end: the window (None: every step
        through the newest `total` line, never the whole file)."""
        return None if self.window is None else max(self.window, 1)

    def _poll_detail(self, t: _Tail) -> list[StepRecord]:
        """New full records from the detail files of the current segment."""
        log = t.log
        last = log.steps[-1].step if log.steps else 0
        got: list[StepRecord] = []
        for slot, name in enumerate(detail_names(log.facts.rank)):
            p = self.run_dir / DETAIL_DIR / name
            try:
                st = os.stat(p)
                f = open_read(p)
            except OSError:
                continue
            with f:
                inode, pos = t.detail_pos.get(slot, (None, 0))
                if inode != st.st_ino or st.st_size < pos or pos == 0:
                    tag = f.readline(MAX_LINE)
                    try:
                        d = json.loads(tag)
                    except (ValueError, UnicodeDecodeError, RecursionError):
                        continue
                    if not isinstance(d, dict) or d.get("header_at") != log.header_at:
                        t.detail_pos[slot] = (st.st_ino, 0)
                        continue
                    pos = len(tag)
                lines, upto, overlong = forward_lines(f, pos, st.st_size)
            log.bad_lines += overlong
            t.detail_pos[slot] = (st.st_ino, upto)
            for line in lines:
                if not line.strip():
                    continue
                try:
                    s = step_from_dict(json.loads(line), t.names)
                except (ValueError, KeyError, TypeError, IndexError, RecursionError,
                        OverflowError):
                    log.bad_lines += 1
                    continue
                if s.step > last:
                    got.append(s)
        got.sort(key=lambda s: s.step)
        for s in got:
            if not log.steps or s.step > log.steps[-1].step:
                log.steps.append(s)
        return got

    def _trim(self, log: RankLog) -> None:
        if self.keep:
            if len(log.steps) > self.keep:
                del log.steps[:-self.keep]
            if len(log.totals) > self.keep:
                del log.totals[:-self.keep]
        totals = [i for i, b in enumerate(log.blocks) if b.kind == "total"]
        if totals and totals[-1] > 0:
            cut = max(0, min(totals[-1], len(log.blocks) - 8))
            del log.blocks[:cut]
        if len(log.blocks) > 64:
            del log.blocks[:-64]

    # -- windows -------------------------------------------------------------------------
    def snapshot(self, window: int | None = 20) -> RunSnapshot:
        snap = RunSnapshot(source=str(self.run_dir))
        for rank, log in sorted(self.logs.items()):
            snap.ranks[rank] = log_window(log, window, detail=self.detail)
        self.annotate(snap)
        return snap

    def annotate(self, snap: RunSnapshot, stale_after_s: float = float("inf")) -> None:
        """Clean closes, stale and missing ranks and the watchdog's stall records of the
        followed ranks, into `snap`."""
        import time

        from .reader import annotate

        problems = [t.problem for t in self._tails.values() if t.problem]
        for t in self._tails.values():  # seen shrinking: said even once a header is back
            if t.truncated and t.log is not None:
                t.log.truncated = True
        annotate(snap, list(self.logs.values()), stale_after_s, time.time(), problems,
                 self.jobs)


def _hold_max() -> int:
    """Logs a follower keeps open: half the process's soft open-file limit (the rest for
    everything else), 0 where it cannot be known."""
    try:
        import resource

        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return 0
    return max(0, soft // 2) if soft != resource.RLIM_INFINITY else 4096
