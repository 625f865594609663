"""One run, one window, one number (issue 31, point 2): `zerodoc report`, the TUI, `compare`
and `whatif` give the same figure for the same quantity of a run recorded in the default
mode (per-unit detail on sampled steps only), or name the definition beside it; each held
to an independent witness computed here from the run's raw JSON lines.

The run: tests/data/scenarios/sampled-default-50 (`ZERODOC_DETAIL=adaptive zerodoc demo
--headless --steps 50`, 2 gloo ranks; samples on steps 1, 2, 3, 23 and 31). Its default
window, the last 20 steps (31-50), holds one sample (31); its per-unit figures come from the
newest three samples after the warm-up step: 3, 23 and 31.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from tests.support.helpers import until
from zerodoc.sources import open_source

RUN = Path(__file__).parent / "data" / "scenarios" / "sampled-default-50"
WINDOW = 20
SAMPLES = (3, 23, 31)
UNIT = "blocks.0"


def raw(rank: int) -> dict[int, dict]:
    """The rank's full step records by step, straight from its detail file."""
    out = {}
    for line in (RUN / "detail" / f"{rank:05d}-a.jsonl").read_text().splitlines():
        d = json.loads(line)
        if d.get("type") == "step":
            out[d["step"]] = d
    return out


def units() -> list[str]:
    head = json.loads((RUN / "rank-00000.jsonl").read_text().splitlines()[0])
    return [u["name"] for u in head["units"]]


def witness() -> dict:
    """The figures computed by hand from the raw records of the SAMPLES: exposed comm per
    step per rank (all collectives), the link-attributable sum (per unit, phase and
    collective the smaller rank's), the unit's all-gather busbw (mean bytes / mean seconds
    over the ranks, x (n-1)/n for 2 ranks)."""
    names = units()
    per_rank, keys, ag = {}, {}, {}
    for r in (0, 1):
        recs = raw(r)
        assert all(recs[s]["detail"] for s in SAMPLES)
        per_rank[r] = sum(row[6] for s in SAMPLES for row in recs[s]["comm"]) / len(SAMPLES)
        for s in SAMPLES:
            for u, phase, coll, _n, nbytes, secs, exposed, _h in recs[s]["comm"]:
                k = (u, phase, coll)
                keys.setdefault(k, {}).setdefault(r, 0.0)
                keys[k][r] += exposed / len(SAMPLES)
                if names[u] == UNIT and coll == "all_gather":
                    b, t = ag.get(r, (0.0, 0.0))
                    ag[r] = (b + nbytes / len(SAMPLES), t + secs / len(SAMPLES))
    link = sum(min(v.values()) for v in keys.values())
    mean_b = sum(b for b, _ in ag.values()) / 2
    mean_t = sum(t for _, t in ag.values()) / 2
    return {"per_rank": per_rank, "mean": sum(per_rank.values()) / 2,
            "worst": max(per_rank.values()), "link": link, "busbw": mean_b / mean_t * 0.5}


def cli(*args: str) -> str:
    from zerodoc.cli.main import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(list(args)) == 0
    return out.getvalue()


@pytest.fixture(scope="module")
def report() -> dict:
    return json.loads(cli("report", str(RUN), "--window", str(WINDOW), "--json"))


def test_the_report_matches_the_witness_and_names_each_definition(report):
    w = witness()
    e = report["exposed_comm"]
    assert [s["exposed_comm_seconds"] for s in report["steps"]] == \
        pytest.approx([w["per_rank"][0], w["per_rank"][1]], rel=1e-5)
    assert (e["mean_over_ranks"], e["worst_rank"], e["link_attributable"]) == \
        pytest.approx((w["mean"], w["worst"], w["link"]), rel=1e-6)
    assert e["definitions"] == {"mean_over_ranks": "all collectives, mean over ranks",
                                "worst_rank": "all collectives, worst rank",
                                "link_attributable": "link-attributable"}
    row = next(u for u in report["units"] if u["unit"] == UNIT)
    assert row["all_gather_busbw_bytes_per_second"] == pytest.approx(w["busbw"], rel=1e-5)
    # which steps: the samples, named, and the breakdown says its parts' steps differ
    assert "from steps 3, 23, 31; steps 3, 23 before the window (31-50)" in e["covers"]
    assert report["breakdown_steps"]["sampled_steps"] == \
        ["compute_seconds", "exposed_comm_seconds", "framework_seconds"]
    text = cli("report", str(RUN), "--window", str(WINDOW))
    assert "exposed comm per step: " in text and "link-attributable (per unit the rank " \
        "that waited least: what ZD006 grades and compare observes)" in text
    assert "step, optimizer and other: every step of the window (31-50); compute, exposed " \
        "comm and framework: the means of the sampled steps named above" in text


async def test_the_tui_shows_the_reports_numbers(report):
    """The TUI's Overview headline (mean over ranks) and its Units view (busbw of the
    unit), on screen, read what the report says (they read 489.9 vs 452 / 528 ms and 107.4
    vs 76.8 MB/s in issue 31)."""
    pytest.importorskip("textual")
    from zerodoc import humanize as fmt
    from zerodoc.testing.textshot import screen_text
    from zerodoc.tui import views
    from zerodoc.tui.app import ZerodocApp

    e = report["exposed_comm"]
    row = next(u for u in report["units"] if u["unit"] == UNIT)
    app = ZerodocApp(open_source(str(RUN), window=WINDOW), refresh=None)
    async with app.run_test(size=(160, 40)) as pilot:
        await until(pilot, lambda: app.frame is not None, what="first frame")
        await pilot.pause()
        shown = screen_text(app)
        assert f"{fmt.duration(e['mean_over_ranks'])}/step the compute waited (all " \
            "collectives, mean over ranks)" in shown
        assert views.unit_values(app.frame, views.MEAN)[UNIT]["ag_busbw"] == \
            pytest.approx(row["all_gather_busbw_bytes_per_second"], rel=1e-5)
        await pilot.press("2")
        await pilot.pause()
        line = next(x for x in screen_text(app).splitlines() if f" {UNIT} " in x)
        assert fmt.bandwidth(row["all_gather_busbw_bytes_per_second"]) in line
        await pilot.press("a")  # the worst rank: its own exposed figure
        await pilot.press("1")
        await pilot.pause()
        assert f"{fmt.duration(e['worst_rank'])}/step the compute waited (all collectives, " \
            "worst rank)" in screen_text(app)


def test_compare_and_whatif_read_the_same_numbers(report):
    """compare's observed exposed communication is the report's link-attributable figure;
    whatif's measured one (the worst rank's, all collectives) the report's worst rank, and
    its text says which."""
    from zerodoc.compare.judge import side

    e = report["exposed_comm"]
    s = side(open_source(str(RUN), window=WINDOW).snapshot(), str(RUN))
    assert s.observed["exposed_comm_seconds_per_step"] == pytest.approx(e["link_attributable"],
                                                                        rel=1e-6)
    doc = json.loads(cli("whatif", str(RUN), "--window", str(WINDOW), "--json"))
    assert doc["measured"]["exposed_comm_s"] == pytest.approx(e["worst_rank"], rel=1e-6)
    assert doc["covers"] == e["covers"]
    text = cli("whatif", str(RUN), "--window", str(WINDOW))
    assert "measured: the worst rank's means; exposed comm: all collectives (the newest 3 " \
        "sampled steps (from steps 3, 23, 31;" in text
    assert "not the link-attributable part ZD006 grades" in text
