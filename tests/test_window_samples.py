"""A window's sampled steps (issue 31, points 1-2): per-unit rules read the samples in their
window; with fewer than MIN_WINDOW_SAMPLES there they take the newest ones before it and
name their steps and age, or say "not evaluated" — never "nothing wrong". The warm-up step
1 (always sampled) is never one of them; ranks are compared over the same steps.

Run logs are written with the real writer (`zerodoc.runlog.replay.Replay` over
`RunLogWriter`), step records from `zerodoc.testing.synthetic` (rank 1 computes 1.3x
slower: a straggler), sampled on the steps each test names, as the shim writes them."""

from __future__ import annotations

from pathlib import Path

import pytest

from zerodoc.runlog import RunLogWriter
from zerodoc.runlog.replay import Replay
from zerodoc.sources import open_source
from zerodoc.testing.synthetic import rank_facts, sampled, step_record, unsampled

RANKS, UNITS, STEPS, K = 2, 4, 50, 32
WARMUP = 25.0  # the warm-up step computes this much longer (compile, allocator): every rank


def write(run: Path, samples: dict[int, set[int]] | set[int], *, straggler: int | None = 1,
          steps: int = STEPS) -> Path:
    """A run whose rank r records per-unit detail on `samples` (one set for every rank, or
    rank -> set), step 1 a warm-up step."""
    config = {"sampling": {"mode": "adaptive", "every": K, "budget": 0.002}}
    for r in range(RANKS):
        mine = samples[r] if isinstance(samples, dict) else samples
        rep = Replay(RunLogWriter(run, r, every_steps=100, queue_size=1 << 20),
                     rank_facts(r, RANKS, UNITS, run_id=run.name, config=config))
        t = 1_700_000_000.0
        for s in range(1, steps + 1):
            rec, step_s = step_record(s, r, RANKS, UNITS, t, straggler)
            if s == 1:
                rec["compute"] = [[u, p, x * WARMUP] for u, p, x in rec["compute"]]
                rec["compute_s"] *= WARMUP
            t += step_s
            rec["end_unix"] = t
            rep.step((sampled if s in mine else unsampled)(rec, K))
        rep.close(end=True)
    return run


def snapshots(run: Path, window: int = 20):
    """The same window through both readers: the run log read whole (`load_run`, what
    `report --window 0` and older segments use) and followed (`open_source`: the sliding
    windows the TUI and the report read)."""
    from zerodoc.runlog import load_run

    return {"load_run": load_run(run, window, float("inf"), skip_warmup=True),
            "sliding": open_source(str(run), window=window).snapshot()}


def report_text(run: Path, window: int = 20) -> str:
    from tests.test_sampled import report_of

    return report_of(run, window)


@pytest.mark.parametrize("reader", ["load_run", "sliding"])
def test_warmup_sample_never_stands_for_the_window(tmp_path, reader):
    """The issue's run: samples on steps 1, 2 and 30, window 31-50. The old reader took
    1, 2, 30 (the warm-up's compile time on both ranks hid the straggler) and the report
    said nothing was wrong; now step 1 is left out, two samples remain and the cross-rank
    rule says it was not evaluated."""
    from zerodoc.diagnosis import diagnose, waiting

    run = write(tmp_path / "run", {1, 2, 30})
    snap = snapshots(run)[reader]
    for w in snap.ranks.values():
        assert (w.first_step, w.last_step) == (31, 50)
        assert (w.detail_steps, w.detail_before) == (2, 2)
    codes = {f.code for f in diagnose(snap)}
    assert "ZD010" not in codes
    wait = waiting(snap)
    assert wait is not None and wait["rules"] == ["ZD010"] and wait["in_window"] == 0
    from zerodoc.windowsamples import sample_steps

    assert all([s for s, _ in sample_steps(w)] == [2, 30] for w in snap.ranks.values())
    assert wait["text"] == ("not evaluated: 0 sampled steps in the window (2 before it: steps "
                            "2, 30); ZD010 needs 3")


def test_report_never_says_nothing_wrong_when_a_rule_family_did_not_run(tmp_path):
    run = write(tmp_path / "run", {1, 2, 30}, straggler=None)
    text = report_text(run)
    assert "nothing the rules know of is wrong" not in text
    head = text.split("Findings: ")[1].splitlines()
    assert "1 rule not evaluated" in head[0]
    assert "not evaluated: 0 sampled steps in the window (2 before it: steps 2, 30); " \
        "ZD010 needs 3" in text
    # the per-unit numbers name the steps they come from and how old they are
    assert "per-unit: the newest 2 sampled steps (from steps 2, 30, all before the window " \
        "(31-50), the newest " in text
    assert "s before step 50; 0 inside the window of 20)" in text


@pytest.mark.parametrize("reader", ["load_run", "sliding"])
def test_three_samples_before_the_window_find_the_straggler_and_say_their_steps(tmp_path,
                                                                              reader):
    """Three samples after the warm-up, all before the window: the rules run on them, the
    straggler is found as with --window 0, and the coverage names steps 12, 23, 30."""
    from zerodoc.diagnosis import diagnose, waiting
    from zerodoc.windowsamples import run_coverage

    run = write(tmp_path / "run", {1, 2, 12, 23, 30})
    snap = snapshots(run)[reader]
    assert waiting(snap) is None
    found = {f.code: f for f in diagnose(snap)}
    assert "ZD010" in found and found["ZD010"].ranks == (1,)
    whole = {f.code for f in diagnose(snapshots(run, window=None)["load_run"])}
    assert "ZD010" in whole
    text = run_coverage(snap)
    assert text.startswith("per-unit: the newest 3 sampled steps (from steps 12, 23, 30, all "
                           "before the window (31-50), the newest ")
    assert text.endswith("s before step 50; 0 inside the window of 20)")


def test_ranks_that_sampled_different_steps_are_not_compared(tmp_path):
    """Rank 0 sampled 12, 23, 30 and rank 1 11, 24, 30: a straggler rule over those would
    compare different steps; it waits and says why."""
    from zerodoc.diagnosis import diagnose, waiting

    run = write(tmp_path / "run", {0: {1, 2, 12, 23, 30}, 1: {1, 2, 11, 24, 30}})
    snap = snapshots(run)["sliding"]
    assert "ZD010" not in {f.code for f in diagnose(snap)}
    wait = waiting(snap)
    assert wait["rules"] == ["ZD010"]
    assert "ZD010 compare ranks over the same steps, and the ranks' samples are different " \
        "steps (rank 0: 12, 23, 30; rank 1: 11, 24, 30)" in wait["text"]


# --------------------------------------------------------------------------------------
# a run still being written (issue 31, point 2): flagged by every view


async def test_a_run_still_being_written_is_flagged_everywhere(tmp_path):
    """report (text and --json), whatif and the TUI's title say LIVE with the newest step
    and the last write's age; once the run ends, none does."""
    import json
    import time

    from tests.support.helpers import until
    from tests.test_one_number import cli
    from zerodoc.testing.synthetic import close_run, write_run

    run = write_run(tmp_path / "run", ranks=2, units=4, steps=8, straggler=None,
                    started_unix=time.time() - 3, end=False)
    text = cli("report", str(run))
    assert "LIVE: still being written (step 8, last write " in text.splitlines()[2]
    assert json.loads(cli("report", str(run), "--json"))["live"].startswith(
        "LIVE: still being written (step 8, last write ")
    assert "LIVE: still being written (step 8, last write " in cli("whatif", str(run))
    pytest.importorskip("textual")
    from zerodoc.testing.textshot import screen_text
    from zerodoc.tui.app import ZerodocApp

    app = ZerodocApp(open_source(str(run), window=20), refresh=0.1)
    async with app.run_test(size=(160, 36)) as pilot:
        await until(pilot, lambda: app.frame is not None and app.frame.snapshot.ranks,
                    what="first frame")
        await pilot.pause()
        assert "LIVE: still being written (step 8, last write " in \
            screen_text(app).splitlines()[0]
        close_run(run)
        await until(pilot, lambda: app.frame.run_ended, what="the run's end")
        await pilot.pause()
        assert "LIVE" not in screen_text(app)
    assert "LIVE" not in cli("report", str(run))
    assert json.loads(cli("report", str(run), "--json"))["live"] is None
    assert "LIVE" not in cli("whatif", str(run))


def test_no_findings_from_samples_before_the_window_is_not_an_all_clear(tmp_path):
    """A window with no sample of its own whose per-unit rules read the newest 3 from before
    it: nothing found is said as such, not as "nothing wrong" (issue 31: a healthy run never
    gets an all-clear without a sample in its window). Rendered from the real snapshot with
    no findings, as a run whose rules find nothing would be."""
    from zerodoc.report import build_report, render_text
    from zerodoc.thresholds import DEFAULT

    run = write(tmp_path / "run", {1, 2, 12, 23, 30}, straggler=None)
    snap = snapshots(run)["sliding"]
    text = render_text(build_report(snap, [], source="run", thresholds=DEFAULT, link=None,
                                    window=20))
    assert "nothing the rules know of is wrong" not in text
    assert "no findings; the per-unit rules read sampled steps from before the window (see " \
        "above), none inside it: not an all-clear for the window" in text
    # with a sample inside the window, nothing found is an all-clear
    inside = write(tmp_path / "inside", {1, 2, 12, 23, 40}, straggler=None)
    text = render_text(build_report(snapshots(inside)["sliding"], [], source="run",
                                    thresholds=DEFAULT, link=None, window=20))
    assert "no findings: nothing the rules know of is wrong" in text
