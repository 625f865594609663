"""A simulated slow link: collectives that complete a fixed delay late.

This layer sits *beneath* the measuring comm objects (it wraps FSDP's own comm), so the
measurement knows nothing about it and has to find the delay the way it would find a real
slow link. Synchronous collectives return `delay_s` later; asynchronous ones hand back a
`DelayedWork` whose future completes `delay_s` after the real collective did (a timer
thread sets it), and whose `wait()` blocks until then.

The delay is counted from the first sign that the real collective completed (its future's
callback on the backend's thread, or `wait()` returning on the caller's), and `wait()` sleeps
out the rest *on the caller's thread*: a waiter then wakes once after the delay, as a
synchronous slow call does, instead of at the end of a chain of three threads (callback,
timer start, timer fire), each of which has to get the GIL and, with more ranks than cores, a
scheduler slice. That chain added 3-4 ms to every 100 ms delay with 4 ranks on 2 cores, and
made the injected ground truth itself imprecise. Used by tests, benchmarks and the
demo's `--slow-link-ms`; never on by default.
"""

from __future__ import annotations

import threading
import time

import torch
import torch.distributed as dist


# The last stretch of an injected delay is spun, not slept: a sleeping thread wakes when the
# scheduler gives it a slice, which with more ranks than cores comes 2-3 ms after the deadline
# (measured: 4 ranks on 2 cores), and that lateness would be injected too. The price: 4 ms
# of a core per delayed call, taken from ranks that compute meanwhile (tests, the demo's
# --slow-link-ms and the what-if bench only: never on by default).
SPIN_S = 0.004


def sleep_until(deadline: float) -> None:
    rest = deadline - time.perf_counter() - SPIN_S
    if rest > 0:
        time.sleep(rest)
    while time.perf_counter() < deadline:
        pass


class DelayedWork(dist.Work):
    def __init__(self, inner, delay_s: float):
        super().__init__()
        self._inner = inner
        self._delay_s = delay_s
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._completed = False  # the future was set (by the waiter or the timer thread)
        self._t_inner: float | None = None  # when the real collective was first seen complete
        self._fut: torch.futures.Future = torch.futures.Future()
        self._inner_fut = inner.get_future()
        self._inner_fut.add_done_callback(self._on_inner_done)

    def _seen_done(self, t: float) -> float:
        with self._lock:
            if self._t_inner is None or t < self._t_inner:
                self._t_inner = t
            return self._t_inner

    def _complete(self) -> None:
        """The future completes once, at the deadline, whoever gets there first: a waiter
        (precise, it spun the last stretch) or the timer thread (nobody waits: a hidden
        collective; it wakes from a plain sleep). `_done` is set once the future is: a
        waiter that finds the timer thread setting it waits for that, so `wait()` returning
        implies the future is done, as with a real Work (review rev3 M1: it lagged up to
        1.4 ms)."""
        with self._lock:
            if self._completed:
                return
            self._completed = True
        try:  # wait(): the inner Work's wait can return just before its future completes
            self._fut.set_result(self._inner_fut.wait())
        except Exception as e:  # the real collective failed: pass it on
            self._fut.set_exception(e)
        self._done.set()

    def _on_inner_done(self, _fut) -> None:
        deadline = self._seen_done(time.perf_counter()) + self._delay_s

        def finish():
            rest = deadline - time.perf_counter()
            if rest > 0:
                time.sleep(rest)  # not spun: a spinning thread would hold the GIL from a
                # waiter spinning to the same deadline
            self._complete()
        threading.Thread(target=finish, daemon=True, name="zerodoc-slowlink").start()

    def wait(self, timeout=None) -> bool:
        ok = self._inner.wait() if timeout is None else self._inner.wait(timeout)
        if not ok:  # timed out: the collective is not done, nor its delay started
            return ok
        t_inner = self._seen_done(time.perf_counter())
        sleep_until(t_inner + self._delay_s)
        self._complete()
        self._done.wait()  # the timer thread may be the one setting the future
        return ok

    def is_completed(self) -> bool:
        return self._fut.done()

    def is_success(self) -> bool:
        return self._inner.is_success()

    def exception(self):
        return self._inner.exception()

    def get_future(self):
        return self._fut

    def source_rank(self) -> int:
        return self._inner.source_rank()

    def result(self):
        return self._inner.result()


class SlowLink:
    """Wraps a comm object (AllGather-like): every call completes `delay_s` later."""

    def __init__(self, inner, delay_s: float):
        self.inner = inner
        self.delay_s = delay_s

    def allocate(self, *args, **kwargs):
        return self.inner.allocate(*args, **kwargs)

    def __call__(self, *args, async_op: bool = False, **kwargs):
        work = self.inner(*args, async_op=async_op, **kwargs)
        if not async_op or work is None:
            sleep_until(time.perf_counter() + self.delay_s)
            return work
        return DelayedWork(work, self.delay_s)
