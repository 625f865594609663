"""The GPU path: CUDA-event timing of collectives without host syncs, allocator statistics,
an OOM observer. Imported only when the model lives on a CUDA device.

Exposure on CUDA. FSDP issues all-gathers on its own stream; the compute stream waits on an
event. Per collective we record two pooled timing events on the stream current at the call
(issue, done), and on the compute stream one "wait point" event when a unit is about to need
its parameters (before FSDP's pre-forward / pre-backward hook). Then

    total   = done - issue
    exposed = max(0, done - wait_point)      (the compute stream had to wait)
    hidden  = total - exposed

The k-th all-gather of (unit, phase) in a step pairs with the k-th wait point of (unit,
phase). Nothing here synchronises: events are read back only when `query()` says the last
of them completed, at a later step end (numbers land in the step in which they were read,
typically one step late). Reduce-scatters have no wait point (FSDP waits on them at the
next unit's post-backward); they report total time, with exposed 0 unless a later wait is
measured.

Allocator statistics come from `torch.cuda.memory_stats()` (host-side counters, no sync);
peaks are reset per step with `reset_peak_memory_stats()`.
"""

from __future__ import annotations

import os
import warnings
from collections import defaultdict
from typing import Any

from .recorder import ALL_GATHER, Recorder


class EventPool:
    """Reuses timing events (creating CUDA events is not free)."""

    def __init__(self, factory):
        self._factory = factory
        self._free: list = []

    def get(self):
        return self._free.pop() if self._free else self._factory()

    def put(self, ev) -> None:
        self._free.append(ev)


class _Pending:
    __slots__ = ("unit", "phase", "coll", "nbytes", "e_issue", "e_done", "e_wait")

    def __init__(self, unit, phase, coll, nbytes, e_issue, e_done):
        self.unit, self.phase, self.coll, self.nbytes = unit, phase, coll, nbytes
        self.e_issue, self.e_done, self.e_wait = e_issue, e_done, None


class CudaTimer:
    """Same interface as `HostTimer`: call / sync_call, wait_point, collect."""

    def __init__(self, rec: Recorder, registry, event_factory=None, max_pending: int = 65536):
        if event_factory is None:
            import torch

            def event_factory():
                return torch.cuda.Event(enable_timing=True)
        self.rec = rec
        self.registry = registry
        self.pool = EventPool(event_factory)
        self.max_pending = max_pending
        self._unpaired_ag: dict[tuple[int, int], list[_Pending]] = defaultdict(list)
        self._unpaired_wait: dict[tuple[int, int], list] = defaultdict(list)
        self._ready: list[_Pending] = []  # complete tuples awaiting their events
        self.dropped = 0

    # --- called from the comm wrappers (current stream = the collective's stream) --------
    def sync_call(self, fn, args: tuple, kwargs: dict, unit: int, coll: int, nbytes: int):
        e0 = self.pool.get()
        e0.record()
        try:
            return fn(*args, **kwargs)
        finally:
            e1 = self.pool.get()
            e1.record()
            self._add(_Pending(unit, self.rec.phase, coll, nbytes, e0, e1))

    def call(self, fn, args: tuple, kwargs: dict, unit: int, coll: int, nbytes: int,
             async_op: bool):
        # Sync or async, NCCL runs the collective in the order of the stream current at the
        # call: events around the enqueue bracket it on that stream.
        return self.sync_call(fn, args, kwargs, unit, coll, nbytes)

    # --- called from the unit hooks on the compute stream -----------------------------------
    def wait_point(self, unit: int) -> None:
        ev = self.pool.get()
        ev.record()
        key = (unit, self.rec.phase)
        ags = self._unpaired_ag.get(key)
        if ags:
            p = ags.pop(0)
            p.e_wait = ev
            self._ready.append(p)
        else:
            self._unpaired_wait[key].append(ev)

    def _add(self, p: _Pending) -> None:
        if len(self._ready) >= self.max_pending:  # never grow without bound
            self.dropped += 1
            for ev in (p.e_issue, p.e_done):
                self.pool.put(ev)
            return
        if p.coll != ALL_GATHER:
            self._ready.append(p)
            return
        key = (p.unit, p.phase)
        waits = self._unpaired_wait.get(key)
        if waits:
            p.e_wait = waits.pop(0)
            self._ready.append(p)
        else:
            self._unpaired_ag[key].append(p)

    # --- at a step end: read back what the GPU has finished, never block --------------------
    def collect(self) -> int:
        """Fold finished collectives into the recorder; returns how many were read."""
        # Unpaired leftovers of the step: all-gathers nobody waited for count with exposed 0;
        # wait points with no all-gather (reshard_after_forward=False in backward) are dropped.
        for key, ags in self._unpaired_ag.items():
            self._ready.extend(ags)
        self._unpaired_ag.clear()
        for waits in self._unpaired_wait.values():
            for ev in waits:
                self._recycle_when_done(ev)
        self._unpaired_wait.clear()
        still: list[_Pending] = []
        n = 0
        for p in self._ready:
            last = p.e_done if p.e_wait is None else p.e_wait
            if not (p.e_done.query() and last.query()):
                still.append(p)
                continue
            total = p.e_issue.elapsed_time(p.e_done) / 1e3
            exposed = 0.0
            if p.e_wait is not None:
                exposed = max(0.0, min(total, p.e_wait.elapsed_time(p.e_done) / 1e3))
            self.rec.add_comm(p.unit, p.phase, p.coll, p.nbytes, total, exposed,
                              total - exposed)
            for ev in (p.e_issue, p.e_done, p.e_wait):
                if ev is not None:
                    self.pool.put(ev)
            n += 1
        self._ready = still
        return n

    def _recycle_when_done(self, ev) -> None:
        if ev.query():
            self.pool.put(ev)


def allocator_stats() -> dict[str, int]:
    """Per-device allocator populations (bytes) and counters, no device sync."""
    import torch

    st = torch.cuda.memory_stats()
    out = {
        "allocated": st.get("allocated_bytes.all.current", 0),
        "reserved": st.get("reserved_bytes.all.current", 0),
        "peak_allocated": st.get("allocated_bytes.all.peak", 0),
        "peak_reserved": st.get("reserved_bytes.all.peak", 0),
        "inactive_split": st.get("inactive_split_bytes.all.current", 0),
        "alloc_retries": st.get("num_alloc_retries", 0),
        "ooms": st.get("num_ooms", 0),
    }
    torch.cuda.reset_peak_memory_stats()
    return out


class OOMObserver:
    """Counts CUDA OOMs and (if asked) dumps a memory snapshot into the run directory.
    It observes only: the OutOfMemoryError still reaches the training code."""

    def __init__(self, run_dir: str, rank: int, registry, history: bool,
                 max_entries: int = 100_000):
        self.run_dir, self.rank, self.registry = run_dir, rank, registry
        self.count = 0
        self.history = False
        import torch

        if history:
            try:
                torch.cuda.memory._record_memory_history(max_entries=max_entries)
                self.history = True
                registry.ok("torch.cuda.memory._record_memory_history")
            except Exception as e:
                registry.missing("torch.cuda.memory._record_memory_history", repr(e))
        attach = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
        if attach is None:
            registry.missing("torch._C._cuda_attach_out_of_memory_observer", "not in this torch")
            return
        attach(self._on_oom)
        registry.ok("torch._C._cuda_attach_out_of_memory_observer")

    def _on_oom(self, device, alloc, device_allocated, device_free) -> None:
        self.count += 1
        if not self.history:
            return
        try:
            import torch

            path = os.path.join(self.run_dir, f"oom-rank{self.rank:05d}-{self.count}.pickle")
            torch.cuda.memory._dump_snapshot(path)
        except Exception as e:  # never in the way of the OOM itself
            self.registry.error("oom_snapshot", e)


def capacity_bytes(device: Any = None) -> int | None:
    try:
        import torch

        return int(torch.cuda.mem_get_info(device)[1])
    except Exception as e:
        warnings.warn(f"zerodoc: cannot read GPU capacity ({e})", stacklevel=2)
        return None
