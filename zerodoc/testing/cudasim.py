"""A CPU stand-in for CUDA streams, events and NCCL that keeps their real semantics.

What it models (the facts zerodoc's GPU path relies on, from PyTorch's / NCCL's sources):
- a device clock and a host clock (ms). The host advances by `launch_ms` per enqueued op
  and by explicit `host(ms)`; the device runs each stream's ops in order, as early as
  possible: an op starts at max(end of the stream's previous op, the moment the host
  enqueued it, the time of the event it waits on);
- streams with ordered queues, many at once (they run concurrently); `wait_stream` /
  `wait_event` (an event never recorded is a no-op wait, as in CUDA);
- events that complete when their stream reaches them: `query()` is true once the device
  time of the record is <= the host clock; `elapsed_time()` raises unless both completed;
  `synchronize()` (counted) moves the host clock forward to the event;
- NCCL (torch >= 2.8): ``async_op=False`` runs the kernel on the *current* stream and returns
  None; ``async_op=True`` makes the process group's internal stream wait on the current
  stream, runs the kernel there and returns a Work whose future completes at enqueue;
  `Work.wait()` makes the current stream wait on the kernel's end; `future.then(cb)` runs
  `cb` inline on a pool stream that first waits on the kernel's end. ``legacy=True``: torch
  <= 2.7, where sync ops also ran on the internal stream and were joined back with a wait.

Every op is logged (`ops`): stream, kind, label, start, end; and every wait that held a
stream back is logged with the time it held it (`stalls`). That log is the witness the tests
compare zerodoc with, the way the profiler's kernel trace is on a GPU.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field


class NotReady(RuntimeError):
    pass


@dataclass
class Op:
    stream: str
    kind: str  # kernel | record | wait
    label: str
    start: float
    end: float


class Sim:
    def __init__(self, launch_ms: float = 0.001):
        self.host_now = 0.0
        self.launch_ms = launch_ms
        self.default = SimStream(self, "compute")
        self.current = self.default
        self.ops: list[Op] = []
        self.stalls: list[tuple[str, str, float, float]] = []  # stream, label, from, to
        self.syncs: list[str] = []
        self._pool = [SimStream(self, f"pool{i}") for i in range(2)]
        self._pool_i = 0

    # --- host side ---------------------------------------------------------------------
    def host(self, ms: float) -> None:
        self.host_now += ms

    def host_ms(self) -> float:
        """The host clock (ms): where an event recorded now on an idle stream lands."""
        return self.host_now

    def _enqueue(self) -> float:
        t = self.host_now
        self.host_now += self.launch_ms
        return t

    @contextlib.contextmanager
    def stream(self, s: "SimStream"):
        prev, self.current = self.current, s
        try:
            yield s
        finally:
            self.current = prev

    def Event(self, enable_timing: bool = True) -> "SimEvent":  # noqa: N802 (torch's name)
        return SimEvent(self)

    def Stream(self) -> "SimStream":  # noqa: N802 (torch.cuda.Stream's name)
        """A new stream (zerodoc's side stream: idle, only events are recorded on it)."""
        return SimStream(self, f"side{len(self._streams())}")

    def pool_stream(self) -> "SimStream":
        s = self._pool[self._pool_i % len(self._pool)]
        self._pool_i += 1
        return s

    def kernel(self, ms: float, label: str = "", stream: "SimStream | None" = None) -> None:
        (stream or self.current).kernel(ms, label)

    def drain(self) -> None:
        """The host waits for the device (a test's own synchronisation, not zerodoc's)."""
        ends = [s.tail for s in self._streams()]
        self.host_now = max([self.host_now, *ends])

    def _streams(self):
        seen = {id(self.default): self.default}
        for op_s in getattr(self, "_all_streams", []):
            seen[id(op_s)] = op_s
        return list(seen.values())

    def busy(self, stream: str, label_prefix: str) -> float:
        """Device time of kernels on `stream` whose label starts with `label_prefix`."""
        return sum(o.end - o.start for o in self.ops if o.stream == stream
                   and o.kind == "kernel" and o.label.startswith(label_prefix))

    def stalled(self, stream: str, label: str) -> float:
        """Time `stream` stood still in waits labelled `label`."""
        return sum(b - a for s, lab, a, b in self.stalls if s == stream and lab == label)

    def stalled_during(self, stream: str, label: str) -> float:
        """Time `stream` stood still in waits labelled `label` *while* a kernel labelled
        `label` ran (on any stream): the part of that collective the stream waited for."""
        kernels = [(o.start, o.end) for o in self.ops if o.kind == "kernel" and o.label == label]
        total = 0.0
        for s, lab, a, b in self.stalls:
            if s != stream or lab != label:
                continue
            for k0, k1 in kernels:
                total += max(0.0, min(b, k1) - max(a, k0))
        return total


class SimStream:
    def __init__(self, sim: Sim, name: str):
        self.sim, self.name = sim, name
        self.tail = 0.0
        sim.__dict__.setdefault("_all_streams", []).append(self)

    def kernel(self, ms: float, label: str = "") -> None:
        t = self.sim._enqueue()
        start = max(self.tail, t)
        self.tail = start + ms
        self.sim.ops.append(Op(self.name, "kernel", label, start, self.tail))

    def wait_event(self, ev: "SimEvent", label: str = "") -> None:
        t = self.sim._enqueue()
        if ev.t is None:  # never recorded: no-op, as in CUDA
            return
        ready = max(self.tail, t)
        if ev.t > ready:
            self.sim.stalls.append((self.name, label, ready, ev.t))
        self.tail = max(ready, ev.t)
        self.sim.ops.append(Op(self.name, "wait", label, ready, self.tail))

    def wait_stream(self, other: "SimStream", label: str = "") -> None:
        ev = SimEvent(self.sim)
        ev.record(other)
        self.wait_event(ev, label)

    def record_event(self) -> "SimEvent":
        ev = SimEvent(self.sim)
        ev.record(self)
        return ev

    def synchronize(self) -> None:
        self.sim.syncs.append(f"Stream.synchronize({self.name})")
        self.sim.host_now = max(self.sim.host_now, self.tail)


class SimEvent:
    created = 0

    def __init__(self, sim: Sim):
        self.sim = sim
        self.t: float | None = None
        SimEvent.created += 1

    def record(self, stream: SimStream | None = None) -> "SimEvent":
        s = stream or self.sim.current
        t = self.sim._enqueue()
        s.tail = max(s.tail, t)
        self.t = s.tail
        return self

    def query(self) -> bool:
        return self.t is not None and self.t <= self.sim.host_now

    def elapsed_time(self, end: "SimEvent") -> float:
        if not (self.query() and end.query()):
            raise NotReady("Both events must be completed before calculating elapsed time.")
        return end.t - self.t

    def synchronize(self) -> None:
        self.sim.syncs.append("Event.synchronize")
        if self.t is not None:
            self.sim.host_now = max(self.sim.host_now, self.t)

    def wait(self, stream: SimStream | None = None) -> None:
        (stream or self.sim.current).wait_event(self)


# --- NCCL -----------------------------------------------------------------------------------


class SimFuture:
    """A CUDA future: complete at enqueue; its event marks the collective's end."""

    def __init__(self, sim: Sim, ev: SimEvent, value=None, label: str = ""):
        self.sim, self.ev, self._value, self.label = sim, ev, value, label

    def done(self) -> bool:
        return True  # "only whether the operation has been enqueued"

    def value(self):
        return self._value

    def wait(self):
        self.sim.current.wait_event(self.ev, self.label)
        return self._value

    def then(self, cb) -> "SimFuture":
        pool = self.sim.pool_stream()
        pool.wait_event(self.ev, "then")
        with self.sim.stream(pool):
            out = cb(self)
            ev = pool.record_event()
        return SimFuture(self.sim, ev, out, self.label)


class SimWork:
    def __init__(self, sim: Sim, end: SimEvent, value=None, label: str = ""):
        self.sim, self.end, self._value, self.label = sim, end, value, label

    def wait(self, timeout=None) -> bool:
        self.sim.current.wait_event(self.end, self.label)
        return True

    def is_completed(self) -> bool:
        return self.end.query()

    def get_future(self) -> SimFuture:
        return SimFuture(self.sim, self.end, [self._value], self.label)


@dataclass
class SimPG:
    """A process group: its internal stream, and the link's time per collective."""

    sim: Sim
    name: str = "pg"
    legacy: bool = False  # torch <= 2.7: sync ops on the internal stream too
    # The host launch gap: host time inside the call before the kernel is enqueued (Python,
    # ProcessGroupNCCL's checks; 50-140 us per call on the first H100 runs). On an idle
    # stream the kernel starts that much after an event recorded before the call.
    launch_gap_ms: float = 0.0
    stream: SimStream = field(init=False)

    def __post_init__(self):
        self.stream = SimStream(self.sim, f"nccl:{self.name}")
        self.last: SimEvent | None = None

    def collective(self, ms: float, label: str, async_op: bool, value=None):
        """One collective; NCCL runs those of one communicator one after the other,
        whatever stream they were issued on."""
        sim = self.sim
        if self.launch_gap_ms:
            sim.host(self.launch_gap_ms)
        if not async_op and not self.legacy:
            s = sim.current
            if self.last is not None:
                s.wait_event(self.last, "nccl.comm-order")
            s.kernel(ms, label)
            self.last = s.record_event()
            return None
        issuing = sim.current
        self.stream.wait_stream(issuing, "nccl.syncStream")
        if self.last is not None:
            self.stream.wait_event(self.last, "nccl.comm-order")
        self.stream.kernel(ms, label)
        end = self.stream.record_event()
        self.last = end
        work = SimWork(sim, end, value, label)
        if not async_op:  # legacy sync op: joined back to the current stream, no Work
            work.wait()
            return None
        return work


class SimComm:
    """An FSDP2-style comm object (AllGather / ReduceScatter protocol) on a SimPG; each call
    takes `ms` on the link and is labelled `label()` (unit and phase) in the op log."""

    def __init__(self, pg: SimPG, ms: float, label):
        self.pg, self.ms, self.label = pg, ms, label

    def allocate(self, size, *, dtype, device):
        import torch

        return torch.empty(size, dtype=dtype, device=device)

    def __call__(self, output_tensor=None, input_tensor=None, group=None, *args,
                 async_op=False, **kw):
        return self.pg.collective(self.ms, self.label(), async_op, output_tensor)
