"""Offline diagnosis from PyTorch profiler traces (`zerodoc/trace`), checked against the live
shim on the same steps of the same real jobs.

Two real FSDP2 jobs (2 gloo ranks, batch 8) run with the shim attached *and* the PyTorch
profiler recording steps 4-7 (ProfilerStep#3-#6): FSDP2's default synchronous all-gathers, and
async unshard + explicit prefetch (traces gzipped). The trace-derived snapshot and the run log
must agree per rank, unit, phase and collective over those four steps:

- count and bytes, every call: exactly (both count FSDP's calls; bytes = the all-gather output
  / the reduce-scatter input, from the recorded shapes vs the tensors the shim saw);
- collective time, every call: the profiler's interval (the c10d op's start to gloo's last
  copy into the output) lies inside the shim's (taken before the call, and after `wait()`
  returned or the completion callback ran): trace <= live + 0.5 ms;
- collective and exposed time: within 10 % + 10 ms on the median of the 4 steps per rank,
  unit, phase and collective: after gloo completes, the waiting thread (sync: woken through a
  condition variable) or the completion callback (async: on gloo's thread) must be scheduled
  and get the GIL back, up to a 5 ms switch interval when another thread holds it, more when
  ranks and other jobs outnumber the 2 cores. A single call is only held to 10 % + 100 ms: a
  Python pause or a thread descheduled on a loaded 2-core box can hit any one call (a
  mispaired or double-counted collective would be off by more);
- compute per unit and phase: within 10 % + 2 ms, median of the steps (the shim's hooks sit
  just inside FSDP's; the trace uses FSDP's own pre/post spans: a few hundred microseconds);
- step time over the window: within 5 % + 10 ms (the shim's step ends at the optimizer hook,
  the profiler's at `prof.step()`, a few ms later in the same loop iteration).
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
import statistics
from pathlib import Path
from collections import defaultdict

import pytest

from tests.support.helpers import profiled, run_demo
from zerodoc.cli.main import main
from zerodoc.sources import open_source
from zerodoc.trace import open_traces

UNITS = ["(root)", "blocks.0", "blocks.1", "blocks.2", "blocks.3"]
CALL_S = 0.010  # two thread hand-overs per call (module docstring)
GROSS_S = 0.100  # no single call may be off by more (a mispaired or double-counted collective)


def per_step_trace(src, rank: int):
    """Per (step, unit, phase, coll): [count, bytes, seconds, exposed] from zerodoc's trace
    attribution; per (step, unit, phase): compute seconds; per step: step seconds."""
    res = src.ranks[rank].result
    comm = defaultdict(lambda: [0, 0, 0.0, 0.0])
    for c in res.collectives:
        a = comm[(c.step + 1, c.unit, c.phase, c.collective)]  # zerodoc's step = N + 1
        a[0] += 1
        a[1] += c.nbytes
        a[2] += (c.done - c.issue) * 1e-6
        a[3] += c.exposed * 1e-6
    compute = {(s.step + 1, *k): v * 1e-6 for s in res.steps for k, v in s.compute.items()
               if v > 0}
    steps = {s.step + 1: (s.end - s.ts) * 1e-6 for s in res.steps}
    return comm, compute, steps


@pytest.fixture(scope="module", params=["sync", "async"])
def pair(request, tmp_path_factory):
    logs, traces = profiled(tmp_path_factory, request.param)
    src = open_traces(str(traces), window=None, progress=False)
    return request.param, logs, src


def test_trace_and_live_agree_per_unit(pair):
    mode, logs, src = pair
    snap = src.snapshot()
    assert sorted(snap.ranks) == [0, 1]
    for rank, w in snap.ranks.items():
        assert (w.steps, w.first_step, w.last_step) == (4, 3, 6)  # ProfilerStep#3-#6
        comm, compute, steps = per_step_trace(src, rank)
        live = {(s.step, *k): t for s in logs[rank].steps if s.step in steps
                for k, t in s.comm.items()}
        assert set(comm) == set(live), set(comm) ^ set(live)
        off = defaultdict(list)  # (unit, phase, coll) -> per step: beyond the allowed
        for key, (n, nbytes, secs, exposed) in comm.items():
            t = live[key]
            where = (mode, rank, key, (n, nbytes, secs, exposed), t)
            assert (t.count, t.bytes) == (n, nbytes) == (1, nbytes), where
            assert secs <= t.seconds + 0.0005, where  # the profiler's interval is inside
            allowed = 0.10 * t.seconds + CALL_S
            off[key[1:]].append(max(t.seconds - secs, abs(t.exposed_seconds - exposed))
                                - allowed)
            assert t.seconds - secs <= allowed - CALL_S + GROSS_S, where
        for key, v in off.items():
            assert statistics.median(v) <= 0, (mode, rank, key, v)
        live_c = {(s.step, *k): v for s in logs[rank].steps if s.step in steps
                  for k, v in s.compute.items() if v > 0}
        assert set(compute) == set(live_c)
        cdiff = defaultdict(list)
        for key, v in compute.items():
            cdiff[key[1:]].append(abs(v - live_c[key]) - (0.10 * live_c[key] + 0.002))
        for key, v in cdiff.items():
            assert statistics.median(v) <= 0, (mode, rank, key, v)
        # the window's exposed time per step (the what-if range's noise): the trace's own
        # collectives of each step, summed
        per_step = defaultdict(float)
        for (step, *_key), (_n, _b, secs, exposed) in comm.items():
            per_step[step] += min(secs, max(0.0, exposed))  # as the window clamps each call
        assert w.exposed_times == pytest.approx([per_step[s] for s in sorted(steps)], abs=1e-6)
        live_steps = {s.step: s.step_seconds for s in logs[rank].steps if s.step in steps}
        total, live_total = sum(steps.values()), sum(live_steps.values())
        assert abs(total - live_total) <= 0.05 * live_total + 0.010, (rank, steps, live_steps)
        # every collective FSDP issued for a unit is found, in both phases, every step
        for unit in UNITS:
            for phase, coll in (("forward", "all_gather"), ("backward", "all_gather"),
                                ("backward", "reduce_scatter")):
                assert w.comm[(unit, phase, coll)].count == 4
    if mode == "async":  # real overlap: some prefetched all-gathers were hidden entirely
        w = snap.ranks[0]
        assert any(t.exposed_seconds < 0.5 * t.seconds for t in w.comm.values())


def _fsdp_spans(path: Path) -> tuple[list, list]:
    """From the raw trace file (not zerodoc's reader): the ProfilerStep spans (n, ts, end) and
    FSDP2's own spans (unit, kind, ts, end) on the training thread; unit "(root)" where the
    name gives none."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    steps, spans = [], []
    for e in events:
        name, ts = e.get("name", ""), float(e["ts"])
        m = re.fullmatch(r"ProfilerStep#(\d+)", name)
        if m:
            steps.append((int(m.group(1)), ts, ts + float(e["dur"])))
        m = re.fullmatch(r"FSDP::(\w+)(?: \((.*?)\))?", name)
        if m:
            spans.append((m.group(2) or "(root)", m.group(1), ts, ts + float(e["dur"])))
    return steps, spans


def _union(ivs) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(ivs):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def test_trace_framework_time_per_unit(pair):
    """Issue 22: FSDP2's own time goes to the unit its spans name, per step and phase. Per
    step the units' parts add up to the step's framework time exactly; every unit has some in
    both phases every step; and each (step, unit, phase) lies between two bounds read from
    the raw trace's FSDP spans: at least the unit's innermost spans (those holding no other
    unit's span) less the time its collectives blocked the thread, at most the union of
    every span naming the unit with the stretch of its post-backward spans. Outside the bounds
    by more than 1 us: in no more than one of the steps per rank, unit and phase, and by at
    most 10 % + 0.5 ms: seen once in CI, 108 us under the lower bound of 2 ms in one step of
    4 on a loaded 2-core host, not reproduced in 6 runs, 3 beside a CPU hog (likely a thread
    descheduled in the unit's Python code between two operators, read as waiting on a
    collective); a unit booked another's framework time would miss every step, by its whole
    span."""
    mode, _logs, src = pair
    for rank in (0, 1):
        res = src.ranks[rank].result
        path = src.ranks[rank].path
        steps, spans = _fsdp_spans(path)
        checked = 0
        misses = defaultdict(list)  # (unit, phase) -> the steps outside the bounds
        for st in res.steps:
            fw = st.unit_framework
            assert abs(sum(fw.values()) - st.framework) <= 1e-6 * st.framework, (mode, rank)
            assert {k for k, v in fw.items() if v > 0} == \
                {(u, p) for u in UNITS for p in ("forward", "backward")}, (mode, rank, fw)
            _n, ts, end = next(x for x in steps if x[0] == st.step)
            inside = [x for x in spans if ts <= x[2] < end]
            bwd_from = max(x[3] for x in inside if x[0] == "(root)" and x[1] == "post_forward")
            for unit in UNITS:
                for phase in ("forward", "backward"):
                    own = [x for x in inside if x[0] == unit
                           and (x[2] >= bwd_from) == (phase == "backward")]
                    leaves = [(a, b) for _u, _k, a, b in own if not any(
                        y[0] != unit and a <= y[2] and y[3] <= b for y in inside)]
                    blocked = sum(c.exposed for c in res.collectives if c.step == st.step
                                  and c.unit == unit and c.phase == phase)
                    posts = [(a, b) for _u, k, a, b in own if k.startswith("post_backward")]
                    hull = [(min(a for a, _ in posts), max(b for _, b in posts))] if posts else []
                    lo = _union(leaves) - blocked
                    hi = _union([(a, b) for _u, _k, a, b in own] + hull)
                    got = fw[(unit, phase)]
                    where = (mode, rank, st.step, unit, phase, lo, got, hi)
                    if not lo - 1.0 <= got <= hi + 1.0:
                        misses[(unit, phase)].append(where)
                        assert lo - (0.1 * lo + 500) <= got <= hi + 0.1 * hi + 500, where
                    checked += 1
        assert checked == len(res.steps) * len(UNITS) * 2 > 0
        assert all(len(m) <= 1 for m in misses.values()), dict(misses)
    # and the window's totals carry them (what the what-if fits per unit)
    for rank, w in src.snapshot().ranks.items():
        assert {u for u, _p in w.unit_framework} == set(UNITS)
        assert abs(sum(w.unit_framework.values()) - w.framework_seconds) <= \
            1e-9 + 1e-6 * w.framework_seconds


@pytest.mark.slow
def test_facts_come_from_the_trace(tmp_path_factory):
    logs, traces = profiled(tmp_path_factory, "sync")
    snap = open_traces(str(traces), window=None, progress=False).snapshot()
    for rank, w in snap.ranks.items():
        live = logs[rank].facts
        f = w.facts
        assert (f.rank, f.world_size, f.framework, f.backend, f.device_type, f.zero_stage) == \
            (rank, 2, "fsdp2", "gloo", "cpu", 3)
        assert [u.name for u in f.units] == [u.name for u in live.units] == UNITS
        for u, lu in zip(f.units, live.units):
            assert u.gather_bytes == lu.gather_bytes  # padded, gather dtype
            assert u.params * 4 == lu.gather_bytes and u.param_dtype == "float32"
            assert (u.reshard_after_forward, u.group_size) == (True, 2)


@pytest.mark.slow
def test_gzip_trace_reads_like_the_plain_file(tmp_path_factory, tmp_path):
    _logs, traces = profiled(tmp_path_factory, "async")
    files = sorted(traces.glob("rank-*.json.gz"))
    assert len(files) == 2
    for f in files:
        (tmp_path / f.name[:-3]).write_bytes(gzip.decompress(f.read_bytes()))
    a = open_traces(str(traces), window=None, progress=False).snapshot()
    b = open_traces(str(tmp_path), window=None, progress=False).snapshot()
    for r in (0, 1):
        assert a.ranks[r].comm == b.ranks[r].comm
        assert a.ranks[r].compute == b.ranks[r].compute


@pytest.mark.slow
def test_report_cli_on_traces(tmp_path_factory, capsys):
    _logs, traces = profiled(tmp_path_factory, "sync")
    assert main(["report", str(traces), "--json"]) == 0
    out = capsys.readouterr()
    rep = json.loads(out.out)
    assert "reading traces" in out.err  # progress on stderr, never on stdout
    assert rep["run"]["framework"] == "fsdp2" and rep["run"]["world_size"] == 2
    assert rep["run"]["zero_stage"] == 3
    assert [u["unit"] for u in rep["units"]] == UNITS
    # facts the trace lacks, from flags; a comma-separated file list works like the directory
    files = ",".join(str(p) for p in sorted(traces.glob("rank-*.json")))
    assert main(["report", files, "--json", "--stage", "2", "--world-size", "4"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["run"]["zero_stage"] == 2 and rep["run"]["world_size"] == 4
    # the trace-only flags on the run's own log directory: refused, not ignored
    assert main(["report", str(traces.parent / "run"), "--stage", "2"]) == 2
    assert "--stage: only for profiler traces" in capsys.readouterr().err


@pytest.mark.slow
def test_tui_on_traces(tmp_path_factory):
    import asyncio

    from zerodoc.tui.app import ZerodocApp
    from zerodoc.testing.textshot import screen_text

    _logs, traces = profiled(tmp_path_factory, "async")

    async def run():
        app = ZerodocApp(open_source(str(traces)), refresh=None)
        async with app.run_test(size=(120, 36)) as pilot:
            for _ in range(200):
                if app.frame is not None:
                    break
                await pilot.pause(0.05)
            await pilot.press("2")
            await pilot.pause()
            text = screen_text(app)
            assert app.active_view == "units"
            for unit in UNITS:
                assert unit in text, unit
    asyncio.run(run())


@pytest.mark.parametrize("bad, why", [
    ("", "empty file"),
    ('{"schemaVersion": 1, "traceEvents": [{"ph": "X", "name": "a", ', "not valid JSON"),
    ('{"schemaVersion": 1}', "without \"traceEvents\""),
    ("<html>", "not JSON"),
])
def test_bad_trace_files_give_one_line(tmp_path, capsys, bad, why):
    path = tmp_path / "rank-0.json"
    path.write_text(bad)
    assert main(["report", str(path)]) == 2
    err = capsys.readouterr().err
    assert why in err and "Traceback" not in err, err


@pytest.mark.slow
def test_truncated_gzip_and_missing_files(tmp_path_factory, tmp_path, capsys):
    _logs, traces = profiled(tmp_path_factory, "async")
    data = (traces / "rank-0.json.gz").read_bytes()
    cut = tmp_path / "rank-0.json.gz"
    cut.write_bytes(data[: len(data) // 2])
    assert main(["report", str(cut)]) == 2
    err = capsys.readouterr().err
    assert "rank-0.json.gz" in err and "Traceback" not in err, err
    assert main(["report", str(tmp_path / "nope.json")]) == 2
    assert "nope.json" in capsys.readouterr().err
    (tmp_path / "copy").mkdir()
    for name in ("rank-0.json.gz", "rank-1.json.gz"):
        shutil.copy(traces / name, tmp_path / "copy" / name)
    shutil.copy(traces / "rank-0.json.gz", tmp_path / "copy" / "again-rank0.json.gz")
    assert main(["report", str(tmp_path / "copy")]) == 2
    assert "both rank 0" in capsys.readouterr().err


def test_rank_from_the_file_name(tmp_path, capsys):
    """A real trace whose distributedInfo has no rank (tests/data/traces/hta)."""
    real = Path(__file__).parent / "data" / "traces" / "hta" / "rank_unavailable" / \
        "rank_not_found.json.gz"
    assert open_traces(str(real), progress=False).snapshot().ranks.keys() == {0}  # one file
    (tmp_path / "named").mkdir()
    shutil.copy(real, tmp_path / "named" / "trainer_rank-5.json.gz")
    assert open_traces(str(tmp_path / "named"), progress=False).snapshot().ranks.keys() == {5}
    (tmp_path / "unnamed").mkdir()
    for name in ("a.json.gz", "b.json.gz"):
        shutil.copy(real, tmp_path / "unnamed" / name)
    assert main(["report", str(tmp_path / "unnamed")]) == 2
    assert "no rank in the trace" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["fsdp1-full", "zero1"])
def test_fsdp1_and_zero1_traces_match_the_live_counts_and_bytes(tmp_path, framework):
    """FSDP1 names no unit in its annotations: the trace's `unit-k` is the k-th unit FSDP1
    gathers in forward, which for this model is the live shim's k-th unit. ZeRO-1 (DDP +
    ZeroRedundancyOptimizer) is one unit, "(model)". Counts and bytes per step: exactly.
    Per-unit detail on every step: the trace holds every call of steps 4-5, and the live
    numbers exist on detail steps only (the default may sample neither of them)."""
    logs = run_demo(tmp_path, "run", nprocs=2, steps=5, attach={"detail": "every"}, extra={
        "framework": framework,
        "profile": {"dir": str(tmp_path / "traces"), "wait": 2, "warmup": 1, "active": 2}})
    src = open_traces(str(tmp_path / "traces"), window=None, progress=False)
    for rank, log in logs.items():
        comm, _compute, steps = per_step_trace(src, rank)
        assert sorted(steps) == [4, 5]
        facts = src.snapshot().ranks[rank].facts
        live_names = [u.name for u in log.facts.units]
        if framework == "zero1":
            assert (facts.framework, facts.zero_stage) == ("zero1", 1)
            names = {"(model)": "(model)"}
        else:
            assert (facts.framework, facts.zero_stage) == ("fsdp1", 3)
            names = {f"unit-{k}": n for k, n in enumerate(live_names)}
        assert [names[u.name] for u in facts.units] == live_names
        live = {(s.step, *k): (t.count, t.bytes) for s in log.steps if s.step in steps
                for k, t in s.comm.items()}
        ours = {(st, names[u], ph, c): (v[0], v[1]) for (st, u, ph, c), v in comm.items()}
        assert ours == live


def event(cat, name, ts, dur, tid=1, **args) -> dict:
    """One complete ("X") trace event."""
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur,
            "args": args}


def launched_kernel(host, corr, ts, dur, stream=7, name="void gemm_kernel<float>") -> list:
    """A kernel and the host call that launched it (same correlation)."""
    return [event("cuda_runtime", "cudaLaunchKernel", host, 5, correlation=corr),
            event("kernel", name, ts, dur, tid=stream, correlation=corr, stream=stream)]


def test_gpu_fsdp2_trace_device_time_is_a_union_by_launch(tmp_path):
    """A GPU trace with FSDP2 spans whose answer is known by hand: two compute kernels of one
    unit overlap on two streams (their union counts, not their sum), the optimizer's kernel
    goes to the optimizer, a kernel still running at the step's end counts up to it, an NCCL
    kernel with no metadata and no launch in the trace is still an all-gather, exposed where
    no compute kernel ran."""
    x, launch = event, launched_kernel
    events = [x("user_annotation", "ProfilerStep#1", 0, 1000),
              x("user_annotation", "FSDP::pre_forward (layers.0)", 100, 10),
              x("user_annotation", "FSDP::post_forward (layers.0)", 400, 10),
              x("user_annotation", "Optimizer.step#SGD.step", 800, 100),
              *launch(200, 1, 300, 200), *launch(250, 2, 350, 100, stream=8),  # union 200
              *launch(850, 3, 900, 50),  # the optimizer's
              *launch(50, 4, 60, 30), *launch(970, 5, 980, 120),  # (model): 30 + 20 in step
              *launch(960, 6, 960, 10, name="Memcpy DtoD (Device -> Device)"),  # neither
              x("kernel", "ncclDevKernel_AllGather_RING_LL(x)", 200, 120, tid=20, stream=20)]
    path = tmp_path / "rank-0.json"
    path.write_text(json.dumps({"traceEvents": events}))
    src = open_traces(str(path), window=None, progress=False)
    st = src.ranks[0].result.steps[0]
    assert dict(st.compute) == {("layers.0", "forward"): 200.0, ("(model)", "forward"): 50.0}
    assert st.optimizer == 50.0 and st.framework == 0.0
    assert (st.device_compute, st.device_comm, st.device_exposed) == (300.0, 120.0, 100.0)
    assert st.device_busy == 300.0 + 100.0 + 10.0
    w = src.snapshot().ranks[0]
    ag = w.comm[("(model)", "forward", "all_gather")]
    assert ag.count == 1 and abs(ag.seconds - 120e-6) < 1e-12
    assert abs(ag.exposed_seconds - 100e-6) < 1e-12 and abs(ag.hidden_seconds - 20e-6) < 1e-12
    assert w.device.comm_kernels == {"all_gather": 1}

    # without profiler steps the whole trace is one step, the device's work included
    path.write_text(json.dumps({"traceEvents": events[1:]}))
    st = open_traces(str(path), window=None, progress=False).ranks[0].result.steps[0]
    assert (st.ts, st.end) == (60, 1100) and st.device_compute == 300.0 + 120.0 - 20.0


def test_device_work_without_a_launch_in_the_trace(tmp_path):
    """Known by hand: a kernel whose launch the trace does not hold (queued before the profiler
    began) is left out of the step and counted in the report's notes, as HTA leaves it out; a
    kernel without a correlation is kept; a capture with no host runtime call at all (device
    only) keeps every kernel. PyTorch 1.8's category names read the same."""
    step = event("user_annotation", "ProfilerStep#1", 0, 1000)
    orphan = event("kernel", "void gemm_kernel<float>", 10, 300, tid=7, correlation=99,
                   stream=7)  # no cudaLaunchKernel with correlation 99
    bare = event("kernel", "void relu_kernel<float>", 900, 50, tid=7, stream=7)  # no corr
    events = [step, orphan, bare, *launched_kernel(400, 1, 500, 100)]
    path = tmp_path / "rank-0.json"

    def read(evs):
        path.write_text(json.dumps({"traceEvents": evs}))
        src = open_traces(str(path), window=None, progress=False)
        return src, src.ranks[0].result

    src, res = read(events)
    assert res.unlaunched == 1 and res.steps[0].device_compute == 100.0 + 50.0
    assert any(x.startswith("1 device operation in rank-0.json not counted")
               for x in src.snapshot().log_notes)
    src, res = read([step, orphan, bare])  # no host runtime call: a device-only capture
    assert res.unlaunched == 0 and res.steps[0].device_compute == 300.0 + 50.0
    assert src.snapshot().log_notes == []
    legacy = {"user_annotation": "Operator", "cuda_runtime": "Runtime", "kernel": "Kernel"}
    src, res = read([{**e, "cat": legacy[e["cat"]]} for e in events])
    assert [s.step for s in res.steps] == [1] and res.unlaunched == 1
    assert res.steps[0].device_compute == 150.0
