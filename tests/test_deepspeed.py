"""DeepSpeed ZeRO 1 / 2 / 3 (+ optimizer offload): real 2-rank gloo jobs on CPU.

Checked against what each stage should issue (this demo config, `zerodoc/demo/fw_deepspeed.py`):
- ZeRO-3 (each block a z3 leaf, no prefetch, released after forward): per step one
  all-gather per unit in forward and one in backward, each of the unit's padded unsharded
  bytes; gradients reduce-scattered in buckets on "(model)" (bytes = Psi * 4); the grad-norm
  all-reduce in the optimizer phase. DeepSpeed's default per-module fetching: the block's
  six modules give six all-gathers per block and phase, same bytes.
- ZeRO-1 / ZeRO-2: gradient buckets all-reduced in backward (bytes = Psi * 4, count >= the
  bucket count the bucket size allows), one all-gather of the updated parameters after the
  step (the padded flat parameter group), the grad-norm all-reduce; nothing in forward.
- A simulated slow link (every all-gather DELAY late, beneath the measurement) raises the
  floor (minimum over ranks and post-warm-up steps) of the exposed time by DELAY on every
  ZeRO-3 unit and phase, and on the post-step all-gather of ZeRO-2. Tolerance: max(5 % of
  DELAY, 2 ms).
- Stage, framework, offload detection; the rules: ZeRO-3 with this much headroom ->
  over-staging (ZD003); ZeRO-2 -> none.

DeepSpeed is an optional extra: without it these tests skip locally and fail in CI (CI=true).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.helpers import (ROOT, SMALL_MODEL, detail_steps, job_command, job_env,
                                   per_step, run_demo)

# The first start on a fresh machine compiles an op (ds_ready): more than the default 300 s.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

# 100 ms: ZeRO-3 issues its fetch asynchronously and waits a moment later (DeepSpeed's
# bookkeeping in between, ms under CPU contention), so its floors move by up to the transfer
# time more than a purely synchronous call's; 5 % of 100 ms covers that.
DELAY = 0.100
TOL = max(0.05 * DELAY, 0.002)
STEPS = 8
SKIP = 2  # warm-up steps: ZeRO-3 records and checks its fetch trace in steps 1-2
BLOCKS = [f"blocks.{i}" for i in range(4)]
Z3_UNITS = ["embed", *BLOCKS, "norm", "head"]
BUILD_TIMEOUT = 900  # first start on a fresh machine compiles DeepSpeed's comm op (~45 s)


def require_deepspeed() -> None:
    """DeepSpeed is part of the test environment (`make venv` installs it for any torch):
    missing is a failure, not a skip that would leave ZeRO untested unnoticed."""
    if importlib.util.find_spec("deepspeed") is None:
        pytest.fail("deepspeed is not installed (make venv installs it: "
                    "pip install --no-build-isolation deepspeed==0.19.8)")


@pytest.fixture(scope="module")
def ds_ready():
    """DeepSpeed importable and its CPU comm op compiled, once, in one process (two ranks
    compiling at once wait on a lock file; a killed build would leave it behind)."""
    require_deepspeed()
    t0 = time.monotonic()
    r = subprocess.run(job_command("deepspeed_build_op"), capture_output=True, text=True,
                       timeout=BUILD_TIMEOUT, env={**job_env(), "DS_ACCELERATOR": "cpu"})
    assert r.returncode == 0, r.stderr[-3000:]
    return time.monotonic() - t0


def ds_run(tmp, name, framework, *, steps=STEPS, model=None, attach=None, extra=None):
    return run_demo(tmp, name, nprocs=2, steps=steps, model=model, attach=attach,
                    extra={"framework": framework, **(extra or {})}, timeout=300)


def floor(logs, unit, phase, coll, field):
    return min(min(per_step(log, unit, phase, coll, field, skip=SKIP)) for log in logs.values())


# The base runs of a slow-link delta: per-unit detail on every step, as the slow run has it
# (fault injection forces it): the floors are minima over every step's sample (a few sampled
# steps leave them at the rank skew's noise), so both runs are measured alike.
EVERY = {"detail": "every"}


def _psi_and_block(model: dict | None = None) -> tuple[int, int, dict[str, int]]:
    """Parameter counts from the model itself, independently of zerodoc."""
    from zerodoc.demo.transformer import DemoConfig, TinyTransformer

    m = TinyTransformer(DemoConfig(**{**SMALL_MODEL, **(model or {})}))
    per_unit = {"embed": m.embed.weight.numel(), "head": m.head.weight.numel(),
                "norm": sum(p.numel() for p in m.norm.parameters())}
    block = sum(p.numel() for p in m.blocks[0].parameters())
    per_unit.update({b: block for b in BLOCKS})
    return sum(p.numel() for p in m.parameters()), block, per_unit


def _padded(numel: int, n: int) -> int:
    return math.ceil(numel / n) * n


# --------------------------------------------------------------------------------------
# runs shared by the tests (module scope: each job starts DeepSpeed, ~10 s)


@pytest.fixture(scope="module")
def z3(ds_ready, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ds3")
    base = ds_run(tmp, "base", "deepspeed-3", attach=EVERY,
                  extra={"losses_file": str(tmp / "loss-on")})
    slow = ds_run(tmp, "slow", "deepspeed-3", attach={"inject_latency_s": DELAY})
    return {"tmp": tmp, "base": base, "slow": slow}


# ZeRO-1/2 gather the whole model after the step: a smaller model keeps that one transfer
# (and its jitter on a busy 2-core machine) small next to the tolerance.
Z2_MODEL = {"hidden": 128, "vocab": 512}
Z2_STEPS = 12


@pytest.fixture(scope="module")
def z2(ds_ready, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ds2")
    return {"tmp": tmp,
            "base": ds_run(tmp, "base", "deepspeed-2", steps=Z2_STEPS, model=Z2_MODEL,
                           attach=EVERY),
            "slow": ds_run(tmp, "slow", "deepspeed-2", steps=Z2_STEPS, model=Z2_MODEL,
                           attach={"inject_latency_s": DELAY})}


# --------------------------------------------------------------------------------------
# ZeRO-3


def test_zero3_facts(z3):
    psi, block, per_unit = _psi_and_block()
    for r, log in z3["base"].items():
        f = log.facts
        assert (f.framework, f.framework_version, f.zero_stage) == ("deepspeed", "0.19.8", 3)
        assert f.world_size == 2 and f.mesh_shape == (2,)
        assert [u.name for u in f.units] == ["(model)", *Z3_UNITS]
        units = {u.name: u for u in f.units}
        assert sum(u.params for u in f.units) == psi
        for name in Z3_UNITS:
            u = units[name]
            assert u.params == per_unit[name] and u.group_size == 2
            assert u.reshard_after_forward is True
        assert f.config["offload_optimizer"] == "none"
        assert f.config["prefetch_bucket_size"] == 0 and f.config["max_reuse_distance"] == 0
        bad = {h: s for h, s in f.hooks.items() if s != "ok"}
        assert not bad, bad
        shard = psi * 4 // 2  # fp32, two ranks, no padding here
        for s in detail_steps(log):
            m = s.memory
            assert m["sharded_parameters"] == shard and m["gradients"] == shard, m
            # Adam m and v + the fp32 master partition (+ AdamW's scalar step counter)
            assert 0 <= m["optimizer_state"] - 3 * shard < 1024, m


def test_zero3_counts_and_bytes(z3):
    """All-gather per unit in forward and backward (its padded unsharded bytes), bucketed
    gradient reduce-scatter on (model), grad-norm all-reduce after backward."""
    psi, block, per_unit = _psi_and_block()
    for r, log in z3["base"].items():
        units = {u.name: u for u in log.facts.units}
        for s in detail_steps(log, SKIP):
            for name in Z3_UNITS:
                # every parameter's numel is even here: no padding to the world size
                assert units[name].gather_bytes == per_unit[name] * 4
                for phase in ("forward", "backward"):
                    ag = s.comm[(name, phase, "all_gather")]
                    assert ag.count == 1, (r, name, phase, ag)
                    assert ag.bytes == units[name].gather_bytes
                assert (name, "backward", "reduce_scatter") not in s.comm
            rs = s.comm[("(model)", "backward", "reduce_scatter")]
            bucket = log.facts.config["reduce_bucket_size"]
            assert rs.bytes == psi * 4, rs  # every gradient reduced once, fp32
            assert math.ceil(psi / bucket) <= rs.count <= 2 * math.ceil(psi / bucket)
            assert s.comm[("(model)", "optimizer", "all_reduce")].count >= 1  # grad norm
            ags = [k for k in s.comm if k[2] == "all_gather"]
            assert len(ags) == 2 * len(Z3_UNITS), ags  # nothing else gathers
            for name in Z3_UNITS:  # per-unit compute in both phases
                assert s.compute.get((name, "forward"), 0) > 0
                assert s.compute.get((name, "backward"), 0) > 0


def test_zero3_slow_link_exposed_rises_by_delay_per_unit(z3):
    for name in Z3_UNITS:
        for phase in ("forward", "backward"):
            d = (floor(z3["slow"], name, phase, "all_gather", "exposed_seconds")
                 - floor(z3["base"], name, phase, "all_gather", "exposed_seconds"))
            assert abs(d - DELAY) <= TOL, (name, phase, d)
            dt = (floor(z3["slow"], name, phase, "all_gather", "seconds")
                  - floor(z3["base"], name, phase, "all_gather", "seconds"))
            assert abs(dt - DELAY) <= TOL, (name, phase, dt)
    # Nothing but all-gathers was delayed.
    d = (floor(z3["slow"], "(model)", "backward", "reduce_scatter", "exposed_seconds")
         - floor(z3["base"], "(model)", "backward", "reduce_scatter", "exposed_seconds"))
    assert d < DELAY / 2


def test_zero3_blocking_call_is_exposed_not_framework(ds_ready, tmp_path):
    """Issue 20 item 9: a slow link that blocks the fetch's collective *call* (every
    all-gather sleeps DELAY before it is issued, beneath DeepSpeed and zerodoc:
    tests/support/jobs/blocking_link.py) was booked as the fetch's framework time (+DELAY per call)
    with exposed time unchanged. The time blocked in the call is exposed communication: the
    exposed all-gather floor rises by DELAY per call on every unit and phase, the framework
    floor does not take the delays."""
    from zerodoc.demo.launch import Job
    from zerodoc.runlog import read_rank_log

    root = ROOT
    env = {"PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    runs = {}
    for name, delay in (("base", 0.0), ("blocked", DELAY)):
        run_dir = tmp_path / name
        spec = {"model": dict(SMALL_MODEL), "steps": STEPS, "framework": "deepspeed-3",
                # both runs: floors of a delta (EVERY, above); no injection forces it here
                "attach": {"run_dir": str(run_dir), "port": False, **EVERY},
                "block_call_s": delay}
        job = Job(2, spec, module="tests.support.jobs.blocking_link", env=env).start()
        try:
            codes = job.wait(300)
        finally:
            job.stop()
        assert codes == [0, 0], job.outputs()
        runs[name] = {r: read_rank_log(run_dir / f"rank-{r:05d}.jsonl") for r in range(2)}
    calls, bad = 0, []
    for name in Z3_UNITS:
        for phase in ("forward", "backward"):
            n = per_step(runs["blocked"][0], name, phase, "all_gather", "count", skip=SKIP)
            assert n and set(n) == {1}, (name, phase, n)
            calls += 1
            base = floor(runs["base"], name, phase, "all_gather", "exposed_seconds")
            d = floor(runs["blocked"], name, phase, "all_gather", "exposed_seconds") - base
            # DELAY blocked in the call, then the wait for the peer: no longer than the
            # base run's (the ranks arrive after the same sleep), possibly shorter
            # (above: a sleep of DELAY overshoots on a loaded host, by up to ~10 %)
            if not DELAY - base - TOL <= d <= DELAY + 2 * TOL:
                bad.append((name, phase, round(d, 4), round(base, 4)))
    assert not bad, bad

    def framework_floor(logs):
        return min(s.framework_seconds for log in logs.values()
                   for s in detail_steps(log, SKIP))

    d = framework_floor(runs["blocked"]) - framework_floor(runs["base"])
    assert d < 0.25 * calls * DELAY, (d, calls)  # was + calls x DELAY


def test_zero3_total_is_exposed_plus_hidden(z3):
    for key in ("base", "slow"):
        for r, log in z3[key].items():
            for s in detail_steps(log):
                for k, t in s.comm.items():
                    assert t.exposed_seconds >= 0 and t.hidden_seconds >= 0
                    assert abs(t.seconds - t.exposed_seconds - t.hidden_seconds) \
                        <= max(0.05 * t.seconds, 0.002 * t.count), (key, r, k, t)


def test_zero3_losses_unchanged_by_instrumentation(z3):
    tmp = z3["tmp"]
    run_demo(tmp, "off", nprocs=2, steps=STEPS, attach={"enabled": False}, timeout=300,
             extra={"framework": "deepspeed-3", "losses_file": str(tmp / "loss-off")},
             read_logs=False)
    for r in range(2):
        on = json.loads(Path(f"{tmp / 'loss-on'}.{r}").read_text())
        off = json.loads(Path(f"{tmp / 'loss-off'}.{r}").read_text())
        assert on == off  # bitwise: floats round-trip through JSON exactly


def test_zero3_per_module_fetch_counts(ds_ready, tmp_path):
    """DeepSpeed's default: one fetch per module owning parameters; grouped per block."""
    logs = ds_run(tmp_path, "linear", "deepspeed-3", steps=4, model={"wrap": "linear"})
    psi, block, per_unit = _psi_and_block()
    # per block: ln1 qkv proj ln2 fc1 fc2
    fetches = {"embed": 1, "norm": 1, "head": 1, **{b: 6 for b in BLOCKS}}
    for r, log in logs.items():
        assert [u.name for u in log.facts.units] == ["(model)", *Z3_UNITS]
        assert log.facts.config["fetch_modules"] == sum(fetches.values())
        assert log.facts.config["z3_leaf_modules"] == 0
        units = {u.name: u for u in log.facts.units}
        for s in detail_steps(log, SKIP):
            for name in Z3_UNITS:
                for phase in ("forward", "backward"):
                    ag = s.comm[(name, phase, "all_gather")]
                    assert ag.count == fetches[name], (name, phase, ag)
                    assert ag.bytes == units[name].gather_bytes
                    assert s.compute.get((name, phase), 0) > 0  # spans of the block module


def test_zero3_offload_detected_and_timed(ds_ready, tmp_path):
    logs = ds_run(tmp_path, "off3", "deepspeed-3-offload", steps=4)
    for r, log in logs.items():
        f = log.facts
        assert f.zero_stage == 3 and f.config["offload_optimizer"] == "cpu"
        assert f.units[-1].name == "(offload)"
        assert f.hooks["DeepSpeedZeroOptimizer_Stage3._offload_grad_partition_at_boundary"] == "ok"
        for s in detail_steps(log):
            assert s.compute.get(("(offload)", "backward"), 0) > 0  # gradient copies to host
            assert s.optimizer_seconds > 0  # the host optimizer step
            assert s.comm[("blocks.0", "forward", "all_gather")].count == 1


# --------------------------------------------------------------------------------------
# ZeRO-1 / ZeRO-2


def _check_zero12(logs, stage, model=None, grad_coll="all_reduce"):
    psi, block, per_unit = _psi_and_block(model)
    for r, log in logs.items():
        f = log.facts
        assert (f.framework, f.zero_stage) == ("deepspeed", stage)
        assert [u.name for u in f.units] == ["(model)"]
        u = f.units[0]
        assert u.params == psi and u.reshard_after_forward is False
        assert u.gather_bytes == _padded(psi, 2) * 4  # the flat fp32 group, padded
        bucket = f.config["reduce_bucket_size"]
        bad = {h: s for h, s in f.hooks.items() if s != "ok"}
        assert not bad, bad
        part = u.gather_bytes // 2
        for s in detail_steps(log):
            m = s.memory  # parameters whole; gradients and optimizer state partitioned
            assert m["sharded_parameters"] == psi * 4 and m["gradients"] == part, m
            assert 0 <= m["optimizer_state"] - 3 * part < 1024, m
            ar = s.comm[("(model)", "backward", grad_coll)]
            assert ar.bytes == psi * 4, ar
            assert math.ceil(psi / bucket) <= ar.count <= 2 * math.ceil(psi / bucket)
            ag = s.comm[("(model)", "optimizer", "all_gather")]
            assert ag.count == 1 and ag.bytes == u.gather_bytes
            assert s.comm[("(model)", "optimizer", "all_reduce")].bytes == 4  # grad norm
            assert not [k for k in s.comm if k[1] == "forward"]
            assert s.compute[("(model)", "forward")] > 0
            assert s.compute[("(model)", "backward")] > 0
            assert s.optimizer_seconds > 0


def test_zero2_counts_and_bytes(z2):
    _check_zero12(z2["base"], 2, Z2_MODEL)


def test_zero1_counts_and_bytes(ds_ready, tmp_path):
    """With `use_multi_rank_bucket_allreduce: false` DeepSpeed reduces each bucket slice to
    its owner rank (`reduce`): booked as the bucket's reduce-scatter."""
    logs = ds_run(tmp_path, "z1", "deepspeed-1", steps=4, model=Z2_MODEL,
                  extra={"ds_config": {"zero_optimization": {
                      "use_multi_rank_bucket_allreduce": False}}})
    _check_zero12(logs, 1, Z2_MODEL, grad_coll="reduce_scatter")


def test_zero2_slow_link_post_step_all_gather(z2):
    base, slow = z2["base"], z2["slow"]
    d = (floor(slow, "(model)", "optimizer", "all_gather", "exposed_seconds")
         - floor(base, "(model)", "optimizer", "all_gather", "exposed_seconds"))
    assert abs(d - DELAY) <= TOL, d
    for log in slow.values():  # synchronous on CPU: nothing hidden
        assert max(per_step(log, "(model)", "optimizer", "all_gather", "hidden_seconds")) == 0


def test_zero2_offload_detected(ds_ready, tmp_path):
    logs = ds_run(tmp_path, "off2", "deepspeed-2-offload", steps=3)
    for log in logs.values():
        assert log.facts.config["offload_optimizer"] == "cpu"
        assert [u.name for u in log.facts.units] == ["(model)", "(offload)"]
        for s in detail_steps(log):
            assert s.compute.get(("(offload)", "backward"), 0) > 0


def test_close_restores_deepspeed(ds_ready, tmp_path):
    """After close(): DeepSpeed's backend methods, coordinator, engine and optimizer are
    DeepSpeed's own again and training goes on (one rank, ZeRO-3 and ZeRO-2 + offload).
    A private DeepSpeed method that is not there (renamed) is reported, training goes on."""
    from zerodoc.demo.launch import free_port

    r = subprocess.run(job_command("deepspeed_restore", free_port(), tmp_path),
                       capture_output=True, text=True, timeout=300,
                       env={**job_env(), "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0 and "deepspeed-3-renamed restored" in r.stdout, \
        (r.stdout[-2000:], r.stderr[-3000:])


def test_deepspeed_detail_plan_sample_by_sample(ds_ready, tmp_path):
    """Issue 19: DeepSpeed's per-unit instrumentation is a plan, built once and installed /
    removed at each detail step (K = 2), for ZeRO-3, ZeRO-2 + offload and ZeRO-1: on every
    detail step the hooks and shadowed methods a fresh registration puts there, none outside
    them or after close, every detail step measured, the losses bitwise the plain run's
    (tests/support/jobs/deepspeed_plan.py)."""
    from zerodoc.demo.launch import free_port

    r = subprocess.run(job_command("deepspeed_plan", free_port(), tmp_path),
                       capture_output=True, text=True, timeout=600,
                       env={**job_env(), "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    for fw in ("deepspeed-3", "deepspeed-2-offload", "deepspeed-1"):
        assert f"{fw} plan ok" in r.stdout, r.stdout[-2000:]


# --------------------------------------------------------------------------------------
# findings


def _diagnose(run_dir):
    from zerodoc import diagnosis
    from zerodoc.runlog import load_run

    return [f.code for f in diagnosis.diagnose(load_run(run_dir))]


def test_findings_zero3_over_staging(z3):
    codes = _diagnose(z3["tmp"] / "base")
    assert "ZD003" in codes, codes


def test_findings_zero2_not_over_staged(z2):
    codes = _diagnose(z2["tmp"] / "base")
    assert "ZD003" not in codes, codes


def test_findings_zero2_no_wrap_rules(z2):
    codes = _diagnose(z2["tmp"] / "base")
    assert not set(codes) & {"ZD001", "ZD002"}, codes


# --------------------------------------------------------------------------------------
# no DeepSpeed involved


def test_not_detected_without_deepspeed():
    """A plain module is not a DeepSpeed engine, and detection never imports DeepSpeed."""
    detect = ("import torch; from zerodoc.shim.deepspeed import DeepSpeedAdapter; "
              "assert not DeepSpeedAdapter.detect(torch.nn.Linear(2, 2), None)")
    r = subprocess.run(job_command("imported_modules", detect, '["deepspeed"]'),
                       capture_output=True, text=True, timeout=120, env=job_env())
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "", f"imported {r.stdout.strip()}"


def test_unit_grouping():
    import torch.nn as nn

    from zerodoc.demo.transformer import DemoConfig, TinyTransformer
    from zerodoc.shim.deepspeed import fetch_modules, group_name

    m = TinyTransformer(DemoConfig(**SMALL_MODEL))
    names = [n for n, _ in fetch_modules(m)]
    assert names[:3] == ["embed", "blocks.0.ln1", "blocks.0.qkv"]
    assert {group_name(m, n) for n in names} == set(Z3_UNITS)
    m.blocks[1]._z3_leaf = True  # deepspeed.utils.set_z3_leaf_modules
    names = [n for n, _ in fetch_modules(m)]
    assert "blocks.1" in names and not any(n.startswith("blocks.1.") for n in names)
    nested = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.Linear(2, 2)))
    assert group_name(nested, "1.0") == "1"
    assert group_name(nested, "") == "(root)"
