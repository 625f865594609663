"""The run-log follower at scale (issue 33 item 4): it keeps each log open between polls and
reads only what was appended, and that never shows a stale figure. Every poll's windows
equal those of a fresh read of the same directory (a new follower reading each log's tail
backwards, no state carried), and the newest step lines on disk say the same (the file
itself, parsed here); a new rank's log, a log whose path names another file (moved away and
written again), and the held files' bound all show up as a fresh read would see them."""

from __future__ import annotations

import json
import os
import time

import pytest

from tests.support.runlogfaults import hand_step, writer_of
from zerodoc.sources import RunDirSource
from zerodoc.testing.synthetic import append_steps, close_run, write_run

UNITS = 4


def _numbers(snap) -> dict:
    """Every figure of every rank's window (per-unit totals from the arrays a read at scale
    keeps, then from its dicts), and what the snapshot says of the ranks."""
    out = {}
    for r, w in snap.ranks.items():
        arr = getattr(w, "unit_arrays", None)
        if arr is not None:
            ck, cv, mk, mv = arr
            out[(r, "arrays")] = (ck, tuple(cv.tolist()), mk, tuple(map(tuple, mv.tolist())))
        out[(r, "window")] = (
            w.steps, w.first_step, w.last_step, w.step_seconds, w.optimizer_seconds,
            w.framework_seconds, w.compute_total, w.exposed_total, w.detail_steps,
            w.window_samples, tuple(w.step_times), tuple(w.exposed_times), w.updated_unix,
            w.warmup_left_out, w.max_step_seconds)
        out[(r, "compute")] = tuple(sorted(w.compute.items()))
        out[(r, "comm")] = tuple(sorted((k, t.count, t.bytes, t.seconds, t.exposed_seconds)
                                        for k, t in w.comm.items()))
    out["ranks"] = (sorted(snap.ranks), sorted(snap.ended_ranks), sorted(snap.stale_ranks),
                    sorted(snap.missing_ranks), tuple(snap.log_notes))
    return out


def _leaves(x) -> list:
    if isinstance(x, (tuple, list)):
        return [v for e in x for v in _leaves(e)]
    return [x]


def _same(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for k in want:  # running sums against a fresh fold: equal to rounding
        a, b = _leaves(got[k]), _leaves(want[k])
        assert len(a) == len(b), k
        for x, y in zip(a, b):
            if isinstance(y, float) and not isinstance(x, str):
                assert x == pytest.approx(y, rel=1e-9, abs=1e-12), (k, x, y)
            else:
                assert x == y, (k, x, y)


def _on_disk(path, window: int) -> tuple[int, float]:
    """(newest step, sum of the newest `window` steps' step_s) from the log's own lines."""
    steps = [json.loads(x) for x in path.read_bytes().splitlines()
             if x.startswith(b'{"type":"step"')]
    return steps[-1]["step"], sum(s["step_s"] for s in steps[-window:])


@pytest.mark.parametrize("detail", [False, True], ids=["at-scale", "full-detail"])
def test_each_poll_equals_a_fresh_read(tmp_path, detail):
    """Steps appended 1, 2, 1, 3 and 1 at a time, across interval lines (every 4 steps):
    after each, the followed windows equal a fresh read's and the file's own step lines."""
    run = write_run(tmp_path / "run", ranks=3, units=UNITS, steps=6, end=False,
                    every_steps=4, started_unix=time.time() - 30)
    try:
        src = RunDirSource(run, window=5, detail=detail)
        src.snapshot()
        step = 7
        for n in (1, 2, 1, 3, 1):
            append_steps(run, ranks=3, units=UNITS, first_step=step, count=n,
                         end_unix=time.time())
            step += n
            got = src.snapshot()
            fresh = RunDirSource(run, window=5, detail=detail).snapshot()
            _same(_numbers(got), _numbers(fresh))
            last, step_s = _on_disk(run / "rank-00001.jsonl", 5)
            assert got.ranks[1].last_step == last == step - 1
            assert got.ranks[1].step_seconds == pytest.approx(step_s, rel=1e-9)
        assert src.follower._held == 3  # the logs stayed open between polls
    finally:
        close_run(run)


def test_a_new_rank_and_a_log_written_again_elsewhere_show_up(tmp_path):
    """Rank 2's log appears after the first poll: the next poll shows it. Rank 0's log is
    moved away (rotated) and a new writer starts a log at its path: the follower reads the
    new file, not the one it kept open (which no longer grows)."""
    run = tmp_path / "run"
    reps = [writer_of(run, r, 3, None) for r in (0, 1)]
    for s in range(1, 6):
        for rep in reps:
            hand_step(rep, s)
    for rep in reps:
        rep.writer.flush()
    src = RunDirSource(run, window=5, detail=False)
    snap = src.snapshot()
    assert sorted(snap.ranks) == [0, 1] and snap.missing_ranks == {2}
    late = writer_of(run, 2, 3, None)
    for s in range(1, 4):
        hand_step(late, s)
    late.writer.flush()
    snap = src.snapshot()
    assert sorted(snap.ranks) == [0, 1, 2] and snap.ranks[2].last_step == 3
    assert not snap.missing_ranks
    # rotated: rank 0's log moved aside, a new writer (a restarted rank) at its path
    reps[0].close(end=False)
    os.rename(run / "rank-00000.jsonl", run / "rank-00000.jsonl.1")
    again = writer_of(run, 0, 3, None)
    for s in range(1, 8):
        hand_step(again, s)
    again.writer.flush()
    snap = src.snapshot()
    fresh = RunDirSource(run, window=5, detail=False).snapshot()
    assert snap.ranks[0].last_step == fresh.ranks[0].last_step == 7
    assert snap.ranks[0].steps == fresh.ranks[0].steps == 5
    _same(_numbers(snap), _numbers(fresh))
    for rep in (reps[1], late, again):
        rep.close()


def test_held_logs_are_bounded_and_released(tmp_path):
    """With room for 2 open logs, 4 ranks are all followed (the others opened at each poll
    that finds them grown); a log gone from the directory has its file closed."""
    run = write_run(tmp_path / "run", ranks=4, units=UNITS, steps=4, end=False,
                    every_steps=4, started_unix=time.time() - 30)
    try:
        src = RunDirSource(run, window=5, detail=False)
        src.follower.hold_max = 2
        src.snapshot()
        append_steps(run, ranks=4, units=UNITS, first_step=5, count=2, end_unix=time.time())
        snap = src.snapshot()
        assert [snap.ranks[r].last_step for r in range(4)] == [6] * 4
        assert src.follower._held == 2
        held = [t for t in src.follower._tails.values() if t.file is not None]
        assert len(held) == 2
        gone = held[0]
        os.unlink(gone.path)
        src.snapshot()
        assert gone.file is None and src.follower._held == 1
    finally:
        close_run(run)
