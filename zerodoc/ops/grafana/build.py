"""zerodoc's Grafana dashboards, built as code and committed as JSON in `dashboards/`.

    python -m zerodoc.cli.dashboards_gen          # regenerate dashboards/*.json (`make dashboards`)
    python -m zerodoc.cli.dashboards_gen --check  # exit 1 if the committed JSON is stale

Needs the `grafana` extra (grafana-foundation-sdk pinned to the Grafana 11.6 line). The
queries use the recording rules of `rules/zerodoc-recording.yml` (`zerodoc.ops.alerts`) and the
catalogued series; panel thresholds come from `zerodoc.thresholds`.
"""

from __future__ import annotations

import json
from pathlib import Path

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import prometheus as pm

from .. import resources
from ..alerts.recording import (ALLOCATED, PEAK_ALLOCATED, PEAK_RESERVED, RESERVED,
                                UNIT_SHARES)
from ...catalog import UNIT_COMPUTE, UNIT_FRAMEWORK, UNIT_RANKS, UNIT_STAT
from ...thresholds import DEFAULT, Thresholds
from .panels import (SEL, bars, big, cells, falling, grid, links, q, rising,
                     row, steps, ts, variables)

DASHBOARDS_DIR = resources.dashboards_dir()
TABLE = pm.PromQueryFormat.TABLE
AG = 'collective="all_gather"'
MODEL_STATES = "sharded_parameters|gradients|optimizer_state"
# GPU allocator populations and, on CPU runs, the process's own: one query serves both.
PROCESS_MEMORY = (f"{RESERVED}|{ALLOCATED}|{PEAK_RESERVED}|{PEAK_ALLOCATED}|"
                  "process_resident|process_peak_resident")
PEAK_MEMORY = f"{PEAK_RESERVED}|process_peak_resident"
JOB = 'job=~"$job"'



def _dashboard(uid: str, title: str, desc: str) -> db.Dashboard:
    d = (db.Dashboard(title).uid(uid).description(desc).tags(["zerodoc"])
         .refresh("10s").time("now-30m", "now").timezone("browser").editable()
         .tooltip(dm.DashboardCursorSync.CROSSHAIR).links(links()))
    for v in variables():
        d = d.with_variable(v)
    return d


def overview(t: Thresholds) -> db.Dashboard:
    d = _dashboard("zerodoc-overview", "zerodoc / Overview",
                   "Is the sharded run healthy? Step time, exposed communication, headroom "
                   "and firing alerts, per rank.")
    d = (d.with_row(row("Run at a glance"))
         .with_panel(big("Step time p50", "Median step time over all selected ranks (recording "
                         "rule job:zerodoc_step_seconds:p50).",
                         q('job:zerodoc_step_seconds:p50{job=~"$job"}', "{{job}}"), "s"))
         .with_panel(big("Steps / s", "Training throughput: completed steps per second "
                         "(the slowest rank sets the pace).",
                         q(f'min by (job) (rank:zerodoc_steps:rate{{{SEL}}})', "{{job}}"),
                         "suffix: steps/s"))
         .with_panel(big("All-gather wait beyond the link",
                         "Share of the median step the job waits on all-gathers that the "
                         "link's expected bandwidth does not explain (link-attributable). "
                         "Alert ZerodocExposedAllGather (ZD004) at "
                         f"{t.exposed_fraction_warn:.0%} / {t.exposed_fraction_crit:.0%}.",
                         q(f"max(job:zerodoc_all_gather_avoidable:fraction{{{JOB}}})", "{{run_id}}"),
                         "percentunit", rising(t.exposed_fraction_warn, t.exposed_fraction_crit)))
         .with_panel(big("Comm / compute (job)",
                         "Avoidable exposed communication per second of compute (job). At "
                         f"{t.comm_compute_ratio_crit:g} the step is communication-bound (ZD006).",
                         q(f"max(job:zerodoc_comm_avoidable_compute:ratio{{{JOB}}})", "{{run_id}}"),
                         "none", rising(t.comm_compute_ratio_warn, t.comm_compute_ratio_crit)))
         .with_panel(big("Headroom (lowest rank)",
                         "Memory capacity left above the peak, lowest rank (ZD007).",
                         q(f"min(rank:zerodoc_memory_headroom:fraction{{{SEL}}})", "lowest"),
                         "percentunit", falling(t.headroom_fraction_crit, t.headroom_fraction_warn)))
         .with_panel(big("Firing alerts", "zerodoc alerts firing now for the selected jobs "
                         "(0 when none).",
                         q('count(ALERTS{alertstate="firing", job=~"$job"}) or vector(0)',
                           "firing"), "none", steps((None, "green"), (1, "red"))))
         .with_row(row("Per rank"))
         .with_panel(ts("Step time", "Mean step time per rank over the rate window, and the "
                        "job's p90 / p99 over all ranks.",
                        [q(f"rank:zerodoc_step_seconds:mean{{{SEL}}}", "rank {{rank}}"),
                         q('job:zerodoc_step_seconds:p90{job=~"$job"}', "p90 {{job}}", "B"),
                         q('job:zerodoc_step_seconds:p99{job=~"$job"}', "p99 {{job}}", "C")],
                        "s", min_=0))
         .with_panel(ts("Exposed all-gather / step time",
                        "Per rank: share of its step time spent waiting for all-gathers. Job: "
                        "the part the link does not explain, which the alert and the dashed "
                        "thresholds apply to.",
                        [q(f"rank:zerodoc_all_gather_exposed:fraction{{{SEL}}}", "rank {{rank}}"),
                         q(f"job:zerodoc_all_gather_avoidable:fraction{{{JOB}}}",
                           "beyond the link {{run_id}}", "B")],
                        "percentunit", rising(t.exposed_fraction_warn, t.exposed_fraction_crit),
                        min_=0))
         .with_panel(ts("Comm / compute", "Per rank: exposed communication time per second "
                        "of compute. Job: the avoidable part (dashed thresholds, alert ZD006).",
                        [q(f"rank:zerodoc_comm_compute:ratio{{{SEL}}}", "rank {{rank}}"),
                         q(f"job:zerodoc_comm_avoidable_compute:ratio{{{JOB}}}",
                           "avoidable {{run_id}}", "B")], "none",
                        rising(t.comm_compute_ratio_warn, t.comm_compute_ratio_crit), min_=0))
         .with_panel(bars("Memory headroom per rank", "Capacity left above the peak, as a "
                          "share of capacity (red below "
                          f"{t.headroom_fraction_crit:.0%}, yellow below "
                          f"{t.headroom_fraction_warn:.0%}).",
                          q(f"rank:zerodoc_memory_headroom:fraction{{{SEL}}}", "rank {{rank}}",
                            instant=True),
                          "percentunit", falling(t.headroom_fraction_crit,
                                                 t.headroom_fraction_warn), max_=1))
         .with_panel(grid("Active alerts", "zerodoc alerts pending or firing (from "
                          "Prometheus' ALERTS series); runbooks in docs/rules.md.",
                          [q('ALERTS{job=~"$job"}', "", instant=True, fmt=TABLE)], "none",
                          hide=("Time", "__name__", "Value"))))
    return d


UNIT_SHARE_FRACTION, UNIT_SHARE_RATIO = UNIT_SHARES


def layers(t: Thresholds) -> db.Dashboard:
    d = _dashboard("zerodoc-layers", "zerodoc / Per layer",
                   "Per sharded unit: exposed all-gathers against the compute that should hide "
                   "them, bus bandwidth and bytes. With metrics_detail=coarse the per-unit "
                   "panels show the ranks of the unit sample only.")
    # Every per-unit panel reads the per-unit series the rules record over the ranks (a few a
    # unit: `unit_job:` / `unit_phase_job:`, every 4m), not every rank's: at 1,024 ranks x 81
    # units a panel over the ranks' own series took 8-23 s a query (issue 33).
    ju = f'{JOB}, unit=~"$unit"'
    over = "over the ranks of the run (recorded every 4m by the per-unit rules)"
    d = (d.with_row(row("Exposure"))
         .with_panel(cells("Exposed all-gather per unit (share of step time)",
                           "One row per unit, one column per evaluation: the share of step "
                           "time the worst rank waited for that unit's all-gathers, "
                           f"{over}. A dark row is a unit prefetch does not hide.",
                           q(f"max by (unit) ({UNIT_SHARE_FRACTION}{{{ju}}})", "{{unit}}"),
                           "percentunit"))
         .with_panel(ts("Exposed share of each unit's all-gather",
                        "Exposed / total all-gather time per unit, the worst rank's "
                        f"(1 = nothing hidden), {over}. Dashed: "
                        f"{t.unit_exposed_ratio_warn:.0%}, where prefetch is not keeping up.",
                        [q(f"max by (unit) ({UNIT_SHARE_RATIO}{{{ju}}})", "{{unit}}")],
                        "percentunit", rising(t.unit_exposed_ratio_warn), min_=0))
         .with_panel(ts("All-gather vs compute per unit (per step)",
                        "Seconds per sampled step, the mean over the ranks of the run: each "
                        "unit's compute, its all-gather time, the exposed part of it, and the "
                        "framework's own time charged to the unit (copy-in / copy-out, "
                        "gradient copies; from the ranks that serve it per unit: rank 0). "
                        "Recorded every 4m by the per-unit rules.",
                        [q(f"sum by (unit) ({UNIT_COMPUTE['mean']}{{{ju}}})", "{{unit}} compute"),
                         q(f"sum by (unit) ({UNIT_STAT['seconds'][1]['mean']}{{{ju}, {AG}}})",
                           "{{unit}} all-gather", "B"),
                         q(f"sum by (unit) ({UNIT_STAT['exposed'][1]['mean']}{{{ju}, {AG}}})",
                           "{{unit}} exposed", "C"),
                         q(f"sum by (unit) ({UNIT_FRAMEWORK['mean']}{{{ju}}})",
                           "{{unit}} framework", "D")], "s", min_=0))
         .with_panel(bars("Wait beyond the link per unit (job)",
                          "Per step, link-attributable: each unit's exposed all-gather time "
                          "that the link's expected bandwidth does not explain (what ZD004 "
                          "adds up), forward and backward together.",
                          q(f'sum by (unit) (unit_job:zerodoc_collective_avoidable_seconds:per_step{{{JOB}, unit=~"$unit", {AG}}})',
                            "{{unit}}", instant=True), "s"))
         .with_row(row("Bandwidth and bytes"))
         .with_panel(ts("Bus bandwidth per unit",
                        "nccl-tests bus bandwidth per unit and collective, link-attributable: "
                        "bus bytes (the median rank's bytes x the factor of the unit's group) "
                        "over the least time any rank took, all phases together (the numbers "
                        "the slow-link alert, ZD005, reads; it fires below "
                        f"{t.slow_link_busbw_fraction:.0%} of the link).",
                        [q("sum by (unit, collective) (unit_job:zerodoc_collective_bus_bytes:"
                           f"per_step{{{ju}}})\n/\n(sum by (unit, collective) ("
                           f"unit_job:zerodoc_collective_seconds:per_step{{{ju}}}) > 0)",
                           "{{unit}} {{collective}}")], "Bps", min_=0))
         .with_panel(ts("Bus bandwidth of large collectives (job)",
                        "Link-attributable bus bandwidth of collectives of at least "
                        f"{t.slow_link_min_bytes / 2**20:g} MiB, per collective kind: what the "
                        "slow-link alert (ZD005) compares with the link class.",
                        [q(f"collective_job:zerodoc_collective_busbw_large:bytes_per_second{{{JOB}}}",
                           "{{collective}} {{run_id}}")], "Bps", min_=0))
         .with_panel(ts("Collective bytes per step per unit",
                        "Bytes moved per sampled step by each unit's collectives (full "
                        "buffer size), summed over the ranks of the run: the mean rank's "
                        "times the ranks that serve the unit.",
                        [q(f"sum by (unit, collective) ({UNIT_STAT['bytes'][1]['mean']}{{{ju}}} "
                           f"* {UNIT_RANKS}{{{ju}}})", "{{unit}} {{collective}}")],
                        "bytes", min_=0))
         .with_panel(bars("Bytes per all-gather call",
                          "Size of one all-gather per unit, the median rank's. Below "
                          f"{t.wrap_fine_median_bytes / 2**20:g} MiB collectives are "
                          "latency-bound (yellow): wrapping may be too fine (ZD002).",
                          q("max by (unit) (unit_job:zerodoc_collective_bytes:per_call"
                            f"{{{ju}, {AG}}})", "{{unit}}", instant=True), "bytes",
                          steps((None, "yellow"), (t.wrap_fine_median_bytes, "green"))))
         .with_panel(bars("Share of parameters per unit",
                          "Each unit's share of the model's parameters. One unit at "
                          f"{t.wrap_coarse_param_fraction:.0%} or more means wrapping is too "
                          "coarse (ZD001): that unit is gathered whole.",
                          q('max by (job, unit) (zerodoc_unit_parameters{job=~"$job", unit=~"$unit"}) '
                            '/ on (job) group_left () sum by (job) (max by (job, unit) '
                            '(zerodoc_unit_parameters{job=~"$job"}))', "{{unit}}", instant=True),
                          "percentunit", rising(t.wrap_coarse_param_fraction), max_=1)))
    return d


def memory(t: Thresholds) -> db.Dashboard:
    d = _dashboard("zerodoc-memory", "zerodoc / Memory",
                   "Memory per rank by population: model states, GPU allocator reserved vs "
                   "allocated (or process resident memory on CPU runs), capacity and headroom.")
    d = (d.with_row(row("Populations"))
         .with_panel(ts("Model states per rank",
                        "Sharded parameters, gradients and optimizer state held by each rank "
                        "(local shards, summed from the tensors).",
                        [q(f'zerodoc_memory_bytes{{{SEL}, population=~"{MODEL_STATES}"}}',
                           "rank {{rank}} {{population}}")], "bytes", min_=0))
         .with_panel(ts("Reserved vs allocated (GPU) / resident (CPU)",
                        "GPU runs: the caching allocator's reserved and allocated bytes (a wide "
                        "gap is fragmentation, ZD012). CPU runs have no allocator: the process's "
                        "resident and peak resident memory. Capacity for reference.",
                        [q(f'zerodoc_memory_bytes{{{SEL}, population=~"{PROCESS_MEMORY}"}}',
                           "rank {{rank}} {{population}}"),
                         q(f"zerodoc_device_memory_capacity_bytes{{{SEL}}}", "rank {{rank}} capacity",
                           "B")], "bytes", min_=0))
         .with_row(row("Headroom"))
         .with_panel(ts("Headroom per rank", "Capacity minus peak reserved (GPU) or peak "
                        "resident (CPU) memory.",
                        [q(f"zerodoc_memory_headroom_bytes{{{SEL}}}", "rank {{rank}}")], "bytes",
                        min_=0))
         .with_panel(bars("Headroom / capacity",
                          f"Red below {t.headroom_fraction_crit:.0%}, yellow below "
                          f"{t.headroom_fraction_warn:.0%} (alert ZerodocLowMemoryHeadroom, ZD007).",
                          q(f"rank:zerodoc_memory_headroom:fraction{{{SEL}}}", "rank {{rank}}",
                            instant=True),
                          "percentunit", falling(t.headroom_fraction_crit, t.headroom_fraction_warn),
                          w=6, max_=1))
         .with_panel(big("Peak memory (highest rank)", "Peak reserved (GPU) or peak resident "
                         "(CPU) bytes of the highest selected rank.",
                         q(f'max(zerodoc_memory_bytes{{{SEL}, population=~"{PEAK_MEMORY}"}})',
                           "peak"), "bytes", w=6, h=8))
         .with_row(row("Latest values"))
         .with_panel(grid("Memory by population", "Latest bytes per rank and population "
                          "(whatever this run reports: CPU or GPU populations).",
                          [q(f"max by (rank, population) (zerodoc_memory_bytes{{{SEL}}})", "",
                             instant=True, fmt=TABLE)], "bytes")))
    return d


def ranks(t: Thresholds) -> db.Dashboard:
    d = _dashboard("zerodoc-ranks", "zerodoc / Ranks",
                   "Rank against rank: step time, compute skew (stragglers), progress and "
                   "exporter health.")
    d = (d.with_row(row("Skew"))
         .with_panel(big("Max compute skew", "Highest rank's compute per step / the median "
                         f"rank's. Above {t.straggler_ratio_warn:g} a rank is a straggler (ZD010).",
                         q(f"max(rank:zerodoc_compute_skew:ratio{{{SEL}}})", "max"), "none",
                         rising(t.straggler_ratio_warn), w=6, h=8))
         .with_panel(ts("Compute per step vs the median rank",
                        f"Dashed at {t.straggler_ratio_warn:g}: the straggler threshold.",
                        [q(f"rank:zerodoc_compute_skew:ratio{{{SEL}}}", "rank {{rank}}")], "none",
                        rising(t.straggler_ratio_warn), w=18))
         .with_panel(ts("Step time per rank", "Mean step time per rank (ranks of a synchronous "
                        "job differ by their waits, not their steps).",
                        [q(f"rank:zerodoc_step_seconds:mean{{{SEL}}}", "rank {{rank}}")], "s",
                        min_=0))
         .with_panel(bars("Compute per step", "Compute seconds per step of each rank.",
                          q(f"rank:zerodoc_compute_seconds:per_step{{{SEL}}}", "rank {{rank}}",
                            instant=True), "s"))
         .with_panel(ts("Exposed communication / step time",
                        "All collectives' exposed time as a share of each rank's step time: "
                        "the fast ranks wait here for the straggler.",
                        [q(f"rank:zerodoc_comm_exposed:fraction{{{SEL}}}", "rank {{rank}}")],
                        "percentunit", min_=0))
         .with_panel(ts("Steps behind the most advanced rank",
                        "0 for every rank of a healthy synchronous job.",
                        [q(f'max by (job) (zerodoc_last_step{{job=~"$job"}}) - on (job) '
                           f"group_right () zerodoc_last_step{{{SEL}}}", "rank {{rank}}")],
                        "none", rising(2), min_=0))
         .with_row(row("Health"))
         .with_panel(grid("Ranks", "Per rank: last step, seconds since it completed (red after "
                          f"{t.stale_after_seconds:g} s: ZerodocRankStalled) and whether "
                          "Prometheus reaches its exporter (up).",
                          [q(f"zerodoc_last_step{{{SEL}}}", "", "A", instant=True, fmt=TABLE),
                           q(f"time() - zerodoc_last_step_timestamp_seconds{{{SEL}}}", "", "B",
                             instant=True, fmt=TABLE),
                           q(f"up{{{SEL}}}", "", "C", instant=True, fmt=TABLE)], "none",
                          rising(t.stale_after_seconds), merge=True)))
    return d


BUILDERS = {"overview": overview, "layers": layers, "memory": memory, "ranks": ranks}


def _number_panels(d: dict) -> dict:
    """Give every panel a unique id (the SDK leaves them 0) and every target a refId."""
    n = 0
    for p in d.get("panels", []):
        n += 1
        p["id"] = n
        for i, tgt in enumerate(p.get("targets", [])):
            tgt.setdefault("refId", chr(ord("A") + i))
            tgt["datasource"] = {"type": "prometheus", "uid": "${datasource}"}
    return d


def render(name: str, t: Thresholds = DEFAULT) -> str:
    d = json.loads(json.dumps(BUILDERS[name](t).build(), cls=JSONEncoder))
    return json.dumps(_number_panels(d), indent=2, sort_keys=True) + "\n"


def render_all(t: Thresholds = DEFAULT) -> dict[str, str]:
    """{file name: JSON text} of every dashboard."""
    return {f"zerodoc-{name}.json": render(name, t) for name in BUILDERS}


def stale_files(out_dir: str | Path = DASHBOARDS_DIR, t: Thresholds = DEFAULT) -> list[str]:
    out_dir = Path(out_dir)
    return [name for name, text in render_all(t).items()
            if not (out_dir / name).exists() or (out_dir / name).read_text() != text]
