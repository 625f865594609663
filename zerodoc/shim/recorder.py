"""Per-step accumulators and the host clock: the shim's hot path.

The training thread's time is partitioned into buckets. Hooks push and remove buckets on a
small stack; every switch charges the time since the last switch to the bucket on top. So
each sharded unit gets its *own* compute time (children units excluded), collective waits
are kept apart (exposed time), and whatever is left (data, loss) lands in "other".

The framework's own time (its pre/post hooks: copy-in / copy-out, gradient copies, the
prefetch of a unit) is charged per unit and phase too, to the unit's framework bucket
(`Recorder.framework_bucket`); "framework" (one bucket, `B_FRAMEWORK`) keeps what belongs to
no unit (a framework's gradient-bucket work, a param group of no unit's). The step's
framework time is the sum of both (`Monitor._fold`).

Collectives are recorded by `add_comm()` into a dict keyed (unit, phase, collective).
Nothing here blocks, synchronises a device, or allocates per call beyond a dict entry
created on first use.
"""

from __future__ import annotations

from time import perf_counter

# The names are the metric catalog's (defined once there); the indices follow their order.
from ..catalog import COLLECTIVES, PHASES  # noqa: F401  (re-exported: the shim's users)

FORWARD, BACKWARD, OPTIMIZER = 0, 1, 2
ALL_GATHER, REDUCE_SCATTER, ALL_REDUCE, BROADCAST = 0, 1, 2, 3

B_OTHER, B_FRAMEWORK, B_WAIT, B_OPTIMIZER = 0, 1, 2, 3
_FIRST_UNIT_BUCKET = 4


def unit_bucket(unit: int, phase: int) -> int:
    """The bucket of a unit's compute in a phase."""
    return _FIRST_UNIT_BUCKET + unit * 3 + phase


def bucket_unit(bucket: int, n_units: int) -> tuple[int, int, bool] | None:
    """(unit, phase, framework?) of a per-unit bucket; None for a step-level one."""
    if bucket < _FIRST_UNIT_BUCKET:
        return None
    i = bucket - _FIRST_UNIT_BUCKET
    fw = i >= 3 * n_units
    if fw:
        i -= 3 * n_units
    return i // 3, i % 3, fw


class Recorder:
    """Accumulates one step's numbers for one rank."""

    def __init__(self, n_units: int):
        self.n_units = n_units
        # per unit and phase: compute, then (from `fw_first`) the framework's own time
        self.fw_first = _FIRST_UNIT_BUCKET + 3 * n_units
        self.acc = [0.0] * (_FIRST_UNIT_BUCKET + 6 * n_units)
        self.stack = [B_OTHER]
        self.last = perf_counter()
        self.phase = FORWARD
        # (unit, phase, collective) -> [count, bytes, seconds, exposed, hidden]
        self.comm: dict[tuple[int, int, int], list] = {}

    # --- the clock ------------------------------------------------------------------
    # One clock read per switch; each returns it, so a caller timing the same span (a
    # blocking collective) needs no read of its own.
    def push(self, bucket: int) -> float:
        now = perf_counter()
        stack = self.stack
        self.acc[stack[-1]] += now - self.last
        self.last = now
        stack.append(bucket)
        return now

    def remove(self, bucket: int) -> float:
        """Leave `bucket` (normally the top; searched from the top if not)."""
        now = perf_counter()
        stack = self.stack
        top = stack[-1]
        self.acc[top] += now - self.last
        self.last = now
        if top == bucket and len(stack) > 1:
            stack.pop()
            return now
        for i in range(len(stack) - 1, 0, -1):
            if stack[i] == bucket:
                del stack[i]
                break
        return now

    def switch(self, old: int, new: int) -> None:
        """`remove(old)` then `push(new)` with one clock read (a hook leaving one bucket
        for another)."""
        now = perf_counter()
        stack = self.stack
        top = stack[-1]
        self.acc[top] += now - self.last
        self.last = now
        if top == old and len(stack) > 1:
            stack[-1] = new
            return
        Recorder._switch_search(stack, old, new)

    @staticmethod
    def _switch_search(stack: list, old: int, new: int) -> None:
        """`switch` when `old` is not on top: leave it where it is, then push `new`."""
        for i in range(len(stack) - 1, 0, -1):
            if stack[i] == old:
                del stack[i]
                break
        stack.append(new)

    def framework_bucket(self, unit: int, phase: int) -> int:
        """The bucket of a unit's framework time in a phase: after every unit's compute
        buckets (a compute bucket is `_FIRST_UNIT_BUCKET <= b < fw_first`)."""
        return self.fw_first + unit * 3 + phase

    def has(self, bucket: int) -> bool:
        return bucket in self.stack

    # --- collectives ---------------------------------------------------------------
    def add_comm(self, unit: int, phase: int, coll: int, nbytes: int, seconds: float,
                 exposed: float, hidden: float) -> None:
        key = (unit, phase, coll)
        a = self.comm.get(key)
        if a is None:
            self.comm[key] = [1, nbytes, seconds, exposed, hidden]
        else:
            a[0] += 1
            a[1] += nbytes
            a[2] += seconds
            a[3] += exposed
            a[4] += hidden

    def take_comm(self) -> dict[tuple[int, int, int], list]:
        """The collectives recorded so far (read-back outside a step end)."""
        comm, self.comm = self.comm, {}
        return comm

    # --- step boundary -------------------------------------------------------------
    def drain(self, now: float, keep_comm: bool = False
              ) -> tuple[list[float], dict[tuple[int, int, int], list]]:
        """Charge up to `now`, hand over this step's accumulators and start fresh ones
        (`keep_comm`: the collectives stay for a later drain; an empty dict is returned)."""
        self.acc[self.stack[-1]] += now - self.last
        self.last = now
        acc, comm = self.acc, self.comm
        self.acc = [0.0] * len(acc)
        if keep_comm:
            comm = {}
        else:
            self.comm = {}
        self.stack = [B_OTHER]
        return acc, comm

    def drain_step(self, now: float, keep_comm: bool = False) -> float:
        """`drain` of a step without per-unit detail: only the optimizer's seconds are
        wanted. Only the step-level buckets (other, framework, wait, optimizer) are zeroed,
        in place: the unit buckets (compute and framework) are charged only by the per-unit
        hooks, which are not installed on such a step, and a detail step's end (`drain`)
        left them at zero. Not a reset of all 6 x units buckets: that loop over a list the
        model's own work has pushed out of the cache grew with the units (~1 us at 21, ~6 us
        at 81 units, the unsampled step's only per-unit cost; docs/gpus.md, round 3)."""
        acc = self.acc
        opt = acc[B_OPTIMIZER]
        if self.stack[-1] == B_OPTIMIZER:
            opt += now - self.last
        self.last = now
        acc[0] = acc[1] = acc[2] = acc[3] = 0.0
        if not keep_comm and self.comm:
            self.comm = {}
        if len(self.stack) > 1:
            self.stack = [B_OTHER]
        return opt

    def reset(self, now: float) -> None:
        self.drain(now)
