"""Fault rows of issue 32 for the run log (`bench/chaos.py --only faults`).

    rows(tmp) -> [{"fault", "said", "slowdown", "lost", "note"}]

Each fault is made for real (tests/support/runlogfaults.py, the same as
tests/test_runlog_faults.py):
- a FIFO in place of rank 1's log of a live 2-rank gloo demo job (it held the job for good:
  rank 1 never returned from attach): rank 1's own warning, the job's wall time;
- a directory in place of a rank's log, the run directory deleted mid-run, a log truncated
  in place (logrotate's copytruncate), a second job attaching to a directory a live job
  writes, and `report` on a directory holding two jobs' logs: the real writer and readers
  in this process; what zerodoc said is its warning (the `zerodoc` logger) or the report's
  line;
- the rank endpoints of two jobs given to one source: two one-process jobs serving /metrics.
slowdown: None: the writer's checks run on its own thread (one stat a second); the one job
that trains here (the FIFO) is timed, not compared (its note). lost: the records the writer
counted as lost (rank 1's steps for the FIFO: it trained them, none is in a log).
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import time
from pathlib import Path

STEPS = 4


class _Said(logging.Handler):
    """The zerodoc logger's warnings while a fault is made."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record) -> None:
        self.lines.append(record.getMessage())

    def __enter__(self):
        logging.getLogger("zerodoc").addHandler(self)
        return self

    def __exit__(self, *exc) -> None:
        logging.getLogger("zerodoc").removeHandler(self)

    def first(self, text: str) -> str:
        return next((x for x in self.lines if text in x), f"nothing said ({text!r} awaited)")


def _short(s: str, tmp: Path) -> str:
    return s.replace(str(tmp), "TMP")[:220]


def _fifo_row(tmp: Path) -> dict:
    from tests.support.helpers import SMALL_MODEL
    from zerodoc.demo.launch import Job
    from zerodoc.runlog import load_run

    from tests.support.runlogfaults import free_fifo

    run = tmp / "fifo"
    run.mkdir(parents=True)
    fifo = run / "rank-00001.jsonl"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    job = Job(2, {"model": SMALL_MODEL, "steps": STEPS,
                  "attach": {"run_dir": str(run), "port": False}}).start()
    try:
        codes = job.wait(90)
    finally:
        free_fifo(fifo)()  # a job held by it (the code before) is freed, and says so
        job.stop()
    took = time.monotonic() - t0
    err = job.outputs()[1][1]
    said = next((x for x in err.splitlines() if str(fifo) in x), "rank 1 said nothing")
    notes = load_run(run, None).log_notes if codes == [0, 0] else []
    return {"fault": "FIFO in place of rank 1's run log (live 2-rank job)",
            "said": _short(said, tmp), "slowdown": None,
            "lost": STEPS if codes == [0, 0] else None,
            "note": f"exit codes {codes}, {took:.0f} s for {STEPS} steps; report: "
                    + _short("; ".join(notes) or "-", tmp)}


def _directory_row(tmp: Path) -> dict:
    from tests.support.runlogfaults import hand_step, writer_of

    run = tmp / "dir"
    (run / "rank-00001.jsonl").mkdir(parents=True)
    with _Said() as said:
        rep = writer_of(run, 1, 2, "jobA")
    for s in range(1, STEPS + 1):
        hand_step(rep, s)
    rep.close()
    return {"fault": "directory in place of a rank's run log", "slowdown": None,
            "said": _short(said.first("no run log"), tmp), "lost": rep.writer.lost,
            "note": f"{rep.writer.lost_steps} steps counted as lost; the rank trains on"}


def _deleted_row(tmp: Path) -> dict:
    from tests.support.runlogfaults import hand_step, lines, writer_of

    run = tmp / "deleted"
    rep = writer_of(run, 0, 1, "jobA")
    step = 0
    with _Said() as said:
        for step in range(1, 4):
            hand_step(rep, step)
        rep.writer.flush()
        shutil.rmtree(run)
        t0 = time.monotonic()
        while not (run / "rank-00000.jsonl").exists() and step < 500:
            step += 1
            hand_step(rep, step)
            rep.writer.flush()
            time.sleep(0.02)
        back = time.monotonic() - t0
        for _ in range(3):  # and on, in the log made again
            step += 1
            hand_step(rep, step)
        rep.close()
    kept = sum(1 for x in lines(run / "rank-00000.jsonl") if x["type"] == "step") \
        if (run / "rank-00000.jsonl").exists() else 0
    return {"fault": "run directory deleted mid-run", "slowdown": None,
            "said": _short(said.first("deleted"), tmp), "lost": rep.writer.lost,
            "note": f"log made again {back:.1f} s after the deletion; {kept} of {step} steps "
                    f"in the new log, {rep.writer.lost_steps} counted as lost (the rest went "
                    "with the deleted directory, as asked)"}


def _truncated_row(tmp: Path) -> dict:
    from tests.support.runlogfaults import followed_then_cut, hand_step, lines, writer_of
    from zerodoc.diagnosis import diagnose
    from zerodoc.runlog import load_run

    run = tmp / "truncated"
    rep = writer_of(run, 0, 1, "jobA")
    src, path = followed_then_cut(run, [rep], 5)
    step = 5
    with _Said() as said:
        while not any(x["type"] == "header" for x in lines(path)) and step < 500:
            step += 1
            hand_step(rep, step)
            rep.writer.flush()
            src.snapshot()
            time.sleep(0.02)
        rep.close()
    snap = src.snapshot()
    stopped = [f.code for f in diagnose(snap) if f.code == "ZD013"]
    note = next((n for n in load_run(run, None).log_notes if "truncated" in n), "not said")
    return {"fault": "run log truncated in place (logrotate copytruncate)", "slowdown": None,
            "said": _short(note, tmp), "lost": rep.writer.lost,
            "note": f"writer: {_short(said.first('truncated'), tmp)[:80]}…; the follower "
                    f"(TUI): ended {sorted(snap.ended_ranks)}, stale {sorted(snap.stale_ranks)},"
                    f" ZD013 {'raised' if stopped else 'not raised'}"}


def _second_job_row(tmp: Path) -> dict:
    from tests.support.runlogfaults import hand_step, writer_of

    run = tmp / "twojobs"
    a = writer_of(run, 0, 2, "jobA")
    with _Said() as said:
        b = writer_of(run, 1, 2, "jobB")
    for s in range(1, STEPS + 1):
        hand_step(a, s)
        hand_step(b, s)
    b.close()
    a.close()
    return {"fault": "second job attaches to a run directory a live job writes",
            "said": _short(said.first("another live job"), tmp), "slowdown": None,
            "lost": b.writer.lost,
            "note": f"job B's rank 1 wrote {'a' if (run / 'rank-00001.jsonl').exists() else 'no'}"
                    " file there; it trains on, its records counted as lost"}


def _report_row(tmp: Path) -> dict:
    from tests.support.runlogfaults import hand_step, writer_of
    from zerodoc.runlog import load_run
    from zerodoc.report import notes

    shared, other = tmp / "shared", tmp / "other"
    now = time.time()
    reps = [writer_of(other, r, 2, "jobA") for r in (0, 1)]
    for s in range(1, STEPS + 1):
        for r in reps:
            hand_step(r, s, now - 600 + s)
    for r in reps:
        r.close()
    b = writer_of(shared, 0, 1, "jobB")
    for s in range(1, STEPS + 1):
        hand_step(b, s, now - 10 + s)
    b.close()
    shutil.copy(other / "rank-00001.jsonl", shared / "rank-00001.jsonl")
    snap = load_run(shared, None)
    return {"fault": "report on a directory holding two jobs' logs", "slowdown": None,
            "said": _short("; ".join(notes(snap)) or "nothing said", tmp), "lost": None,
            "note": f"ranks shown {sorted(snap.ranks)} (world size "
                    f"{snap.ranks[0].facts.world_size})"}


def _endpoints_row(tmp: Path) -> dict:
    from tests.support.helpers import job_command, job_env
    from zerodoc.report import notes
    from zerodoc.sources import EndpointsSource

    procs, eps = [], []
    try:
        for name, steps in (("jobA", 2), ("jobB", 3)):
            procs.append(subprocess.Popen(job_command("serving_rank", tmp / name, steps),
                                          env=job_env(), stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, text=True))
            eps.append(procs[-1].stdout.readline().strip())
        snap = EndpointsSource(eps, window=None, settle_s=0).snapshot()
        said = "; ".join(notes(snap)) or "nothing said"
        ranks = sorted(snap.ranks)
    finally:
        for p in procs:
            p.stdin.close()
        for p in procs:
            p.wait(60)
    return {"fault": "rank endpoints of two jobs given to one report", "slowdown": None,
            "said": _short(said, tmp), "lost": None,
            "note": f"ranks shown {ranks} from {len(eps)} endpoints, each serving a rank 0"}


def rows(tmp: Path) -> list[dict]:
    tmp = Path(tmp)
    out = []
    for make in (_fifo_row, _directory_row, _deleted_row, _truncated_row, _second_job_row,
                 _report_row, _endpoints_row):
        try:
            out.append(make(tmp))
        except Exception as e:  # noqa: BLE001 - a row that says so, never a missing one
            out.append({"fault": make.__name__.strip("_").replace("_row", ""),
                        "said": f"the row failed: {type(e).__name__}: {e}"[:220],
                        "slowdown": None, "lost": None, "note": ""})
    return out


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        for row in rows(Path(d)):
            print(row)
