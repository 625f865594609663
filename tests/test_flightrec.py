"""PyTorch flight-recorder dumps -> who stopped the job (issue 34, item 1).

Witnesses independent of the reader: NVIDIA's resiliency extension's 16-rank dumps with
faults injected on two ranks (tests/data/flightrec/nvrx, the injected ranks in each case's
fault_injection.log, and what NVRx's own analyser names); a real gloo job whose stopped
rank is chosen by the test (tests/support/jobs/flightrec_stop.py); synthetic dumps whose
stopped ranks are known by construction (zerodoc.testing.flightrec).
"""

from __future__ import annotations

import gzip
import json
import os
import pickle
import pickletools
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.helpers import ROOT, job_command, job_env
from zerodoc.testing.flightrec import write_dumps

NVRX = ROOT / "tests" / "data" / "flightrec" / "nvrx"
# NVRx's analyser on the same dumps (its tests/attribution/unit/reference_outputs/, the
# commit in NVRX/README.md): a second reader, not ours
NVRX_NAMES = {"gpu_error_1st": [12], "gpu_error_2nd": [9, 14], "lock_gil_1st": [9, 14],
              "lock_gil_2nd": [10, 15]}


def injected(case: str) -> set[int]:
    """The ranks NVRx injected the fault on, from the log written beside the dumps."""
    text = (NVRX / case / "fault_injection.log").read_text()
    return {int(x) for x in re.search(r"Fault ranks: \[([\d, ]+)\]", text).group(1).split(",")}


def report(capsys, *args) -> tuple[int, str, str]:
    from zerodoc.cli.main import main

    try:
        code = main(["report", *map(str, args)])
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


def stopped_of(capsys, path, *flags) -> dict:
    code, out, err = report(capsys, path, "--json", *flags)
    assert code in (0, 1), err
    rep = json.loads(out)
    assert not [f for f in rep["findings"] if f["code"] == "ZD000"], "a rule crashed"
    return rep


@pytest.mark.parametrize("case", sorted(NVRX_NAMES))
def test_nvrx_dumps_name_the_injected_ranks(capsys, case):
    rep = stopped_of(capsys, NVRX / case)
    st = rep["stopped"]
    assert st, rep["log_notes"]
    assert st["ranks"] and set(st["ranks"]) <= injected(case), (st["ranks"], injected(case))
    assert st["ranks"] == NVRX_NAMES[case]
    assert st["rank"] == st["ranks"][0]
    # gpu_error_1st's rank 14 was injected too, but its dump shows it in step with its
    # group, waiting for rank 12 like the others (tests/data/flightrec/nvrx/README.md)
    assert not set(st["waiting_ranks"]) & (injected(case) - {14 if case == "gpu_error_1st"
                                                             else -1})
    assert st["waiting_ranks"], "the ranks left waiting are named"
    # the lock_gil cases' stopped ranks hold the interpreter lock: their dumps are empty,
    # so the evidence is their silence, not their own record
    assert st["confidence"] == ("medium" if case.startswith("lock_gil") else "high")
    assert st["process_group"] and isinstance(st["sequence"], int)
    assert st["collective"].startswith("nccl:")
    code, text, _ = report(capsys, NVRX / case)
    line = next(ln for ln in text.splitlines() if ln.startswith("RUN STOPPED:"))
    assert f"rank{'s' if len(st['ranks']) > 1 else ''} {', '.join(map(str, st['ranks']))} " \
           "stopped first" in line
    assert "LIVE" not in text


def test_a_missing_dump_is_evidence_not_an_error(tmp_path, capsys):
    """NVRx's gpu_error_1st without rank 12's dump (a rank that died before writing it):
    still rank 12, now from its absence (confidence medium)."""
    case = shutil.copytree(NVRX / "gpu_error_1st", tmp_path / "dumps")
    (case / "_dump_12").unlink()
    (case / "fault_injection.log").unlink()
    rep = stopped_of(capsys, case)
    assert rep["stopped"]["ranks"] == [12]
    assert rep["stopped"]["confidence"] == "medium"
    assert rep["missing_ranks"] == [12]
    assert "left no dump" in rep["stopped"]["title"]


def test_a_stale_record_of_completion_does_not_move_the_collective(tmp_path, capsys):
    """Rank 5 of 8 left no dump; every waiting rank but rank 0 counts its last completed
    collective one short (gloo's pg_status lags the return from its wait: seen in a real
    3-rank job, 1 run in 4). A collective rank 0 saw complete was entered by every member,
    rank 5 too: rank 5 lacks the one after it, as with no stale record."""
    d = write_dumps(tmp_path / "d", 8, stopped=(5,), missing=(5,), tp=4, ring=40)
    truth = stopped_of(capsys, d)["stopped"]
    for r in (1, 2, 3, 4, 6, 7):
        f = d / f"nccl_trace_rank_{r}"
        dump = pickle.loads(f.read_bytes())
        for st in dump["pg_status"].values():
            st["last_completed_collective"] -= 1
        last = {e["pg_id"]: e for e in dump["entries"] if e["state"] == "completed"}
        for e in last.values():
            e["state"] = "scheduled"
        f.write_bytes(pickle.dumps(dump))
    st = stopped_of(capsys, d)["stopped"]
    assert st["ranks"] == [5] and st["confidence"] == "medium"
    assert (st["process_group"], st["sequence"]) == (truth["process_group"], truth["sequence"])


@pytest.mark.parametrize("how", ["behind", "empty", "missing"])
def test_synthetic_job_names_the_ranks_it_stopped(tmp_path, capsys, how):
    """64 ranks in TP groups of 8; ranks 13 and 42 stop (their dumps behind, empty or
    absent): both named, every other rank waiting for them."""
    stop = (13, 42)
    kw = {"empty": stop} if how == "empty" else {"missing": stop} if how == "missing" else {}
    d = write_dumps(tmp_path / "d", 64, stopped=stop, ring=60, **kw)
    st = stopped_of(capsys, d)["stopped"]
    assert st["ranks"] == [13, 42]
    assert st["confidence"] == ("high" if how == "behind" else "medium")
    assert st["waiting_ranks"] == [r for r in range(64) if r not in stop]
    assert st["process_group"] == "0" and st["collective"] == "nccl:all_reduce"


def test_no_rank_behind_names_nobody(tmp_path, capsys):
    d = write_dumps(tmp_path / "d", 16, ring=40)
    rep = stopped_of(capsys, d)
    assert rep["stopped"] is None
    assert any("no rank is behind" in n for n in rep["log_notes"])


def test_report_on_dumps_claims_no_timings(tmp_path, capsys):
    """Dumps hold collectives, not timings: the report shows no step or unit rows (never a
    rank's "0 s"), no "NO DATA" advice to call attach(), no link grade, and with nobody
    behind it says what that covers instead of an all-clear."""
    rep = stopped_of(capsys, NVRX / "gpu_error_1st")
    assert rep["source_kind"] == "flight-recorder dumps"
    assert rep["steps"] == [] and rep["units"] == [] and rep["data_problems"] == []
    assert rep["link"] is None
    for flags in ((), ("--markdown",)):
        code, text, _ = report(capsys, NVRX / "gpu_error_1st", *flags)
        assert code == 0 and "ZD013" in text  # no --fail-on: exit 0, as for any source
        assert "NO DATA" not in text.upper() and "Step breakdown" not in text
        assert "0 s" not in text and "link " not in text and "stale ranks" not in text
        assert "no per-unit or per-step figures" in text
    d = write_dumps(tmp_path / "d", 16, ring=40)
    code, text, _ = report(capsys, d)
    assert code == 0
    assert "no rank behind another" in text and "nothing the rules know of is wrong" not in text


@pytest.mark.parametrize("gz", [False, True])
def test_a_profiler_trace_is_not_taken_for_dumps(tmp_path, gz):
    """A Kineto trace of a distributed job opens with distributedInfo holding "pg_config"
    (PyTorch 2.x) and is named with its rank at the end: it is a trace, not a dump."""
    from zerodoc.sources import flightrec, open_source

    head = {"schemaVersion": 1, "deviceProperties": [],
            "distributedInfo": {"backend": "gloo", "rank": 0, "world_size": 2,
                                "pg_count": 1, "pg_config": [{"pg_name": "0", "ranks": [0, 1]}]},
            "traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1,
                             "tid": 1, "ts": 0, "dur": 5}]}
    data = json.dumps(head).encode()
    for r in (0, 1):
        p = tmp_path / f"trace_rank_{r}.json" if not gz else tmp_path / f"trace_{r}.json.gz"
        p.write_bytes(gzip.compress(data) if gz else data)
    assert not flightrec.looks_like_dumps(tmp_path)
    try:
        src = open_source(str(tmp_path))
    except Exception as e:  # noqa: BLE001 - a trace source may refuse a trace this thin
        assert "flight" not in str(e).lower(), e
    else:
        assert not isinstance(src, flightrec.FlightRecorderSource)


def test_json_and_older_formats_read_alike(tmp_path, capsys):
    """The JSON form (torch's `_dump_nccl_trace_json`: process_group a list, pg_status values
    strings) and a pre-2.4 dump (no pg_status; `seq_id` in the 1.x entries) give the same
    ranks as the pickles they are made from."""
    src = NVRX / "gpu_error_2nd"
    as_json, old = tmp_path / "json", tmp_path / "old"
    as_json.mkdir()
    old.mkdir()
    for f in src.glob("_dump_*"):
        d = pickle.loads(f.read_bytes())
        j = dict(d, pg_status={k: {kk: str(vv) for kk, vv in v.items()}
                               for k, v in d["pg_status"].items()},
                 entries=[dict(e, process_group=list(e["process_group"]))
                          for e in d["entries"]])
        (as_json / f"{f.name}.json").write_text(json.dumps(j))
        o = {"version": "1.5", "pg_config": d["pg_config"],
             "entries": [{k: v for k, v in dict(e, seq_id=e["collective_seq_id"]).items()
                          if k not in ("collective_seq_id", "is_p2p")}
                         for e in d["entries"] if not e["is_p2p"]]}
        (old / f.name).write_bytes(gzip.compress(pickle.dumps(o)))
    assert stopped_of(capsys, as_json)["stopped"]["ranks"] == [9, 14]
    assert stopped_of(capsys, old)["stopped"]["ranks"] == [9, 14]


class _Boom:
    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


def test_a_pickle_naming_code_is_refused_unrun(tmp_path, capsys):
    """A dump that names a callable (here Path.touch of a marker file) is refused with one
    line, before anything is imported or called."""
    d = write_dumps(tmp_path / "d", 4, ring=10)
    marker = tmp_path / "ran"
    boom = _Boom()
    boom.marker = str(marker)
    evil = pickle.dumps({"version": "2.9", "entries": [boom]})
    assert any(op.name in ("GLOBAL", "STACK_GLOBAL") for op, _, _ in pickletools.genops(evil))
    (d / "nccl_trace_rank_2").write_bytes(evil)
    code, out, err = report(capsys, d)
    assert code == 2 and not marker.exists()
    assert err.count("\n") == 1 and "nccl_trace_rank_2" in err and "pathlib" in err, err


def test_bombs_are_bounded(tmp_path, capsys, monkeypatch):
    """A gzip bomb (over the size bound once inflated) is refused; a pickle claiming a
    1e9-character string in a few bytes is an unreadable dump (evidence), not an
    allocation."""
    from zerodoc.sources import flightrec

    monkeypatch.setattr(flightrec, "MAX_DUMP_BYTES", 1 << 20)
    d = write_dumps(tmp_path / "d", 4, ring=10)
    (d / "nccl_trace_rank_1").write_bytes(gzip.compress(b"\0" * (4 << 20)))
    code, _, err = report(capsys, d)
    assert code == 2 and "more than 1 MiB" in err and err.count("\n") == 1, err
    claim = b"\x80\x02}q\x00X" + (10**9).to_bytes(4, "little") + b"abc"
    (d / "nccl_trace_rank_1").write_bytes(claim)
    rep = stopped_of(capsys, d)
    assert any("nccl_trace_rank_1" in n and "not a readable dump" in n
               for n in rep["log_notes"]), rep["log_notes"]


def _cpu() -> float:
    """CPU seconds of this process and its reaped children (the reading processes)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


@pytest.mark.slow  # the folder is read by worker processes
def test_a_thousand_ranks_read_within_bounds(tmp_path, capsys):
    """1,024 ranks (rings of 200 collectives here; bench/flightrec.py reads full 2,000-entry
    rings and prints the time) read and reported in <= 10 s of CPU, the issue's bound as CPU
    time (wall time on a machine shared by several test runs says more about the others;
    this run took ~2-4 s), with rank 700 named."""
    d = write_dumps(tmp_path / "d", 1024, stopped=(700,), ring=200, steps=60)
    c0 = _cpu()
    st = stopped_of(capsys, d)["stopped"]
    took = _cpu() - c0
    assert st["ranks"] == [700]
    assert took <= 10.0, f"{took:.1f} s of CPU"


def test_world_size_names_a_missing_last_rank(tmp_path, capsys):
    """Dumps without pg_config (gloo's) do not say the world: the highest rank's missing dump
    is seen only with --world-size; without it the answer says it is unsure."""
    d = write_dumps(tmp_path / "d", 8, stopped=(7,), missing=(7,), ring=30, tp=4)
    for f in d.iterdir():
        f.write_bytes(pickle.dumps(dict(pickle.loads(f.read_bytes()), pg_config={})))
    # unseen, rank 7's TP group looks like ranks 4-6, who wait there with nobody behind:
    # named as waiting for each other or for someone unlisted, not as a sure answer
    low = stopped_of(capsys, d)["stopped"]
    assert low["confidence"] == "low" and 7 not in low["ranks"], low
    st = stopped_of(capsys, str(d), "--world-size", "8")["stopped"]
    assert st["ranks"] == [7] and st["confidence"] == "medium"
    code, _, err = report(capsys, d, "--world-size", "5")
    assert code == 2 and "holds a dump of rank 6" in err


@pytest.mark.slow
@pytest.mark.parametrize("how", ["pickle", "json", "nodump"])
def test_a_real_gloo_job_names_the_rank_that_stopped(tmp_path, how):
    """Three gloo ranks; rank 2 (rank 1 in `nodump`, where it writes no dump: gloo's dumps
    do not say the world size, so the highest rank's absence would go unseen) stops before
    the sixth all-reduce the others enter (torch records gloo's collectives in its flight
    recorder)."""
    stop = 1 if how == "nodump" else 2
    r = subprocess.run(job_command("flightrec_stop", tmp_path, 3, stop, how), env=job_env(),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    rep = subprocess.run([sys.executable, "-m", "zerodoc", "report", str(tmp_path / "dumps"),
                          "--json"], capture_output=True, text=True, timeout=120, env=job_env())
    st = json.loads(rep.stdout)["stopped"]
    assert st["ranks"] == [stop] and st["waiting_ranks"] == [r for r in range(3) if r != stop]
    assert st["collective"] == "gloo:all_reduce" and st["sequence"] == 6
    assert st["confidence"] == ("medium" if how == "nodump" else "high")


async def test_tui_shows_the_stopped_ranks():
    """`zerodoc tui DIR` on dumps: the same finding in the findings view (NVRx lock_gil_2nd)."""
    from tests.test_tui import SIZE, app_text, first_frame
    from zerodoc.sources import open_source
    from zerodoc.tui.app import ZerodocApp

    app = ZerodocApp(open_source(str(NVRX / "lock_gil_2nd")), refresh=None)
    async with app.run_test(size=SIZE) as pilot:
        await first_frame(app, pilot)
        await pilot.press("3")
        await pilot.pause()
        text = app_text(app)
        assert "ranks 10, 15 stopped first" in text, text[:2000]
        await pilot.press("q")
        await pilot.pause()
