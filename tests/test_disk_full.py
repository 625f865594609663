"""The run log when writes fail (issue 20 item 11): a record is written whole or not at all,
every lost record is counted (in the log, in `end`, in /metrics' counter), the report says
"N steps not recorded: ... at PATH" and does not invent a crash, the detail files stay
bounded.

The faults are real and need no set-up: a job writing its run log in a child process under
a file-size limit (`RLIMIT_FSIZE`: the kernel fails the write that crosses it with EFBIG,
after writing what fits, exactly as a full disk does with ENOSPC), lifted again later as
when space is freed; and a file-descriptor limit (`RLIMIT_NOFILE`: EMFILE) while the writer
must open its next detail file.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zerodoc.cli import main as cli
from zerodoc.runlog import read_rank_log
from zerodoc.testing import hostile


def run_job(tmp: Path, mode: str) -> tuple[Path, dict, str]:
    run = tmp / "run"
    got, stderr = hostile.failing_writes_run(run, mode)
    return run, got, stderr


@pytest.mark.slow
def test_file_size_limit_loses_whole_records_counted_and_reported(tmp_path, capsys):
    run, got, stderr = run_job(tmp_path, "fsize")
    path = run / "rank-00000.jsonl"
    raw = path.read_bytes()
    assert raw.endswith(b"\n")
    lines = raw.split(b"\n")[:-1]
    recs = [json.loads(x) for x in lines]  # every line whole: none torn, none glued
    steps = [r["step"] for r in recs if r["type"] == "step"]
    assert steps[:10] == list(range(1, 11)) and steps[-10:] == list(range(21, 31))
    missing = set(range(1, 31)) - set(steps)
    assert missing == set(range(11, 21)), sorted(missing)  # the limit took all of them
    # counted by the writer, and in the log: a `lost` record once writes work, and the end
    assert got["lost_steps"] == len(missing) == 10 and got["lost"] >= 10, got
    assert got["write_error"] == "file size limit reached"
    lost = [r for r in recs if r["type"] == "lost"]
    assert len(lost) == 1 and lost[0]["total_steps"] == 10 and lost[0]["path"] == str(path)
    end = recs[-1]
    assert end["type"] == "end" and end["lost_steps"] == 10 and end["lost"] == got["lost"]
    # one warning naming the file, one when it recovered
    warn = [x for x in stderr.splitlines() if "cannot write the run log" in x]
    assert len(warn) == 1 and str(path) in warn[0] and "file size limit" in warn[0], stderr
    log = read_rank_log(path)
    assert log.bad_lines == 0 and log.ended and log.lost_steps == 10
    # the report: not a crash, the loss said with the path
    assert cli.main(["report", str(run), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["stopped"] is None and "ZD013" not in [f["code"] for f in rep["findings"]]
    assert rep["ended_ranks"] == [0]
    note = f"10 steps not recorded: file size limit reached at {path}"
    assert any(n.startswith(note) for n in rep["log_notes"]), rep["log_notes"]
    assert cli.main(["report", str(run)]) == 0
    assert note in capsys.readouterr().out


@pytest.mark.slow
def test_detail_files_stay_bounded_when_they_cannot_be_opened(tmp_path):
    """EMFILE at every interval's switch of detail file: the writer stops writing detail
    (no file grows past one interval) and resumes once it can open files again; the main
    log loses nothing."""
    run, got, _ = run_job(tmp_path, "nofile")
    longest = 0
    for p in (run / "detail").iterdir():
        body = p.read_text().splitlines()
        assert len(body) <= 1 + 5, (p.name, len(body))  # the tag + one interval of steps
        longest = max(longest, *map(len, body))
    # and while the fault lasted (40 steps): never more than one interval's worth
    assert 0 < got["detail_bytes_during"] <= 6 * (longest + 1), (got, longest)
    assert got["lost"] == 0 and got["errors"] >= 8, got
    recs = [json.loads(x) for x in (run / "rank-00000.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs if r["type"] == "step"] == list(range(1, 61))
    log = read_rank_log(run / "rank-00000.jsonl")
    assert log.steps and log.steps[-1].step == 60  # detail came back after the fault


def test_metrics_counter_is_in_the_catalog():
    """The counter the exporter serves once a record is lost is a catalog metric."""
    from zerodoc.catalog import BY_NAME

    m = BY_NAME["zerodoc_runlog_records_lost_total"]
    assert m.type == "counter" and m.per == "lost"
