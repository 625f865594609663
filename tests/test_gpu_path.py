"""The GPU path on a CPU machine: its modules import without CUDA, the NVML link class, the
CUDA facts the timer is built on (checked on the stand-in of zerodoc/testing/cudasim.py), zerodoc's
GPU code making no synchronisation, and the fault injector's gate. On a CUDA machine, one
real FSDP2 step under the sync debug mode (the full check is bench/gpu_check.py)."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from tests.support.helpers import job_command, job_env
from zerodoc.testing.syncwatch import SyncWatch
from zerodoc.testing.cudasim import Sim, SimPG
from zerodoc.shim.config import AttachConfig
from zerodoc.shim import hookpoints as hp
from zerodoc.shim.cuda import CudaTimer
from zerodoc.shim.devclock import DeviceRecorder, EventPool
from zerodoc.shim.nvml import link_class_from_topology
from zerodoc.shim.recorder import ALL_GATHER, FORWARD, unit_bucket

ROOT = str(Path(__file__).resolve().parents[1])

CUDA = torch.cuda.is_available()


def test_an_async_collective_done_event_on_the_issuing_stream_completes_at_enqueue():
    """The assumption the old timer made, and why it was wrong: NCCL runs an async_op=True
    collective on the process group's stream, which waits on the issuing stream, not the
    other way round."""
    sim = Sim()
    pg = SimPG(sim)
    e0 = sim.Event().record()
    work = pg.collective(10.0, "ag", async_op=True)
    e1 = sim.Event().record()  # what the old code called "done"
    sim.drain()
    assert e0.elapsed_time(e1) < 0.01  # "0 ms" ...
    assert work.end.t - e0.t == pytest.approx(10.0, abs=0.01)  # ... for a 10 ms collective


def test_the_timer_reads_the_kernel_time_of_an_async_collective():
    sim = Sim()
    rec = DeviceRecorder(1, EventPool(sim.Event))
    timer = CudaTimer(rec, hp.HookRegistry(), event_factory=sim.Event)
    rec.phase = FORWARD
    pg = SimPG(sim)
    timer.call(pg.collective, (10.0, "ag", True), {}, 0, ALL_GATHER, 64, True, group=pg)
    timer.collect()
    assert rec.comm == {}  # not complete yet: deferred, never waited for
    sim.drain()
    timer.collect()
    (count, nbytes, secs, exposed, hidden), = rec.comm.values()
    assert (count, nbytes) == (1, 64) and secs == pytest.approx(0.010, abs=1e-5)  # + launch gaps
    assert exposed == 0.0 and hidden == pytest.approx(secs)  # nobody waited for it


def test_a_done_event_completing_out_of_order_is_read_later():
    """The read-back finds a group's completed done events by a binary search (they complete
    in issue order: one communicator). A done event recorded on a busy pool stream (async
    collectives' futures run their callbacks on pool streams) can complete after a later one:
    its read finds it not complete, it waits for a later step end, and nothing fails."""
    sim = Sim()
    rec = DeviceRecorder(1, EventPool(sim.Event))
    timer = CudaTimer(rec, hp.HookRegistry(), event_factory=sim.Event)
    rec.phase = FORWARD
    pg = SimPG(sim)
    sim.kernel(50.0, "busy", stream=sim._pool[0])  # the first callback's pool stream
    for label in ("a", "b"):
        timer.call(pg.collective, (1.0, label, True), {}, 0, ALL_GATHER, 8, True, group=pg)
    sim.host(10.0)  # both kernels ended; the first done event waits behind "busy"
    assert not timer._pending[0].e1.ev.query() and timer._pending[1].e1.ev.query()
    timer.collect()
    assert rec.comm == {} and len(timer._pending) == 2  # not read, not lost
    sim.drain()
    timer.collect()
    assert rec.comm[(0, FORWARD, ALL_GATHER)][0] == 2 and timer._pending == []
    assert sim.syncs == []


def test_zerodoc_gpu_code_makes_no_synchronisation():
    """The timer and the device clock through many steps, watched: no synchronize(), no
    .item(), no device-to-host copy from zerodoc's code (the stand-in counts its own)."""
    sim = Sim()
    rec = DeviceRecorder(2, EventPool(sim.Event))
    timer = CudaTimer(rec, hp.HookRegistry(), event_factory=sim.Event)
    pg = SimPG(sim)
    with SyncWatch() as watch:
        for _ in range(20):
            rec.phase = FORWARD
            rec.push(1)
            timer.arrive(1)
            timer.call(pg.collective, (2.0, "ag", True), {}, 1, ALL_GATHER, 8, True, pg)
            rec.switch(1, unit_bucket(1, FORWARD))
            timer.ready(1)
            sim.kernel(3.0, "fwd")
            rec.remove(unit_bucket(1, FORWARD))
            timer.collect()
    sim.drain()
    timer.collect()
    assert watch.by("zerodoc") == [] and sim.syncs == []
    assert rec.comm[(1, FORWARD, ALL_GATHER)][0] == 20


def test_syncwatch_can_see_a_sync():
    """The harness itself: a sync made from zerodoc's package is attributed to zerodoc."""
    code = compile("import torch\ndef f(t):\n    return t.item()\n",
                   "/x/zerodoc/shim/fake_sync.py", "exec")
    ns: dict = {}
    exec(code, ns)
    with SyncWatch() as watch:
        ns["f"](torch.ones(1))
        torch.ones(1).item()
    assert [c[1] for c in watch.calls] == ["zerodoc", "caller"]


def test_link_class():
    assert link_class_from_topology(4, "single", False) == "nvlink"
    assert link_class_from_topology(0, "hostbridge", False) == "pcie"
    assert link_class_from_topology(0, None, False) == "local"
    assert link_class_from_topology(12, "single", True) == "infiniband"


@pytest.mark.slow
def test_gpu_check_without_cuda_says_so_in_one_line():
    out = subprocess.run([sys.executable, "bench/gpu_check.py"], capture_output=True,
                         text=True, timeout=120, env={"CUDA_VISIBLE_DEVICES": "",
                                                      "PATH": "/usr/bin", "PYTHONPATH": "."})
    assert out.returncode == 2, (out.stdout, out.stderr)
    lines = [x for x in out.stdout.splitlines() if x.strip()]
    assert len(lines) == 1 and "no CUDA device" in lines[0] and not out.stderr.strip()


# --- the fault injector's gate --------------------------------------------------------------


def test_injector_env_alone_is_ignored_with_a_warning(monkeypatch):
    monkeypatch.setenv("ZERODOC_INJECT_LATENCY_S", "0.05")
    monkeypatch.delenv("ZERODOC_INJECT_LATENCY_ACK", raising=False)
    with pytest.warns(UserWarning, match="IGNORED"):
        cfg = AttachConfig.from_options()
    assert cfg.inject_latency_s == 0.0


def test_injector_env_with_acknowledgement_injects(monkeypatch):
    monkeypatch.setenv("ZERODOC_INJECT_LATENCY_S", "0.05")
    monkeypatch.setenv("ZERODOC_INJECT_LATENCY_ACK", "slow-down-this-job")
    assert AttachConfig.from_options().inject_latency_s == 0.05
    monkeypatch.setenv("ZERODOC_INJECT_LATENCY_ACK", "1")  # a lazy "yes" is not enough
    with pytest.warns(UserWarning, match="IGNORED"):
        assert AttachConfig.from_options().inject_latency_s == 0.0


def test_injection_is_loud_in_the_facts_and_the_metrics(tmp_path, monkeypatch):
    """A job that injects says so: a warning at attach, the run facts, the exporter."""
    import zerodoc
    from zerodoc.exporter.prometheus import ZerodocCollector

    monkeypatch.delenv("ZERODOC_INJECT_LATENCY_S", raising=False)
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for inject, loud in ((0.02, True), (0.0, False)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            mon = zerodoc.attach(model, opt, run_dir=str(tmp_path / str(inject)), port=False,
                                 inject_latency_s=inject)
        try:
            said = [str(w.message) for w in caught if "FAULT INJECTION" in str(w.message)]
            assert bool(said) == loud, said
            assert mon.facts.config["fault_injection"] is loud
            assert mon.facts.config["inject_latency_s"] == inject
            fams = {f.name: f for f in ZerodocCollector(mon).collect()}
            assert fams["zerodoc_injected_latency_seconds"].samples[0].value == inject
        finally:
            mon.close()


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (run on the device machine)")
def test_real_gpu_step_adds_no_synchronisation(tmp_path):
    """FSDP2 with NCCL at world size 1: instrumented steps under the sync debug mode, and
    no explicit synchronisation from zerodoc's code; allocator populations are exported."""
    import os

    import torch.distributed as dist

    import zerodoc
    from zerodoc.testing.gpusetup import batch, build_model, train_step

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29555", RANK="0",
                      WORLD_SIZE="1", LOCAL_RANK="0")
    dist.init_process_group("nccl")
    try:
        torch.cuda.set_device(0)
        from torch.distributed.fsdp import fully_shard

        model = build_model("cuda")
        for b in model.blocks:
            fully_shard(b)
        fully_shard(model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
        mon = zerodoc.attach(model, opt, run_dir=str(tmp_path / "gpu"), port=False)
        ids = [batch("cuda", i, bsz=1, seq=128) for i in range(6)]
        torch.cuda.synchronize()
        with SyncWatch() as watch:
            torch.cuda.set_sync_debug_mode("error")
            try:
                for x in ids:
                    train_step(model, opt, x)
            finally:
                torch.cuda.set_sync_debug_mode(0)
        assert watch.by("zerodoc") == [] and not mon.registry.errors
        mon.close()
        from zerodoc.runlog import read_rank_log

        log = read_rank_log(tmp_path / "gpu" / "rank-00000.jsonl")
        mem = log.steps[-1].memory
        for pop in ("allocated", "reserved", "peak_reserved", "capacity", "headroom"):
            assert pop in mem and mem[pop] > 0, pop
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_attach_builds_the_cuda_path_for_a_cuda_model(tmp_path):
    # The monitor's CUDA branch runs only where the model is on a GPU; here it is taken on
    # CPU with torch.cuda.Event replaced by the stand-in's. (Its first GPU run found an
    # attribute missing in that branch: attach failed and the job ran unmonitored.)
    # (tests/support/jobs/cuda_branch.py)
    out = subprocess.run(job_command("cuda_branch", tmp_path / "run"), capture_output=True,
                         text=True, timeout=120, cwd=ROOT, env=job_env())
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[-2] == "Monitor CudaTimer DeviceRecorder [True] []", \
        out.stdout[-2000:]


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_fast_record_records_on_the_current_stream():
    from zerodoc.shim.cuda import fast_record

    record = fast_record()
    assert record is not None
    side, ev = torch.cuda.Stream(), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)  # tens of ms on the side stream only
        record(ev)
    torch.cuda.current_stream().synchronize()  # the default stream has nothing queued
    assert not ev.query(), "recorded on the default stream, not the current one"
    side.synchronize()
    assert ev.query()
