"""`zerodoc compare`: predicted vs observed, verdicts, the history fed back into findings, and
the demo loop run for real (`zerodoc demo --wrap linear` -> ZD002 -> `--wrap block` ->
`zerodoc compare` confirms it). Recorded runs are real demo runs (tests/data/scenarios);
the witness of "applied" and of the outcome is the run after the fix, measured, never the
rule's own prediction."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.helpers import ROOT, LiveDemo
from zerodoc.compare import history
from zerodoc.compare.judge import (
    CONFIRMED, ENVIRONMENT, INCONCLUSIVE, MISSED, NOT_CONFIRMED, NOT_JUDGED, PARTLY, UNKNOWN,
    WITHIN_NOISE, WORSE, compare, judge, overall, side,
)
from zerodoc.diagnosis import diagnose
from zerodoc.diagnosis.findings import Predicted
from zerodoc.diagnosis.observables import OBSERVABLES
from zerodoc.testing.rulecases import load_case
from zerodoc.runlog import load_run

DATA = Path(__file__).parent / "data"
SCEN = DATA / "scenarios"
DOCS = ROOT / "docs" / "compare.md"


def zerodoc(*args, timeout=300, **kw):
    return subprocess.run([sys.executable, "-m", "zerodoc", *args], capture_output=True,
                          text=True, timeout=timeout, **kw)


def recorded(name: str):
    # every step, as `zerodoc compare --window 0` reads a run directory: its warm-up step
    # (step 1) left out
    snap = load_run(SCEN / name, window=None, stale_after_s=float("inf"), skip_warmup=True)
    return side(snap, f"run log {name}")


# --- judging one effect ------------------------------------------------------------------


@pytest.mark.parametrize("pred,before,after,verdict", [
    (Predicted("step_seconds", "down", 0.6, 1.0), 1.0, 0.62, CONFIRMED),   # 95 % of it
    (Predicted("step_seconds", "down", 0.6, 1.0), 1.0, 0.5, CONFIRMED),    # more than predicted
    (Predicted("step_seconds", "down", 0.6, 1.0), 1.0, 0.8, PARTLY),       # 50 %
    (Predicted("step_seconds", "down", 0.6, 1.0), 1.0, 0.93, NOT_CONFIRMED),  # 17 %
    (Predicted("step_seconds", "down", 0.6, 1.0), 1.0, 0.98, NOT_CONFIRMED),  # within noise
    (Predicted("step_seconds", "down", 0.6, 1.0), 1.0, 1.2, WORSE),
    (Predicted("median_all_gather_bytes", "up", 3e6, 1e6), 1e6, 3.2e6, CONFIRMED),
    (Predicted("median_all_gather_bytes", "up", 3e6, 1e6), 1e6, 0.5e6, WORSE),
    (Predicted("peak_memory_bytes", "down", None, 5e9), 5e9, 4e9, CONFIRMED),  # direction only
    # within the noise (the 5 % floor here), only a direction predicted: cannot tell
    (Predicted("peak_memory_bytes", "down", None, 5e9), 5e9, 5.1e9, INCONCLUSIVE),
    (Predicted("peak_memory_bytes", "up", 6e9, 5e9, cost=True), 5e9, 5.9e9, CONFIRMED),  # cost
    (Predicted("peak_memory_bytes", "up", 6e9, 5e9, cost=True), 5e9, 7e9, WORSE),  # costlier
    (Predicted("step_seconds", "down", 0.6, 1.0), None, 0.6, UNKNOWN),
    # with a range (the step model's) that excludes the value before: inside is confirmed,
    # outside by more than the noise missed, either side; just outside (0.74: 40 ms past
    # 0.7, the floor's noise +/-50 ms) inconclusive (it was "missed")
    (Predicted("step_seconds", "down", 0.6, 1.0, lo=0.5, hi=0.7), 1.0, 0.68, CONFIRMED),
    (Predicted("step_seconds", "down", 0.6, 1.0, lo=0.5, hi=0.7), 1.0, 0.8, MISSED),
    (Predicted("step_seconds", "down", 0.6, 1.0, lo=0.5, hi=0.7), 1.0, 0.74, INCONCLUSIVE),
    (Predicted("step_seconds", "down", 0.6, 1.0, lo=0.5, hi=0.7), 1.0, 0.4, MISSED),
    (Predicted("step_seconds", "down", 0.6, 1.0, lo=0.5, hi=0.7), 1.0, 1.2, MISSED),
])
def test_judge(pred, before, after, verdict):
    assert judge(pred, before, after)["verdict"] == verdict


def test_overall_verdict_follows_the_main_effect():
    e = lambda v, cost=False: {"verdict": v, "cost": cost}  # noqa: E731
    assert overall([e(CONFIRMED), e(CONFIRMED), e(WORSE, cost=True)]) == CONFIRMED
    assert overall([e(CONFIRMED), e(NOT_CONFIRMED)]) == PARTLY
    assert overall([e(WORSE), e(CONFIRMED)]) == WORSE
    assert overall([e(NOT_CONFIRMED), e(CONFIRMED)]) == PARTLY
    assert overall([e(NOT_CONFIRMED)]) == NOT_CONFIRMED
    assert overall([e(UNKNOWN, cost=True)]) == UNKNOWN
    assert overall([e(MISSED)]) == MISSED
    assert overall([e(MISSED), e(CONFIRMED)]) == PARTLY
    assert overall([e(CONFIRMED), e(MISSED)]) == PARTLY
    # inconclusive: the main effect decides unless another benefit failed; it never lowers
    assert overall([e(INCONCLUSIVE), e(CONFIRMED)]) == INCONCLUSIVE
    assert overall([e(INCONCLUSIVE), e(MISSED), e(CONFIRMED)]) == MISSED
    assert overall([e(INCONCLUSIVE), e(WORSE)]) == WORSE
    assert overall([e(CONFIRMED), e(INCONCLUSIVE)]) == CONFIRMED
    assert overall([e(NOT_JUDGED), e(NOT_JUDGED), e(WORSE, cost=True)]) == NOT_JUDGED


def test_a_missed_range_names_the_observed_value_and_the_range():
    out = judge(Predicted("step_seconds", "down", 0.6, 1.0, lo=0.5, hi=0.7), 1.0, 0.8)
    assert out["reason"] == "observed 800 ms, predicted 500 ms-700 ms"
    assert (out["lo"], out["hi"]) == (0.5, 0.7)


def test_every_predicted_effect_names_an_observable():
    """Across every rule's fail cases: the structured predictions use the observables that
    compare reads, with their value now as compare reads it."""
    seen = set()
    for path in sorted((DATA / "rules").glob("*/fail-*.json")):
        case = load_case(path)
        for f in diagnose(case.snapshot, case.thresholds, link=case.link,
                          device_memory_bytes=case.device_memory_bytes):
            for e in f.effects:
                assert e.metric in OBSERVABLES, (path.name, f.code, e.metric)
                assert e.now is not None
                seen.add(f.code)
    assert {"ZD001", "ZD002", "ZD003", "ZD004", "ZD005", "ZD007", "ZD010"} <= seen, seen


# --- recorded real runs -------------------------------------------------------------------


def _fix(doc, code):
    return next(f for f in doc["fixes"] if f["code"] == code)


def test_wrap_fix_on_recorded_runs_is_applied_and_confirmed():
    doc = compare(recorded("wrap-linear"), recorded("healthy-block"))
    f = _fix(doc, "ZD002")
    assert f["applied_by"] == "facts" and "units 18 -> 5" in f["applied"]
    count = next(e for e in f["effects"] if e["metric"] == "all_gathers_per_step")
    assert (count["now"], count["value"], count["observed_after"]) == (36, 10, 10)
    assert count["verdict"] == CONFIRMED
    # the time predictions come from the step model, with a range, judged by it: both fell
    # inside (the merge prices calls 3x larger than any the run made: a wide range)
    ex, step = (next(e for e in f["effects"] if e["metric"] == m)
                for m in ("exposed_comm_seconds_per_step", "step_seconds"))
    assert f["effects"][0] is ex
    for e in (ex, step):
        assert e["lo"] < e["value"] < e["hi"] and e["lo"] <= e["observed_after"] <= e["hi"]
        assert e["verdict"] == CONFIRMED and e["reason"].startswith("observed "), e
    assert f["verdict"] == CONFIRMED and not f["still_present"]
    assert doc["findings"]["resolved"] == ["ZD002"]
    facts = {c["fact"]: c for c in doc["configuration"]}
    assert facts["units"]["changed"] and not facts["world_size"]["changed"]
    # the stage did not change: ZD003's fix is not claimed applied
    assert not _fix(doc, "ZD003")["applied"]


def test_coarse_wrap_and_slow_link_fixes_on_recorded_runs():
    doc = compare(recorded("wrap-root"), recorded("healthy-block"))
    assert _fix(doc, "ZD001")["verdict"] == CONFIRMED
    doc = compare(recorded("slow-link-50ms"), recorded("healthy-block"))
    f = _fix(doc, "ZD005")
    assert "simulated_link_latency_s 0.05 -> 0.0" in f["applied"]
    # the recorded all-gathers' slope is hidden by the noise: the model prices the fixed link
    # at the per-byte cost it fitted (0, its error in the range) with the 50 ms delay per call
    # removed (the latency set to gloo-cpu's healthy 2 ms per call, the range down to 0: the
    # range's low end is the "latency 0" one's, its high end 221 ms: widened by the misfit of
    # the replay's exposed time, by the ranks' arrival spread the replay takes from the run
    # itself, and by the noise of the two runs' mean exposed times (the worst rank's moves
    # 34 ms from step to step over 9 steps: t(8) x sqrt(2) x its standard error, +/-37 ms,
    # which takes the low end to 0; 44.5-243 ms with step 1 in and that noise not yet
    # carried, 46.3-241 ms before the spread was); before
    # issue 22's fix it priced them at gloo-cpu's class figure (120 MB/s, the
    # healthy run's reached 142 MB/s) and missed: "observed 156 ms, predicted 169 ms-218 ms"
    ex, step = (next(e for e in f["effects"] if e["metric"] == m)
                for m in ("exposed_comm_seconds_per_step", "step_seconds"))
    for e in (ex, step):
        assert e["lo"] <= e["observed_after"] <= e["hi"] and e["verdict"] == CONFIRMED, e
    assert ex["reason"] == "observed 135 ms, inside 0 s-221 ms"
    from zerodoc.whatif import Changes, answer, fit
    nz = answer(fit(recorded("slow-link-50ms").snapshot), Changes(), memory=False)["noise"]
    assert nz["exposed_steps"] == 9 and nz["exposed_t"] == 2.31
    assert nz["exposed_s"] * nz["exposed_t"] == pytest.approx(0.037, abs=0.001)
    assert ex["value"] < ex["observed_after"]  # the point: the hidden slope priced at 0
    assert f["verdict"] == CONFIRMED


def test_undoing_a_fix_is_a_new_finding_and_slower_step_is_worse():
    doc = compare(recorded("healthy-block"), recorded("wrap-linear"))
    assert "ZD002" in doc["findings"]["new"]
    assert not [f for f in doc["fixes"] if f["applied"]]
    ag = next(m for m in doc["measurements"] if m["metric"] == "all_gathers_per_step")
    assert (ag["before"], ag["after"], ag["judgement"]) == (10, 36, "worse")


def test_declared_fix_is_judged():
    """Declared with --applied: judged, unless another fix shows in the facts too (here
    ZD002's wrap: the observed change is both's; it was judged against it)."""
    doc = compare(recorded("healthy-block"), recorded("straggler-noisy-neighbour"),
                  applied={"ZD006"})
    f = _fix(doc, "ZD006")
    assert f["applied_by"] == "user" and f["verdict"] in (CONFIRMED, PARTLY, NOT_CONFIRMED,
                                                           WORSE, INCONCLUSIVE)
    assert f["effects"][0]["verdict"] != NOT_JUDGED and f["reason"] is None
    doc = compare(recorded("wrap-linear"), recorded("healthy-block"), applied={"ZD006"})
    f = _fix(doc, "ZD006")
    assert f["applied_by"] == "user" and f["verdict"] == NOT_JUDGED
    assert "(ZD002's fix)" in f["reason"] and f["reason"].endswith("alone")


# --- the history fed back ------------------------------------------------------------------


def _doc(ratio, verdict):
    eff = {"metric": "all_gather_seconds_per_step", "direction": "down", "value": 0.2,
           "now": 0.4, "cost": False, "observed_before": 0.4, "observed_after": 0.4 - 0.2 * ratio,
           "ratio": ratio, "verdict": verdict}
    return {"before": {"source": "b"}, "after": {"source": "a"},
            "fixes": [{"code": "ZD002", "applied": "units 18 -> 5", "verdict": verdict,
                       "effects": [eff]}]}


def test_history_note_only_when_outcomes_keep_differing_one_way(tmp_path, monkeypatch):
    monkeypatch.delenv("ZERODOC_HISTORY", raising=False)
    snap = load_run(SCEN / "wrap-linear", window=None, stale_after_s=float("inf"))
    findings = diagnose(snap)
    path = tmp_path / history.HISTORY_NAME

    def noted():
        f = next(f for f in history.annotate(findings, snap, path) if f.code == "ZD002")
        return f.extra.get("history")

    history.record(path, _doc(0.4, PARTLY), snap)
    assert noted() is None  # one outcome is not a pattern
    history.record(path, _doc(0.5, PARTLY), snap)
    note = noted()
    assert note["side"] == "less" and note["compares"] == 2
    assert note["text"].startswith("last time on this run: predicted all-gather time / step "
                                   "400 ms -> 200 ms, got 400 ms -> 300 ms")
    history.record(path, _doc(1.0, CONFIRMED), snap)  # then it came true
    assert noted() is None
    history.record(path, _doc(2.0, CONFIRMED), snap)
    history.record(path, _doc(2.5, CONFIRMED), snap)
    assert noted() is None  # the last 5 are not all on one side
    for _ in range(3):
        history.record(path, _doc(2.2, CONFIRMED), snap)
    assert noted()["side"] == "more"
    other = load_run(SCEN / "wrap-root", window=None, stale_after_s=float("inf"))
    assert all("history" not in f.extra for f in history.annotate(diagnose(other), other, path))
    path.write_text(path.read_text() + "not json\n")
    assert noted()["side"] == "more"  # a torn line is skipped


def test_history_is_bounded_and_can_be_turned_off(tmp_path, monkeypatch):
    path = tmp_path / "h.jsonl"
    snap = load_run(SCEN / "wrap-linear", window=None, stale_after_s=float("inf"))
    monkeypatch.setattr(history, "MAX_ENTRIES", 10)
    for _ in range(25):
        history.record(path, _doc(0.5, PARTLY), snap)
    assert len(path.read_text().splitlines()) == 10
    monkeypatch.setenv("ZERODOC_HISTORY", "off")
    assert history.history_path(tmp_path) is None
    monkeypatch.setenv("ZERODOC_HISTORY", str(tmp_path / "x.jsonl"))
    assert history.history_path(None) == tmp_path / "x.jsonl"
    monkeypatch.delenv("ZERODOC_HISTORY")
    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    assert history.history_path(run) == (tmp_path / "runs" / history.HISTORY_NAME).resolve()


@pytest.mark.slow
def test_report_shows_the_history_note(tmp_path):
    runs = tmp_path / "runs"
    for name in ("wrap-linear", "healthy-block"):
        shutil.copytree(SCEN / name, runs / name)
    snap = load_run(runs / "wrap-linear", window=None, stale_after_s=float("inf"))
    path = runs / history.HISTORY_NAME
    for r in (0.4, 0.5):
        history.record(path, _doc(r, PARTLY), snap)
    env = {k: v for k, v in __import__("os").environ.items() if k != "ZERODOC_HISTORY"}
    out = zerodoc("report", str(runs / "wrap-linear"), "--window", "0", env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "history: last time on this run: predicted" in out.stdout
    rep = json.loads(zerodoc("report", str(runs / "wrap-linear"), "--json", env=env,
                             timeout=120).stdout)
    f = next(f for f in rep["findings"] if f["code"] == "ZD002")
    assert f["history"]["side"] == "less" and f["predicted_effects"][0]["metric"]


# --- the command line ------------------------------------------------------------------


@pytest.mark.parametrize("args,msg", [
    (["/nonexistent/a", str(SCEN / "wrap-linear")], "no run directory"),
    ([str(SCEN / "wrap-linear"), str(SCEN / "healthy-block"), "--applied", "ZD999"],
     "not a rule code"),
    ([str(SCEN / "wrap-linear"), str(SCEN / "healthy-block"), "--noise", "2"], "--noise"),
])
@pytest.mark.slow
def test_bad_input_is_one_line(args, msg):
    out = zerodoc("compare", *args, timeout=120, env={**__import__("os").environ,
                                                      "ZERODOC_HISTORY": "off"})
    assert out.returncode == 2 and msg in out.stderr and "Traceback" not in out.stderr


def test_json_schema_is_documented():
    doc = compare(recorded("wrap-linear"), recorded("healthy-block"))
    text = DOCS.read_text()
    keys = set(doc) | set(doc["summary"]) | set(doc["fixes"][0]) | \
        set(doc["fixes"][0]["effects"][0]) | set(doc["measurements"][0]) | \
        set(doc["configuration"][0]) | set(doc["units"]) | set(doc["findings"]) | \
        set(doc["runs"]["before"]) | set(doc["environment"]) | set(doc["noise"]) | \
        set(doc["noise"]["per_step"]["step"]) | set(doc["summary"]["verdicts"]) | \
        {"verdict_as_it_stands"}
    missing = sorted(k for k in keys if f"`{k}`" not in text)
    assert not missing, missing
    facts = {c["fact"] for c in doc["configuration"]}
    assert not sorted(f for f in facts if f"`{f}`" not in text)


# --- for real: the demo loop, and a live endpoint source ----------------------------------------


def _by_the_range(e: dict) -> None:
    """A time effect judged by its range as docs/compare.md says: confirmed inside a range
    that excludes the value before (or with a change the predicted way beyond the noise),
    missed outside it by more than the noise, else inconclusive with the reason."""
    lo, hi, b, a, n = (e[k] for k in ("lo", "hi", "observed_before", "observed_after", "noise"))
    outside = max(lo - a, a - hi, 0.0)
    if e["verdict"] == CONFIRMED:
        assert outside == 0 and (not lo <= b <= hi or b - a > n), e
    elif e["verdict"] == MISSED:
        assert outside > n, e
    else:
        assert e["verdict"] == INCONCLUSIVE and e["reason"], e
        assert outside <= n or lo <= b <= hi, e


@pytest.mark.slow
def test_demo_loop_confirms_the_wrap_fix(tmp_path):
    runs = tmp_path / "zerodoc-runs"
    common = ["--headless", "--steps", "8", "--port", "0"]
    out = zerodoc("demo", *common, "--wrap", "linear", "--run-dir", str(runs / "before"))
    assert out.returncode == 0, out.stderr
    rep = json.loads(zerodoc("report", str(runs / "before"), "--json").stdout)
    assert rep["findings"][0]["code"] == "ZD002", [f["code"] for f in rep["findings"]]
    out = zerodoc("demo", *common, "--wrap", "block", "--run-dir", str(runs / "after"))
    assert out.returncode == 0, out.stderr
    out = zerodoc("compare", str(runs / "before"), str(runs / "after"), "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    f = _fix(doc, "ZD002")
    assert f["applied_by"] == "facts" and not f["still_present"]
    by = {e["metric"]: e for e in f["effects"]}
    assert by["all_gathers_per_step"]["verdict"] == CONFIRMED
    assert by["all_gathers_per_step"]["observed_after"] == by["all_gathers_per_step"]["value"]
    ex = by["exposed_comm_seconds_per_step"]  # the step model's, with its range
    assert f["effects"][0]["metric"] == "exposed_comm_seconds_per_step"
    # the point predicts less waiting; the range may reach past "now" (the framework's
    # per-call vs per-byte price, which one run cannot tell apart: docs/whatif.md)
    assert ex["lo"] < ex["value"] < ex["hi"] and ex["value"] < ex["now"], ex
    _by_the_range(ex)
    assert f["verdict"] in (CONFIRMED, PARTLY, INCONCLUSIVE, MISSED)
    lines = (runs / history.HISTORY_NAME).read_text().splitlines()
    assert [json.loads(x)["code"] for x in lines] == ["ZD002"]
    md = zerodoc("compare", str(runs / "before"), str(runs / "after"), "--markdown",
                 "--no-history").stdout
    assert f"**ZD002 `wrap-too-fine`: {f['verdict']}**" in md, md
    assert "| effect | predicted | observed | verdict |" in md
    assert len((runs / history.HISTORY_NAME).read_text().splitlines()) == 1


@pytest.mark.slow
def test_compare_reads_live_endpoints(tmp_path):
    runs = tmp_path / "runs"
    shutil.copytree(SCEN / "wrap-linear", runs / "wrap-linear")
    # every step's per-unit detail: the endpoints' window is the few steps between two
    # scrapes, which holds a sampled step (the all-gather count judged here) only by chance
    # under the default's sampling (a sample every ~15 s)
    with LiveDemo(tmp_path, steps=10**6, attach={"detail": "every"}) as demo:
        demo.wait_steps(4)
        out = zerodoc("compare", str(runs / "wrap-linear"), ",".join(demo.endpoints),
                      "--json", "--no-history", timeout=120)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["after"]["source"].startswith("endpoints ")
    f = _fix(doc, "ZD002")
    assert "units 18 -> 5" in f["applied"]
    count = next(e for e in f["effects"] if e["metric"] == "all_gathers_per_step")
    # a job still running: flagged, and every verdict inconclusive, saying how it stands
    assert doc["runs"]["after"]["live"] and not doc["runs"]["before"]["live"]
    assert count["observed_after"] == 10 and count["verdict"] == INCONCLUSIVE
    assert count["verdict_as_it_stands"] == CONFIRMED
    assert count["reason"].startswith("AFTER is still being written (")


def test_tui_feed_findings_carry_the_history_note(tmp_path, monkeypatch):
    """The TUI's feed annotates its findings from the history beside the followed run."""
    from zerodoc.sources import open_source
    from zerodoc.tui.feed import Feed

    monkeypatch.delenv("ZERODOC_HISTORY", raising=False)
    runs = tmp_path / "runs"
    shutil.copytree(SCEN / "wrap-linear", runs / "wrap-linear")
    snap = load_run(runs / "wrap-linear", window=None, stale_after_s=float("inf"))
    for r in (0.3, 0.6):
        history.record(runs / history.HISTORY_NAME, _doc(r, PARTLY), snap)
    frame = Feed(open_source(str(runs / "wrap-linear"))).fetch()
    f = next(f for f in frame.findings if f.code == "ZD002")
    assert f.extra["history"]["side"] == "less" and f.extra["history"]["compares"] == 2


@pytest.mark.slow
def test_compare_reads_profiler_traces(tmp_path_factory, tmp_path, capsys, monkeypatch):
    """Both sides PyTorch profiler traces (the shared profiled runs of the trace tests:
    FSDP2's synchronous all-gathers, then async unshard + prefetch): the async run's overlap
    shows as a configuration change and as less exposed all-gather time."""
    from tests.support.helpers import profiled
    from zerodoc.cli.main import main

    monkeypatch.setenv("ZERODOC_HISTORY", str(tmp_path / "h.jsonl"))
    _, sync = profiled(tmp_path_factory, "sync")
    _, asyn = profiled(tmp_path_factory, "async")
    assert main(["compare", str(sync), str(asyn), "--json", "--window", "0"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert "trace" in doc["before"]["source"].lower() and "trace" in doc["after"]["source"].lower()
    assert not doc["summary"]["live"]  # traces are finished files, never "still being written"
    facts = {c["fact"]: c for c in doc["configuration"]}
    assert (facts["synchronous_all_gathers"]["before"],
            facts["synchronous_all_gathers"]["after"]) == (True, False)
    m = next(x for x in doc["measurements"] if x["metric"] == "all_gather_exposed_seconds_per_step")
    # less exposed all-gather time; "better" only beyond the runs' noise, which 4 profiled
    # steps a side measure wide (+/-125 ms on a 78 -> 53 ms change in one run: within it)
    assert m["after"] < m["before"] and m["noise_from"].startswith("per-step exposed times")
    assert m["judgement"] == ("better" if m["before"] - m["after"] > m["noise"]
                              else "within noise"), m
    for f in doc["fixes"]:
        if f["code"] == "ZD004":
            assert f["applied"] == "all-gathers synchronous -> asynchronous", f


def test_unit_size_is_judged_in_the_direction_of_the_applied_fix():
    """After ZD001's fix (shard per block) the median all-gather shrinks: compare called that
    "worse" (the observable's fixed "up"); ZD002's fix grows it and that stays "better"."""
    doc = compare(recorded("wrap-root"), recorded("healthy-block"))
    assert _fix(doc, "ZD001")["applied"]
    m = next(x for x in doc["measurements"] if x["metric"] == "median_all_gather_bytes")
    assert m["after"] < m["before"] and m["judgement"] == "better", m
    assert (m["better"], m["better_from"]) == ("down", "ZD001")
    units = next(x for x in doc["measurements"] if x["metric"] == "units")
    assert units["after"] > units["before"] and units["judgement"] == "better", units
    doc = compare(recorded("wrap-linear"), recorded("healthy-block"))
    m = next(x for x in doc["measurements"] if x["metric"] == "median_all_gather_bytes")
    assert m["after"] > m["before"] and (m["judgement"], m["better_from"]) == ("better", "ZD002")
    doc = compare(recorded("healthy-block"), recorded("wrap-linear"))  # no fix applied
    m = next(x for x in doc["measurements"] if x["metric"] == "median_all_gather_bytes")
    assert (m["judgement"], m["better"]) == ("changed", None), m


def test_peak_memory_on_cpu_cannot_be_judged_below_the_runtime():
    """A peak-memory prediction on CPU was "not confirmed" where process memory (~450 MB of
    runtime) cannot show a change of tens of MB: it says it cannot judge that on CPU, and
    that does not lower the fix's verdict."""
    from zerodoc.compare.render import render_text

    doc = compare(recorded("wrap-root"), recorded("healthy-block"))
    f = _fix(doc, "ZD001")
    peak = next(e for e in f["effects"] if e["metric"] == "peak_memory_bytes")
    assert peak["verdict"] == "cannot judge on CPU", peak
    assert "process memory hides a change of this size" in peak["reason"]
    assert f["verdict"] == CONFIRMED
    assert "cannot judge on CPU (process memory hides a change of this size" in render_text(doc)


def test_compare_judges_predictions_made_with_a_link_profile(tmp_path):
    """`zerodoc compare --link-profile`: the predictions judged are the ones the report makes
    with the same profile (each side diagnosed with it)."""
    from tests.test_report import CONVEX_PROFILE
    from zerodoc.whatif.linkprofile import profile_from_dict

    prof = profile_from_dict(CONVEX_PROFILE, "p.json")

    def with_profile(name):
        snap = load_run(SCEN / name, window=None, stale_after_s=float("inf"), skip_warmup=True)
        return side(snap, f"run log {name}", link_profile=prof)

    plain = compare(recorded("wrap-linear"), recorded("healthy-block"))
    prof_doc = compare(with_profile("wrap-linear"), with_profile("healthy-block"))
    ex = [next(e for e in _fix(d, "ZD002")["effects"]
               if e["metric"] == "exposed_comm_seconds_per_step") for d in (plain, prof_doc)]
    assert ex[1]["value"] > ex[0]["value"]
    assert ex[1]["observed_after"] == ex[0]["observed_after"]  # the same runs, measured
    assert ex[1]["verdict"] is not None


# --- verdicts that can fail (issue 31): ranges, the runs' noise, the change predicted for, live


# The issue's case: resharding turned off, "step time 2.54 s -> 2.23 s (1.88 s-2.61 s)"
# predicted, 2.54 s -> 2.6 s observed, and compare said "confirmed".
ISSUE_STEP = Predicted("step_seconds", "down", 2.23, 2.54, lo=1.88, hi=2.61)


def test_a_range_holding_the_before_value_is_never_confirmed_within_noise():
    """Inside a range that holds the value before, a change within the runs' noise (or the
    other way) cannot tell a win from no change: inconclusive, with the reason. (On the code
    before, every one of these was "confirmed".)"""
    out = judge(ISSUE_STEP, 2.54, 2.6, noise=0.1)
    assert out["verdict"] == INCONCLUSIVE, out
    assert out["reason"] == ("observed 2.6 s, inside 1.88 s-2.61 s, but the range holds the "
                             "before-value 2.54 s: cannot tell a win from no change; the "
                             "change +60 ms is within the runs' noise (+/-100 ms)")
    assert "it moved the other way (+60 ms)" in judge(ISSUE_STEP, 2.54, 2.6, noise=0.01)["reason"]
    for before in (1.9, 2.2, 2.54, 2.6):  # every before-value inside the range
        for d in (-0.09, -0.05, 0.0, 0.05, 0.09):  # every change within the noise
            after = before + d
            if 1.88 <= after <= 2.61:
                v = judge(ISSUE_STEP, before, after, noise=0.1)["verdict"]
                assert v == INCONCLUSIVE, (before, after, v)
    # beyond the noise and the predicted way it is a measured win: confirmed, and says why
    out = judge(ISSUE_STEP, 2.54, 2.2, noise=0.1)
    assert out["verdict"] == CONFIRMED and "beyond the runs' noise (+/-100 ms)" in out["reason"]
    # a range that excludes the value before: inside is confirmed whatever the noise
    assert judge(ISSUE_STEP, 2.8, 2.5, noise=0.5)["verdict"] == CONFIRMED
    # outside by less than the noise is no miss; by more it is
    assert judge(ISSUE_STEP, 2.8, 2.65, noise=0.1)["verdict"] == INCONCLUSIVE
    assert judge(ISSUE_STEP, 2.8, 2.75, noise=0.1)["verdict"] == MISSED


def test_made_worse_and_not_confirmed_must_be_beyond_the_noise():
    p = Predicted("step_seconds", "down", 0.6, 1.0)
    assert judge(p, 1.0, 1.2, noise=0.1)["verdict"] == WORSE
    assert judge(p, 1.0, 1.2, noise=0.3)["verdict"] == NOT_CONFIRMED  # 0.6 predicted: not it
    out = judge(Predicted("step_seconds", "down", 0.95, 1.0), 1.0, 1.2, noise=0.3)
    assert out["verdict"] == INCONCLUSIVE and "within the runs' noise (+/-300 ms)" in out["reason"]
    assert judge(Predicted("step_seconds", "down"), 1.0, 0.8, noise=0.3)["verdict"] == INCONCLUSIVE
    assert judge(Predicted("step_seconds", "down"), 1.0, 0.8, noise=0.1)["verdict"] == CONFIRMED


def _step_times(name: str) -> dict[int, list[float]]:
    """Each rank's per-step step times read straight from its run log's step records
    (step 1, the warm-up, left out as `recorded()` does): the witness for the noise."""
    out = {}
    for p in sorted((SCEN / name).glob("rank-*.jsonl")):
        recs = [json.loads(x) for x in p.read_text().splitlines() if x.strip()]
        rank = next(r["rank"] for r in recs if r.get("type") == "header")
        out[rank] = [r["step_s"] for r in recs if r.get("type") == "step" and r["step"] > 1]
    return out


def test_a_rerun_with_nothing_changed_is_environment_never_better_or_worse():
    """Two recorded runs of the same command (the second with another process on rank 0's
    core): no fact changed, the step 32 % and compute 38 % slower. Compare said "+32 %
    worse" (a fixed 5 % noise floor); now the step's noise comes from the runs' own
    per-step spread and a change beyond it with no configuration change is the
    environment's, in either direction."""
    import statistics

    for a, b in (("healthy-block", "straggler-noisy-neighbour"),
                 ("straggler-noisy-neighbour", "healthy-block")):
        doc = compare(recorded(a), recorded(b))
        assert not any(c["changed"] for c in doc["configuration"])
        by = {m["metric"]: m for m in doc["measurements"]}
        assert {m["judgement"] for m in doc["measurements"]} <= {WITHIN_NOISE, ENVIRONMENT}, \
            [(m["metric"], m["judgement"]) for m in doc["measurements"]]
        assert by["step_seconds"]["judgement"] == ENVIRONMENT
        assert by["compute_seconds_per_step"]["judgement"] == ENVIRONMENT
        env = doc["environment"]
        assert not env["configuration_changed"] and env["compute_beyond_noise"]
        assert env["text"].startswith(
            f"compute {by['compute_seconds_per_step']['change_fraction'] * 100:+.0f} % with "
            "no configuration change: the host's load, not the job")
        assert not doc["summary"]["worse"]
        # the step's noise: t(8) = 2.31 (Student's t table, 97.5 %) x sqrt(se_a^2 + se_b^2),
        # each run's standard error of the mean from its widest-spread rank's step times
        se = [max(statistics.stdev(xs) / len(xs) ** 0.5 for xs in _step_times(n).values())
              for n in (a, b)]
        assert by["step_seconds"]["noise"] == pytest.approx(
            2.31 * (se[0] ** 2 + se[1] ** 2) ** 0.5, rel=1e-4)
        assert by["step_seconds"]["noise_measured"]
        assert by["step_seconds"]["noise_from"] == "per-step step times (9 + 9 steps)"
    same = compare(recorded("healthy-block"), recorded("healthy-block"))
    assert {m["judgement"] for m in same["measurements"]} == {WITHIN_NOISE}
    assert "a rerun" in same["environment"]["text"]
    from zerodoc.compare.render import render_text

    text = render_text(doc)
    assert "% environment" in text and not re.search(r"%\s+(better|worse)", text), text
    assert "Environment: compute -27 % with no configuration change: the host's load" in text


def test_without_per_step_figures_the_noise_is_a_stated_floor():
    """Prometheus and rank endpoints keep no per-step figures: the noise is not measured,
    and times fall back to the conservative floor, named as such."""
    import copy

    from zerodoc.compare.noise import TIME_FLOOR

    def bare(name):
        snap = copy.deepcopy(recorded(name).snapshot)
        for w in snap.ranks.values():
            w.step_times, w.exposed_times = [], []
        return side(snap, name)

    doc = compare(bare("healthy-block"), bare("straggler-noisy-neighbour"))
    step = next(m for m in doc["measurements"] if m["metric"] == "step_seconds")
    assert not step["noise_measured"] and step["noise_from"].startswith("not measured")
    assert step["noise"] == pytest.approx(TIME_FLOOR * step["before"], rel=1e-5)
    assert step["judgement"] == ENVIRONMENT  # +32 %, beyond 15 %, nothing changed
    assert doc["noise"]["per_step"] == {"step": None, "exposed": None}


def _facts_changed(name: str, *, reshard: bool | None = None, prefetch: dict | None = None):
    """A recorded run with its configuration facts changed as a fix would change them (the
    measurements kept: what is tested is which prediction is judged against which change)."""
    import copy
    from dataclasses import replace

    snap = copy.deepcopy(load_run(SCEN / name, window=None, stale_after_s=float("inf"),
                                  skip_warmup=True))
    for w in snap.ranks.values():
        f = w.facts
        if reshard is not None:
            f = replace(f, units=type(f.units)(replace(u, reshard_after_forward=reshard)
                                               for u in f.units))
        if prefetch is not None:
            f = replace(f, config={**(f.config or {}), "prefetch": prefetch})
        w.facts = f
    return side(snap, f"{name}, facts changed")


def test_a_prediction_is_judged_only_against_its_own_change():
    """ZD004's prediction (made for prefetching one unit deeper, and resharding only the
    late blocks) was judged against ZD003's fix (resharding off everywhere): ZD004 accepted
    it as its own. Now ZD003 is judged, ZD004 is not, and says why."""
    doc = compare(recorded("over-staging-small-batch"),
                  _facts_changed("over-staging-small-batch", reshard=False))
    z3, z4 = _fix(doc, "ZD003"), _fix(doc, "ZD004")
    assert z3["applied_by"] == "facts" and z3["effects"] and z3["verdict"] != NOT_JUDGED
    assert z4["applied"] is None and z4["effects"] == [] and z4["verdict"] == NOT_JUDGED
    assert z4["reason"].startswith(f"not judged: the applied change is {z3['applied']} "
                                   "(ZD003's fix), the prediction was for "), z4["reason"]
    assert "asynchronous unshard, prefetch depth 2" in z4["reason"]
    assert doc["summary"]["verdicts"][NOT_JUDGED] >= 1
    from zerodoc.compare.render import render_text

    assert f"ZD004 exposed-all-gather (still present) ({z4['reason']})" in render_text(doc)


def test_two_fixes_applied_at_once_are_not_judged_one_by_one():
    """Resharding off and prefetch on in one change: each rule's prediction was made for its
    own fix alone, so neither is judged against the sum (the one that is ZD004's own shows:
    prefetching units)."""
    none = {"forward": 0, "backward": 0, "unshard_async": False}  # as the shim records it
    doc = compare(_facts_changed("healthy-block", prefetch=none), _facts_changed(
        "healthy-block", reshard=False,
        prefetch={"forward": 4, "backward": 4, "unshard_async": True}))
    for code, other in (("ZD003", "ZD004"), ("ZD004", "ZD003")):
        f = _fix(doc, code)
        assert f["applied_by"] == "facts" and f["verdict"] == NOT_JUDGED, f
        assert f["reason"].startswith("not judged: the applied changes are ")
        assert f"({other}'s fix)" in f["reason"] and f["reason"].endswith(" alone")
        judged = [e for e in f["effects"] if e["verdict"] not in (UNKNOWN, "cannot judge on CPU")]
        assert judged and all(e["verdict"] == NOT_JUDGED for e in judged)


def _shift_unix(rec, by: float):
    if isinstance(rec, dict):
        return {k: (v + by if k.endswith("_unix") and isinstance(v, (int, float)) and v
                    else _shift_unix(v, by)) for k, v in rec.items()}
    if isinstance(rec, list):
        return [_shift_unix(x, by) for x in rec]
    return rec


def _as_if_live(src: Path, dst: Path, *, ended: bool = False, now: bool = True) -> Path:
    """A copy of a recorded run as if it were being written: its end records dropped (kept
    with `ended`) and its timestamps (the rank logs' and their per-step detail's) moved to
    now (kept with `now=False`: a run that died)."""
    shutil.copytree(src, dst)
    paths = [*dst.glob("rank-*.jsonl"), *dst.glob("detail/*.jsonl")]
    last = max(json.loads(x).get("end_unix") or 0 for p in paths
               for x in p.read_text().splitlines() if x.strip())
    by = time.time() - last - 1 if now else 0.0
    for p in paths:
        recs = [json.loads(x) for x in p.read_text().splitlines() if x.strip()]
        p.write_text("".join(json.dumps(_shift_unix(r, by)) + "\n" for r in recs
                             if ended or r.get("type") != "end"))
    return dst


def test_a_run_still_being_written_is_flagged_and_its_verdicts_inconclusive(tmp_path, capsys,
                                                                              monkeypatch):
    """`compare base live` said "-59 % better" after 2 steps with no flag. AFTER without its
    end records and written a second ago: flagged in the JSON (`runs.after.live`), the text
    and every verdict, which says how it stands; ended, or gone stale (a run that died), it
    is not live."""
    from zerodoc.cli.main import main

    monkeypatch.setenv("ZERODOC_HISTORY", str(tmp_path / "h.jsonl"))
    live = _as_if_live(SCEN / "healthy-block", tmp_path / "live")
    assert main(["compare", str(SCEN / "wrap-linear"), str(live), "--json", "--window", "0"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["runs"]["after"] == {"live": True, "ranks": [0, 1], "steps_so_far": 10}
    assert doc["runs"]["before"]["live"] is False and doc["summary"]["live"]
    f = _fix(doc, "ZD002")
    assert f["applied_by"] == "facts" and f["verdict"] == INCONCLUSIVE
    why = "AFTER is still being written (10 steps so far)"
    assert f["reason"] == f"inconclusive: {why}"
    for e in f["effects"]:
        assert e["verdict"] == INCONCLUSIVE and e["reason"].startswith(why + "; as it stands: ")
    count = next(e for e in f["effects"] if e["metric"] == "all_gathers_per_step")
    assert count["verdict_as_it_stands"] == CONFIRMED
    line = json.loads((tmp_path / "h.jsonl").read_text().splitlines()[-1])
    assert (line["verdict"], line["side"]) == (INCONCLUSIVE, None) and line["reason"] == \
        f["effects"][0]["reason"]
    assert main(["compare", str(SCEN / "wrap-linear"), str(live), "--window", "0",
                 "--no-history"]) == 0
    text = capsys.readouterr().out
    assert "(LIVE: still being written, 10 steps so far;" in text
    assert f"ZD002 wrap-too-fine: INCONCLUSIVE" in text and why in text
    for kw, name in (({"ended": True}, "ended"), ({"now": False}, "died")):
        d = _as_if_live(SCEN / "healthy-block", tmp_path / name, **kw)
        assert main(["compare", str(SCEN / "wrap-linear"), str(d), "--json", "--window", "0",
                     "--no-history"]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert doc["runs"]["after"]["live"] is False, name
        assert _fix(doc, "ZD002")["verdict"] == CONFIRMED, name


def test_inconclusive_outcomes_are_recorded_but_make_no_pattern(tmp_path):
    snap = load_run(SCEN / "wrap-linear", window=None, stale_after_s=float("inf"))
    findings = diagnose(snap)
    path = tmp_path / history.HISTORY_NAME
    for r in (0.4, 0.5, 0.3):
        history.record(path, _doc(r, INCONCLUSIVE), snap)
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [(x["verdict"], x["side"]) for x in lines] == [(INCONCLUSIVE, None)] * 3
    f = next(f for f in history.annotate(findings, snap, path) if f.code == "ZD002")
    assert "history" not in f.extra


def test_zd004_is_not_judged_against_zd003s_fix_on_recorded_runs():
    """The issue's case on real runs: the demo with small micro-batches (ZD003 and ZD004
    fire), then the same command with resharding off (tests/data/compare). ZD003's fix is
    judged; its step-time range holds the value before (382 ms in 143-567 ms) and the step
    got slower (440 ms, within the runs' noise): inconclusive, where the code before said
    "confirmed". ZD004's prediction, for prefetching one unit deeper, is not judged."""
    after = load_run(DATA / "compare" / "no-reshard-small-batch", window=None,
                     stale_after_s=float("inf"), skip_warmup=True)
    doc = compare(recorded("over-staging-small-batch"), side(after, "no reshard"))
    z3, z4 = _fix(doc, "ZD003"), _fix(doc, "ZD004")
    assert z3["applied"] == "stage zero3 -> zero2" and z3["reason"] is None
    by = {e["metric"]: e for e in z3["effects"]}
    step = by["step_seconds"]
    assert step["lo"] <= step["observed_before"] <= step["hi"]
    assert step["lo"] <= step["observed_after"] <= step["hi"]
    assert step["observed_after"] > step["observed_before"]  # slower, not the predicted way
    assert step["verdict"] == INCONCLUSIVE and "holds the before-value" in step["reason"]
    assert by["backward_all_gather_bytes_per_step"]["verdict"] == CONFIRMED  # 14.7 MB -> 0
    assert z4["applied"] is None and z4["verdict"] == NOT_JUDGED and z4["effects"] == []
    assert z4["reason"] == ("not judged: the applied change is stage zero3 -> zero2 (ZD003's "
                            "fix), the prediction was for " + z4["predicted_for"])
    assert "asynchronous unshard, prefetch depth 2" in z4["predicted_for"]


def test_two_rules_reading_one_change_name_the_same_change():
    """ZD005 (the path) and ZD008 (tensor parallelism) both take a new mesh as their fix:
    one change, not two applied at once; a dtype change (ZD009's) beside it is another."""
    from zerodoc.compare.judge import _others, applied_changes

    b = {"mesh_shape": "8", "link": "nvlink", "param_dtype": "float32"}
    a = {"mesh_shape": "2x4", "link": "nvlink", "param_dtype": "float32"}
    ch = applied_changes(b, a)
    assert {"ZD005", "ZD008"} <= set(ch) and ch["ZD005"][1] == ch["ZD008"][1] == {"mesh_shape"}
    assert _others(ch, "ZD005") == ""
    ch = applied_changes(b, {**a, "param_dtype": "bfloat16"})
    assert _others(ch, "ZD005") == "param_dtype float32 -> bfloat16 (ZD009's fix)"
