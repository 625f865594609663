"""Which steps get per-unit detail (issue 19's tiers): every step is measured at step level;
1 step in K gets the per-unit hooks and comm wrappers, installed at its start and removed at
its end (outside sampled steps they are not entered at all).

Position. Step `s` is sampled when ``mix(seed, s) mod K == 0``, `mix` a 64-bit integer hash
and `seed` derived from the run id (never the rank): the position is pseudo-random, so it
cannot alias with gradient accumulation, logging or checkpoint cycles, and it is the same on
every rank for the same K. In adaptive mode K is a power of two, so the steps sampled at
K = 2^b are a subset of those sampled at 2^a (a < b): ranks whose own cost led them to
different K still sample nested sets, and every step the rank with the largest K samples is
sampled on all ranks (the steps cross-rank per-unit comparisons use). Steps 1 and 2 (warm-up)
are always sampled, so per-unit detail is there from the start.

Adaptive K. After each step the monitor reports the step's wall time and the training
thread's CPU time (`time.thread_time()`, one read per step end). The shim's own cost of a
sampled step is the larger of two differences of medians over recent sampled and unsampled
steps (past warm-up): of the training thread's CPU time (what the sampled steps cost the
host beyond an unsampled one: hooks, wrappers, event records, install and removal) and of
the step's wall time (what the training thread's CPU clock does not see: the step waiting
for the interpreter lock while other threads run zerodoc's work, e.g. on CPU / gloo the async
collectives' completion callbacks on gloo's threads; docs/overhead.md). The wall-time
difference is the noisier one: its noise can only raise K (less detail), never lower it.
Each difference is taken at its upper bound: plus two standard errors of the difference of
the two medians (from each window's median absolute deviation), so that a cost the windows
cannot resolve from the steps' own jitter does not read as "free" (on a noisy CPU step the
point estimate is often <= 0, and K fell to 1: detail on every step, the budget exceeded).
Then ``K = ceil(own_hi / (budget x median step))``, rounded up to a power of two, clamped
to [K_MIN, K_MAX]: at least 2, so that steps without detail keep coming and keep the
baseline of the estimate current (`detail="every"` is K = 1). Until two of each kind were
seen, K stays at K_START.
"""

from __future__ import annotations

import math
import statistics
import zlib
from collections import deque

BUDGET = 0.002  # the shim's own host time on sampled steps, as a fraction of the median step
K_START = 8
K_MIN = 2  # adaptive: plain steps keep coming (the baseline of the cost estimate)
K_MAX = 1024
WARMUP = 2  # steps always sampled (and left out of the cost medians)
WINDOW = 15  # recent steps of each kind the medians are taken over
MASK = (1 << 64) - 1


def mix(seed: int, step: int) -> int:
    """splitmix64 of (seed, step): a well-spread 64-bit hash, a few integer operations."""
    z = (seed + step * 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def seed_of(run_id: str) -> int:
    return zlib.crc32(run_id.encode("utf-8", "replace")) * 0x100000001


def parse(detail) -> tuple[str, int | None]:
    """(mode, fixed K) of the `detail` option: "adaptive", "every", "off" or an int K >= 1
    (also given as a string, from $ZERODOC_DETAIL)."""
    if isinstance(detail, bool):
        raise TypeError(f"zerodoc.attach(): detail must be 'adaptive', 'every', 'off' or an "
                        f"int K >= 1, not {detail!r} (bool)")
    if isinstance(detail, str):
        d = detail.strip().lower()
        if d in ("adaptive", "every", "off"):
            return d, (1 if d == "every" else None)
        try:
            detail = int(d)
        except ValueError:
            raise ValueError(f"zerodoc.attach(): detail must be 'adaptive', 'every', 'off' "
                             f"or an int K >= 1, not {detail!r}") from None
    if not isinstance(detail, int):
        raise TypeError(f"zerodoc.attach(): detail must be 'adaptive', 'every', 'off' or an "
                        f"int K >= 1, not {detail!r} ({type(detail).__name__})")
    if detail < 1:
        raise ValueError(f"zerodoc.attach(): detail K must be >= 1, not {detail}")
    return ("every", 1) if detail == 1 else ("fixed", detail)


def median_se(xs) -> float:
    """Standard error of the median of `xs` from their median absolute deviation (robust to
    the odd slow step): 1.2533 x 1.4826 x MAD / sqrt(n); 0 with fewer than 2 values."""
    n = len(xs)
    if n < 2:
        return 0.0
    m = statistics.median(xs)
    mad = statistics.median(abs(x - m) for x in xs)
    return 1.2533 * 1.4826 * mad / math.sqrt(n)


def diff_hi(a, b) -> float:
    """Upper bound of median(a) - median(b): plus two standard errors of the difference."""
    se = math.hypot(median_se(a), median_se(b))
    return statistics.median(a) - statistics.median(b) + 2.0 * se


def pow2_ceil(x: float) -> int:
    return 1 if x <= 1 else 1 << math.ceil(math.log2(x))


class Sampler:
    """Decides, before each step, whether it gets per-unit detail."""

    def __init__(self, detail, run_id: str, budget: float = BUDGET):
        self.mode, fixed = parse(detail)
        self.k = fixed if fixed is not None else K_START
        self.budget = budget
        self.seed = seed_of(run_id)
        self._cpu = {True: deque(maxlen=WINDOW), False: deque(maxlen=WINDOW)}
        self._wall = {True: deque(maxlen=WINDOW), False: deque(maxlen=WINDOW)}
        self._steps: deque = deque(maxlen=2 * WINDOW)
        self.own_s: float | None = None  # the latest estimate of a sampled step's own cost
        self.own_hi_s: float | None = None  # its upper bound, which K is set from

    def header(self) -> dict:
        """The run header's `sampling` (docs/gpus.md, "Tiers")."""
        if self.mode in ("adaptive", "off"):
            return {"mode": self.mode, "every": None, "budget": self.budget}
        return {"mode": "every", "every": self.k, "budget": self.budget}

    def due(self, step: int) -> bool:
        """Is step `step` (1-based) a detail step?"""
        mode = self.mode
        if mode == "every":
            return True
        if mode == "off":
            return False
        if mode == "adaptive":
            if step <= WARMUP:
                return True
            return mix(self.seed, step) & (self.k - 1) == 0
        return mix(self.seed, step) % self.k == 0

    def observe(self, step: int, step_s: float, cpu_s: float, sampled: bool) -> None:
        """A step ended: its wall time and the training thread's CPU time over it."""
        if self.mode != "adaptive" or step <= WARMUP:
            return
        self._steps.append(step_s)
        self._cpu[sampled].append(cpu_s)
        self._wall[sampled].append(step_s)
        if sampled:
            self.adapt()

    def adapt(self) -> int:
        s, u = self._cpu[True], self._cpu[False]
        if len(s) < 2 or len(u) < 2 or not self._steps:
            return self.k
        med = statistics.median
        ws, wu = self._wall[True], self._wall[False]
        self.own_s = max(0.0, med(s) - med(u), med(ws) - med(wu))
        own_hi = max(0.0, diff_hi(s, u), diff_hi(ws, wu))
        self.own_hi_s = own_hi
        step = statistics.median(self._steps)
        if step <= 0:
            return self.k
        self.k = max(K_MIN, min(K_MAX, pow2_ceil(own_hi / (self.budget * step))))
        return self.k


class SeqCounter:
    """Step-level collective counts without entering any wrapper: the process groups'
    sequence numbers (each collective issued on a group advances its number by one), read
    once per step end. Sequence numbers do not say the kind or the bytes: a step whose count
    equals that of the latest detail step (the schedule repeats) is given that step's split
    per kind, counts and bytes; otherwise its count alone, under "any" (bytes null)."""

    def __init__(self, registry=None):
        self.readers: list | None = None
        self.registry = registry
        self.last: list[int] = []
        self.schedule: tuple[int, dict] | None = None  # (count, {kind: [count, bytes]})

    def _read(self) -> list[int] | None:
        if self.readers is None:
            from . import hookpoints as hp

            try:
                self.readers = hp.process_group_sequence_readers()
            except Exception as e:  # noqa: BLE001 - private: fail soft
                self.readers = []
                if self.registry is not None:
                    self.registry.missing("ProcessGroup._get_sequence_number_for_group",
                                          repr(e))
        try:
            return [f() for f in self.readers]
        except Exception:  # noqa: BLE001 - a group destroyed: look them up again next time
            self.readers = None
            return None

    def start(self) -> None:
        now = self._read()
        self.last = now or []

    def step(self, kinds: dict | None) -> dict | None:
        """The step's collectives: `kinds` ({kind: [count, bytes]} from the comm wrappers)
        on a detail step, None on another. None when not measured."""
        if kinds is None and self.readers == []:  # no process group: nothing to count
            return None
        now = self._read()
        if now is None or len(now) != len(self.last):
            self.last = now or []
            return kinds
        n = sum(now) - sum(self.last)
        self.last = now
        if kinds is not None:
            self.schedule = (n, kinds)
            return kinds
        if not self.readers:
            return None
        if self.schedule is not None and self.schedule[0] == n:
            return self.schedule[1]
        return {"any": [n, None]}
