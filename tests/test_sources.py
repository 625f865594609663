"""One run model, three sources: run logs, the ranks' /metrics, a real Prometheus server.

A live 2-rank demo (per-Linear wrapping, so there is a warning to agree on) is read from all
three. Each scrape source is checked against the run log cut at the very step it saw: the
exporter's cumulative counters and the run log's per-step records must give the same numbers,
facts and findings. Then windows, stale ranks and the errors a user meets.
"""

from __future__ import annotations

import copy
import math
import shutil
import time
from pathlib import Path

import pytest

from tests.support.helpers import LiveDemo, wait_until
from tests.support.promserver import PromServer
from zerodoc.catalog import RANK_TOTAL_UNIT
from zerodoc.demo.launch import free_port
from zerodoc.diagnosis import diagnose
from zerodoc.errors import UserError
from zerodoc.runlog import read_rank_log, window_from_steps
from zerodoc.sources import (
    EndpointsSource, PrometheusSource, RunDirSource, open_source, parse_endpoints,
)

SCENARIOS = Path(__file__).parent / "data" / "scenarios"


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sources")
    # the default mode (per-unit detail on sampled steps): the scrapes are checked against
    # the run log over the same steps, sampled or not
    with LiveDemo(tmp, model={"wrap": "linear"}, attach={"run_log_every": 1000}) as demo:
        with PromServer(tmp, targets=demo.endpoints) as prom:
            demo.wait_steps(6)
            prom.wait_for("zerodoc_run_info", min_results=2)  # both ranks scraped
            yield demo, prom


def run_log_at(demo, rank: int, last_step: int):
    """The run log's window over steps 1..last_step (what a cumulative scrape at that step
    must equal)."""
    path = demo.run_dir / f"rank-{rank:05d}.jsonl"

    def logged():
        log = read_rank_log(path)
        return log if log.steps and log.steps[-1].step >= last_step else None

    log = wait_until(logged, 30, f"rank {rank}'s run log to reach step {last_step}", 0.1)
    return window_from_steps(log.facts, [s for s in log.steps if s.step <= last_step])


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)


def framework_as_served(ref, rank: int) -> dict:
    """A run log window's framework time per (unit, phase) as the rank serves it: rank 0 per
    unit, every other rank summed over its units per phase, under RANK_TOTAL_UNIT (issue 33:
    the series budget; docs/metrics.md)."""
    if rank == 0:
        return dict(ref.unit_framework)
    out: dict = {}
    for (_u, p), v in ref.unit_framework.items():
        out[(RANK_TOTAL_UNIT, p)] = out.get((RANK_TOTAL_UNIT, p), 0.0) + v
    return out


def mismatches(snap, demo) -> list[str]:
    """Where a scrape snapshot differs from the run log at the same step."""
    bad = []
    for r, w in snap.ranks.items():
        ref = run_log_at(demo, r, w.last_step)
        if w.steps != ref.steps:
            bad.append(f"rank {r}: steps {w.steps} vs {ref.steps}")
            continue
        for k in ("step_seconds", "optimizer_seconds", "framework_seconds", "other_seconds"):
            if not close(getattr(w, k), getattr(ref, k)):
                bad.append(f"rank {r}: {k} {getattr(w, k)} vs {getattr(ref, k)}")
        if set(w.compute) != set(ref.compute) or not all(
                close(w.compute[k], ref.compute[k]) for k in ref.compute):
            bad.append(f"rank {r}: compute differs")
        for k, t in ref.comm.items():
            s = w.comm.get(k)
            if s is None or s.count != t.count or s.bytes != t.bytes or not (
                    close(s.seconds, t.seconds) and close(s.exposed_seconds, t.exposed_seconds)):
                bad.append(f"rank {r}: comm {k}: {s} vs {t}")
        if set(w.comm) != set(ref.comm):
            bad.append(f"rank {r}: comm keys differ")
        want_fw = framework_as_served(ref, r)
        if set(w.unit_framework) != set(want_fw) or not all(
                close(w.unit_framework[k], v) for k, v in want_fw.items()):
            bad.append(f"rank {r}: framework per unit {w.unit_framework} vs {want_fw}")
        if w.memory.get("capacity") != ref.memory.get("capacity"):
            bad.append(f"rank {r}: capacity")
        fu = [(u.name, u.params, u.param_bytes, u.gather_bytes, u.sharded_bytes, u.group_size,
               u.reshard_after_forward, u.param_dtype, u.reduce_dtype, u.tensors)
              for u in w.facts.units]
        ru = [(u.name, u.params, u.param_bytes, u.gather_bytes, u.sharded_bytes, u.group_size,
               u.reshard_after_forward, u.param_dtype, u.reduce_dtype, u.tensors)
              for u in ref.facts.units]
        if fu != ru:
            bad.append(f"rank {r}: unit facts {fu[:2]} vs {ru[:2]}")
        for k in ("rank", "local_rank", "world_size", "local_world_size", "node", "run_id",
                  "framework", "device_type", "backend", "zero_stage", "mesh_shape",
                  "param_dtype", "reduce_dtype", "device_capacity_bytes"):
            if getattr(w.facts, k) != getattr(ref.facts, k):
                bad.append(f"rank {r}: {k} {getattr(w.facts, k)!r} vs {getattr(ref.facts, k)!r}")
    return bad


def agrees_with_run_log(make_source, demo, pause: float) -> tuple:
    """Snapshot a scrape source and compare it with the run log at the same step. A scrape
    can land while a rank is between updating its counters and its step count; such a torn
    sample is retried (every `pause` s, for 3 pauses: about twice)."""
    bad: list = []

    def agrees():
        snap = make_source().snapshot()
        bad[:] = mismatches(snap, demo)
        return not bad and snap

    try:
        snap = wait_until(agrees, 3 * pause, "a scrape that agrees with the run log", pause)
    except AssertionError:
        raise AssertionError(bad) from None
    ref = type(snap)(source="run log", ranks={
        r: run_log_at(demo, r, w.last_step) for r, w in snap.ranks.items()})
    return snap, ref


def codes(findings):
    return [(f.code, f.severity.name) for f in findings]


def found_or_not_evaluated(snap, code: str) -> bool:
    """`code` is the top WARNING finding, or — a window of a few steps from a scraped source
    in the default mode may hold no sampled step, and scrapes cannot look back for older
    ones — the rule was not evaluated and the snapshot says so (never a silent nothing)."""
    from zerodoc.diagnosis import waiting

    got = codes(diagnose(snap))
    if got and got[0] == (code, "WARNING"):
        return True
    wait = waiting(snap)
    return bool(wait and code in wait["rules"] and wait["text"].startswith("not evaluated: ")
                and code not in {c for c, _ in got})


def test_endpoints_equal_the_run_log_at_the_same_step(live):
    demo, _prom = live
    snap, ref = agrees_with_run_log(lambda: EndpointsSource(demo.endpoints, window=None),
                                    demo, 0.2)
    assert sorted(snap.ranks) == [0, 1] and not snap.stale_ranks
    assert [(f.code, f.severity, f.title) for f in diagnose(snap)] == \
        [(f.code, f.severity, f.title) for f in diagnose(ref)]


def test_prometheus_equals_the_run_log_at_the_same_step(live):
    demo, prom = live
    snap, ref = agrees_with_run_log(lambda: PrometheusSource(prom.url, window=None), demo, 1.2)
    assert sorted(snap.ranks) == [0, 1] and not snap.stale_ranks
    assert [(f.code, f.severity, f.title) for f in diagnose(snap)] == \
        [(f.code, f.severity, f.title) for f in diagnose(ref)]


def test_framework_time_per_unit_from_the_scrape_sources(live):
    """Issue 22: the framework's time per unit and phase reaches the endpoints and Prometheus
    sources (zerodoc_framework_unit_seconds_total) as the run log has it. Issue 33: rank 0
    serves it per unit, every other rank summed over its units per phase (checked per rank in
    `mismatches`), so the scrape sources' per-unit stats are rank 0's (PromQL on the server,
    numpy on the endpoints' windows) while the run log has every rank's."""
    from zerodoc.report import unit_rows
    from zerodoc.unitstats import unit_stats
    from zerodoc.whatif.stepmodel import fit

    demo, prom = live
    for make, pause in ((lambda: EndpointsSource(demo.endpoints, window=None), 0.2),
                        (lambda: PrometheusSource(prom.url, window=None), 1.2)):
        snap, ref = agrees_with_run_log(make, demo, pause)
        units = [u.name for u in ref.any_rank.facts.units]
        for r, w in ref.ranks.items():  # the witness has it for every unit, both phases
            assert {u for u, _p in w.unit_framework} == set(units), r
            assert {p for _u, p in w.unit_framework} == {"forward", "backward"}, r
        # the scrape: per unit from rank 0, one sum per phase from rank 1
        assert {u for u, _p in snap.ranks[0].unit_framework} == set(units)
        assert set(snap.ranks[1].unit_framework) == \
            {(RANK_TOTAL_UNIT, "forward"), (RANK_TOTAL_UNIT, "backward")}
        ranks = sorted(ref.ranks)
        want = unit_stats(ref, [0]).units  # rank 0's, from the run log
        got = (snap.unit_stats or unit_stats(snap, ranks)).units
        for u in units:
            a, b = got[u]["framework_seconds"], want[u]["framework_seconds"]
            assert b.n == 1 and a.n == b.n, (u, a, b)
            for f in ("min", "median", "mean", "max"):
                assert close(getattr(a, f), getattr(b, f)), (u, f, a, b)
        # the report's unit rows show it: rank 0's per step (the run log's rows: both ranks')
        rows = {r["unit"]: r["framework_seconds_per_step"] for r in unit_rows(snap)}
        steps0 = ref.ranks[0].per_sampled_step
        want_rows = {u: steps0(ref.ranks[0].unit_framework[(u, "forward")]
                               + ref.ranks[0].unit_framework[(u, "backward")]) for u in units}
        assert set(rows) == set(units)
        for u, v in want_rows.items():
            assert v is not None and v > 0 and rows[u] is not None, (u, rows[u], v)
            assert math.isclose(rows[u], v, rel_tol=1e-4, abs_tol=1e-6), (u, rows[u], v)
        # the what-if prices the framework time per unit on rank 0 as from the run log, with
        # the units' parameter tensor counts (zerodoc_unit_parameter_tensors) the same, and per
        # step on rank 1 (its note says why)
        assert all(u.tensors for u in snap.any_rank.facts.units)
        # (witness: the run log with rank 1's framework time summed as rank 1 serves it)
        folded = copy.copy(ref.ranks[1])
        folded.unit_framework = framework_as_served(ref.ranks[1], 1)
        witness = type(ref)(source="run log, as served", ranks={0: ref.ranks[0], 1: folded})
        got_fit, want_fit = fit(snap), fit(witness)
        assert [rm.framework_per_unit for rm in fit(ref).ranks] == [True, True]
        assert [rm.framework_per_unit for rm in got_fit.ranks] == \
            [rm.framework_per_unit for rm in want_fit.ranks] == [True, False]
        f0, w0 = got_fit.ranks[0].framework_fit, want_fit.ranks[0].framework_fit
        assert f0 is not None and w0 is not None and f0.tensor_note == w0.tensor_note
        for k in ("per_call_s", "per_byte_s", "per_tensor_s", "rest_s"):
            assert close(getattr(f0, k), getattr(w0, k)), (k, f0, w0)
        assert got_fit.ranks[1].framework_fit is None
        pricing = got_fit.framework_pricing()  # priced on the replay's rank
        if got_fit.overhead_rank() is got_fit.ranks[1]:
            assert pricing["pricing"] == "per step", pricing
            assert "from rank 0 alone" in pricing["note"], pricing
        else:
            assert pricing["pricing"] == "per unit", pricing


def test_same_run_same_findings_from_every_source(live):
    """The same steps from every source give the same findings. The run is live: three
    snapshots taken one after another hold different steps (Prometheus lags by up to a
    scrape interval), and a rule near its threshold (ZD006's ratio) then grades them
    differently — the suite once failed so, WARNING from the run directory and INFO from
    Prometheus (issue 31). So each scraped source is held to the run log over exactly its
    own steps (`agrees_with_run_log`: 1..its last step, the warm-up step included: the
    scrapes are cumulative), and the run directory read whole over the same steps too."""
    demo, prom = live
    found = {}
    for name, make, pause in (
            ("endpoints", lambda: EndpointsSource(demo.endpoints, window=None), 0.3),
            ("prometheus", lambda: PrometheusSource(prom.url, window=None), 1.2)):
        snap, ref = agrees_with_run_log(make, demo, pause)
        assert {r: w.last_step for r, w in snap.ranks.items()} == \
            {r: w.last_step for r, w in ref.ranks.items()}  # the same steps
        found[name] = codes(diagnose(snap))
        assert found[name] == codes(diagnose(ref)), (name, found[name], codes(diagnose(ref)))
        assert found[name][0] == ("ZD002", "WARNING"), found
    # the run directory's own reader, over all its steps so far: the same top finding
    whole = open_source(str(demo.run_dir), window=None, skip_warmup=False).snapshot()
    assert codes(diagnose(whole))[0] == ("ZD002", "WARNING")


def test_endpoint_window_is_the_difference_between_scrapes(live):
    """Issue 13 #9: the first window of a live run is not "everything since the start" (which
    counts the slow warm-up step and finds what the run log and Prometheus do not): the
    source scrapes again once the ranks did `window` more steps (or, after about 2 s, at
    least one: issue 20 item 7) and reports those steps."""
    demo, _prom = live
    src = EndpointsSource(demo.endpoints, window=3)
    bad: list = []

    def agrees():
        snap = src.snapshot()
        bad.clear()
        for r, w in snap.ranks.items():
            assert w.first_step > 1 and 1 <= w.steps < w.last_step, (w.first_step, w.steps)
            path = demo.run_dir / f"rank-{r:05d}.jsonl"
            ref = window_from_steps(read_rank_log(path).facts,
                                    [s for s in read_rank_log(path).steps
                                     if w.first_step <= s.step <= w.last_step])
            if ref.steps != w.steps or not close(w.step_seconds, ref.step_seconds) or \
                    not close(w.exposed_seconds, ref.exposed_seconds):
                bad.append((r, w.steps, ref.steps, w.step_seconds, ref.step_seconds))
        return not bad and snap

    # a torn scrape (counters updated, step count not yet): again, for about 3 tries
    try:
        snap = wait_until(agrees, 0.9, "a window that agrees with the run log", 0.3)
    except AssertionError:
        raise AssertionError(bad) from None
    demo.wait_steps(max(w.last_step for w in snap.ranks.values()) + 4)
    w = src.snapshot().ranks[0]  # later snapshots: the difference with an earlier scrape
    assert w.steps >= 3 and w.first_step > snap.ranks[0].first_step


def test_prometheus_window_covers_recent_steps(live):
    demo, prom = live
    demo.wait_steps(24)
    w = PrometheusSource(prom.url, window=4).snapshot().ranks[0]
    # W = max(4 steps, 4 scrape intervals) of ~0.5 s steps: recent steps, not all of them
    assert 1 <= w.steps < w.last_step - 4, (w.steps, w.last_step)
    assert found_or_not_evaluated(PrometheusSource(prom.url, window=4).snapshot(), "ZD002")


def test_prometheus_unit_stats_are_reused_then_recomputed_in_the_background(live):
    """The per-unit stats (the costly queries at scale) of a source kept across refreshes:
    reused while young, recomputed off the refresh's path once older than unit_reuse x their
    cost; the per-rank numbers are queried every time."""
    demo, prom = live
    demo.wait_steps(10)
    # the cumulative window (all steps): its per-unit numbers hold the sampled steps since
    # the start. A 4-step window on the default detail holds a sampled step only now and
    # then (one in up to 15 s): in one full-suite run it held none, and `comm` was empty
    src = PrometheusSource(prom.url, window=None)
    queries: list[str] = []
    query = src._query
    src._query = lambda e, *a: (queries.append(e), query(e, *a))[1]

    def unit_queries() -> int:
        return sum("by (unit, phase, collective)" in q for q in queries)

    src.unit_reuse = 1e9  # young for ever
    first = src.snapshot().unit_stats
    assert unit_queries() >= 15 and first.fetched_unix is not None and first.comm
    queries.clear()
    again = src.snapshot()
    assert again.unit_stats is first and unit_queries() == 0
    assert any("sum by (rank)" in q for q in queries)  # per-rank numbers: fresh
    src.unit_reuse = 0.0  # old at once: the next refresh starts a recomputation ...
    queries.clear()
    assert src.snapshot().unit_stats is first  # ... and does not wait for it
    wait_until(lambda: not src._units_busy and src._units_next, 60,
               "the background recomputation of the per-unit numbers", 0.1)
    assert unit_queries() >= 15
    newer = src.snapshot().unit_stats
    assert newer is not first and newer.fetched_unix > first.fetched_unix
    assert set(newer.comm) == set(first.comm)


def test_an_unreachable_rank_is_stale(live):
    demo, _prom = live
    dead = f"127.0.0.1:{free_port()}"
    src = EndpointsSource([demo.endpoints[0], dead], window=None)
    snap = src.snapshot()
    # rank 1 never answered: the world size says it exists, no endpoint shows it
    assert sorted(snap.ranks) == [0] and snap.missing_ranks == {1} and not snap.stale_ranks
    assert dead in src.unreachable


def test_no_endpoint_answering_is_a_clear_error():
    port = free_port()
    with pytest.raises(UserError, match="no zerodoc rank answered") as e:
        EndpointsSource(f"127.0.0.1:{port}-{port + 1}", window=None).snapshot()
    assert f"127.0.0.1:{port}" in str(e.value)


def test_prometheus_unreachable_or_not_prometheus(live):
    demo, _prom = live
    with pytest.raises(UserError, match="cannot reach Prometheus"):
        PrometheusSource(f"http://127.0.0.1:{free_port()}")
    with pytest.raises(UserError, match="does not look like a Prometheus server"):
        PrometheusSource(f"http://{demo.endpoints[0]}")  # a rank's exporter, not Prometheus


@pytest.mark.slow
def test_prometheus_without_zerodoc_series(tmp_path):
    with PromServer(tmp_path) as prom:
        with pytest.raises(UserError, match="no zerodoc series"):
            PrometheusSource(prom.url).snapshot()


def test_open_source_dispatch(tmp_path, monkeypatch):
    run = SCENARIOS / "wrap-root"
    assert isinstance(open_source(str(run)), RunDirSource)
    assert isinstance(open_source("node1:9730-9731,node2:9730"), EndpointsSource)
    assert parse_endpoints("h:9730-9732") == ["h:9730", "h:9731", "h:9732"]
    for bad, msg in (("/no/such/run", "no run directory"),
                     ("not a source", "neither a run directory"),
                     ("h:9737-9730", "first <= last")):
        with pytest.raises(UserError, match=msg):
            open_source(bad)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match="no zerodoc runs"):
        open_source(None)
    shutil.copytree(run, tmp_path / "zerodoc-runs" / "r1")
    assert open_source(None).snapshot().ranks[0].facts.run_id == "root"


def test_run_dir_marks_ranks_without_an_end_as_stale(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(SCENARIOS / "healthy-block", run)
    log = run / "rank-00001.jsonl"
    lines = log.read_text().splitlines(keepends=True)
    log.write_text("".join(x for x in lines if '"type":"end"' not in x))
    snap = RunDirSource(run, window=5, stale_after_s=60).snapshot()
    assert snap.stale_ranks == {1} and snap.ranks[0].steps == 5


def test_run_dir_errors_are_one_clear_line(tmp_path):
    with pytest.raises(UserError, match="no run directory"):
        RunDirSource(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no rank-"):
        RunDirSource(tmp_path / "empty").snapshot()
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "rank-00000.jsonl").write_text("this is not json\n")
    with pytest.raises(UserError, match="not JSON"):
        RunDirSource(bad).snapshot()


def test_report_reads_endpoints_and_prometheus(live, capsys):
    import json

    from zerodoc.cli.main import main

    demo, prom = live
    for src in (",".join(demo.endpoints), prom.url):
        assert main(["report", src, "--json", "--window", "0"]) == 0
        rep = json.loads(capsys.readouterr().out)
        assert rep["summary"]["top"] == "ZD002" and rep["ranks"] == [0, 1], src
        assert len(rep["units"]) == 18 and rep["run"]["world_size"] == 2


def test_windowed_sources_agree_on_a_live_run(live):
    """Issue 13 #9: windows of the last steps (what the TUI shows) find the same as the run
    log from the endpoints and from Prometheus, none counting the warm-up step."""
    demo, prom = live
    snaps = {
        "run dir": open_source(str(demo.run_dir), window=5).snapshot(),
        "endpoints": open_source(",".join(demo.endpoints), window=5).snapshot(),
        "prometheus": open_source(prom.url, window=5).snapshot(),
    }
    for name, s in snaps.items():
        assert sorted(s.ranks) == [0, 1] and not s.missing_ranks and not s.ended_ranks, name
        assert all(w.first_step > 1 for w in s.ranks.values()), name
    # the run's structural finding from every source (a straggler, ZD010, may come and go
    # with the load on a shared 2-core box: the windows cover slightly different steps)
    found = {name: codes(diagnose(s)) for name, s in snaps.items()}
    assert all(found_or_not_evaluated(s, "ZD002") for s in snaps.values()), found
    # the run directory looks back for samples (the newest 3, named): it always finds it
    assert ("ZD002", "WARNING") in found["run dir"], found


def test_a_cleanly_closed_run_is_ended_from_every_source(live, tmp_path):
    """Issue 13 #9: a run that closed cleanly is ended, not a source error with every rank
    stale (endpoints, as the TUI polls them); Prometheus selects it by run id among the runs
    it holds, shows its last steps however long ago it ended (the same window twice), all
    its steps for --window 0, and the rank it never scraped as missing."""
    from zerodoc.demo.launch import Job
    from zerodoc.runlog import read_rank_log as rrl
    from zerodoc.tui.feed import Feed

    demo, _prom = live
    run = tmp_path / "closed-run"  # the run id is the run directory's name
    sd = tmp_path / "sd"
    sd.mkdir()  # the file_sd directory exists before Prometheus watches it (as deployed)
    spec = {"model": {"blocks": 2, "hidden": 64, "heads": 4, "vocab": 256, "seq": 32,
                      "batch": 2}, "steps": 80,
            # a slow link (+30 ms per all-gather): steps long enough for a few scrapes
            "attach": {"run_dir": str(run), "port": 0, "inject_latency_s": 0.03}}
    job = Job(2, spec, env={"ZERODOC_FILE_SD_DIR": str(sd)}, log_dir=str(run / "logs")).start()
    try:
        with PromServer(tmp_path, targets=demo.endpoints,
                        file_sd=[str(sd / "*-rank-00000.json")]) as prom:
            eps = wait_until(
                lambda: (e := [rrl(p).facts.metrics_endpoint
                               for p in sorted(run.glob("rank-*.jsonl")) if p.stat().st_size])
                and len(e) >= 2 and e, 90, "both ranks' endpoints", 0.3)
            feed = Feed(EndpointsSource(eps, window=5, settle_s=0), diagnose=lambda s: [])
            # the TUI's refresh: a fetch every 0.3 s while the run goes on, until it ends
            wait_until(lambda: feed.fetch() and not job.running(), 240, "the run to end",
                       interval=0.3)
            assert job.wait(30) == [0, 0]
            for _ in range(3):
                frame = feed.fetch()
            assert frame.source_error is None and frame.ended == {0, 1} and not frame.stale
            assert sorted(frame.snapshot.ranks) == [0, 1]

            assert len(rrl(run / "rank-00000.jsonl").totals) == 80
            # Prometheus saw the run up to its last scrape before the clean close removed
            # the target (the last few steps may fall between two scrapes)
            seen = prom.wait_for('last_over_time(zerodoc_last_step{run_id="closed-run"}[5m])')
            last = int(float(seen[0]["value"][1]))
            assert 60 <= last <= 80, last
            # the clean close removed the file_sd target: Prometheus drops it within seconds
            # (its discovery updates every 5 s); a crashed rank's target stays, up == 0
            wait_until(lambda: not prom.query('up{run_id="closed-run"}'), 30,
                       "Prometheus to drop the closed run's target", 0.5)
            src = PrometheusSource(prom.url, window=5, run_id="closed-run")
            assert {"closed-run", "live"} <= set(src.runs())
            a = src.snapshot()
            time.sleep(3)  # the subject: seconds later, an ended run's window has not moved
            b = open_source(prom.url + "#run=closed-run", window=5).snapshot()
            for s in (a, b):
                assert sorted(s.ranks) == [0] and s.ranks[0].facts.run_id == "closed-run"
                assert s.ended_ranks == {0} and s.missing_ranks == {1} and not s.stale_ranks
            wa, wb = a.ranks[0], b.ranks[0]
            assert wa.last_step == last and 1 <= wa.steps < last
            assert (wa.steps, wa.first_step, wa.last_step) == (wb.steps, wb.first_step,
                                                               wb.last_step)
            everything = PrometheusSource(prom.url, window=None, run_id="closed-run")
            assert everything.snapshot().ranks[0].steps == last  # all it saw
            # without a run id: the run with the newest step (the live demo)
            assert PrometheusSource(prom.url, window=5).snapshot().ranks[0].facts.run_id == \
                "live"
    finally:
        job.stop()


def test_a_stalled_job_does_not_grow_the_endpoint_history(tmp_path):
    """Issue 10: 60 identical scrapes of a job that stopped stepping keep one entry."""
    import warnings

    import torch
    import torch.nn as nn

    import zerodoc

    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mon = zerodoc.attach(model, port=0, run_dir=str(tmp_path / "stall"))
    try:
        def steps(n):
            for _ in range(n):
                model(torch.randn(4, 8)).sum().backward()
                mon.step()

        steps(3)
        src = EndpointsSource([mon.endpoint], window=5, settle_s=0)
        for _ in range(60):
            snap = src.snapshot()
        assert len(src._history[0]) == 1 and snap.ranks[0].last_step == 3
        steps(2)
        # the exporter publishes a step off the training thread: wait for it to show
        wait_until(lambda: src.snapshot().ranks[0].last_step == 5, 10, "step 5 scraped", 0.05)
        assert [h.steps for h in src._history[0]] == [3, 5]
    finally:
        mon.close()


def test_first_endpoint_snapshot_waits_briefly_not_for_a_whole_window(monkeypatch):
    """Issue 20 item 7: a one-shot report on the endpoints of a job with 1.4 s steps waited
    for `window` (20) new steps, up to 15 s. It now waits about `settle_s` and takes the
    steps every rank did meanwhile (at least one); the window says how many. A virtual clock
    drives the job's step counters (what the mechanism is: how long it waits, not timing)."""
    import types

    from zerodoc.sources import endpoints as ep
    from zerodoc.sources.samples import Cumulative

    clock = {"t": 1000.0, "slept": 0.0}

    def sleep(s):
        clock["t"] += s
        clock["slept"] += s

    monkeypatch.setattr(ep, "time", types.SimpleNamespace(
        monotonic=lambda: clock["t"], sleep=sleep, time=lambda: clock["t"]))
    step_s, t0 = 1.4, clock["t"]

    def scrape_all():  # two ranks, one step every 1.4 (virtual) s since step 30
        n = 30 + int((clock["t"] - t0) / step_s)
        return {r: Cumulative(r, labels={"run_id": "r"},
                              scalars={"steps": n, "last_step": n, "step_seconds": n * step_s,
                                       "last_step_seconds": step_s,
                                       "updated_unix": clock["t"]})
                for r in (0, 1)}

    src = ep.EndpointsSource("127.0.0.1:9800-9801", window=20)
    monkeypatch.setattr(src, "_scrape_all", scrape_all)
    snap = src.snapshot()
    assert clock["slept"] <= 3.0, clock["slept"]  # was 15 s (20 steps' worth)
    for w in snap.ranks.values():
        assert 1 <= w.steps < 20 and w.first_step == 31  # the steps after the first scrape
    # a fast job still gets its whole window within the budget
    clock["slept"], step_s, t0 = 0.0, 0.05, clock["t"]
    src = ep.EndpointsSource("127.0.0.1:9800-9801", window=20)
    monkeypatch.setattr(src, "_scrape_all", scrape_all)
    snap = src.snapshot()
    assert all(w.steps >= 20 for w in snap.ranks.values())
    assert clock["slept"] <= 2.0
