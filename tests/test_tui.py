"""`zerodoc tui`: the Textual app on a real recorded run, driven with App.run_test() + Pilot;
text snapshots of each view; once in a real terminal (tmux); `zerodoc demo`'s live front end.

Snapshots live in tests/snapshots/tui_*.txt; regenerate with ZERODOC_UPDATE_SNAPSHOTS=1.
"""

from __future__ import annotations


import asyncio
import gc
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.helpers import ROOT, run_demo, until, wait_until
from zerodoc.diagnosis.findings import Finding, Severity
from zerodoc.runmodel import RunSnapshot
from zerodoc.runlog import load_run, read_rank_log, window_from_steps
from zerodoc.sources import open_source

pytest.importorskip("textual")

from zerodoc.tui import views  # noqa: E402
from zerodoc.tui.app import ZerodocApp  # noqa: E402
from zerodoc.tui.history import History  # noqa: E402
from zerodoc.tui.screens.help import HelpScreen  # noqa: E402
from zerodoc.testing.synthetic import append_steps, write_run  # noqa: E402
from zerodoc.testing.textshot import screen_text  # noqa: E402
from zerodoc.tui.widgets.table import ZTable  # noqa: E402
from zerodoc.runlog.sliding import SlidingWindows  # noqa: E402

SNAPSHOTS = Path(__file__).resolve().parent / "snapshots"
SIZE = (120, 36)
WINDOW = 20


# --------------------------------------------------------------------------------------
# fixtures and helpers


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    """A real 2-rank demo run (FSDP2 on gloo), 8 steps, cleanly ended. Per-unit detail on
    every step: these tests hold the TUI's tables and sliding windows to the run log step by
    step (each step's raw per-unit rows); the default mode's sampled steps are held to the
    report and to a witness from the raw lines in tests/test_one_number.py and
    tests/test_tui_sampled.py."""
    tmp = tmp_path_factory.mktemp("tui")
    run_demo(tmp, "rec", nprocs=2, steps=8, attach={"detail": "every"})
    return tmp / "rec"


def raw_log(path: Path) -> tuple[dict, list[dict], bool]:
    """Header, full step records and whether it ended, straight from the JSON lines (no
    zerodoc): the header and the end from the rank's log, the steps with their per-unit
    rows from its detail files (run log schema 2, docs/runlog.md)."""
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    rank = lines[0]["rank"]
    steps = {}
    for name in (f"{rank:05d}-a.jsonl", f"{rank:05d}-b.jsonl"):
        det = path.parent / "detail" / name
        if det.exists():
            for x in det.read_text().splitlines()[1:]:
                rec = json.loads(x)
                steps[rec["step"]] = rec
    return lines[0], [steps[k] for k in sorted(steps)], lines[-1]["type"] == "end"


def expected_units(run_dir: Path, rank: int, window: int = WINDOW) -> dict[str, dict]:
    """Per unit, per step over the window, from the raw run log: what the Units view shows."""
    head, steps, _ = raw_log(run_dir / f"rank-{rank:05d}.jsonl")
    steps = window_steps(steps, window)
    names = [u["name"] for u in head["units"]]
    group = {u["name"]: u["group_size"] for u in head["units"]}
    out = {n: {"ag_s": 0.0, "ag_exposed_s": 0.0, "ag_bytes": 0, "compute_s": 0.0, "rs_s": 0.0}
           for n in names}
    for st in steps:
        for u, _phase, coll, _n, nbytes, secs, exposed, _hid in st["comm"]:
            o = out[names[u]]
            if coll == "all_gather":
                o["ag_s"] += secs
                o["ag_exposed_s"] += exposed
                o["ag_bytes"] += nbytes
            elif coll == "reduce_scatter":
                o["rs_s"] += secs
        for u, _phase, secs in st["compute"]:
            out[names[u]]["compute_s"] += secs
    for name, o in out.items():
        g = group[name]
        o["busbw"] = (o["ag_bytes"] / o["ag_s"] * (g - 1) / g) if o["ag_s"] and g > 1 else None
        for k in ("ag_s", "ag_exposed_s", "ag_bytes", "compute_s", "rs_s"):
            o[k] /= len(steps)
    return out


RATE_GB = {"B/s": 1e-9, "kB/s": 1e-6, "MB/s": 1e-3, "GB/s": 1.0}


def cell_float(table: ZTable, row: str, col: str) -> float:
    """A cell's number; a bandwidth cell ("124.3 MB/s": its unit chosen by size) in GB/s."""
    num, _, unit = str(table.get_cell(row, col)).partition(" ")
    return float(num) * RATE_GB[unit] if unit else float(num)


def window_steps(steps: list[dict], window: int) -> list[dict]:
    """The steps a run directory's window shows: the last `window`, the warm-up step 1 left
    out when the window would start there (issue 20 item 10)."""
    steps = steps[-window:]
    return steps[1:] if len(steps) >= 2 and steps[0]["step"] == 1 else steps


def shown(number: float, cell: float) -> bool:
    """`cell` is `number` as the table formats it (2 decimals under 10, 1 under 1000)."""
    return abs(cell - number) <= (0.0051 if abs(number) < 10 else 0.051 if abs(number) < 1000
                                  else 0.51)


def rows_in_order(table: ZTable) -> list[str]:
    return [r.key.value for r in table.ordered_rows]


async def first_frame(app, pilot):
    await until(pilot, lambda: app.frame is not None, what="first frame")
    await pilot.pause()
    return app.frame


def app_text(app) -> str:
    return screen_text(app)


class ScriptedSource:
    """A source that plays back snapshots and exceptions, one per call (the last repeats)."""

    description = "scripted source"

    def __init__(self, script):
        self.script = list(script)
        self.calls = 0

    def snapshot(self):
        item = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        if isinstance(item, BaseException):
            raise item
        return item


def finding(code="ZD004", severity=Severity.WARNING, **kw) -> Finding:
    base = dict(
        code=code, name="exposed-all-gather", severity=severity,
        title="all-gathers exposed for 27% of the step: prefetch is not keeping up",
        evidence={"exposed_fraction": 0.27, "exposed_seconds_per_step": 0.0412,
                  "gather_bytes": 3 * 2**20},
        threshold={"exposed_fraction_warn": 0.10},
        fix="enable forward/backward prefetch; reshard_after_forward=False on late blocks",
        predicted="exposed all-gather 41 ms -> ~5 ms per step", units=("blocks.3",),
        ranks=(1,), doc="docs/rules.md#zd004")
    base.update(kw)
    return Finding(**base)


# --------------------------------------------------------------------------------------
# Pilot tests on the recorded run


async def test_views_switch_with_keys_and_help(recorded):
    app = ZerodocApp(open_source(str(recorded)), refresh=None)
    async with app.run_test(size=SIZE) as pilot:
        await first_frame(app, pilot)
        text = app_text(app)
        for words in ("Step time", "Exposed comm", "Comm/compute", "Worst unit", "Worst rank",
                      "Headroom", "Memory headroom per rank", "r0", "r1", "Quit"):
            assert words in text, words
        for key, view, marker in (("2", "units", "AG ms"), ("3", "findings", "Severity"),
                                  ("4", "ranks", "Comp÷median"), ("1", "overview", "Worst unit"),
                                  ("u", "units", "busbw"), ("r", "ranks", "Headroom GB")):
            await pilot.press(key)
            await pilot.pause()
            assert app.active_view == view
            assert marker in app_text(app), (key, marker)
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        assert "Keys" in app_text(app) and "mean over ranks" in app_text(app)
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, HelpScreen)
        await pilot.press("q")
        await pilot.pause()
    assert app.return_code in (0, None)


async def test_unit_table_matches_run_log(recorded):
    exp = {r: expected_units(recorded, r) for r in (0, 1)}
    app = ZerodocApp(open_source(str(recorded)), refresh=None)
    async with app.run_test(size=SIZE) as pilot:
        await first_frame(app, pilot)
        await pilot.press("2")
        await pilot.press("right_square_bracket")  # a single rank: rank 0
        await pilot.pause()
        assert app.scope == 0
        table = app.query_one("#units-table", ZTable)
        assert set(rows_in_order(table)) == set(exp[0])
        for unit, e in exp[0].items():
            assert shown(e["ag_s"] * 1e3, cell_float(table, unit, "ag_ms")), unit
            assert shown(e["ag_exposed_s"] * 1e3, cell_float(table, unit, "exposed_ms")), unit
            assert shown(e["ag_bytes"] / 1e6, cell_float(table, unit, "ag_mb")), unit
            assert shown(e["compute_s"] * 1e3, cell_float(table, unit, "compute_ms")), unit
            assert shown(e["rs_s"] * 1e3, cell_float(table, unit, "rs_ms")), unit
            assert shown(e["busbw"] / 1e9, cell_float(table, unit, "busbw")), unit
            assert shown(100 * e["ag_exposed_s"] / e["ag_s"],
                         cell_float(table, unit, "exposed_pct")), unit
        await pilot.press("right_square_bracket")  # rank 1
        await pilot.pause()
        for unit, e in exp[1].items():
            assert shown(e["ag_s"] * 1e3, cell_float(table, unit, "ag_ms")), unit
        await pilot.press("a")  # back to all ranks: the mean
        await pilot.pause()
        assert app.scope == views.MEAN and "mean of 2 ranks" in app_text(app)
        for unit in exp[0]:
            mean = (exp[0][unit]["compute_s"] + exp[1][unit]["compute_s"]) / 2
            assert shown(mean * 1e3, cell_float(table, unit, "compute_ms")), unit
        await pilot.press("a")  # the worst rank per column
        await pilot.pause()
        assert app.scope == views.WORST and "worst rank per column" in app_text(app)
        for unit in exp[0]:
            worst = max(exp[0][unit]["ag_exposed_s"], exp[1][unit]["ag_exposed_s"])
            assert shown(worst * 1e3, cell_float(table, unit, "exposed_ms")), unit
            low = min(exp[0][unit]["busbw"], exp[1][unit]["busbw"])
            assert shown(low / 1e9, cell_float(table, unit, "busbw")), unit


async def test_unit_table_sorts(recorded):
    app = ZerodocApp(open_source(str(recorded)), refresh=None)
    async with app.run_test(size=SIZE) as pilot:
        await first_frame(app, pilot)
        await pilot.press("2")
        await pilot.pause()
        table = app.query_one("#units-table", ZTable)

        def column(col):
            return [cell_float(table, r, col) for r in rows_in_order(table)]

        assert app.unit_sort == "exposed_ms"
        assert column("exposed_ms") == sorted(column("exposed_ms"), reverse=True)
        assert "Exposed ms ▼" in str(table.columns["exposed_ms"].label)
        seen = []
        for _ in range(len(views.UNIT_SORTS)):
            await pilot.press("s")
            await pilot.pause()
            seen.append(app.unit_sort)
            if app.unit_sort == "unit":
                assert rows_in_order(table) == sorted(rows_in_order(table))
            elif app.unit_sort == "busbw":  # the low end is the bad one: lowest first
                assert column("busbw") == sorted(column("busbw"))
            elif app.unit_sort in ("ag_ms", "compute_ms", "ag_mb", "rs_ms"):
                assert column(app.unit_sort) == sorted(column(app.unit_sort), reverse=True)
        assert set(seen) == set(views.UNIT_SORTS)
        while app.unit_sort != "compute_ms":
            await pilot.press("s")
        await pilot.press("S")  # reverse: smallest first
        await pilot.pause()
        assert column("compute_ms") == sorted(column("compute_ms"))
        assert "Compute ms ▲" in str(table.columns["compute_ms"].label)

        async def click_header(key):
            x = 0
            for c in table.ordered_columns:
                if c.key.value == key:
                    break
                x += c.get_render_width(table)
            await pilot.click(table, offset=(x + 1, 0))
            await pilot.pause()

        await click_header("ag_mb")  # a header click sorts by that column ...
        assert app.unit_sort == "ag_mb" and not app.unit_reverse
        assert column("ag_mb") == sorted(column("ag_mb"), reverse=True)
        await click_header("ag_mb")  # ... and a second click reverses
        assert app.unit_reverse and column("ag_mb") == sorted(column("ag_mb"))


async def test_rank_view_matches_run_log_and_selects_a_rank(recorded):
    app = ZerodocApp(open_source(str(recorded)), refresh=None)
    async with app.run_test(size=SIZE) as pilot:
        await first_frame(app, pilot)
        await pilot.press("4")
        await pilot.pause()
        table = app.query_one("#ranks-table", ZTable)
        for r in (0, 1):
            _, steps, ended = raw_log(recorded / f"rank-{r:05d}.jsonl")
            steps = window_steps(steps, WINDOW)
            mean_step = sum(s["step_s"] for s in steps) / len(steps)
            compute = sum(x[2] for s in steps for x in s["compute"]) / len(steps)
            assert ended
            assert str(table.get_cell(str(r), "state")) == "ended"
            assert int(str(table.get_cell(str(r), "last_step"))) == steps[-1]["step"]
            assert shown(mean_step * 1e3, cell_float(table, str(r), "step_ms"))
            assert shown(compute * 1e3, cell_float(table, str(r), "compute_ms"))
        table.move_cursor(row=table.get_row_index("1"))
        await pilot.press("enter")
        await pilot.pause()
        assert app.scope == 1 and app.active_view == "units"
        assert "rank 1" in app_text(app)


async def test_findings_come_from_the_diagnosis_facade(recorded, monkeypatch):
    import zerodoc.diagnosis as diagnosis

    # the window as the TUI's source (and `zerodoc report`) reads it: warm-up step 1 left out
    expected = [f.code for f in diagnosis.diagnose(
        load_run(recorded, window=WINDOW, skip_warmup=True))]
    app = ZerodocApp(open_source(str(recorded)), refresh=None)
    async with app.run_test(size=SIZE) as pilot:
        frame = await first_frame(app, pilot)
        assert [f.code for f in frame.findings] == expected
        await pilot.press("3")
        await pilot.pause()
        table = app.query_one("#findings-table", ZTable)
        assert [str(table.get_cell(r, "code")) for r in rows_in_order(table)] == expected

    calls = []

    def recorder(snap):
        calls.append(snap)
        return [finding()]

    monkeypatch.setattr(diagnosis, "diagnose", recorder)
    app = ZerodocApp(open_source(str(recorded)), refresh=None)
    async with app.run_test(size=SIZE) as pilot:
        frame = await first_frame(app, pilot)
        assert calls and isinstance(calls[0], RunSnapshot) and sorted(calls[0].ranks) == [0, 1]
        assert [f.code for f in frame.findings] == ["ZD004"]


async def test_findings_view_shows_evidence_threshold_fix(recorded):
    fs = [finding(), finding("ZD010", Severity.INFO, name="straggler",
                             title="rank 1 computes 1.3x slower", evidence={"ratio": 1.3},
                             threshold={"straggler_ratio_warn": 1.25}, fix="compare ranks",
                             predicted=None, units=(), doc="")]
    app = ZerodocApp(open_source(str(recorded)), refresh=None, diagnose=lambda s: fs)
    async with app.run_test(size=SIZE) as pilot:
        await first_frame(app, pilot)
        assert "WARNING" in app_text(app) and "ZD004" in app_text(app)  # overview: top finding
        await pilot.press("3")
        await pilot.pause()
        text = app_text(app)
        for words in ("WARNING", "ZD004", "exposed-all-gather", "exposed fraction = 27.0%",
                      "exposed = 41.2 ms/step", "gather = 3.1 MB",
                      "exposed fraction warn = 10.0%", "enable forward/backward prefetch",
                      "exposed all-gather 41 ms -> ~5 ms per step", "blocks.3"):
            assert words in text, words
        await pilot.press("down")
        await pilot.pause()
        text = app_text(app)
        assert "straggler" in text and "straggler ratio warn = 1.25" in text


async def test_findings_view_shows_the_whatif_of_the_selected_fix(tmp_path):
    """A recorded slow-link run, diagnosed for real: the selected finding (ZD005, its fix the
    all-gathers' fixed delay removed, their latency set to gloo-cpu's healthy 2 ms per call,
    the range down to 0, at the per-byte cost the run fitted) shows a "what-if"
    line with the step model's answer, the same numbers `zerodoc.whatif` gives for that
    change on the same run."""
    from zerodoc.humanize import secs
    from zerodoc.whatif import Changes, answer, fit

    run = tmp_path / "slow-link"
    shutil.copytree(Path(__file__).parent / "data" / "scenarios" / "slow-link-50ms", run)
    app = ZerodocApp(open_source(str(run)), refresh=None)
    async with app.run_test(size=(200, 60)) as pilot:
        frame = await first_frame(app, pilot)
        assert frame.findings[0].code == "ZD005", [f.code for f in frame.findings]
        await pilot.press("3")
        await pilot.pause()
        text = " ".join(app_text(app).split())
    ans = answer(fit(open_source(str(run)).snapshot()),
                 Changes(latency_set_s=0.002, latency_set_low_s=0.0,
                         latency_kind="all_gather"))
    p, b = ans["predicted"], ans["baseline"]
    assert "what-if" in text and "latency set to 2 ms, range from 0 ms (all_gather)" in text, \
        text
    want = f"step {secs(b['step_s'])} -> {secs(p['step_s'])} ({secs(p['step_s_range'][0])}-"
    assert want in text, (want, text)
    assert f"exposed comm {secs(b['exposed_comm_s'])} -> {secs(p['exposed_comm_s'])}" in text
    assert text.count("what-if (latency") == 1  # on its own line, not again in "predicted"
    assert "with the link fixed, modelled as the all-gather collectives' fixed delay" in text


async def test_findings_view_whatif_with_a_link_profile(tmp_path):
    """`zerodoc tui --link-profile`: the selected fix's what-if is the step model's with the
    measured link profile, the same answer `zerodoc report --link-profile` gives (a recorded
    too-fine wrapping: ZD002's merge priced past the run's sizes by the profile)."""
    import json as _json

    from tests.test_report import CONVEX_PROFILE
    from zerodoc.diagnosis import diagnose
    from zerodoc.tui.app import diagnose_with
    from zerodoc.whatif.linkprofile import profile_from_dict

    run = tmp_path / "wrap-linear"
    shutil.copytree(Path(__file__).parent / "data" / "scenarios" / "wrap-linear", run)
    path = tmp_path / "profile.json"
    path.write_text(_json.dumps(CONVEX_PROFILE))
    prof = profile_from_dict(CONVEX_PROFILE, str(path))
    app = ZerodocApp(open_source(str(run)), refresh=None, diagnose=diagnose_with(prof))
    async with app.run_test(size=(200, 60)) as pilot:
        frame = await first_frame(app, pilot)
        codes = [f.code for f in frame.findings]
        assert "ZD002" in codes, codes
        await pilot.press("3")
        await pilot.pause()
        for _ in range(codes.index("ZD002")):
            await pilot.press("down")
        await pilot.pause()
        text = " ".join(app_text(app).split())
    want = next(f for f in diagnose(open_source(str(run)).snapshot(), link_profile=prof)
                if f.code == "ZD002")
    assert f"priced by the link profile {path}" in text, text
    # the step model's answer with the profile, as the report's finding has it
    import re

    exposed = re.search(r"exposed comm \S+ ms -> \S+ ms \([^)]*\)", want.predicted).group(0)
    assert exposed in text, (exposed, text)


# --------------------------------------------------------------------------------------
# stale, vanishing and failing sources


def make_stale_copy(recorded: Path, dest: Path) -> Path:
    """Rank 0 as recorded (ended); rank 1 stops after 4 steps, no end line, an hour old:
    its first 4 recorded steps written again through the real writer, shifted an hour back,
    and left the way a killed job leaves its log."""
    from zerodoc.runlog import RunLogWriter, facts_from_dict
    from zerodoc.runlog.replay import Replay

    shutil.copytree(recorded, dest, ignore=shutil.ignore_patterns("logs"))
    head, steps, _ = raw_log(recorded / "rank-00001.jsonl")
    (dest / "rank-00001.jsonl").unlink()
    for p in (dest / "detail").glob("00001-*"):
        p.unlink()
    head["started_unix"] -= 3600
    rep = Replay(RunLogWriter(dest, 1), facts_from_dict(head))
    for rec in steps[:4]:
        rep.step({**rec, "end_unix": rec["end_unix"] - 3600})
    rep.close(end=False)
    old = time.time() - 3600
    os.utime(dest / "rank-00001.jsonl", (old, old))
    return dest


async def test_stale_rank_is_shown_stale(recorded, tmp_path):
    run = make_stale_copy(recorded, tmp_path / "stale")
    app = ZerodocApp(open_source(str(run)), refresh=None)
    async with app.run_test(size=SIZE) as pilot:
        frame = await first_frame(app, pilot)
        assert set(frame.stale) == {1} and frame.snapshot.stale_ranks == {1}
        text = app_text(app)
        assert "rank 1 STALE" in text and "1 stale" in text
        await pilot.press("4")
        await pilot.pause()
        table = app.query_one("#ranks-table", ZTable)
        # 60 minutes old when copied; a loaded host may take a minute or more to show it
        assert re.match(r"STALE 6\dm", str(table.get_cell("1", "state")))
        assert str(table.get_cell("0", "state")) == "ended"
        assert int(str(table.get_cell("1", "last_step"))) == 4
        await pilot.press("2")  # aggregates leave the stale rank out
        await pilot.pause()
        assert "mean of 1 rank" in app_text(app)


async def test_vanishing_rank_and_failing_source_never_crash(recorded):
    both = load_run(recorded, window=WINDOW)
    only0 = load_run(recorded, window=WINDOW)
    del only0.ranks[1]
    both.ended_ranks.clear()  # as a live run: a rank that vanishes without an end is stale
    only0.ended_ranks.clear()
    src = ScriptedSource([both, only0, ConnectionRefusedError(111, "Connection refused"),
                          RuntimeError("garbled /metrics page"), "not a snapshot", both])
    app = ZerodocApp(src, refresh=None)
    async with app.run_test(size=SIZE) as pilot:
        await first_frame(app, pilot)
        assert not app.frame.stale and not app.frame.source_error
        await pilot.press("4")
        await app.refresh_now()  # rank 1 vanished: kept, with its last numbers, as stale
        await pilot.pause()
        assert app.frame.stale == {1: "stopped reporting"}
        table = app.query_one("#ranks-table", ZTable)
        assert str(table.get_cell("1", "state")).startswith("STALE")
        assert sorted(app.frame.snapshot.ranks) == [0, 1]
        for expect in ("Connection refused", "garbled /metrics page", "not a RunSnapshot"):
            await app.refresh_now()
            await pilot.pause()
            assert expect in app.frame.source_error
            text = app_text(app)
            assert "source error" in text and expect in text
            assert sorted(app.frame.snapshot.ranks) == [0, 1]  # last good numbers stay
            for view in "1234":
                await pilot.press(view)
                await pilot.pause()
            assert app.display_error is None
        await app.refresh_now()  # the source is back
        await pilot.pause()
        assert app.frame.source_error is None and not app.frame.stale
        assert "source error" not in app_text(app)


async def test_odd_windows_and_failing_rules_do_not_crash(recorded):
    snap = load_run(recorded, window=WINDOW)
    w0 = snap.ranks[0]
    odd = RunSnapshot(source="odd")
    odd.ranks[0] = window_from_steps(w0.facts, [])  # a rank with no step yet
    odd.ranks[1] = snap.ranks[1]
    odd.ranks[1].memory = {}  # no memory numbers
    odd.ranks[1].comm[("not-a-unit", "forward", "all_gather")] = \
        next(iter(odd.ranks[1].comm.values())).copy()

    def broken_rules(s):
        raise ValueError("rule bug")

    app = ZerodocApp(ScriptedSource([odd]), refresh=None, diagnose=broken_rules)
    async with app.run_test(size=SIZE) as pilot:
        await first_frame(app, pilot)
        for view in "12341":
            await pilot.press(view)
            await pilot.pause()
            assert app.display_error is None, app.display_error
        assert "diagnosis failed: ValueError: rule bug" in app.frame.diagnose_error
        assert "not-a-unit" in {k for k, _ in views.unit_table(app.frame, views.MEAN).rows}


# --------------------------------------------------------------------------------------
# live refresh, coalescing, pause


async def test_live_refresh_is_coalesced(tmp_path):
    run = write_run(tmp_path / "live", ranks=2, units=4, steps=5, started_unix=time.time() - 5,
                    end=False)
    app = ZerodocApp(open_source(str(run)), refresh=0.1, diagnose=lambda s: [])
    async with app.run_test(size=SIZE) as pilot:
        await first_frame(app, pilot)
        await pilot.press("2")
        await pilot.pause()
        table = app.query_one("#units-table", ZTable)
        applied, updates, fetched = app.frames_applied, table.updates, app.feed.refreshes
        await until(pilot, lambda: app.feed.refreshes >= fetched + 3, what="timer refreshes")
        assert (app.frames_applied, table.updates) == (applied, updates)  # nothing new
        append_steps(run, ranks=2, units=4, first_step=6, count=2, end_unix=time.time())
        await until(pilot, lambda: app.frame.snapshot.ranks[1].last_step == 7, what="step 7")
        await pilot.pause()
        assert app.frames_applied > applied and table.updates > updates
        assert app.frame.history[0].steps[-2:] == (6, 7)
        await pilot.press("p")
        await pilot.pause()
        assert app.paused and "paused" in app_text(app)
        fetched = app.feed.refreshes
        await pilot.pause(0.4)
        assert app.feed.refreshes == fetched
        await pilot.press("p")
        await until(pilot, lambda: app.feed.refreshes > fetched, what="resumed refresh")


def test_sliding_windows_equal_window_from_steps(recorded, tmp_path):
    syn = write_run(tmp_path / "syn", ranks=1, units=5, steps=45)
    for path in (recorded / "rank-00000.jsonl", syn / "rank-00000.jsonl"):
        full = read_rank_log(path)
        for window in (1, 3, WINDOW, None):
            sw = SlidingWindows(window)
            log = type(full)(facts=full.facts)
            for i, step in enumerate(full.steps):
                log.steps.append(step)
                if i % 2 and i != len(full.steps) - 1:
                    continue  # sometimes two new steps per update
                got = sw.update({0: log})[0]
                del log.steps[:-1]  # the feed drops consumed records like this
                lo = max(0, i + 1 - window) if window else 0
                ref = window_from_steps(full.facts, full.steps[lo:i + 1])
                assert (got.steps, got.first_step, got.last_step, got.step_times, got.memory) \
                    == (ref.steps, ref.first_step, ref.last_step, ref.step_times, ref.memory)
                assert got.step_seconds == pytest.approx(ref.step_seconds, rel=1e-9)
                assert got.compute == pytest.approx(ref.compute, rel=1e-9, abs=1e-12)
                assert set(got.comm) == set(ref.comm)
                for k, t in ref.comm.items():
                    g = got.comm[k]
                    assert (g.count, g.bytes) == (t.count, t.bytes)
                    assert (g.seconds, g.exposed_seconds, g.hidden_seconds) == pytest.approx(
                        (t.seconds, t.exposed_seconds, t.hidden_seconds), rel=1e-9, abs=1e-12)


def test_history_from_cumulative_and_sliding_windows(recorded):
    log = read_rank_log(recorded / "rank-00000.jsonl")
    h = History(length=50)
    for i in range(1, len(log.steps) + 1):  # an exporter: cumulative since the start
        w = window_from_steps(log.facts, log.steps[:i])
        w.step_times = []  # a scrape has no per-step times
        h.add_window(0, w)
        h.add_window(0, w)  # the same scrape again adds nothing
    s = h.series(0)
    assert s.steps == tuple(x.step for x in log.steps)
    for i, rec in enumerate(log.steps):
        assert s.step_seconds[i] == pytest.approx(rec.step_seconds, rel=1e-9)
        assert s.compute_seconds[i] == pytest.approx(sum(rec.compute.values()), rel=1e-9)
        assert s.exposed_seconds[i] == pytest.approx(
            sum(t.exposed_seconds for t in rec.comm.values()), rel=1e-9, abs=1e-12)


HTA_TRACES = ROOT / "tests" / "data" / "traces" / "hta"


@pytest.mark.parametrize("traces", ["trace_filter", "ns_resolution_trace"])
async def test_overview_shows_the_reports_trace_scope_and_device_table(traces, capsys):
    """Issue 20: on profiler traces (real A100 traces from HTA's tests, no FSDP annotations)
    the TUI shows what `zerodoc report` prints under its step breakdown: what the traces let
    zerodoc say and what not, and the device time per rank. The witness is the report's own
    text, line for line; a TUI that lost either block, or a row, fails."""
    from zerodoc.cli.main import main

    assert main(["report", str(HTA_TRACES / traces)]) == 0
    report = capsys.readouterr().out.splitlines()
    start = next(i for i, x in enumerate(report) if x.startswith("Profiler traces:"))
    block = [" ".join(x.split()) for x in report[start:] if x.strip()]
    assert any(x.startswith("Device time (per step") for x in block)
    assert sum(x.split()[0].isdigit() for x in block) >= 1  # device rows: the check has teeth
    app = ZerodocApp(open_source(str(HTA_TRACES / traces)), refresh=None)
    async with app.run_test(size=(140, 44)) as pilot:
        await first_frame(app, pilot)
        text = screen_text(app)
    # the overview wraps long lines: compare word sequences
    words = " ".join(text.split())
    for line in block:
        assert line in words, line
    assert "No findings: nothing crossed a threshold" not in text  # traces say what they lack
    # a recording: not "live", and no age from a wall clock the trace does not carry
    assert "recorded trace" in text and "● live" not in text, text
    assert not re.search(r"\d{4,}h ago", text), text


async def test_overview_of_a_run_log_has_no_trace_block(snapshot_run):
    app = ZerodocApp(open_source(str(snapshot_run)), refresh=None)
    async with app.run_test(size=SIZE) as pilot:
        await first_frame(app, pilot)
        assert not app.query_one("#ov-trace").display
        assert "Profiler traces" not in screen_text(app)


# --------------------------------------------------------------------------------------
# text snapshots (deterministic: synthetic run log, fixed clock, fixed findings, no timer)

SNAP_T0 = 1_700_000_000.0


@pytest.fixture(scope="module")
def snapshot_run(tmp_path_factory) -> Path:
    """4 ranks x 6 units x 12 steps; rank 3 a straggler; rank 2 stopped after step 6."""
    return write_run(tmp_path_factory.mktemp("snap") / "snap", ranks=4, units=6, steps=12,
                     straggler=3, started_unix=SNAP_T0, end=True, stop_rank_after={2: 6})


def check_snapshot(name: str, text: str) -> None:
    path = SNAPSHOTS / f"tui_{name}.txt"
    if os.environ.get("ZERODOC_UPDATE_SNAPSHOTS") == "1":
        SNAPSHOTS.mkdir(exist_ok=True)
        path.write_text(text)
        return
    assert path.exists(), f"{path} missing: run with ZERODOC_UPDATE_SNAPSHOTS=1"
    want = path.read_text()
    if text != want:
        import difflib

        diff = "\n".join(difflib.unified_diff(want.splitlines(), text.splitlines(),
                                              "committed", "rendered", lineterm=""))
        pytest.fail(f"snapshot {path.name} differs (ZERODOC_UPDATE_SNAPSHOTS=1 to accept):\n"
                    f"{diff}")


@pytest.mark.parametrize("view, keys", [("overview", ""), ("units", "2"), ("findings", "3"),
                                        ("ranks", "4"), ("units_rank3", "2]]]]"),
                                        ("help", "?")])
async def test_snapshot(snapshot_run, view, keys):
    source = open_source(str(snapshot_run))
    source.description = "run log synthetic (4 ranks x 6 units)"
    fs = [finding(), finding("ZD010", Severity.INFO, name="straggler", units=(), ranks=(3,),
                             title="rank 3 computes 1.30x slower than the others")]
    app = ZerodocApp(source, refresh=None, diagnose=lambda s: fs,
                     clock=lambda: SNAP_T0 + 600)  # no timer: nothing moves under the camera
    app.animation_level = "none"
    async with app.run_test(size=SIZE) as pilot:
        await first_frame(app, pilot)
        for key in keys:
            await pilot.press({"?": "question_mark", "]": "right_square_bracket"}.get(key, key))
            await pilot.pause()
        await pilot.pause()
        check_snapshot(view, screen_text(app))


# --------------------------------------------------------------------------------------
# CLI, import hygiene, a real terminal, the live demo


def test_cli_bad_arguments_exit_2(recorded, capsys):
    from zerodoc.cli.main import main

    for argv, msg in ((["tui", "--refresh", "0", str(recorded)], "--refresh"),
                      (["tui", "--window", "-1", str(recorded)], "--window"),
                      (["tui", "/no/such/run/dir"], "no run directory"),
                      (["tui", "nonsense-source"], "neither a run directory"),
                      (["tui", "--link-profile", "/no/such.json", str(recorded)],
                       "--link-profile /no/such.json: no such file"),
                      (["tui", str(recorded)], "interactive terminal")):  # pytest: no TTY
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("zerodoc tui: error:") and msg in err[0], err


def test_tmux_real_terminal(recorded):
    tmux = shutil.which("tmux")
    if tmux is None:
        pytest.skip("tmux binary not found")
    sock = f"zerodoc-test-{os.getpid()}"
    base = [tmux, "-L", sock, "-f", "/dev/null"]
    # COLUMNS/LINES from this process would override the pane's size inside the app
    cmd = (f"env -u COLUMNS -u LINES {sys.executable} -m zerodoc tui {recorded} --refresh 0.5; "
           f"echo ZERODOC_EXIT=$?; sleep 60")

    def screen() -> str:
        return subprocess.run([*base, "capture-pane", "-p", "-t", "tui"], capture_output=True,
                              text=True).stdout

    def wait_for(*texts: str, timeout: float = 30.0) -> str:
        try:
            return wait_until(lambda: (out := screen()) and all(t in out for t in texts)
                              and out, timeout, f"{texts} on the screen", interval=0.2)
        except AssertionError:
            out = screen()
            raise AssertionError(f"{[t for t in texts if t not in out]} never appeared:\n{out}"
                                 ) from None

    try:
        subprocess.run([*base, "new-session", "-d", "-s", "tui", "-x", "120", "-y", "36", cmd],
                       check=True, cwd=ROOT)
        wait_for("zerodoc", "run log", "Overview", "Units", "Findings", "Ranks", "Step time",
                 "Exposed comm", "Comm/compute", "Worst unit", "Worst rank", "Headroom",
                 "2 ranks", "r0", "r1", "■ ended", "? Help", "q Quit")
        subprocess.run([*base, "send-keys", "-t", "tui", "2"], check=True)
        wait_for("Exposed ms ▼", "blocks.0", "(root)")
        subprocess.run([*base, "send-keys", "-t", "tui", "q"], check=True)
        wait_for("ZERODOC_EXIT=0", timeout=15)
    finally:
        subprocess.run([*base, "kill-server"], capture_output=True)


@pytest.mark.slow
def test_demo_opens_the_tui_and_stops_the_job_on_quit(tmp_path, monkeypatch, capsys):
    """`zerodoc demo` (not --headless, on a terminal) runs `run_live_demo`: the job starts, the
    app follows it live, and quitting stops every rank."""
    from zerodoc.cli.main import build_parser
    from zerodoc.demo import live
    from zerodoc.demo.live import spec_from_args
    from zerodoc.tui import app as appmod

    seen = {}

    def headless_run(self):
        async def drive():
            async with self.run_test(size=SIZE) as pilot:
                await until(pilot, lambda: self.frame is not None and any(
                    w.steps >= 2 for w in self.frame.snapshot.ranks.values()), timeout=120,
                    what="two live steps")
                seen["job"] = self.job
                seen["running"] = self.job.running()
                seen["text"] = screen_text(self)
                await pilot.press("q")

        asyncio.run(drive())

    monkeypatch.setattr(appmod.ZerodocApp, "run", headless_run)
    monkeypatch.setattr(appmod, "tune_gc", lambda: None)  # keep this process's GC as it is
    monkeypatch.setattr(gc, "freeze", lambda: None)
    args = build_parser().parse_args(["demo", "--ranks", "2", "--steps", "0", "--port", "0",
                                      "--blocks", "2", "--run-dir", str(tmp_path / "live")])
    assert live.run_live_demo(args, spec_from_args(args)) == 0
    assert seen["running"] and "demo running" in seen["text"] and "Step time" in seen["text"]
    assert all(p.poll() is not None for p in seen["job"].procs)  # quit stopped every rank
    assert "Run log" in capsys.readouterr().out


@pytest.mark.slow
def test_bench_script_runs_small(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "tui_render.py"), "--ranks", "4",
                        "--units", "8", "--steps", "4", "--refreshes", "2", "--run-dir",
                        str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert "RESULT: 4 ranks x 8 units" in r.stdout, r.stdout + r.stderr
    assert r.returncode == 0, r.stdout + r.stderr
