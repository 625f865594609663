"""The device clock: the bucket clock of `recorder.py` mirrored on the GPU's compute stream.

On CUDA the host runs ahead of the device, so the host bucket clock measures how long the
work took to *launch*. `DeviceRecorder` keeps that host clock (it is the "host launch time")
and, at every bucket switch, also records a pooled CUDA event on the stream current at the
switch (the compute stream). The device time between two consecutive switch events belongs
to the bucket that was on top in between: per unit and phase, that is the unit's compute as
the device ran it (idle time of the stream inside the span included: a device waiting for the
host is the launch-bound signature, see below).

Events are read back lazily by `DeviceClock.collect()` at a step end: only those already
complete (`query()`), in order, never a synchronisation. Numbers land in the step in which
they were read, typically one step late.

Launch-bound signal. When a unit's compute segment ends (the host has launched it all), we
ask whether the event that started the segment (one segment in `LAUNCH_EVERY`, rotating) was
complete: complete means the device had already begun
the segment while the host was still launching it, i.e. the device was keeping pace with the
host, not the other way round. Once the collective timer has calibrated the host clock on the
device's (`dev_off`, cuda.py's launch bracket) that needs no CUDA call: the host time of the
segment's end is kept and compared at read-back with the start mark's device time (complete
then iff its time <= that host time + `dev_off`); before that, a `query()`. The fraction of segments where that held ("caught up"), with
host launch time close to device time, is what rule ZD014 reads.

Marks are shared with the collective timer (`cuda.CudaTimer`): the switch that starts a
unit's pre-hook window is its "arrive" event, the one that starts its compute is "ready".
A mark's event returns to the pool only when the clock and every window holding it are done.
"""

from __future__ import annotations

from time import perf_counter

from .recorder import _FIRST_UNIT_BUCKET, Recorder

# The launch-bound probe queries the start of one unit segment in this many (a sample of the
# segments, rotating over the units: the fraction is what ZD014 reads, not each segment).
LAUNCH_EVERY = 4


def _plain_record(ev) -> None:
    ev.record()


def _perf_ms() -> float:
    return perf_counter() * 1e3


def host_clock(event_factory):
    """The host clock (ms) on which an event recorded on an idle stream lands, offset aside:
    the CUDA stand-in's own (`Sim.host_ms`) for its events, else `perf_counter`."""
    return getattr(getattr(event_factory, "__self__", None), "host_ms", None) or _perf_ms


class EventPool:
    """Reuses timing events (creating CUDA events is not free). `record(ev)` records one on
    the current stream: `cuda.fast_record()` on a GPU, the event's own `record()` otherwise.

    Marks are slots too: `mark(bucket)` records a `Mark` taken from `_marks` (each keeps its
    event for good), and a mark whose last holder let go goes back there, not to the event
    list: a detail step allocates no Python object per switch or collective end once the
    pool has grown to the most marks in flight (issue 19 item 3; the garbage collector ran
    over ~230 new marks per detail step at 21 units)."""

    __slots__ = ("_factory", "_free", "_marks", "created", "record")

    def __init__(self, factory, record=None):
        self._factory = factory
        self._free: list = []
        self._marks: list = []  # released Marks, their events with them
        self.created = 0
        self.record = record or _plain_record

    def mark(self, bucket: int) -> "Mark":
        """A mark (from the slots, else a new one), its event recorded on the current
        stream."""
        marks = self._marks
        if marks:
            m = marks.pop()
            m.bucket = bucket
            m.holds = 1
            m.done = False
            m.t = None
        else:
            m = Mark(self.get(), bucket)
        self.record(m.ev)
        return m

    def get(self):
        if self._free:
            return self._free.pop()
        self.created += 1
        return self._factory()

    def put(self, ev) -> None:
        self._free.append(ev)


class Mark:
    """One recorded switch: the event, the bucket on top after it, its holders, whether
    the read-back found it complete (`done`: later readers need no `query()` of their own)
    and its time on the clock's timeline (`t`, ms; set by the read-back: other events are
    read as one `elapsed_time` from a nearby mark, intervals are differences of `t`)."""

    __slots__ = ("ev", "bucket", "holds", "done", "t")

    def __init__(self, ev, bucket: int):
        self.ev, self.bucket, self.holds = ev, bucket, 1
        self.done = False
        self.t: float | None = None

    def complete(self) -> bool:
        """Complete on the device: known from the read-back, else one `query()`."""
        if not self.done:
            self.done = bool(self.ev.query())
        return self.done

    def release(self, pool: EventPool) -> None:
        self.holds -= 1
        if self.holds == 0:  # back to the slots (once: a stray extra release is ignored)
            pool._marks.append(self)


def _first_incomplete(marks: list, lo: int) -> int:
    """Index of the first mark from `lo` whose event is not complete. Events of one stream
    complete in order, so a binary search needs about log2(n) queries, not n."""
    hi = len(marks)
    if hi <= lo or marks[hi - 1].ev.query():
        return hi
    # invariant: marks[lo-1] complete (or lo is the start), marks[hi-1] not complete
    while lo < hi - 1:
        mid = (lo + hi - 1) // 2
        if marks[mid].ev.query():
            lo = mid + 1
        else:
            hi = mid + 1
    return lo if not marks[lo].ev.query() else lo + 1


class DeviceRecorder(Recorder):
    """A `Recorder` whose bucket switches are also CUDA events on the current stream."""

    def __init__(self, n_units: int, pool: EventPool):
        super().__init__(n_units)
        self.pool = pool
        self.marks: list[Mark] = []
        self.last_mark: Mark | None = None
        self.dev_acc = [0.0] * len(self.acc)  # device seconds read back since the last take
        self.launch_checks = 0
        self.launch_caught_up = 0
        self._seg_start: Mark | None = None  # mark that started the checked unit segment
        self._seg_n = LAUNCH_EVERY - 1  # unit segments since the last checked one
        self.max_marks = 1 << 16
        self.dropped_marks = 0
        self.host_ms = host_clock(pool._factory)
        self.dev_off: float | None = None  # device - host ms (the collective timer's calibration)
        self._probes: list = []  # (segment start mark, host ms at its end): read back later
        self.on = True  # marks only on detail steps (sampler.py); host clock always

    # --- tiers: marks on detail steps only -----------------------------------------------
    def pause(self) -> None:
        """Stop marking (the end of a detail step): the device time after the last mark is
        charged to no bucket, up to the first mark of the next detail step."""
        if not self.on:
            return
        self.on = False
        seg = self._seg_start
        if seg is not None:
            self._seg_start = None
            seg.release(self.pool)
        if self.marks:
            self.marks[-1].bucket = -1  # ends the chain: collect() charges nothing after it
        self.last_mark = None

    def resume(self) -> None:
        """Start marking again (a detail step begins): one mark opens the chain."""
        if self.on:
            return
        self.on = True
        self._mark()

    # --- the hot path ------------------------------------------------------------------
    def _mark(self) -> None:
        if not self.on:
            return
        top = self.stack[-1]
        seg = self._seg_start
        if seg is not None and seg.bucket != top:
            # A unit's compute segment ends: was the device already running it?
            self._seg_start = None
            if self.dev_off is not None and len(self._probes) < 4096:
                self._probes.append((seg, self.host_ms()))  # compared at read-back
            else:
                self.launch_checks += 1
                if seg.ev.query():
                    self.launch_caught_up += 1
                seg.release(self.pool)
        marks = self.marks
        if len(marks) >= self.max_marks:  # the device stopped reading back: bound it
            self.dropped_marks += 1
            self.last_mark = None
            return
        pool = self.pool
        slots = pool._marks
        if slots:  # EventPool.mark, inlined (every switch of a detail step)
            m = slots.pop()
            m.bucket = top
            m.holds = 1
            m.done = False
            m.t = None
        else:
            m = Mark(pool.get(), top)
        pool.record(m.ev)
        marks.append(m)
        self.last_mark = m
        if _FIRST_UNIT_BUCKET <= top < self.fw_first:  # a unit's compute (not its framework)
            self._seg_n += 1
            if self._seg_n >= LAUNCH_EVERY:  # one segment in LAUNCH_EVERY is checked
                self._seg_n = 0
                m.holds += 1  # held until the segment ends (its event is queried then)
                self._seg_start = m

    # The host clock's switches (`Recorder`'s, the same code inlined: one call per hook
    # instead of two) followed by a mark.
    def push(self, bucket: int) -> float:
        now = perf_counter()
        stack = self.stack
        self.acc[stack[-1]] += now - self.last
        self.last = now
        stack.append(bucket)
        if self.on:
            self._mark()
        return now

    def remove(self, bucket: int) -> float:
        top = self.stack[-1]
        now = Recorder.remove(self, bucket)
        if self.on and (self.stack[-1] != top or top == bucket):
            self._mark()
        return now

    def switch(self, old: int, new: int) -> None:
        # Recorder.switch inlined, then the mark (every bucket switch of a detail step: a
        # call to the base method here was one Python frame per switch); keep the two alike
        now = perf_counter()
        stack = self.stack
        top = stack[-1]
        self.acc[top] += now - self.last
        self.last = now
        if top == old and len(stack) > 1:
            stack[-1] = new
        else:
            Recorder._switch_search(stack, old, new)
        if self.on:
            self._mark()

    def leave_unmarked(self, bucket: int) -> float:
        """`remove(bucket)` right after the push that entered it, nothing launched between
        (zerodoc's own code): no mark, the push's mark starts the new top's interval (the
        two events would have been recorded back to back on the stream: one suffices)."""
        now = Recorder.remove(self, bucket)
        m = self.last_mark
        if m is not None and self.on:
            m.bucket = self.stack[-1]
        return now

    # --- read-back (step end) -------------------------------------------------------------
    def collect(self) -> int:
        """Charge the device time between completed marks to their buckets; returns how
        many intervals were read. The last completed mark stays as the next interval's start."""
        marks = self.marks
        if len(marks) < 2:
            return 0
        k = _first_incomplete(marks, 0)  # marks[:k] complete
        if k < 2:
            return 0
        acc, slots = self.dev_acc, self.pool._marks
        prev = marks[0]
        prev.done = True
        t = prev.t
        if t is None:
            t = prev.t = 0.0  # the timeline's origin: the first mark ever read
        for i in range(1, k):
            m = marks[i]
            m.done = True  # the windows holding it read that instead of querying
            dt = prev.ev.elapsed_time(m.ev)
            t += dt
            m.t = t  # one read per mark: the windows and collectives use `t`
            if prev.bucket >= 0:  # -1: the end of a detail step's chain (pause())
                acc[prev.bucket] += dt / 1e3
            prev.holds -= 1  # Mark.release, inlined (one per mark)
            if prev.holds == 0:
                slots.append(prev)
            prev = m
        del marks[: k - 1]
        if self._probes:
            self._probe()
        return k - 1

    def _probe(self) -> None:
        """The launch probes whose start mark is on the timeline now: complete at the
        segment's end iff its device time <= that host time on the device's clock."""
        off, pool, keep = self.dev_off, self.pool, []
        checks = caught = 0
        for seg, h in self._probes:
            if seg.t is None:
                keep.append((seg, h))
                continue
            checks += 1
            caught += seg.t <= h + off
            seg.release(pool)
        self._probes[:] = keep
        self.launch_checks += checks
        self.launch_caught_up += caught

    def take_device(self) -> tuple[list[float], int, int]:
        """Device seconds per bucket and launch checks read since the last take."""
        acc = self.dev_acc
        self.dev_acc = [0.0] * len(acc)
        checks, caught = self.launch_checks, self.launch_caught_up
        self.launch_checks = self.launch_caught_up = 0
        return acc, checks, caught
