"""Faults of a rank's run log made for real (issue 32, item 3), shared by
tests/test_runlog_faults.py and bench/chaos_runlog.py: writers of a job (a `Replay` over the
real `RunLogWriter`, with the header's `job_id`), logrotate's copytruncate, the other end of
a FIFO, a deadline for what would block."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import threading
import time
from pathlib import Path

from zerodoc.runlog import RunLogWriter
from zerodoc.runlog.replay import Replay
from zerodoc.sources import RunDirSource
from zerodoc.testing.synthetic import rank_facts, step_record


def in_time(fn, timeout: float = 10.0, unblock=None):
    """fn() in a thread, which must return within `timeout` seconds (a blocking open never
    does: `unblock()` then frees it so that the test process can end)."""
    out: dict = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            out["error"] = e
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        if unblock is not None:
            unblock()
        raise AssertionError(f"blocked: still running after {timeout:g} s")
    if "error" in out:
        raise out["error"]
    return out["value"]


def free_fifo(path: Path):
    """Open the FIFO's other end (non-blocking), so that an open waiting on it returns."""
    def unblock():
        for flags in (os.O_RDONLY | os.O_NONBLOCK, os.O_WRONLY | os.O_NONBLOCK):
            try:
                os.close(os.open(path, flags))
            except OSError:
                pass
    return unblock


def writer_of(run_dir: Path, rank: int, world: int, job: str | None, **kw) -> Replay:
    """A rank of job `job` (the header's `job_id`) writing `run_dir` through the real
    writer, as attach() would (2 units, an interval every 4 steps)."""
    facts = dataclasses.replace(rank_facts(rank, world, 2, run_id=run_dir.name), job_id=job)
    return Replay(RunLogWriter(run_dir, rank, every_steps=kw.pop("every_steps", 4), **kw),
                  facts, step_clock=False)


def hand_step(rep: Replay, step: int, end_unix: float | None = None) -> None:
    """Hand one synthetic step record to the writer (ended now, or at `end_unix`)."""
    rec, _ = step_record(step, rep.facts.rank, rep.facts.world_size, 2,
                         end_unix if end_unix is not None else time.time())
    rep.step(rec)


def followed_then_cut(run: Path, reps: list[Replay], steps: int):
    """`steps` steps of each writer, read by a run-directory source (as the TUI does), then
    rank 0's log copied aside and truncated in place: (the source, rank 0's log)."""
    for s in range(1, steps + 1):
        for rep in reps:
            hand_step(rep, s)
    for rep in reps:
        rep.writer.flush()
    src = RunDirSource(run, window=5, stale_after_s=1.0)
    assert src.snapshot().ranks[0].last_step == steps
    path = run / "rank-00000.jsonl"
    copytruncate(path)
    return src, path


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_bytes().splitlines() if x.strip()]


def copytruncate(path: Path) -> int:
    """What logrotate's copytruncate does: copy the log aside, truncate it in place."""
    shutil.copy(path, str(path) + ".1")
    size = path.stat().st_size
    os.truncate(path, 0)
    return size
