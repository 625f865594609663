"""The two-level layout's rules (issue 33 item 3): per-rack Prometheus servers that scrape
their ranks and pre-aggregate per unit, and a central store (VictoriaMetrics + vmalert, or any
Prometheus-API engine) that combines the racks into the SAME series the flat rules record.

    rack  (one Prometheus per rack / node group; `rack_files()["zerodoc-rack.yml"]`)
      scrapes its ranks, plus rank 0's run facts (`zerodoc_unit_group_size`,
      `zerodoc_world_size`: the bus-bandwidth factors need them, and rank 0 is in one rack);
      records each rank's per-step rates per unit (`recording.per_step_rules`, as flat), then
      per unit over ITS ranks only what combines exactly: min, max, sum and count
      (`unit_rack:...:per_step_{min,max,sum}`, `unit_rack:...:ranks`), and the per-rank
      per-collective bytes / seconds / bandwidths (a few series a rank);
      remote-writes to the central store ONLY the rank-level series (raw series without a
      `unit` label, the run's per-unit facts, `up` and scrape health) and what the rack
      rules record for the centre (`central_names()`): `rack_prometheus_config()`'s
      `write_relabel_configs` keep-list, exact names joined in one `__name__` alternation
      (the only regex; none over other label values but the facts job's own marker label).
    central (`zerodoc-central.yml` + the flat alerts file, unchanged)
      evaluates the flat rank-level groups verbatim on the forwarded rank-level series, and
      combines the racks: min of mins, max of maxes, sum of sums over sum of counts (a
      mean; a mean of the racks' means would weigh a rack of 3 ranks like one of 125),
      count = sum of counts; the flat per-job rules that read only `unit_job:` / `job:`
      series follow verbatim (`recording.unit_rules`' tail), so `zerodoc report`, the TUI,
      the dashboards and the alerts read the central store unchanged.

What changes against the flat layout (the only stats that do not combine are medians):

- `unit_job:zerodoc_collective_{calls,bytes}:per_step{,_median}` and the framework's
  per-unit median: recorded only where every rank of every rack has the same number
  (min of mins == max of maxes, the median then exactly), absent elsewhere. FSDP's
  per-unit calls and bytes per step are the same on every rank of a unit, and the
  framework's per-unit time is served by rank 0 alone, so in practice all three are there;
  where they are not, `zerodoc report` says the median is not recorded (`sources.prometheus`)
  and everything built on the bytes median (bytes per call, bus bytes, the slow-link and
  avoidable-time rules) is absent rather than wrong.
- The per-rank, per-unit rates stay in the racks (~1 M series at 1,024 ranks x 81 units):
  a rank's own per-unit drill-down (the layers dashboard's per-rank panels, `unit_rank_views`)
  queries the rack's Prometheus, not the centre.
- Coarse ranks' unit-less per-unit totals are not forwarded (their metric names are the
  per-unit ones); the per-rank collective series the rack records include them.
- The central unit series lag the racks' by up to one rack evaluation plus the remote-write
  delay; vmalert's chained rules read the previous evaluation's results.

Standard library only.
"""

from __future__ import annotations

from ...catalog import (
    ASYNC_ALL_GATHER, CATALOG, RULE_WINDOW, UNIT_COMPUTE, UNIT_FRAMEWORK, UNIT_RANKS, UNIT_STAT,
)
from ...thresholds import DEFAULT, Thresholds
from .recording import (
    FACTOR_ANY, FRAMEWORK_PER_STEP, JOB, KEY, PER_STEP, QUANTILE_GROUP, RANK_BUS_BYTES,
    RANK_BYTES, RANK_GROUP, RANK_SECONDS, UNIT_FACTOR, UNIT_SHARES, UNITS, WORLD_FACTOR, _rec,
    _seconds, _steps, _unit, per_step_rules, quantile_rules, rank_rules, unit_rank_views,
    unit_rules, unit_window,
)

RACK_FILE = "zerodoc-rack.yml"
CENTRAL_FILE = "zerodoc-central.yml"
RACK_CONFIG_FILE = "rack-prometheus.yml"
RACK_LABEL = "zerodoc_rack"
"""External label of a rack's Prometheus: its series stay apart in the central store."""
FACTS_LABEL = "zerodoc_facts"
"""Marks the rack's own scrape of rank 0's run facts (dropped before the remote write)."""
RACK_RANK_GROUP, RACK_UNIT_GROUP = "zerodoc.rack.ranks", "zerodoc.rack.units"
CENTRAL_UNIT_GROUP = "zerodoc.central.units"

# what each field's per-step number is, per rank, unit, phase and collective
_FIELDS = {"calls": _unit("calls"), "bytes": _unit("bytes"), "seconds": _unit("seconds"),
           "exposed_seconds": _unit("exposed_seconds"),
           "hidden_seconds": f"{_unit('seconds')} - {_unit('exposed_seconds')}"}
_STAT_FIELD = {"count": "calls", "bytes": "bytes", "seconds": "seconds",
               "exposed": "exposed_seconds", "hidden": "hidden_seconds"}
_RACK_AGG = {"min": "min", "max": "max", "sum": "sum"}
RACK_RANKS = "unit_rack:zerodoc_collective_ranks:count"
RACK_ASYNC = "rack:zerodoc_all_gather:asynchronous"
RACK_BYTES_MEAN = "unit_rack:zerodoc_collective_bytes:per_step_sum"


def rack_name(field: str, agg: str) -> str:
    """A rack's per-unit aggregate of one field (`_FIELDS`) over its ranks."""
    return f"unit_rack:zerodoc_collective_{field}:per_step_{agg}"


def _rack_compute(agg: str) -> str:
    return f"unit_phase_rack:zerodoc_compute_seconds:per_step_{agg}"


def _rack_framework(agg: str) -> str:
    return f"unit_rack:zerodoc_framework_unit_seconds:per_step_{agg}"


def _rack_share(name: str) -> str:
    return name.replace("unit_job:", "unit_rack:")


def _needed(stat_aggs) -> set[str]:
    """The rack aggregates a central stat needs: a mean needs the sum (and the count), a
    median the min and the max (it is recorded only where they meet)."""
    need = {"min": {"min"}, "max": {"max"}, "mean": {"sum"}, "median": {"min", "max"}}
    return set().union(*(need[a] for a in stat_aggs))


def rack_unit_rules(w: str) -> list[dict]:
    """The rack's per-unit rules over its own ranks: each rank's per-step rates (as flat),
    then per unit the aggregates that combine across racks, and the per-rank collective
    series (per rank: exact in the rack)."""
    rules = per_step_rules(w)
    for f, (_metric, aggs) in UNIT_STAT.items():
        field = _STAT_FIELD[f]
        for a in sorted(_needed(aggs)):
            rules.append(_rec(rack_name(field, a), _agg_rack(a, _FIELDS[field], KEY)))
    rules.append(_rec(RACK_RANKS, f"count by ({KEY}) (\n  {_unit('calls')}\n)"))
    comp = (f"rate(zerodoc_compute_seconds_total{{{UNITS}}}[{w}])\n"
            f"  / ignoring (unit, phase) group_left ()\n  {_steps(w)}")
    for a in ("sum", "max"):
        rules.append(_rec(_rack_compute(a), _agg_rack(a, comp, f"{JOB}, unit, phase")))
    rules.append(_rec(_rack_compute("count"), f"count by ({JOB}, unit, phase) (\n  {comp}\n)"))
    flat = {r["record"]: r["expr"] for r in unit_rules(window=w)}
    rules.append(_rec(FRAMEWORK_PER_STEP, flat[FRAMEWORK_PER_STEP]))
    for a in ("min", "max", "sum"):
        rules.append(_rec(_rack_framework(a), _agg_rack(a, FRAMEWORK_PER_STEP, f"{JOB}, unit")))
    rules.append(_rec(_rack_framework("count"),
                      f"count by ({JOB}, unit) (\n  {FRAMEWORK_PER_STEP}\n)"))
    for name, view in UNIT_SHARES.items():
        rules.append(_rec(_rack_share(name),
                          f"max by ({JOB}, unit) (\n{unit_rank_views()[view]}\n)"))
    rules.append(_rec(RACK_ASYNC, flat[ASYNC_ALL_GATHER]))
    # per rank over its units: the flat rules verbatim, the unit list from the rack's sums
    rules.append(_rec(FACTOR_ANY, flat[FACTOR_ANY].replace(
        UNIT_STAT["bytes"][1]["mean"], RACK_BYTES_MEAN)))
    for name in (RANK_BYTES, RANK_SECONDS, RANK_BUS_BYTES, *RANK_BANDWIDTHS):
        rules.append(_rec(name, flat[name]))
    return rules


RANK_BANDWIDTHS = ("collective_rank:zerodoc_collective_busbw:bytes_per_second",
                   "collective_rank:zerodoc_collective_algbw:bytes_per_second")


def _agg_rack(a: str, expr: str, by: str) -> str:
    return f"{_RACK_AGG[a]} by ({by}) (\n  {expr}\n)"


def rack_rank_rules(t: Thresholds = DEFAULT, window: str = "1m") -> list[dict]:
    """The few rank-level rules the rack's per-unit rules read (the mean step of the
    layers shares, the bus factors from rank 0's facts): not forwarded, the centre records
    its own from the forwarded raw series."""
    keep = {"unit_job:zerodoc_unit_group_size:max", UNIT_FACTOR, "job:zerodoc_world_size:max",
            WORLD_FACTOR, "rank:zerodoc_steps:rate", "rank:zerodoc_step_seconds:mean"}
    return [r for r in rank_rules(t, window) if r["record"] in keep]


def _combine(a: str, field: str, by: str = KEY) -> str:
    """A central stat over every rack's ranks from the racks' aggregates (module docstring)."""
    if a == "min":
        return f"min by ({by}) ({rack_name(field, 'min')})"
    if a == "max":
        return f"max by ({by}) ({rack_name(field, 'max')})"
    if a == "mean":
        return (f"sum by ({by}) ({rack_name(field, 'sum')})\n/\n"
                f"sum by ({by}) ({RACK_RANKS})")
    return (f"min by ({by}) ({rack_name(field, 'min')})\n==\n"
            f"max by ({by}) ({rack_name(field, 'max')})")


def central_unit_rules(t: Thresholds = DEFAULT, window: str = "4m",
                       link: str = "infiniband") -> list[dict]:
    """The centre's per-unit group: the flat `unit_job:` stats combined from the racks, then
    the flat per-job rules that read only those (verbatim)."""
    rules = []
    for f, (_metric, aggs) in UNIT_STAT.items():
        for a, name in aggs.items():
            rules.append(_rec(name, _combine(a, _STAT_FIELD[f])))
    rules.append(_rec(UNIT_RANKS, f"sum by ({KEY}) ({RACK_RANKS})"))
    by = f"{JOB}, unit, phase"
    rules.append(_rec(UNIT_COMPUTE["mean"], f"sum by ({by}) ({_rack_compute('sum')})\n/\n"
                      f"sum by ({by}) ({_rack_compute('count')})"))
    rules.append(_rec(UNIT_COMPUTE["max"], f"max by ({by}) ({_rack_compute('max')})"))
    by = f"{JOB}, unit"
    fw = {"min": f"min by ({by}) ({_rack_framework('min')})",
          "max": f"max by ({by}) ({_rack_framework('max')})",
          "mean": f"sum by ({by}) ({_rack_framework('sum')})\n/\n"
                  f"sum by ({by}) ({_rack_framework('count')})",
          "median": f"min by ({by}) ({_rack_framework('min')})\n==\n"
                    f"max by ({by}) ({_rack_framework('max')})",
          "n": f"sum by ({by}) ({_rack_framework('count')})"}
    rules += [_rec(UNIT_FRAMEWORK[a], fw[a]) for a in ("min", "median", "mean", "max", "n")]
    rules.append(_rec(RULE_WINDOW, f"0 * max by ({JOB}) (zerodoc_world_size) + "
                                   f"{_seconds(window):g}"))
    rules += [_rec(name, f"max by ({JOB}, unit) ({_rack_share(name)})") for name in UNIT_SHARES]
    rules.append(_rec(ASYNC_ALL_GATHER, f"sum by ({JOB}) ({RACK_ASYNC})"))
    # flat: the bytes median over the calls' median, inline over every rank's rates
    rules.append(_rec(PER_CALL, f"{UNIT_STAT['bytes'][1]['median']}\n/\n"
                                f"{UNIT_STAT['count'][1]['median']}"))
    done = {r["record"] for r in rules}
    per_rank = set(PER_STEP.values()) | {FRAMEWORK_PER_STEP, FACTOR_ANY, RANK_BYTES,
                                         RANK_SECONDS, RANK_BUS_BYTES, *RANK_BANDWIDTHS}
    rules += [r for r in unit_rules(t, window, link)
              if r["record"] not in done and r["record"] not in per_rank
              and r["record"] not in _COMPUTED_IN_RACKS]
    return rules


_COMPUTED_IN_RACKS = set(UNIT_COMPUTE.values())  # the flat rules' raw-counter compute stats
PER_CALL = "unit_job:zerodoc_collective_bytes:per_call"


def central_names(t: Thresholds = DEFAULT, window: str = "4m") -> list[str]:
    """The rack-recorded series the centre reads: the racks' aggregates and the per-rank
    collective series (the flat names)."""
    return [r["record"] for r in rack_unit_rules(window)
            if r["record"] not in set(PER_STEP.values()) | {FRAMEWORK_PER_STEP, FACTOR_ANY}]


def rank_level_names() -> list[str]:
    """The raw series a rack forwards: every catalog series without a `unit` label, the
    run's per-unit facts (rank 0's, one series a unit), `up` and the scrape health series
    the monitoring alerts read."""
    names = [s for m in CATALOG if "unit" not in m.labels or m.scope == "run"
             for s in m.series_names]
    return [*names, "up", "scrape_duration_seconds", "scrape_timeout_seconds",
            "scrape_samples_scraped"]


def rack_groups(t: Thresholds = DEFAULT, window: str = "1m",
                unit_win: str | None = None, unit_interval: str | None = None) -> list[dict]:
    uw = unit_win or unit_window(window)
    return [{"name": RACK_RANK_GROUP, "rules": rack_rank_rules(t, window)},
            {"name": RACK_UNIT_GROUP, "interval": unit_interval or uw,
             "rules": rack_unit_rules(uw)}]


def central_groups(t: Thresholds = DEFAULT, window: str = "1m", link: str = "infiniband",
                   unit_win: str | None = None, unit_interval: str | None = None) -> list[dict]:
    uw = unit_win or unit_window(window)
    return [{"name": RANK_GROUP, "rules": rank_rules(t, window)},
            {"name": QUANTILE_GROUP, "rules": quantile_rules(window)},
            {"name": CENTRAL_UNIT_GROUP, "interval": unit_interval or uw,
             "rules": central_unit_rules(t, uw, link)}]


def rack_prometheus_config(rack: str, central_write_url: str, *, ranks_sd: list[str],
                           facts_sd: list[str], scrape_interval: str = "15s",
                           rule_file: str = RACK_FILE,
                           t: Thresholds = DEFAULT, unit_win: str = "4m") -> dict:
    """A rack's Prometheus configuration: its ranks (`ranks_sd`: zerodoc's file_sd files of
    the rack's ranks), rank 0's run facts (`facts_sd`: rank 0's file_sd file; its `job` and
    `run_id` labels join the facts to the ranks), the rack rules, and the remote write of the
    rank-level series and the racks' aggregates only (exact names; module docstring)."""
    keep = sorted(set(rank_level_names()) | set(central_names(t, unit_win)))
    facts = ["zerodoc_unit_group_size", "zerodoc_world_size"]
    return {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval,
                   "external_labels": {RACK_LABEL: rack}},
        "rule_files": [rule_file],
        # honor_labels, as exporters/prometheus.yml: the ranks' own rank / local_rank / node
        # labels win over the identical target labels (else every series gains exported_*)
        "scrape_configs": [
            {"job_name": "zerodoc", "honor_labels": True, "file_sd_configs": [{"files": ranks_sd}]},
            {"job_name": "zerodoc-facts", "honor_labels": True,
             "file_sd_configs": [{"files": facts_sd}],
             "metric_relabel_configs": [
                 {"source_labels": ["__name__"], "regex": "|".join(facts), "action": "keep"},
                 {"target_label": FACTS_LABEL, "replacement": "1"}]},
        ],
        "remote_write": [{
            "url": central_write_url,
            "write_relabel_configs": [
                {"source_labels": ["__name__"], "regex": "|".join(keep), "action": "keep"},
                {"source_labels": [FACTS_LABEL], "regex": "1", "action": "drop"}],
        }],
    }
