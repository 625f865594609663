"""Flight-recorder dumps + a zerodoc run log of the same job -> the stopped rank's unit and
phase (issue 34, item 1: `zerodoc report DUMPS --runlog RUNDIR`).

The witness is the job itself (tests/support/jobs/flightrec_units.py): a real 2-rank FSDP2
gloo run with zerodoc attached at its default detail, in which the test chooses the rank, the
unit and the phase where one rank blocks (a forward pre-hook of `blocks.1` after FSDP's own,
on a step without per-unit detail). Its peer goes on to the next unit's all-gather and waits
there. Torch's own flight recorder dumps every rank; the report must name the chosen rank,
unit and phase, and the peer's unit, as zerodoc's watchdog places the same hang
(tests/test_stopped.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.helpers import ROOT, SMALL_MODEL, job_env, wait_until
from zerodoc.demo.launch import Job
from tests.test_flightrec import report as report_here  # `zerodoc report` in this process
from zerodoc.sources.flightrec_units import read_rank

NVRX = ROOT / "tests" / "data" / "flightrec" / "nvrx" / "gpu_error_1st"
OLD_RUN = ROOT / "tests" / "data" / "scenarios" / "healthy-block"  # a log with no collorder


def report(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "zerodoc", "report", *map(str, args)],
                          capture_output=True, text=True, timeout=120, env=job_env())


def stopped_of(dumps: Path, run: Path) -> dict | None:
    out = report(dumps, "--runlog", run, "--json")
    if out.returncode not in (0, 1):
        raise AssertionError(out.stderr)
    return json.loads(out.stdout)


def _dumps_say_rank(dumps: Path, run: Path, rank: int):
    """The report once the dumps show `rank` alone behind (the peer reached its collective:
    it cannot leave it, so this is the final state), else None."""
    if not all((dumps / f"nccl_trace_rank_{r}").exists() for r in (0, 1)):
        return None
    rep = stopped_of(dumps, run)
    st = rep.get("stopped")
    return rep if st and st["ranks"] == [rank] else None


def hung_job(tmp_path: Path, spec: dict, what: str, module: str, framework: str = "fsdp2"):
    """Run `module` (a job of tests/support/jobs/) with `spec` ("hang" rank 1), wait until
    rank 1 blocks (`what`), dump both ranks, end the job: the report of the dumps with the
    run log once they show rank 1 behind, the run directory and the dumps."""
    run, out = tmp_path / "run", tmp_path / "fr"
    spec = {"model": dict(SMALL_MODEL), "steps": 400, "out": str(out), "framework": framework,
            "attach": {"run_dir": str(run), "port": False}, **spec}
    env = {"TORCH_FR_BUFFER_SIZE": "2000", "DS_ACCELERATOR": "cpu", **os.environ}
    job = Job(2, spec, module=module, env=job_env(env), log_dir=str(tmp_path / "logs")).start()
    try:
        wait_until(lambda: (out / "hung-1").exists() or not job.running(), 300,
                   f"rank 1 to block in {what}", interval=0.2)
        assert job.running(), (tmp_path / "logs" / "rank-1.out").read_text()[-3000:]
        (out / "dump").touch()
        rep = wait_until(lambda: _dumps_say_rank(out / "dumps", run, 1), 120,
                         "the dumps to show rank 1 behind", interval=0.5)
    finally:
        (out / "stop").touch()
        try:
            job.wait(30)
        finally:
            job.stop(grace=1)
    return rep, run, out / "dumps"


@pytest.fixture(scope="module", params=["forward", "backward"])
def hung(tmp_path_factory, request):
    """The job, rank 1 blocked in blocks.1's forward or backward, dumped; ended after the
    test's wait."""
    phase = request.param
    spec = {"hang": {"rank": 1, "module": "blocks.1", "phase": phase, "at_step": 6}}
    rep, run, dumps = hung_job(tmp_path_factory.mktemp(f"hung-{phase}"), spec,
                               "blocks.1", "tests.support.jobs.flightrec_units")
    yield phase, rep, run, dumps


# where the peer waits (the watchdog's placement of the same hang, tests/test_stopped.py):
# forward, in the next unit's all-gather; backward, in blocks.1's own reduce-scatter (FSDP2's
# pre-backward of blocks.1 already issued blocks.0's all-gather, a prefetch: rank 1's last
# collective moves blocks.0's parameters; flightrec._stopped_in)
PEER = {"forward": ("blocks.2", "all_gather", "blocks.1"),
        "backward": ("blocks.1", "reduce_scatter", "blocks.0")}


@pytest.mark.slow
def test_dumps_and_runlog_name_the_stopped_ranks_unit_and_phase(hung):
    phase, rep, run, dumps = hung
    peer_unit, peer_coll, last_of = PEER[phase]
    st = rep["stopped"]
    # the rank, unit and phase the test chose
    assert (st["rank"], st["unit"], st["phase"]) == (1, "blocks.1", phase), st
    assert st["confidence"] == "high" and st["process_group"] is not None, st
    f = next(x for x in rep["findings"] if x["code"] == "ZD013")
    ev = f["evidence"]
    assert ev["place"]["collective"] == "all_gather" and ev["place"]["from_rank"] == 1, ev
    assert ev["place"]["unit"] == last_of, ev
    assert ev["place"]["step"] >= 6, ev  # the hang begins at the 6th forward or later
    # placed from rank 1's own step lines up to the step it stopped in (each step's `seq`),
    # not by assuming the schedule repeats past the newest one
    assert ev["place"]["steps_past_log"] == 0, ev
    # the peer, from the dumps' sequence number alone
    (w,) = ev["waiting"]
    assert (w["rank"], w["unit"], w["phase"]) == (0, peer_unit, phase), w
    assert (ev["awaited_place"]["unit"], ev["awaited_place"]["collective"]) == \
        (peer_unit, peer_coll), ev
    assert ev["awaited_place"]["step"] == ev["place"]["step"], ev
    assert f"blocks.1 ({phase})" in f["title"], f["title"]
    # the dumps alone (no --runlog) still name the rank, and no unit
    alone = report(dumps, "--json")
    assert json.loads(alone.stdout)["stopped"]["unit"] is None, alone.stdout[-2000:]


def test_runlog_goes_with_dumps_only_and_must_be_a_run_dir(tmp_path, capsys):
    code, _, err = report_here(capsys, OLD_RUN, "--runlog", OLD_RUN)
    assert code == 2 and "--runlog goes with a folder of flight-recorder dumps" in err, err
    code, _, err = report_here(capsys, NVRX, "--runlog", tmp_path / "nowhere")
    assert code == 2 and "not a zerodoc run directory" in err, err
    assert "Traceback" not in err


@pytest.mark.slow
async def test_tui_with_runlog_names_the_unit_and_phase(hung):
    """`zerodoc tui DUMPS --runlog RUNDIR`: the findings view says where the rank stopped, as
    the report does (the CLI joins the run directory as `apply_runlog` does here)."""
    from tests.test_tui import SIZE, app_text, first_frame
    from zerodoc.cli.options import apply_runlog
    from zerodoc.sources import open_source
    from zerodoc.tui.app import ZerodocApp

    phase, _rep, run, dumps = hung

    class Args:
        runlog = str(run)
    app = ZerodocApp(apply_runlog(Args, open_source(str(dumps))), refresh=None)
    async with app.run_test(size=SIZE) as pilot:
        await first_frame(app, pilot)
        await pilot.press("3")
        await pilot.pause()
        text = app_text(app)
        assert f"blocks.1 ({phase})" in text, text[:3000]
        await pilot.press("q")
        await pilot.pause()


def test_tui_runlog_goes_with_dumps_only(tmp_path, capsys):
    """The TUI's --runlog is checked before any terminal work: one line, exit 2."""
    from zerodoc.cli.main import main

    for src, runlog, says in ((OLD_RUN, OLD_RUN, "--runlog goes with a folder of flight-recorder"),
                              (NVRX, tmp_path / "nowhere", "not a zerodoc run directory")):
        try:
            code = main(["tui", str(src), "--runlog", str(runlog)])
        except SystemExit as e:
            code = e.code
        err = capsys.readouterr().err
        assert code == 2 and says in err and "Traceback" not in err, err


def test_a_runlog_without_the_record_names_no_unit_and_says_so(capsys):
    """A run log from before the record (or another job's): the rank is still named from
    the dumps; no unit is made up, and the notes say why."""
    rep = json.loads(report_here(capsys, NVRX, "--runlog", OLD_RUN, "--json")[1])
    assert rep["stopped"]["ranks"] == [12] and rep["stopped"]["unit"] is None, rep["stopped"]
    assert any("no collective placed in a unit" in n for n in rep["log_notes"]), rep["log_notes"]


def _log(path: Path, steps: list[tuple[int, int]], order: dict) -> Path:
    lines = [{"type": "header", "schema": 3, "segment": 0, "rank": 0},
             {"type": "collorder", "step": 1, "groups": ["0"], "units": ["a", "b"],
              "phases": ["forward", "backward"], "kinds": ["all_gather", "reduce_scatter"],
              "order": order}]
    lines += [{"type": "step", "step": s, "detail": False, "seq": [e]} for s, e in steps]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


ORDER = {"0": {"n": 4, "at": [[1, 0, 0, 0], [2, 1, 0, 0], [4, 1, 1, 1]]}}


def test_placement_by_offset_in_the_step_after_the_newest_below(tmp_path):
    """Each step has 4 collectives on group 0 (offset 3: the user's own, not wrapped)."""
    o = read_rank(_log(tmp_path / "rank-00000.jsonl", [(1, 4), (2, 8), (3, 12)], ORDER))
    assert o.place("0", 10) == {"step": 3, "offset": 2, "of": 4, "unit": "b",
                                "phase": "forward", "collective": "all_gather",
                                "steps_past_log": 0}
    assert (o.place("0", 12)["unit"], o.place("0", 12)["phase"],
            o.place("0", 12)["collective"]) == ("b", "backward", "reduce_scatter")
    assert o.place("0", 11)["unit"] is None and o.place("0", 11)["step"] == 3
    # past the newest step line: the schedule taken to repeat, and said
    got = o.place("0", 18)
    assert (got["step"], got["unit"], got["steps_past_log"]) == (5, "b", 1), got
    assert o.place("1", 10) is None  # a group the record does not list
    # a log whose newest segment has no order record: nothing placed
    (tmp_path / "old.jsonl").write_text(json.dumps({"type": "header"}) + "\n" + json.dumps(
        {"type": "step", "step": 1, "seq": [4]}) + "\n")
    assert read_rank(tmp_path / "old.jsonl") is None
