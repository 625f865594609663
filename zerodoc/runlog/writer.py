"""The run-log writer: used inside training jobs. Standard library only; never blocks the
training thread and never raises into it after construction.

The training thread only *hands over* records (`write()`, `write_units()`): a bounded queue,
`put_nowait`, and when the queue is full the record is dropped and counted (`dropped`). A
background thread encodes and writes them. A blocked or slow filesystem therefore stalls
the writer thread, never a step; the records that did not fit are counted, the count is
exported (`zerodoc_runlog_dropped_records_total`) and written to the log (a `dropped`
record) once the filesystem moves again.

Construction (at attach) opens the file, takes an exclusive `flock` (a second writer of the
same rank log is refused: two writers would interleave their lines) and reads the tail of
an existing log to number the new segment. That is bounded, attach-time I/O; from then on
the training thread does none.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import queue
import threading
import time
from pathlib import Path

from .records import SCHEMA, rank_log_name
from .scan import newest_head

DETAIL_DIR = "detail"
_STOP = object()

# os.write, looked up at call time: the writer-never-blocks test puts a blocking one here.
_os_write = os.write


def detail_names(rank: int) -> tuple[str, str]:
    return f"{rank:05d}-a.jsonl", f"{rank:05d}-b.jsonl"


class RunLogBusy(OSError):
    """Another writer holds this rank's run log."""


def _dumps(rec: dict) -> bytes:
    return (json.dumps(rec, separators=(",", ":"), default=str) + "\n").encode()


class RunLogWriter:
    """Writes one rank's run log; see the module docstring and `zerodoc.runlog`.

    every_steps / every_seconds: per-unit interval lines at most this many steps / seconds
    apart; totals_every: a cumulative `total` line every this many intervals; detail: keep
    the steps of the current and the previous interval with their full per-unit detail in
    `detail/`; queue_size: records the hand-over queue holds before it drops.
    """

    def __init__(self, run_dir: str | os.PathLike, rank: int, *, every_steps: int = 100,
                 every_seconds: float = 300.0, totals_every: int = 10, detail: bool = True,
                 queue_size: int = 1024, on_error=None, clock=time.time):
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
        self._unlogged_drops = 0
        self._q: queue.Queue = queue.Queue(maxsize=max(1, int(queue_size)))
        self._closed = False
        self._closing_timeout = 0.0
        # per-unit checkpoints: decided on the training thread (cheap), written by the thread
        self._last_units_step = 0
        self._last_units_time = clock()

        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            self._lock()
            self._pos, self.segment, self._prev_head, torn = self._find_segment()
            if torn:
                self._pos += _os_write(self._fd, b"\n")  # a killed writer's torn last line
        except BaseException:
            os.close(self._fd)
            raise
        self._header_at: int | None = None
        self._unit_index: dict[str, int] = {}
        self._prev_cum: tuple | None = None  # cumulative totals at the last interval line
        self._intervals = 0
        self._interval_max = 0.0  # longest step line written since the last interval
        self._detail_fd: int | None = None
        self._detail_slot = 1
        self._thread = threading.Thread(target=self._run, name=f"zerodoc-runlog-{rank}",
                                        daemon=True)
        self._thread.start()

    # --- set-up (attach time) ----------------------------------------------------------
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
        with open(self.path, "rb") as f:
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
        except queue.Full:
            self.dropped += 1
            self._unlogged_drops += 1

    def write_header(self, facts) -> None:
        rec = {"type": "header", "schema": SCHEMA, "segment": self.segment,
               "prev_header_at": self._prev_head,
               "runlog": {"every_steps": self.every_steps, "every_seconds": self.every_seconds,
                          "totals_every": self.totals_every, "detail": self.detail},
               **(dataclasses.asdict(facts) if dataclasses.is_dataclass(facts) else facts)}
        self._unit_index = {u["name"]: i for i, u in enumerate(rec["units"])}
        self._put(("header", rec))

    def write(self, record: dict) -> None:
        """Hand one record over. A `step` record (with its `compute` / `comm` rows) becomes
        a step line (totals) and, with detail on, a detail line; any other type is written
        as it is."""
        self._put(("step" if record.get("type") == "step" else "record", record))

    def units_due(self, step: int) -> bool:
        """A per-unit interval line is due after this step (every_steps / every_seconds)."""
        return step - self._last_units_step >= self.every_steps or (
            step > self._last_units_step
            and self.clock() - self._last_units_time >= self.every_seconds)

    def write_units(self, totals, final: bool = False) -> None:
        """Hand over a copy of the cumulative totals (a RankWindow since attach): the writer
        writes the interval since the previous one (and every `totals_every` intervals, and
        on close, the cumulative totals). The copy is the only work done here (a few hundred
        entries, once per interval)."""
        if totals.last_step <= self._last_units_step and not final:
            return
        self._last_units_step = totals.last_step
        self._last_units_time = self.clock()
        snap = (totals.last_step, totals.steps, totals.updated_unix,
                (totals.step_seconds, totals.optimizer_seconds, totals.framework_seconds,
                 totals.other_seconds, totals.self_seconds,
                 getattr(totals, "host_compute_seconds", 0.0),
                 getattr(totals, "launch_checks", 0), getattr(totals, "launch_caught_up", 0),
                 getattr(totals, "detail_steps", totals.steps)),
                totals.max_step_seconds,
                dict(totals.compute),
                {k: (t.count, t.bytes, t.seconds, t.exposed_seconds, t.hidden_seconds)
                 for k, t in totals.comm.items()})
        self._put(("units", snap, final))

    def close(self, steps: int, totals=None, timeout: float = 5.0,
              failed: bool = False) -> None:
        """Final interval / total lines (from `totals`), the `end` record (`"failed": true`
        when an exception ended the training: not a clean close), then stop the thread;
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
        self._put(("end", end))
        self._closed = True
        try:
            self._q.put(_STOP, timeout=max(0.0, deadline - time.monotonic()))
        except queue.Full:
            pass
        self._thread.join(max(0.0, deadline - time.monotonic()))
        if not self._thread.is_alive():
            self._close_files()

    def abandon(self, timeout: float = 5.0) -> None:
        """Stop after writing what was handed over, with no final lines and no `end`: what
        a killed job leaves behind (tests, synthetic runs)."""
        if self._closed:
            return
        self._closed = True
        self._q.put(_STOP, timeout=timeout)
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self._close_files()

    def _close_files(self) -> None:
        for fd in (self._detail_fd, self._fd):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every record handed over so far is written (tests, tools)."""
        deadline = time.monotonic() + timeout
        while self._q.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.002)
        return not self._q.unfinished_tasks

    # --- the writer thread -------------------------------------------------------------
    def _run(self) -> None:
        while True:
            item = self._q.get()
            try:
                if item is _STOP:
                    return
                self._handle(*item)
                if self._unlogged_drops:
                    n, self._unlogged_drops = self._unlogged_drops, 0
                    self._main({"type": "dropped", "records": n, "total": self.dropped,
                                "end_unix": self.clock()})
            except Exception as e:  # noqa: BLE001 - counted, the thread carries on
                self.errors += 1
                if self.on_error is not None:
                    try:
                        self.on_error("runlog", e)
                    except Exception:  # noqa: BLE001
                        pass
            finally:
                self._q.task_done()

    def _main(self, rec: dict) -> int:
        data = _dumps(rec)
        at = self._pos
        n = 0
        while n < len(data):
            n += _os_write(self._fd, data[n:])
        self._pos += n
        self.written += 1
        return at

    def _handle(self, kind: str, *rec) -> None:
        rec = rec[0] if kind != "units" else rec
        if kind == "header":
            self._header_at = self._main(rec)
            if self.detail:
                self._switch_detail(rec["segment"], first_step=1)
        elif kind == "step":
            light = {k: v for k, v in rec.items() if k not in ("compute", "comm")}
            self._main(light)
            self._interval_max = max(self._interval_max, float(rec.get("step_s", 0.0)))
            if self._detail_fd is not None:
                data = _dumps(rec)
                n = 0
                while n < len(data):
                    n += _os_write(self._detail_fd, data[n:])
        elif kind == "units":
            self._units(*rec)
        elif kind == "end":
            self._main({**rec, "dropped": self.dropped})
        else:
            self._main(rec)

    def _switch_detail(self, segment: int, first_step: int) -> None:
        """Make the other detail file current: truncate it, tag it with this segment."""
        self._detail_slot ^= 1
        path = self.run_dir / DETAIL_DIR / detail_names(self.rank)[self._detail_slot]
        path.parent.mkdir(exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        old, self._detail_fd = self._detail_fd, fd
        if old is not None:
            os.close(old)
        _os_write(fd, _dumps({"type": "detail", "segment": segment,
                              "header_at": self._header_at, "first_step": first_step}))

    def _units(self, snap: tuple, final: bool) -> None:
        step, steps, end_unix, scalars, max_step, compute, comm = snap
        prev = self._prev_cum
        if prev is not None and step <= prev[0]:  # no step since the last interval
            if final:
                self._total(snap)
            return
        first = prev[0] + 1 if prev else 1
        pscal = prev[3] if prev else (0.0,) * 9
        pcomp = prev[5] if prev else {}
        pcomm = prev[6] if prev else {}
        zero = (0, 0, 0.0, 0.0, 0.0)
        d_comp = {k: v - pcomp.get(k, 0.0) for k, v in compute.items()}
        d_comm = {}
        for k, v in comm.items():
            p = pcomm.get(k, zero)
            d_comm[k] = (v[0] - p[0], v[1] - p[1], v[2] - p[2], v[3] - p[3], v[4] - p[4])
        base = {"step_s": scalars[0] - pscal[0], "optimizer_s": scalars[1] - pscal[1],
                "framework_s": scalars[2] - pscal[2], "other_s": scalars[3] - pscal[3],
                "self_s": scalars[4] - pscal[4], "host_compute_s": scalars[5] - pscal[5],
                "launch": [scalars[6] - pscal[6], scalars[7] - pscal[7]],
                # the steps the interval's per-unit numbers come from (sampling.py)
                "detail_steps": scalars[8] - pscal[8]}
        self._main({"type": "interval", "first": first, "last": step,
                    "steps": steps - (prev[1] if prev else 0), "end_unix": end_unix,
                    "header_at": self._header_at, **base, "max_step_s": self._interval_max,
                    "units": self._columns(d_comp, d_comm, skip_zero=True)})
        self._interval_max = 0.0
        self._intervals += 1
        self._prev_cum = snap
        if self._intervals % self.totals_every == 0 or final:
            self._total(snap)
        if self.detail and not final:
            self._switch_detail(self.segment, first_step=step + 1)

    def _total(self, snap: tuple) -> None:
        step, steps, end_unix, scalars, max_step, compute, comm = snap
        self._main({"type": "total", "step": step, "steps": steps, "end_unix": end_unix,
                    "header_at": self._header_at, "step_s": scalars[0],
                    "optimizer_s": scalars[1], "framework_s": scalars[2],
                    "other_s": scalars[3], "self_s": scalars[4], "host_compute_s": scalars[5],
                    "launch": [scalars[6], scalars[7]], "detail_steps": scalars[8],
                    "max_step_s": max_step,
                    "units": self._columns(compute, comm, skip_zero=False)})

    def _columns(self, compute: dict, comm: dict, skip_zero: bool) -> dict:
        idx = self._unit_index
        cgroups: dict[str, dict] = {}
        for (unit, phase), s in compute.items():
            if skip_zero and s == 0.0 or unit not in idx:
                continue
            g = cgroups.setdefault(phase, {"phase": phase, "unit": [], "seconds": []})
            g["unit"].append(idx[unit])
            g["seconds"].append(s)
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
        return {"compute": list(cgroups.values()), "comm": list(mgroups.values())}
