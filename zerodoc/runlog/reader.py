"""Reading run logs: one segment in full, or only the tail a window needs (seek from the
end), and the windows (`RankWindow`) built from what was read."""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Iterable
from pathlib import Path

from ..runmodel import CommTotals, LazyRankWindow, RankFacts, RankWindow, RunSnapshot
from ..windowsamples import MIN_WINDOW_SAMPLES, set_sample_steps
from .records import (
    SCALARS, SUMMED_SCALARS, RankLog, RunLogError, StepRecord, StepTotals, UnitsBlock,
    block_from_dict, check_header, facts_from_dict, rank_log_name, step_from_dict,
    totals_from_dict, totals_of,
)
from .scan import MAX_LINE, OVERLONG, kind_of, reverse_lines, segment_heads
from .segments import one_job
from .writer import DETAIL_DIR, NotAFile, detail_names, open_read

DEFAULT_ROOT = "zerodoc-runs"
# RecursionError: JSON nested too deeply; OverflowError: an integer too big for a float
_BAD = (json.JSONDecodeError, KeyError, TypeError, ValueError, IndexError, AttributeError,
        UnicodeDecodeError, RecursionError, OverflowError)


class RunLogInvalid(RunLogError):
    """A complete header whose fields are wrong (world_size 1e9, "x", -5 ...): unlike a
    header not written yet, waiting will not mend it."""


class RunLogUnreadable(RunLogError):
    """A rank's log that cannot be shown, for a reason a reader states and goes on: not a
    regular file (a FIFO, a directory), or lines with no header (truncated in place). The
    other ranks are still read; the message goes under "Run log" (`log_notes`)."""

    def __init__(self, message: str, rank: int | None = None):
        super().__init__(message)
        self.rank = rank


COUNT_MAX = 256 << 20  # headerless lines are counted in at most this many bytes


def rank_logs(run_dir: str | os.PathLike) -> list[Path]:
    d = Path(run_dir)
    return [d / n for n in rank_log_names(d)]


def rank_log_names(run_dir: str | os.PathLike) -> list[str]:
    """The names of the rank logs (rank-*.jsonl) in `run_dir`, sorted; [] when it cannot be
    listed. One scandir: a follower lists a thousand ranks' directory at every refresh
    (pathlib's glob and the sort of Path objects took ~6 ms per 256 ranks)."""
    try:
        with os.scandir(run_dir) as it:
            return sorted(e.name for e in it if e.name.startswith("rank-")
                          and e.name.endswith(".jsonl") and len(e.name) >= 11)
    except OSError:
        return []


def rank_of(path: Path) -> int | None:
    """The rank a log's name says (rank-00003.jsonl: 3), or None."""
    try:
        return int(Path(path).name[5:-6])
    except ValueError:
        return None


def _open(path: Path):
    """The log opened for reading: non-blocking (a FIFO in its place would wait for a writer
    for good) and a regular file only (RunLogUnreadable naming what is there)."""
    try:
        return open_read(path)
    except NotAFile as e:
        raise RunLogUnreadable(f"{e.strerror}: rank {rank_of(path)} has no run log there",
                               rank_of(path)) from None
    except OSError as e:
        raise RunLogError(f"cannot read run log {path}: {e.strerror or e}") from e


def _headerless(f, end: int) -> int:
    """Complete lines in [0, end) (lines with no header before them), counted in at most
    COUNT_MAX bytes."""
    f.seek(0)
    n, left = 0, min(end, COUNT_MAX)
    while left > 0:
        buf = f.read(min(CHUNK_COUNT, left))
        if not buf:
            break
        n += buf.count(b"\n")
        left -= len(buf)
    return n


CHUNK_COUNT = 1 << 20


def _segment(f, path: Path, segment: int | None) -> tuple[int, int, dict, int, int]:
    """(start, end, header, segment number, segment count) of the wanted segment."""
    size = os.fstat(f.fileno()).st_size
    if size == 0:
        raise RunLogError(f"{path}: empty run log (the rank wrote no header yet)")
    heads = segment_heads(f, size)
    if not heads:
        f.seek(0)
        first = f.readline(MAX_LINE)
        try:
            head = json.loads(first)
        except (ValueError, UnicodeDecodeError, RecursionError) as e:
            raise RunLogError(f"{path}: first line is not JSON ({e})") from None
        if isinstance(head, dict) and isinstance(head.get("type"), str) and \
                head["type"] != "header":  # a record with no header before it
            n = _headerless(f, size)
            raise RunLogUnreadable(
                f"{path.name}: {n:,}{'+' if size > COUNT_MAX else ''} line(s) with no header, "
                f"not read: the log was truncated in place (logrotate's copytruncate?) by a "
                f"writer that does not write its header again; rank {rank_of(path)} is not "
                "shown", rank_of(path))
        check_header(head, str(path))
        heads = [(0, head)]
    numbers = [int(h.get("segment", i)) for i, (_o, h) in enumerate(heads)]
    if segment is None:
        i = len(heads) - 1
    elif segment < 0 and -segment <= len(heads):
        i = len(heads) + segment
    elif segment in numbers:
        i = numbers.index(segment)
    else:
        raise RunLogError(f"{path}: no segment {segment} (segments: "
                          f"{', '.join(map(str, numbers))})")
    start, head = heads[i]
    end = heads[i + 1][0] if i + 1 < len(heads) else size
    check_header(head, f"{path} (segment {numbers[i]})")
    return start, end, head, numbers[i], len(heads)


def _new_log(path: Path, head: dict, number: int, count: int, start: int) -> RankLog:
    try:
        facts = facts_from_dict(head)
    except RunLogError as e:
        raise RunLogInvalid(f"{path}: {e}") from None
    return RankLog(facts=facts, segment=number, segments=count,
                   schema=int(head.get("schema", 1)), path=str(path), header_at=start)


def _reopened(f, path: Path, log: RankLog, head: dict) -> None:
    """A header the writer wrote again (docs/runlog.md, "When the log's place changes"):
    truncated in place (the lines before the file's oldest header have none: counted), or
    the run directory deleted / replaced."""
    why = head.get("reopened")
    why = why.get("why") if isinstance(why, dict) else None
    if why == "truncated in place":
        log.truncated = True
        heads_at = log.header_at
        f.seek(0)
        if heads_at > 0 and kind_of(f.readline(MAX_LINE).rstrip(b"\n")) != "header":
            log.headerless = _headerless(f, heads_at)
    elif isinstance(why, str):
        log.reopened = why[:40]


def _open_segment(f, path: Path, segment: int | None):
    """(start, end, an empty RankLog, unit names, offset after the header); `f` is left
    just after the header."""
    start, end, head, number, count = _segment(f, path, segment)
    log = _new_log(path, head, number, count, start)
    if "reopened" in head:
        _reopened(f, path, log, head)
    f.seek(start)
    body = start + len(f.readline(MAX_LINE))
    return start, end, log, [u.name for u in log.facts.units], body


def _take(log: RankLog, line: bytes, names: list[str], parse_steps: bool = True) -> None:
    """Fold one line of the segment (oldest first) into `log`."""
    try:
        rec = json.loads(line)
        kind = rec.get("type")
        if kind == "step":
            if not parse_steps:
                return
            if log.schema == 1:
                s = step_from_dict(rec, names)
                log.steps.append(s)
                log.totals.append(totals_of(s))
            else:
                log.totals.append(totals_from_dict(rec))
        elif kind in ("interval", "total"):
            log.blocks.append(block_from_dict(rec, names))
        elif kind == "end":
            log.ended = True
            log.interrupted = bool(rec.get("interrupted"))
            log.dropped = max(log.dropped, int(rec.get("dropped", 0)))
            _lost(log, rec.get("lost", 0), rec.get("lost_steps", 0), rec.get("write_error"))
        elif kind == "header":
            pass
        else:
            if kind == "dropped":
                log.dropped = max(log.dropped, int(rec.get("total", 0)))
            elif kind == "lost":
                _lost(log, rec.get("total", 0), rec.get("total_steps", 0), rec.get("error"))
            log.add_event(rec)
    except _BAD:
        log.bad_lines += 1


def _lost(log: RankLog, records, steps, why) -> None:
    """Cumulative counts of records the writer lost (a `lost` or `end` record)."""
    log.lost = max(log.lost, int(records or 0))
    log.lost_steps = max(log.lost_steps, int(steps or 0))
    if why:
        log.write_error = str(why)[:200]


def log_notes(logs) -> list[str]:
    """What the run logs say went wrong with themselves, one line each: records a failed
    write lost ("N steps not recorded: disk full at PATH") and lines a reader skipped."""
    out = []
    for log in sorted(logs, key=lambda x: x.facts.rank):
        name = os.path.basename(log.path) or f"rank {log.facts.rank}"
        if log.lost:
            what = (f"{log.lost_steps} step{'s' if log.lost_steps != 1 else ''} not recorded"
                    if log.lost_steps else f"{log.lost} record(s) not recorded")
            more = log.lost - log.lost_steps
            out.append(f"{what}: {log.write_error or 'write failed'} at {log.path}"
                       + (f" (and {more} other record(s))" if log.lost_steps and more else ""))
        if log.dropped:
            out.append(f"{log.dropped} record(s) dropped by the writer (its queue was full: "
                       f"a slow filesystem) in {name}")
        if log.bad_lines:
            out.append(f"{log.bad_lines} line{'s' if log.bad_lines != 1 else ''} skipped in "
                       f"{name} (torn or not valid)")
        if log.truncated:
            out.append(f"{name} was truncated in place (logrotate's copytruncate?): "
                       + (f"{log.headerless:,} line(s) before its header written again not "
                          "read; " if log.headerless else "")
                       + "the steps before the cut are in the rotated copy, not here")
        if log.reopened:
            out.append(f"{name}: the run log was {log.reopened} while the job ran; the writer "
                       "made it again (the records lost with it are counted above)")
    return out


def read_detail(run_dir: Path, rank: int, header_at: int, names: list[str],
                last: int | None = None) -> tuple[list[StepRecord], int]:
    """The full-detail steps of the segment whose header is at `header_at` (the newest
    segment only keeps them), oldest first; `last`: only the newest N, and further back
    until MIN_WINDOW_SAMPLES of them are sampled steps (a window with fewer samples takes
    the newest ones before it). (records, bad)."""
    out: dict[int, StepRecord] = {}
    bad = 0
    keep = last
    for name in detail_names(rank):
        p = run_dir / DETAIL_DIR / name
        try:
            f = open_read(p)
        except OSError:
            continue
        with f:
            tag = f.readline(MAX_LINE)
            try:
                t = json.loads(tag)
            except (ValueError, UnicodeDecodeError, RecursionError):
                continue
            if not isinstance(t, dict) or t.get("header_at") != header_at:
                continue
            start = len(tag)
            size = os.fstat(f.fileno()).st_size
            got = sampled = 0
            for _off, line in reverse_lines(f, size, start):
                try:
                    s = step_from_dict(json.loads(line), names)
                except _BAD:
                    bad += 1
                    continue
                out.setdefault(s.step, s)
                got += 1
                sampled += s.detail
                if last is not None and got >= last and sampled >= MIN_WINDOW_SAMPLES:
                    break
        if last is not None:
            keep = max(keep, got)
    steps = [out[k] for k in sorted(out)]
    if last:
        cut = max(0, len(steps) - last)
        while cut > 0 and sum(s.detail for s in steps[cut:]) < MIN_WINDOW_SAMPLES:
            cut -= 1
        steps = steps[cut:]
    return steps, bad


def read_rank_log(path: str | os.PathLike, segment: int | None = None, *,
                  detail: bool = True) -> RankLog:
    """One segment of one rank's log, every line of it (the newest segment by default;
    `segment` a number, or -2 for the one before the newest). Torn or malformed lines are
    skipped and counted. Reads the whole segment: use `read_rank_tail` for big logs."""
    path = Path(path)
    with _open(path) as f:
        start, end, log, names, body = _open_segment(f, path, segment)
        data = f.read(end - body)
    lines = data.split(b"\n")
    torn = lines.pop() if lines else b""
    for line in lines:
        if line.strip():
            _take(log, line, names)
    log.read_to = end - len(torn)
    if torn.strip():
        log.torn = True
        _take(log, torn, names)
    if detail and log.schema >= 2 and log.segment == log.segments - 1:
        log.steps, bad = read_detail(path.parent, log.facts.rank, start, names)
        log.bad_lines += bad
    return log


WARMUP_LOOKAHEAD = 8  # lines after a header searched for the warm-up step's interval line


def seen_total(picked: list[bytes]) -> bool:
    return bool(picked) and kind_of(picked[-1]) == "total"


def _warmup_line(f, body: int) -> bytes | None:
    """The warm-up step's own interval line (step 1 alone), among the first lines after the
    segment's header (step 1's line, then its interval line; a few events may come
    between): bounded, whatever the log's size. None: not there (an older log)."""
    f.seek(body)
    for _ in range(WARMUP_LOOKAHEAD):
        line = f.readline(MAX_LINE)
        if not line.endswith(b"\n"):
            return None
        kind = kind_of(line)
        if kind == "header" or kind == "total":
            return None
        if kind == "interval":
            try:
                d = json.loads(line)
            except _BAD:
                return None
            return line if d.get("first") == 1 and d.get("last") == 1 else None
    return None


def read_rank_tail(path: str | os.PathLike, window: int | None = 20,
                   segment: int | None = None, *, detail: bool = True) -> RankLog:
    """What a window of the last `window` steps (None: all) needs of one segment, read from
    the end: the newest `window` step lines, the per-unit lines back to where they cover
    the window (for all steps: back to the newest `total` line), and with `detail` the
    newest `window` steps in full. Time and memory do not grow with the log."""
    path = Path(path)
    with _open(path) as f:
        start, end, log, names, body = _open_segment(f, path, segment)
        number, count = log.segment, log.segments
        f.seek(end - 1)
        log.torn = end > body and f.read(1) != b"\n"
        if log.schema == 1:  # full per-step lines: the whole segment
            f.seek(body)
            data = f.read(end - body)
            lines = data.split(b"\n")
            log.read_to = end - len(lines[-1])
            for line in lines:
                if line.strip():
                    _take(log, line, names)
            if window:
                log.steps = log.steps[-window:]
                log.totals = log.totals[-window:]
            return log
        picked: list[bytes] = []  # newest first
        step_lines = covered = 0
        seen_block = False
        newest_total = None
        log.read_to = end
        for off, line in reverse_lines(f, end, body):
            if log.torn and line is OVERLONG and log.read_to == end:
                log.torn = False  # no record is that long: not one being written, skipped
            elif log.torn and off + len(line) == end:
                log.read_to = off
            kind = kind_of(line)
            if kind == "step":
                if (window is None and not seen_block) or \
                        (window is not None and step_lines < window):
                    picked.append(line)
                step_lines += 1
            elif kind == "interval":
                picked.append(line)
                seen_block = True
                try:
                    covered += int(json.loads(line).get("steps", 0))
                except _BAD:
                    pass
            elif kind == "total":
                if window is None:
                    picked.append(line)
                    break
                newest_total = newest_total or line  # used only if no interval covers
            else:
                picked.append(line)
            if window is not None and step_lines >= window and covered >= window:
                break
        warm = _warmup_line(f, body) if window is None and seen_total(picked) else None
    if window is not None and covered < window and newest_total is not None:
        picked.append(newest_total)  # the segment's totals: better than no per-unit numbers
    if warm is not None:
        picked.append(warm)  # oldest: log_window can take step 1 off the totals
    for line in reversed(picked):
        _take(log, line, names)
    if detail and number == count - 1:
        log.steps, bad = read_detail(path.parent, log.facts.rank, start, names, last=window)
        log.bad_lines += bad
    return log


# --------------------------------------------------------------------------------------
# windows


def window_from_steps(facts: RankFacts, steps: Iterable[StepRecord],
                      errors: dict[str, int] | None = None) -> RankWindow:
    """Fold step records into one RankWindow (totals over those steps; per-unit totals over
    the sampled ones among them, `detail_steps`)."""
    w = RankWindow(facts=facts, detail_steps=0)
    for s in steps:
        if w.steps == 0:
            w.first_step = s.step
        w.steps += 1
        w.last_step = s.step
        _add_scalars(w, s)
        w.last_step_seconds = s.step_seconds
        w.max_step_seconds = max(w.max_step_seconds, s.step_seconds)
        w.updated_unix = s.end_unix
        w.step_times.append(s.step_seconds)
        if s.detail:
            _add_detail(w, s)
            w.exposed_times.append(s.exposed_seconds)
        if s.detail_k:  # K in force: the newest step's (every step carries it since 11-27)
            w.detail_every = s.detail_k
        if s.memory:
            w.memory = dict(s.memory)
        if s.errors:
            w.errors = dict(s.errors)
    if errors:
        w.errors = dict(errors)
    return w


def _add_detail(w: RankWindow, s: StepRecord) -> None:
    """Add one sampled step's per-unit rows to `w`."""
    w.detail_steps = (w.detail_steps or 0) + 1
    w.detail_last_step = max(w.detail_last_step, s.step)
    w.detail_every = s.detail_k or w.detail_every
    for k, v in s.compute.items():
        w.compute[k] = w.compute.get(k, 0.0) + v
    for k, t in s.comm.items():
        w.comm.setdefault(k, CommTotals()).add(t)
    _add_framework(w, s.unit_framework)


def _add_framework(w: RankWindow, fw: dict) -> None:
    """Add per-unit framework seconds (a step's or a block's) to `w`."""
    wf = w.unit_framework
    for k, v in fw.items():
        wf[k] = wf.get(k, 0.0) + v


def per_unit_from_samples(w: RankWindow, steps: list[StepRecord],
                          least: int = MIN_WINDOW_SAMPLES, skip_warmup: bool = True) -> RankWindow:
    """A window with unsampled steps and fewer than `least` sampled ones takes its per-unit
    totals from the newest `least` sampled steps of `steps` (the records before it too);
    `detail_before` says how many of them lie before the window. (A window whose every step
    is sampled keeps its own, however short.) With `skip_warmup` the warm-up step 1 is never
    one of them when the window does not hold it: always sampled, its compile and first
    all-gathers would stand for the run (issue 31: three "newest samples" 1, 2 and 30 hid a
    straggler that --window 0 showed). `sample_steps` (windowsamples.sample_steps) names
    the steps the per-unit numbers come from and when each ended."""
    if w.steps == 0:
        return w
    own = [s for s in steps if s.detail and w.first_step <= s.step <= w.last_step]
    if w.per_unit_steps >= least or w.per_unit_steps == w.steps:
        set_sample_steps(w, own)
        return w
    samples = [s for s in steps if s.detail and s.step <= w.last_step
               and not (skip_warmup and s.step == 1 and w.first_step > 1)][-least:]
    before = sum(1 for s in samples if s.step < w.first_step)
    if not before:
        set_sample_steps(w, own)
        return w
    k = w.detail_every
    w.compute, w.comm, w.unit_framework = {}, {}, {}
    w.detail_steps, w.detail_last_step = 0, 0
    for s in samples:
        _add_detail(w, s)
    w.exposed_times = [s.exposed_seconds for s in samples]  # the figures the mean is from
    w.detail_every = k or w.detail_every  # the newest step's K, not the oldest sample's
    w.detail_before = before
    set_sample_steps(w, samples)
    return w


def _add_scalars(w: RankWindow, src) -> None:
    """w.<f> += src.<f> for every step-level number that adds up over steps."""
    for f in SUMMED_SCALARS:
        setattr(w, f, getattr(w, f) + getattr(src, f))


def _scalars_from_totals(w: RankWindow, totals: list[StepTotals]) -> None:
    """Step-level numbers of `w` from step lines (replacing what was there)."""
    w.steps = len(totals)
    w.first_step, w.last_step = totals[0].step, totals[-1].step
    for f in SUMMED_SCALARS:
        setattr(w, f, sum(getattr(t, f) for t in totals))
    w.window_samples = sum(1 for t in totals if t.detail)
    w.compute_total = _measured_total(totals, "compute_seconds")
    w.exposed_total = _measured_total(totals, "exposed_seconds")
    w.step_times = [t.step_seconds for t in totals]
    w.exposed_times = exposed_times(totals)
    w.last_step_seconds = totals[-1].step_seconds
    w.max_step_seconds = max(w.step_times)
    w.updated_unix = totals[-1].end_unix


def exposed_times(totals: list[StepTotals]) -> list[float]:
    """The exposed communication of each step line that measured it (a sampled step)."""
    return [t.exposed_seconds for t in totals if t.exposed_seconds is not None]


def _measured_total(totals: list[StepTotals], attr: str) -> float | None:
    """The sum over all steps of a number measured on sampled steps only: their sum scaled
    to every step (None: no step measured it; the per-unit totals say then)."""
    got = [v for v in (getattr(t, attr) for t in totals) if v is not None]
    if len(got) == len(totals):
        return sum(got)
    return sum(got) * len(totals) / len(got) if got else None


def _add_block(w: RankWindow, b: UnitsBlock, first: bool) -> None:
    """Add a block's step-level sums to `w` (its per-unit totals: `merge_arrays`)."""
    if first:
        w.first_step = b.first_step
    w.steps += b.steps
    if b.detail_steps != b.steps or w.detail_steps is not None:
        w.detail_steps = (w.steps - b.steps if w.detail_steps is None else w.detail_steps) \
            + b.detail_steps
    w.last_step = b.last_step
    _add_scalars(w, b)
    _add_framework(w, b.unit_framework)
    w.max_step_seconds = max(w.max_step_seconds, b.max_step_seconds)
    w.updated_unix = max(w.updated_unix, b.end_unix)


def merge_arrays(parts: list[tuple]) -> tuple:
    """The sum of unit arrays (keys in first-seen order; equal key tuples: one numpy add)."""
    import numpy as np

    ck, cv, mk, mv = parts[0]
    cv, mv = cv.copy(), mv.copy()
    for bck, bcv, bmk, bmv in parts[1:]:
        if bck is ck or bck == ck:
            cv += bcv
        else:
            pos = {k: i for i, k in enumerate(ck)}
            new = [k for k in bck if k not in pos]
            ck = ck + tuple(new)
            cv = np.concatenate((cv, np.zeros(len(new))))
            pos.update({k: len(pos) + i for i, k in enumerate(new)})
            cv[[pos[k] for k in bck]] += bcv
        if bmk is mk or bmk == mk:
            mv += bmv
        else:
            pos = {k: i for i, k in enumerate(mk)}
            new = [k for k in bmk if k not in pos]
            mk = mk + tuple(new)
            mv = np.concatenate((mv, np.zeros((len(new), 5))))
            pos.update({k: len(pos) + i for i, k in enumerate(new)})
            mv[[pos[k] for k in bmk]] += bmv
    return ck, cv, mk, mv


def _latest(log: RankLog, attr: str) -> dict:
    best: tuple[int, dict] = (-1, {})
    for src in (log.totals[-1:], log.steps[-1:]):
        for s in src:
            v = getattr(s, attr)
            if v and s.step > best[0]:
                best = (s.step, dict(v))
    if not best[1] and attr == "memory":
        for s in reversed(log.totals):
            if s.memory:
                return dict(s.memory)
    return best[1]


def _is_warmup(block: UnitsBlock) -> bool:
    """The warm-up step's own interval line (step 1 alone)."""
    return block.kind == "interval" and block.first_step == 1 and block.last_step == 1


def _past_warmup(total: UnitsBlock, warm: UnitsBlock) -> UnitsBlock:
    """A `total` line's totals without the warm-up step: steps 2 .. total.last_step."""
    wck, wcv, wmk, wmv = warm.unit_arrays
    b = UnitsBlock("total", 2, total.last_step, total.steps - warm.steps, total.end_unix,
                   *(getattr(total, f) - getattr(warm, f) for _k, f in SCALARS),
                   total.max_past_warmup if total.max_past_warmup is not None
                   else total.max_step_seconds,
                   merge_arrays([total.unit_arrays, (wck, -wcv, wmk, -wmv)]))
    b.host_compute_seconds = total.host_compute_seconds - warm.host_compute_seconds
    b.launch_checks = total.launch_checks - warm.launch_checks
    b.launch_caught_up = total.launch_caught_up - warm.launch_caught_up
    b.detail_steps = total.detail_steps - warm.detail_steps
    b.unit_framework = {k: v - warm.unit_framework.get(k, 0.0)
                        for k, v in total.unit_framework.items()}
    return b


def _pieces(log: RankLog, det: list, window: int | None, skip_warmup: bool) -> tuple:
    """(the blocks whose per-unit totals make the window, the full-detail steps after
    them, step 1 taken off a `total` line, the warm-up step's own line left out):
    `log_window`'s choice, and `unit_part`'s."""
    intervals = [b for b in log.blocks if b.kind == "interval"]
    totals = [b for b in log.blocks if b.kind == "total"]
    warm = next((b for b in intervals if _is_warmup(b)), None)
    if window is None and totals and warm is not None:
        intervals.remove(warm)  # inside the newest total's steps: only to take step 1 off
    cut = intervals[-1].last_step if intervals else (totals[-1].last_step if totals else 0)
    tail = [s for s in det if s.step > cut]
    pieces: list = []
    taken_off = False  # step 1 taken off a `total` line
    if window is None:
        base = totals[-1] if totals else None
        if base is not None:
            if skip_warmup and warm is not None and base.first_step == 1 and \
                    base.steps > warm.steps:
                base, taken_off = _past_warmup(base, warm), True
            pieces.append(base)
            pieces += [b for b in intervals if b.first_step > base.last_step]
        else:
            pieces += intervals
    else:
        covered = len(tail)
        for b in reversed(intervals):
            if covered >= window:
                break
            pieces.insert(0, b)
            covered += b.steps
        if covered < window and totals and not intervals:
            pieces.insert(0, totals[-1])
    # a later step exists (in a block, a detail step or a step line): step 1 can leave
    later = len(pieces) + len(tail) >= 2 or bool(log.totals and log.totals[-1].step > 1)
    dropped = skip_warmup and later and bool(pieces) and _is_warmup(pieces[0])
    if dropped:
        pieces = pieces[1:]
    return pieces, tail, taken_off, dropped


def unit_part(log: RankLog, window: int, skip_warmup: bool = False) -> tuple:
    """What `log_window(log, window, detail=False)` gives of the per-unit numbers alone,
    without its step-level numbers (a follower takes those from running sums):
    (`unit_arrays`, `detail_steps`, `warmup_kept`)."""
    pieces = _pieces(log, [], window, skip_warmup)[0]
    steps = sum(b.steps for b in pieces)
    detail = sum(b.detail_steps for b in pieces)  # `_add_block`'s sum, in closed form
    if not log.totals and all(b.detail_steps == b.steps for b in pieces):
        detail = None
    elif not pieces:
        detail = 0 if log.totals else None
    return (merge_arrays([b.unit_arrays for b in pieces]) if pieces else None), detail, \
        _warmup_kept(skip_warmup, pieces, steps)


def _warmup_kept(skip_warmup: bool, pieces: list, steps: int) -> bool:
    """The window's per-unit numbers sum the warm-up step with later steps' (its first
    block starts at step 1 and the window holds another step)."""
    return bool(skip_warmup and pieces and pieces[0].first_step == 1 and steps >= 2)


def log_window(log: RankLog, window: int | None = 20, *, detail: bool = True,
               skip_warmup: bool = False) -> RankWindow:
    """One rank's totals over its last `window` steps (None: all steps of the segment).
    `skip_warmup`: a window that starts at step 1 (a short run) leaves that warm-up step out
    when a later step exists (`warmup_left_out` says so): from full-detail steps, or from
    interval lines through the warm-up step's own interval line (the writer writes one).
    Where the lines it reads cover step 1 together with later steps (an older log, or all
    steps from a `total` line) step 1 stays in and `warmup_kept` says so.

    With `detail` and enough full-detail steps, exactly those steps. Otherwise per-unit
    numbers come from the newest interval lines that cover the window (all steps: the
    newest total line and the intervals after it) plus any full-detail steps after them;
    when `detail` is off, the step-level numbers are the last `window` step lines and
    `detail_steps` says how many steps the per-unit numbers cover."""
    facts = log.facts
    det = log.steps if detail else []
    # the whole window in full detail: the last `window` steps, or every step of a young
    # segment (its detail starts at step 1 and reaches the newest per-unit line)
    newest_block = max((b.last_step for b in log.blocks), default=0)
    if det and ((window and len(det) >= window) or
                (det[0].step == 1 and det[-1].step >= newest_block)):
        steps = det[-window:] if window else det
        left_out = skip_warmup and len(steps) >= 2 and steps[0].step == 1
        w = window_from_steps(facts, steps[1:] if left_out else steps)
        w.warmup_left_out = 1 if left_out else None
        per_unit_from_samples(w, det[1:] if left_out else det, skip_warmup=skip_warmup)
        w.memory = _latest(log, "memory") or w.memory
        return w
    pieces, tail, taken_off, dropped = _pieces(log, det, window, skip_warmup)
    warmup_out = taken_off or dropped
    if tail:  # full-detail steps after the blocks (small runs): dicts
        part = window_from_steps(facts, tail)
        w = part
        if pieces:
            w = RankWindow(facts=facts)
            for i, b in enumerate(pieces):
                _add_block(w, b, i == 0)
            comp, comm = part.compute, part.comm
            for b in pieces:
                for k, v in b.compute.items():
                    comp[k] = comp.get(k, 0.0) + v
                for k, t in b.comm.items():
                    comm.setdefault(k, CommTotals()).add(t)
            w.detail_steps = w.per_unit_steps + part.per_unit_steps
            w.detail_last_step, w.detail_every = part.detail_last_step, part.detail_every
            w.steps += part.steps
            w.last_step = part.last_step
            _add_scalars(w, part)
            w.max_step_seconds = max(w.max_step_seconds, part.max_step_seconds)
            w.updated_unix = part.updated_unix
            w.compute, w.comm = comp, comm
            _add_framework(w, part.unit_framework)
    else:  # blocks only: per-unit totals stay arrays until someone reads the dicts
        w = LazyRankWindow(facts=facts, unit_arrays=merge_arrays(
            [b.unit_arrays for b in pieces]) if pieces else None)
        for i, b in enumerate(pieces):
            _add_block(w, b, i == 0)
    lines = log.totals
    if _warmup_kept(skip_warmup, pieces, w.steps):
        w.warmup_kept = True
    if lines:
        if not detail and window is not None:
            # step-level numbers: exactly the last `window` step lines, fresh; per-unit: the
            # intervals above, over `detail_steps` steps
            detail_steps = w.per_unit_steps if (pieces or tail) else 0
            lines = lines[-window:]
            if skip_warmup and len(lines) >= 2 and lines[0].step == 1:
                lines = lines[1:]  # the step-level numbers leave it out with the per-unit
                warmup_out = True
            _scalars_from_totals(w, lines)
            w.detail_steps = detail_steps
        else:
            inside = [t for t in lines if w.first_step <= t.step <= w.last_step]
            if w.steps == 0 and not pieces:
                lines = lines if window is None else lines[-window:]
                if skip_warmup and len(lines) >= 2 and lines[0].step == 1:
                    lines = lines[1:]
                    warmup_out = True
                _scalars_from_totals(w, lines)
                w.detail_steps = 0
            else:
                if len(inside) == w.steps:
                    w.step_times = [t.step_seconds for t in inside]
                    w.exposed_times = exposed_times(inside)
                if inside:
                    w.last_step_seconds = inside[-1].step_seconds
                    w.updated_unix = max(w.updated_unix, inside[-1].end_unix)
    if warmup_out and not w.warmup_kept:
        w.warmup_left_out = 1
    w.memory = _latest(log, "memory")
    w.errors = _latest(log, "errors")
    k = newest_k(log.totals)
    if k:
        w.detail_every = k
    return w


def newest_k(lines: list) -> int | None:
    """K in force at the newest step line that says it (every step line since 2026-11-27;
    before, sampled ones only: a sampled step's K goes stale when adaptive K rises after
    it). The newest 4,096 lines at most: an old log that never says it costs no scan."""
    for t in itertools.islice(reversed(lines), 4096):
        if t.detail_k:
            return t.detail_k
    return None


# --------------------------------------------------------------------------------------
# run directories


def load_run(run_dir: str | os.PathLike, window: int | None = 20,
             stale_after_s: float = 30.0, *, segment: int | None = None,
             skip_warmup: bool = False) -> RunSnapshot:
    """A RunSnapshot from a run directory: each rank's totals over its last `window` steps
    (all steps when None) of the newest segment (or `segment`). Ranks whose log has no
    clean end and no step for `stale_after_s` seconds are stale; ranks the world size
    promises and no log shows are missing."""
    from .segments import pick_segment

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunLogError(f"no run directory at {run_dir}")
    paths = rank_logs(run_dir)
    if not paths:
        raise RunLogError(f"{run_dir} holds no rank-*.jsonl run logs")
    read, problems = [], []
    for p in paths:
        try:
            read.append(read_rank_tail(p, window, segment))
        except RunLogUnreadable as e:
            problems.append(str(e))  # said under "Run log"; the other ranks are read
    if not read:
        raise RunLogError(f"{run_dir}: no rank's log can be read: {'; '.join(problems[:3])}")
    logs, jobs = one_job(read)
    logs = pick_segment(logs, segment)
    snap = RunSnapshot(source=str(run_dir))
    now = time.time()
    for log in logs:
        snap.ranks[log.facts.rank] = log_window(log, window, skip_warmup=skip_warmup)
    annotate(snap, logs, stale_after_s, now, problems, jobs)
    return snap


def annotate(snap: RunSnapshot, logs, stale_after_s: float, now: float,
             problems: list[str] = (), jobs: dict | None = None) -> None:
    """Ended, stale and missing ranks and the watchdog's stall records of these logs, into
    `snap`. A log whose newest watchdog record says the rank failed (closed while an
    exception propagated) is not a clean end. `problems`: logs that could not be read
    (`RunLogUnreadable`), said under "Run log"; `jobs`: `one_job`'s account when the
    directory holds the logs of more than one job (`snap.jobs`, and said)."""
    from ..stalls import last_stall

    for log in logs:
        rank = log.facts.rank
        stall = last_stall(log.events)
        if stall is not None:
            snap.stalls[rank] = stall
        failed = stall is not None and stall.get("state") == "failed"
        if log.ended and not failed:
            snap.ended_ranks.add(rank)
            if log.interrupted:
                snap.interrupted_ranks.add(rank)
        elif not log.ended and now - log.last_unix > stale_after_s:
            snap.stale_ranks.add(rank)
    snap.missing_ranks = missing(snap)
    snap.log_notes = [*problems, *log_notes(logs)]
    snap.jobs = jobs  # the report says it (report.notes)


def missing(snap: RunSnapshot) -> set[int]:
    """Ranks below the world size that the snapshot does not show."""
    if not snap.ranks:
        return set()
    world = max(w.facts.world_size for w in snap.ranks.values())
    return set(range(world)) - set(snap.ranks)


def latest_run(root: str | os.PathLike = DEFAULT_ROOT) -> Path:
    """The most recently written run directory under `root`."""
    root = Path(root)
    candidates = [d for d in root.glob("*") if d.is_dir() and rank_logs(d)] if root.is_dir() else []
    if not candidates:
        raise RunLogError(f"no zerodoc runs under {root.resolve()} "
                          "(run `zerodoc demo`, or pass a run directory)")
    return max(candidates, key=lambda d: max(p.stat().st_mtime for p in rank_logs(d)))


__all__ = ["DEFAULT_ROOT", "RankLog", "RunLogError", "StepRecord", "latest_run", "load_run",
           "log_window", "rank_log_name", "rank_logs", "read_detail", "read_rank_log",
           "read_rank_tail", "window_from_steps"]
