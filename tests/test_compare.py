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
from pathlib import Path

import pytest

from tests.support.helpers import ROOT, LiveDemo
from zerodoc.compare import history
from zerodoc.compare.judge import (
    CONFIRMED, MISSED, NOT_CONFIRMED, PARTLY, UNKNOWN, WORSE, compare, judge, overall, side,
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
    (Predicted("peak_memory_bytes", "down", None, 5e9), 5e9, 5.1e9, NOT_CONFIRMED),
    (Predicted("peak_memory_bytes", "up", 6e9, 5e9, cost=True), 5e9, 5.9e9, CONFIRMED),  # cost
    (Predicted("peak_memory_bytes", "up", 6e9, 5e9, cost=True), 5e9, 7e9, WORSE),  # costlier
    (Predicted("step_seconds", "down", 0.6, 1.0), None, 0.6, UNKNOWN),
    # with a range (the step model's): inside is confirmed, outside missed, either side
    (Predicted("step_seconds", "down", 0.6, 1.0, lo=0.5, hi=0.7), 1.0, 0.68, CONFIRMED),
    (Predicted("step_seconds", "down", 0.6, 1.0, lo=0.5, hi=0.7), 1.0, 0.75, MISSED),
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


def test_a_missed_range_names_the_observed_value_and_the_range():
    out = judge(Predicted("step_seconds", "down", 0.6, 1.0, lo=0.5, hi=0.7), 1.0, 0.75)
    assert out["reason"] == "observed 750 ms, predicted 500 ms-700 ms"
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
    doc = compare(recorded("wrap-linear"), recorded("healthy-block"), applied={"ZD006"})
    f = _fix(doc, "ZD006")
    assert f["applied_by"] == "user" and f["verdict"] in (CONFIRMED, PARTLY, NOT_CONFIRMED,
                                                           WORSE)


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
        set(doc["configuration"][0]) | set(doc["units"]) | set(doc["findings"])
    missing = sorted(k for k in keys if f"`{k}`" not in text)
    assert not missing, missing
    facts = {c["fact"] for c in doc["configuration"]}
    assert not sorted(f for f in facts if f"`{f}`" not in text)


# --- for real: the demo loop, and a live endpoint source ----------------------------------------


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
    assert ex["verdict"] == (CONFIRMED if ex["lo"] <= ex["observed_after"] <= ex["hi"]
                             else MISSED), ex
    assert f["verdict"] in (CONFIRMED, PARTLY)
    lines = (runs / history.HISTORY_NAME).read_text().splitlines()
    assert [json.loads(x)["code"] for x in lines] == ["ZD002"]
    md = zerodoc("compare", str(runs / "before"), str(runs / "after"), "--markdown",
                 "--no-history").stdout
    assert re.search(r"\*\*ZD002 `wrap-too-fine`: (confirmed|partly)\*\*", md), md
    assert "| effect | predicted | observed | verdict |" in md
    assert len((runs / history.HISTORY_NAME).read_text().splitlines()) == 1


@pytest.mark.slow
def test_compare_reads_live_endpoints(tmp_path):
    runs = tmp_path / "runs"
    shutil.copytree(SCEN / "wrap-linear", runs / "wrap-linear")
    with LiveDemo(tmp_path, steps=10**6) as demo:
        demo.wait_steps(4)
        out = zerodoc("compare", str(runs / "wrap-linear"), ",".join(demo.endpoints),
                      "--json", "--no-history", timeout=120)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["after"]["source"].startswith("endpoints ")
    f = _fix(doc, "ZD002")
    assert "units 18 -> 5" in f["applied"]
    count = next(e for e in f["effects"] if e["metric"] == "all_gathers_per_step")
    assert count["observed_after"] == 10 and count["verdict"] == CONFIRMED


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
    facts = {c["fact"]: c for c in doc["configuration"]}
    assert (facts["synchronous_all_gathers"]["before"],
            facts["synchronous_all_gathers"]["after"]) == (True, False)
    m = next(x for x in doc["measurements"] if x["metric"] == "all_gather_exposed_seconds_per_step")
    assert m["judgement"] == "better", m
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
