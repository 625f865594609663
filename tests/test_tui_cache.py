"""What the TUI's refresh keeps between asks (issue 33 item 4) never shows a stale or a
different figure: the step model's per-model memo (`whatif.stepmodel.MEMO`) gives the
answers a model without it gives, change after change; the per-frame and per-facts indexes
(`Frame.fresh_ranks`, `RankFacts.unit`) follow their input; a live run whose straggler
moves shows the new one, with the findings a fresh diagnosis of the same snapshot gives."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest

from zerodoc.diagnosis import diagnose
from zerodoc.sources import open_source
from zerodoc.testing.synthetic import append_steps, close_run, rank_facts, write_run
from zerodoc.whatif import stepmodel
from zerodoc.whatif.stepmodel import Changes, answer, fit

pytest.importorskip("textual")

from tests.support.helpers import until  # noqa: E402
from zerodoc.tui import views  # noqa: E402
from zerodoc.tui.app import ZerodocApp  # noqa: E402

# changes that move the memo's keys: the units merged two ways, resharding off and on, and
# each again after the others (a key that left one out would hand back another's numbers)
CHANGES = [Changes(), Changes(merge=2), Changes(reshard_after_forward=False),
           Changes(merge="blocks"), Changes(merge=2, reshard_after_forward=False),
           Changes(prefetch=1), Changes(world_size=8), Changes(), Changes(merge=2)]


def _answers(snap, memo: bool, fresh: bool) -> list[str]:
    """answer() per change as JSON: one model asked in turn, or a new model each time."""
    old = stepmodel.MEMO
    stepmodel.MEMO = memo
    try:
        model = fit(snap)
        out = []
        for ch in CHANGES:
            out.append(json.dumps(answer(fit(snap) if fresh else model, ch, memory=False),
                                  sort_keys=True, default=repr))
        return out
    finally:
        stepmodel.MEMO = old


def test_step_model_memo_gives_the_same_answers(tmp_path):
    run = write_run(tmp_path / "run", ranks=4, units=7, steps=8, straggler=2)
    snap = open_source(str(run), window=20).snapshot()
    memo = _answers(snap, memo=True, fresh=False)
    plain = _answers(snap, memo=False, fresh=True)
    for ch, a, b in zip(CHANGES, memo, plain):
        assert a == b, ch.describe()
    # the changes do differ, so equal answers are not equal by accident
    assert len(set(plain)) >= 6


def _json(model) -> str:
    return json.dumps(answer(model, Changes(prefetch=1), memory=False), sort_keys=True,
                      default=repr)


def _fresh(snap) -> str:
    """The answer of a model fitted with nothing kept from an earlier fit."""
    old = stepmodel.MEMO
    stepmodel.MEMO = False
    try:
        return _json(fit(snap))
    finally:
        stepmodel.MEMO = old


def _refit(snap) -> tuple[int, str]:
    """(per-unit parts built by this fit, its answer)."""
    built = stepmodel.PARTS_BUILT[0]
    got = _json(fit(snap))
    return stepmodel.PARTS_BUILT[0] - built, got


def test_step_model_refits_only_when_the_per_unit_numbers_change(tmp_path):
    """The TUI refits the step model on every refresh; its part read from the per-unit
    numbers (`stepmodel.UnitPart`) is rebuilt only when they change (issue 33 item 4). Read
    at scale (per-unit numbers as interval-line arrays, every 3 steps): a step without
    per-unit numbers reuses the part, and the answer moves with the new step times and equals
    a fresh fit's; the next interval line (rank 1 now the straggler) refits, and so do a
    rank that goes and one that comes back; an unchanged snapshot reuses the part."""
    from zerodoc.runmodel import LazyRankWindow, RunSnapshot

    run = write_run(tmp_path / "run", ranks=4, units=5, steps=9, every_steps=3, detail=False,
                    end=False, straggler=3, started_unix=time.time() - 30)
    try:
        src = open_source(str(run), window=6)  # per-unit numbers over 6 steps throughout
        snap = src.snapshot()
        w = snap.ranks[0]
        assert isinstance(w, LazyRankWindow) and w.unit_arrays is not None  # the arrays' key
        n, first = _refit(snap)
        assert (n, first) == (1, _fresh(snap))
        assert _refit(snap) == (0, first)

        append_steps(run, ranks=4, units=5, first_step=10, end_unix=time.time())
        snap = src.snapshot()
        assert snap.ranks[0].last_step == 10 and snap.ranks[0].detail_last_step <= 9
        n, second = _refit(snap)
        assert n == 0 and second == _fresh(snap) and second != first

        append_steps(run, ranks=4, units=5, first_step=11, count=2, straggler=1,
                     end_unix=time.time())
        snap = src.snapshot()
        assert snap.ranks[0].per_unit_steps == 6  # only the values tell the change
        n, third = _refit(snap)
        assert n == 1 and third == _fresh(snap) and third != second
        assert _refit(src.snapshot()) == (0, third)  # nothing new: the same part

        fewer = RunSnapshot(snap.source, ranks={r: w for r, w in snap.ranks.items() if r != 2})
        n, without = _refit(fewer)
        assert n == 1 and without == _fresh(fewer) and without != third
        n, back = _refit(snap)  # rank 2 comes back
        assert n == 1 and back == third
    finally:
        close_run(run)


def test_step_model_reads_the_per_step_numbers_on_every_fit(tmp_path):
    """Per-unit numbers unchanged, a rank's per-step ones (optimizer, framework, other
    time; read as dicts, the run log's detail) changed: the part is reused, and the answer
    is a fresh fit's, not the earlier one's."""
    run = write_run(tmp_path / "run", ranks=4, units=5, steps=8, straggler=2)
    snap = open_source(str(run), window=20).snapshot()
    n, before = _refit(snap)
    assert n == 1
    for field in ("optimizer_seconds", "framework_seconds", "other_seconds"):
        slow = dataclasses.replace(snap, ranks={
            r: dataclasses.replace(w, **{field: getattr(w, field) + 0.3 * w.steps})
            if r == 1 else w for r, w in snap.ranks.items()})
        n, after = _refit(slow)
        assert n == 0 and after == _fresh(slow) and after != before, field


def test_unit_index_follows_the_facts():
    f = rank_facts(0, 4, 3)
    assert f.unit("layers.0") is f.units[1] and f.unit("nope") is None
    g = dataclasses.replace(f, units=f.units[:1])  # new facts: the index is theirs
    assert g.unit("layers.0") is None and g.unit("(root)") is g.units[0]
    assert g == dataclasses.replace(rank_facts(0, 4, 3), units=f.units[:1])


async def test_live_run_shows_the_new_straggler(tmp_path):
    """Rank 3 computes slowest, then rank 1 (a window of 4 steps): the Overview's worst rank,
    the Ranks table and the findings follow; the findings equal a fresh diagnosis of the
    frame's snapshot with the memo off."""
    run = write_run(tmp_path / "run", ranks=4, units=5, steps=6, straggler=3, end=False,
                    started_unix=time.time() - 30)  # live: no rank stale
    try:
        app = ZerodocApp(open_source(str(run), window=4), refresh=None)
        async with app.run_test(size=(140, 44)) as pilot:
            await until(pilot, lambda: app.frame is not None, what="first frame")
            worst = next(h for h in views.headlines(app.frame, views.MEAN)
                         if h.label == "Worst rank")
            assert worst.value == "rank 3"
            z10 = next(f for f in app.frame.findings if f.code == "ZD010")
            assert z10.ranks == (3,)
            append_steps(run, ranks=4, units=5, first_step=7, count=5, straggler=1,
                         end_unix=time.time())
            frame = await app.refresh_now()
            await pilot.pause()
            assert frame is app.frame and frame.snapshot.ranks[0].last_step == 11
            worst = next(h for h in views.headlines(frame, views.MEAN)
                         if h.label == "Worst rank")
            assert worst.value == "rank 1", worst
            assert next(f for f in frame.findings if f.code == "ZD010").ranks == (1,)
            await pilot.press("4")
            await pilot.pause()
            table = views.rank_table(frame)
            assert table.cell("1", "last_step") == "11"
            old = stepmodel.MEMO
            stepmodel.MEMO = False
            try:
                again = diagnose(frame.snapshot)
            finally:
                stepmodel.MEMO = old
            strip = lambda fs: [(f.code, f.title, f.evidence, f.predicted,  # noqa: E731
                                 f.extra.get("whatif")) for f in fs]
            assert strip(frame.findings) == strip(again)
    finally:
        close_run(run)


async def test_the_tui_follows_new_steps_a_new_rank_and_rotated_or_truncated_logs(tmp_path):
    """The follower keeps each log open and reads only what was appended (issue 33 item 4);
    the Ranks view must still show each change as it lands: a step appended to rank 1, rank
    2's log appearing, rank 0's log moved away and written again by a restarted rank (the
    file kept open no longer grows), rank 1's log truncated in place (copytruncate: the
    writer writes its header again). Read at scale (step lines and interval lines)."""
    import os

    from tests.support.helpers import wait_until
    from tests.support.runlogfaults import copytruncate, hand_step, lines, writer_of
    from zerodoc.sources import RunDirSource
    from zerodoc.tui.widgets.table import ZTable

    run = tmp_path / "run"
    now = time.time()
    reps = [writer_of(run, r, 3, None) for r in (0, 1)]
    late = None

    def steps(rep, first, last):
        for s in range(first, last + 1):
            hand_step(rep, s, end_unix=now + s)
        rep.writer.flush()

    for rep in reps:
        steps(rep, 1, 5)
    app = ZerodocApp(RunDirSource(run, window=5, detail=False), refresh=None)
    try:
        async with app.run_test(size=(140, 44)) as pilot:
            await until(pilot, lambda: app.frame is not None, what="first frame")
            await pilot.press("4")
            await pilot.pause()

            async def shown():
                await app.refresh_now()
                await pilot.pause()
                return app.query_one("#ranks-table", ZTable).shown

            table = await shown()
            assert [k for k, _ in table.rows] == ["0", "1"]
            assert table.cell("1", "last_step") == "5"
            steps(reps[1], 6, 6)  # an appended step
            assert (await shown()).cell("1", "last_step") == "6"
            late = writer_of(run, 2, 3, None)  # a new rank's log
            steps(late, 1, 3)
            table = await shown()
            assert [k for k, _ in table.rows] == ["0", "1", "2"]
            assert table.cell("2", "last_step") == "3"
            reps[0].close(end=False)  # rotated: moved aside, a restarted rank writes anew
            os.rename(run / "rank-00000.jsonl", run / "rank-00000.jsonl.1")
            reps[0] = writer_of(run, 0, 3, None)
            steps(reps[0], 1, 8)
            assert (await shown()).cell("0", "last_step") == "8"
            path = run / "rank-00001.jsonl"  # truncated in place under its writer
            copytruncate(path)
            step = [6]

            def header_back():
                step[0] += 1
                steps(reps[1], step[0], step[0])
                return any(x["type"] == "header" for x in lines(path))

            wait_until(header_back, 20, "the writer's header written again")
            steps(reps[1], step[0] + 1, step[0] + 1)
            table = await shown()
            assert table.cell("1", "last_step") == str(step[0] + 1)
            # the frame carries what the source said of the cut (none of the views shows the
            # run log's notes yet: `zerodoc report` does)
            assert any("truncated in place" in n for n in app.frame.snapshot.log_notes)
    finally:
        for rep in (*reps, late):
            if rep is not None:
                rep.close()


async def test_the_screen_keeps_refreshing_while_a_refit_blocks(tmp_path, monkeypatch):
    """A refit of the step model (new per-unit numbers) that takes long does not freeze the
    TUI: the snapshot and the rules run off the UI thread, so while the fit is held (on an
    Event, beneath the rules: `zerodoc.whatif.fit`) the views switch, the timer's ticks
    redraw the status line, which says past one refresh interval that the figures are the
    previous refresh's; released, the new frame is shown and the label goes."""
    import threading

    import zerodoc.whatif as whatif
    from zerodoc.tui.widgets.status import StatusLine

    plain, held, release = whatif.fit, threading.Event(), threading.Event()
    gate = {"on": False}

    def slow_fit(*a, **kw):
        if gate["on"]:
            held.set()
            release.wait(20)
        return plain(*a, **kw)

    monkeypatch.setattr(whatif, "fit", slow_fit)
    now = [time.time()]
    run = write_run(tmp_path / "run", ranks=4, units=5, steps=6, end=False,
                    started_unix=now[0] - 30)
    try:
        app = ZerodocApp(open_source(str(run), window=4), refresh=0.05,
                         clock=lambda: now[0])
        async with app.run_test(size=(160, 44)) as pilot:
            await until(pilot, lambda: app.frame is not None, what="first frame")
            app._timer.pause()  # the ticks start no fetch of their own until one is held
            await until(pilot, lambda: not app._fetching, what="no fetch in flight")
            first = app.frame
            assert first.snapshot.ranks[0].last_step == 6
            gate["on"] = True
            append_steps(run, ranks=4, units=5, first_step=7, count=1, end_unix=now[0])
            task = app.run_worker(app.refresh_now(), group="fetch")
            await until(pilot, held.is_set, what="the refit held")
            status = lambda: str(app.query_one(StatusLine).render())  # noqa: E731
            app._timer.resume()  # ticks while held: the status line only
            assert "previous refresh" not in status()
            now[0] += 5.0  # the held refresh has run 5 s by the app's clock
            await until(pilot, lambda: "figures of the previous refresh" in status(),
                        what="the status line's label, drawn by a tick while held")
            await pilot.press("4")
            await until(pilot, lambda: app.active_view == "ranks", what="view switched")
            assert app.frame is first and app._fetching  # still held, the old frame shown
            release.set()
            await task.wait()
            await until(pilot, lambda: app.frame is not first, what="the new frame")
            assert app.frame.snapshot.ranks[0].last_step == 7
            await until(pilot, lambda: "previous refresh" not in status(), what="label gone")
    finally:
        release.set()
        close_run(run)
