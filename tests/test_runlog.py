"""The run log (schema 2): off the training thread, bounded, read from its end, segmented.

The witnesses: a filesystem write that blocks beneath the writer (the step must return and
every record is either on disk or counted); a real 2-rank gloo job whose interval lines are
checked against the per-step records it also wrote (two code paths of the shim: cumulative
totals and per-step rows); the number of lines a reader parses on a 50,000-step log; a
schema-1 log converted through the real writer giving the same windows and findings.
"""

from __future__ import annotations

import json
import math
import shutil
import threading
import time
import urllib.request
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn as nn

import zerodoc
from tests.support.helpers import run_demo
from zerodoc.runlog import (
    RunFollower, RunLogBusy, RunLogError, RunLogWriter, load_run, log_window, read_rank_log,
    read_rank_tail, window_from_steps,
)
from zerodoc.runlog.replay import Replay
from zerodoc.sources import RunDirSource
from zerodoc.testing import synthetic

DATA = Path(__file__).parent / "data"


def _train(mon, model, steps: int) -> list[float]:
    """`steps` hand-ended steps; returns how long each mon.step() call took."""
    took = []
    for _ in range(steps):
        model(torch.randn(4, 8)).sum().backward()
        t = time.perf_counter()
        mon.step()
        took.append(time.perf_counter() - t)
    return took


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))


def test_a_blocked_filesystem_never_blocks_a_step(tmp_path, monkeypatch):
    """os.write blocks beneath the writer (a hung network filesystem): steps still return at
    once, the queue holds `run_log_queue` records, the rest are dropped and counted (exported
    and, once the filesystem moves again, written to the log); nothing is lost uncounted."""
    import zerodoc.runlog.writer as writer_mod

    gate = threading.Event()
    gate.set()
    real_write = writer_mod._os_write

    def slow_write(fd, data):
        gate.wait()  # blocked until the test lets the filesystem move
        return real_write(fd, data)

    monkeypatch.setattr(writer_mod, "_os_write", slow_write)
    model = _model()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mon = zerodoc.attach(model, port=0, run_dir=str(tmp_path / "run"), run_log_queue=8)
    try:
        _train(mon, model, 2)
        assert mon._writer.flush(10)
        gate.clear()  # the filesystem hangs
        took = _train(mon, model, 60)
        assert max(took) < 0.5, max(took)  # loose: a blocked write would take forever
        dropped = mon._writer.dropped
        assert 60 - 8 - 2 <= dropped <= 60 - 8, dropped  # 8 queued, 1 or 2 in the writer
        with urllib.request.urlopen(f"http://{mon.endpoint}/metrics", timeout=10) as r:
            text = r.read().decode()
        assert f"zerodoc_runlog_dropped_records_total{{" in text
        line = next(x for x in text.splitlines()
                    if x.startswith("zerodoc_runlog_dropped_records_total{"))
        assert float(line.rsplit(" ", 1)[1]) == dropped
    finally:
        gate.set()
        mon.close()
    log = read_rank_log(tmp_path / "run" / "rank-00000.jsonl")
    written = [s.step for s in log.totals]
    assert len(written) + dropped == 62 and written[:2] == [1, 2] and written[-1] <= 62
    drops = [e for e in log.events if e["type"] == "dropped"]
    assert drops and sum(e["records"] for e in drops) == dropped and log.dropped == dropped
    assert log.ended  # the end record made it once the filesystem moved


def test_the_queue_is_bounded_and_the_writer_counts_what_it_cannot_take(tmp_path, monkeypatch):
    import zerodoc.runlog.writer as writer_mod

    gate = threading.Event()
    real_write = writer_mod._os_write
    monkeypatch.setattr(writer_mod, "_os_write", lambda fd, d: (gate.wait(), real_write(fd, d))[1])
    w = RunLogWriter(tmp_path, 0, queue_size=16)
    for i in range(1000):
        w.write({"type": "note", "i": i})
    assert w._q.qsize() <= 16 and w.dropped >= 1000 - 16 - 1
    gate.set()
    w.close(0)
    lines = (tmp_path / "rank-00000.jsonl").read_text().splitlines()
    notes = [json.loads(x) for x in lines if '"note"' in x]
    assert len(notes) + w.dropped == 1000 and lines[-1].startswith('{"type":"end"')


@pytest.mark.slow
def test_interval_lines_equal_the_sum_of_the_steps(tmp_path):
    """A real 2-rank gloo job, an interval every 5 steps, full detail kept: every interval
    line's per-unit totals (from the shim's cumulative totals) equal the sum of the per-step
    records over the same steps (from its per-step rows), and the total line the whole run.
    Per-unit detail on every step: each interval, the warm-up step's own too, then has
    per-unit rows to sum (sampled, the warm-up step has none)."""
    logs = run_demo(tmp_path, "iv", nprocs=2, steps=8,
                    attach={"run_log_every": 5, "detail": "every"})
    for log in logs.values():
        assert [s.step for s in log.steps] == list(range(1, 9))
        intervals = [b for b in log.blocks if b.kind == "interval"]
        totals = [b for b in log.blocks if b.kind == "total"]
        # step 1 (warm-up) has an interval line of its own; the cadence stays 5, 10, ...
        assert [(b.first_step, b.last_step, b.steps) for b in intervals] == \
            [(1, 1, 1), (2, 5, 4), (6, 8, 3)]
        assert [(b.last_step, b.steps) for b in totals] == [(8, 8)]
        for b in intervals + totals:
            ref = window_from_steps(log.facts, [s for s in log.steps
                                                if b.first_step <= s.step <= b.last_step])
            assert math.isclose(b.step_seconds, ref.step_seconds, rel_tol=1e-9)
            assert b.compute.keys() <= ref.compute.keys()
            for k, v in ref.compute.items():
                assert math.isclose(b.compute.get(k, 0.0), v, rel_tol=1e-9, abs_tol=1e-12), k
            # the framework's time per unit (issue 22): every unit has some, as the steps say
            assert ref.unit_framework and b.unit_framework.keys() == ref.unit_framework.keys()
            for k, v in ref.unit_framework.items():
                assert math.isclose(b.unit_framework[k], v, rel_tol=1e-9, abs_tol=1e-12), k
            assert set(b.comm) == set(ref.comm)
            for k, t in ref.comm.items():
                got = b.comm[k]
                assert (got.count, got.bytes) == (t.count, t.bytes), k
                for f in ("seconds", "exposed_seconds", "hidden_seconds"):
                    assert math.isclose(getattr(got, f), getattr(t, f), rel_tol=1e-9,
                                        abs_tol=1e-12), (k, f)
        names = {u.name for u in log.facts.units}
        for full in log.steps:  # every unit's framework time, summing to the step's
            assert {u for u, _p in full.unit_framework} == names
            assert math.isclose(sum(full.unit_framework.values()), full.framework_seconds,
                                rel_tol=1e-9)
        for light, full in zip(log.totals, log.steps):  # step lines: the steps' totals
            assert light.step_seconds == full.step_seconds
            assert math.isclose(light.exposed_seconds, full.exposed_seconds, rel_tol=1e-12,
                                abs_tol=1e-15)
        # all steps, read from the end (total line) = the per-step sum
        w = log_window(read_rank_tail(log.path, None, detail=False), None, detail=False)
        assert w.steps == 8 and math.isclose(
            w.comm_seconds, window_from_steps(log.facts, log.steps).comm_seconds, rel_tol=1e-9)
        # ... and without the warm-up step: the warm-up line taken off the total line
        w = log_window(read_rank_tail(log.path, None, detail=False), None, detail=False,
                       skip_warmup=True)
        ref = window_from_steps(log.facts, log.steps[1:])
        assert (w.first_step, w.steps, w.warmup_left_out) == (2, 7, 1)
        assert math.isclose(w.comm_seconds, ref.comm_seconds, rel_tol=1e-9)
        assert math.isclose(w.compute_seconds, ref.compute_seconds, rel_tol=1e-9)
        assert math.isclose(w.step_seconds, ref.step_seconds, rel_tol=1e-9)
        assert w.max_step_seconds == max(s.step_seconds for s in log.steps[1:])
        assert w.unit_framework.keys() == ref.unit_framework.keys()
        for k, v in ref.unit_framework.items():
            assert math.isclose(w.unit_framework[k], v, rel_tol=1e-9, abs_tol=1e-12), k


def test_seek_from_end_on_a_long_log(tmp_path, monkeypatch):
    """30,000 steps written through the real writer: a window of 20 steps and "all steps"
    parse a few dozen lines, not 30,000 (bounded time and memory; the bench measures them)."""
    run = synthetic.write_run(tmp_path / "long", ranks=1, units=4, steps=30_000, detail=False,
                              started_unix=time.time() - 10**6)
    path = run / "rank-00000.jsonl"
    assert path.stat().st_size > 3e6  # a long log (its step lines shorter since schema 3)
    import zerodoc.runlog.reader as reader

    parsed = []
    real = reader.json.loads

    class CountingJson:
        JSONDecodeError = json.JSONDecodeError

        @staticmethod
        def loads(s):
            parsed.append(len(s))
            return real(s)

    monkeypatch.setattr(reader, "json", CountingJson)
    log = read_rank_tail(path, 20, detail=False)
    w = log_window(log, 20, detail=False)
    assert (w.steps, w.last_step) == (20, 30_000) and w.detail_steps == 100
    assert len(parsed) < 40 and sum(parsed) < 200_000, (len(parsed), sum(parsed))
    parsed.clear()
    log = read_rank_tail(path, None, detail=False)
    w = log_window(log, None, detail=False)
    assert (w.steps, w.first_step, w.last_step) == (30_000, 1, 30_000)
    assert len(parsed) < 40, len(parsed)
    monkeypatch.undo()
    ref = read_rank_log(path, detail=False)  # every line: the same totals
    assert math.isclose(w.step_seconds, sum(s.step_seconds for s in ref.totals), rel_tol=1e-9)


def test_a_restart_starts_a_new_segment(tmp_path):
    """The same run directory used again (torchelastic reusing the run id, a reused
    ZERODOC_RUN_DIR): a new segment, never step numbers mixed into the old one. Readers show
    the newest segment and can name the older one; a torn last line of the killed first
    incarnation stays in its segment."""
    run = tmp_path / "run"
    model = _model()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mon = zerodoc.attach(model, port=False, run_dir=str(run))
        _train(mon, model, 3)
        mon.close()
        path = run / "rank-00000.jsonl"
        with open(path, "a") as f:
            f.write('{"type":"step","step":4,"end_u')  # killed mid-line
        mon = zerodoc.attach(model, port=False, run_dir=str(run))
        _train(mon, model, 2)
        mon.close()
    new, old = read_rank_log(path), read_rank_log(path, segment=0)
    assert (new.segment, new.segments, old.segment) == (1, 2, 0)
    assert [s.step for s in new.totals] == [1, 2] and [s.step for s in old.totals] == [1, 2, 3]
    assert old.bad_lines == 1 and new.bad_lines == 0 and new.ended and old.ended
    assert load_run(run, window=None).ranks[0].steps == 2
    assert load_run(run, window=None, segment=0).ranks[0].steps == 3
    assert RunDirSource(run, window=None, segment=-2).snapshot().ranks[0].last_step == 3
    assert RunDirSource(run, window=None).snapshot().ranks[0].last_step == 2
    with pytest.raises(RunLogError, match="no segment 7"):
        read_rank_log(path, segment=7)


def test_a_second_writer_of_the_same_rank_log_is_refused(tmp_path):
    w = RunLogWriter(tmp_path, 0)
    with pytest.raises(RunLogBusy, match="another zerodoc monitor"):
        RunLogWriter(tmp_path, 0)
    w.close(0)
    RunLogWriter(tmp_path, 0).close(0)  # once closed, the next one may write


def test_missing_ranks_and_kept_events(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(DATA / "scenarios" / "healthy-block", run)
    (run / "rank-00001.jsonl").unlink()
    snap = load_run(run, window=5, stale_after_s=float("inf"))
    assert sorted(snap.ranks) == [0] and snap.missing_ranks == {1} and snap.ended_ranks == {0}
    assert RunDirSource(run, window=5).snapshot().missing_ranks == {1}
    w = RunLogWriter(tmp_path / "ev", 0)
    w.write_header(synthetic.rank_facts(0, 1, 2))
    w.write({"type": "stall", "step": 3, "where": "blocks.1 forward all_gather"})
    w.close(0)
    log = read_rank_log(tmp_path / "ev" / "rank-00000.jsonl")
    assert log.events == [{"type": "stall", "step": 3, "where": "blocks.1 forward all_gather"}]
    f = RunFollower(tmp_path / "ev")
    f.poll()
    assert f.logs[0].events == log.events


def test_schema_1_is_read_and_converts_to_the_same_windows(tmp_path):
    """Old logs (schema 1) are still read; converted through the real writer they give the
    same windows and findings; a newer schema is a clear error."""
    from zerodoc.diagnosis import diagnose
    from zerodoc.cli.convert import main as convert
    from zerodoc.whatif import Changes, answer, fit

    old = DATA / "schema1" / "wrap-root"
    assert convert([str(old), str(tmp_path / "new")]) == 0
    for window in (None, 3):
        a = load_run(old, window, stale_after_s=float("inf"))
        b = load_run(tmp_path / "new", window, stale_after_s=float("inf"))
        for r in a.ranks:
            x, y = a.ranks[r], b.ranks[r]
            assert (x.steps, x.first_step, x.last_step) == (y.steps, y.first_step, y.last_step)
            assert x.comm.keys() == y.comm.keys() and x.memory == y.memory
            assert math.isclose(x.step_seconds, y.step_seconds, rel_tol=1e-12)
            # no framework time per unit in them: the what-if prices it per step
            assert x.unit_framework == y.unit_framework == {}
        assert [(f.code, f.title) for f in diagnose(a)] == [(f.code, f.title) for f in diagnose(b)]
        assert answer(fit(b), Changes())["framework"]["pricing"] == "per step"
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "rank-00000.jsonl").write_text('{"type": "header", "schema": 4}\n')
    with pytest.raises(RunLogError, match="schema 4.*newer zerodoc"):
        load_run(bad)


def test_units_parameter_tensors_recorded_read_back_absent_not_recorded(tmp_path):
    """The units' parameter tensors (the what-if's framework fit per tensor): a header that
    has them reads them back, one without them (a log written before zerodoc recorded them)
    reads as not recorded (None, not 0), a bad count is a clear error."""
    src = DATA / "scenarios" / "healthy-block"
    old = load_run(src, None, stale_after_s=float("inf"))
    assert all(u.tensors is None for u in old.any_rank.facts.units)
    for name, value in (("new", 12), ("bad", -1)):
        d = tmp_path / name
        shutil.copytree(src, d)
        for log in d.glob("rank-*.jsonl"):
            lines = log.read_text().splitlines()
            head = json.loads(lines[0])
            assert all("tensors" not in u for u in head["units"])
            for u in head["units"]:
                u["tensors"] = value
            log.write_text("\n".join([json.dumps(head), *lines[1:]]) + "\n")
    new = load_run(tmp_path / "new", None, stale_after_s=float("inf"))
    assert [u.tensors for u in new.any_rank.facts.units] == [12] * len(head["units"])
    with pytest.raises(RunLogError, match="unit tensors"):
        load_run(tmp_path / "bad", None, stale_after_s=float("inf"))


def test_a_unit_key_from_a_newer_zerodoc_is_left_out_not_an_error(tmp_path):
    """A header written by a newer zerodoc may give its units a key this one does not know:
    the log stays readable (review of 2026-11-27: an older reader refused every log with
    `tensors` in it, "unexpected keyword argument")."""
    src = DATA / "scenarios" / "healthy-block"
    d = tmp_path / "newer"
    shutil.copytree(src, d)
    for log in d.glob("rank-*.jsonl"):
        lines = log.read_text().splitlines()
        head = json.loads(lines[0])
        for u in head["units"]:
            u["a_field_from_the_future"] = {"x": 1}
        log.write_text("\n".join([json.dumps(head), *lines[1:]]) + "\n")
    snap = load_run(d, None, stale_after_s=float("inf"))
    ref = load_run(src, None, stale_after_s=float("inf"))
    assert snap.any_rank.facts.units == ref.any_rank.facts.units


@pytest.mark.parametrize("k", [1, 8])
def test_run_log_bytes_per_step_at_81_units(tmp_path, k):
    """The budget: at most 1 KiB per step per rank on disk at 81 units over 240 steps, the
    header left out, with every row a real run writes (the framework's time per unit, the
    step's collectives, sampled and lean steps; `runlogbytes`): <= 960 B, leaving the
    per-step records other parts add (issue 34's collective sequence numbers) room under
    1,024 (1,056-1,081 B before issue 33's encoding). Full detail stays bounded."""
    from zerodoc.testing.runlogbytes import measure

    got = measure(units=81, steps=240, k=k, run_dir=tmp_path / "m")
    assert got["lines"]["interval"]["n"] == 4 and got["lines"]["total"]["n"] == 1, got
    assert got["bytes_per_step"] <= 960, got
    # the framework's columns are there: read back per unit, in every interval line
    log = read_rank_log(tmp_path / "m" / "rank-00001.jsonl")
    assert all(len(b.unit_framework) == 2 * 81 for b in log.blocks if b.steps > 0)
    run = synthetic.write_run(tmp_path / "b", ranks=1, units=81, steps=400)
    detail = sum(p.stat().st_size for p in (run / "detail").iterdir())
    assert detail < 201 * 40_000  # the current and the previous interval at most
    rep = Replay(RunLogWriter(tmp_path / "c", 0), synthetic.rank_facts(0, 1, 81))
    for s in range(1, 5):
        rep.step(synthetic.step_record(s, 0, 1, 81, 1.0e9 + s)[0])
    rep.close()
    assert read_rank_log(tmp_path / "c" / "rank-00000.jsonl").ended


def test_big_run_reading_equals_full_detail_when_the_window_is_an_interval(tmp_path):
    """The path a thousand-rank run is read by (step lines, interval lines as arrays, stats
    across ranks in numpy) gives the numbers of the full per-step detail when the window is
    exactly one interval; a missing rank shows in the TUI's frame."""
    from zerodoc.diagnosis import diagnose
    from zerodoc.tui.feed import Feed
    from zerodoc.unitstats import unit_stats

    run = synthetic.write_run(tmp_path / "r", ranks=4, units=6, steps=20, every_steps=10,
                              straggler=2, started_unix=time.time() - 60, end=False)
    small = RunDirSource(run, window=10, detail=True).snapshot()
    big = RunDirSource(run, window=10, detail=False).snapshot()
    for r in range(4):
        a, b = small.ranks[r], big.ranks[r]
        assert (a.steps, a.first_step, a.last_step) == (b.steps, b.first_step, b.last_step)
        assert b.detail_steps == 10 and getattr(b, "unit_arrays", None) is not None
        assert math.isclose(a.compute_seconds, b.compute_seconds, rel_tol=1e-9)
        assert math.isclose(a.exposed_seconds, b.exposed_seconds, rel_tol=1e-9)
    sa, sb = unit_stats(small, [0, 1, 2, 3]), unit_stats(big, [0, 1, 2, 3])
    assert sa.comm.keys() == sb.comm.keys() and sa.units.keys() == sb.units.keys()
    for k in sa.comm:
        for f in ("count", "bytes", "seconds", "exposed", "hidden"):
            x, y = sa.comm[k][f], sb.comm[k][f]
            assert all(math.isclose(getattr(x, s), getattr(y, s), rel_tol=1e-9, abs_tol=1e-12)
                       for s in ("min", "median", "mean", "max")), (k, f)
    assert [(f.code, f.title) for f in diagnose(small)] == \
        [(f.code, f.title) for f in diagnose(big)]
    synthetic.close_run(run)
    (run / "rank-00003.jsonl").unlink()
    frame = Feed(RunDirSource(run, window=10), diagnose=lambda s: []).fetch()
    assert frame.missing == {3} and sorted(frame.snapshot.ranks) == [0, 1, 2]
