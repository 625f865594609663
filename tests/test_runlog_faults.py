"""The run log never blocks and never loses silently (issue 32, item 3).

Faults made for real: a FIFO, a directory in place of a rank's log (a FIFO's blocking open
held a real 2-rank gloo job for good: rank 1 never returned from attach); the run directory
removed while the writer writes; a log truncated in place as logrotate's copytruncate does
(copy, then truncate); a second job started in a run directory a live job writes; the logs of
two jobs in one directory and the rank endpoints of two jobs given to one `report`.

Witnesses: the clock (a blocking open never returns: a deadline), the files on disk (what is
in the reopened log, what the writer left alone), the steps handed over against the steps in
the log and the writer's own loss count (two-sided bounds), and what `report` prints.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
import warnings

import pytest
import torch
import torch.nn as nn

import zerodoc
from tests.support.helpers import wait_until
from tests.support.runlogfaults import (
    followed_then_cut, free_fifo, hand_step, in_time, lines, writer_of,
)
from zerodoc.runlog import load_run, read_rank_log
from zerodoc.sources import EndpointsSource, RunDirSource


# --- not a regular file ------------------------------------------------------------------

def test_a_fifo_in_place_of_the_log_never_blocks_and_is_counted(tmp_path, caplog):
    """A FIFO where rank 1's log belongs: the writer's open returned never (no reader), so
    attach never did. Now: refused at once with one warning naming the path, every record
    counted as lost, the FIFO left alone; `report` on the directory neither blocks (its
    open of the FIFO waited for a writer) nor loses rank 0, and says why rank 1 has no log."""
    run = tmp_path / "run"
    run.mkdir()
    fifo = run / "rank-00001.jsonl"
    os.mkfifo(fifo)
    good = writer_of(run, 0, 2, "jobA")
    with caplog.at_level(logging.WARNING, logger="zerodoc"):
        rep = in_time(lambda: writer_of(run, 1, 2, "jobA"), unblock=free_fifo(fifo))
    said = [r.getMessage() for r in caplog.records if str(fifo) in r.getMessage()]
    assert len(said) == 1 and "a FIFO" in said[0], said
    for s in (1, 2, 3):
        hand_step(good, s)
        hand_step(rep, s)
    good.close()
    rep.close()
    assert rep.writer.off and rep.writer.lost_steps == 3
    # every record counted: as many as rank 0, handed the same, wrote
    assert rep.writer.lost == len(lines(run / "rank-00000.jsonl"))
    assert fifo.is_fifo()
    snap = in_time(lambda: load_run(run, None), unblock=free_fifo(fifo))
    assert sorted(snap.ranks) == [0] and snap.missing_ranks == {1}
    assert any("rank-00001.jsonl is a FIFO" in n and "rank 1" in n for n in snap.log_notes), \
        snap.log_notes
    detail = run / "detail" / "00000-b.jsonl"  # and where a detail file belongs (the TUI)
    detail.unlink(missing_ok=True)
    os.mkfifo(detail)
    snap = in_time(lambda: RunDirSource(run, window=5).snapshot(), unblock=free_fifo(detail))
    assert sorted(snap.ranks) == [0] and snap.ranks[0].last_step == 3


@pytest.mark.parametrize("what", ["a directory", "a character device"])
def test_a_directory_or_device_in_place_of_the_log_is_said_not_silent(tmp_path, caplog, what):
    """A directory where rank 1's log belongs: the rank wrote no log and nothing said why
    (the attach-time warning is given by local rank 0 only); a device (a link to /dev/null):
    every record written into it, gone without a word. Now the writer itself warns, naming
    the path, counts the records, and `report` says why rank 1 is missing."""
    run = tmp_path / "run"
    path = run / "rank-00001.jsonl"
    run.mkdir()
    if what == "a directory":
        path.mkdir()
    else:
        path.symlink_to("/dev/null")
    good = writer_of(run, 0, 2, "jobA")
    with caplog.at_level(logging.WARNING, logger="zerodoc"):
        rep = writer_of(run, 1, 2, "jobA")
    said = [r.getMessage() for r in caplog.records if str(path) in r.getMessage()]
    assert len(said) == 1 and f"is {what}" in said[0], said
    hand_step(good, 1)
    hand_step(rep, 1)
    good.close()
    rep.close()
    assert rep.writer.lost_steps == 1
    snap = load_run(run, None)
    assert sorted(snap.ranks) == [0] and snap.missing_ranks == {1}
    assert any(f"rank-00001.jsonl is {what}" in n for n in snap.log_notes), snap.log_notes


@pytest.mark.slow
def test_a_fifo_in_place_of_a_ranks_log_in_a_real_two_rank_job(tmp_path):
    """The issue's fault as it happened: a real 2-rank gloo job with a FIFO at rank 1's log.
    It hung for good (rank 1 inside attach, rank 0 in its first all-gather); now both ranks
    train to the end, rank 1 warns naming the path, and rank 0's log is whole."""
    run = tmp_path / "fifo"
    run.mkdir()
    fifo = run / "rank-00001.jsonl"
    os.mkfifo(fifo)
    from tests.support.helpers import SMALL_MODEL
    from zerodoc.demo.launch import Job

    unblock = free_fifo(fifo)
    timer = threading.Timer(100, unblock)  # on the code before: free the hung rank, then fail
    timer.start()
    t0 = time.monotonic()
    job = Job(2, {"model": SMALL_MODEL, "steps": 4,
                  "attach": {"run_dir": str(run), "port": False}}).start()
    try:
        codes = job.wait(120)
    finally:
        timer.cancel()
        job.stop()
    took = time.monotonic() - t0
    outs = job.outputs()
    assert codes == [0, 0], outs
    assert took < 100, f"the job was held by the FIFO ({took:.0f} s)"
    said = [x for x in outs[1][1].splitlines() if str(fifo) in x]
    assert len(said) == 1 and "is a FIFO" in said[0] and "training continues" in said[0], \
        outs[1][1]
    assert fifo.is_fifo()
    log0 = read_rank_log(run / "rank-00000.jsonl")
    assert log0.ended and [t.step for t in log0.totals] == [1, 2, 3, 4]


# --- the run directory deleted -----------------------------------------------------------

def test_a_deleted_run_directory_is_made_again_and_the_loss_counted(tmp_path, caplog):
    """The run directory removed mid-run: the writer appended to the deleted file for good
    (every later record and the end record lost, nothing counted, a FileNotFoundError line
    without the path). Now it notices within a second, makes the directory and the log
    again (the header written again, `reopened`), counts the records that went with the old
    file, and ends the new log cleanly. Counted against what is on disk: every step handed
    over after the deletion is in the new log or counted, and no more are counted than are
    missing."""
    run = tmp_path / "run"
    rep = writer_of(run, 0, 1, "jobA")
    for s in (1, 2, 3):
        hand_step(rep, s)
    rep.writer.flush()
    with caplog.at_level(logging.WARNING, logger="zerodoc"):
        shutil.rmtree(run)
        after = []  # steps handed over after the deletion, until the log is there again
        step = 3
        while not (run / "rank-00000.jsonl").exists():
            step += 1
            hand_step(rep, step)
            after.append(step)
            rep.writer.flush()
            assert step < 200, "the writer never made the log again"
            time.sleep(0.02)
        for _ in range(3):
            step += 1
            hand_step(rep, step)
        rep.close()
    said = [r.getMessage() for r in caplog.records if "deleted" in r.getMessage()]
    assert len(said) == 1 and str(run / "rank-00000.jsonl") in said[0], said
    got = lines(run / "rank-00000.jsonl")
    head = got[0]
    assert head["type"] == "header" and head["reopened"]["why"] == "deleted"
    assert head["job_id"] == "jobA" and head["segment"] == 0
    in_new = {x["step"] for x in got if x["type"] == "step"}
    assert max(in_new) == step and got[-1]["type"] == "end"
    missing_after = set(after) - in_new
    w = rep.writer
    assert len(missing_after) <= w.lost_steps <= step - len(in_new), \
        (sorted(missing_after), w.lost_steps, sorted(in_new))
    assert w.lost_steps >= 1 and got[-1]["lost_steps"] == w.lost_steps
    log = read_rank_log(run / "rank-00000.jsonl")
    assert log.ended and log.lost_steps == w.lost_steps
    notes = load_run(run, None).log_notes
    assert any("deleted while the job ran" in n for n in notes), notes


# --- truncated in place ------------------------------------------------------------------

def test_a_log_truncated_in_place_is_said_and_never_a_stopped_rank(tmp_path):
    """copytruncate under a live writer: the lines after the cut had no header; the reader
    dropped the rank as "missing" with no reason and uncounted lines, and a following TUI
    kept the old log, saw no new step and said STOPPED (ZD013, CRITICAL) for a rank that
    closed cleanly. Now the writer writes its header again at the new end, the report says
    the log was truncated and counts the lines without a header (counted here from the file
    itself), and the follower sees the clean end: ended, not stale, no ZD013."""
    from zerodoc.diagnosis import diagnose

    run = tmp_path / "run"
    rep = writer_of(run, 0, 1, "jobA")
    src, path = followed_then_cut(run, [rep], 5)
    step = 5
    while True:  # until the writer has written its header again; read as a TUI does
        step += 1
        hand_step(rep, step)
        rep.writer.flush()
        src.snapshot()
        if any(x["type"] == "header" for x in lines(path)):
            break
        assert step < 200, "the header never came back"
        time.sleep(0.02)
    rep.close()
    raw = path.read_bytes().splitlines()
    at = next(i for i, x in enumerate(raw) if json.loads(x)["type"] == "header")
    head = json.loads(raw[at])
    assert head["reopened"]["why"] == "truncated in place"
    snap = wait_until(lambda: (lambda s: s if 0 in s.ended_ranks else None)(src.snapshot()),
                      10, "the clean end seen through the truncation")
    assert snap.stale_ranks == set() and snap.ranks[0].last_step == step
    assert not [f for f in diagnose(snap) if f.code == "ZD013"]
    assert any("truncated in place" in n for n in snap.log_notes), snap.log_notes
    once = load_run(run, None)
    assert sorted(once.ranks) == [0] and 0 in once.ended_ranks and not once.missing_ranks
    note = next(n for n in once.log_notes if "truncated in place" in n)
    assert f"{at} line(s) before its header" in note, (at, note)


# before the cut: 3 steps (the file grows back past what was read: other bytes where the
# last line read ended), 12 steps (it stays shorter than what was read)
@pytest.mark.parametrize("before", [3, 12], ids=["grows-past", "stays-shorter"])
def test_a_log_truncated_under_a_writer_that_writes_no_header_again(tmp_path, before):
    """The same cut under a writer that does not write its header again (an older zerodoc):
    the follower kept the old log (a shorter file) or read from the middle of a line (a
    longer one); the rank that went on and closed cleanly was then stale, and ZD013 said
    STOPPED. Now it reads the lines after the cut as the same segment's and sees the clean
    end; a one-shot report says how many lines have no header and why, instead of dropping
    the rank without a word."""
    from zerodoc.diagnosis import diagnose

    run = tmp_path / "run"
    rep = writer_of(run, 0, 2, "jobA")
    other = writer_of(run, 1, 2, "jobA")
    rep.writer._check_place = lambda: None  # the older writer: no check, no header again
    src, path = followed_then_cut(run, [rep, other], before)
    last = before + 3
    for s in range(before + 1, last + 1):
        hand_step(rep, s)
        hand_step(other, s)
    rep.close()
    other.close()
    grown = path.stat().st_size > path.with_name(path.name + ".1").stat().st_size
    assert grown == (before == 3)  # the case this parameter makes
    snap = wait_until(lambda: (lambda s: s if {0, 1} <= s.ended_ranks else None)(
        src.snapshot()), 10, "both clean ends")
    assert snap.ranks[0].last_step == last and not snap.stale_ranks
    assert not [f for f in diagnose(snap) if f.code == "ZD013"]
    assert any("rank-00000.jsonl was truncated in place" in n for n in snap.log_notes)
    n = len(path.read_bytes().splitlines())
    once = load_run(run, None)
    assert sorted(once.ranks) == [1] and once.missing_ranks == {0}
    note = next(x for x in once.log_notes if "no header" in x)
    assert note.startswith(f"rank-00000.jsonl: {n} line(s) with no header") and \
        "truncated in place" in note and "rank 0" in note, note


# --- two jobs, one run directory ---------------------------------------------------------

def test_a_second_live_job_in_a_run_directory_is_refused_at_attach(tmp_path, caplog):
    """Job B given the run directory that live job A writes: its rank 1 wrote beside A's
    rank 0 and `report` merged them. Now B's writer is refused at attach (one warning naming
    A's job id and the directory), creates no file there, counts its records, and B trains
    on. Once A has ended, B may use the directory: a new segment in each log."""
    run = tmp_path / "run"
    a0 = writer_of(run, 0, 2, "jobA")
    a1 = writer_of(run, 1, 2, "jobA")  # the same job: both ranks welcome
    with caplog.at_level(logging.WARNING, logger="zerodoc"):
        b2 = writer_of(run, 2, 3, "jobB")  # a rank A does not have: no per-rank lock held
    said = [r.getMessage() for r in caplog.records if "another live job" in r.getMessage()]
    assert len(said) == 1 and "jobA" in said[0] and str(run) in said[0], said
    assert b2.writer.off and b2.writer.other_job == "jobA"
    assert not (run / "rank-00002.jsonl").exists()
    for s in (1, 2):
        hand_step(a0, s)
        hand_step(a1, s)
        hand_step(b2, s)
    b2.close()
    assert b2.writer.lost_steps == 2
    a0.close()
    a1.close()
    assert read_rank_log(run / "rank-00001.jsonl").facts.job_id == "jobA"
    reused = writer_of(run, 0, 3, "jobB")  # A has ended: a new segment of the directory
    assert reused.writer.off is None
    hand_step(reused, 1)
    reused.close()
    log = read_rank_log(run / "rank-00000.jsonl")
    assert (log.facts.job_id, log.segment) == ("jobB", 1)


def test_attach_refuses_a_second_live_job_in_its_run_directory(tmp_path, monkeypatch, caplog):
    """The same through attach(): job A's rank 1 writes the directory (live), then job B
    (another job identity, $ZERODOC_RUN_ID) attaches its rank 0 with the same run_dir: it
    trains on without a log, its empty rank-00000.jsonl not left behind, and job A's rank
    0 Prometheus target (file_sd) is not overwritten by B's serving rank 0."""
    run = tmp_path / "run"
    a1 = writer_of(run, 1, 2, "jobA")
    hand_step(a1, 1)
    target = run / "file_sd" / "rank-00000.json"  # job A's rank 0 serves /metrics
    target.parent.mkdir()
    target.write_text('[{"targets": ["job-a-host:9740"]}]')
    model = nn.Linear(4, 4)
    monkeypatch.setenv("ZERODOC_RUN_ID", "jobB")
    with warnings.catch_warnings(), caplog.at_level(logging.WARNING, logger="zerodoc"):
        warnings.simplefilter("ignore")
        mon = zerodoc.attach(model, port=0, run_dir=str(run))
        assert target.read_text() == '[{"targets": ["job-a-host:9740"]}]'  # A's, untouched
        for _ in range(2):
            model(torch.randn(2, 4)).sum().backward()
            mon.step()
        mon.close()
    a1.close()
    said = [r.getMessage() for r in caplog.records if "another live job" in r.getMessage()]
    assert len(said) == 1 and "jobA" in said[0] and "jobB" in said[0], said
    assert not (run / "rank-00000.jsonl").exists()
    assert target.read_text() == '[{"targets": ["job-a-host:9740"]}]'  # B's close: not removed
    assert mon._writer.lost_steps == 2
    assert read_rank_log(run / "rank-00001.jsonl").ended


def test_report_never_merges_the_ranks_of_two_jobs(tmp_path, capsys):
    """A directory holding job B's rank 0 (world 1) and job A's rank 1 (world 2), as two
    jobs given one directory left it: `report` said "1 ranks", tabulated both and raised
    three ERRORs. Now it shows the job with the most recent activity and names the other."""
    from tests.test_report import report_in_process

    b, a = tmp_path / "shared", tmp_path / "a"
    now = time.time()
    rep_a = [writer_of(a, r, 2, "jobA") for r in (0, 1)]
    for s in (1, 2, 3):
        for r in rep_a:
            hand_step(r, s, now - 600 + s)
    for r in rep_a:
        r.close()
    rep_b = writer_of(b, 0, 1, "jobB")
    for s in (1, 2, 3, 4):
        hand_step(rep_b, s, now - 10 + s)
    rep_b.close()
    shutil.copy(a / "rank-00001.jsonl", b / "rank-00001.jsonl")
    snap = load_run(b, None)
    assert sorted(snap.ranks) == [0] and snap.jobs["shown"]["job_id"] == "jobB"
    assert snap.jobs["left_out"][0]["job_id"] == "jobA"
    r = report_in_process(capsys, str(b), "--window", "0")
    assert r.returncode == 0, r.stderr
    assert "| 1 ranks |" in r.stdout
    note = next(x for x in r.stdout.splitlines() if "2 jobs in this run directory" in x)
    assert "showing job jobB (rank 0" in note and "left out job jobA (rank 1)" in note, note
    j = json.loads(report_in_process(capsys, str(b), "--json").stdout)
    assert j["ranks"] == [0] and any("left out job jobA (rank 1)" in n for n in j["notes"])


@pytest.mark.slow
def test_rank_endpoints_of_two_jobs_are_not_merged(tmp_path):
    """`report 127.0.0.1:9740-9741` over two jobs whose port ranges meet: both serve a rank
    0, and the second silently replaced the first. Now the source keeps the job with the
    most recent activity and names the other with its endpoint. Real exporters: two
    one-process jobs whose run directories have one name (`run_id`), each its own job (the
    exporter's `job_id`, set through $ZERODOC_RUN_ID)."""
    import os
    import subprocess

    from tests.support.helpers import job_command, job_env
    from zerodoc.report import notes

    procs, eps = [], []
    try:
        for name, steps in (("jobA", 2), ("jobB", 3)):  # B steps after A: the newer
            procs.append(subprocess.Popen(job_command("serving_rank", tmp_path / name / "run", steps),
                                          env=job_env(dict(os.environ, ZERODOC_RUN_ID=name)),
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          text=True))
            eps.append(procs[-1].stdout.readline().strip())
        assert all(eps), eps
        snap = EndpointsSource(eps, window=None, settle_s=0).snapshot()
        assert sorted(snap.ranks) == [0] and snap.ranks[0].facts.job_id == "jobB"
        assert snap.ranks[0].last_step == 3
        assert snap.jobs["shown"]["job_id"] == "jobB"
        left = snap.jobs["left_out"]
        assert [(x["job_id"], x["endpoints"]) for x in left] == [("jobA", [eps[0]])]
        note = next(n for n in notes(snap) if "2 jobs at these endpoints" in n)
        assert eps[0] in note and "showing job jobB" in note, note
    finally:
        for p in procs:
            p.stdin.close()
        for p in procs:
            p.wait(60)
