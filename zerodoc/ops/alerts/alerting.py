"""Alerting rules: the engine rules PromQL can express, plus zerodoc's own health.

Engine-mirroring alerts (label `zerodoc_rule: ZD0xx`) read the
job-level recording rules, which compute the engine's own numbers, with the engine's
thresholds and comparisons (`>=` where the engine grades with `>=`). WARNING maps to
severity `warning`, ERROR to `critical`; the engine's INFO notes have no alert.

ZD013 (a stopped run) reads the watchdog's gauge `zerodoc_stall_since_timestamp_seconds` and
`up`, and names the rank that stopped first and, with a query in its description, the ranks
waiting for it.

Not expressible in PromQL from the exported series, so engine-only: ZD001 / ZD002 / ZD003 /
ZD008 / ZD009 (static configuration and planner checks, shown on the dashboards where a
series exists) and ZD011 (CPU offload is a configuration fact, not a series).

The monitoring itself (issue 33 item 5): a zerodoc rule group taking more than half its
interval or missing an iteration (Prometheus' own `prometheus_rule_group_*` series: the server
must scrape itself), a rank's scrape slow against its timeout, a rank serving more series
than `zerodoc.ops.cardinality.BUDGET_FULL`.

Every alert's `runbook_url` is `<runbook_base>docs/runbooks.md#<alert name, lower case>`: one
section per alert (what it means, how to confirm it, the fix, how to silence it for a known
cause); a test checks that each anchor exists.
"""

from __future__ import annotations

from ...thresholds import DEFAULT, LINK_BUSBW, Thresholds
from ..cardinality import BUDGET_FULL
from .recording import unit_window as default_unit_window

RUNBOOKS = "docs/runbooks.md"
DEFAULT_STALL_AFTER_S = 120.0  # zerodoc.shim.config.AttachConfig.stall_after_s (the shim's default)
WHO = "rank {{ $labels.rank }} ({{ $labels.instance }}, node {{ $labels.node }})"
RUN = "run {{ $labels.run_id }} (job {{ $labels.job }})"


def _pct(x: float) -> str:
    return f"{x * 100:g}%"


def _gbps(x: float) -> str:
    return f"{x / 1e9:g} GB/s"


def _duration(seconds: float) -> str:
    s = int(round(seconds))
    if s % 3600 == 0:
        return f"{s // 3600}h"
    if s % 60 == 0:
        return f"{s // 60}m"
    return f"{s}s"


def _cap(s: str) -> str:
    return s[0].upper() + s[1:]


def alerting_rules(t: Thresholds = DEFAULT, *, window: str = "1m", alert_for: str | None = None,
                   link: str = "infiniband", runbook_base: str = "",
                   extra_labels: dict[str, str] | None = None,
                   unit_window: str | None = None) -> list[dict]:
    # uw: the window of the per-unit groups' series (recording.unit_window) the ZD004/5/6
    # alerts read; w: the rank-level one
    w, for_ = window, alert_for or t.alert_for
    uw = unit_window or default_unit_window(window)
    link_bw = LINK_BUSBW[link]
    rules: list[dict] = []

    def alert(name, expr, severity, code, summary, description, for_=for_):
        labels = {"severity": severity, **(extra_labels or {})}
        if code:
            labels["zerodoc_rule"] = code
        rules.append({
            "alert": name, "expr": expr, "for": for_, "labels": labels,
            "annotations": {"summary": summary, "description": description,
                            "runbook_url": runbook_url(name, runbook_base)},
        })

    # ZD004 exposed all-gather
    for sev, thr in (("warning", t.exposed_fraction_warn), ("critical", t.exposed_fraction_crit)):
        alert("ZerodocExposedAllGather", f"job:zerodoc_all_gather_avoidable:fraction >= {thr:g}",
              sev, "ZD004",
              "All-gathers of {{ $labels.run_id }} expose {{ $value | humanizePercentage }} "
              "of the step: prefetch is not keeping up",
              f"Over the last {uw}, {RUN} waited on all-gathers for {{{{ $value | "
              f"humanizePercentage }}}} of its median step time beyond what the {link} link "
              f"explains (link-attributable: the rank that waited least; warning at "
              f"{_pct(t.exposed_fraction_warn)}, critical at {_pct(t.exposed_fraction_crit)}). "
              "The per-layer dashboard shows which units.")
    # ZD006 comm-bound
    # synchronous all-gathers: past crit, the raw ratio is a warning too (ZD006)
    raw_cb = (f"\nor\n(\n  job:zerodoc_comm_exposed_compute:ratio >= {t.comm_compute_ratio_crit:g}"
              "\n  and on (job, run_id) job:zerodoc_all_gather:synchronous\n)")
    for sev, thr in (("warning", t.comm_compute_ratio_warn),
                     ("critical", t.comm_compute_ratio_crit)):
        alert("ZerodocCommBound", f"job:zerodoc_comm_avoidable_compute:ratio >= {thr:g}"
              + (raw_cb if sev == "warning" else ""), sev,
              "ZD006",
              "{{ $labels.run_id }} is communication-bound (exposed comm / compute "
              "{{ $value | printf \"%.2f\" }})",
              f"Over the last {uw}, {RUN} waited {{{{ $value | printf \"%.2f\" }}}} s on exposed "
              f"collectives (beyond what the {link} link explains) per second of compute "
              f"(warning at {t.comm_compute_ratio_warn:g}, critical at "
              f"{t.comm_compute_ratio_crit:g}; with synchronous all-gathers also a warning "
              f"when all exposed communication reaches {t.comm_compute_ratio_crit:g}x the "
              "compute).")
    # ZD007 low headroom
    for sev, thr in (("warning", t.headroom_fraction_warn), ("critical", t.headroom_fraction_crit)):
        alert("ZerodocLowMemoryHeadroom", f"rank:zerodoc_memory_headroom:fraction < {thr:g}",
              sev, "ZD007",
              "Rank {{ $labels.rank }} has {{ $value | humanizePercentage }} memory headroom",
              f"{_cap(WHO)} has {{{{ $value | humanizePercentage }}}} of its memory capacity "
              f"left above its peak (warning below {_pct(t.headroom_fraction_warn)}, critical "
              f"below {_pct(t.headroom_fraction_crit)}); an allocation spike can OOM it.")
    # ZD012 fragmentation (WARNING when the allocator holds a large share or has retried)
    alert("ZerodocAllocatorFragmentation",
          f"rank:zerodoc_device_memory_fragmentation:ratio >= {t.fragmentation_ratio_warn:g}\n"
          "and (\n"
          f"  rank:zerodoc_device_memory_reserved:fraction >= {t.fragmentation_min_reserved_fraction:g}\n"
          "  or sum without (population) (zerodoc_memory_bytes{population=\"alloc_retries\"}) > 0\n)",
          "warning", "ZD012",
          "Rank {{ $labels.rank }}: {{ $value | humanizePercentage }} of reserved GPU memory "
          "is not allocated",
          f"On {WHO}, {{{{ $value | humanizePercentage }}}} of the memory the caching allocator "
          f"reserved is not allocated to tensors (warning at {_pct(t.fragmentation_ratio_warn)} "
          f"when it holds {_pct(t.fragmentation_min_reserved_fraction)} of the device or has "
          "retried an allocation): fragmentation can OOM with memory \"free\".")
    # ZD010 straggler
    alert("ZerodocStraggler",
          f"rank:zerodoc_compute_skew:ratio >= {t.straggler_ratio_warn:g}\n"
          f"and on (job, run_id)\njob:zerodoc_straggler_peer_wait:fraction >= "
          f"{t.exposed_fraction_warn:g}",
          "warning", "ZD010",
          "Rank {{ $labels.rank }} computes {{ $value | printf \"%.2f\" }}x slower than the "
          "other ranks",
          f"Over the last {w}, {WHO} needed {{{{ $value | printf \"%.2f\" }}}} times the "
          f"median compute time per step of the other ranks (warning at "
          f"{t.straggler_ratio_warn:g}x when the others wait at least "
          f"{_pct(t.exposed_fraction_warn)} of the step for it).")
    # ZD005 slow link: below slow_link_busbw_fraction of the link, or (synchronous
    # all-gathers) below slow_link_costly_busbw_fraction when the wait beyond the link's
    # expected time is >= exposed_fraction_crit of the step. Critical as the engine's ERROR
    # (that cost >= exposed_fraction_crit) and, as the engine raises a cause to what it
    # explains, when its symptoms ZerodocExposedAllGather / ZerodocCommBound are critical:
    # the root cause is never quieter than its symptoms (alertmanager.yml inhibits those
    # while it fires).
    busbw = "collective_job:zerodoc_collective_busbw_large:bytes_per_second"
    beyond = "collective_job:zerodoc_collective_beyond_link:fraction"
    kinds = '{collective=~"all_gather|reduce_scatter|all_reduce"}'
    slow = t.slow_link_busbw_fraction * link_bw
    costly = t.slow_link_costly_busbw_fraction * link_bw
    per_call = 'unit_job:zerodoc_collective_bytes:per_call{collective="all_gather"}'
    too_fine = (f"      count by (job, run_id) (count by (job, run_id, unit) ({per_call})) >= "
                f"{t.wrap_fine_min_units}\n      and on (job, run_id)\n      quantile by (job, "
                f"run_id) (0.5, {per_call}) < {t.wrap_fine_median_bytes}\n")
    slow_expr = (f"(\n  {busbw}{kinds} < {slow:g}\n  or\n  (\n    {busbw}{kinds} < {costly:g}\n"
                 f"    and on (job, run_id, collective) {beyond} >= {t.exposed_fraction_crit:g}\n"
                 "    and on (job, run_id) job:zerodoc_all_gather:synchronous\n"
                 f"    unless on (job, run_id) (\n{too_fine}    )\n  )\n)")
    crit_expr = (f"{slow_expr}\nand on (job, run_id)\n(\n"
                 f"  sum by (job, run_id) ({beyond} and on (job, run_id, collective) {slow_expr})"
                 f" >= {t.exposed_fraction_crit:g}\n"
                 f"  or job:zerodoc_all_gather_avoidable:fraction >= {t.exposed_fraction_crit:g}\n"
                 f"  or job:zerodoc_comm_avoidable_compute:ratio >= {t.comm_compute_ratio_crit:g}\n)")
    for sev, expr in (("warning", slow_expr), ("critical", crit_expr)):
        alert("ZerodocSlowLink", expr, sev, "ZD005",
              "{{ $labels.collective }} bus bandwidth of {{ $labels.run_id }} is "
              "{{ $value | humanize }}B/s, far below the link's",
              f"Over the last {uw}, {RUN} moved its {{{{ $labels.collective }}}} calls of at "
              f"least {t.slow_link_min_bytes} bytes at {{{{ $value | humanize }}}}B/s bus "
              f"bandwidth (link-attributable), below {_pct(t.slow_link_busbw_fraction)} of the "
              f"{_gbps(link_bw)} expected for link class {link} (or below "
              f"{_pct(t.slow_link_costly_busbw_fraction)} with synchronous collectives when "
              f"waiting on it beyond its expected time costs "
              f"{_pct(t.exposed_fraction_crit)} of the step). Critical when that wait is "
              f"{_pct(t.exposed_fraction_crit)} of the step or more, or when the exposed "
              "all-gather / comm-bound alerts it explains are critical.")
    # ZD013 rank stopped: the rank that stopped first, and the ranks left waiting for it.
    # First choice: a rank stuck outside any collective (what the others wait for); else a
    # rank whose exporter is down while others wait in collectives (it died, or hangs holding
    # the interpreter lock); else the rank stuck earliest.
    stall = "zerodoc_stall_since_timestamp_seconds"
    waiters = (f'{{{{ range $i, $w := printf "{stall}{{job=\\"%s\\",run_id=\\"%s\\",'
               'rank!=\\"%s\\",collective!=\\"\\"}" $labels.job $labels.run_id $labels.rank '
               '| query | sortByLabel "rank" }}{{ if $i }}, {{ end }}rank {{ $w.Labels.rank }} '
               '({{ $w.Labels.collective }} of {{ $w.Labels.unit }}, {{ $w.Labels.phase }})'
               '{{ else }}none recorded{{ end }}')
    alert("ZerodocRankStopped",
          f'bottomk by (job, run_id) (1, {stall}{{collective=""}})\n'
          "or on (job, run_id)\n"
          '(\n  up{run_id!=""} == 0\n  and on (job, run_id)\n'
          f'  count by (job, run_id) ({stall}{{collective!=""}}) > 0\n)\n'
          "or on (job, run_id)\n"
          f"bottomk by (job, run_id) (1, {stall})",
          "critical", "ZD013",
          "Run {{ $labels.run_id }} stopped: rank {{ $labels.rank }} stopped first"
          "{{ if $labels.unit }} in {{ $labels.unit }} ({{ $labels.phase }}"
          "{{ if $labels.collective }}, {{ $labels.collective }}{{ end }}){{ end }}",
          f"{_cap(WHO)} of {RUN} stopped first: "
          "{{ if $labels.phase }}no progress since {{ $value | humanizeTimestamp }}"
          "{{ if $labels.collective }} inside {{ $labels.collective }} (every stopped rank "
          "waits in a collective: look at the one stuck earliest){{ else }} outside any "
          "collective (compute, data loading or user code){{ end }}"
          "{{ else }}its exporter does not answer while other ranks wait in collectives (the "
          "process died, or hangs holding the interpreter lock){{ end }}. "
          f"Ranks waiting for it: {waiters}. (A rank's watchdog reports a stall after "
          f"{DEFAULT_STALL_AFTER_S:g} s without progress by default, ZERODOC_STALL_AFTER_S.) "
          "`zerodoc report` on the run directory shows where each rank is, with its stack.",
          for_="0m")

    # zerodoc's own health
    alert("ZerodocInternalErrors",
          f"increase(zerodoc_errors_total[{w}]) > 0\nor\n"
          f"(zerodoc_errors_total unless zerodoc_errors_total offset {w})",
          "warning", None,
          "zerodoc caught errors in {{ $labels.hook }} on rank {{ $labels.rank }}",
          f"zerodoc caught {{{{ $value | humanize }}}} error(s) in {{{{ $labels.hook }}}} on "
          f"{WHO} within the last {w}. Training carried on; the measurements of that hook "
          "may be incomplete.",
          for_="0m")
    alert("ZerodocHookMissing", "zerodoc_hook_available == 0", "info", None,
          "zerodoc hook point {{ $labels.hook }} is missing on rank {{ $labels.rank }}",
          f"On {WHO} the torch hook point {{{{ $labels.hook }}}} was not found "
          "(zerodoc_hook_available = {{ $value }}); the numbers that depend on it are missing "
          "or degraded.",
          for_="0m")
    stale = _duration(t.stale_after_seconds)
    alert("ZerodocExporterDown",
          'up{run_id!=""} == 0\nand on (job, run_id)\nmax by (job, run_id) (up{run_id!=""}) == 1',
          "warning", None,
          "zerodoc exporter of rank {{ $labels.rank }} is down while the job runs",
          "Prometheus cannot scrape rank {{ $labels.rank }} ({{ $labels.instance }}, node "
          "{{ $labels.node }}) of run {{ $labels.run_id }} (up = {{ $value }}) while other "
          f"ranks of the run answer, for {stale}. The rank crashed, hung, or its port is "
          "blocked.",
          for_=stale)
    # Every rank of a run gone at once: ExporterDown needs a rank that answers, so a job that
    # died whole (a crash, the OOM killer, torchrun tearing every rank down after one failed,
    # a lost node) would page nobody. A clean close serves zerodoc_run_closed_timestamp_seconds
    # before the server stops (exporter/closing.py) and drops the file_sd target: those ranks
    # are not counted. Static targets of an ended run stay down forever; the lookback keeps
    # old runs quiet.
    look = _duration(t.run_down_lookback_seconds)
    # Clean closes are looked up twice as far back: a rank that ended before the last one
    # died is still known to have ended (the marker's series holds a few samples: cheap).
    look2 = _duration(2 * t.run_down_lookback_seconds)
    alert("ZerodocRunDown",
          f'count by (job, run_id) (\n'
          f'  up{{run_id!=""}} == 0\n'
          f'  unless on (job, instance) max_over_time(zerodoc_run_closed_timestamp_seconds[{look2}])\n'
          f')\n'
          f'unless on (job, run_id)\n'
          f'max by (job, run_id) (up{{run_id!=""}}) == 1\n'
          f'unless on (job, run_id)\n'
          f'max by (job, run_id) (max_over_time(up{{run_id!=""}}[{look}])) == 0',
          "critical", None,
          "Run {{ $labels.run_id }} is down: no rank answers, {{ $value }} without a clean end",
          f"No rank of {RUN} answers Prometheus, for {stale}, and {{{{ $value }}}} of its ranks "
          "went away without zerodoc's clean close: the job died (a crash, the OOM killer, a "
          "lost node, or torchrun ending every rank after one failed), or Prometheus cannot "
          "reach any of its nodes. `zerodoc report` on the run directory names the rank that "
          "failed first and where. (A run that ended cleanly does not fire; this alert stops "
          f"{look} after the run last answered.)",
          for_=stale)
    alert("ZerodocRankStalled",
          f"time() - zerodoc_last_step_timestamp_seconds > {t.stale_after_seconds:g}\n"
          "and zerodoc_last_step > 0",
          "critical", None,
          "Rank {{ $labels.rank }} completed no step for {{ $value | humanizeDuration }}",
          f"{_cap(WHO)} still serves metrics but finished its last step "
          f"{{{{ $value | humanizeDuration }}}} ago (critical after {t.stale_after_seconds:g} s): "
          "a hang, a deadlocked collective, or a very long pause.",
          for_="0m")
    _monitoring_alerts(alert)
    return rules


# The monitoring itself (issue 33 item 5). A rule group may take at most this share of its
# interval (the rest is headroom for a slow query, a compaction, a restart's catch-up).
RULE_GROUP_BUDGET = 0.5
# Prometheus serves a target's scrape_timeout_seconds with --enable-feature=extra-scrape-metrics
# only; without it a scrape is slow past half of Prometheus' default scrape_timeout (10 s).
SCRAPE_SLOW_FRACTION, DEFAULT_SCRAPE_TIMEOUT_S = 0.5, 10.0
# zerodoc's rule groups in the server's own series (rule_group is "<file>;<group>"): the one
# regex matcher of the rules, over a handful of series
ZERODOC_GROUPS = 'rule_group=~".*;zerodoc[.].*"'


def _monitoring_alerts(alert) -> None:
    """Alerts on zerodoc's monitoring: rule groups that cannot keep up, slow scrapes, ranks
    serving more series than the budget. The rule-group alerts read Prometheus' own
    metrics: the server must scrape itself (docs/operations.md)."""
    grp = ZERODOC_GROUPS
    alert("ZerodocRuleGroupSlow",
          f"prometheus_rule_group_last_duration_seconds{{{grp}}}\n"
          f"> {RULE_GROUP_BUDGET:g} * prometheus_rule_group_interval_seconds{{{grp}}}",
          "warning", None,
          "zerodoc rule group {{ $labels.rule_group }} takes {{ $value | humanizeDuration }} "
          "an evaluation",
          "Prometheus ({{ $labels.instance }}) needed {{ $value | humanizeDuration }} to "
          "evaluate the zerodoc rule group {{ $labels.rule_group }}, more than "
          f"{_pct(RULE_GROUP_BUDGET)} of its interval, for 10m: a little more load and it "
          "misses iterations (dashboards, `zerodoc report` and alerts then read stale "
          "numbers).",
          for_="10m")
    alert("ZerodocRuleGroupMissedIterations",
          f"increase(prometheus_rule_group_iterations_missed_total{{{grp}}}[10m]) > 0",
          "critical", None,
          "zerodoc rule group {{ $labels.rule_group }} missed {{ $value | humanize }} "
          "evaluations",
          "Prometheus ({{ $labels.instance }}) skipped {{ $value | humanize }} evaluation(s) "
          "of the zerodoc rule group {{ $labels.rule_group }} within 10m: an evaluation "
          "took longer than the interval. Its recorded series have gaps and the alerts that "
          "read them fire late or not at all.",
          for_="0m")
    sel = 'run_id!=""'
    alert("ZerodocScrapeSlow",
          f"scrape_duration_seconds{{{sel}}}\n"
          f"> {SCRAPE_SLOW_FRACTION:g} * scrape_timeout_seconds{{{sel}}}\n"
          f"or\n(\n  scrape_duration_seconds{{{sel}}} > "
          f"{SCRAPE_SLOW_FRACTION * DEFAULT_SCRAPE_TIMEOUT_S:g}\n"
          f"  unless on (job, instance) scrape_timeout_seconds{{{sel}}}\n)",
          "warning", None,
          "Scraping rank {{ $labels.rank }} takes {{ $value | humanizeDuration }}",
          f"Prometheus needs {{{{ $value | humanizeDuration }}}} to scrape {WHO} of "
          f"{RUN}, more than {_pct(SCRAPE_SLOW_FRACTION)} of its scrape_timeout "
          f"({SCRAPE_SLOW_FRACTION * DEFAULT_SCRAPE_TIMEOUT_S:g} s where the server does not "
          "say its timeout), for 5m: near the timeout its samples go missing (up = 0).",
          for_="5m")
    alert("ZerodocSeriesOverBudget",
          f'scrape_samples_scraped{{{sel}, rank!="0"}} > {BUDGET_FULL}',
          "warning", None,
          "Rank {{ $labels.rank }} serves {{ $value }} series, over zerodoc's budget",
          f"{_cap(WHO)} of {RUN} serves {{{{ $value }}}} series a scrape, more than the "
          f"{BUDGET_FULL:,} a rank may serve at full detail (zerodoc.ops.cardinality; rank 0 "
          "also serves the run's per-unit facts and is not held to it), for 5m: at a "
          "thousand ranks that is the server's memory and the rules' time.",
          for_="5m")


def runbook_url(alert: str, base: str = "") -> str:
    """Where an alert's runbook section is: `base` + docs/runbooks.md#<alert, lower case>."""
    return f"{base}{RUNBOOKS}#{alert.lower()}"
