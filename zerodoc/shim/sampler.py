"""Which steps get per-unit detail (issue 19's tiers): every step is measured at step level;
1 step in K gets the per-unit hooks and comm wrappers, installed at its start and removed at
its end (outside sampled steps they are not entered at all).

Schedule (adaptive mode, the default). Step 1 is warm-up (lazy initialisation, allocator
growth; every reader leaves it out) and is never sampled; steps 2 and 3 (FIRST) always are,
so per-unit detail is there right after the warm-up. From step 4 on, 1 step in K, K a power
of two, positioned in aligned blocks: in every block of K consecutive steps (steps
b x K .. b x K + K - 1) exactly one is sampled, which one chosen by hashes of (seed, level,
block): at each level j = 1 .. log2 K one hash bit picks the half of the block of 2^j steps
that holds its sample (`block_sample`). So
- the position within a block is pseudo-random: it cannot alias with gradient accumulation,
  logging or checkpoint cycles;
- the steps sampled at K = 2^b are a subset of those sampled at 2^a (a < b): the sample of
  a block of 2^b steps is the sample of one of its sub-blocks of 2^a;
- consecutive samples are at most 2K - 1 steps apart (K on average).

What every rank shares. `seed` comes from the job identity (`jobid.py`: the same string on
every rank and node, never the rank), so ranks with the same K sample the same steps. Each
rank sets its own K from its own measurements (below; no collective is ever added to the
training path), so K may differ between ranks; the nesting makes every step that the rank
with the largest K samples a sampled step on every rank: the steps cross-rank per-unit
comparisons use. Steps 2 and 3 are sampled on every rank, and while every rank has the
same K (the usual case: K is a power of two, so small differences in the measured cost or
step time land on the same K) every rank samples exactly the same steps.

Adaptive K is the largest of what the cost bound and the cap allow, at most what the time
floor allows:

    K = clamp(max(K_cap, min(K_cost, K_floor)), K_MIN, K_MAX)
    K_cost  = pow2_ceil(own_hi / (BUDGET x median step))    the cost bound (0.2 %)
    K_cap   = pow2_ceil(own_hi / (cap x median step))        the hard cap (1 %)
    K_floor = pow2_floor(floor_s / median step)              a sample every floor_s (15 s)

The floor brings samples to slow jobs (a 2.5 s step with K = 32 samples once in 80 s, and a
20-step window then often holds none; with the floor of 15 s K is 4), but never below what
keeps the estimated own cost, at its upper bound, within the cap: a sampled step that costs
more than cap x K steps keeps K up. K_MIN = 2 holds over the floor too (steps longer than
floor_s / 2 are sampled every other step, not every step): plain steps keep the cost
estimate's baseline current. Until the first cost estimate (below) K is
min(K_START, K_floor): the cap is not known yet, and while K is low the estimate comes soon
(ESTIMATE_FROM = 3 sampled steps with a baseline of two plain ones; from 2, the median of
two excesses is their mean, and one unlucky pair read as free: K fell to K_MIN).
`floor_s = 0`: no floor (K from the cost bound alone).

Fixed K (an int, any K >= 2): step 1 is not sampled either; then one step in every aligned
block of K steps, at `mix(seed, block) mod K` within it (a fixed rate, not 1 in K on
average: a 12-step run with K = 2 has 5 or 6 samples, whatever the seed). "every" samples
every step, step 1 included (the demo's and diagnostic runs' mode).

The own cost. After each step the monitor reports the step's wall time, the training
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
slowly, never holds it below what recent samples cost). K is recomputed at each sampled
step's end (and, until the first estimate, at every step's end: the floor from the step
times so far).
"""

from __future__ import annotations

import math
import statistics
import zlib
from collections import deque

BUDGET = 0.002  # the shim's own host time on sampled steps, as a fraction of the median step
CAP = 0.01  # the hard cap the time floor never pushes the own cost past (fraction of a step)
FLOOR_S = 15.0  # a sample at least every this many seconds (about a scrape interval)
K_START = 8
K_MIN = 2  # adaptive: plain steps keep coming (the baseline of the cost estimate)
K_MAX = 1024
WARMUP = 1  # adaptive: steps never sampled and left out of the cost medians (warm-up)
FIRST = (2, 3)  # adaptive: always sampled (detail right after the warm-up)
WINDOW = 15  # recent steps the median step is taken over (x 2); recent samples (a rise)
BASE = 64  # recent unsampled steps: a sampled step's baseline, and the steps' jitter
SAMPLES = 128  # sampled steps' excesses kept (the cost's median and its bound)
OWN_SPREAD = 8  # from this many excesses kept, their own spread may widen the bound
ESTIMATE_FROM = 3  # excesses before the first estimate (the median of 2 is their mean)
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


def pow2_floor(x: float) -> int:
    """The largest power of two <= x (1 below 2)."""
    return 1 if x < 2 else 1 << int(math.log2(x))


def block_sample(seed: int, block: int, bits: int) -> int:
    """The sampled step of aligned block `block` of 2^bits steps: from the top level down,
    one hash bit of (seed, level j, the block of 2^j steps reached so far) picks the half
    that holds the sample. The sample of a block is the sample of one of its halves, down to
    single steps: the steps sampled at 2^b are a subset of those at 2^a (a < b)."""
    pos = block << bits
    for j in range(bits, 0, -1):
        pos |= (mix(seed, ((pos >> j) << 6) | j) & 1) << (j - 1)
    return pos


class Sampler:
    """Decides, before each step, whether it gets per-unit detail. `job_id`: the job
    identity (`jobid.py`), the same on every rank: the positions' seed."""

    def __init__(self, detail, job_id: str, budget: float = BUDGET,
                 floor_s: float = FLOOR_S, cap: float = CAP):
        self.mode, fixed = parse(detail)
        self.budget, self.floor_s, self.cap = budget, floor_s, cap
        self.seed = seed_of(job_id)
        self._base_cpu: deque = deque(maxlen=BASE)  # unsampled steps: the baseline
        self._base_out: deque = deque(maxlen=BASE)  # the second clock (process CPU)
        self._xs_cpu: deque = deque(maxlen=SAMPLES)  # sampled steps' excesses over it
        self._xs_out: deque = deque(maxlen=SAMPLES)
        self._steps: deque = deque(maxlen=2 * WINDOW)
        self.own_s: float | None = None  # the latest estimate of a sampled step's own cost
        self.own_hi_s: float | None = None  # its upper bound, which K is set from
        self._k = 0
        self._set_k(fixed if fixed is not None else K_START)

    @property
    def k(self) -> int:
        """K in force: about 1 step in K is sampled (a power of two in adaptive mode)."""
        return self._k

    @k.setter
    def k(self, k: int) -> None:
        self._set_k(k)

    def _set_k(self, k: int) -> int:
        if k != self._k:
            self._k = k
            self._bits = k.bit_length() - 1  # log2 K (adaptive)
            self._block = (-1, 0)  # (block, its sampled step) at this K, once computed
        return k

    def header(self) -> dict:
        """The run header's `sampling` (docs/gpus.md, "Tiers"): the floor and cap are in
        force in adaptive mode only (null otherwise)."""
        if self.mode in ("adaptive", "off"):
            on = self.mode == "adaptive"
            return {"mode": self.mode, "every": None, "budget": self.budget,
                    "floor_s": self.floor_s if on else None, "cap": self.cap if on else None}
        return {"mode": "every", "every": self.k, "budget": self.budget, "floor_s": None,
                "cap": None}

    def due(self, step: int) -> bool:
        """Is step `step` (1-based) a detail step?"""
        mode = self.mode
        if mode == "adaptive":
            if step <= WARMUP:
                return False
            if step in FIRST:
                return True
            block = step >> self._bits  # one block's sample computed once (log2 K hashes)
            if block != self._block[0]:
                self._block = (block, block_sample(self.seed, block, self._bits))
            return step == self._block[1]
        if mode == "every":
            return True
        if mode == "off" or step <= WARMUP:
            return False
        k = self._k  # fixed K: one step in every aligned block of K, at a hashed place
        return step % k == mix(self.seed, step // k) % k

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
        elif len(bc) >= 2:  # a baseline to take the excess over
            med = statistics.median
            self._xs_cpu.append(cpu_s - med(bc))
            self._xs_out.append(out - med(bo))
        if sampled or self.own_hi_s is None:
            self.adapt()

    def adapt(self) -> int:
        """K from the cost estimate, the cap and the time floor (module docstring)."""
        if not self._steps:
            return self.k
        step = statistics.median(self._steps)
        if step <= 0:
            return self.k
        floor = pow2_floor(self.floor_s / step) if self.floor_s > 0 else K_MAX
        xc, xo = self._xs_cpu, self._xs_out
        if len(xc) < ESTIMATE_FROM:  # no estimate yet: the start value, or the floor's
            return self._set_k(max(K_MIN, min(K_START, floor)))
        med = statistics.median
        self.own_s = max(0.0, med(xc), med(xo))
        own_hi = max(0.0, excess_hi(xc, self._base_cpu), excess_hi(xo, self._base_out))
        self.own_hi_s = own_hi
        k_cost = pow2_ceil(own_hi / (self.budget * step))
        k_cap = pow2_ceil(own_hi / (self.cap * step))
        return self._set_k(max(K_MIN, min(K_MAX, max(k_cap, min(k_cost, floor)))))


class SeqCounter:
    """Step-level collective counts without entering any wrapper: the process groups'
    sequence numbers (each collective issued on a group advances its number by one), read
    once per step end. Sequence numbers do not say the kind or the bytes: a step whose count
    equals that of the latest detail step (the schedule repeats) is given that step's split
    per kind, counts and bytes; otherwise its count alone, under "any" (bytes null)."""

    def __init__(self, registry=None):
        self.readers: list | None = None
        self.names: list[str] = []  # each reader's group name (replaced, never mutated)
        self.registry = registry
        self.last: list[int] = []
        self.schedule: tuple[int, dict] | None = None  # (count, {kind: [count, bytes]})

    def _read(self) -> list[int] | None:
        if self.readers is None:
            from . import hookpoints as hp

            try:
                self.readers = hp.process_group_sequence_readers()
                self.names = hp.process_group_names()
            except Exception as e:  # noqa: BLE001 - private: fail soft
                self.readers, self.names = [], []
                if self.registry is not None:
                    self.registry.missing("ProcessGroup._get_sequence_number_for_group",
                                          repr(e))
        try:
            return [f() for f in self.readers]
        except Exception:  # noqa: BLE001 - a group destroyed: look them up again next time
            self.readers = None
            return None

    def by_name(self) -> dict[str, int]:
        """The groups' numbers at the latest read, by group name."""
        return dict(zip(self.names, self.last)) if len(self.names) == len(self.last) else {}

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
