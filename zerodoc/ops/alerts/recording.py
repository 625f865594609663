"""Recording rules: the derived series dashboards and alerts query.

Two levels:

- per rank (`rank:`, `unit_collective_rank:`, `collective_rank:`): what one rank saw over the
  window — its per-step rates per unit, comm/compute, headroom, bus bandwidth per collective,
  step time quantiles. The dashboards plot these.
- per job (`unit_job:`, `collective_job:`, `job:`): the rules engine's numbers
  (`zerodoc.diagnosis.context`). Per unit, phase and collective the *link-attributable* time
  (the smallest per-step time over the ranks, so a straggler's waiting peers are not blamed
  on the link) and the *avoidable* exposed time (with synchronous all-gathers, only what
  the link's expected bandwidth does not explain). The alerts that mirror engine rules fire
  on these, so alert and engine agree on the same data.

Bus bandwidth is not exported (it is derivable): bus bytes = bytes x the nccl-tests factor
of the unit's group, from rank 0's `zerodoc_unit_group_size` (the world size where rank 0's
facts are missing), over the collective's seconds.

Per-rank compute and exposed time (`rank:zerodoc_compute_seconds:per_step`, the exposed
fractions and ratios, the straggler rules built on them) read the rank's own totals over its
units, `zerodoc_rank_compute_seconds_total` and `zerodoc_rank_collective_exposed_seconds_total`
(5 series a rank), not its per-unit series (~400 a rank at 81 units; issue 20 item 17). Ranks
of a zerodoc without those series get no per-rank compute rules: rules and ranks come
from the same release.

Coarse detail (`metrics_detail="coarse"`): ranks outside the unit sample serve their
collective and compute counters without a `unit` label (summed over units). Per-rank rules
read the rank-level totals every rank serves; per-unit rules select `unit!=""`, so a unit's
numbers come from the ranks that keep unit detail.

Four groups (issue 33 item 2). `zerodoc.recording` holds the rules that read rank-level
series (a few a rank): the run's facts, step time, exposure and compute per rank, memory, the
straggler; it runs at the server's evaluation interval, and so does `zerodoc.step_quantiles`
(`quantile_rules`: the step-time quantiles, half of the rank-level work at 1,024 ranks, in a
group of their own so that each takes well under half of the 15 s while the per-unit groups
run). The rules that read the per-unit
counters (~243 series a rank each at 81 units) run in two groups of their own, once per
per-unit rate window (`unit_window`: four times the rank-level window, 4m in production;
each evaluation reads a fresh window):

- `zerodoc.unit_rates` records each rank's per-step rate of each per-unit collective counter
  ONCE (`unit_collective_rank:...:per_step`, `PER_STEP`, the coarse ranks' unit-less totals
  included), and the rules that read raw per-unit counters (compute and framework time per
  unit, over ranks). Before, 41 rate() calls over 243k series per evaluation at 1,024 ranks
  took 170-255 s against a 15 s interval.
- `zerodoc.units` aggregates those recorded rates: every per-unit, per-collective and per-job
  number. It reads them, and the first group's series (bus factors, median step), as of those
  groups' last evaluations: at most one per-unit window late, and at start-up it records
  nothing until the rates exist.

Why two groups, and why 4m: a group's rules run one after another on one core, while groups
run side by side. At 1,024 ranks x 81 units on a 2-core Debian Prometheus 2.42 (measured:
docs/operations.md) the recorded rates take ~45 s and the aggregates ~60 s an evaluation, and
the rank-level group must still finish within half of its 15 s beside them; at 2m the
per-unit groups alone kept one of the two cores busy and the aggregates took 64 s (over half
of 2m). Each aggregate reads ~249k recorded series (~8 us a series on that server) and each
recorded rate writes as many, so per rank AND unit nothing is recorded beyond the four rates
(~1M series at 1,024 ranks, one sample a window): a unit's exposed share, bytes per call and
bus bandwidth per rank (486 series a rank before) are computed by the layers dashboard at
query time, for the ranks it shows (`unit_rank_views`). The compute per unit (read by two
rules) stays inline. Smaller jobs can take a shorter window (`--unit-window`): the per-unit
groups' time grows with ranks x units (~20 s at 256 ranks).

Per-unit stats over ranks (`unit_stat_rules`, `unit_job:...:per_step_<agg>`): for each unit,
phase and collective the median / mean / max (min where the engine reads it) of each rank's
per-step calls, bytes, seconds, exposed and hidden seconds, the number of ranks, the compute
per unit and phase, and the framework's time per unit (min / median / mean / max over the
ranks that serve it per unit, and their number). `zerodoc report` / `zerodoc tui` on
Prometheus read these few series per unit instead of aggregating every rank's raw per-unit
series per query (43.5 s to a first answer at 1,024 ranks, issue 20 item 17);
`job:zerodoc_recording_window:seconds` says which rate window they cover. The server pays
for them once per rate window.

In each group later rules read earlier ones within the same evaluation.
"""

from __future__ import annotations

from ...catalog import (  # the recorded names: the contract with the Prometheus source
    ASYNC_ALL_GATHER, RANK_COMPUTE, RANK_EXPOSED, RULE_WINDOW, UNIT_COMPUTE, UNIT_FRAMEWORK,
    UNIT_RANKS, UNIT_STAT,
)
from ...thresholds import DEFAULT, LINK_BUSBW, Thresholds

AG = 'collective="all_gather"'
COLL = "unit, phase, collective"
KEY = "job, run_id, unit, phase, collective"
JOB = "job, run_id"

# GPU caching-allocator populations of zerodoc_memory_bytes, as the shim exports them
# (torch.cuda.memory_stats); absent on CPU runs.
ALLOCATED, RESERVED = "allocated", "reserved"
PEAK_ALLOCATED, PEAK_RESERVED = "peak_allocated", "peak_reserved"


def _rec(name: str, expr: str) -> dict:
    return {"record": name, "expr": expr}


def _pop(p: str) -> str:
    return f'sum without (population) (zerodoc_memory_bytes{{population="{p}"}})'


def _factor(g: str) -> str:
    """The nccl-tests busbw / algbw factor of each collective kind for groups of `g` ranks."""
    parts = [(f"({g} - 1) / {g}", "all_gather"), (f"({g} - 1) / {g}", "reduce_scatter"),
             (f"2 * ({g} - 1) / {g}", "all_reduce"), (f"{g} / {g}", "broadcast")]
    return "\nor\n".join(f'label_replace({e}, "collective", "{c}", "", "")' for e, c in parts)


def bus_bytes(expr: str) -> str:
    """Bus bytes of a byte vector (labels `collective`, `unit`, the run's): times its unit's
    group factor, or where no group size is known (no facts from rank 0, a coarse rank's
    unit-less totals), the world size's."""
    return (f"(\n  {expr}\n)\n* on (job, run_id, unit, collective) group_left ()\n{UNIT_FACTOR}"
            f"\nor\n(\n  {expr}\n)\n* on (job, run_id, collective) group_left ()\n{WORLD_FACTOR}")


UNIT_FACTOR = "unit_collective_job:zerodoc_collective_bus_factor:ratio"
WORLD_FACTOR = "collective_job:zerodoc_collective_bus_factor:ratio"
FACTOR_ANY = "unit_collective_job:zerodoc_collective_bus_factor:ratio_or_world"
RANK_BYTES = "collective_rank:zerodoc_collective_bytes:per_step"
RANK_SECONDS = "collective_rank:zerodoc_collective_seconds:per_step"
RANK_BUS_BYTES = "collective_rank:zerodoc_collective_bus_bytes:per_step"
UNITS = 'unit!=""'  # per-unit numbers: not a coarse rank's totals over units


_AGG = {"min": "min", "mean": "avg", "max": "max", "median": "quantile"}


def _seconds(window: str) -> float:
    n, unit = float(window[:-1] if window[-2:] != "ms" else window[:-2]), window[-1]
    if window.endswith("ms"):
        return n / 1000
    return n * {"s": 1, "m": 60, "h": 3600, "d": 86400}.get(unit, 1)


# Each rank's per-step rate of each per-unit collective counter, recorded once for the
# aggregations to read (module docstring); labels: the rank's, unit, phase, collective.
PER_STEP = {c: f"unit_collective_rank:zerodoc_collective_{c}:per_step"
            for c in ("calls", "bytes", "seconds", "exposed_seconds")}
FRAMEWORK_PER_STEP = "unit_rank:zerodoc_framework_unit_seconds:per_step"
BUCKET_RATE = "rank:zerodoc_step_duration_seconds_bucket:rate"
# per unit, the worst rank's exposed all-gather share of its step / of the all-gather time
UNIT_SHARES = {"unit_job:zerodoc_all_gather_exposed:fraction_max":
               "unit_rank:zerodoc_all_gather_exposed:fraction",
               "unit_job:zerodoc_all_gather_exposed:ratio_max":
               "unit_rank:zerodoc_all_gather_exposed:ratio"}
RANK_GROUP, QUANTILE_GROUP = "zerodoc.recording", "zerodoc.step_quantiles"
RATES_GROUP, UNIT_GROUP = "zerodoc.unit_rates", "zerodoc.units"


def _steps(w: str) -> str:
    """Per step of the steps the per-unit counters cover: the sampled ones (issue 19), every
    step where a rank does not count them; inline (one series a rank), so that the per-unit
    group's rates and their divisor cover the same instant."""
    return (f"(rate(zerodoc_detail_steps_total[{w}])\n  or rate(zerodoc_step_duration_seconds_count"
            f"[{w}]))")


def _agg(a: str, expr: str, by: str = KEY) -> str:
    fn = _AGG[a]
    return f"{fn} by ({by}) (0.5,\n  {expr}\n)" if a == "median" else \
        f"{fn} by ({by}) (\n  {expr}\n)"


def per_step_rules(w: str) -> list[dict]:
    """The recorded per-rank per-step rates of the per-unit counters (PER_STEP): the only
    rate() over them; every rank's series, a coarse rank's unit-less totals too."""
    metric = {"calls": "zerodoc_collective_calls_total",
              "bytes": "zerodoc_collective_bytes_total",
              "seconds": "zerodoc_collective_seconds_total",
              "exposed_seconds": "zerodoc_collective_exposed_seconds_total"}
    return [_rec(name, f"rate({metric[c]}[{w}])\n  / ignoring ({COLL}) group_left ()\n  {_steps(w)}")
            for c, name in PER_STEP.items()]


def _unit(c: str, sel: str = "") -> str:
    """A recorded per-step series of per-unit numbers only (not a coarse rank's totals)."""
    return f"{PER_STEP[c]}{{{UNITS}{', ' + sel if sel else ''}}}"


def unit_rank_views(sel: str = "", rank_sel: str = "", only: str = "") -> dict[str, str]:
    """Per rank AND unit, at query time from the recorded per-step rates (not recorded: module
    docstring), keyed by the names they were recorded as before issue 33: a unit's exposed
    all-gather share of the step, its exposed / total all-gather time, its bytes per call
    and its bus bandwidth per collective. `sel`: matchers on the per-unit series (the layers
    dashboard's job, rank and unit variables), `rank_sel` on the rank-level series, `only`
    on the bytes-per-call sides (e.g. one collective)."""
    def per_unit(c: str, extra: str = "") -> str:
        return f"{PER_STEP[c]}{{{', '.join(x for x in (UNITS, sel, extra) if x)}}}"

    def over(c: str, without: str, extra: str = "") -> str:
        return f"sum without ({without}) ({per_unit(c, extra)})"

    mean_step = "rank:zerodoc_step_seconds:mean" + (f"{{{rank_sel}}}" if rank_sel else "")
    return {
        "unit_rank:zerodoc_all_gather_exposed:fraction":
            f"{over('exposed_seconds', 'phase, collective', AG)}\n"
            f"/ ignoring (unit) group_left ()\n{mean_step}",
        "unit_rank:zerodoc_all_gather_exposed:ratio":
            f"{over('exposed_seconds', 'phase, collective', AG)}\n/\n"
            f"{over('seconds', 'phase, collective', AG)}",
        "unit_rank:zerodoc_collective_bytes:per_call":
            f"{over('bytes', 'phase', only)}\n/\n{over('calls', 'phase', only)}",
        "unit_collective_rank:zerodoc_collective_busbw:bytes_per_second":
            f"sum without (phase) (\n{bus_bytes(per_unit('bytes'))}\n)\n/\n"
            f"({over('seconds', 'phase')} > 0)",
    }


def unit_stat_rules(w: str) -> list[dict]:
    """The per-unit stats over ranks the Prometheus source reads (module docstring), after
    the recorded per-step rates they read (`per_step_rules`)."""
    rules = per_step_rules(w)
    seen = {"unit_job:zerodoc_collective_seconds:per_step",  # recorded below, as they were
            "unit_job:zerodoc_collective_exposed_seconds:per_step",
            "unit_job:zerodoc_collective_bytes:per_step"}
    field = {"count": "calls", "bytes": "bytes", "seconds": "seconds",
             "exposed": "exposed_seconds"}
    for f, (metric, names) in UNIT_STAT.items():
        num = _unit(field[f]) if metric else f"{_unit('seconds')} - {_unit('exposed_seconds')}"
        for a, name in names.items():
            if name not in seen:
                rules.append(_rec(name, _agg(a, num)))
    rules.append(_rec(UNIT_RANKS, f"count by ({KEY}) (\n  {_unit('calls')}\n)"))
    # compute per unit: read by two rules only, inline (recording it would cost 162 series
    # a rank for one rate() a window)
    comp = (f"rate(zerodoc_compute_seconds_total{{{UNITS}}}[{w}])\n"
            f"  / ignoring (unit, phase) group_left ()\n  {_steps(w)}")
    for a, name in UNIT_COMPUTE.items():
        rules.append(_rec(name, _agg(a, comp, f"{JOB}, unit, phase")))
    # the framework's time per unit over its phases, per step, per rank (rank 0's per-unit
    # series: the other ranks serve theirs summed over units, no unit label); then over ranks
    rules.append(_rec(FRAMEWORK_PER_STEP,
                      f"sum by ({JOB}, rank, unit) (\n  rate(zerodoc_framework_unit_seconds_total"
                      f"{{{UNITS}}}[{w}])\n)\n  / on ({JOB}, rank) group_left ()\n  {_steps(w)}"))
    for a, name in UNIT_FRAMEWORK.items():
        rules.append(_rec(name, f"count by ({JOB}, unit) (\n  {FRAMEWORK_PER_STEP}\n)"
                          if a == "n" else _agg(a, FRAMEWORK_PER_STEP, f"{JOB}, unit")))
    # raw series only: promtool can backfill it alone (bench/scale_prom.py)
    rules.append(_rec(RULE_WINDOW,
                      f"0 * max by ({JOB}) (zerodoc_world_size) + {_seconds(w):g}"))
    return rules


def unit_stat_names() -> set[str]:
    """The recorded series the Prometheus source reads per unit."""
    return {n for _m, names in UNIT_STAT.values() for n in names.values()} | \
        {UNIT_RANKS, RULE_WINDOW, ASYNC_ALL_GATHER, *UNIT_COMPUTE.values(),
         *UNIT_FRAMEWORK.values()}


def recording_rules(t: Thresholds = DEFAULT, window: str = "1m", link: str = "infiniband") -> list[dict]:
    """Every recording rule, the groups' in order (`recording_groups`)."""
    return [r for _name, _interval, rules in recording_groups(t, window, link) for r in rules]


UNIT_WINDOW_FACTOR = 4


def unit_window(window: str) -> str:
    """The per-unit groups' rate window (and interval) for a rank-level `window`: four times
    it (module docstring)."""
    s = _seconds(window) * UNIT_WINDOW_FACTOR
    return f"{s / 60:g}m" if s >= 60 and s % 60 == 0 else f"{s:g}s"


def recording_groups(t: Thresholds = DEFAULT, window: str = "1m", link: str = "infiniband",
                     unit_interval: str | None = None, unit_win: str | None = None,
                     ) -> list[tuple[str, str | None, list[dict]]]:
    """(group name, its interval or None for the server's, its rules): the rank-level group,
    then the two per-unit groups, each at one evaluation per per-unit rate window (`unit_win`,
    default `unit_window(window)`) unless told otherwise (module docstring)."""
    uw = unit_win or unit_window(window)
    rules = unit_rules(t, uw, link)
    first = set(PER_STEP.values()) | set(UNIT_COMPUTE.values()) | \
        set(UNIT_FRAMEWORK.values()) | {FRAMEWORK_PER_STEP, RULE_WINDOW}
    return [(RANK_GROUP, None, rank_rules(t, window)),
            (QUANTILE_GROUP, None, quantile_rules(window)),
            (RATES_GROUP, unit_interval or uw, [r for r in rules if r["record"] in first]),
            (UNIT_GROUP, unit_interval or uw, [r for r in rules if r["record"] not in first])]


def rank_rules(t: Thresholds = DEFAULT, window: str = "1m") -> list[dict]:
    """Rules over rank-level series only (a few a rank)."""
    w = window
    steps = f"rate(zerodoc_step_duration_seconds_count[{w}])"
    step_sum = f"rate(zerodoc_step_duration_seconds_sum[{w}])"
    # Per-unit counters (compute, collectives) count the sampled steps only (issue 19): their
    # per-step means divide by the sampled steps' rate (every step where a rank does not
    # count them), and shares of step time are those means over the mean step.
    sampled = "rank:zerodoc_detail_steps:rate"
    mean_step = "rank:zerodoc_step_seconds:mean"
    # a rank's own totals over its units (catalog RANK_COMPUTE / RANK_EXPOSED): the per-rank
    # rules read these 5 series a rank, not its ~400 per-unit ones
    rank_exposed = f"sum without (phase, collective) (rate({RANK_EXPOSED}[{w}]))"
    rank_compute = f"sum without (phase) (rate({RANK_COMPUTE}[{w}]))"
    exposed_step = "rank:zerodoc_comm_exposed_seconds:per_step"
    compute_step = "rank:zerodoc_compute_seconds:per_step"

    rules = [
        # ---- the run's facts (rank 0) and the busbw factors ------------------------------
        _rec("unit_job:zerodoc_unit_group_size:max",
             f"max by ({JOB}, unit) (zerodoc_unit_group_size)"),
        _rec(UNIT_FACTOR, _factor("unit_job:zerodoc_unit_group_size:max")),
        _rec("job:zerodoc_world_size:max", f"max by ({JOB}) (zerodoc_world_size)"),
        _rec(WORLD_FACTOR, _factor("job:zerodoc_world_size:max")),
        # ---- per rank: step time --------------------------------------------------------
        _rec("rank:zerodoc_steps:rate", steps),
        _rec(mean_step, f"{step_sum}\n/\n{steps}"),
        _rec(sampled, f"rate(zerodoc_detail_steps_total[{w}])\nor\n{steps}"),
    ]
    rules += [
        # ---- per rank: exposure, compute, skew ------------------------------------------
        _rec("rank:zerodoc_all_gather_exposed:fraction",
             f"sum without (phase, collective) (rate({RANK_EXPOSED}{{{AG}}}[{w}]))\n/\n"
             f"{sampled}\n/\n{mean_step}"),
        # the rank's exposed and compute time per step once; the shares below reuse them
        _rec(exposed_step, f"{rank_exposed}\n/\n{sampled}"),
        _rec(compute_step, f"{rank_compute}\n/\n{sampled}"),
        _rec("rank:zerodoc_comm_exposed:fraction", f"{exposed_step}\n/\n{mean_step}"),
        _rec("rank:zerodoc_comm_compute:ratio", f"{exposed_step}\n/\n{compute_step}"),
        # The engine's straggler ratio: a rank's compute per step over the median of the
        # *other* ranks. For the slowest rank that is the median of all but the slowest;
        # every other rank's ratio is below it, so "some rank above the threshold" agrees.
        _rec("rank:zerodoc_compute_skew:ratio",
             "rank:zerodoc_compute_seconds:per_step\n/ on (job, run_id) group_left ()\n"
             "quantile by (job, run_id) (0.5,\n"
             "  rank:zerodoc_compute_seconds:per_step\n"
             "  unless\n"
             "  (rank:zerodoc_compute_seconds:per_step == on (job, run_id) group_left ()\n"
             "     max by (job, run_id) (rank:zerodoc_compute_seconds:per_step))\n)"),
        # The straggler's cost: the other ranks' exposed time beyond its own, per step (the
        # median over them), as a share of the median step.
        _rec("job:zerodoc_slowest_rank_exposed_seconds:per_step",
             f"max by ({JOB}) (\n  rank:zerodoc_comm_exposed_seconds:per_step\n  and\n"
             f"  (rank:zerodoc_compute_seconds:per_step == on ({JOB}) group_left ()\n"
             f"     max by ({JOB}) (rank:zerodoc_compute_seconds:per_step))\n)"),
        # ---- per rank: memory -------------------------------------------------------------
        _rec("rank:zerodoc_memory_headroom:fraction",
             "zerodoc_memory_headroom_bytes\n/\nzerodoc_device_memory_capacity_bytes"),
        # peak populations when the GPU path reports them, else the current ones (as ZD012)
        _rec("rank:zerodoc_device_memory_reserved:bytes",
             f"{_pop(PEAK_RESERVED)} > 0\nor\n{_pop(RESERVED)}"),
        _rec("rank:zerodoc_device_memory_allocated:bytes",
             f"({_pop(PEAK_ALLOCATED)} and {_pop(PEAK_RESERVED)} > 0)\nor\n{_pop(ALLOCATED)}"),
        _rec("rank:zerodoc_device_memory_fragmentation:ratio",
             "(rank:zerodoc_device_memory_reserved:bytes - rank:zerodoc_device_memory_allocated:bytes)\n"
             "/\n(rank:zerodoc_device_memory_reserved:bytes > 0)"),
        _rec("rank:zerodoc_device_memory_reserved:fraction",
             "rank:zerodoc_device_memory_reserved:bytes\n/\nzerodoc_device_memory_capacity_bytes"),
        # ---- per job: medians over ranks --------------------------------------------------
        _rec("job:zerodoc_step_seconds:median",
             f"quantile by ({JOB}) (0.5, rank:zerodoc_step_seconds:mean)"),
        _rec("job:zerodoc_compute_seconds:median_per_step",
             f"quantile by ({JOB}) (0.5, rank:zerodoc_compute_seconds:per_step)"),
        _rec("job:zerodoc_straggler_peer_wait:fraction",
             f"quantile by ({JOB}) (0.5,\n  clamp_min(\n"
             "    (\n      rank:zerodoc_comm_exposed_seconds:per_step\n      unless\n"
             f"      (rank:zerodoc_compute_seconds:per_step == on ({JOB}) group_left ()\n"
             f"         max by ({JOB}) (rank:zerodoc_compute_seconds:per_step))\n    )\n"
             f"    - on ({JOB}) group_left () job:zerodoc_slowest_rank_exposed_seconds:per_step,\n"
             "    0\n  )\n)\n/\njob:zerodoc_step_seconds:median"),
    ]
    return rules


def quantile_rules(window: str = "1m") -> list[dict]:
    """Step-time quantiles per rank and per run (group `zerodoc.step_quantiles`, beside the
    rank group: half its time at 1,024 ranks, and nothing there reads them). The buckets'
    rates are recorded once (17 series a rank) for the six quantiles: each rate()d them
    itself before."""
    rules = [_rec(BUCKET_RATE, f"rate(zerodoc_step_duration_seconds_bucket[{window}])")]
    for q in (0.5, 0.9, 0.99):
        rules.append(_rec(f"rank:zerodoc_step_seconds:p{round(q * 100)}",
                          f"histogram_quantile({q}, {BUCKET_RATE})"))
    for q in (0.5, 0.9, 0.99):
        rules.append(_rec(f"job:zerodoc_step_seconds:p{round(q * 100)}",
                          f"histogram_quantile({q},\n  sum by ({JOB}, le) ({BUCKET_RATE})\n)"))
    return rules


def unit_rules(t: Thresholds = DEFAULT, window: str = "1m", link: str = "infiniband") -> list[dict]:
    """Rules over the per-unit counters: their per-step rates recorded once, then every
    per-unit, per-collective and per-job number from those."""
    w = window
    sec, exp, nbytes = (PER_STEP[c] for c in ("seconds", "exposed_seconds", "bytes"))
    sel_ag = f"{{{AG}}}"
    rules = [
        *unit_stat_rules(w),  # the recorded per-step rates first: every rule below reads them
        # ---- per rank, over its units: bandwidth (ratios of per-step numbers: the steps
        # cancel). Per rank AND unit (a unit's exposed share, bytes per call, busbw) the
        # layers dashboard computes at query time for the ranks it shows, from the recorded
        # per-step rates: recorded, they were 486 series a rank written every evaluation
        # (~500k at 1,024 ranks, a quarter of this group's time; issue 33).
        # Each unit's bus factor, the world's where its group's is unknown (and for a coarse
        # rank's unit-less totals: the row without a unit), one series a unit and collective,
        # so that the per-rank bus bytes take one join instead of `bus_bytes`' two and an
        # `or` over every rank's series; then each rank's bytes, bus bytes and seconds per
        # collective once (a few series a rank) for both bandwidths (26 s of this group's
        # 89 s at 1,024 ranks before).
        _rec(FACTOR_ANY,
             f"{UNIT_FACTOR}\nor\n{WORLD_FACTOR} * on ({JOB}, collective) group_right ()\n"
             f"(0 * count without (phase) ({UNIT_STAT['bytes'][1]['mean']}) + 1)\nor\n"
             f"{WORLD_FACTOR}"),
        _rec(RANK_BYTES, f"sum without (unit, phase) ({nbytes})"),
        _rec(RANK_SECONDS, f"sum without (unit, phase) ({sec})"),
        _rec(RANK_BUS_BYTES,
             f"sum without (unit) (\n  sum without (phase) ({nbytes})\n"
             f"  * on ({JOB}, unit, collective) group_left ()\n  {FACTOR_ANY}\n)"),
        _rec("collective_rank:zerodoc_collective_busbw:bytes_per_second",
             f"{RANK_BUS_BYTES}\n/\n({RANK_SECONDS} > 0)"),
        _rec("collective_rank:zerodoc_collective_algbw:bytes_per_second",
             f"{RANK_BYTES}\n/\n{RANK_SECONDS}"),
        # ---- per unit over ranks: the layers dashboard's shares (worst rank), recorded so
        # its panels read a few series a unit instead of every rank's (issue 33: 8-23 s a
        # panel query at 1,024 ranks)
        *(_rec(name, f"max by ({JOB}, unit) (\n{unit_rank_views()[view]}\n)")
          for name, view in UNIT_SHARES.items()),
        # ---- per job: link-attributable views (the engine's CommView) ---------------------
        _rec("unit_job:zerodoc_collective_seconds:per_step", _agg("min", _unit("seconds"))),
        _rec("unit_job:zerodoc_collective_exposed_seconds:per_step",
             _agg("min", _unit("exposed_seconds"))),
        _rec("unit_job:zerodoc_collective_bytes:per_step", _agg("median", _unit("bytes"))),
        _rec("unit_job:zerodoc_collective_bus_bytes:per_step",
             bus_bytes("unit_job:zerodoc_collective_bytes:per_step")),
        _rec("unit_job:zerodoc_collective_bytes:per_call",
             "unit_job:zerodoc_collective_bytes:per_step\n/\n" + _agg("median", _unit("calls"))),
        # Time the link explains: the bus bytes at slow_link_busbw_fraction of the link's
        # expected bandwidth (below that the slow-link rule speaks instead).
        _rec("unit_job:zerodoc_collective_explained_seconds:per_step",
             "unit_job:zerodoc_collective_bus_bytes:per_step / "
             f"{LINK_BUSBW[link] * t.slow_link_busbw_fraction:g}"),
        # How many (rank, unit, phase) all-gathers overlapped compute (>1 % hidden); absent
        # when all are synchronous (FSDP2's default on gloo/CPU exposes every byte). Per
        # step or per second alike: the same rank's divisor on both sides.
        _rec(ASYNC_ALL_GATHER,
             f"count by ({JOB}) (\n  {sec}{sel_ag} - {exp}{sel_ag}\n"
             f"  > 0.01 * {sec}{sel_ag}\n)"),
        _rec("unit_job:zerodoc_collective_avoidable_seconds:per_step",
             "(\n  unit_job:zerodoc_collective_exposed_seconds:per_step\n"
             f"  and on ({JOB}) job:zerodoc_all_gather:asynchronous\n)\nor\n"
             "clamp_min(\n  unit_job:zerodoc_collective_exposed_seconds:per_step\n"
             "  - unit_job:zerodoc_collective_explained_seconds:per_step,\n  0\n)"),
        _rec("job:zerodoc_all_gather_exposed:fraction",
             f"sum by ({JOB}) (unit_job:zerodoc_collective_exposed_seconds:per_step{{{AG}}})\n"
             "/\njob:zerodoc_step_seconds:median"),
        _rec("job:zerodoc_all_gather_avoidable:fraction",
             f"sum by ({JOB}) (unit_job:zerodoc_collective_avoidable_seconds:per_step{{{AG}}})\n"
             "/\njob:zerodoc_step_seconds:median"),
        _rec("job:zerodoc_comm_avoidable_compute:ratio",
             f"sum by ({JOB}) (unit_job:zerodoc_collective_avoidable_seconds:per_step)\n"
             "/\njob:zerodoc_compute_seconds:median_per_step"),
        # Exposed communication / compute as it is (the engine's raw ratio: ZD006 grades it
        # for synchronous all-gathers, whose time the link partly explains)
        _rec("job:zerodoc_comm_exposed_compute:ratio",
             f"sum by ({JOB}) (unit_job:zerodoc_collective_exposed_seconds:per_step)\n"
             "/\njob:zerodoc_compute_seconds:median_per_step"),
        # All-gathers timed and not one of them hidden (the engine's `sync`): present as 1
        _rec("job:zerodoc_all_gather:synchronous",
             f"count by ({JOB}) (unit_job:zerodoc_collective_seconds:per_step{{{AG}}}) > bool 0\n"
             f"unless on ({JOB}) job:zerodoc_all_gather:asynchronous"),
        # ZD005's cost: exposed time of the large collectives beyond the time they take at
        # the link's full expected bandwidth, per collective kind, as a share of the step
        _rec("collective_job:zerodoc_collective_beyond_link:fraction",
             f"sum by ({JOB}, collective) (\n"
             "  clamp_min(\n    unit_job:zerodoc_collective_exposed_seconds:per_step\n"
             f"    - unit_job:zerodoc_collective_bus_bytes:per_step / {LINK_BUSBW[link]:g},\n"
             "    0\n  )\n"
             f"  and unit_job:zerodoc_collective_bytes:per_call >= {t.slow_link_min_bytes}\n)\n"
             f"/ on ({JOB}) group_left ()\njob:zerodoc_step_seconds:median"),
        _rec("collective_job:zerodoc_collective_busbw_large:bytes_per_second",
             f"sum by ({JOB}, collective) (\n"
             "  unit_job:zerodoc_collective_bus_bytes:per_step\n"
             f"  and unit_job:zerodoc_collective_bytes:per_call >= {t.slow_link_min_bytes}\n)\n/\n"
             f"sum by ({JOB}, collective) (\n"
             "  unit_job:zerodoc_collective_seconds:per_step > 0\n"
             f"  and unit_job:zerodoc_collective_bytes:per_call >= {t.slow_link_min_bytes}\n)"),
    ]
    return rules
