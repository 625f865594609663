"""A simulated slow link: collectives that complete a fixed delay late.

This layer sits *beneath* the measuring comm objects (it wraps FSDP's own comm), so the
measurement knows nothing about it and has to find the delay the way it would find a real
slow link. Synchronous collectives return `delay_s` later; asynchronous ones hand back a
`DelayedWork` whose future completes `delay_s` after the real collective did (a timer
thread sets it), and whose `wait()` blocks until then. Used by tests, benchmarks and the
demo's `--slow-link-ms`; never on by default.
"""

from __future__ import annotations

import threading
import time

import torch
import torch.distributed as dist


class DelayedWork(dist.Work):
    def __init__(self, inner, delay_s: float):
        super().__init__()
        self._inner = inner
        self._delay_s = delay_s
        self._done = threading.Event()
        self._fut: torch.futures.Future = torch.futures.Future()
        inner.get_future().add_done_callback(self._on_inner_done)

    def _on_inner_done(self, fut) -> None:
        def finish():
            self._done.set()
            try:
                self._fut.set_result(fut.value())
            except Exception as e:  # the real collective failed: pass it on
                self._fut.set_exception(e)
        threading.Timer(self._delay_s, finish).start()

    def wait(self, timeout=None) -> bool:
        ok = self._inner.wait() if timeout is None else self._inner.wait(timeout)
        self._done.wait()
        return ok

    def is_completed(self) -> bool:
        return self._done.is_set()

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
            time.sleep(self.delay_s)
            return work
        return DelayedWork(work, self.delay_s)
