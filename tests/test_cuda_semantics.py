"""zerodoc's GPU timing against a CPU stand-in that keeps CUDA's and NCCL's semantics
(tests/cudasim.py): several streams with ordered queues, events that complete when their
stream reaches them, async NCCL ops on the process group's own stream after it waited on the
issuing stream, futures that complete at enqueue, sync ops on the current stream.

The real `CudaTimer`, `DeviceRecorder` and the real adapter wiring (FSDP2's
`fsdp2.instrument`, DDP's comm hook, DeepSpeed's stage-3 coordinator wrappers) are driven
through scripted scenarios of FSDP2 (implicit prefetch, async unshard + explicit prefetch,
reshard_after_forward=False, torch <= 2.7 NCCL), DDP and DeepSpeed. The witness is the
simulator's own log of what ran on which stream when (its "kernel trace"): per unit and
phase, the collective's kernel time, the part of it during which the compute stream stood
still waiting for it (exposed; a wait on FSDP's copy-in before the kernel started is the
framework's time, not the link's), and the unit's compute kernels. Both are deterministic, so the comparison is exact.

`test_async_all_gather_is_timed_on_its_own_stream` fails on zerodoc before the GPU-truth work
(its done event, recorded on the issuing stream after the enqueue, completed at once).
"""

from __future__ import annotations

import pytest
import torch

from tests.cudasim import Sim
from tests.fakefsdp2 import FakeFSDP2
from zerodoc.shim import fsdp2
from zerodoc.shim import hookpoints as hp
from zerodoc.shim.cuda import CudaTimer
from zerodoc.shim.recorder import (
    ALL_GATHER, B_OPTIMIZER, COLLECTIVES, FORWARD, PHASES, REDUCE_SCATTER, Recorder,
    unit_bucket,
)

try:  # the device clock (absent before the GPU-truth work: those runs time collectives only)
    from zerodoc.shim.devclock import DeviceRecorder, EventPool
except ImportError:  # pragma: no cover - only when checking the old code fails
    DeviceRecorder = None

EPS = 1e-9  # seconds: the simulator is exact
# (name, forward ms, backward ms, all-gather ms, reduce-scatter ms); blocks.2 on a slow link
UNITS = [("(root)", 1.0, 2.0, 0.4, 0.6),
         ("blocks.0", 2.0, 4.0, 0.5, 0.7),
         ("blocks.1", 2.0, 4.0, 0.5, 0.7),
         ("blocks.2", 2.0, 4.0, 9.0, 0.7),
         ("blocks.3", 2.0, 4.0, 0.5, 5.0)]


def run_fsdp2(monkeypatch, steps: int = 3, **cfg):
    sim = Sim()
    fsdp = FakeFSDP2(sim, UNITS, **cfg)
    registry = hp.HookRegistry()
    units = [fsdp2.Unit(i, name, m, [g], i == 0)
             for i, (name, m, g) in enumerate(zip([u[0] for u in UNITS], fsdp.modules,
                                                  fsdp.groups))]
    n = len(units)
    rec = DeviceRecorder(n, EventPool(sim.Event)) if DeviceRecorder else Recorder(n)
    timer = CudaTimer(rec, registry, event_factory=sim.Event)
    queue: list = []
    monkeypatch.setattr(hp, "queue_autograd_callback", queue.append)

    def on_root_forward():
        rec.phase = FORWARD

    fsdp2.instrument(units, rec, timer, registry, on_root_forward)
    got = {"comm": {}, "compute": {}, "host": {}}

    def fold():
        _acc, comm = rec.drain(0.0)
        for (u, p, c), a in comm.items():
            key = (UNITS[u][0], PHASES[p], COLLECTIVES[c])
            old = got["comm"].get(key, [0, 0, 0.0, 0.0, 0.0])
            got["comm"][key] = [x + y for x, y in zip(old, a)]
        if DeviceRecorder:
            dev, _checks, _caught = rec.take_device()
            for u in range(n):
                for p in (0, 1):
                    key = (UNITS[u][0], PHASES[p])
                    got["compute"][key] = got["compute"].get(key, 0.0) + dev[unit_bucket(u, p)]
                    got["host"][key] = got["host"].get(key, 0.0) + _acc[unit_bucket(u, p)]

    for _ in range(steps):
        fsdp.step(queue)
        rec.push(B_OPTIMIZER)
        sim.kernel(0.5, "optimizer")
        rec.remove(B_OPTIMIZER)
        timer.collect()  # the host is far ahead: little is complete yet, nothing blocks
        fold()
    assert sim.syncs == [], sim.syncs  # zerodoc never synchronised
    sim.drain()  # the test's own synchronisation: now everything is complete
    timer.collect()
    fold()
    return sim, got


def truth_all_gather(sim, name, phase):
    lab = f"ag:{name}:{phase}"
    return (sum(o.end - o.start for o in sim.ops if o.kind == "kernel" and o.label == lab) / 1e3,
            sim.stalled_during("compute", lab) / 1e3)


def truth_reduce_scatter(sim, name):
    lab = f"rs:{name}"
    return (sum(o.end - o.start for o in sim.ops if o.kind == "kernel" and o.label == lab) / 1e3,
            sim.stalled_during("compute", lab) / 1e3)


def check_against_trace(sim, got, phases=("forward", "backward")):
    """Every unit, phase and collective: zerodoc's numbers == the simulator's trace."""
    seen_exposed = 0.0
    for name, *_ in UNITS:
        for phase in phases:
            secs, exposed = truth_all_gather(sim, name, phase)
            t = got["comm"].get((name, phase, "all_gather"))
            if secs == 0:
                assert t is None, (name, phase, t)
                continue
            assert t is not None, (name, phase, "all-gather not recorded")
            assert t[2] == pytest.approx(secs, abs=EPS), (name, phase, "seconds", t, secs)
            assert t[3] == pytest.approx(exposed, abs=EPS), (name, phase, "exposed", t, exposed)
            assert t[4] == pytest.approx(secs - exposed, abs=EPS)
            seen_exposed += exposed
        secs, exposed = truth_reduce_scatter(sim, name)
        t = got["comm"][(name, "backward", "reduce_scatter")]
        assert t[2] == pytest.approx(secs, abs=EPS), (name, "reduce_scatter", t, secs)
        assert t[3] == pytest.approx(exposed, abs=EPS), (name, "rs exposed", t, exposed)
    assert seen_exposed > 0.001  # the slow link was exposed somewhere: the check can fail


def check_compute(sim, got):
    for name, *_ in UNITS:
        for phase, tag in (("forward", "fwd"), ("backward", "bwd")):
            want = sim.busy("compute", f"{tag}:{name}") / 1e3
            assert got["compute"][(name, phase)] == pytest.approx(want, abs=EPS), (name, phase)
            # ... while the host only launched it (microseconds): the two are different
            assert got["host"][(name, phase)] < 0.1 * want


def test_sync_all_gather_implicit_prefetch(monkeypatch):
    """FSDP2's default: all-gathers on FSDP's all-gather stream (async_op=False), the compute
    stream waits on its event; overlap comes from the host running ahead."""
    sim, got = run_fsdp2(monkeypatch)
    check_against_trace(sim, got)
    check_compute(sim, got)
    # the slow unit's forward all-gather was not entirely hidden behind blocks.1's compute
    _secs, exposed = truth_all_gather(sim, "blocks.2", "forward")
    assert 0.003 * 3 < exposed < 0.009 * 3  # 3 steps: 9 ms of link, part hidden


def test_async_all_gather_is_timed_on_its_own_stream(monkeypatch):
    """Async unshard + explicit prefetch: FSDP2 issues the all-gather on the compute stream
    with async_op=True; NCCL runs it on the process group's stream (which waits on the
    compute stream, not the other way round). An event recorded after the call on the
    issuing stream completes at enqueue; zerodoc must time the kernel itself."""
    sim, got = run_fsdp2(monkeypatch, async_op=True, explicit_prefetch=True)
    secs, _ = truth_all_gather(sim, "blocks.2", "forward")
    assert secs == pytest.approx(3 * 0.009)  # 3 steps of a 9 ms all-gather
    t = got["comm"][("blocks.2", "forward", "all_gather")]
    assert t[2] == pytest.approx(secs, abs=EPS), f"async all-gather timed {t[2]} s, ran {secs} s"
    check_against_trace(sim, got)


def test_async_all_gathers_queued_on_one_stream_count_only_their_own_time(monkeypatch):
    """Prefetched async all-gathers queue on the process group's one stream: each one's
    time starts when the previous one ended, not when it was issued."""
    sim, got = run_fsdp2(monkeypatch, async_op=True, explicit_prefetch=True)
    waits = [o for o in sim.ops if o.stream.startswith("nccl") and o.kind == "kernel"]
    assert len(waits) > 4
    check_against_trace(sim, got)


def test_reshard_after_forward_false_has_no_backward_all_gather(monkeypatch):
    sim, got = run_fsdp2(monkeypatch, reshard_after_forward=False)
    for name, *_ in UNITS:
        assert (name, "backward", "all_gather") not in got["comm"]
    check_against_trace(sim, got)
    check_compute(sim, got)


def test_legacy_nccl_sync_ops_on_the_process_group_stream(monkeypatch):
    """torch <= 2.7: sync collectives ran on the process group's stream and were joined back
    to the current stream by a wait; events around the call still bracket them."""
    sim, got = run_fsdp2(monkeypatch, legacy_nccl=True)
    check_against_trace(sim, got)


def test_reduce_scatter_waits_are_exposed_where_the_compute_stream_waits(monkeypatch):
    """blocks.3's reduce-scatter (5 ms) outlasts blocks.2's backward: the compute stream
    waits for it at blocks.2's post-backward; the root's, at the end of backward."""
    sim, got = run_fsdp2(monkeypatch)
    _secs, exposed = truth_reduce_scatter(sim, "blocks.3")
    assert exposed > 0.0005
    assert got["comm"][("blocks.3", "backward", "reduce_scatter")][3] == \
        pytest.approx(exposed, abs=EPS)


def test_events_are_pooled_and_unread_events_never_block(monkeypatch):
    sim = Sim()
    rec = DeviceRecorder(1, EventPool(sim.Event))
    timer = CudaTimer(rec, hp.HookRegistry(), event_factory=sim.Event)
    for _ in range(50):
        rec.push(unit_bucket(0, 0))
        sim.kernel(1.0, "fwd")
        rec.remove(unit_bucket(0, 0))
        timer.collect()  # nothing complete yet (the host is ahead): must not raise
    sim.drain()
    timer.collect()
    created = rec.pool.created
    for _ in range(50):
        rec.push(unit_bucket(0, 0))
        sim.kernel(1.0, "fwd")
        rec.remove(unit_bucket(0, 0))
        sim.drain()
        timer.collect()
    assert rec.pool.created == created  # steady state: no new events
    assert sim.syncs == []
