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

Adaptive K. After each step the monitor reports the step's wall time, the training
thread's CPU time (`time.thread_time()`) and the process's (`time.process_time()`, all its
threads; one read of each per step end). The shim's own cost of a sampled step is the larger
of two excesses over the unsampled steps (past warm-up): of the training thread's CPU time
(what the sampled steps cost the host beyond an unsampled one: hooks, wrappers, event
records, install and removal) and of the process's CPU time (what the training thread's
clock does not see: zerodoc's work on other threads, which the training thread waits for at
the interpreter lock, e.g. on CPU / gloo the async collectives' completion callbacks on
gloo's threads; docs/overhead.md). Until 2026-11-25 that second clock was the step's wall
time; on a shared machine other processes move it by hundreds of ms step to step (the
65-unit bench: excesses of +477, -175, -17 ms with a median step of 1.4 s), so its bound
pinned K at K_MAX; the process's CPU clock sees zerodoc's other threads without the
preemptions. Without a process clock (`observe()` without `proc_s`) the wall time is used.

Each sampled step's excess is taken when it ends, over the median of the last BASE
unsampled steps then (its contemporaneous baseline: a drift of the step time between samples
far apart does not read as cost), and the last SAMPLES excesses are kept: sampled steps are
rare (1 in K), so their memory is longer than the baseline's, and the estimate tightens as
they accumulate instead of staying as loose as the last 15 allowed. The cost is the median
excess at its upper bound, plus two standard errors of a median of n excesses over a
baseline of m steps: 1.2533 x sigma x sqrt(1/n + 1/m), sigma the steps' jitter. sigma is a
pooled spread: the unsampled window's (1.4826 x its median absolute deviation; many steps,
well measured), and once OWN_SPREAD excesses are kept, the larger of it and the excesses' own
(a sampled step that varies more than a plain one widens the bound, never narrows it). So a
cost that the steps' jitter hides does not read as "free" (on a noisy CPU step the point
estimate is often <= 0, and K fell to 1: detail on every step, the budget exceeded), and with
few samples K is high but comes down as they accumulate. A rise in the cost is seen sooner:
the bound is at least the median excess of the last WINDOW samples (the long memory lowers K
slowly, never holds it below what recent samples cost).
Then ``K = ceil(own_hi / (budget x median step))``, rounded up to a power of two, clamped
to [K_MIN, K_MAX]: at least 2, so that steps without detail keep coming and keep the
baseline of the estimate current (`detail="every"` is K = 1). Until two sampled steps with a
baseline (two unsampled steps before them) were seen, K stays at K_START.
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
WINDOW = 15  # recent steps the median step is taken over (x 2); recent samples (a rise)
BASE = 64  # recent unsampled steps: a sampled step's baseline, and the steps' jitter
SAMPLES = 128  # sampled steps' excesses kept (the cost's median and its bound)
OWN_SPREAD = 8  # from this many excesses kept, their own spread may widen the bound
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


def spread(xs) -> float:
    """sigma of `xs` from their median absolute deviation (robust to the odd slow step):
    1.4826 x MAD; 0 with fewer than 2 values."""
    if len(xs) < 2:
        return 0.0
    m = statistics.median(xs)
    return 1.4826 * statistics.median([abs(x - m) for x in xs])


def excess_hi(xs, base) -> float:
    """Upper bound of the median of the excesses `xs` (each over its own baseline, a median of
    len(base) steps): plus two standard errors of that median, from the pooled spread (the
    baseline's, widened by the excesses' own once OWN_SPREAD of them are kept); at least the
    median of the last WINDOW excesses (a cost that rose is seen before the memory turns over)."""
    n, m = len(xs), len(base)
    sigma = spread(base)
    if n >= OWN_SPREAD:
        sigma = max(sigma, spread(xs))
    med = statistics.median(xs)
    hi = med + 2.0 * 1.2533 * sigma * math.sqrt(1.0 / n + 1.0 / m)
    if n > WINDOW:
        hi = max(hi, statistics.median(list(xs)[-WINDOW:]))
    return hi


def pow2_ceil(x: float) -> int:
    return 1 if x <= 1 else 1 << math.ceil(math.log2(x))


class Sampler:
    """Decides, before each step, whether it gets per-unit detail."""

    def __init__(self, detail, run_id: str, budget: float = BUDGET):
        self.mode, fixed = parse(detail)
        self.k = fixed if fixed is not None else K_START
        self.budget = budget
        self.seed = seed_of(run_id)
        self._base_cpu: deque = deque(maxlen=BASE)  # unsampled steps: the baseline
        self._base_out: deque = deque(maxlen=BASE)  # the second clock (process CPU)
        self._xs_cpu: deque = deque(maxlen=SAMPLES)  # sampled steps' excesses over it
        self._xs_out: deque = deque(maxlen=SAMPLES)
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

    def observe(self, step: int, step_s: float, cpu_s: float, sampled: bool,
                proc_s: float | None = None) -> None:
        """A step ended: its wall time, the training thread's CPU time over it and the
        process's (all threads; the monitor gives it): the cost's second clock, what the
        training thread's misses. Without `proc_s` the wall time is that clock."""
        if self.mode != "adaptive" or step <= WARMUP:
            return
        self._steps.append(step_s)
        out = step_s if proc_s is None else proc_s
        bc, bo = self._base_cpu, self._base_out
        if not sampled:
            bc.append(cpu_s)
            bo.append(out)
            return
        if len(bc) < 2:  # no baseline yet
            return
        med = statistics.median
        self._xs_cpu.append(cpu_s - med(bc))
        self._xs_out.append(out - med(bo))
        self.adapt()

    def adapt(self) -> int:
        xc, xo = self._xs_cpu, self._xs_out
        if len(xc) < 2 or not self._steps:
            return self.k
        med = statistics.median
        self.own_s = max(0.0, med(xc), med(xo))
        own_hi = max(0.0, excess_hi(xc, self._base_cpu), excess_hi(xo, self._base_out))
        self.own_hi_s = own_hi
        step = med(self._steps)
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
