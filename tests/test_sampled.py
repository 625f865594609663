"""Per-unit numbers from sampled steps (issue 19): the run log reader's counts, the report's
wording, rules that wait for samples, and the TUI picking up detail that appears after it
opened (issue 20 item 1), agreeing with `zerodoc report` on the same directory.

Run logs are written with the real writer (`zerodoc.testing.synthetic.write_run`, through
`RunLogWriter`), with unsampled steps as the shim writes them (`"detail": false`, empty
`compute` / `comm`, per-unit-derived step fields null)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.support.helpers import until
from zerodoc.sources import open_source
from zerodoc.testing.synthetic import append_steps, close_run, write_run

SIZE = (120, 36)


# --------------------------------------------------------------------------------------
# the TUI opened before the job wrote anything (issue 20 item 1)


async def test_tui_opened_on_an_empty_run_dir_picks_up_per_unit_detail(tmp_path):
    pytest.importorskip("textual")
    from zerodoc.tui.app import ZerodocApp

    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)  # what `zerodoc demo` has when its TUI opens
    app = ZerodocApp(open_source(str(run)), refresh=0.1)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.frame is not None, what="first frame")
        write_run(run, ranks=2, units=4, steps=6, started_unix=time.time() - 6, end=False,
                  straggler=None)
        await until(pilot, lambda: app.frame.snapshot.ranks.get(1) is not None
                    and app.frame.snapshot.ranks[1].last_step == 6, what="step 6")

        def unit_compute():
            u = app.frame.units.get(0)
            return u is not None and u["layers.0"].compute_seconds > 0

        await until(pilot, unit_compute, what="per-unit compute of layers.0")
        await until(pilot, lambda: any(f.code == "ZD004" for f in app.frame.findings),
                    what="a per-unit finding")
        close_run(run)


def _key(findings) -> list[tuple]:
    return [(f.code, f.severity, f.units, f.ranks,
             {k: round(v, 9) if isinstance(v, float) else v for k, v in f.evidence.items()})
            for f in findings]


@pytest.mark.parametrize("sample_every", [None, 10], ids=["every-step", "sampled"])
async def test_tui_waits_for_the_run_dir_and_ends_on_what_report_says(tmp_path, sample_every):
    pytest.importorskip("textual")
    from zerodoc.diagnosis import diagnose
    from zerodoc.tui.app import ZerodocApp

    run = tmp_path / "run"  # not there yet; its parent is (a typo'd root is still refused)
    app = ZerodocApp(open_source(str(run), window=20, wait=True), refresh=0.1)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.frame is not None and app.frame.source_error,
                    what="first frame")
        assert "waiting for" in app.frame.source_error
        write_run(run, ranks=2, units=4, steps=30, started_unix=time.time() - 30,
                  every_steps=100, sample_every=sample_every)
        await until(pilot, lambda: app.frame.run_ended, what="the run's end")
        await pilot.pause(0.3)
        tui = app.frame
    rep = open_source(str(run), window=20).snapshot()
    w, t = rep.ranks[0], tui.snapshot.ranks[0]
    assert (t.first_step, t.last_step, t.steps) == (w.first_step, w.last_step, w.steps) \
        == (11, 30, 20)
    assert (t.per_unit_steps, t.detail_before) == (w.per_unit_steps, w.detail_before) \
        == ((20, 0) if sample_every is None else (3, 1))
    assert t.compute == pytest.approx(w.compute)
    assert _key(tui.findings) == _key(diagnose(rep)) and tui.findings


# --------------------------------------------------------------------------------------
# the readers' counts, against the raw JSON lines


def raw_steps(run: Path, rank: int) -> dict[int, dict]:
    """Step records with their per-unit rows straight from the detail files (no zerodoc)."""
    import json

    out = {}
    for name in (f"{rank:05d}-a.jsonl", f"{rank:05d}-b.jsonl"):
        p = run / "detail" / name
        if p.exists():
            for line in p.read_text().splitlines()[1:]:
                rec = json.loads(line)
                out[rec["step"]] = rec
    return out


def raw_compute(recs: list[dict], unit: int) -> float:
    return sum(s for r in recs for u, _phase, s in r["compute"] if u == unit)


def unit_compute(w, unit: str) -> float:
    """A window's compute seconds of one unit, over all phases."""
    return sum(s for (u, _phase), s in w.compute.items() if u == unit)


@pytest.fixture(scope="module")
def sampled_run(tmp_path_factory) -> Path:
    """60 steps, 2 ranks, per-unit detail on every 10th step, written by the real writer."""
    return write_run(tmp_path_factory.mktemp("sampled") / "run", ranks=2, units=4, steps=60,
                     straggler=None, sample_every=10)


def test_the_log_holds_unsampled_steps(sampled_run):
    raw = raw_steps(sampled_run, 0)
    assert sorted(s for s, r in raw.items() if r["detail"]) == [10, 20, 30, 40, 50, 60]
    r = raw[41]
    assert (r["compute"], r["comm"], r["compute_s"], r["exposed_s"]) == ([], [], None, None)
    assert r["coll"]["all_gather"][0] == 7  # 4 forward + 3 backward


@pytest.mark.parametrize("how", ["load_run", "source"])
def test_window_counts_steps_and_samples(sampled_run, how):
    from zerodoc.runlog import load_run

    raw = raw_steps(sampled_run, 0)
    get = (lambda n: load_run(sampled_run, n).ranks[0]) if how == "load_run" else \
        (lambda n: open_source(str(sampled_run), window=n).snapshot().ranks[0])
    w = get(30)  # steps 31..60: samples 40, 50, 60
    assert (w.steps, w.first_step, w.last_step) == (30, 31, 60)
    assert (w.detail_steps, w.detail_before, w.detail_last_step, w.detail_every) == (3, 0, 60, 10)
    samples = [raw[s] for s in (40, 50, 60)]
    assert unit_compute(w, "layers.0") == pytest.approx(raw_compute(samples, 1))
    # step-level numbers count every step; compute per step is the samples' mean
    assert w.step_seconds == pytest.approx(sum(raw[s]["step_s"] for s in range(31, 61)))
    mean = sum(raw[s]["compute_s"] for s in (40, 50, 60)) / 3
    assert w.compute_seconds / w.steps == pytest.approx(mean)
    w = get(20)  # steps 41..60: two samples inside, the newest one before it is taken too
    assert (w.steps, w.first_step) == (20, 41)
    assert (w.detail_steps, w.detail_before) == (3, 1)
    assert unit_compute(w, "layers.0") == pytest.approx(raw_compute(samples, 1))


def test_at_scale_reader_counts_the_intervals_samples(sampled_run):
    from zerodoc.sources.rundir import RunDirSource

    w = RunDirSource(sampled_run, 20, detail=False).snapshot().ranks[0]
    raw = raw_steps(sampled_run, 0)
    assert w.steps == 20 and w.per_unit_steps == 6  # the closing interval: steps 1..60
    from zerodoc.windowsamples import coverage

    assert coverage(w) == ("per-unit: 6 steps with per-unit detail in the newest run-log "
                           "intervals (the window: 20 steps)")
    assert w.window_samples == 2  # steps 50 and 60 among the window's step lines
    assert unit_compute(w, "layers.0") == pytest.approx(
        raw_compute([raw[s] for s in range(10, 61, 10)], 1))


# --------------------------------------------------------------------------------------
# the report's wording and the rules that wait


def report_of(run: Path, window: int, fmt: str = "text") -> str:
    """`zerodoc report RUN --window N` as the command line runs it."""
    import contextlib
    import io

    from zerodoc.cli.main import main

    out = io.StringIO()
    args = ["report", str(run), "--window", str(window)] + ([f"--{fmt}"] if fmt != "text" else [])
    with contextlib.redirect_stdout(out):
        assert main(args) == 0
    return out.getvalue()


def test_report_says_how_many_sampled_steps(sampled_run):
    import json

    text = report_of(sampled_run, 30)
    assert "per-unit: 3 sampled steps of 30 (steps 40, 50, 60) (about 1 step in 10 is " \
        "sampled)" in text
    assert "Per unit (per step, mean over ranks; per-unit: 3 sampled steps of 30 (steps 40, " \
        "50, 60))" in text
    text = report_of(sampled_run, 20)
    # the sample from before the window names its step and its age (issue 31)
    assert "per-unit: the newest 3 sampled steps (from steps 40, 50, 60; step 40 before the " \
        "window (41-60), " in text
    assert " s before step 60; 2 inside the window of 20)" in text
    doc = json.loads(report_of(sampled_run, 30, "json"))
    pu = doc["window"]["per_unit"]
    assert (pu["sampled"], pu["detail_steps"], pu["steps"], pu["every"]) == (True, 3, 30, 10)
    assert doc["steps"][0]["detail_steps"] == 3 and doc["waiting"] is None
    # the per-unit table's means are over the 3 samples, not over 30 steps
    raw = raw_steps(sampled_run, 0)
    ag = [r for s in (40, 50, 60) for r in raw[s]["comm"]
          if r[0] == 1 and r[2] == "all_gather"]
    row = next(u for u in doc["units"] if u["unit"] == "layers.0")
    assert row["all_gather_count_per_step"] == pytest.approx(sum(r[3] for r in ag) / 3)
    raw1 = raw_steps(sampled_run, 1)
    ag1 = [r for s in (40, 50, 60) for r in raw1[s]["comm"]
           if r[0] == 1 and r[2] == "all_gather"]
    mean_s = (sum(r[5] for r in ag) + sum(r[5] for r in ag1)) / 6
    assert row["all_gather_seconds_per_step"] == pytest.approx(mean_s, rel=1e-5)


@pytest.mark.slow
def test_rules_wait_for_the_first_sample_and_say_when(tmp_path):
    from zerodoc.diagnosis import diagnose, waiting

    run = write_run(tmp_path / "young", ranks=2, units=4, steps=8, straggler=None,
                    sample_every=10, end=False)
    snap = open_source(str(run), window=20).snapshot()
    # steps 2-8: the warm-up step 1 is left out of a short window (issue 20 item 10)
    assert snap.ranks[0].steps == 7 and snap.ranks[0].warmup_left_out == 1
    assert snap.ranks[0].detail_steps == 0
    findings = diagnose(snap)
    assert not [f for f in findings if f.code in ("ZD004", "ZD006", "ZD010")]
    w = waiting(snap)
    assert w["samples"] == 0 and "ZD004" in w["rules"] and "ZD007" not in w["rules"]
    assert w["message"] == "per-unit detail after the first sampled step, about every 10 steps"
    text = report_of(run, 20)
    assert "not evaluated: 0 sampled steps in the window; ZD001, ZD002" in text
    assert "9 rules not evaluated" in text.split("Findings: ")[1].splitlines()[0]
    assert "no per-unit numbers yet: per-unit detail after the first sampled step, about " \
        "every 10 steps" in text
    assert "nothing the rules know of is wrong" not in text
    assert " 0 s " not in text.split("Step breakdown")[1]  # not measured is not zero
    # the first sample arrives: the per-unit rules run
    append_steps(run, ranks=2, units=4, first_step=9, count=3, end_unix=time.time())
    snap = open_source(str(run), window=20).snapshot()
    assert snap.ranks[0].detail_steps == 1 and waiting(snap)["rules"] == ["ZD010"]
    assert any(f.code == "ZD004" for f in diagnose(snap))
    close_run(run)


# --------------------------------------------------------------------------------------
# the TUI on a run that samples


@pytest.mark.slow
async def test_tui_says_when_the_next_sample_is_due_then_shows_it(tmp_path):
    pytest.importorskip("textual")
    from zerodoc.tui import views
    from zerodoc.tui.app import ZerodocApp
    from zerodoc.testing.textshot import screen_text

    run = tmp_path / "run"
    run.mkdir()
    app = ZerodocApp(open_source(str(run), window=20), refresh=0.1)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.frame is not None, what="first frame")
        write_run(run, ranks=2, units=4, steps=8, started_unix=time.time() - 8, end=False,
                  straggler=None, sample_every=10)
        await until(pilot, lambda: 0 in app.frame.snapshot.ranks
                    and app.frame.snapshot.ranks[0].last_step == 8, what="step 8")
        await pilot.pause(0.2)
        due = "per-unit detail after the first sampled step, about every 10 steps"
        heads = {h.label: h for h in views.headlines(app.frame, views.MEAN)}
        assert (heads["Exposed comm"].value, heads["Exposed comm"].detail) == ("-", due)
        assert heads["Worst unit"].detail == due
        assert heads["Step time"].value != "-"  # step-level numbers on every step
        table = views.unit_table(app.frame, views.MEAN)
        assert all(c == "-" for _k, cells in table.rows for c in cells[2:9])  # no zeros
        assert due in table.caption
        assert app.frame.waiting and "ZD004" in app.frame.waiting["rules"]
        shown = screen_text(app)
        assert "not evaluated: 0 sampled steps in the window" in shown
        assert "not an all-clear" in shown and "No findings" not in shown
        append_steps(run, ranks=2, units=4, first_step=9, count=4, end_unix=time.time())
        await until(pilot, lambda: app.frame.snapshot.ranks[0].last_step == 12,
                    what="step 12")
        await until(pilot, lambda: any(f.code == "ZD004" for f in app.frame.findings),
                    what="ZD004 after the first sample")
        heads = {h.label: h for h in views.headlines(app.frame, views.MEAN)}
        assert heads["Exposed comm"].value != "-"
        assert "per-unit: the newest 1 sampled step" not in heads["Exposed comm"].detail
        assert "per-unit: 1 sampled step of 11 (steps 10)" in heads["Exposed comm"].detail
        assert app.frame.units[0]["layers.0"].compute_seconds == pytest.approx(
            raw_compute([raw_steps(run, 0)[10]], 1))
        close_run(run)


# --------------------------------------------------------------------------------------
# /metrics readers: the endpoints and Prometheus sources


def test_scraped_windows_divide_per_unit_counters_by_sampled_steps():
    """Two scrapes of a rank that sampled 3 of its 30 steps between them: the window counts 30
    steps, its per-unit totals cover 3 (zerodoc_detail_steps_total), and compute per step is
    those 3 steps' mean."""
    from zerodoc.sources import Cumulative, add_sample, facts_of, window_of

    def scrape(steps: int, detail: int, compute_s: float) -> dict:
        got: dict[int, Cumulative] = {}
        lab = {"rank": "0", "local_rank": "0", "node": "n0"}
        add_sample(got, "zerodoc_step_duration_seconds_count", lab, steps)
        add_sample(got, "zerodoc_step_duration_seconds_sum", lab, steps * 0.5)
        add_sample(got, "zerodoc_detail_steps_total", lab, detail)
        add_sample(got, "zerodoc_last_step", lab, steps)
        add_sample(got, "zerodoc_compute_seconds_total",
                   {**lab, "unit": "layers.0", "phase": "forward"}, compute_s)
        return got

    base, cur = scrape(10, 1, 0.2)[0], scrape(40, 4, 0.8)[0]
    w = window_of(facts_of(cur), cur, base)
    assert (w.steps, w.detail_steps, w.per_unit_steps) == (30, 3, 3)
    assert unit_compute(w, "layers.0") == pytest.approx(0.6)  # over the 3 samples
    assert w.compute_seconds / w.steps == pytest.approx(0.2)  # a sample's compute per step
    old = scrape(40, 4, 0.8)[0]
    del old.scalars["detail_steps"]  # an exporter without the counter: every step
    assert window_of(facts_of(old), old).per_unit_steps == 40


def test_prometheus_unit_stats_divide_by_sampled_steps():
    """The PromQL that makes per-unit stats divides by the sampled-steps counter where the
    ranks serve it (else by the step count)."""
    from zerodoc.sources.prometheus import PrometheusSource

    seen = []

    class Probe(PrometheusSource):
        def _many(self, exprs, at, *a, **k):
            seen.extend(exprs.values())
            return {k: [] for k in exprs}

    from zerodoc.runmodel import RunSnapshot

    src = Probe.__new__(Probe)
    src.timeout_s, src.lookback = 5.0, "5m"
    src.recorded = False  # the raw aggregation (the recorded rules' own divisor: below)
    src._unit_stats('job="x"', lambda n, e="": f"increase({n}{{job=\"x\"{e}}}[60s])", 0.0,
                    (0,), RunSnapshot(source="probe"))
    per = [e for e in seen if "zerodoc_collective_seconds_total" in e and ") / " in e]
    # a rank with no sampled step in the window has no divisor (its per-step figures are
    # absent, not 0): only a rank that counts no samples at all is divided by its steps
    assert per and all("(increase(zerodoc_detail_steps_total" in e and "> 0) or (" in e and
                       "increase(zerodoc_step_duration_seconds_count" in e and
                       " unless on (rank) increase(zerodoc_detail_steps_total" in e
                       for e in per)
    # the recording rules the source reads at scale (issue 20 item 17) divide the same way
    from zerodoc.ops.alerts.recording import unit_stat_rules

    per_step = [r["expr"] for r in unit_stat_rules("1m") if "collective_seconds_total" in
                r["expr"]]
    assert per_step and all("rate(zerodoc_detail_steps_total[1m])" in e and
                            "or rate(zerodoc_step_duration_seconds_count[1m])" in e
                            for e in per_step)


def test_compare_says_how_many_sampled_steps_each_side_has(sampled_run, tmp_path):
    import contextlib
    import io
    import json

    from zerodoc.cli.main import main

    every = write_run(tmp_path / "every", ranks=2, units=4, steps=30, straggler=None)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(["compare", str(every), str(sampled_run), "--window", "30"])
    text = out.getvalue()
    # the every-step run's window leaves its warm-up step out (29 steps, issue 20 item 10)
    assert "29 steps) -> run run (fsdp2, 2 ranks, 30 steps; per-unit: 3 sampled steps of 30 " \
        "(steps 40, 50, 60))" in text.splitlines()[0]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(["compare", str(every), str(sampled_run), "--window", "30", "--json"])
    doc = json.loads(out.getvalue())
    assert doc["after"]["window"]["per_unit"]["detail_steps"] == 3
    assert doc["before"]["window"]["per_unit"]["sampled"] is False


@pytest.mark.slow
def test_live_demo_tui_shows_per_unit_numbers_while_the_job_runs(tmp_path, monkeypatch):
    """Issue 20 item 1 on a real job: `zerodoc demo` with a slow link opens its TUI before
    the ranks have written anything; the Overview's worst unit and a per-unit finding show up
    while the job still runs (before: only after the run ended)."""
    pytest.importorskip("textual")
    import asyncio
    import gc

    from zerodoc.cli.main import build_parser
    from zerodoc.demo import live
    from zerodoc.demo.live import spec_from_args
    from zerodoc.tui import app as appmod
    from zerodoc.tui import views

    seen = {}

    def headless_run(self):
        async def drive():
            async with self.run_test(size=SIZE) as pilot:
                def per_unit():
                    f = self.frame
                    if f is None or not f.snapshot.ranks:
                        return False
                    heads = {h.label: h for h in views.headlines(f, views.MEAN)}
                    worst = heads.get("Worst unit")
                    return worst is not None and worst.value != "-" and \
                        any(x.code in ("ZD004", "ZD005", "ZD006") for x in f.findings)

                await until(pilot, per_unit, timeout=120, what="per-unit numbers, live")
                seen["running"] = self.job.running()
                seen["step"] = max(w.last_step for w in self.frame.snapshot.ranks.values())
                await pilot.press("q")

        asyncio.run(drive())

    monkeypatch.setattr(appmod.ZerodocApp, "run", headless_run)
    monkeypatch.setattr(appmod, "tune_gc", lambda: None)
    monkeypatch.setattr(gc, "freeze", lambda: None)
    args = build_parser().parse_args(["demo", "--ranks", "2", "--steps", "0", "--port", "0",
                                      "--blocks", "2", "--slow-link-ms", "40",
                                      "--run-dir", str(tmp_path / "live")])
    assert live.run_live_demo(args, spec_from_args(args)) == 0
    assert seen["running"] and seen["step"] >= 1


def test_k_in_force_is_the_newest_steps_not_the_newest_samples(tmp_path):
    """Adaptive K that rose after the newest sample: every step record carries the K in
    force, and the report, the run-directory source and the sliding window say the new K
    (they said the newest sample's K: "about 1 step in 10" after 40 steps without one)."""
    from zerodoc.runlog import load_run

    run = write_run(tmp_path / "run", ranks=2, units=4, steps=30, straggler=None,
                    sample_every=10, end=False)
    append_steps(run, ranks=2, units=4, first_step=31, count=40, straggler=None,
                 sample_every=128)  # K rose to 128: no sample in steps 31-70
    close_run(run)
    assert load_run(run, 20).ranks[0].detail_every == 128
    assert open_source(str(run), window=20).snapshot().ranks[0].detail_every == 128
    from zerodoc.sources.rundir import RunDirSource  # the at-scale reader: step lines
    assert RunDirSource(run, 20, detail=False).snapshot().ranks[0].detail_every == 128
    # a run log without detail files (`run_log_detail=False`): windows from the step and
    # interval lines only
    lean = write_run(tmp_path / "lean", ranks=2, units=4, steps=30, straggler=None,
                     sample_every=10, end=False, detail=False)
    append_steps(lean, ranks=2, units=4, first_step=31, count=40, straggler=None,
                 sample_every=128)
    close_run(lean)
    assert load_run(lean, 20).ranks[0].detail_every == 128
    text = report_of(run, 20)
    assert "about 1 step in 128 is sampled" in text and "1 step in 10 " not in text, text
    # the samples are named, with their age (issue 31)
    assert "(from steps 10, 20, 30, all before the window (51-70), the newest " in text
