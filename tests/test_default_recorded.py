"""Issue 31: runs recorded in the default mode (adaptive per-unit detail: sampled steps only),
on a loaded and on a quiet host, read as a user reads them. Each check's witness is the run
logs' own lines, read here (tests/support/defaultmode.py), not zerodoc's readers.

- tests/data/scenarios/default-loaded: a new user's GPT-2 (tests/newuser/train_gpt2.py), 50
  steps on 2 gloo ranks, with two other processes spinning on the host's 2 cores;
- tests/data/scenarios/default-quiet: the same on a quiet host.
(their expect.json says how each was recorded; tests/test_rules.py holds their findings)
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from tests.support import defaultmode as dm
from zerodoc.cli.main import main as zerodoc_main

SCENARIOS = Path(__file__).parent / "data" / "scenarios"
RUNS = [SCENARIOS / "default-loaded", SCENARIOS / "default-quiet"]
ids = [p.name for p in RUNS]


def report(run: Path, capsys, *flags: str) -> tuple[dict, str]:
    out = []
    for extra in (("--json",), ()):
        capsys.readouterr()
        zerodoc_main(["report", str(run), *flags, *extra])
        out.append(capsys.readouterr().out)
    return json.loads(out[0]), out[1]


@pytest.mark.parametrize("run", RUNS, ids=ids)
def test_the_schedule_in_the_logs(run):
    """Step 1 (warm-up) is never sampled, steps 2 and 3 always; every rank samples the steps
    of the rank that samples least (nested sets: ranks compare the same steps); and a sample
    comes at least every 2 x the header's time floor, in the steps' own wall time."""
    rs = dm.ranks(run)
    assert len(rs) == 2
    per_rank = {r: dm.sampled_steps(run, r) for r in rs}
    for r, got in per_rank.items():
        sampling = dm.header(run, r)["config"]["sampling"]
        assert sampling["mode"] == "adaptive" and sampling["floor_s"] > 0, sampling
        assert 1 not in got and got[:2] == [2, 3], (r, got)
        assert len(got) < len(dm.steps(run, r)) - 1, (r, got)  # sampled, not every step
    least = min(per_rank.values(), key=len)
    for r, got in per_rank.items():
        assert set(least) <= set(got), (least, r, got)
    for r in rs:
        recs = dm.steps(run, r)
        floor = dm.header(run, r)["config"]["sampling"]["floor_s"]
        marks = [recs[s]["end_unix"] for s in per_rank[r]] + [recs[max(recs)]["end_unix"]]
        gaps = [b - a for a, b in zip(marks, marks[1:])]
        assert max(gaps) <= 2 * floor, (r, gaps)


@pytest.mark.parametrize("run", RUNS, ids=ids)
@pytest.mark.parametrize("window", [20, 10, 5, 3])
def test_no_all_clear_without_a_sample_in_the_window(run, window, capsys):
    rep, text = report(run, capsys, "--window", str(window))
    dm.check_no_all_clear_without_a_sample(run, rep, text, window)


@pytest.mark.parametrize("run", RUNS, ids=ids)
def test_exposed_comm_is_the_mean_of_the_steps_it_names(run, capsys):
    """The report's exposed communication per step (all collectives: mean over ranks and
    worst rank) is the mean of the step records' `exposed_s` over the sampled steps the
    window takes by the issue's rule (its own, else the newest 3), and its text names them."""
    rep, text = report(run, capsys)
    rs = dm.ranks(run)
    last = min(max(dm.steps(run, r)) for r in rs)
    first = last - 20 + 1
    means = {}
    for r in rs:
        recs = dm.steps(run, r)
        taken = dm.per_unit_steps(run, r, first, last)
        assert taken and all(recs[s]["detail"] for s in taken)
        means[r] = statistics.mean(recs[s]["exposed_s"] for s in taken)
        for s in taken:
            assert str(s) in rep["exposed_comm"]["covers"], (taken, rep["exposed_comm"])
    got = rep["exposed_comm"]
    assert got["mean_over_ranks"] == pytest.approx(statistics.mean(means.values()), rel=1e-3)
    assert got["worst_rank"] == pytest.approx(max(means.values()), rel=1e-3)
    assert rep["window"]["per_unit"]["text"] in text
