"""bench/gpu_check.py's overhead A/B: the block boundary is clean. A sample installed for the
zerodoc twin's next step at the end of its block (the per-unit hooks, FSDP2's class-level
`_prefetch_unshard` wrapper) must not be in place while the plain twin's block runs, and A's
samples must still fall on exactly the steps its sampler schedules (none added or lost).

The block logic (`ab_blocks`) runs the same on CPU: two real FSDP2 twins in this process (gloo,
world size 1), zerodoc attached to A, no GPU. Witness of "B ran without zerodoc": Python calls
into zerodoc's shim while B's blocks run, counted with sys.setprofile (independent of the
shim's own state); of A's schedule: the sampler's `due` per step against what was installed.
"""

from __future__ import annotations

import pytest
import torch

import zerodoc
from bench.gpu_check import ab_blocks
from zerodoc.testing.syncwatch import python_calls

BLOCKS, PER = 8, 3


@pytest.mark.parametrize("detail", ["every", 2])
def test_b_blocks_run_without_zerodoc_and_a_keeps_its_schedule(gloo_world_1, tmp_path,
                                                              detail):
    from torch.distributed.device_mesh import init_device_mesh

    from zerodoc.demo.transformer import DemoConfig, batch, build, loss_fn

    cfg = DemoConfig(blocks=4, hidden=32, seq=8, batch=2)
    mesh = init_device_mesh("cpu", (1,))

    def make():
        torch.manual_seed(0)
        model = build(cfg, mesh=mesh)
        return model, torch.optim.AdamW(model.parameters(), lr=1e-3)

    twins = {"A": make(), "B": make()}

    def step(name: str, i: int) -> None:
        model, opt = twins[name]
        x, y = batch(cfg, i, 0)
        loss_fn(model(x), y).backward()
        opt.step()
        opt.zero_grad()

    for name in ("A", "B"):
        step(name, 0)
    mon = zerodoc.attach(*twins["A"], run_dir=str(tmp_path / "blocks"), port=False,
                         detail=detail, stall_after_s=0)
    a_steps: list = []  # per A step: (installed at its start, due by the sampler)
    ends_due: list = []  # per A block: a sample installed for A's next step at its end
    b_calls: list = []

    def run_a() -> int:
        for i in range(PER):
            a_steps.append((mon._detail_on, mon.sampler.due(mon.step_index + 1)))
            step("A", i)
        ends_due.append(mon._detail_on)
        return PER

    def run_b() -> int:
        b_calls.append(python_calls(lambda: [step("B", i) for i in range(PER)],
                                    prefix="zerodoc.shim", exclude=""))
        return PER

    try:
        d0 = mon.totals.detail_steps
        times = ab_blocks({"A": run_a, "B": run_b}, mon, BLOCKS, lambda: None)
        after = mon._detail_on, mon.sampler.due(mon.step_index + 1)
        detail_steps = mon.totals.detail_steps - d0
    finally:
        mon.close()
    assert len(times["A"]) == len(times["B"]) == BLOCKS
    assert all(t > 0 for t in times["A"] + times["B"])
    # the case under test: A's blocks ended with a sample due next (every one with "every")
    assert sum(ends_due) >= (BLOCKS if detail == "every" else 2), ends_due
    assert b_calls == [0] * BLOCKS  # B's blocks entered none of zerodoc's shim
    assert all(on == due for on, due in a_steps), a_steps  # detail exactly when due
    assert detail_steps == sum(due for _on, due in a_steps)
    assert after[0] == after[1]  # left as the schedule says for A's next step


def test_b_blocks_device_time_is_not_charged_to_a_on_the_cuda_stand_in(tmp_path, monkeypatch):
    """On the GPU path (the CUDA stand-in: zerodoc's device clock on simulated events), a
    detail step's instrumentation installed for A's next step opens the device clock with a
    mark on the compute stream: left in place through B's block, B's device work up to A's
    next mark would be charged to A's buckets. Ground truth beneath the measurement: each B
    block is one BLOCK_B_MS kernel on the compute stream; A's own steps take ~6 ms (all of
    A's ~30 steps: ~0.2 s, below one B block)."""
    from zerodoc.shim import hookpoints as hp
    from zerodoc.testing import simmonitor

    BLOCK_B_MS = 1000.0
    monkeypatch.setattr(hp, "queue_autograd_callback", hp.queue_autograd_callback)
    sim, fsdp, opt = simmonitor.build(4)
    queue: list = []
    mon, _real = simmonitor.attach(sim, fsdp, opt, "every", str(tmp_path / "sim"), queue)
    monkeypatch.setattr(hp, "queue_autograd_callback", queue.append)

    def run_a() -> int:
        for _ in range(PER):
            fsdp.step(queue)
            sim.kernel(0.5, "optimizer")
            opt.step()
            sim.drain()
        return PER

    def run_b() -> int:
        sim.kernel(BLOCK_B_MS, "the plain twin's block")
        return 1

    try:
        run_a()  # warm-up: the device clock's chain started
        ab_blocks({"A": run_a, "B": run_b}, mon, BLOCKS, sim.drain)
        run_a()
        sim.drain()
        mon.flush()
        tot = mon.totals
        charged = tot.other_seconds + tot.framework_seconds + tot.optimizer_seconds + \
            sum(tot.compute.values())
        device_steps = tot.steps
    finally:
        mon.close()
    assert sim.syncs == []
    assert device_steps == (BLOCKS + 2) * PER
    # A's buckets hold A's own device time, nothing of B's blocks (with the sample left
    # installed through them: 8.2 s, every B block's second)
    assert 0.05 < charged < BLOCK_B_MS / 1e3, charged
