"""Host-clock timing of collectives (the CPU / gloo backend).

Semantics on the host:
- a synchronous collective blocks the calling (compute) thread: all of it is exposed;
- an asynchronous one returns a `dist.Work`; we hand FSDP a `TimedWork` whose `wait()`
  measures how long the compute thread blocked (exposed). Completion time comes from the
  Work's future callback (gloo runs it on its own thread as the collective finishes), so
  hidden = min(completion, wait entered) - issue is measured, not derived. Without
  callbacks the completion of a collective that finished before `wait()` is unknown and
  its hidden time is an upper bound (up to the moment `wait()` was entered).

The CUDA backend (`cuda.CudaTimer`: events on the streams the collectives run on, exposure
on the compute stream, read back lazily) has the same interface: the comm wrappers call
`timer.call(...)`, the unit hooks `timer.arrive(unit)` / `timer.ready(unit)`, and nothing
else knows how time is taken. On the host those two are no-ops: a blocked compute thread is
measured directly.

Delays for tests and the demo (a simulated slow link) are injected by `slowlink.py`, a
layer beneath this one that the measurement knows nothing about.
"""

from __future__ import annotations

from time import perf_counter
from typing import Any

import torch.distributed as dist

from .recorder import B_WAIT, Recorder


class HostTimer:
    device = False
    order = None  # collorder.CollOrder: the collectives' sequence numbers (set by the monitor)

    def __init__(self, rec: Recorder, registry, callbacks: bool = True):
        self.rec = rec
        self.registry = registry
        self.callbacks = callbacks

    def call(self, fn, args: tuple, kwargs: dict, unit: int, coll: int, nbytes: int,
             async_op: bool, group=None) -> Any:
        """Run one collective `fn(*args, **kwargs)` (async_op already in kwargs) and time it."""
        if not async_op:
            return self.sync_call(fn, args, kwargs, unit, coll, nbytes)
        t0 = perf_counter()
        work = fn(*args, **kwargs)
        return self.async_issue(work, unit, coll, nbytes, t0)

    def call_blocking_issue(self, fn, args: tuple, kwargs: dict, unit: int, coll: int,
                            nbytes: int, async_op: bool) -> Any:
        """`call`, for an asynchronous collective whose call itself may block (DeepSpeed's
        ZeRO-3 parameter fetches): the thread's time inside the call is the wait bucket's and
        exposed communication, not the framework time around it (issue 20 item 9)."""
        if not async_op:
            return self.sync_call(fn, args, kwargs, unit, coll, nbytes)
        rec = self.rec
        t0 = rec.push(B_WAIT)
        try:
            work = fn(*args, **kwargs)
        finally:
            t1 = rec.remove(B_WAIT)
        return self.async_issue(work, unit, coll, nbytes, t0, t1)

    def arrive(self, unit: int, claim: tuple = ()) -> None:
        """The compute stream is about to need `unit`'s parameters (CudaTimer only)."""

    def ready(self, unit: int, kinds: tuple = ()) -> None:
        """The compute stream's wait for `unit` is over (CudaTimer only)."""

    def tail(self, kinds: tuple) -> None:
        """The end-of-backward wait on gradient reductions is over (CudaTimer only)."""

    def collect(self, step_end: bool = True) -> int:
        """Step end: host timings are recorded as they happen; nothing to read back."""
        return 0

    def sync_call(self, fn, args: tuple, kwargs: dict, unit: int, coll: int,
                  nbytes: int) -> Any:
        rec = self.rec
        phase = rec.phase
        t0 = rec.push(B_WAIT)  # the blocked span is exactly the "wait" bucket's
        try:
            return fn(*args, **kwargs)
        finally:
            t1 = rec.remove(B_WAIT)
            rec.add_comm(unit, phase, coll, nbytes, t1 - t0, t1 - t0, 0.0)

    def async_call3(self, fn, a, b, c, unit: int, coll: int, nbytes: int):
        """`call` of `fn(a, b, c, async_op=True)` without packing arguments."""
        t0 = perf_counter()
        return self.async_issue(fn(a, b, c, async_op=True), unit, coll, nbytes, t0)

    def async_issue(self, work, unit: int, coll: int, nbytes: int, t_issue: float,
                    t_called: float | None = None):
        """`work` issued at `t_issue`; `t_called`: when the call returned, if the thread was
        blocked in it (that span is exposed)."""
        if work is None:
            return None
        try:
            return TimedWork(work, self, unit, self.rec.phase, coll, nbytes, t_issue,
                             t_issue if t_called is None else t_called)
        except Exception as e:  # never break the job: hand back the original Work
            self.registry.error("comm.timed_work", e)
            return work


class TimedWork(dist.Work):
    """A `dist.Work` that measures exposure when the compute thread waits on it."""

    def __init__(self, inner, timer: HostTimer, unit: int, phase: int, coll: int,
                 nbytes: int, t_issue: float, t_called: float):
        super().__init__()
        self._inner = inner
        self._timer = timer
        # What wait() records, in one attribute (a Work subclass's attribute sets are slow);
        # t_called > t_issue: the thread was blocked in the call until then (exposed).
        self._what = (unit, phase, coll, nbytes, t_issue, t_called)
        self._t_done: float | None = None
        self._recorded = False
        if timer.callbacks:
            inner.get_future().add_done_callback(self._on_done)

    def _on_done(self, _fut) -> None:  # runs on the backend's thread
        self._t_done = perf_counter()

    def wait(self, timeout=None) -> bool:
        inner = self._inner
        if self._recorded:
            return inner.wait() if timeout is None else inner.wait(timeout)
        timer = self._timer
        rec = timer.rec
        if not timer.callbacks:
            done_before = inner.is_completed()
        t_wait = rec.push(B_WAIT)  # one clock read: the wait starts here
        t_cb = self._t_done
        if timer.callbacks:
            done_before = t_cb is not None and t_cb <= t_wait
        try:
            ok = inner.wait() if timeout is None else inner.wait(timeout)
        finally:
            t_ret = rec.remove(B_WAIT)
            self._recorded = True
            unit, phase, coll, nbytes, t_issue, t_called = self._what
            blocked = t_called - t_issue  # in the call itself: exposed (0 unless it blocked)
            if done_before:
                # Completed while the compute ran: hidden (but for a blocking call). Without
                # a callback the completion time is unknown, bounded by the wait's start.
                t_done = max(t_cb if t_cb is not None else t_wait, t_called)
                exposed, hidden = blocked, t_done - t_called
            else:
                # The compute thread blocked until the collective completed.
                t_done = t_ret
                exposed, hidden = blocked + t_ret - t_wait, t_wait - t_called
            rec.add_comm(unit, phase, coll, nbytes, t_done - t_issue, exposed, hidden)
        return ok

    # Everything else delegates to the real Work.
    def is_completed(self) -> bool:
        return self._inner.is_completed()

    def is_success(self) -> bool:
        return self._inner.is_success()

    def exception(self):
        return self._inner.exception()

    def get_future(self):
        return self._inner.get_future()

    def source_rank(self) -> int:
        return self._inner.source_rank()

    def result(self):
        return self._inner.result()

    def synchronize(self):
        return self._inner.synchronize()

    def abort(self):
        return self._inner.abort()
