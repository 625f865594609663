"""The watchdog (zerodoc/shim/watchdog.py) on its own: when it calls a rank stuck, where it
says the rank is, once per stall and "resumed" after, a slow step is not a stall, failures
at close. The ground truth is what the test makes the training thread do (block inside a
real `HostTimer.sync_call`, raise from one, sit in a unit's compute bucket), never the
watchdog's own bookkeeping. Real multi-rank runs: tests/test_stopped.py."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from tests.support.helpers import wait_until

from zerodoc.shim.config import AttachConfig
from zerodoc.runmodel import RankWindow
from zerodoc.shim.comm import HostTimer
from zerodoc.shim.hookpoints import HookRegistry
from zerodoc.shim.recorder import ALL_GATHER, BACKWARD, FORWARD, REDUCE_SCATTER, Recorder, \
    unit_bucket
from zerodoc.shim.watchdog import STEP_FACTOR, Watchdog, poll_interval

UNITS = ["(root)", "blocks.0", "blocks.1"]


class Clock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


class Writer:
    def __init__(self):
        self.records: list[dict] = []

    def write(self, rec: dict) -> None:
        self.records.append(rec)


def fake_monitor(clock: Clock, max_step: float = 0.5):
    rec = Recorder(len(UNITS))
    rec.last = clock.t
    return SimpleNamespace(
        rec=rec, unit_names=UNITS, rank=3, step_index=7, _step_start=clock.t,
        _t_attach=clock.t - 100, _closed=False, totals=SimpleNamespace(max_step_seconds=max_step),
        registry=HookRegistry(), _writer=Writer(), timer=None)


def test_stall_recorded_once_then_resumed_with_the_recorder_position():
    clock = Clock()
    m = fake_monitor(clock)
    wd = Watchdog(m, 10.0, clock=clock, wall=lambda: 5000.0 + clock.t)
    m.rec.stack = [0, unit_bucket(1, BACKWARD)]  # inside blocks.0's backward compute
    m.rec.phase = BACKWARD
    clock.t += 9.9
    assert wd.check() is None and not m._writer.records  # not yet: 9.9 s < 10 s
    clock.t += 0.2
    rec = wd.check()
    assert rec is not None and rec["state"] == "stuck"
    assert (rec["unit"], rec["phase"], rec["in"], rec["collective"]) == \
        ("blocks.0", "backward", "compute", "")
    assert rec["step"] == 8 and rec["rank"] == 3 and rec["stalled_s"] == pytest.approx(10.1)
    assert rec["since_unix"] == pytest.approx(6000.0)  # wall clock when progress stopped
    assert wd.current is rec and wd.count == 1
    clock.t += 60
    assert wd.check() is None and len(m._writer.records) == 1  # once per stall
    m.rec.last = clock.t  # a hook fired: progress
    back = wd.check()
    assert back["state"] == "resumed" and back["since_unix"] == rec["since_unix"]
    assert wd.current is None and [r["state"] for r in m._writer.records] == ["stuck", "resumed"]
    clock.t += 11  # a second stall is a second record
    assert wd.check()["state"] == "stuck" and wd.count == 2


def test_a_slow_step_is_not_a_stall():
    """Steps of 20 s with threshold 2 s: 10 s without a hook inside a step is normal; only
    no step for STEP_FACTOR x the slowest step is a stall."""
    clock = Clock()
    m = fake_monitor(clock, max_step=20.0)
    wd = Watchdog(m, 2.0, clock=clock)
    clock.t += 10.0
    assert wd.check() is None
    clock.t += STEP_FACTOR * 20.0 - 10.0 - 0.5
    assert wd.check() is None
    clock.t += 1.0
    assert wd.check()["state"] == "stuck"


def test_step_end_counts_as_progress():
    clock = Clock()
    m = fake_monitor(clock)
    wd = Watchdog(m, 5.0, clock=clock)
    clock.t += 6
    assert wd.check()["state"] == "stuck"
    m.step_index += 1
    m._step_start = clock.t
    assert wd.check()["state"] == "resumed"


def test_blocked_collective_is_found_on_the_training_thread():
    """A real HostTimer.sync_call blocked in its collective on another thread: the
    watchdog names the collective's unit (not the unit whose bucket is open) and how long
    it has waited."""
    rec = Recorder(len(UNITS))
    timer = HostTimer(rec, HookRegistry(), callbacks=False)
    release = threading.Event()
    entered = threading.Event()

    def collective():
        entered.set()
        release.wait(30)

    m = SimpleNamespace(rec=rec, unit_names=UNITS, rank=0, step_index=2, _step_start=None,
                        _t_attach=time.perf_counter(), _closed=False,
                        totals=SimpleNamespace(max_step_seconds=0.0), registry=HookRegistry(),
                        _writer=Writer(), timer=timer)

    def train():
        rec.phase = FORWARD
        rec.push(unit_bucket(0, FORWARD))  # the root's forward, about to gather blocks.1
        timer.sync_call(collective, (), {}, 2, ALL_GATHER, 1 << 20)

    t = threading.Thread(target=train, daemon=True)
    wd = Watchdog(m, 0.3)
    t.start()
    wd.thread_id = t.ident
    try:
        assert entered.wait(10)
        # in the collective past the 0.3 s threshold: the watchdog's check reports the stall
        got = wait_until(wd.check, 10, "the watchdog to see the stall", interval=0.02)
    finally:
        release.set()
        t.join(10)
    assert got is not None, "no stall seen"
    assert (got["in"], got["unit"], got["collective"], got["phase"]) == \
        ("collective", "blocks.1", "all_gather", "forward")
    assert got["running_unit"] == "(root)"
    assert got["in_collective_s"] >= 0.3
    assert any("collective" in line for line in got["stack"]), got["stack"]


def test_failure_at_close_names_the_collective_from_the_traceback():
    rec = Recorder(len(UNITS))
    timer = HostTimer(rec, HookRegistry())
    m = SimpleNamespace(rec=rec, unit_names=UNITS, rank=1, step_index=4, _step_start=None,
                        _t_attach=0.0, _closed=False, totals=SimpleNamespace(max_step_seconds=1.0),
                        registry=HookRegistry(), _writer=Writer(), timer=timer)

    def dead_peer():
        raise RuntimeError("Connection reset by peer")

    rec.phase = BACKWARD
    try:
        timer.sync_call(dead_peer, (), {}, 1, REDUCE_SCATTER, 4096)
    except RuntimeError as e:
        out = Watchdog(m, 0.0).failed(e)
    assert out["state"] == "failed" and out["step"] == 5
    assert (out["collective"], out["unit"], out["phase"]) == \
        ("reduce_scatter", "blocks.0", "backward")
    assert "Connection reset by peer" in out["error"]
    assert m._writer.records == [out]


class FakeEvent:
    def __init__(self, done: bool):
        self.done = done

    def query(self) -> bool:
        return self.done


def test_gpu_collective_the_device_has_not_finished():
    """CUDA: the host is stuck outside any collective (e.g. a .item()), the device is still
    in an all-gather: the oldest pending collective whose completion event has not fired is
    named (event queries only, no sync)."""
    clock = Clock()
    m = fake_monitor(clock)
    def coll(unit, phase, done, seconds=None):
        return SimpleNamespace(unit=unit, phase=phase, coll=ALL_GATHER, seconds=seconds,
                               e1=SimpleNamespace(ev=FakeEvent(done)))

    pend = [coll(0, FORWARD, True, seconds=0.01),  # read back
            coll(1, FORWARD, True),  # finished on the device, not read back yet
            coll(2, BACKWARD, False),  # the one the device is still in
            coll(1, BACKWARD, False)]
    m.timer = SimpleNamespace(_pending=pend)
    wd = Watchdog(m, 1.0, clock=clock)
    clock.t += 2
    got = wd.check()
    assert (got["in"], got["unit"], got["phase"], got["collective"]) == \
        ("gpu collective", "blocks.1", "backward", "all_gather")


def test_thread_starts_stops_and_never_raises():
    clock = Clock()
    m = fake_monitor(clock)
    m.rec = None  # broken state: every check raises inside the watchdog
    wd = Watchdog(m, 1.0, poll_s=0.01).start()
    wait_until(lambda: m.registry.errors.get("watchdog", 0) >= 2, 10,
               "the watchdog thread to poll on past a check that raised")
    wd.stop()
    assert not wd._thread.is_alive()
    assert m.registry.errors.get("watchdog", 0) >= 1


def test_poll_interval_and_config(monkeypatch):
    assert poll_interval(120.0) == 5.0 and poll_interval(2.0) == pytest.approx(0.2)
    assert AttachConfig.from_options().stall_after_s == 120.0
    monkeypatch.setenv("ZERODOC_STALL_AFTER_S", "7.5")
    assert AttachConfig.from_options().stall_after_s == 7.5
    assert AttachConfig.from_options(stall_after_s=0).stall_after_s == 0
    for bad in (-1, float("inf"), "soon", True):
        with pytest.raises((TypeError, ValueError), match="stall_after_s"):
            AttachConfig(stall_after_s=bad)
    monkeypatch.setenv("ZERODOC_STALL_AFTER_S", "soon")
    with pytest.raises(ValueError, match="ZERODOC_STALL_AFTER_S"):
        AttachConfig.from_options()


def test_the_exporter_publishes_a_stall_only_while_it_lasts():
    from prometheus_client import CollectorRegistry, generate_latest

    from zerodoc.exporter.prometheus import ZerodocCollector
    from zerodoc.runmodel import RankFacts

    facts = RankFacts(rank=0, local_rank=0, world_size=2, local_world_size=2, node="n",
                      run_id="r", framework="fsdp2", framework_version="", torch_version="",
                      device_type="cpu", backend="gloo", zero_stage=3, mesh_shape=(2,),
                      mesh_dim_names=None, param_dtype="", reduce_dtype="", units=(),
                      device_capacity_bytes=None, started_unix=0.0, pid=1)
    wd = SimpleNamespace(count=1, current={"unit": "blocks.1", "phase": "forward",
                                           "collective": "all_gather", "since_unix": 123.5})
    mon = SimpleNamespace(facts=facts, totals=RankWindow(facts=facts), hist_counts=[0] * 16,
                          last_comm={}, unit_names=[], registry=HookRegistry(), watchdog=wd)
    reg = CollectorRegistry(auto_describe=False)
    reg.register(ZerodocCollector(mon))
    text = generate_latest(reg).decode()
    assert 'zerodoc_stalls_total{local_rank="0",node="n",rank="0"} 1.0' in text
    assert ('zerodoc_stall_since_timestamp_seconds{collective="all_gather",local_rank="0",'
            'node="n",phase="forward",rank="0",unit="blocks.1"} 123.5') in text
    wd.current = None
    assert "zerodoc_stall_since_timestamp_seconds{" not in generate_latest(reg).decode()


def test_a_signal_between_steps_is_not_placed_in_a_stale_phase():
    """A SIGTERM on a step without per-unit detail while the training thread is in its own
    code (data loading: no unit, forward or backward frame, not in the optimizer): the
    recorder's phase is the last detail step's (no hook keeps it between samples), so the
    "terminated" record says no phase rather than "optimizer"; inside the optimizer step
    (`_t_opt` set) it says the optimizer."""
    import sys

    from zerodoc.shim.recorder import OPTIMIZER

    clock = Clock()
    m = fake_monitor(clock)
    m._detail_on, m._t_opt, m.adapter = False, None, None
    m.rec.phase = OPTIMIZER  # stale: the last hook that ran was an optimizer hook
    wd = Watchdog(m, 10.0, clock=clock, wall=lambda: 5000.0 + clock.t)

    def load_batch():  # the training thread's own code when the signal came
        return wd.signalled("SIGTERM", sys._getframe())

    rec = load_batch()
    assert (rec["state"], rec["signal"], rec["step"]) == ("terminated", "SIGTERM", 8)
    assert (rec["in"], rec["unit"], rec["phase"], rec["collective"]) == \
        ("outside units", None, None, ""), rec
    assert rec["stack"][-1].endswith(" load_batch") and m._writer.records == [rec]
    m._t_opt = clock.t  # inside optimizer.step()
    assert wd.signalled("SIGTERM", sys._getframe())["phase"] == "optimizer"
