"""`zerodoc report` as a user (and a CI job) runs it: a subprocess, on recorded demo runs.

Every output format, the exit codes and a sample of bad inputs go through a real
`python -m zerodoc report` process; the remaining flag combinations call the same entry point
(`zerodoc.cli.main.main`) in-process, because each process start imports torch (the demo command's
parser needs it) and that costs seconds on a loaded 2-core host.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from zerodoc.demo.launch import free_port

SCENARIOS = Path(__file__).parent / "data" / "scenarios"
LINEAR = str(SCENARIOS / "wrap-linear")
HEALTHY = str(SCENARIOS / "healthy-block")
UNIT_KEYS = {"unit", "params", "all_gather_count_per_step", "all_gather_bytes_per_step",
             "all_gather_seconds_per_step", "all_gather_exposed_seconds_per_step",
             "all_gather_exposed_fraction", "all_gather_busbw_bytes_per_second",
             "compute_forward_seconds_per_step", "compute_backward_seconds_per_step",
             "reduce_scatter_seconds_per_step", "reduce_scatter_exposed_seconds_per_step",
             "all_reduce_count_per_step", "all_reduce_bytes_per_step",
             "all_reduce_seconds_per_step", "all_reduce_exposed_seconds_per_step",
             "framework_seconds_per_step"}
STEP_KEYS = {"rank", "stale", "steps", "detail_steps", "first_step", "last_step",
             "step_seconds", "compute_seconds", "exposed_comm_seconds", "optimizer_seconds",
             "framework_seconds", "other_seconds", "exposed_fraction"}


def report(*args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "zerodoc", "report", *args],
                          capture_output=True, text=True, timeout=120, cwd=cwd)


def report_in_process(capsys, *args) -> subprocess.CompletedProcess:
    """The same CLI entry point without a new interpreter."""
    from zerodoc.cli.main import main

    try:
        code = main(["report", *args])
    except SystemExit as e:  # argparse errors
        code = e.code
    out = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, out.out, out.err)


@pytest.mark.slow
def test_text_report_has_findings_units_and_steps():
    r = report(LINEAR)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert out.startswith("zerodoc report: run linear | fsdp2 | 2 ranks | ZeRO-3 | gloo/cpu")
    first = next(line for line in out.splitlines() if line.startswith("  WARNING"))
    assert "ZD002 wrap-too-fine" in first
    for text in ("evidence:", "threshold:", "fix:", "predicted:", "docs/rules.md#zd002",
                 "Per unit (per step, mean over ranks)", "blocks.3.fc2", "AG/step", "busbw",
                 "Step breakdown (per step)", "exposed comm", "optimizer"):
        assert text in out, text


@pytest.mark.slow
def test_json_report_is_stable_and_complete():
    r = report(LINEAR, "--json", "--window", "5")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["schema"] == 1
    assert list(rep) == ["schema", "generator", "generated_unix", "source", "run", "link",
                         "window", "ranks", "stale_ranks", "stopped", "summary", "findings",
                         "units", "steps", "thresholds", "ended_ranks", "data_problems",
                         "missing_ranks", "interrupted_ranks", "log_notes", "trace_scope", "device",
                         "waiting", "notes", "exposed_comm", "breakdown_steps", "live",
                         "source_kind"]
    assert rep["source_kind"] == "run"
    assert rep["notes"] == []
    assert rep["stopped"] is None
    assert rep["window"] == {"steps_requested": 5, "steps": 5, "first_step": 6, "last_step": 10,
                             "warmup_left_out": None, "warmup_kept": False,
                             "per_unit": {"sampled": False, "detail_steps": 5, "steps": 5,
                                          "before_window": 0, "every": None, "text": None,
                                          "next": None}}
    assert rep["waiting"] is None
    assert rep["link"] == {"class": "gloo-cpu", "expected_busbw_bytes_per_second": 1.2e8}
    assert rep["summary"]["top"] == "ZD002" and rep["summary"]["worst_severity"] == "warning"
    sev = [f["severity"] for f in rep["findings"]]
    order = ["critical", "error", "warning", "info"]
    assert sev == sorted(sev, key=order.index)
    f = rep["findings"][0]
    assert set(f) == {"code", "name", "severity", "title", "evidence", "threshold", "fix",
                      "predicted", "predicted_effects", "history", "ranks", "units", "doc",
                      "cost_seconds_per_step", "explains", "explained_by", "extra"}
    # The step model's predictions come first (issue 22), each with its range.
    pe = f["predicted_effects"]
    assert [e["metric"] for e in pe[:2]] == ["exposed_comm_seconds_per_step", "step_seconds"]
    assert all(e["lo"] <= e["value"] <= e["hi"] and e["value"] < e["now"] for e in pe[:2]), pe
    assert "whatif" in f["extra"]
    assert f["evidence"]["units"] == 18 and f["threshold"]["wrap_fine_min_units"] == 16
    assert len(rep["units"]) == 18 and all(set(u) == UNIT_KEYS for u in rep["units"])
    assert [s["rank"] for s in rep["steps"]] == [0, 1]
    assert all(set(s) == STEP_KEYS and s["steps"] == 5 for s in rep["steps"])
    assert rep["thresholds"]["exposed_fraction_warn"] == 0.1


@pytest.mark.slow
def test_markdown_report_and_fail_on():
    r = report(LINEAR, "--markdown", "--fail-on", "warning")
    assert r.returncode == 1, r.stderr  # ZD002 is a warning: a CI gate fails
    md = r.stdout
    assert md.startswith("# zerodoc report: run linear")
    assert "### WARNING ZD002 `wrap-too-fine`" in md
    assert "| unit | params | AG/step |" in md and "| rank | steps | step |" in md
    assert "[docs/rules.md#zd002](docs/rules.md#zd002)" in md


@pytest.mark.slow
def test_fail_on_passes_a_healthy_run():
    r = report(HEALTHY, "--fail-on", "warning")
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr)
    assert "Findings: 3 info" in r.stdout


@pytest.mark.parametrize("args, code", [
    ((LINEAR, "--fail-on", "error"), 0),
    ((HEALTHY, "--fail-on", "info"), 1),
    ((str(SCENARIOS / "slow-link-50ms"), "--fail-on", "ERROR", "--json"), 1),
    # without ZD002 the per-linear run's synchronous all-gathers are 1.17x its compute: a
    # ZD006 WARNING (comm-bound past comm_compute_ratio_crit), unless that threshold moves too
    ((LINEAR, "--fail-on", "warning", "--threshold", "wrap_fine_min_units=100"), 1),
    ((LINEAR, "--fail-on", "warning", "--threshold", "wrap_fine_min_units=100",
      "--threshold", "comm_compute_ratio_crit=2"), 0),
    ((LINEAR, "--markdown", "--fail-on", "critical"), 0),
])
def test_fail_on_thresholds_and_formats_combine(capsys, args, code):
    r = report_in_process(capsys, *args)
    assert r.returncode == code, (r.stdout[-2000:], r.stderr)


def test_link_override_changes_the_verdict(capsys):
    # Held to NVLink speed, a gloo run's 0.1 GB/s collectives are a slow link.
    rep = json.loads(report_in_process(capsys, HEALTHY, "--json", "--link", "nvlink").stdout)
    assert rep["summary"]["top"] == "ZD005" and rep["link"]["class"] == "nvlink"


@pytest.mark.slow
def test_default_source_is_the_latest_local_run(tmp_path):
    shutil.copytree(SCENARIOS / "wrap-root", tmp_path / "zerodoc-runs" / "demo-1")
    r = report("--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["summary"]["top"] == "ZD001"


def _bad_run_log(tmp: Path) -> str:
    d = tmp / "bad"
    d.mkdir()
    (d / "rank-00000.jsonl").write_text('{"type": "header", "schema": 1}\n')
    return str(d)


BAD_INPUTS = {
    "missing-dir": (lambda t: [str(t / "missing")], "no run directory"),
    "malformed-log": (lambda t: [_bad_run_log(t)], "not a zerodoc schema-1 header"),
    "dead-endpoint": (lambda t: [f"127.0.0.1:{free_port()}"], "no zerodoc rank answered"),
    "dead-prometheus": (lambda t: [f"http://127.0.0.1:{free_port()}"],
                        "cannot reach Prometheus"),
    "bad-window": (lambda t: [LINEAR, "--window", "-1"], "--window must be >= 0"),
    "bad-threshold": (lambda t: [LINEAR, "--threshold", "nope=1"], "unknown threshold"),
    "bad-threshold-value": (lambda t: [LINEAR, "--threshold", "exposed_fraction_warn=lots"],
                            "needs a float"),
    "bad-link": (lambda t: [LINEAR, "--link", "carrier-pigeon"], "unknown link class"),
    "bad-severity": (lambda t: [LINEAR, "--fail-on", "panic"], "unknown severity"),
    "bad-size": (lambda t: [LINEAR, "--device-memory", "80G"], "expected a number and a unit"),
    "bad-flag": (lambda t: [LINEAR, "--no-such-flag"], "unrecognized arguments"),
}
IN_A_PROCESS = ("missing-dir", "malformed-log", "dead-endpoint")


def _one_line_exit_2(r, message):
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and r.stdout == ""
    err = [line for line in r.stderr.splitlines() if "error" in line]
    assert len(err) == 1 and message in err[0], r.stderr


@pytest.mark.slow
@pytest.mark.parametrize("name", IN_A_PROCESS)
def test_bad_input_is_one_line_and_exit_2(tmp_path, name):
    make_args, message = BAD_INPUTS[name]
    _one_line_exit_2(report(*make_args(tmp_path)), message)


@pytest.mark.parametrize("name", sorted(set(BAD_INPUTS) - set(IN_A_PROCESS)))
def test_more_bad_inputs_exit_2(tmp_path, capsys, name):
    make_args, message = BAD_INPUTS[name]
    _one_line_exit_2(report_in_process(capsys, *make_args(tmp_path)), message)


def test_short_run_window_leaves_the_warm_up_step_out_and_says_so(capsys):
    """A 10-step run's window included step 1 (compile, allocator, first all-gathers), which
    moves the per-unit numbers: by default it is left out and the header says so; the
    per-unit table is then the mean of steps 2-10 read straight from the run logs (the
    witness: `window_from_steps` over each rank's full-detail steps 2-10);
    --include-warmup keeps it."""
    from zerodoc.report import unit_rows
    from zerodoc.runlog import read_rank_log, window_from_steps
    from zerodoc.runmodel import RunSnapshot

    run = SCENARIOS / "healthy-block"
    r = report_in_process(capsys, str(run), "--json")
    rep = json.loads(r.stdout)
    assert rep["window"]["warmup_left_out"] == 1 and rep["window"]["first_step"] == 2
    assert rep["window"]["steps"] == rep["window"]["last_step"] - 1
    witness = RunSnapshot(source="witness")
    for p in sorted(run.glob("rank-*.jsonl")):
        log = read_rank_log(p)
        assert log.steps[0].step == 1
        witness.ranks[log.facts.rank] = window_from_steps(log.facts, log.steps[1:])
    want = {u["unit"]: u for u in unit_rows(witness)}
    for u in rep["units"]:
        for k in ("all_gather_seconds_per_step", "all_gather_exposed_seconds_per_step",
                  "compute_forward_seconds_per_step"):
            assert u[k] == pytest.approx(want[u["unit"]][k], rel=1e-4), (u["unit"], k)
    text = report_in_process(capsys, str(run)).stdout
    assert (f"({rep['window']['steps']} steps, 2-{rep['window']['last_step']}; warm-up step 1 "
            f"left out, --include-warmup keeps it)") in text
    kept = json.loads(report_in_process(capsys, str(run), "--json", "--include-warmup").stdout)
    assert kept["window"]["warmup_left_out"] is None and kept["window"]["first_step"] == 1
    assert kept["units"] != rep["units"]  # the warm-up step moves the per-unit numbers
    whole = json.loads(report_in_process(capsys, str(run), "--json", "--window", "0").stdout)
    assert whole["window"]["warmup_left_out"] == 1 and whole["units"] == rep["units"]


def test_interval_line_windows_leave_the_warm_up_step_out_too(tmp_path, capsys):
    """Issue 20: a window read from the run log's interval lines (no detail files) kept step
    1 where a window read from steps leaves it out. The writer now gives step 1 an interval
    line of its own, so both leave it out and say so. Witness: the same synthetic run
    written with detail files, its steps 2-10 folded by `window_from_steps`. All steps of a
    finished run (`--window 0`) come from its `total` line, which holds step 1: the warm-up
    line is taken off it (the same numbers)."""
    from zerodoc.runmodel import RunSnapshot
    from zerodoc.report import unit_rows
    from zerodoc.runlog import read_rank_log, window_from_steps
    from zerodoc.testing.synthetic import write_run

    lean = write_run(tmp_path / "lean", ranks=2, units=3, steps=10, detail=False)
    full = write_run(tmp_path / "full", ranks=2, units=3, steps=10, detail=True)
    assert not (lean / "detail").exists() or not any((lean / "detail").iterdir())
    rep = json.loads(report_in_process(capsys, str(lean), "--json").stdout)
    assert rep["window"]["warmup_left_out"] == 1 and not rep["window"]["warmup_kept"]
    assert (rep["window"]["first_step"], rep["window"]["steps"]) == (2, 9)
    witness = RunSnapshot(source="witness")
    for p in sorted(full.glob("rank-*.jsonl")):
        log = read_rank_log(p)
        assert [s.step for s in log.steps] == list(range(1, 11))
        witness.ranks[log.facts.rank] = window_from_steps(log.facts, log.steps[1:])
    want = {u["unit"]: u for u in unit_rows(witness)}
    for u in rep["units"]:
        for k in ("all_gather_seconds_per_step", "all_gather_exposed_seconds_per_step",
                  "compute_forward_seconds_per_step", "reduce_scatter_seconds_per_step"):
            assert u[k] == pytest.approx(want[u["unit"]][k], rel=1e-9), (u["unit"], k)
    text = report_in_process(capsys, str(lean)).stdout
    assert "(9 steps, 2-10; warm-up step 1 left out, --include-warmup keeps it)" in text
    kept = json.loads(report_in_process(capsys, str(lean), "--json",
                                        "--include-warmup").stdout)
    assert kept["window"]["first_step"] == 1 and kept["window"]["warmup_left_out"] is None
    assert kept["units"] != rep["units"]
    whole = json.loads(report_in_process(capsys, str(lean), "--json", "--window", "0").stdout)
    assert whole["window"]["warmup_left_out"] == 1 and not whole["window"]["warmup_kept"]
    assert (whole["window"]["first_step"], whole["window"]["steps"]) == (2, 9)
    assert [u["unit"] for u in whole["units"]] == [u["unit"] for u in rep["units"]]
    for u, v in zip(whole["units"], rep["units"]):
        for k, x in u.items():
            if isinstance(x, float):
                assert x == pytest.approx(v[k], rel=1e-9, abs=1e-15), (u["unit"], k)
            else:
                assert x == v[k], (u["unit"], k)
    for s, t in zip(whole["steps"], rep["steps"]):
        assert s["step_seconds"] == pytest.approx(t["step_seconds"], rel=1e-9)


def test_a_log_without_the_warm_up_line_keeps_step_1_and_says_so(tmp_path, capsys):
    """A log whose interval lines cover step 1 with later steps (written before the warm-up
    line existed) cannot leave it out: the window keeps it and the coverage line says so."""
    from zerodoc.testing.synthetic import write_run

    run = write_run(tmp_path / "old", ranks=2, units=3, steps=10, detail=False)
    for p in run.glob("rank-*.jsonl"):
        lines = p.read_text().splitlines(keepends=True)
        recs = [json.loads(x) for x in lines]
        warm = [i for i, r in enumerate(recs) if r["type"] == "interval" and r["last"] == 1]
        assert len(warm) == 1  # the writer wrote step 1's own interval line
        nxt = next(i for i, r in enumerate(recs) if r["type"] == "interval" and r["first"] == 2)
        # as an older writer did: one interval line for steps 1-10 (offsets move: no total
        # line's header_at is needed by the reader past the header, which stays first)
        merged = dict(recs[nxt], first=1, steps=10)
        merged["step_s"] += recs[warm[0]]["step_s"]
        lines[nxt] = json.dumps(merged) + "\n"
        del lines[warm[0]]
        p.write_text("".join(lines))
    rep = json.loads(report_in_process(capsys, str(run), "--json").stdout)
    assert rep["window"]["warmup_kept"] and rep["window"]["warmup_left_out"] is None
    text = report_in_process(capsys, str(run)).stdout
    assert "warm-up step 1 kept in the per-unit numbers: the run log's per-unit lines cover it " \
        "with later steps" in text


def test_unit_rows_of_units_no_fresh_rank_measured_are_null_not_zero():
    """The only rank with per-unit series is stale and the fresh one is coarse: no fresh
    rank measured any unit, so the unit rows say not measured (null), never 0.0 (review rev3
    S1: 0.0 for every unit)."""
    from zerodoc.runmodel import CommTotals, RankWindow, RunSnapshot
    from zerodoc.report import unit_rows
    from zerodoc.testing.synthetic import rank_facts, unit_names

    w0 = RankWindow(facts=rank_facts(0, 2, 3), steps=4, detail_steps=4)
    for u in unit_names(3):
        w0.comm[(u, "forward", "all_gather")] = CommTotals(4, 4000, 0.4, 0.2, 0.2)
        w0.compute[(u, "forward")] = 1.2
    w1 = RankWindow(facts=rank_facts(1, 2, 3), steps=4, detail_steps=4)  # coarse
    rows = unit_rows(RunSnapshot(source="x", ranks={0: w0, 1: w1}, stale_ranks={0}))
    assert [r["unit"] for r in rows] == unit_names(3)
    assert all(r["all_gather_seconds_per_step"] is None for r in rows)
    # the same ranks both fresh: rank 0's numbers (rank 1 left out, not averaged in as 0)
    rows = unit_rows(RunSnapshot(source="x", ranks={0: w0, 1: w1}))
    assert all(r["all_gather_seconds_per_step"] == pytest.approx(0.1) for r in rows)


def test_prometheus_unit_table_leaves_a_unit_without_series_unmeasured():
    """From Prometheus as from a run directory: a unit no rank has series of is NONE (n=0),
    one measured without a reduce-scatter has 0 of it (review rev3 S1)."""
    from zerodoc.sources.prometheus import _unit_table
    from zerodoc.unitstats import Stat

    s = {k: Stat(1.0, 1.0, 1.0, 1.0, 2) for k in ("count", "bytes", "seconds", "exposed")}
    t = _unit_table({("a", "forward", "all_gather"): s}, {}, ["a", "b"], {}, 2)
    assert all(st.n == 0 for st in t["b"].values())
    assert t["a"]["ag_seconds"].mean == 1.0 and t["a"]["rs_seconds"] == Stat(0, 0, 0, 0, 1)


CONVEX_PROFILE = {  # a link whose cost per byte grows past the run's 1.05 MB calls
    "kind": "zerodoc-link-profile", "schema": 1, "backend": "gloo", "group_size": 2,
    "host": "synthetic", "collectives": {c: [
        {"bytes": b, "median_s": t, "se_s": 1e-5} for b, t in
        ((250_000, 0.0011), (1_000_000, 0.0015), (2_000_000, 0.0070), (4_000_000, 0.0170))]
        for c in ("all_gather", "reduce_scatter")}}


def test_report_rules_predict_with_a_link_profile(capsys, tmp_path):
    """`zerodoc report --link-profile`: the rules' predicted effects come from the step model
    with the profile, as `zerodoc whatif --link-profile` gives (one source of predictions):
    ZD002's merge makes ~2.9 MB calls, past the run's 1.05 MB, priced by the profile's
    steeper rise; the finding says so. The same answer as whatif's, to the microsecond."""
    prof = tmp_path / "profile.json"
    prof.write_text(json.dumps(CONVEX_PROFILE))

    def zd002(*extra):
        r = report_in_process(capsys, LINEAR, "--json", *extra)
        assert r.returncode == 0, r.stderr
        f = next(f for f in json.loads(r.stdout)["findings"] if f["code"] == "ZD002")
        return f, {e["metric"]: e for e in f["predicted_effects"]}

    f0, e0 = zd002()
    f1, e1 = zd002("--link-profile", str(prof))
    ex0, ex1 = e0["exposed_comm_seconds_per_step"], e1["exposed_comm_seconds_per_step"]
    assert ex1["value"] > ex0["value"] and ex1["hi"] > ex0["hi"]
    assert "link profile" not in f0["predicted"] and str(prof) in f1["predicted"]
    from zerodoc.cli.main import main

    assert main(["whatif", LINEAR, "--merge", "blocks", "--json", "--link-profile",
                 str(prof)]) == 0
    w = json.loads(capsys.readouterr().out)
    # the finding applies the model's change to the run's observed value
    change = w["predicted"]["exposed_comm_s"] - w["baseline"]["exposed_comm_s"]
    assert ex1["value"] == pytest.approx(ex1["now"] + change, abs=2e-6)


def test_report_and_compare_bad_link_profile_one_line_exit_2(capsys, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"kind": "zerodoc-link-profile", "schema": 1, "group_size": 1}')
    r = report_in_process(capsys, LINEAR, "--link-profile", str(bad))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "group_size must be an integer" in r.stderr
    from zerodoc.cli.main import main

    assert main(["compare", LINEAR, str(SCENARIOS / "healthy-block"), "--no-history",
                 "--link-profile", str(tmp_path / "missing.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no such file" in err[0], err
