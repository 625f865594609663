"""The injected slow link (`zerodoc/shim/slowlink.py`), the ground truth beneath the exposure
tests, the demo's --slow-link-ms and the what-if bench: its delay is where it says it is, and
its Work behaves as a real one (review rev3 M1: `wait()` returned before the future was
done, which the shim's completion callback and DDP's comm hook read)."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from zerodoc.shim.slowlink import DelayedWork

DELAY = 0.03


def test_wait_returns_after_the_delay_with_the_future_done(gloo_world_1):
    late = []
    for _ in range(20):
        t = torch.ones(1000)
        w = DelayedWork(dist.all_reduce(t, async_op=True), DELAY)
        t0 = time.perf_counter()
        assert w.wait()
        late.append(time.perf_counter() - t0 - DELAY)
        assert w.get_future().done() and w.is_completed()
        assert torch.equal(w.get_future().value()[0], torch.ones(1000))
    # counted from the collective's completion (at most the wait's start) and spun at the
    # end: never over the delay by more than a scheduler's hiccup, never far under it
    assert -0.005 <= min(late) and sorted(late)[len(late) // 2] <= 0.002, late


def test_the_future_completes_after_the_delay_when_nobody_waits(gloo_world_1):
    w = DelayedWork(dist.all_reduce(torch.ones(3), async_op=True), DELAY)
    t0 = time.perf_counter()
    assert not w.is_completed()
    w.get_future().wait()
    took = time.perf_counter() - t0
    assert DELAY - 0.005 <= took <= DELAY + 0.05, took
    assert w.is_completed()


def test_a_failed_collective_fails_the_future():
    class Failed:
        def __init__(self):
            self.fut = torch.futures.Future()
            self.fut.set_exception(RuntimeError("link down"))

        def get_future(self):
            return self.fut

        def wait(self, timeout=None):
            return True

    w = DelayedWork(Failed(), 0.001)
    w.wait()
    try:
        w.get_future().wait()
    except RuntimeError as e:
        assert "link down" in str(e)
    else:
        raise AssertionError("the failure was not passed on")
