"""The GPU path. On CPU machines: the CUDA modules import cleanly and the event-pairing /
lazy read-back logic is checked with stand-in events that keep CUDA's contract (record(),
query(), elapsed_time() in ms). On a CUDA machine: a real FSDP2 job, with a count of device
synchronisations proving the shim adds none."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from zerodoc.shim.cuda import CudaTimer
from zerodoc.shim.nvml import link_class_from_topology
from zerodoc.shim.recorder import (
    ALL_GATHER, BACKWARD, FORWARD, REDUCE_SCATTER, Recorder,
)

CUDA = torch.cuda.is_available()


class Clock:
    """A stand-in GPU clock: events complete at times the test decides."""

    def __init__(self):
        self.script: list[float | None] = []  # completion time (ms) of each new record()
        self.events: list[FakeEvent] = []


class FakeEvent:
    def __init__(self, clock: Clock):
        self.clock = clock
        self.t: float | None = None
        clock.events.append(self)

    def record(self):
        self.t = self.clock.script.pop(0)

    def query(self) -> bool:
        return self.t is not None

    def elapsed_time(self, end: "FakeEvent") -> float:
        assert self.t is not None and end.t is not None, "read before completion"
        return end.t - self.t


def make_timer():
    clock = Clock()
    rec = Recorder(n_units=2)
    return clock, rec, CudaTimer(rec, registry=None, event_factory=lambda: FakeEvent(clock))


def comm(rec, unit, phase, coll):
    return rec.comm.get((unit, phase, coll))


def test_prefetched_all_gather_exposure_is_done_minus_wait_point():
    clock, rec, timer = make_timer()
    rec.phase = FORWARD
    # all-gather of unit 1 issued at 10 ms, done at 18 ms (prefetched) ...
    clock.script = [10.0, 18.0]
    timer.call(lambda: None, (), {}, 1, ALL_GATHER, 4096, async_op=False)
    # ... the compute stream reaches unit 1 at 15 ms: it waits 3 ms.
    clock.script = [15.0]
    timer.wait_point(1)
    assert timer.collect() == 1
    t = comm(rec, 1, FORWARD, ALL_GATHER)
    assert t == [1, 4096, pytest.approx(0.008), pytest.approx(0.003), pytest.approx(0.005)]


def test_not_prefetched_all_gather_is_fully_exposed():
    clock, rec, timer = make_timer()
    rec.phase = BACKWARD
    clock.script = [5.0]  # compute ready for unit 0 at 5 ms
    timer.wait_point(0)
    clock.script = [6.0, 11.0]  # issued after that, done at 11 ms
    timer.call(lambda: None, (), {}, 0, ALL_GATHER, 100, async_op=True)
    timer.collect()
    t = comm(rec, 0, BACKWARD, ALL_GATHER)
    assert t[2] == pytest.approx(0.005) and t[3] == pytest.approx(0.005) and t[4] == 0


def test_hidden_all_gather_has_zero_exposure():
    clock, rec, timer = make_timer()
    rec.phase = FORWARD
    clock.script = [1.0, 4.0]
    timer.call(lambda: None, (), {}, 0, ALL_GATHER, 8, async_op=False)
    clock.script = [9.0]  # compute arrives long after it finished
    timer.wait_point(0)
    timer.collect()
    t = comm(rec, 0, FORWARD, ALL_GATHER)
    assert t[3] == 0.0 and t[4] == pytest.approx(0.003)


def test_unfinished_events_are_deferred_never_waited_for():
    clock, rec, timer = make_timer()
    rec.phase = BACKWARD
    clock.script = [1.0, None]  # done event not complete yet
    timer.call(lambda: None, (), {}, 1, REDUCE_SCATTER, 64, async_op=False)
    assert timer.collect() == 0 and comm(rec, 1, BACKWARD, REDUCE_SCATTER) is None
    clock.events[1].t = 3.0  # the GPU finishes it later
    assert timer.collect() == 1
    assert comm(rec, 1, BACKWARD, REDUCE_SCATTER)[2] == pytest.approx(0.002)


def test_events_are_pooled():
    clock, rec, timer = make_timer()
    rec.phase = FORWARD
    for step in range(5):
        clock.script = [1.0, 2.0, 1.5]
        timer.call(lambda: None, (), {}, 0, ALL_GATHER, 1, async_op=False)
        timer.wait_point(0)
        timer.collect()
    assert len(clock.events) == 3  # created once, reused every step


def test_link_class():
    assert link_class_from_topology(4, "single", False) == "nvlink"
    assert link_class_from_topology(0, "hostbridge", False) == "pcie"
    assert link_class_from_topology(0, None, False) == "local"
    assert link_class_from_topology(12, "single", True) == "infiniband"


def test_gpu_modules_import_without_cuda():
    code = "import zerodoc.shim.cuda, zerodoc.shim.nvml; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, env={"CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin"})
    assert out.stdout.strip() == "ok", out.stderr


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (run on the device machine)")
def test_real_gpu_step_adds_no_synchronisation(tmp_path, monkeypatch):
    """FSDP2 with NCCL at world size 1 on one GPU: instrumented steps call none of the
    device synchronisation entry points; allocator populations are exported."""
    import os

    import torch.distributed as dist

    import zerodoc
    from zerodoc.demo.model import DemoConfig, batch, build, loss_fn

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29555", RANK="0",
                      WORLD_SIZE="1", LOCAL_RANK="0")
    dist.init_process_group("nccl")
    try:
        torch.cuda.set_device(0)
        cfg = DemoConfig(blocks=4, hidden=512, seq=256, batch=8)
        with torch.device("cuda"):
            model = build(cfg)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        mon = zerodoc.attach(model, opt, run_dir=str(tmp_path / "gpu"), port=False)
        calls = []
        for name, owner in (("synchronize", torch.cuda), ("synchronize", torch.cuda.Event),
                            ("synchronize", torch.cuda.Stream)):
            orig = getattr(owner, name)

            def counted(*a, _orig=orig, _n=f"{owner.__name__}.{name}", **k):
                calls.append(_n)
                return _orig(*a, **k)
            monkeypatch.setattr(owner, name, counted)
        for step in range(6):
            x, y = batch(cfg, step, 0)
            loss = loss_fn(model(x.cuda()), y.cuda())
            loss.backward()
            opt.step()
            opt.zero_grad()
        assert calls == [], calls
        mon.close()
        from zerodoc.runlog import read_rank_log

        log = read_rank_log(tmp_path / "gpu" / "rank-00000.jsonl")
        mem = log.steps[-1].memory
        for pop in ("allocated", "reserved", "peak_reserved", "capacity", "headroom"):
            assert pop in mem and mem[pop] > 0, pop
    finally:
        dist.destroy_process_group()
