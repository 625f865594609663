"""The run-log writer: used inside training jobs. Standard library only; never blocks the
training thread and never raises into it after construction.

The training thread only *hands over* records (`write()`, `write_lean_step()`,
`write_units()`): one append to a bounded deque (a C call: no lock, no wake-up of the writer
thread per record), and when it is full the record is dropped and counted (`dropped`). A
background thread wakes every `POLL_S` seconds (or when `close()` / `flush()` wake it), and
builds, encodes and writes what was handed over, in order. A blocked or slow filesystem therefore stalls
the writer thread, never a step; the records that did not fit are counted, the count is
exported (`zerodoc_runlog_dropped_records_total`) and written to the log (a `dropped`
record) once the filesystem moves again.

A record is written whole or not at all: a write that fails half-way (disk full, a
file-size limit, a filesystem turned read-only) is cut back to where the record began, or,
where even that fails, the next record starts on a new line, so no reader ever sees a
record glued to a torn one. Every record a failed write lost is counted (`lost`,
`lost_steps`), exported (`zerodoc_runlog_records_lost_total`), warned about with the path,
and written to the log once it takes writes again: a `lost` record, and the counts in the
`end` record. On a full disk the detail files (which only repeat the latest steps) are
emptied to make room for the main log's records. The detail files stay bounded whatever
fails: a detail file that cannot be replaced at an interval is closed, not appended to.

Construction (at attach) opens the file, takes an exclusive `flock` (a second writer of the
same rank log is refused: two writers would interleave their lines) and reads the tail of
an existing log to number the new segment. That is bounded, attach-time I/O; from then on
the training thread does none.

What is there in the log's place cannot hold the job (issue 32): the log is opened
non-blocking and anything but a regular file (a FIFO, which blocked `open` for good, a
directory, a device) is refused with one warning naming the path; the writer then runs
*off* (no file) and counts every record it is handed as lost (`lost`, served as
`zerodoc_runlog_records_lost_total`), so the rank trains on. A second job writing into a
run directory that a live job still writes is refused the same way at attach (its
`job_id`, the run directory's `.zerodoc-job` file under a shared `flock`: `_claim_dir`).
While it runs, the writer thread checks at least every second and before every interval
line that the path still names its file (`_check_place`): a run directory deleted or
replaced is re-created and the log reopened (the header written again, the records written
to the vanished file counted as lost), or, where that fails, the writer stops with the path
named; a log truncated in place (logrotate's copytruncate: the file shorter than what was
written) gets its header written again so that readers can place the lines after it.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import logging
import os
import stat
import threading
import time
from collections import deque
from pathlib import Path

from .records import SCHEMA, rank_log_name
from .scan import newest_head

DETAIL_DIR = "detail"
_STOP = object()
POLL_S = 0.05  # the writer thread's wake-up interval (records wait at most this long)
CHECK_S = 1.0  # the log's place (deleted, replaced, truncated) is checked at least this often
JOB_FILE = ".zerodoc-job"  # the live job's id in a run directory, held under a shared flock


class _Full(Exception):
    pass


class _Handover:
    """The hand-over between the training thread (and the watchdog's) and the writer thread:
    a deque appended to without a lock or a notify (a `queue.Queue` put cost the training
    thread a lock, a condition notify and a wake-up of the writer thread on every step), drained
    by the writer thread on its own tick."""

    __slots__ = ("items", "maxsize", "wake", "busy")

    def __init__(self, maxsize: int):
        self.items: deque = deque()
        self.maxsize = maxsize
        self.wake = threading.Event()
        self.busy = False  # the writer thread is handling items it took

    def qsize(self) -> int:
        return len(self.items)

    def put_nowait(self, item) -> None:
        if len(self.items) >= self.maxsize:
            raise _Full
        self.items.append(item)

    def put(self, item, timeout: float) -> None:
        """Wait (boundedly: close()) for room."""
        deadline = time.monotonic() + timeout
        while len(self.items) >= self.maxsize:
            self.wake.set()
            if time.monotonic() >= deadline:
                raise _Full
            time.sleep(0.001)
        self.items.append(item)

    def idle(self) -> bool:
        return not self.items and not self.busy

# os.write, looked up at call time: the writer-never-blocks test puts a blocking one here.
_os_write = os.write


log = logging.getLogger("zerodoc")

# why a write failed, as the report says it
_WHY = {errno.ENOSPC: "disk full", errno.EDQUOT: "disk quota exceeded",
        errno.EFBIG: "file size limit reached", errno.EROFS: "read-only filesystem",
        errno.EMFILE: "too many open files", errno.EIO: "I/O error"}


def write_error(e: OSError) -> str:
    """A failed write's reason in words ("disk full", "read-only filesystem", ...)."""
    return _WHY.get(e.errno, e.strerror or str(e))


def _append_whole(fd: int, data: bytes, at: int) -> None:
    """Append `data` (the file is `at` bytes long) all or nothing: after a write that fails
    half-way the file is cut back to `at`. Raises the OSError; its `torn` attribute says
    the cut failed too (the file ends inside this record)."""
    n = 0
    try:
        while n < len(data):
            n += _os_write(fd, data[n:])
    except OSError as e:
        e.torn = False
        if n:
            try:
                os.ftruncate(fd, at)
            except OSError:
                e.torn = True
        raise


def detail_names(rank: int) -> tuple[str, str]:
    return f"{rank:05d}-a.jsonl", f"{rank:05d}-b.jsonl"


def lean_record(t: tuple) -> dict:
    """The `step` record of a step without per-unit detail, from `write_lean_step`'s tuple;
    the per-unit-derived fields are null (not measured), never 0."""
    step, end_unix, step_s, optimizer_s, self_s, mem, coll, dev, errors, k, *seq = t
    rec = {"type": "step", "step": step, "end_unix": end_unix, "detail": False,
           "step_s": step_s, "optimizer_s": optimizer_s, "self_s": self_s, "compute": [],
           "comm": [], "mem": mem, "framework_s": None, "other_s": None, "wait_s": None,
           "compute_s": None, "exposed_s": None, "detail_k": k}
    if coll is not None:
        rec["coll"] = coll
    if seq and seq[0]:  # the process groups' sequence numbers at the step's end
        rec["seq"] = seq[0]
    if dev is not None:
        rec["device_step_s_for"], rec["device_step_s"] = dev
    if errors:
        rec["errors"] = errors
    return rec


class RunLogBusy(OSError):
    """Another writer holds this rank's run log."""


class NotAFile(OSError):
    """Something other than a regular file is where a log belongs (a FIFO, a directory, a
    device): refused, never opened for writing."""


def _kind(mode: int) -> str:
    """What a file mode is, in words ("a FIFO", "a directory", ...)."""
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return name
    return "not a regular file"


def open_regular(path, flags: int, mode: int = 0o644) -> int:
    """os.open for a regular file only, never blocking: O_NONBLOCK (a FIFO's open would wait
    for a reader for good), then fstat; anything but a regular file is closed again and
    refused (NotAFile naming the path and what is there). `flags` may add O_NOFOLLOW."""
    try:
        fd = os.open(path, flags | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0), mode)
    except OSError as e:
        if e.errno in (errno.EISDIR, errno.ENXIO, errno.ELOOP):  # a directory, a FIFO
            try:  # with no reader, a symbolic link under O_NOFOLLOW
                what = _kind(os.lstat(path).st_mode)
            except OSError:
                what = "not a regular file"
            raise NotAFile(e.errno, f"{path} is {what}, not a regular file") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotAFile(errno.EINVAL, f"{path} is {_kind(st.st_mode)}, not a regular file")
        os.set_blocking(fd, True)  # a regular file: writes behave as they always did
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_read(path):
    """A regular file opened for reading as a binary file object, never blocking on what
    is there instead (NotAFile: a FIFO, a directory, a device)."""
    return os.fdopen(open_regular(path, os.O_RDONLY), "rb")


def _close_quietly(fd: int | None) -> None:
    if fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass


def _holds(fd: int, how: int) -> bool:
    """flock(fd, how | LOCK_NB): True when taken, False when another holder has it; raises
    OSError where the filesystem has no flock."""
    import fcntl

    try:
        fcntl.flock(fd, how | fcntl.LOCK_NB)
        return True
    except OSError as e:
        if e.errno in (errno.EWOULDBLOCK, errno.EACCES, errno.EAGAIN):
            return False
        raise


def claim_dir(run_dir: Path, job: str, tries: int = 40) -> tuple[int | None, str | None]:
    """Claim `run_dir` for job `job`: (fd holding a shared flock on its JOB_FILE, None), or
    (None, the other live job's id) when a live job of another id holds it, or (None, None)
    where it cannot be told (no flock, a JOB_FILE that is not a regular file): then nothing
    is refused. The first holder of a free directory writes its id under an exclusive lock,
    then holds it shared; every later holder holds it shared after reading the same id, so
    the file's id is always that of every holder. Bounded: `tries` attempts 5 ms apart
    (another rank of this job may be writing the id)."""
    try:
        import fcntl
    except ImportError:
        return None, None
    try:
        fd = open_regular(run_dir / JOB_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW)
    except OSError:
        return None, None
    other = None
    try:
        for _ in range(tries):
            if _holds(fd, fcntl.LOCK_EX):  # no live holder: the directory is free
                os.ftruncate(fd, 0)
                os.pwrite(fd, job.encode(), 0)
                if _holds(fd, fcntl.LOCK_SH) and os.pread(fd, 4096, 0).decode(
                        "utf-8", "replace") == job:
                    return fd, None
            elif _holds(fd, fcntl.LOCK_SH):
                held = os.pread(fd, 4096, 0).decode("utf-8", "replace")
                if held == job:
                    return fd, None
                if held:
                    other = held  # held by live holders: the job whose id this is
                fcntl.flock(fd, fcntl.LOCK_UN)
            time.sleep(0.005)
    except OSError:
        os.close(fd)
        return None, None
    os.close(fd)
    return None, other


def _dumps(rec: dict) -> bytes:
    return (json.dumps(rec, separators=(",", ":"), default=str) + "\n").encode()


# Durations are written with 13 significant digits (issue 33: Python's shortest round trip
# of a float takes up to 17, a third of a step line): a relative error below 5e-13, under
# a nanosecond on any step or per-unit time, under a microsecond on a week's cumulative
# total, far below what any of the clocks measured. `end_unix` (an absolute time) keeps all.
DIGITS = 13


def short(x):
    """A duration as written (`DIGITS` significant digits); anything else as it is."""
    return float(f"{x:.{DIGITS}g}") if type(x) is float else x


def _short_list(xs: list) -> list:
    return [float(f"{x:.{DIGITS}g}") if type(x) is float else x for x in xs]


def _compact(g: dict, columns: tuple) -> None:
    """Schema 3's compact columns of one `units` group, in place (records.column reads
    them): `unit` 0..n-1 as n, a column of one repeated number as that number, a column
    equal to `seconds` as "seconds" (CPU collectives: exposed is all of it)."""
    units = g["unit"]
    if units == list(range(len(units))):
        g["unit"] = len(units)
    for name in columns:
        col = g[name]
        if col and col == g["seconds"] and name != "seconds":
            g[name] = "seconds"
        elif col and col.count(col[0]) == len(col):
            g[name] = col[0]


def short_step(rec: dict) -> dict:
    """A step record with its step-level durations (`*_s` fields) as written, in its step
    line and its detail line alike. Its per-unit rows go to the detail files only (bounded,
    outside the budget): kept as they are, spared the writer thread's time."""
    return {k: short(v) if k.endswith("_s") else v for k, v in rec.items()}


class RunLogWriter:
    """Writes one rank's run log; see the module docstring and `zerodoc.runlog`.

    every_steps / every_seconds: per-unit interval lines at most this many steps / seconds
    apart; totals_every: a cumulative `total` line every this many intervals; detail: keep
    the steps of the current and the previous interval with their full per-unit detail in
    `detail/`; queue_size: records the hand-over queue holds before it drops; job_id: this
    job's identity (zerodoc/shim/jobid.py), checked against the run directory's live job
    before the log is opened (else at `write_header`, from the header's `job_id`).
    """

    def __init__(self, run_dir: str | os.PathLike, rank: int, *, every_steps: int = 100,
                 every_seconds: float = 300.0, totals_every: int = 10, detail: bool = True,
                 queue_size: int = 1024, on_error=None, clock=time.time,
                 job_id: str | None = None):
        self.run_dir = Path(run_dir)
        self.rank = rank
        self.path = self.run_dir / rank_log_name(rank)
        self.every_steps = max(1, int(every_steps))
        self.every_seconds = float(every_seconds)
        self.totals_every = max(1, int(totals_every))
        self.detail = bool(detail)
        self.on_error = on_error  # callable(hook, exception): count, never raise
        self.clock = clock
        self.dropped = 0  # records dropped because the queue was full
        self.written = 0  # records written
        self.errors = 0  # write errors (counted through on_error too)
        self.lost = 0  # records a failed write lost (disk full, read-only, size limit)
        self.lost_steps = 0  # ... of which step lines
        self.write_error: str | None = None  # why the newest failed write failed
        self._unlogged_lost = [0, 0]  # lost records / steps not yet told in the log
        self._failing = False  # the last write to the main log failed
        self._torn = False  # the main log ends inside a record that could not be cut back
        self._unlogged_drops = 0
        self._q = _Handover(max(1, int(queue_size)))
        self._closed = False
        self._closing_timeout = 0.0
        # per-unit checkpoints: decided on the training thread (cheap), written by the thread
        self._last_units_step = 0
        self._last_units_time = clock()
        self._warmup_written = False  # step 1's own interval line was handed over
        self.off: str | None = None  # why this writer keeps no log (refused): records lost
        self.other_job: str | None = None  # the live job whose run directory this is (off)
        self._job: str | None = None  # the job whose run directory claim we hold
        self._job_fd: int | None = None  # ... its JOB_FILE, under a shared flock
        self._created = False  # this writer created the log file (removed if refused)
        self._since_check = [0, 0]  # records / steps written since the place was checked
        self._next_check = 0.0
        self._header_rec: dict | None = None  # the header written, again after a reopen
        self._last_step = 0  # the newest step line written
        self._fd: int | None = None
        self._pos, self.segment, self._prev_head = 0, 0, None
        self._detail_fd: int | None = None
        self._detail_pos = 0
        self._detail_slot = 1

        self.path.parent.mkdir(parents=True, exist_ok=True)
        if job_id is None or self._claim(job_id):
            try:
                self._open_log()
            except NotAFile as e:
                self._go_off(e.strerror or str(e))
            except BaseException:
                self._close_job()
                raise
        self._header_at: int | None = None
        self._unit_index: dict[str, int] = {}
        self._prev_cum: tuple | None = None  # cumulative totals at the last interval line
        self._intervals = 0
        self._interval_max = 0.0  # longest step line written since the last interval
        self._max_past_warmup = 0.0  # longest step line after step 1
        self._wrote_warmup = False  # step 1's own interval line is in this segment
        self._thread = threading.Thread(target=self._run, name=f"zerodoc-runlog-{rank}",
                                        daemon=True)
        self._thread.start()

    # --- set-up (attach time) ----------------------------------------------------------
    def _open_log(self) -> None:
        """Open (non-blocking, a regular file only), lock and place the log: the file's
        size, the new segment's number, the previous header; a torn last line ended."""
        fd = open_regular(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        old, self._fd = self._fd, fd
        try:
            self._lock()
            self._pos, self.segment, self._prev_head, torn = self._find_segment()
            self._created = self._pos == 0
            if torn:
                self._pos += _os_write(self._fd, b"\n")  # a killed writer's torn last line
        except BaseException:
            self._fd = old
            os.close(fd)
            raise
        _close_quietly(old)

    def _claim(self, job: str) -> bool:
        """Claim the run directory for `job` (`claim_dir`); False (and the writer off, its
        own empty log removed) when another live job writes it."""
        self._job = job
        self._close_job()
        self._job_fd, other = claim_dir(self.run_dir, job)
        if other is None:
            return True
        self.other_job = other
        self._drop_created()
        self._go_off(f"{self.run_dir} is being written by another live job (job_id {other}); "
                     f"this job ({job}) keeps no run log there: give each job its own run "
                     "directory (attach(run_dir=...) or ZERODOC_RUN_DIR)")
        return False

    def _close_job(self) -> None:
        fd, self._job_fd = self._job_fd, None
        _close_quietly(fd)

    def _drop_created(self) -> None:
        """Remove the log this writer created and left empty (refused after opening it)."""
        if self._fd is None or not self._created:
            return
        try:
            st, fst = os.stat(self.path), os.fstat(self._fd)
            if fst.st_size == 0 and (st.st_dev, st.st_ino) == (fst.st_dev, fst.st_ino):
                os.unlink(self.path)
        except OSError:
            pass

    def _go_off(self, why: str) -> None:
        """Keep no log from now on (one warning naming the path): every record handed over
        is counted as lost; the job trains on."""
        self.off = self.write_error = why
        fds = (self._fd, self._detail_fd)
        self._fd = self._detail_fd = None
        self._close_job()
        for fd in fds:
            _close_quietly(fd)
        log.warning("zerodoc: no run log for rank %d: %s; every record is counted as lost "
                    "(zerodoc_runlog_records_lost_total); training continues", self.rank, why)

    def _lock(self) -> None:
        try:
            import fcntl
        except ImportError:  # not POSIX: no lock
            return
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in (errno.EWOULDBLOCK, errno.EACCES, errno.EAGAIN):
                raise RunLogBusy(e.errno, f"another zerodoc monitor is writing {self.path} "
                                 "(attached twice, or two jobs share this run directory "
                                 "and rank)") from None
            # a filesystem without flock (some network filesystems): write unlocked

    def _find_segment(self) -> tuple[int, int, int | None, bool]:
        """(file size, this segment's number, previous segment's header offset, torn end)."""
        size = os.fstat(self._fd).st_size
        if size == 0:
            return 0, 0, None, False
        with open_read(self.path) as f:
            f.seek(size - 1)
            torn = f.read(1) != b"\n"
            head = newest_head(f, size)
        if head is None:
            return size, 0, None, torn
        offset, d = head
        return size, int(d.get("segment", 0)) + 1, offset, torn

    # --- the training thread's side: hand over, never block -----------------------------
    def _put(self, item) -> None:
        if self._closed:
            return
        try:
            if self._closing_timeout:  # close(): the last records may wait, boundedly
                self._q.put(item, timeout=self._closing_timeout)
            else:
                self._q.put_nowait(item)
        except _Full:
            self.dropped += 1
            self._unlogged_drops += 1

    def write_header(self, facts) -> None:
        rec = {"type": "header", "schema": SCHEMA, "segment": self.segment,
               "prev_header_at": self._prev_head,
               "runlog": {"every_steps": self.every_steps, "every_seconds": self.every_seconds,
                          "totals_every": self.totals_every, "detail": self.detail},
               **(dataclasses.asdict(facts) if dataclasses.is_dataclass(facts) else facts)}
        self._unit_index = {u["name"]: i for i, u in enumerate(rec["units"])}
        job = rec.get("job_id")
        if job and self._job is None and self.off is None:
            self._claim(str(job))  # attach time: the constructor was not told the job
        self._put(("header", rec))

    def write(self, record: dict) -> None:
        """Hand one record over. A `step` record (with its `compute` / `comm` rows) becomes
        a step line (totals) and, with detail on, a detail line; any other type is written
        as it is."""
        self._put(("step" if record.get("type") == "step" else "record", record))

    def write_lean_step(self, t: tuple) -> None:
        """Hand over a step without per-unit detail as a tuple (step, end_unix, step_s,
        optimizer_s, self_s, mem, coll, (device_step_s_for, device_step_s) or None,
        errors or None, K in force[, seq: the groups' sequence numbers at the step's end]):
        the writer thread builds its `step` record (docs/runlog.md), so the training thread builds no dict on such a step. `mem` and
        `errors` are not changed after the hand-over (the monitor replaces them, never
        mutates them).
        The common case is one append here, no further call (`_put` for the rest: closed,
        closing, full)."""
        q = self._q
        if not self._closing_timeout and len(q.items) < q.maxsize and not self._closed:
            q.items.append(("lean", t))
        else:
            self._put(("lean", t))

    def units_due(self, step: int) -> bool:
        """A per-unit interval line is due after this step (every_steps / every_seconds),
        and after step 1: the warm-up step gets an interval line of its own, so that a
        window read from interval lines can leave it out as one read from steps does."""
        return step - self._last_units_step >= self.every_steps or (
            step > self._last_units_step
            and self.clock() - self._last_units_time >= self.every_seconds) or (
            step == 1 and not self._warmup_written)

    def write_units(self, totals, final: bool = False) -> None:
        """Hand over a copy of the cumulative totals (a RankWindow since attach): the writer
        writes the interval since the previous one (and every `totals_every` intervals, and
        on close, the cumulative totals). The copy is the only work done here (a few hundred
        entries, once per interval)."""
        if totals.last_step <= self._last_units_step and not final:
            return
        if totals.last_step == 1 and not self._warmup_written:
            self._warmup_written = True  # the warm-up line: the interval boundaries stay
        else:
            self._last_units_step = totals.last_step
            self._last_units_time = self.clock()
        snap = (totals.last_step, totals.steps, totals.updated_unix,
                (totals.step_seconds, totals.optimizer_seconds, totals.framework_seconds,
                 totals.other_seconds, totals.self_seconds,
                 getattr(totals, "host_compute_seconds", 0.0),
                 getattr(totals, "launch_checks", 0), getattr(totals, "launch_caught_up", 0)),
                totals.max_step_seconds,
                dict(totals.compute),
                {k: (t.count, t.bytes, t.seconds, t.exposed_seconds, t.hidden_seconds)
                 for k, t in totals.comm.items()},
                # sampled steps: the per-unit totals cover these (None: every step)
                getattr(totals, "detail_steps", None),
                dict(getattr(totals, "unit_framework", None) or {}))
        self._put(("units", snap, final))

    def close(self, steps: int, totals=None, timeout: float = 5.0,
              failed: bool = False, interrupted: bool = False,
              terminated: bool = False) -> None:
        """Final interval / total lines (from `totals`), the `end` record (`"failed": true`
        when an exception ended the training: not a clean close; `"interrupted": true` when
        the user stopped it, `"terminated": true` when a SIGTERM did: a clean close), then
        stop the thread;
        waits at most `timeout` seconds for a slow filesystem (what is not written by then is
        lost, and the job goes on)."""
        if self._closed:
            return
        self._closing_timeout = timeout  # the final records wait for room (bounded)
        deadline = time.monotonic() + timeout
        if totals is not None and totals.last_step > 0:
            self.write_units(totals, final=True)
        end = {"type": "end", "end_unix": self.clock(), "steps": steps}
        if failed:
            end["failed"] = True
        elif interrupted:
            end["interrupted"] = True
        elif terminated:
            end["terminated"] = True
        self._put(("end", end))
        self._closed = True
        try:
            self._q.put(_STOP, timeout=max(0.0, deadline - time.monotonic()))
        except _Full:
            pass
        self._q.wake.set()
        self._thread.join(max(0.0, deadline - time.monotonic()))
        if not self._thread.is_alive():
            self._close_files()

    def abandon(self, timeout: float = 5.0) -> None:
        """Stop after writing what was handed over, with no final lines and no `end`: what
        a killed job leaves behind (tests, synthetic runs)."""
        if self._closed:
            return
        self._closed = True
        try:
            self._q.put(_STOP, timeout=timeout)
        except _Full:
            pass
        self._q.wake.set()
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self._close_files()

    def _close_files(self) -> None:
        self._close_job()
        for fd in (self._detail_fd, self._fd):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every record handed over so far is written (tests, tools)."""
        deadline = time.monotonic() + timeout
        q = self._q
        while not q.idle() and time.monotonic() < deadline:
            q.wake.set()
            time.sleep(0.002)
        return q.idle()

    # --- the writer thread -------------------------------------------------------------
    def _run(self) -> None:
        q = self._q
        items = q.items
        while True:
            q.wake.wait(POLL_S)
            q.wake.clear()
            q.busy = True  # before taking: flush() sees no gap between the deque and here
            try:
                while items:
                    item = items.popleft()
                    if item is _STOP:
                        return
                    self._one(item)
                if time.monotonic() >= self._next_check:
                    self._one(None)
            finally:
                q.busy = False

    def _one(self, item) -> None:
        """Handle one item (None: check the log's place), then tell the log what was lost
        or dropped; an error is counted and the thread carries on."""
        try:
            if item is None:
                self._check_place()
            else:
                self._handle(*item)
            if self._unlogged_lost[0]:
                (n, k), self._unlogged_lost = self._unlogged_lost, [0, 0]
                try:
                    self._main({"type": "lost", "records": n, "steps": k,
                                "total": self.lost, "total_steps": self.lost_steps,
                                "error": self.write_error, "path": str(self.path),
                                "end_unix": self.clock()}, meta=True)
                except OSError:
                    self._unlogged_lost = [self._unlogged_lost[0] + n,
                                           self._unlogged_lost[1] + k]
                    raise
            if self._unlogged_drops:
                n, self._unlogged_drops = self._unlogged_drops, 0
                self._main({"type": "dropped", "records": n, "total": self.dropped,
                            "end_unix": self.clock()}, meta=True)
        except Exception as e:  # noqa: BLE001 - counted, the thread carries on
            self.errors += 1
            if self.on_error is not None:
                try:
                    self.on_error("runlog", e)
                except Exception:  # noqa: BLE001
                    pass

    def _main(self, rec: dict, meta: bool = False) -> int:
        """Append one record to the main log, whole or not at all; its offset. A failed
        write is counted as lost (`meta`: a `lost` / `dropped` record, not counted) and
        raised."""
        if self.off is not None:  # refused, or stopped: counted, never written
            if not meta:
                self.lost += 1
                self.lost_steps += rec.get("type") == "step"
            return -1
        data = _dumps(rec)
        lead = b"\n" if self._torn else b""
        at = self._pos
        try:
            try:
                _append_whole(self._fd, lead + data, at)
            except OSError as e:
                if e.errno not in (errno.ENOSPC, errno.EDQUOT) or e.torn or \
                        not self._free_detail():
                    raise
                _append_whole(self._fd, lead + data, at)  # once more, in the space freed
        except OSError as e:
            self._torn = self._torn or e.torn
            if self._torn:
                try:
                    self._pos = os.fstat(self._fd).st_size
                except OSError:
                    pass
            if not meta:
                self.lost += 1
                self._unlogged_lost[0] += 1
                if rec.get("type") == "step":
                    self.lost_steps += 1
                    self._unlogged_lost[1] += 1
            self._write_failed(e)
            raise
        self._torn = False
        self._pos = at + len(lead) + len(data)
        self.written += 1
        if not meta:
            self._since_check[0] += 1
            self._since_check[1] += rec.get("type") == "step"
        if self._failing:
            self._failing = False
            log.warning("zerodoc: run log %s takes writes again; %d record(s) (%d step(s)) "
                        "were lost", self.path, self.lost, self.lost_steps)
        return at + len(lead)

    def _write_failed(self, e: OSError) -> None:
        """Note why (warned once per run of failures, with the path)."""
        self.write_error = write_error(e)
        if not self._failing:
            self._failing = True
            log.warning("zerodoc: cannot write the run log %s (%s); records are lost and "
                        "counted until it takes writes again; training continues",
                        self.path, self.write_error)

    def _handle(self, kind: str, *rec) -> None:
        rec = rec[0] if kind != "units" else rec
        if kind == "lean":  # built here, then written as any step record
            kind, rec = "step", lean_record(rec)
        if kind == "header":
            self._header_rec = rec
            self._header_at = self._main(rec)
            if self.detail and self.off is None:
                self._switch_detail(rec["segment"], first_step=1)
        elif kind == "step":
            rec = short_step(rec)
            light = {k: v for k, v in rec.items() if k not in ("compute", "comm", "framework")}
            self._main(light)
            self._last_step = rec.get("step", self._last_step)
            self._interval_max = max(self._interval_max, float(rec.get("step_s", 0.0)))
            if rec.get("step", 1) > 1:  # the longest step past warm-up, for `total` lines
                self._max_past_warmup = max(self._max_past_warmup, float(rec.get("step_s", 0.0)))
            if self._detail_fd is not None:
                data = _dumps(rec)
                try:
                    _append_whole(self._detail_fd, data, self._detail_pos)
                except OSError as e:
                    if e.torn:  # a torn detail line: stop this file (readers skip it)
                        self._close_detail()
                    raise
                self._detail_pos += len(data)
        elif kind == "units":
            self._units(*rec)
        elif kind == "end":
            self._main(self._end(rec))
        else:
            self._main(rec)

    # --- the log's place: deleted, replaced, truncated ------------------------------------
    def _check_place(self) -> None:
        """Does the path still name the file written, as long as written? (module
        docstring). A deleted or replaced one is reopened, a truncated one re-headed."""
        self._next_check = time.monotonic() + CHECK_S
        if self.off is not None or self._fd is None:
            return
        try:
            st = os.stat(self.path)
        except (FileNotFoundError, NotADirectoryError):
            st = None
        except OSError:
            return  # cannot tell (a hung or vanished mount answers with its own error)
        fst = os.fstat(self._fd)
        if st is None or (st.st_dev, st.st_ino) != (fst.st_dev, fst.st_ino):
            self._reopen("deleted" if st is None else "replaced")
        elif fst.st_size < self._pos:
            self._truncated(fst.st_size)
        else:
            self._since_check = [0, 0]

    def _reopen(self, how: str) -> None:
        """The log's path no longer names its file (the run directory deleted or replaced):
        what was written since the last check went with it (counted as lost); make the
        directory again and write the header again there, in this segment (a new one after
        a log already there), or stop with the path named."""
        n, k = self._since_check
        self._since_check = [0, 0]
        self._close_detail()
        self.lost += n
        self.lost_steps += k
        why = f"run log {how} while the job ran"
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            if self._job is not None and not self._claim(self._job):
                return  # another live job has the new directory (warned, off)
            segment = self.segment
            self._open_log()
        except OSError as e:
            self._go_off(f"the run log {self.path} was {how} and cannot be made again "
                         f"({write_error(e)}); {n} record(s) written since the last check "
                         "went with it")
            return
        if self._pos == 0:  # a new file: this segment goes on
            self.segment, self._prev_head = segment, None
        self.write_error = why
        self._unlogged_lost[0] += n
        self._unlogged_lost[1] += k
        log.warning("zerodoc: the run log %s was %s while the job ran: reopened it (header "
                    "written again, segment %d); %d record(s) (%d step(s)) written since the "
                    "last check went with the old file and are counted as lost",
                    self.path, how, self.segment, n, k)
        self._rehead(how)

    def _truncated(self, size: int) -> None:
        """The log is shorter than what was written (truncated in place: logrotate's
        copytruncate): the header is written again at its new end, so that the lines from
        here on have one (readers count those in between as lines without a header)."""
        self._pos = size
        self._torn = False
        log.warning("zerodoc: the run log %s was truncated in place (logrotate's "
                    "copytruncate?); its header is written again at the new end", self.path)
        self._prev_head = None
        self._rehead("truncated in place")
        self._since_check = [0, 0]

    def _rehead(self, how: str) -> None:
        """Write this segment's header again (`reopened` says why and after which step)."""
        if self._header_rec is None:
            return  # not written yet: it comes in its turn
        rec = {**self._header_rec, "segment": self.segment, "prev_header_at": self._prev_head,
               "reopened": {"why": how, "after_step": self._last_step}}
        self._header_at = self._main(rec)  # detail files follow at the next interval

    def _switch_detail(self, segment: int, first_step: int) -> None:
        """Make the other detail file current: truncate it, tag it with this segment."""
        self._detail_slot ^= 1
        path = self.run_dir / DETAIL_DIR / detail_names(self.rank)[self._detail_slot]
        self._close_detail()  # whatever fails below, no detail file grows past its interval
        path.parent.mkdir(exist_ok=True)
        fd = open_regular(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND
                          | os.O_NOFOLLOW)
        tag = _dumps({"type": "detail", "segment": segment, "header_at": self._header_at,
                      "first_step": first_step})
        try:
            _append_whole(fd, tag, 0)
        except OSError:
            os.close(fd)
            raise
        self._detail_fd, self._detail_pos = fd, len(tag)

    def _close_detail(self) -> None:
        fd, self._detail_fd = self._detail_fd, None
        _close_quietly(fd)

    def _free_detail(self) -> bool:
        """Empty both detail files (they only repeat the latest steps in full): room for
        the main log's records when the disk is full. Whether that freed anything; the
        detail starts again at the next interval."""
        self._close_detail()
        freed = False
        for name in detail_names(self.rank):
            p = self.run_dir / DETAIL_DIR / name
            try:
                if p.stat().st_size:
                    os.truncate(p, 0)
                    freed = True
            except OSError:
                pass
        return freed

    def _end(self, rec: dict) -> dict:
        out = {**rec, "dropped": self.dropped}
        if self.lost:
            out.update(lost=self.lost, lost_steps=self.lost_steps, write_error=self.write_error)
        return out

    def _units(self, snap: tuple, final: bool) -> None:
        step, steps, end_unix, scalars, max_step, compute, comm, detail_steps, fw = snap
        self._check_place()  # at least at every interval line (and every CHECK_S)
        prev = self._prev_cum
        if prev is not None and step <= prev[0]:  # no step since the last interval
            if final:
                self._total(snap)
            return
        first = prev[0] + 1 if prev else 1
        pscal = prev[3] if prev else (0.0,) * 8
        pcomp = prev[5] if prev else {}
        pcomm = prev[6] if prev else {}
        zero = (0, 0, 0.0, 0.0, 0.0)
        d_comp = {k: v - pcomp.get(k, 0.0) for k, v in compute.items()}
        pfw = prev[8] if prev else {}
        d_fw = {k: v - pfw.get(k, 0.0) for k, v in fw.items()}
        d_comm = {}
        for k, v in comm.items():
            p = pcomm.get(k, zero)
            d_comm[k] = (v[0] - p[0], v[1] - p[1], v[2] - p[2], v[3] - p[3], v[4] - p[4])
        base = {"step_s": scalars[0] - pscal[0], "optimizer_s": scalars[1] - pscal[1],
                "framework_s": scalars[2] - pscal[2], "other_s": scalars[3] - pscal[3],
                "self_s": scalars[4] - pscal[4], "host_compute_s": scalars[5] - pscal[5]}
        base = {k: short(v) for k, v in base.items()}
        base["launch"] = [scalars[6] - pscal[6], scalars[7] - pscal[7]]
        sampled = {} if detail_steps is None else \
            {"detail_steps": detail_steps - ((prev[7] or 0) if prev else 0)}
        self._main({"type": "interval", "first": first, "last": step,
                    "steps": steps - (prev[1] if prev else 0), **sampled, "end_unix": end_unix,
                    "header_at": self._header_at, **base, "max_step_s": self._interval_max,
                    "units": self._columns(d_comp, d_comm, skip_zero=True, framework=d_fw)})
        self._interval_max = 0.0
        warmup = first == 1 and step == 1  # step 1 alone: not an interval of the cadence
        self._wrote_warmup = self._wrote_warmup or warmup
        self._intervals += not warmup
        self._prev_cum = snap
        if (self._intervals % self.totals_every == 0 and not warmup) or final:
            self._total(snap)
        if self.detail and not final and not warmup and self.off is None:
            self._switch_detail(self.segment, first_step=step + 1)

    def _total(self, snap: tuple) -> None:
        step, steps, end_unix, scalars, max_step, compute, comm, detail_steps, fw = snap
        sampled = {} if detail_steps is None else {"detail_steps": detail_steps}
        self._main({"type": "total", "step": step, "steps": steps, **sampled,
                    "end_unix": end_unix,
                    "header_at": self._header_at, "step_s": short(scalars[0]),
                    "optimizer_s": short(scalars[1]), "framework_s": short(scalars[2]),
                    "other_s": short(scalars[3]), "self_s": short(scalars[4]),
                    "host_compute_s": short(scalars[5]),
                    "launch": [scalars[6], scalars[7]], "max_step_s": short(max_step),
                    # a reader that takes the warm-up line off these totals needs this max
                    **({"max_step_s_past_warmup": self._max_past_warmup}
                       if self._wrote_warmup else {}),
                    "units": self._columns(compute, comm, skip_zero=False, framework=fw)})

    def _columns(self, compute: dict, comm: dict, skip_zero: bool,
                 framework: dict | None = None) -> dict:
        idx = self._unit_index

        def by_phase(secs: dict) -> list:
            groups: dict[str, dict] = {}
            for (unit, phase), s in secs.items():
                if skip_zero and s == 0.0 or unit not in idx:
                    continue
                g = groups.setdefault(phase, {"phase": phase, "unit": [], "seconds": []})
                g["unit"].append(idx[unit])
                g["seconds"].append(s)
            for g in groups.values():
                g["seconds"] = _short_list(g["seconds"])
                _compact(g, ())
            return list(groups.values())
        mgroups: dict[tuple, dict] = {}
        for (unit, phase, coll), v in comm.items():
            if skip_zero and v[0] == 0 or unit not in idx:
                continue
            g = mgroups.setdefault((phase, coll), {
                "phase": phase, "collective": coll, "unit": [], "count": [], "bytes": [],
                "seconds": [], "exposed": [], "hidden": []})
            g["unit"].append(idx[unit])
            for name, x in zip(("count", "bytes", "seconds", "exposed", "hidden"), v):
                g[name].append(x)
        for g in mgroups.values():
            for name in ("seconds", "exposed", "hidden"):
                g[name] = _short_list(g[name])
            _compact(g, ("count", "bytes", "exposed", "hidden"))
        out = {"compute": by_phase(compute), "comm": list(mgroups.values())}
        fw = by_phase(framework) if framework else []
        if fw:  # the framework's time per unit (absent: not recorded, as in older logs)
            out["framework"] = fw
        return out
