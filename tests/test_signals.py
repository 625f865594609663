"""A run stopped by Ctrl-C or SIGTERM ends its run log (issue 32, item 4): real one-rank FSDP2
jobs (gloo) in a fresh interpreter (tests/support/jobs/signalled.py), signalled by the test
once they have trained three steps. The ground truth is the signal the test sent and the
disposition the job set; the run log's end record and the process's exit status must say
what happened, and SIGTERM must still end the process as it would without zerodoc."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.support.helpers import wait_until
from tests.support.jobs.signalled import finish, start
from tests.test_stopped import lines_of
from zerodoc.runlog import read_rank_log

pytestmark = pytest.mark.slow  # every test starts a job


def records(run: Path) -> list[dict]:
    return lines_of(run, 0)


def end_of(run: Path) -> dict:
    ends = [r for r in records(run) if r.get("type") == "end"]
    assert len(ends) == 1, (ends, [r.get("type") for r in records(run)][-5:])
    return ends[0]


@pytest.mark.parametrize("mode", ["readme", "after_loop"])
def test_ctrl_c_ends_the_run_log_as_interrupted(tmp_path, mode):
    """Ctrl-C (SIGINT to the process) in the README's own loop, and in a loop that calls
    close() after it with no try/finally: an uncaught KeyboardInterrupt is the user stopping
    the run, not a crash (before: `_at_exit` took it for one: no end record, and ZD013 later
    said "(killed, crashed, or hung)")."""
    proc, run, _ = start(tmp_path, mode)
    proc.send_signal(signal.SIGINT)
    code, out = finish(proc)
    assert code in (-signal.SIGINT, 130, 1), (code, out[-2000:])  # KeyboardInterrupt's exit
    assert "KeyboardInterrupt" in out, out[-2000:]
    end = end_of(run)
    assert end.get("interrupted") is True and not end.get("failed"), end
    assert not any(r.get("type") == "stall" for r in records(run))
    log = read_rank_log(next(run.glob("rank-*.jsonl")))
    assert log.ended and log.interrupted


def test_sigterm_records_the_end_and_still_ends_the_process_by_it(tmp_path):
    """SIGTERM with the default disposition: a "terminated" record naming where the rank was
    and an end marked `"terminated": true`, then the process ends by SIGTERM as without
    zerodoc (the launcher sees -15)."""
    proc, run, _ = start(tmp_path, "default")
    proc.send_signal(signal.SIGTERM)
    code, out = finish(proc)
    assert code == -signal.SIGTERM, (code, out[-2000:])
    end = end_of(run)
    assert end.get("terminated") is True and not end.get("failed") \
        and not end.get("interrupted"), end
    term = [r for r in records(run) if r.get("type") == "stall"]
    assert [r["state"] for r in term] == ["terminated"] and term[0]["signal"] == "SIGTERM"
    assert term[0]["step"] >= 4 and term[0]["stack"], term


def test_sigterm_is_handed_to_the_jobs_own_handler(tmp_path):
    """A Python SIGTERM handler the job set before attach is called after the record (it
    exits with status 7 here): the job's choice stands."""
    proc, run, ready = start(tmp_path, "chained")
    proc.send_signal(signal.SIGTERM)
    code, out = finish(proc)
    assert code == 7, (code, out[-2000:])
    assert Path(str(ready) + ".handler").exists()
    assert end_of(run).get("terminated") is True


def test_an_ignored_sigterm_stays_ignored(tmp_path):
    """SIGTERM ignored by the job before attach: zerodoc leaves it so; the job trains on and
    records nothing."""
    proc, run, _ = start(tmp_path, "ignored")
    try:
        def steps() -> int:
            return sum(r.get("type") == "step" for r in records(run))
        before = steps()
        proc.send_signal(signal.SIGTERM)
        wait_until(lambda: steps() >= before + 3 or proc.poll() is not None, 60,
                   "three more steps after the SIGTERM")
        assert proc.poll() is None
        assert not any(r.get("type") in ("stall", "end") for r in records(run))
    finally:
        proc.kill()
        proc.wait(30)


def test_a_forked_child_passes_sigterm_on_without_recording(tmp_path):
    """A child forked after attach (a DataLoader worker; the loader ends its workers with
    SIGTERM) inherits the handler: it records nothing (the run log is the parent's) and
    ends by the signal as without zerodoc."""
    import multiprocessing as mp
    import os
    import time

    from zerodoc.shim import signals

    marker = tmp_path / "recorded"
    undo = signals.install(lambda sig, frame: marker.write_text(str(os.getpid())))
    assert undo is not None  # pytest runs tests on the main thread

    def child() -> None:
        (tmp_path / "child").touch()
        while True:
            time.sleep(0.05)

    try:
        proc = mp.get_context("fork").Process(target=child)
        proc.start()
        wait_until(lambda: (tmp_path / "child").exists(), 30, "the child")
        os.kill(proc.pid, signal.SIGTERM)
        proc.join(30)
    finally:
        undo()
    assert proc.exitcode == -signal.SIGTERM
    assert not marker.exists()
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # put back by undo()
