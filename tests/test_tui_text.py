"""What the TUI shows as text: literally what the rules and the run say (no Rich markup eats
"[...]"), nested evidence converted with units, a finished run shown as ended, a run with
no data said so. Textual `run_test()` on synthetic run logs (zerodoc.testing.synthetic), text
read off the screen as a terminal would show it.
"""

from __future__ import annotations

import re
import time

import pytest

from zerodoc.diagnosis.findings import Finding, Severity
from zerodoc.runmodel import RankFacts
from zerodoc.runlog import RunLogWriter
from zerodoc.sources import open_source

pytest.importorskip("textual")

from zerodoc.tui.app import ZerodocApp  # noqa: E402
from zerodoc.testing.synthetic import rank_facts, write_run  # noqa: E402
from zerodoc.testing.textshot import screen_text  # noqa: E402

SIZE = (140, 40)


async def _first_frame(app, pilot):
    for _ in range(400):
        if app.frame is not None:
            break
        await pilot.pause(0.05)
    assert app.frame is not None
    await pilot.pause()


def _zd004(fix: str) -> Finding:
    return Finding(
        code="ZD004", name="exposed-all-gather", severity=Severity.WARNING,
        title="all-gathers of [blocks.3] wait: prefetch [off]",
        evidence={"all_gather_exposed_seconds_per_step": 0.0123,
                  "worst": [{"unit": "blocks.3", "phase": "backward",
                             "exposed_seconds_per_step": 0.0032,
                             "exposed_ratio": 0.91}]},
        threshold={"exposed_fraction_warn": 0.1}, fix=fix,
        predicted="exposed all-gather 12.3 ms -> ~2 ms per step [estimate]",
        units=("blocks.3",), doc="docs/rules.md#zd004")


async def test_brackets_and_nested_evidence_are_shown_as_they_are(tmp_path):
    """Bug: `set_modules_to_forward_prefetch([next_block])` showed as
    `set_modules_to_forward_prefetch()`, and ZD004's nested `worst` showed
    `exposed_seconds_per_step: 0.00` where the report says 3.2 ms."""
    run = write_run(tmp_path / "r", ranks=2, units=4, steps=3, end=True)
    fix = ("`block.set_modules_to_forward_prefetch([next_block])`, "
           "`block.set_modules_to_backward_prefetch([prev_block])`; [bold]not bold[/bold]")
    app = ZerodocApp(open_source(str(run)), refresh=None, diagnose=lambda s: [_zd004(fix)])
    async with app.run_test(size=SIZE) as pilot:
        await _first_frame(app, pilot)
        assert "all-gathers of [blocks.3] wait: prefetch [off]" in screen_text(app)  # overview
        await pilot.press("3")
        await pilot.pause()
        text = " ".join(screen_text(app).split())
    for words in ("set_modules_to_forward_prefetch([next_block])",
                  "set_modules_to_backward_prefetch([prev_block])",
                  "[bold]not bold[/bold]", "~2 ms per step [estimate]",
                  "exposed: 3.20 ms/step", "unit: blocks.3", "phase: backward"):
        assert words in text, words
    assert "exposed_seconds_per_step: 0.00" not in text


def _ended_without_steps(run_dir) -> None:
    for rank in range(2):
        w = RunLogWriter(run_dir, rank)
        facts: RankFacts = rank_facts(rank, 2, 3, started_unix=time.time() - 5)
        w.write_header(facts)
        w.close(0)  # a clean end, no step


async def test_a_finished_run_shows_ended_not_live(tmp_path):
    """A cleanly finished run showed "● live"; one that ended before its first step waited
    for that step forever and said "No findings"."""
    run = write_run(tmp_path / "done", ranks=2, units=3, steps=4, end=True)
    app = ZerodocApp(open_source(str(run)), refresh=None)
    async with app.run_test(size=SIZE) as pilot:
        await _first_frame(app, pilot)
        text = screen_text(app)
    assert "■ ended" in text and "● live" not in text

    empty = tmp_path / "empty"
    _ended_without_steps(empty)
    app = ZerodocApp(open_source(str(empty)), refresh=None)
    async with app.run_test(size=SIZE) as pilot:
        await _first_frame(app, pilot)
        text = screen_text(app)
        await pilot.press("3")
        await pilot.pause()
        findings = screen_text(app)
    assert "■ ended" in text
    assert "the run ended without a completed step" in text
    assert "waiting for the first step" not in text
    assert "No data" in text and "No findings" not in text
    assert "not an all-clear" in " ".join(findings.split())


async def test_an_ended_run_whose_source_went_away_stays_ended(tmp_path):
    """Over endpoints, a cleanly finished run turned into a red "source error" with every
    rank STALE once the job's /metrics servers were gone. A source that reported the ranks'
    clean end (`RunSnapshot.ended_ranks`) keeps them ended."""
    from tests.test_tui import ScriptedSource
    from zerodoc.runlog import load_run

    run = write_run(tmp_path / "r", ranks=2, units=3, steps=4, end=True,
                    started_unix=time.time() - 10)
    ended = load_run(run)
    assert ended.ended_ranks == {0, 1}  # the run-dir reader sets it from the "end" records
    live = load_run(run)
    live.ended_ranks = set()
    gone = ConnectionRefusedError(111, "Connection refused")
    app = ZerodocApp(ScriptedSource([live, ended, gone]), refresh=None)
    async with app.run_test(size=SIZE) as pilot:
        await _first_frame(app, pilot)
        assert "● live" in screen_text(app)
        await app.refresh_now()
        await app.refresh_now()
        await pilot.pause()
        text = screen_text(app)
        assert app.frame.source_error and not app.frame.stale
    assert "■ ended" in text and "⚠ source error" not in text and "STALE" not in text
    assert "· source: ConnectionRefusedError" in " ".join(text.split())


class _AgedUnits:
    """A source whose per-unit stats were computed `age` seconds ago (what the Prometheus
    source does at scale: sources/prometheus.py reuses them across refreshes)."""

    def __init__(self, inner, age: float):
        self.inner, self.age = inner, age
        self.description = inner.description

    def snapshot(self):
        from zerodoc.unitstats import unit_stats

        snap = self.inner.snapshot()
        stats = unit_stats(snap, sorted(snap.ranks))
        stats.fetched_unix = time.time() - self.age
        snap.unit_stats = stats
        return snap


async def test_the_age_of_reused_per_unit_numbers_is_shown(tmp_path):
    run = write_run(tmp_path / "run", ranks=2, units=3, steps=4)
    shown = {}
    for age in (0.0, 90.0):
        app = ZerodocApp(_AgedUnits(open_source(str(run)), age), refresh=None)
        async with app.run_test(size=SIZE) as pilot:
            await _first_frame(app, pilot)
            shown[age] = " ".join(screen_text(app).split())
    assert "per-unit numbers" not in shown[0.0]
    # 90 s when computed, plus however long the frame took to reach the screen
    assert re.search(r"per-unit numbers 9\d s ago", shown[90.0]), shown[90.0][-400:]


def test_overview_comm_bound_label_has_a_finding_beside_it():
    """The Overview said "comm-bound" (exposed comm / compute past comm_compute_ratio_warn)
    while Findings was empty: run-wide, the label is now the rules' — comm-bound exactly when
    ZD006 is among the findings — including before any per-unit detail exists."""
    from tests.test_rules import _slow_link_case
    from zerodoc.diagnosis import diagnose
    from zerodoc.thresholds import DEFAULT
    from zerodoc.tui import views
    from zerodoc.tui.feed import Frame

    snap = _slow_link_case(0.04, compute_s=0.12)
    for w in snap.ranks.values():  # step totals only: no per-unit detail yet
        w.compute_total, w.exposed_total = w.compute_seconds, w.exposed_seconds
        w.comm, w.compute = {}, {}
    findings = diagnose(snap)
    frame = Frame(description="t", snapshot=snap, findings=findings)
    line = next(h for h in views.headlines(frame, views.MEAN) if h.label == "Comm/compute")
    assert float(line.value) >= DEFAULT.comm_compute_ratio_warn
    assert "comm-bound (ZD006)" in line.detail and any(f.code == "ZD006" for f in findings)
    # a ratio past the line that the rules do not call comm-bound is not labelled so
    quiet = Frame(description="t", snapshot=snap,
                  findings=[f for f in findings if f.code != "ZD006"])
    line = next(h for h in views.headlines(quiet, views.MEAN) if h.label == "Comm/compute")
    assert "compute-bound" in line.detail and "comm-bound" not in line.detail


def test_units_view_shows_all_reduce_when_a_unit_all_reduces():
    """DDP (the HF Trainer on CPU): the Units view showed `(model) ... 0 B 0 s` although the
    run log held every bucket's all-reduce (issue 20 item 6). Columns `AR ms` / `AR exp ms`
    appear when some unit all-reduces, with the snapshot's per-step numbers (mean and one
    rank); an FSDP table keeps its columns."""
    from zerodoc.testing.rulecases import snapshot_from_dict
    from zerodoc.tui import views
    from zerodoc.tui.feed import Frame, unit_totals

    def snap(coll: str):
        rank = {"steps": 4, "step": 0.5, "compute": [["(model)", "backward", 0.2]],
                "comm": [["(model)", "backward", coll, 3, 7.4e7, 0.030, 0.012]]}
        return snapshot_from_dict({"run": {"framework": "ddp", "zero_stage": 0},
                                   "units": [{"name": "(model)", "params": 18_500_000}],
                                   "ranks": [rank, {**rank, "comm": [[
                                       "(model)", "backward", coll, 3, 7.4e7, 0.050, 0.020]]}]})

    s = snap("all_reduce")
    frame = Frame(description="t", snapshot=s,
                  units={r: unit_totals(w) for r, w in s.ranks.items()})
    table = views.unit_table(frame, views.MEAN)
    labels = [c.label for c in table.columns]
    assert "AR ms" in labels and "AR exp ms" in labels
    row = dict(zip([c.key for c in table.columns], table.rows[0][1]))
    assert (row["ar_ms"], row["ar_exposed_ms"]) == ("40.0", "16.0")  # mean of 30 / 50, 12 / 20
    one = dict(zip([c.key for c in views.unit_table(frame, 1).columns],
                   views.unit_table(frame, 1).rows[0][1]))
    assert (one["ar_ms"], one["ar_exposed_ms"]) == ("50.0", "20.0")
    assert views.unit_table(frame, views.MEAN, sort="ar_ms").columns  # sortable
    fsdp = snap("all_gather")
    frame = Frame(description="t", snapshot=fsdp,
                  units={r: unit_totals(w) for r, w in fsdp.ranks.items()})
    table = views.unit_table(frame, views.MEAN, sort="ar_ms")
    assert not {"ar_ms", "ar_exposed_ms"} & {c.key for c in table.columns}
    assert [c.key for c in table.columns] == [c.key for c in views.UNIT_COLUMNS]
