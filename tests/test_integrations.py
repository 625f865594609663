"""Trainer integrations, run for real: HF Trainer, Accelerate, Lightning on 2 gloo ranks.

Each job (tests/support/jobs/integration.py) trains a tiny model with the real framework and the
integration as a user writes it. Checked against witnesses independent of zerodoc:
- units and bytes per all-gather: computed from the original model's parameter sizes
  (dim 0 padded to the world size) and the framework's documented wrapping;
- counts per unit and phase: FSDP2's schedule (a unit resharded after forward gathers again
  in backward; the root and `reshard_after_forward=False` groups do not);
- per step, the count and bytes of the collectives that reached `torch.distributed`
  (counted beneath FSDP / DDP, so beneath zerodoc) equal the sums in zerodoc's run log;
- the framework's own step counter equals the run log's step count; the run log ends with an
  `end` record and the rank's file_sd target, present during training, is gone (kept, and
  the end marked failed, when the training ended in an exception).

With two or more GPUs the same tests run on 2 ranks over NCCL, without the CPU-only patch of
Accelerate's device gate (see tests/support/jobs/integration.py); with one GPU they run on CPU
over gloo (at world size 1 there would be no collective to count). Lightning's FSDPStrategy (FSDP1) needs
CUDA: it runs on min(2, GPUs) ranks, and is skipped without a GPU.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from pathlib import Path

import pytest
import torch

from tests.support.helpers import ROOT, detail_steps
from zerodoc.demo.launch import Job
from zerodoc.runlog import read_rank_log

pytestmark = pytest.mark.slow

CUDA = torch.cuda.is_available()
# Two ranks, so that every collective runs (FSDP2 skips its all-gather / reduce-scatter and the
# Trainer its DDP wrapper at world size 1). With two GPUs they run over NCCL; with one, NCCL
# cannot put two ranks on it, so the jobs run on CPU over gloo (the GPUs hidden) and only the
# Lightning FSDP1 test, which needs CUDA, uses the one GPU (`run_job(..., gpu=True)`).
MULTI_GPU = CUDA and torch.cuda.device_count() >= 2
NPROCS = 2
STEPS = 3

LIGHTNING_FSDP_ON_CPU = (
    "Lightning's FSDPStrategy cannot run without CUDA: its accelerator connector refuses it "
    "('The strategy `fsdp` requires a GPU accelerator', lightning/pytorch/trainer/connectors/"
    "accelerator_connector.py, _check_strategy_and_fallback), and past that check torch's "
    "FSDP1 raises 'FSDP needs a non-CPU accelerator device' because the strategy passes "
    "device_id=root_device.index (None on CPU; lightning/pytorch/strategies/fsdp.py, "
    "_setup_model)")


def run_job(tmp: Path, name: str, spec: dict, ok: bool = True, gpu: bool = False):
    """Run a scenario on NPROCS ranks (`gpu`: on min(2, GPUs) ranks, each on its GPU); return
    (per-rank results, per-rank run logs, run dir)."""
    nprocs = min(2, torch.cuda.device_count()) if gpu else NPROCS
    run_dir, out = tmp / name / "run", tmp / name / "out"
    spec = {**spec, "run_dir": str(run_dir), "out": str(out)}
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           # Lightning: processes started outside it (as torchrun does)
           "TORCHELASTIC_RUN_ID": f"zdtest-{name}", "GROUP_RANK": "0",
           "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    if not (gpu or MULTI_GPU):
        env["CUDA_VISIBLE_DEVICES"] = ""
    job = Job(nprocs, spec, module="tests.support.jobs.integration", env=env).start()
    try:
        codes = job.wait(240)
    finally:
        job.stop()
    outs = job.outputs()
    assert codes == [0] * nprocs, f"ranks exited {codes}: {[e[-3000:] for _, e in outs]}"
    results = {r: json.loads((out / f"rank-{r}.json").read_text()) for r in range(nprocs)}
    logs = {r: read_rank_log(run_dir / f"rank-{r:05d}.jsonl") for r in range(nprocs)}
    return results, logs, run_dir


def check_closed(results, logs, run_dir, steps: int, failed: bool = False) -> None:
    """Closed by the integration: an end record, and the file_sd target gone, unless the
    training ended in an exception (`failed`): then the end says so and the targets stay (the
    ranks show as down to Prometheus, as a crashed job's do)."""
    for r, log in logs.items():
        assert results[r]["global_step"] == steps
        assert len(log.steps) == steps, [s.step for s in log.steps]
        assert log.ended, f"rank {r}: no end record"
        assert log.facts.metrics_endpoint, "the exporter was not serving"
        assert f"rank-{r:05d}.json" in results[r]["targets_during"]
    left = sorted(os.listdir(run_dir / "file_sd")) if (run_dir / "file_sd").is_dir() else []
    if failed:
        assert left == [f"rank-{r:05d}.json" for r in sorted(logs)], left
    else:
        assert left == [], f"file_sd targets left after close: {left}"


def with_witness(log, witness: list) -> list:
    """(step, the witness's count of that step) for the steps with per-unit detail: in the
    default detail the sampled steps (the others have no per-unit rows to hold against it)."""
    pairs = [(s, w) for s, w in zip(log.steps, witness) if s.detail]
    assert pairs, f"rank {log.facts.rank}: no step with per-unit detail"
    return pairs


def check_units(results, logs, counts: dict[str, tuple[int, int, int]]) -> None:
    """counts: unit -> (forward all-gathers, backward all-gathers, reduce-scatters) per step."""
    for r, log in logs.items():
        expected = results[r]["expected"]
        facts = {u.name: u for u in log.facts.units}
        assert set(facts) == set(counts), sorted(facts)
        assert log.facts.framework == "fsdp2" and log.facts.world_size == NPROCS
        for unit in counts:
            assert facts[unit].gather_bytes == expected[unit], (unit, facts[unit])
        for s, wit in with_witness(log, results[r]["witness"]):
            for unit, (fwd, bwd, rs) in counts.items():
                for phase, coll, n in (("forward", "all_gather", fwd),
                                       ("backward", "all_gather", bwd),
                                       ("backward", "reduce_scatter", rs)):
                    t = s.comm.get((unit, phase, coll))
                    got = (t.count, t.bytes) if t is not None else (0, 0)
                    assert got == (n, n * expected[unit]), (r, s.step, unit, phase, coll, got)
            # Beneath zerodoc: what reached torch.distributed in the same step.
            for coll in ("all_gather", "reduce_scatter"):
                mine = [t for (u, p, c), t in s.comm.items() if c == coll]
                assert [sum(t.count for t in mine), sum(t.bytes for t in mine)] \
                    == wit.get(coll, [0, 0]), (r, s.step, coll)


# --- Hugging Face Trainer ---------------------------------------------------------------------

HF_TAIL = "transformer.wte+transformer.ln_f+lm_head"


@pytest.fixture(scope="module")
def hf_frameworks():
    """The integrations extra (make venv installs it): missing is a failure, not a skip."""
    import accelerate  # noqa: F401
    import transformers  # noqa: F401


def test_hf_trainer_fsdp2_callback_measures_the_trainers_sharded_model(tmp_path, hf_frameworks):
    results, logs, run_dir = run_job(tmp_path, "hf-fsdp2", {"scenario": "hf", "steps": STEPS})
    assert all(res["fsdp_enabled"] for res in results.values())
    check_closed(results, logs, run_dir, STEPS)
    # Accelerate's FSDP2 preparation: each GPT2Block, the root, and one group for the tied
    # embedding + final norm + head (`fully_shard([ln_f, wte, lm_head],
    # reshard_after_forward=False)`); the root is not resharded after forward (FSDP2's root
    # heuristic), the blocks are.
    check_units(results, logs, {"(root)": (1, 0, 1), HF_TAIL: (1, 0, 1),
                                "transformer.h.0": (1, 1, 1), "transformer.h.1": (1, 1, 1)})


def test_hf_trainer_ddp_callback_attaches_the_wrapped_model(tmp_path, hf_frameworks):
    # The Trainer's default on several processes: DDP. The callback was given the trainer,
    # so it attaches `model_wrapped` (the DDP wrapper) although callbacks see the bare model.
    results, logs, run_dir = run_job(tmp_path, "hf-ddp",
                                     {"scenario": "hf", "fsdp": False, "steps": STEPS})
    check_closed(results, logs, run_dir, STEPS)
    for r, log in logs.items():
        assert results[r]["model_seen"] == "GPT2LMHeadModel"  # what callbacks are handed
        assert log.facts.framework == "ddp"
        for s, wit in with_witness(log, results[r]["witness"]):
            ar = [t for (u, p, c), t in s.comm.items() if c == "all_reduce"]
            # Every gradient byte is all-reduced once per step, in DDP's buckets.
            assert sum(t.bytes for t in ar) == results[r]["param_bytes"], (r, s.step)
            assert [sum(t.count for t in ar), sum(t.bytes for t in ar)] == wit["all_reduce"]


# --- Accelerate ---------------------------------------------------------------------------------

def test_accelerate_fsdp2_attach_after_prepare_with_gradient_accumulation(tmp_path):
    import accelerate  # noqa: F401  (the integrations extra: missing is a failure)

    results, logs, run_dir = run_job(tmp_path, "accelerate",
                                     {"scenario": "accelerate", "steps": STEPS, "accumulate": 2})
    check_closed(results, logs, run_dir, STEPS)
    assert results[0]["optimizer_type"] == "AcceleratedOptimizer"
    # Two micro-batches per optimizer step: two gathers per unit and phase, one
    # reduce-scatter (Accelerate skips gradient sync on the first micro-batch).
    check_units(results, logs, {"(root)": (2, 0, 1), "blocks.0": (2, 2, 1),
                                "blocks.1": (2, 2, 1)})


# --- Lightning ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def lightning_framework():
    """The integrations extra (make venv installs it): missing is a failure, not a skip."""
    import lightning  # noqa: F401


def test_lightning_model_parallel_fsdp2_callback(tmp_path, lightning_framework):
    results, logs, run_dir = run_job(tmp_path, "lightning-mp",
                                     {"scenario": "lightning", "steps": STEPS})
    check_closed(results, logs, run_dir, STEPS)
    assert results[0]["model_seen"].startswith("FSDP")  # the strategy's sharded module
    check_units(results, logs, {"(root)": (1, 0, 1), "net.blocks.0": (1, 1, 1),
                                "net.blocks.1": (1, 1, 1)})
    for log in logs.values():
        # Lightning steps inside optimizer.step(closure): forward and backward must not be
        # booked as optimizer time. With it wrongly booked, optimizer_s ~ step_s, which holds
        # the units' compute too; booked apart, optimizer + compute <= step. (A share of the
        # step is no test: on a fast 16-core host the optimizer alone took 53 % of a step.)
        for s in detail_steps(log, 1):
            assert s.compute_seconds > 0, s
            assert s.optimizer_seconds + 0.5 * s.compute_seconds < s.step_seconds, s


def test_lightning_exception_is_recorded_and_the_monitor_closed(tmp_path, lightning_framework):
    results, logs, run_dir = run_job(tmp_path, "lightning-raise",
                                     {"scenario": "lightning", "steps": 4, "raise_at": 2})
    assert results[0]["raised"] == "boom at batch 2"
    check_closed(results, logs, run_dir, 2, failed=True)
    for r in logs:
        records = [json.loads(line) for line in
                   (run_dir / f"rank-{r:05d}.jsonl").read_text().splitlines()]
        exc = [x for x in records if x["type"] == "exception"]
        assert len(exc) == 1 and exc[0]["error"] == "RuntimeError"
        assert exc[0]["message"] == "boom at batch 2" and exc[0]["step"] == 2
        assert records[-1]["type"] == "end" and records[-1].get("failed") is True


@pytest.mark.skipif(not CUDA, reason=LIGHTNING_FSDP_ON_CPU)
def test_lightning_fsdp_strategy_callback_cuda(tmp_path, lightning_framework):
    results, logs, run_dir = run_job(tmp_path, "lightning-fsdp1",
                                     {"scenario": "lightning", "strategy": "fsdp",
                                      "steps": STEPS}, gpu=True)
    check_closed(results, logs, run_dir, STEPS)
    for r, log in logs.items():
        assert log.facts.framework == "fsdp1"
        names = [u.name for u in log.facts.units]
        assert any(n.endswith("blocks.0") for n in names), names
        seen = 0
        for s, wit in with_witness(log, results[r]["witness"]):
            for coll in ("all_gather", "reduce_scatter"):
                mine = [t for (u, p, c), t in s.comm.items() if c == coll]
                assert [sum(t.count for t in mine), sum(t.bytes for t in mine)] \
                    == wit.get(coll, [0, 0]), (r, s.step, coll)
                seen += sum(t.count for t in mine)
            # On one GPU FSDP1 runs NO_SHARD: its gradients are all-reduced. The witness also
            # counts Lightning's own all-reduces of one scalar (8 bytes; the H100 run: 5
            # calls / 3,332 bytes against FSDP's 3 / 3,316): those, and only those, are not
            # FSDP's.
            mine = [t for (u, p, c), t in s.comm.items() if c == "all_reduce"]
            n, b = sum(t.count for t in mine), sum(t.bytes for t in mine)
            wn, wb = wit.get("all_reduce", [0, 0])
            assert n <= wn and b == wb - 8 * (wn - n), (r, s.step, (n, b), (wn, wb))
            seen += n
        assert seen > 0, "no collective measured: the comparison above was vacuous"


# --- torchtitan ---------------------------------------------------------------------------------

def test_torchtitan_units_and_step_boundary(tmp_path):
    pytest.importorskip("torchtitan", reason="torchtitan is not installed (not in the "
                        "integrations extra: its Trainer needs CUDA, see docs/integrations.md)")
    results, logs, run_dir = run_job(tmp_path, "torchtitan",
                                     {"scenario": "torchtitan", "steps": 2})
    check_closed(results, logs, run_dir, 2)
    for r, log in logs.items():
        facts = {u.name: u.gather_bytes for u in log.facts.units}
        assert facts == results[r]["expected"], facts


# --- in-process ---------------------------------------------------------------------------------

def test_closure_time_is_not_optimizer_time(tmp_path):
    """`optimizer.step(closure)` (Lightning, LBFGS): a 200 ms closure injected beneath the
    measurement lands outside the optimizer bucket; the closure's result is passed through."""
    import zerodoc

    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(2, 4)

    def closure():
        time.sleep(0.2)  # the subject: 200 ms of closure, the ground truth beneath the shim
        opt.zero_grad()
        loss = model(x).square().sum()
        loss.backward()
        return loss

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no sharded units here
        monitor = zerodoc.attach(model, opt, port=False, run_dir=str(tmp_path))
    try:
        losses = [opt.step(closure), opt.step(closure=closure), opt.step(closure)]
    finally:
        monitor.close()
    assert all(isinstance(l, torch.Tensor) for l in losses)
    steps = read_rank_log(tmp_path / "rank-00000.jsonl").steps
    assert len(steps) == 3
    for s in steps:
        assert s.optimizer_seconds < 0.1, s
        assert s.step_seconds - s.optimizer_seconds >= 0.19, s


def test_bad_options_raise_when_the_callback_is_made():
    from zerodoc.integrations.lightning import ZerodocCallback

    with pytest.raises(TypeError, match="unknown option"):
        ZerodocCallback(prot=0)
