"""FSDP1 (`FullyShardedDataParallel`): real gloo jobs for each sharding strategy.

- counts and bytes per step follow the strategy: FULL_SHARD (ZeRO-3) gathers every unit in
  forward and every non-root unit again in backward (FSDP1 keeps the root gathered between
  them), SHARD_GRAD_OP (ZeRO-2) only in forward, NO_SHARD none (one gradient all-reduce per
  unit), HYBRID_SHARD adds the all-reduce of the gradient shard across replicate groups;
  bytes = the unit's padded flat parameter, computed here from the model independently;
- stage detection and the facts (strategy, prefetch, limit_all_gathers) in the run log;
- truth: a slow link injected beneath the measurement (every all-gather +DELAY) raises the
  floor over ranks and steps of every unit's exposed all-gather time by DELAY (as in
  tests/test_exposure.py);
- findings: FULL_SHARD with the host's memory as headroom is over-staging (ZD003);
  SHARD_GRAD_OP is not.
"""

from __future__ import annotations

import math

import pytest

from tests.support.helpers import ROOT, SMALL_MODEL, detail_steps, per_step, run_demo

DELAY = 0.060
TOL = max(0.05 * DELAY, 0.002)
UNITS = ["(root)", "blocks.0", "blocks.1", "blocks.2", "blocks.3"]
BLOCKS = UNITS[1:]
# Odd-sized blocks (hidden 33): FSDP1 pads each block's flat parameter to a multiple of the
# group size, so gathered bytes differ from the parameters' bytes.
ODD_MODEL = {"hidden": 33, "heads": 3, "vocab": 256, "seq": 64}


def expected_bytes(model: dict, group: int) -> dict[str, int]:
    """Padded unsharded fp32 bytes of each unit's flat parameter, from the model alone."""
    from zerodoc.demo.transformer import DemoConfig, TinyTransformer

    m = TinyTransformer(DemoConfig(**{**SMALL_MODEL, **model}))
    block = sum(p.numel() for p in m.blocks[0].parameters())
    root = sum(p.numel() for n, p in m.named_parameters() if not n.startswith("blocks."))

    def padded(n: int) -> int:
        return math.ceil(n / group) * group * 4

    return {"(root)": padded(root), **{b: padded(block) for b in BLOCKS}}


def floor(logs, unit, phase, field, coll="all_gather"):
    return min(min(per_step(log, unit, phase, coll, field)) for log in logs.values())


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fsdp1_full")
    extra = {"framework": "fsdp1-full"}
    # Per-unit detail on every step in both: the floors are minima over every step's sample
    # (a few sampled steps leave them at the rank skew's noise), and the slow run has it
    # anyway (fault injection forces it): both runs measured alike.
    every = {"detail": "every"}
    return {
        "tmp": tmp,
        "base": run_demo(tmp, "base", steps=14, extra=extra, attach=every),
        "slow": run_demo(tmp, "slow", steps=14, extra=extra,
                         attach={"inject_latency_s": DELAY, **every}),
    }


@pytest.fixture(scope="module")
def grad_op(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fsdp1_grad_op")
    return tmp, run_demo(tmp, "grad_op", steps=4, model=ODD_MODEL,
                         extra={"framework": "fsdp1-grad-op",
                                "fsdp1": {"backward_prefetch": "BACKWARD_POST",
                                          "limit_all_gathers": False}})


def test_full_shard_facts_counts_and_bytes(full):
    expected = expected_bytes({}, 2)
    for r, log in full["base"].items():
        f = log.facts
        assert f.framework == "fsdp1" and f.zero_stage == 3 and f.world_size == 2
        assert f.config["sharding_strategy"] == "FULL_SHARD"
        assert f.config["backward_prefetch"] == "BACKWARD_PRE"
        assert f.config["limit_all_gathers"] is True
        assert f.config["forward_prefetch"] is False and f.config["cpu_offload"] is False
        assert [u.name for u in f.units] == UNITS
        assert all(v == "ok" for v in f.hooks.values()), f.hooks
        for u in f.units:
            assert u.gather_bytes == expected[u.name] and u.group_size == 2
            assert u.sharded_bytes * 2 == expected[u.name]
            # FSDP1 keeps the root gathered from forward to backward.
            assert u.reshard_after_forward is (u.name != "(root)")
        for s in detail_steps(log):
            for unit in UNITS:
                fwd = s.comm[(unit, "forward", "all_gather")]
                assert (fwd.count, fwd.bytes) == (1, expected[unit]), (r, s.step, unit)
                rs = s.comm[(unit, "backward", "reduce_scatter")]
                assert (rs.count, rs.bytes) == (1, expected[unit])  # fp32 gradients
                assert (unit, "backward", "all_reduce") not in s.comm
                assert s.compute[(unit, "forward")] > 0 and s.compute[(unit, "backward")] > 0
            for unit in BLOCKS:
                bwd = s.comm[(unit, "backward", "all_gather")]
                assert (bwd.count, bwd.bytes) == (1, expected[unit])
            assert ("(root)", "backward", "all_gather") not in s.comm


def test_slow_link_exposure_rises_by_delay_on_every_unit(full):
    gathers = [(u, "forward") for u in UNITS] + [(u, "backward") for u in BLOCKS]
    for unit, phase in gathers:
        d = (floor(full["slow"], unit, phase, "exposed_seconds")
             - floor(full["base"], unit, phase, "exposed_seconds"))
        assert abs(d - DELAY) <= TOL, (unit, phase, d)
        for r, log in full["slow"].items():
            # Synchronous on CPU: every rank waited at least the delay, nothing hidden.
            assert min(per_step(log, unit, phase, "all_gather", "exposed_seconds")) \
                >= DELAY - TOL, (r, unit, phase)
            assert max(per_step(log, unit, phase, "all_gather", "hidden_seconds")) == 0.0
    # The reduce-scatters were not delayed.
    for unit in UNITS:
        d = (floor(full["slow"], unit, "backward", "exposed_seconds", "reduce_scatter")
             - floor(full["base"], unit, "backward", "exposed_seconds", "reduce_scatter"))
        assert d < DELAY / 2, (unit, d)


def test_shard_grad_op_gathers_in_forward_only_padded(grad_op):
    _, logs = grad_op
    expected = expected_bytes(ODD_MODEL, 2)
    from zerodoc.demo.transformer import Block

    assert sum(p.numel() for p in Block(33, 3).parameters()) % 2 == 1  # padding happens
    for r, log in logs.items():
        f = log.facts
        assert f.framework == "fsdp1" and f.zero_stage == 2
        assert f.config["sharding_strategy"] == "SHARD_GRAD_OP"
        assert f.config["backward_prefetch"] == "BACKWARD_POST"
        assert f.config["limit_all_gathers"] is False
        for u in f.units:
            assert u.gather_bytes == expected[u.name], u
            assert u.reshard_after_forward is False
        for s in detail_steps(log):
            for unit in UNITS:
                ag = s.comm[(unit, "forward", "all_gather")]
                assert (ag.count, ag.bytes) == (1, expected[unit]), (r, s.step, unit)
                assert (unit, "backward", "all_gather") not in s.comm
                rs = s.comm[(unit, "backward", "reduce_scatter")]
                assert (rs.count, rs.bytes) == (1, expected[unit])


def test_no_shard_all_reduces_only(tmp_path):
    logs = run_demo(tmp_path, "no_shard", steps=3, model={"blocks": 2},
                    extra={"framework": "fsdp1-no-shard"})
    from zerodoc.demo.transformer import DemoConfig, TinyTransformer

    m = TinyTransformer(DemoConfig(**{**SMALL_MODEL, "blocks": 2}))
    numel = {"(root)": sum(p.numel() for n, p in m.named_parameters()
                           if not n.startswith("blocks.")),
             **{b: sum(p.numel() for p in m.blocks[0].parameters()) for b in BLOCKS[:2]}}
    tensors = {"(root)": sum(1 for n, _p in m.named_parameters() if not n.startswith("blocks.")),
               **{b: len(list(m.blocks[0].parameters())) for b in BLOCKS[:2]}}
    for log in logs.values():
        f = log.facts
        assert f.framework == "fsdp1" and f.zero_stage == 0
        assert f.config["sharding_strategy"] == "NO_SHARD"
        for u in f.units:
            assert u.sharded_bytes == u.param_bytes == numel[u.name] * 4
            assert u.tensors == tensors[u.name]  # the FlatParameter's original parameters
            assert u.replicate_size == 2 and u.reshard_after_forward is None
        for s in detail_steps(log):
            assert {c for (_, _, c) in s.comm} == {"all_reduce"}
            for unit in numel:
                ar = s.comm[(unit, "backward", "all_reduce")]
                assert (ar.count, ar.bytes) == (1, numel[unit] * 4)


def test_hybrid_shard_four_ranks(tmp_path):
    logs = run_demo(tmp_path, "hybrid", nprocs=4, steps=3, model={"blocks": 2},
                    extra={"framework": "fsdp1-hybrid"})
    units = UNITS[:3]
    expected = expected_bytes({"blocks": 2}, 2)  # sharded within groups of 2
    for r, log in logs.items():
        f = log.facts
        assert f.framework == "fsdp1" and f.zero_stage == 3 and f.world_size == 4
        assert f.config["sharding_strategy"] == "HYBRID_SHARD"
        assert f.mesh_shape == (2, 2) and f.mesh_dim_names == ("replicate", "shard")
        for u in f.units:
            assert (u.group_size, u.replicate_size) == (2, 2)
        for s in detail_steps(log):
            for unit in units:
                assert s.comm[(unit, "forward", "all_gather")].bytes == expected[unit]
                rs = s.comm[(unit, "backward", "reduce_scatter")]
                assert (rs.count, rs.bytes) == (1, expected[unit])
                # The gradient shard is all-reduced across the two replicate groups.
                ar = s.comm[(unit, "backward", "all_reduce")]
                assert (ar.count, ar.bytes) == (1, expected[unit] // 2), (r, unit)
            assert s.comm[("blocks.1", "backward", "all_gather")].count == 1


def _codes(run_dir) -> set[str]:
    from zerodoc import diagnosis
    from zerodoc.runlog import load_run

    return {f.code for f in diagnosis.diagnose(load_run(run_dir))}


def test_findings_full_shard_is_over_staging(full):
    assert "ZD003" in _codes(full["tmp"] / "base")


def test_findings_shard_grad_op_is_not_over_staging(grad_op):
    tmp, _ = grad_op
    assert "ZD003" not in _codes(tmp / "grad_op")


def test_missing_hook_point_fails_soft(tmp_path):
    """Without FSDP1's private runtime module the job trains on; the all-gathers (another
    hook point) are still measured and the header names what is missing."""
    logs = run_demo(tmp_path, "broken", steps=3, model={"blocks": 2},
                    extra={"framework": "fsdp1-full",
                           "break_hooks": ["zerodoc.shim.hookpoints.fsdp1_runtime"]})
    for log in logs.values():
        assert log.facts.hooks["fsdp._runtime_utils"] != "ok"
        assert log.facts.zero_stage == 3 and len(log.steps) == 3
        for s in detail_steps(log):
            assert s.comm[("blocks.1", "forward", "all_gather")].count == 1
            assert ("blocks.1", "backward", "reduce_scatter") not in s.comm


def test_close_restores_fsdp1(tmp_path):
    from zerodoc.demo.launch import Job

    job = Job(2, {"run_dir": str(tmp_path / "run"), "framework": "fsdp1-full"},
              module="tests.support.jobs.restore_after_close", env={"PYTHONPATH": str(ROOT)})
    with job:
        codes = job.wait(120)
    assert codes == [0, 0], job.outputs()
