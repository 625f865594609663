"""The GPU path: collectives timed on the device, exposure measured on the compute stream,
never a synchronisation. Imported only when the model lives on a CUDA device.

Where a collective runs (torch >= 2.8, ProcessGroupNCCL; see docs/gpus.md):
- ``async_op=False``: on the stream current at the call (FSDP2: its all-gather /
  reduce-scatter streams; FSDP1: its unshard / post-backward streams). Two pooled events
  recorded around the call on that stream bracket the kernel. (<= 2.7 ran it on the process
  group's stream and joined it back with a stream wait: the same events still bracket it.)
- ``async_op=True``: on the process group's internal stream, which first waits on the
  current stream. An event recorded after the call on the current stream completes at
  *enqueue* (that was zerodoc's bug before 0.2). The done event is recorded instead inside
  `work.get_future().then(cb)`: NCCL futures complete at enqueue, so the callback runs
  inline, on a pool stream that has been made to wait on the collective's end event. The
  issue event is on the current stream before the call.
NCCL runs the collectives of one communicator one after the other, whatever stream they were
issued on: queued behind an earlier collective of the same process group (a prefetched
all-gather behind the previous one, FSDP's all-gather behind a reduce-scatter of the same
group), the kernel starts only when that one ends; issued onto an idle stream, it starts only
when the host has launched it (the host launch gap after the issue event), which an event
recorded after the call on zerodoc's own idle side stream bounds from above. The duration is
therefore ``done - max(issue, done of the previous collective of that group, side)``.
An event on an idle stream completes when the host records it (plus the submission latency):
it is the host's clock read on the device's. So only one collective in `SIDE_EVERY` (and the
first after each step end) records a side event, the *calibration*; the others read the host
clock (`host_ms`) where theirs would have been recorded, and their ``side`` is that reading
plus the offset the calibration measured (its side event's device time less its host time,
submission latency included): two CUDA calls fewer per collective.
NCCL's own timing (`work._get_duration()`) is not used: reading it needs the `Work` object
after completion, and holding it pins the collective's output buffer (a unit's unsharded
parameters) until read-back.

Exposure is measured on the compute stream. The adapter marks a *window*: ``arrive`` where a
unit is about to need its parameters (before the framework's pre-forward / pre-backward /
fetch hook makes the stream wait) and ``ready`` where that wait is over (the unit's compute
starts). At ``ready`` the window takes every collective of that unit, phase and kind issued
and not yet claimed. Per collective, with events read back later:

    seconds = done - max(issue, done of the previous collective of the same group, side)
    exposed = done - arrive if arrive < done <= ready, else 0   (a cursor over the window's
              collectives in order of done, so overlapping ones are not counted twice; one
              that ended after `ready` was not waited for there)
    hidden  = seconds - exposed

Copy-out kernels FSDP2 runs on the compute stream after the wait (and the copy-in of the next
prefetch) are not exposed communication: they are the framework's device time. Gradient
reductions get windows where the compute stream waits for them (FSDP2's post-backward wait on
the previous reduce-scatter; the end-of-backward wait of FSDP2 / FSDP1 / DDP) and take every
unclaimed reduction of any unit. A collective never claimed by a window counts as hidden.

The windows' arrive / ready events are the device clock's marks (`devclock.py`): the switch
into the framework bucket and the switch into the unit's compute bucket. Nothing here
synchronises: events are read back only once `query()` says they completed, at a later step
end, in the step in which they are read.
"""

from __future__ import annotations

from .devclock import DeviceRecorder, EventPool, Mark, _first_incomplete, host_clock
from .recorder import ALL_GATHER, B_WAIT, Recorder

# One collective in this many records a side event (the host-to-device clock calibration);
# the others map a host clock reading with it (module docstring). Also the first after each
# step end, so that the offset used is at most a step old (clock drift: ppm).
SIDE_EVERY = 16


class _Coll:
    """One collective in flight. `e1` is a `Mark` (its event is held by the collective
    itself and, for the latest async collective of a process group, by its successor)."""

    __slots__ = ("unit", "phase", "coll", "nbytes", "e0", "e1", "group", "win", "seconds",
                 "prev", "ref", "side", "gap", "h", "cal", "off")

    def __init__(self, unit, phase, coll, nbytes, e0, group, ref):
        self.unit, self.phase, self.coll, self.nbytes = unit, phase, coll, nbytes
        self.e0, self.group = e0, group
        self.ref: Mark | None = ref  # the clock's mark before the issue (held): e0, e1 and
        # the side event are read as one elapsed time each from it
        self.side = None  # the launch bracket's event on the idle side stream (after the call)
        self.h: float | None = None  # host ms where `side` is (or would have been) recorded
        self.cal: _Coll | None = None  # the calibration whose offset maps `h` (no `side`)
        self.off: float | None = None  # a calibration's device - host ms, once read
        self.gap = 0.0  # seconds the bracket took off (the host launch gap)
        self.e1: Mark | None = None
        self.win: _Window | None = None
        self.seconds: float | None = None  # known once read back
        self.prev: _Coll | None = None  # the previous collective of the same process group


class _Window:
    """A span of the compute stream where it may have waited for `colls`."""

    __slots__ = ("arrive", "ready", "colls", "bucket")

    def __init__(self, arrive: Mark, ready: Mark, colls: list, bucket: int):
        self.arrive, self.ready, self.colls, self.bucket = arrive, ready, colls, bucket


def timing_event():
    """A CUDA event that records a timestamp (the factory of every pooled event)."""
    import torch

    return torch.cuda.Event(enable_timing=True)


def fast_record(registry=None):
    """`record(ev)`: record `ev` on the current stream, as `torch.cuda.Event.record()` does,
    without its Python: with no stream given it calls `torch.cuda.current_stream()`, which
    builds a new `Stream` object each time (device index lookup, Python constructor). The
    first H100 run recorded ~450 events per step at 21 units, on a launch-bound job where
    every host microsecond is step time. Here: one C call for the current stream's identity
    and one dict lookup for a cached `Stream`. Private hook points (hookpoints.py):
    `torch._C._cuda_getCurrentStream`, `torch._C._cuda_getDevice`,
    `torch._C._CudaEventBase.record`; missing, the event's own `record()` is used."""
    try:
        import torch

        cur = torch._C._cuda_getCurrentStream
        getdev = torch._C._cuda_getDevice
        base = torch._C._CudaEventBase.record
        Stream = torch.cuda.Stream
    except Exception as e:  # noqa: BLE001 - fail soft: the public path
        if registry is not None:
            registry.missing("torch._C._cuda_getCurrentStream/_CudaEventBase.record", repr(e))
        return None
    cache: dict = {}

    def record(ev) -> None:
        sd = cur(getdev())
        s = cache.get(sd)
        if s is None:
            if len(cache) > 1024:  # streams come from pools; bound it all the same
                cache.clear()
            s = cache[sd] = Stream(stream_id=sd[0], device_index=sd[1], device_type=sd[2])
        base(ev, s)

    return record  # reported only when missing, like every refinement (series budget)


def device_timing(n_units: int, registry, event_factory=None, record=None):
    """The GPU path's clock and timer for one monitor: a `DeviceRecorder` whose pooled
    events (`event_factory`, default `timing_event`) mark the bucket switches on the compute
    stream, and a `CudaTimer` that shares that pool. Events are recorded with `record`
    (default: `fast_record()` for real CUDA events, the event's own `record()` for others)."""
    if record is None and event_factory is None:
        record = fast_record(registry)
    rec = DeviceRecorder(n_units, EventPool(event_factory or timing_event, record))
    return rec, CudaTimer(rec, registry)


class CudaTimer:
    """The timer interface of `comm.HostTimer` (call / sync_call / arrive / ready / collect)
    on CUDA events. With a `DeviceRecorder` the windows use its switch marks."""

    device = True
    order = None  # collorder.CollOrder (comm.HostTimer.order)

    def __init__(self, rec: Recorder, registry, event_factory=None, max_pending: int = 65536,
                 stream_factory=None, host_ms=None):
        sim = getattr(event_factory, "__self__", None)
        if stream_factory is None:
            # real CUDA: torch.cuda.Stream; the stand-in's Sim has `Stream()` beside `Event()`
            stream_factory = _cuda_stream if event_factory is None else \
                getattr(sim, "Stream", None)
        # the host clock (ms) the side events calibrate: the stand-in's own for its events
        self._host_ms = host_ms or host_clock(event_factory)
        self._cal: _Coll | None = None  # the latest calibration (a side event on the timeline)
        self._n_side = 0  # collectives since it
        if event_factory is None:
            event_factory = timing_event
        self._stream_factory = stream_factory
        self._side = None  # the idle side stream of the launch bracket (made on first use)
        # (unit, phase, collective) -> seconds the bracket took off, read back so far: the
        # host launch gap the issue event alone would have counted (bench/gpu_check.py)
        self.launch_gap: dict[tuple[int, int, int], float] = {}
        self.rec = rec
        self.registry = registry
        self.pool: EventPool = rec.pool if isinstance(rec, DeviceRecorder) \
            else EventPool(event_factory)
        self._marked = isinstance(rec, DeviceRecorder)  # `rec.last_mark` exists
        self.max_pending = max_pending
        self._pending: list[_Coll] = []  # in issue order
        self._unclaimed: dict[tuple[int, int, int], list[_Coll]] = {}
        self._open: dict[tuple[int, int], tuple[Mark, list]] = {}  # windows not closed
        self._last: dict = {}  # group key -> last async _Coll issued on it
        self.dropped = 0
        self.async_fallbacks = 0

    # --- called from the comm wrappers ----------------------------------------------------
    def call(self, fn, args: tuple, kwargs: dict, unit: int, coll: int, nbytes: int,
             async_op: bool, group=None):
        """Run one collective `fn(*args, **kwargs)` and time it on the device."""
        pending = self._pending
        if len(pending) >= self.max_pending:  # the device stopped reading back
            self.dropped += 1
            return fn(*args, **kwargs)
        pool = self.pool
        free = pool._free  # EventPool.get, inlined (here and below: every collective)
        e0 = free.pop() if free else pool.get()
        pool.record(e0)
        out = fn(*args, **kwargs)
        rec = self.rec
        ref = rec.last_mark if self._marked else None  # _ref(), inlined
        if ref is not None:
            ref.holds += 1
        g = id(group) if group is not None else None
        c = _Coll(unit, rec.phase, coll, nbytes, e0, g, ref)
        last = self._last  # _chain(), inlined
        p = last.get(g)
        if p is not None and p.e1 is not None:
            c.prev = p  # takes over p.e1's successor hold
        last[g] = c
        if async_op and out is not None:
            try:
                out.get_future().then(lambda _f, _c=c: self.done(_c))
            except Exception as e:  # not a CUDA future: the current stream is all we have
                self.async_fallbacks += 1
                if self.registry is not None:
                    self.registry.missing("Work.get_future().then (async collective end)",
                                          repr(e))
        if c.e1 is None:
            self.done(c)  # sync (or the callback did not run inline): on the current stream
        pending.append(c)  # _add(), inlined
        key = (unit, c.phase, coll)
        lst = self._unclaimed.get(key)
        if lst is None:
            self._unclaimed[key] = [c]
        else:
            lst.append(c)
        return out

    def sync_call(self, fn, args: tuple, kwargs: dict, unit: int, coll: int, nbytes: int):
        return self.call(fn, args, kwargs, unit, coll, nbytes, False)

    def issue(self, unit: int, coll: int, nbytes: int, group=None) -> _Coll:
        """Start timing an async collective the caller issues itself right after; the caller
        calls `done(handle)` in its own `future.then(...)` callback (DDP's comm hook)."""
        e0 = self.pool.get()
        self.pool.record(e0)
        c = _Coll(unit, self.rec.phase, coll, nbytes, e0, _gkey(group), self._ref())
        self._chain(c)
        self._add(c)
        return c

    def _ref(self) -> Mark | None:
        m = getattr(self.rec, "last_mark", None)
        if m is not None:
            m.holds += 1
        return m

    def done(self, c: _Coll) -> None:
        """The collective's end, recorded on the current stream (inside a future callback:
        the pool stream that waited on the collective)."""
        if c.e1 is not None:
            return
        side = self._side
        if side is None and self._stream_factory is not None:
            side = self._side_stream()
        if side is not None:
            # The launch bracket: the call has returned, so the kernel was enqueued before
            # now: an event recorded now on a stream that runs nothing completes at about
            # the host's now, an upper bound of the kernel's launch. Recorded for the
            # calibrations only; the others read the host clock (module docstring).
            c.h = self._host_ms()
            cal = self._cal
            self._n_side += 1
            if cal is None or c.ref is None or self._n_side >= SIDE_EVERY:
                sev = self.pool.get()
                sev.record(side)
                c.side = sev
                if c.ref is not None:
                    self._cal, self._n_side = c, 0
            else:
                c.cal = cal
        pool = self.pool
        slots = pool._marks
        if slots:  # EventPool.mark(-1), inlined
            m = slots.pop()
            m.bucket = -1
            m.holds = 2 if self._last.get(c.group) is c else 1  # +1: the group's next one
            m.done = False
            m.t = None
        else:
            m = Mark(pool.get(), -1)
            if self._last.get(c.group) is c:
                m.holds = 2  # for the next collective of the group
        pool.record(m.ev)
        c.e1 = m

    def _side_stream(self):
        try:
            self._side = self._stream_factory()
        except Exception as e:  # noqa: BLE001 - fail soft: no bracket, the issue event only
            self._stream_factory = None
            if self.registry is not None:
                self.registry.missing("torch.cuda.Stream (launch bracket)", repr(e))
        return self._side

    def _chain(self, c: _Coll) -> None:
        p = self._last.get(c.group)
        if p is not None and p.e1 is not None:
            c.prev = p  # takes over p.e1's successor hold
        self._last[c.group] = c

    def _add(self, c: _Coll) -> None:
        self._pending.append(c)
        key = (c.unit, c.phase, c.coll)
        lst = self._unclaimed.get(key)
        if lst is None:
            self._unclaimed[key] = [c]
        else:
            lst.append(c)

    # --- called from the unit hooks, right after the recorder's switch --------------------
    def arrive(self, unit: int, claim: tuple[int, ...] = ()) -> None:
        """The compute stream is where `unit` needs what a collective brings (this phase):
        open its window. `claim`: kinds of collectives of *any* unit issued so far that the
        window is about (gradient reductions a post-backward or the end of backward waits
        for); otherwise `ready()` claims the unit's own."""
        m = self.rec.last_mark if self._marked else None
        if m is None:
            return
        key = (unit, self.rec.phase)
        old = self._open.pop(key, None)
        if old is not None:
            self._close(old[0], None, old[1])
        m.holds += 1
        colls: list[_Coll] = []
        if claim:
            for k in [k for k in self._unclaimed if k[2] in claim]:
                colls.extend(self._unclaimed.pop(k))
        self._open[key] = (m, colls)

    def ready(self, unit: int, kinds: tuple[int, ...] = (ALL_GATHER,)) -> None:
        """The wait of `unit` (this phase) is over: close its window, claiming the unit's
        own collectives of `kinds` issued so far (its all-gathers, prefetched or not)."""
        rec = self.rec
        opened = self._open.pop((unit, rec.phase), None)
        if opened is None:
            return
        arrive, colls = opened
        for kind in kinds:
            lst = self._unclaimed.pop((unit, rec.phase, kind), None)
            if lst:
                colls.extend(lst)
        ready = rec.last_mark if self._marked else None
        if ready is None or not colls:
            self._close(arrive, ready, colls)
            return
        ready.holds += 1  # _close(), inlined (a window to measure: most units, each phase)
        w = _Window(arrive, ready, colls, arrive.bucket)
        for c in colls:
            c.win = w

    def _close(self, arrive: Mark, ready: Mark | None, colls: list) -> None:
        if ready is None or not colls:
            arrive.release(self.pool)
            for c in colls:
                c.win = _HIDDEN  # claimed, but no span to measure a wait on
            return
        ready.holds += 1
        w = _Window(arrive, ready, colls, arrive.bucket)
        for c in colls:
            c.win = w

    def tail(self, kinds: tuple[int, ...]) -> None:
        """The end-of-backward wait on gradient reductions, from the last switch before now
        to a switch made now (call it from an autograd callback queued after the framework's
        own final callback, which is where the compute stream waits)."""
        rec = self.rec
        if getattr(rec, "last_mark", None) is None:
            return
        self.arrive(-1, claim=kinds)
        rec.push(B_WAIT)
        self.ready(-1, ())
        rec.leave_unmarked(B_WAIT)  # the wait's end is its start: one mark

    # --- at a step end: read back what the GPU has finished, never block -------------------
    def busy(self) -> bool:
        """Anything a step end's `collect()` would work on (a detail step's tail)."""
        marks = getattr(self.rec, "marks", ())
        return bool(self._pending or self._unclaimed or self._open or len(marks) > 1)

    def collect(self, step_end: bool = True) -> int:
        """Fold finished collectives into the recorder; returns how many were emitted."""
        rec = self.rec
        if isinstance(rec, DeviceRecorder):
            rec.collect()
        if step_end:
            self._cal = None  # the next step's first collective calibrates afresh
            # Collectives no window claimed by the end of their step never will be: hidden.
            for lst in self._unclaimed.values():
                for c in lst:
                    c.win = _HIDDEN
            self._unclaimed.clear()
            for arrive, colls in self._open.values():
                self._close(arrive, None, colls)
            self._open.clear()
        self._known_done()
        n = 0
        keep: list[_Coll] = []
        for c in self._pending:
            if c.seconds is None and not self._read(c):
                keep.append(c)
                continue
            w = c.win
            if w is _HIDDEN:
                self._emit(c, 0.0)
                n += 1
            elif w is None:
                keep.append(c)  # not claimed yet
            elif _all_read(w.colls) and (w.arrive.done or w.arrive.complete()) and \
                    (w.ready.done or w.ready.complete()):
                n += self._settle(w)
            else:
                keep.append(c)
        self._pending = [c for c in keep if c.e0 is not None]  # settled ones are emitted
        return n

    def _known_done(self) -> None:
        """Which done events completed, in about log2(n) queries per process group, not one
        each: NCCL runs the collectives of one communicator one after the other, so their
        done events complete in issue order (a binary search, as for the clock's marks). An
        event found not complete after all at its read (a done event on a busy pool stream)
        is read at a later step end."""
        chains: dict = {}
        for c in self._pending:
            e1 = c.e1
            if c.seconds is None and e1 is not None and not e1.done:
                lst = chains.get(c.group)
                if lst is None:
                    chains[c.group] = [e1]
                else:
                    lst.append(e1)
        for lst in chains.values():
            for i in range(_first_incomplete(lst, 0)):
                lst[i].done = True

    def _read(self, c: _Coll) -> bool:
        """Device duration of `c` once complete (read in issue order within a group):

            seconds = done - max(issue, done of the group's previous one, side)

        `issue` (before the call, on the stream the kernel runs after) is a lower bound of
        the kernel's start; `side` (after the call, on the idle side stream) bounds its
        launch from above. A kernel queued behind work on its stream starts at `issue` or
        at the previous collective's end (the host was ahead: `side` is earlier); one issued
        onto an idle stream starts at its launch, up to `side`: the host launch gap between
        `issue` and the launch is not the collective's (kept in `launch_gap`). Each event
        is one `elapsed_time` from the clock's mark before the issue (`ref`)."""
        e1 = c.e1
        # `e0` needs no query of its own: it was recorded before the collective on the
        # stream the collective (sync) or the process group's stream (async: it waits on that
        # stream first) runs after, and `e1` after its end: `e1` complete implies `e0`.
        p = c.prev
        if p is not None and p.seconds is None:  # its group's previous one first (no query)
            return False
        if e1 is None or not (e1.done or e1.complete()):
            return False
        try:
            return self._read_done(c, e1, p)
        except Exception as e:  # noqa: BLE001 - completed out of order: not ready yet
            if not _not_ready(e):
                raise
            e1.done = False
            return False

    def _read_done(self, c: _Coll, e1: Mark, p: _Coll | None) -> bool:
        ref = c.ref
        pt = p.e1.t if p is not None else None
        cal = c.cal
        if cal is not None and cal.off is None and cal.seconds is None:
            return False  # its calibration is read first (it may complete later)
        if ref is not None and ref.t is not None and (p is None or pt is not None):
            el = ref.ev.elapsed_time
            base = ref.t
            t1 = base + el(e1.ev)
            start = base + el(c.e0)
            if pt is not None and pt > start:
                start = pt
            old = t1 - start
            ts = None
            if c.side is not None:
                ts = base + el(c.side)
                if c.h is not None:
                    c.off = ts - c.h
                    if isinstance(self.rec, DeviceRecorder):
                        self.rec.dev_off = c.off  # the launch probe's clock (devclock.py)
            elif cal is not None and cal.off is not None:
                ts = c.h + cal.off
            if ts is not None and ts > start:
                start = ts
            ms = t1 - start
            e1.t = t1
        elif ref is not None and ref.t is None and not ref.done:
            return False  # its mark is read back first (a later step end)
        else:  # no mark on the timeline (marks off, or the previous one read without)
            ms = old = c.e0.elapsed_time(e1.ev)
            if p is not None:
                old = ms = min(ms, p.e1.ev.elapsed_time(e1.ev))
            if c.side is not None:
                ms = min(ms, c.side.elapsed_time(e1.ev))
        if p is not None:
            m = p.e1  # its successor hold: Mark.release, inlined
            m.holds -= 1
            if m.holds == 0:
                self.pool._marks.append(m)
            c.prev = None
        c.seconds = max(0.0, ms) / 1e3
        c.gap = max(0.0, old - ms) / 1e3
        c.cal = None
        return True

    def _settle(self, w: _Window) -> int:
        """Exposure of the window's collectives (module docstring), then emit them."""
        a = w.arrive
        r = w.ready
        colls = w.colls
        if len(colls) == 1 and a.t is not None and r.t is not None \
                and colls[0].e1.t is not None:
            # one collective (most windows: a unit's all-gather): no sort, no cursor
            c = colls[0]
            end = c.e1.t - a.t
            if end < 0.0:
                end = 0.0
            span = r.t - a.t
            exposed = 0.0
            if end <= span:
                exposed = min(end / 1e3, c.seconds)
            self._emit(c, exposed)
            if exposed:
                self._charge_wait(w, exposed)
            slots = self.pool._marks  # Mark.release (a, r), inlined
            a.holds -= 1
            if a.holds == 0:
                slots.append(a)
            r.holds -= 1
            if r.holds == 0:
                slots.append(r)
            return 1
        if a.t is not None and r.t is not None and all(c.e1.t is not None for c in w.colls):
            t0 = a.t  # all on the clock's timeline: no read of their own
            span = max(0.0, r.t - t0) / 1e3
            ends = sorted((max(0.0, c.e1.t - t0) / 1e3, i, c) for i, c in enumerate(w.colls))
        else:
            arrive = a.ev
            span = max(0.0, arrive.elapsed_time(r.ev) / 1e3)
            ends = sorted((max(0.0, arrive.elapsed_time(c.e1.ev) / 1e3), i, c)
                          for i, c in enumerate(w.colls))
        cursor = total = 0.0
        for end, _i, c in ends:
            exposed = 0.0
            if end <= span:  # ended after `ready`: the stream went on without it
                exposed = min(max(0.0, end - cursor), c.seconds)
                cursor = max(cursor, end)
            total += exposed
            self._emit(c, exposed)
        self._charge_wait(w, total)
        a.release(self.pool)
        r.release(self.pool)
        return len(ends)

    def _charge_wait(self, w: _Window, total: float) -> None:
        rec = self.rec
        if total and w.bucket >= 0 and isinstance(rec, DeviceRecorder):
            # On the device clock the stall sat in the window's bucket: it was a wait.
            rec.dev_acc[w.bucket] -= total
            rec.dev_acc[B_WAIT] += total

    def _emit(self, c: _Coll, exposed: float) -> None:
        s = c.seconds or 0.0
        key = (c.unit, c.phase, c.coll)
        comm = self.rec.comm  # Recorder.add_comm, inlined (every collective)
        a = comm.get(key)
        if a is None:
            comm[key] = [1, c.nbytes, s, exposed, s - exposed]
        else:
            a[0] += 1
            a[1] += c.nbytes
            a[2] += s
            a[3] += exposed
            a[4] += s - exposed
        if c.gap:
            self.launch_gap[key] = self.launch_gap.get(key, 0.0) + c.gap
        pool = self.pool
        free = pool._free
        free.append(c.e0)  # EventPool.put, inlined
        c.e0 = None
        if c.side is not None:
            free.append(c.side)
            c.side = None
        slots = pool._marks
        m = c.ref
        if m is not None:  # Mark.release, inlined
            m.holds -= 1
            if m.holds == 0:
                slots.append(m)
            c.ref = None
        c.win = None
        m = c.e1
        m.holds -= 1
        if m.holds == 0:
            slots.append(m)


_HIDDEN = _Window(None, None, [], -1)  # type: ignore[arg-type]


def _all_read(colls: list) -> bool:
    for x in colls:
        if x.seconds is None:
            return False
    return True


def _not_ready(e: Exception) -> bool:
    """`elapsed_time` on an event not complete yet (CUDA: cudaErrorNotReady; the stand-in:
    NotReady)."""
    return type(e).__name__ == "NotReady" or "not ready" in str(e).lower() or \
        "must be completed" in str(e)


def _cuda_stream():
    import torch

    return torch.cuda.Stream()


def _gkey(group):
    return id(group) if group is not None else None
