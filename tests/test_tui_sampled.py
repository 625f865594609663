"""The TUI in the default mode (issue 31, point 5), driven with App.run_test() + Pilot:
`1` / `o` from Findings go to Overview; the per-step sparklines show sampled steps as
samples (a step without a value is a gap, never the previous sample repeated); a finding's
severity is shown with the figure it was graded on.

Run logs are synthetic (`zerodoc.testing.synthetic.write_run`, through the real writer)."""

from __future__ import annotations

import pytest

from tests.support.helpers import until
from zerodoc.sources import open_source
from zerodoc.testing.synthetic import write_run

pytest.importorskip("textual")

from zerodoc.testing.textshot import screen_text  # noqa: E402
from zerodoc.tui import views  # noqa: E402
from zerodoc.tui.app import ZerodocApp  # noqa: E402


async def _opened(app, pilot):
    await until(pilot, lambda: app.frame is not None and app.frame.snapshot.ranks,
                what="first frame")
    await pilot.pause()


@pytest.mark.parametrize("key", ["1", "o"])
async def test_overview_keys_work_from_findings(tmp_path, key):
    """They did not: the Findings table kept the focus in its hidden pane and the tabs
    switched back to it."""
    run = write_run(tmp_path / "run", ranks=2, units=4, steps=12, straggler=1)
    app = ZerodocApp(open_source(str(run)), refresh=None)
    async with app.run_test(size=(120, 36)) as pilot:
        await _opened(app, pilot)
        for _ in range(2):  # and again, after a row was highlighted
            await pilot.press("3")
            await pilot.pause()
            assert app.active_view == "findings"
            await pilot.press("down")
            await pilot.press(key)
            await pilot.pause()
            assert app.active_view == "overview"
            assert "Worst unit" in screen_text(app)
        await pilot.press("3")  # the other views still switch from Findings
        await pilot.press("2")
        await pilot.pause()
        assert app.active_view == "units"


def _spark(app, label: str) -> str:
    """The cells of one sparkline row as shown (between its label and its value)."""
    line = next(x for x in screen_text(app).splitlines() if x.lstrip().startswith(label))
    return line.split(label, 1)[1].split(" last ", 1)[0].strip("\n")


async def test_sparklines_show_sampled_steps_as_samples(tmp_path):
    """30 steps, per-unit detail on every 5th: the step-time line has a cell per step, the
    exposed-comm and compute lines one filled cell per sampled step and gaps between (the
    old Sparkline got the 6 samples only and stretched them into blocks across its width)."""
    run = write_run(tmp_path / "run", ranks=2, units=4, steps=30, straggler=None,
                    sample_every=5)
    app = ZerodocApp(open_source(str(run), window=30), refresh=None)
    async with app.run_test(size=(200, 40)) as pilot:
        await _opened(app, pilot)
        series = views.sparkline_series(app.frame, views.MEAN)
        got = [i for i, x in enumerate(series["exposed"]) if x is not None]
        assert len(series["exposed"]) >= 29 and len(got) == 6  # steps 5, 10, ..., 30
        step = _spark(app, "step time")
        exposed = _spark(app, "exposed comm")
        compute = _spark(app, "compute")
        bars = set(views.SPARK_BARS)
        assert sum(c in bars for c in step) == len(series["step"])
        for cells in (exposed, compute):
            filled = [i for i, c in enumerate(cells) if c in bars]
            assert len(filled) == 6, repr(cells)
            assert all(b - a == 5 for a, b in zip(filled, filled[1:])), repr(cells)
        assert "(6 sampled of " in screen_text(app)


def test_spark_cells_leave_gaps_and_keep_every_step():
    cells = views.spark_cells([1.0, None, None, 2.0, None, None, 4.0], 20)
    assert cells[1:3] == "  " and cells[4:6] == "  " and len(cells) == 7
    assert (cells[0], cells[-1]) == (views.SPARK_BARS[0], views.SPARK_BARS[-1])
    # more steps than cells: a cell holds consecutive steps, blank only if none has a value
    assert views.spark_cells([None] * 9 + [5.0] + [None] * 9 + [6.0], 10) == \
        "    ▁    █"


async def test_a_findings_severity_comes_with_the_figure_it_was_graded_on(tmp_path):
    """ZD010 on a straggler run: 'INFO (compute ratio 1.30; threshold warn 1.25 · peer wait
    fraction ...; threshold warn 10.0%)' in the Findings view's detail and on the
    Overview's top finding."""
    run = write_run(tmp_path / "run", ranks=2, units=4, steps=30, straggler=1)
    app = ZerodocApp(open_source(str(run), window=20), refresh=None)
    async with app.run_test(size=(200, 40)) as pilot:
        await _opened(app, pilot)
        top = app.frame.findings[0]
        assert top.code == "ZD010"
        assert views.graded_on(top).startswith("compute ratio 1.30; threshold warn 1.25 · "
                                               "peer wait fraction ")
        shown = " ".join(screen_text(app).split())  # the overview's top finding
        assert f"{top.severity.name} {top.code} {top.title} (compute ratio 1.30; threshold " \
            "warn 1.25" in shown
        await pilot.press("3")
        await pilot.pause()
        text = " ".join(screen_text(app).split())
        assert f"{top.severity.name} {top.code} {top.name} (compute ratio 1.30; threshold " \
            "warn 1.25" in text


async def test_no_findings_from_samples_before_the_window_is_not_an_all_clear(tmp_path):
    """The Overview and Findings say where the per-unit rules read from when no sample is
    in the window (rules that find nothing: an empty diagnosis), never "nothing crossed a
    threshold in this window"."""
    from tests.test_window_samples import write

    run = write(tmp_path / "run", {1, 2, 12, 23, 30}, straggler=None)
    app = ZerodocApp(open_source(str(run), window=20), refresh=None, diagnose=lambda s: [])
    async with app.run_test(size=(200, 40)) as pilot:
        await _opened(app, pilot)
        want = "No findings; the per-unit rules read sampled steps 12, 23, 30 from before " \
            "the window, none inside the window: not an all-clear for it"
        for key in ("1", "3"):
            await pilot.press(key)
            await pilot.pause()
            text = " ".join(screen_text(app).split())
            assert want in text, key
            assert "nothing crossed a threshold" not in text
