"""Prometheus rules: generated from zerodoc.thresholds, up to date, promtool-checked and
unit-tested (rules/tests/), every name catalogued, every alert documented, and the alerts
agree with the rules engine on the same data."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.promserver import require_binary
from tests.support.helpers import ROOT
from zerodoc.ops import alerts
from zerodoc.ops.alerts import RuleOptions
from zerodoc.catalog import RANK_COMPUTE, RANK_EXPOSED, all_series_names
from zerodoc.thresholds import DEFAULT, Thresholds

RULES = ROOT / "rules"
RULE_FILES = [RULES / alerts.RECORDING_FILE, RULES / alerts.ALERTS_FILE]
UNIT_TESTS = RULES / "tests" / "zerodoc-alerts.test.yml"
PROM_BUILTINS = {"up", "ALERTS", "ALERTS_FOR_STATE", "scrape_duration_seconds",
                 "scrape_samples_scraped", "scrape_timeout_seconds",
                 # the server's own series (it scrapes itself): the rule-group alerts
                 "prometheus_rule_group_last_duration_seconds",
                 "prometheus_rule_group_interval_seconds",
                 "prometheus_rule_group_iterations_missed_total"}
SEVERITIES = {"info", "warning", "critical"}


# --------------------------------------------------------------------------------------
# metric names in PromQL (shared with test_dashboards)

GRAFANA_VARS = {"$__rate_interval": "1m", "$__interval": "1m", "$__range": "1h",
                "${__rate_interval}": "1m"}


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression reads (Grafana variables substituted first)."""
    for k, v in GRAFANA_VARS.items():
        expr = expr.replace(k, v)
    try:
        import promql_parser
    except ImportError:  # the dev extra brings it; keep a careful fallback
        return _names_by_regex(expr)
    names: set[str] = set()

    def visit(node):
        if isinstance(node, promql_parser.VectorSelector):
            if node.name:
                names.add(node.name)
            for m in (node.matchers.matchers if node.matchers else []):
                if m.name == "__name__":
                    names.add(m.value)
        return True

    promql_parser.walk(promql_parser.parse(expr), visit)
    return names


_KEYWORDS = {"sum", "min", "max", "avg", "count", "quantile", "stddev", "stdvar", "topk",
             "bottomk", "by", "without", "on", "ignoring", "group_left", "group_right", "and",
             "or", "unless", "bool", "offset", "rate", "irate", "increase", "histogram_quantile",
             "avg_over_time", "max_over_time", "min_over_time", "clamp_min", "clamp_max",
             "vector", "scalar", "time", "round", "abs", "label_replace", "absent", "le", "inf",
             "nan", "count_values", "group", "sort", "sort_desc", "delta", "deriv", "changes"}


def _names_by_regex(expr: str) -> set[str]:
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # label values
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # ranges
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    expr = re.sub(r"\{[^}]*\}", "", expr)  # matchers
    expr = re.sub(r"(?<![\w:])\d+(\.\d+)?([eE][+-]?\d+)?\w*", "", expr)  # numbers, durations
    toks = set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", expr))
    return {t for t in toks if t.lower() not in _KEYWORDS and not re.fullmatch(r"\d+\w*", t)}


def known_names() -> set[str]:
    return all_series_names() | alerts.recording_names() | PROM_BUILTINS


def load_groups(path: Path) -> list[dict]:
    return yaml.safe_load(path.read_text())["groups"]


# --------------------------------------------------------------------------------------
# generated, up to date, valid


def test_rule_files_are_up_to_date():
    stale = alerts.stale_files()
    assert not stale, f"{stale} are stale: run `python -m zerodoc.cli.rules_gen` (make dashboards)"
    assert not alerts.stale_prometheus_rule(), \
        "exporters/kubernetes/zerodoc-prometheusrule.yaml is stale: python -m zerodoc.cli.rules_gen"


@pytest.mark.slow
def test_generator_check_mode_and_bad_input(tmp_path):
    run = [sys.executable, "-m", "zerodoc.cli.rules_gen"]
    assert subprocess.run(run + ["--check"], cwd=ROOT).returncode == 0
    r = subprocess.run(run + ["--out", str(tmp_path), "--k8s-out", "", "--check"], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 1 and "stale:" in r.stderr
    r = subprocess.run(run + ["--window", "ten seconds"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().count("\n") == 0 and "not a Prometheus duration" in r.stderr
    r = subprocess.run(run + ["--threshold", "nope=1"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and "unknown threshold" in r.stderr


@pytest.mark.slow
def test_generator_writes_and_checks_the_two_level_layout(tmp_path):
    """`--layout two-level` checks rules/two-level/ by default, writes the three files of the
    layout (and no PrometheusRule manifest: that one holds the flat groups) where --out says,
    and --check then finds them up to date."""
    run = [sys.executable, "-m", "zerodoc.cli.rules_gen", "--layout", "two-level"]
    assert subprocess.run(run + ["--check"], cwd=ROOT).returncode == 0
    r = subprocess.run(run + ["--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*.yml"))
    assert written == sorted(alerts.rule_files(opts=RuleOptions(layout="two-level"))), written
    assert not list(tmp_path.rglob("*.yaml"))  # no manifest
    assert subprocess.run(run + ["--out", str(tmp_path), "--check"], cwd=ROOT).returncode == 0
    r = subprocess.run(run[:-2] + ["--out", str(tmp_path), "--k8s-out", "", "--check"],
                       cwd=ROOT, capture_output=True, text=True)  # the flat files are not there
    assert r.returncode == 1 and "stale:" in r.stderr


def test_the_example_rack_config_finds_the_files_ranks_write(tmp_path, monkeypatch):
    """The shipped rack Prometheus example's file_sd globs match the target files ranks
    write with ZERODOC_FILE_SD_DIR set (`<run_id>-rank-NNNNN.json`): its ranks job every
    rank's, its facts job rank 0's only (it read `rank-00000.json`, a name no rank writes)."""
    from fnmatch import fnmatch

    from zerodoc.exporter.targets import FILE_SD_DIR_ENV, target_path

    text = alerts.rule_files(opts=RuleOptions(layout="two-level"))["rack/rack-prometheus.yml"]
    jobs = {c["job_name"]: [f for sd in c["file_sd_configs"] for f in sd["files"]]
            for c in yaml.safe_load(text)["scrape_configs"]}
    assert len(jobs) == 2, jobs
    (ranks_glob,), (facts_glob,) = (jobs[j] for j in sorted(jobs, key=lambda j: "facts" in j))
    shared = str(Path(ranks_glob).parent)
    monkeypatch.setenv(FILE_SD_DIR_ENV, shared)
    written = [str(target_path(tmp_path, {"rank": r, "run_id": "run-7"})) for r in (0, 1, 130)]
    assert all(fnmatch(w, ranks_glob) for w in written), (written, ranks_glob)
    assert [fnmatch(w, facts_glob) for w in written] == [True, False, False], \
        (written, facts_glob)


def test_yaml_emitter_round_trips():
    """What the stdlib emitter writes is what the generator meant (quoting, block scalars)."""
    for name, text in alerts.rule_files().items():
        groups = yaml.safe_load(text)["groups"]
        got = [r for g in groups for r in g["rules"]]
        want = alerts.recording_rules() if name == alerts.RECORDING_FILE else \
            alerts.alerting_rules()
        assert got == want
    # the per-unit groups state their interval (their rate window, four times the
    # rank-level window); the rank-level group uses the server's
    groups = yaml.safe_load(alerts.rule_files()[alerts.RECORDING_FILE])["groups"]
    assert [(g["name"], g.get("interval")) for g in groups] == \
        [("zerodoc.recording", None), ("zerodoc.step_quantiles", None),
         ("zerodoc.unit_rates", "4m"), ("zerodoc.units", "4m")]
    assert "[4m]" in yaml.dump(groups[2]) and "[4m]" not in yaml.dump(groups[:2])
    k8s = yaml.safe_load(alerts.prometheus_rule())
    assert k8s["kind"] == "PrometheusRule"
    assert [r for g in k8s["spec"]["groups"] for r in g["rules"]] == \
        alerts.recording_rules() + alerts.alerting_rules()


@pytest.mark.slow
def test_promtool_check_rules_and_example_config():
    promtool = require_binary("promtool")
    r = subprocess.run([promtool, "check", "rules", *map(str, RULE_FILES)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run([promtool, "check", "config", str(ROOT / "exporters" / "prometheus.yml")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.slow
def test_promtool_unit_tests_pass():
    """Firing and not firing, warning vs critical, a dip that resets `for:`, the link
    baseline, link-attributable minimum over ranks, ... (rules/tests/zerodoc-alerts.test.yml)."""
    promtool = require_binary("promtool")
    r = subprocess.run([promtool, "test", "rules", str(UNIT_TESTS)], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


@pytest.mark.slow
def test_unit_tests_fail_when_a_threshold_moves(tmp_path):
    """The promtool tests bite: rules generated from another threshold fail them."""
    promtool = require_binary("promtool")
    (tmp_path / "tests").mkdir()
    shutil.copy(UNIT_TESTS, tmp_path / "tests")
    alerts.write_rules(tmp_path, Thresholds(exposed_fraction_warn=0.21))
    r = subprocess.run([promtool, "test", "rules", str(tmp_path / "tests" / UNIT_TESTS.name)],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "ZerodocExposedAllGather" in r.stdout + r.stderr


# --------------------------------------------------------------------------------------
# one source of thresholds, names, metadata


def test_alert_thresholds_come_from_thresholds():
    t = Thresholds(exposed_fraction_warn=0.125, exposed_fraction_crit=0.375,
                   headroom_fraction_warn=0.0625, straggler_ratio_warn=1.75,
                   comm_compute_ratio_warn=0.625, fragmentation_ratio_warn=0.4375,
                   stale_after_seconds=90.0, alert_for="7m")
    rules = {(r["alert"], r["labels"]["severity"]): r for r in alerts.alerting_rules(t)}
    assert rules["ZerodocExposedAllGather", "warning"]["expr"].endswith(">= 0.125")
    assert rules["ZerodocExposedAllGather", "critical"]["expr"].endswith(">= 0.375")
    assert rules["ZerodocLowMemoryHeadroom", "warning"]["expr"].endswith("< 0.0625")
    assert "skew:ratio >= 1.75" in rules["ZerodocStraggler", "warning"]["expr"]
    assert rules["ZerodocStraggler", "warning"]["expr"].endswith("peer_wait:fraction >= 0.125")
    assert rules["ZerodocCommBound", "warning"]["expr"].startswith(
        "job:zerodoc_comm_avoidable_compute:ratio >= 0.625\n")
    t2 = Thresholds(slow_link_costly_busbw_fraction=0.375, exposed_fraction_crit=0.3125,
                    comm_compute_ratio_crit=1.5)
    rules2 = {(r["alert"], r["labels"]["severity"]): r for r in alerts.alerting_rules(t2)}
    slow = rules2["ZerodocSlowLink", "critical"]["expr"]
    assert f"< {0.375 * 20e9:g}" in slow and ">= 0.3125" in slow and ">= 1.5" in slow
    assert "comm_exposed_compute:ratio >= 1.5" in rules2["ZerodocCommBound", "warning"]["expr"]
    assert ">= 0.4375" in rules["ZerodocAllocatorFragmentation", "warning"]["expr"]
    assert "> 90" in rules["ZerodocRankStalled", "critical"]["expr"]
    assert rules["ZerodocExposedAllGather", "warning"]["for"] == "7m"
    assert "12.5%" in rules["ZerodocExposedAllGather", "warning"]["annotations"]["description"]
    # the committed files carry the defaults
    text = (RULES / alerts.ALERTS_FILE).read_text()
    assert f"job:zerodoc_all_gather_avoidable:fraction >= {DEFAULT.exposed_fraction_warn:g}" in text
    assert f"for: {DEFAULT.alert_for}" in text


def test_every_alert_has_severity_summary_description_runbook():
    """(That each runbook_url lands on a runbook section: tests/test_runbooks.py.)"""
    for group in load_groups(RULES / alerts.ALERTS_FILE):
        for r in group["rules"]:
            assert r["labels"]["severity"] in SEVERITIES, r["alert"]
            ann = r["annotations"]
            assert ann["summary"] and ann["description"], r["alert"]
            assert "{{ $value" in ann["description"], f"{r['alert']}: no number in description"
            assert ann["runbook_url"] == f"docs/runbooks.md#{r['alert'].lower()}", r["alert"]
            if r["labels"].get("zerodoc_rule"):  # the engine's thresholds are stated too
                assert re.search(r"\d", ann["description"].replace("{{ $value", "")), r["alert"]


def test_engine_codes_exist():
    from zerodoc.diagnosis import BY_CODE

    codes = {r["labels"].get("zerodoc_rule") for r in alerts.alerting_rules()} - {None}
    assert codes == {"ZD004", "ZD005", "ZD006", "ZD007", "ZD010", "ZD012", "ZD013"}
    assert codes <= set(BY_CODE)


def test_every_metric_name_in_rules_is_catalogued():
    known = known_names()
    for path in RULE_FILES + [ROOT / "exporters" / "kubernetes" / alerts.PROMETHEUS_RULE_FILE]:
        doc = yaml.safe_load(path.read_text())
        groups = doc["spec"]["groups"] if "spec" in doc else doc["groups"]
        for g in groups:
            for r in g["rules"]:
                names = metric_names(r["expr"])
                assert names, r
                unknown = names - known
                assert not unknown, f"{path.name} {r.get('record') or r.get('alert')}: {unknown}"


def test_metric_name_extractor_regex_fallback_agrees():
    for r in alerts.recording_rules() + alerts.alerting_rules():
        assert _names_by_regex(r["expr"]) == metric_names(r["expr"]), r["expr"]


def test_rule_options_validation():
    with pytest.raises(ValueError, match="duration"):
        RuleOptions(window="1 minute")
    with pytest.raises(ValueError, match="link class"):
        RuleOptions(link="carrier-pigeon")
    text = alerts.rule_files(opts=RuleOptions(window="10s", alert_for="5s", link="gloo-cpu"))
    assert "[10s]" in text[alerts.RECORDING_FILE] and "[1m]" not in text[alerts.RECORDING_FILE]
    assert "for: 5s" in text[alerts.ALERTS_FILE]


# --------------------------------------------------------------------------------------
# the engine and the alerts agree on the same data

ALERT_OF = {"ZD004": "ZerodocExposedAllGather", "ZD005": "ZerodocSlowLink",
            "ZD006": "ZerodocCommBound", "ZD007": "ZerodocLowMemoryHeadroom",
            "ZD010": "ZerodocStraggler", "ZD012": "ZerodocAllocatorFragmentation"}
# engine ERROR <-> severity critical (ZD005: its own ERROR, or raised to its symptoms')
CRITICAL_MIRRORED = {"ZD004", "ZD005", "ZD006", "ZD007"}
MIB = 1 << 20
UNITS = ("blocks.0", "blocks.1")


def _scenario(*, world=2, sync=False, step=0.5, compute=(0.15, 0.15), ag_bytes=512 * MIB,
              ag_seconds=0.035, ag_exposed=(0.005, 0.005), slow_rank=None, slow_factor=1.0,
              peer_wait=0.0, capacity=80e9, peak=40e9, gpu=None):
    """Per-step numbers of a run with two units (a forward and a backward all-gather each,
    one backward reduce-scatter, hidden), the same every step: {rank: per-step dict}.
    `ag_seconds` is per call; `ag_exposed` per unit and step (ignored when `sync`: all of
    it is exposed); the ranks other than `slow_rank` also wait `peer_wait` per step."""
    ranks = {}
    for r in range(world):
        f = slow_factor if r == slow_rank else 1.0
        wait = peer_wait if slow_rank is not None and r != slow_rank else 0.0
        comp, comm = {}, {}
        for i, u in enumerate(UNITS):
            comp[(u, "forward")] = compute[i] / 3 * f
            comp[(u, "backward")] = compute[i] * 2 / 3 * f
            for ph in ("forward", "backward"):
                extra = wait / 4
                secs = ag_seconds + extra
                exp = secs if sync else ag_exposed[i] / 2 + extra
                comm[(u, ph, "all_gather")] = (1, ag_bytes, secs, exp, secs - exp)
            comm[(u, "backward", "reduce_scatter")] = (1, ag_bytes, ag_seconds, 0.0, ag_seconds)
        mem = {"sharded_parameters": int(4e9), "optimizer_state": int(8e9),
               "capacity": int(capacity), "headroom": int(capacity - peak)}
        if gpu:
            mem.update({k: int(v) for k, v in gpu.items()})
        ranks[r] = {"step": step, "compute": comp, "comm": comm, "memory": mem}
    return ranks


SCENARIOS = {
    # prefetch hides the all-gathers (2 % of the step exposed), 7.7 GB/s bus bandwidth
    "healthy": _scenario(),
    # prefetch fails: 28 % of the step exposed: critical (comm/compute 0.47: no ZD006)
    "exposed": _scenario(ag_seconds=0.05, ag_exposed=(0.07, 0.07)),
    # synchronous all-gathers that the link explains: the engine's INFO only, no alert
    "sync-at-link-speed": _scenario(sync=True, ag_seconds=0.015),
    # synchronous all-gathers on a slow link (1.3 GB/s): slow link, exposed beyond the
    # link (49 % of the step), comm-bound (1.95)
    "slow-link": _scenario(sync=True, ag_seconds=0.2, step=1.2),
    # synchronous all-gathers at 27 % of the link (above slow_link_busbw_fraction), a fixed
    # delay the link's figure hides: 29 % of the step waiting beyond the link's expected
    # time: slow link (costly), critical; ZD004 / ZD006 only INFO
    "slow-link-costly": _scenario(sync=True, ag_seconds=0.05),
    # synchronous all-gathers the link explains, but more exposed communication than compute
    # (1.25x): comm-bound warning on the raw ratio, no slow link
    "sync-comm-bound": _scenario(sync=True, ag_seconds=0.025, compute=(0.04, 0.04), step=0.2),
    # one rank of four computes 1.5x, the others wait 0.15 s per step (23 %) for it
    "straggler": _scenario(world=4, slow_rank=3, slow_factor=1.5, peer_wait=0.15, step=0.65),
    # ... and one that computes 1.5x but costs the others only 4 % of the step: INFO
    "mild-straggler": _scenario(world=4, slow_rank=3, slow_factor=1.5, peer_wait=0.02),
    # 7 % headroom: warning; 3 %: critical
    "low-headroom": _scenario(peak=74.4e9),
    "oom-risk": _scenario(peak=77.6e9),
    # a GPU run whose allocator holds 60 of 80 GB, a third of it unallocated
    "fragmented": _scenario(peak=60e9, gpu={"peak_reserved": 60e9, "peak_allocated": 40e9,
                                            "reserved": 55e9, "allocated": 45e9}),
}


def _snapshot(ranks: dict, steps: int = 20):
    from tests.support.helpers import synthetic_facts
    from zerodoc.runmodel import CommTotals, RankWindow, RunSnapshot, UnitFacts

    world = len(ranks)
    units = tuple(UnitFacts(name=u, params=2 * MIB, param_bytes=8 * MIB, gather_bytes=8 * MIB,
                            sharded_bytes=8 * MIB // world, reshard_after_forward=True,
                            group_size=world) for u in UNITS)
    snap = RunSnapshot(source="synthetic")
    for r, d in ranks.items():
        facts = synthetic_facts(r, world, units, run_id="agree")
        w = RankWindow(facts=facts, steps=steps, first_step=1, last_step=steps,
                       step_seconds=d["step"] * steps, last_step_seconds=d["step"],
                       max_step_seconds=d["step"])
        w.compute = {k: v * steps for k, v in d["compute"].items()}
        w.comm = {k: CommTotals(c * steps, b * steps, s * steps, e * steps, h * steps)
                  for k, (c, b, s, e, h) in d["comm"].items()}
        w.memory = dict(d["memory"])
        snap.ranks[r] = w
    return snap


def _series(ranks: dict, samples: int = 40, interval: float = 15.0) -> list[dict]:
    """The same run as promtool input series: what the exporter would serve, scraped every
    `interval` seconds (counters grow by `interval / step` steps per scrape)."""
    out = []
    world = len(ranks)
    for r, d in ranks.items():
        n = interval / d["step"]  # steps per scrape
        base = {"instance": f"n1:{9730 + r}", "job": "zerodoc", "rank": str(r),
                "local_rank": str(r), "node": "n1", "run_id": "agree"}

        def add(name, labels, per_scrape=None, value=None):
            lab = ",".join(f'{k}="{v}"' for k, v in {**base, **labels}.items())
            vals = f"0+{per_scrape!r}x{samples}" if per_scrape is not None else \
                f"{value!r}x{samples}"
            out.append({"series": f"{name}{{{lab}}}", "values": vals})

        add("zerodoc_step_duration_seconds_count", {}, n)
        add("zerodoc_step_duration_seconds_sum", {}, n * d["step"])
        add("zerodoc_world_size", {}, value=world)
        if r == 0:  # the run's per-unit facts come from rank 0 only
            for u in UNITS:
                add("zerodoc_unit_group_size", {"unit": u}, value=world)
        for (u, ph), s in d["compute"].items():
            add("zerodoc_compute_seconds_total", {"unit": u, "phase": ph}, n * s)
        for (u, ph, c), (cnt, b, s, e, _h) in d["comm"].items():
            lab = {"unit": u, "phase": ph, "collective": c}
            add("zerodoc_collective_calls_total", lab, n * cnt)
            add("zerodoc_collective_bytes_total", lab, n * b)
            add("zerodoc_collective_seconds_total", lab, n * s)
            add("zerodoc_collective_exposed_seconds_total", lab, n * e)
        # ... and summed over the rank's units, as it serves them too (the per-rank rules)
        rank_compute: dict = {}
        for (_u, ph), s in d["compute"].items():
            rank_compute[ph] = rank_compute.get(ph, 0.0) + s
        for ph, s in rank_compute.items():
            add(RANK_COMPUTE, {"phase": ph}, n * s)
        rank_exposed: dict = {}
        for (_u, ph, c), (_cnt, _b, _s, e, _h) in d["comm"].items():
            rank_exposed[(ph, c)] = rank_exposed.get((ph, c), 0.0) + e
        for (ph, c), e in rank_exposed.items():
            add(RANK_EXPOSED, {"phase": ph, "collective": c}, n * e)
        for pop, v in d["memory"].items():
            if pop == "capacity":
                add("zerodoc_device_memory_capacity_bytes", {}, value=v)
            elif pop == "headroom":
                add("zerodoc_memory_headroom_bytes", {}, value=v)
            else:
                add("zerodoc_memory_bytes", {"population": pop}, value=v)
    return out


def _engine_alerts(ranks: dict, t: Thresholds, link: str) -> set[tuple[str, str]]:
    from zerodoc.diagnosis import Severity, diagnose

    want = set()
    for f in diagnose(_snapshot(ranks), t, link=link):
        if f.code not in ALERT_OF or f.severity < Severity.WARNING:
            continue
        want.add((ALERT_OF[f.code], "warning"))
        if f.code in CRITICAL_MIRRORED and f.severity >= Severity.ERROR:
            want.add((ALERT_OF[f.code], "critical"))
    return want


@pytest.mark.slow
@pytest.mark.parametrize("link", ["infiniband", "ethernet"])
def test_engine_and_alerts_agree_on_the_same_data(tmp_path, link):
    """Each scenario goes to the rules engine as a RunSnapshot and to promtool as the scrapes
    the exporter would serve; the (alert, severity) pairs firing after `for:` must be the
    engine's findings (WARNING -> warning; ERROR -> critical where the alert has one)."""
    promtool = require_binary("promtool")
    t = DEFAULT
    opts = RuleOptions(link=link)
    alerts.write_rules(tmp_path, t, opts)
    tests, expected = [], {}
    for name, ranks in SCENARIOS.items():
        want = _engine_alerts(ranks, t, link)
        expected[name] = want
        tests.append({
            "interval": "15s", "input_series": _series(ranks),
            "promql_expr_test": [{
                "expr": 'max by (alertname, severity) (ALERTS{alertstate="firing"})',
                "eval_time": "8m",
                "exp_samples": [{"labels": f'{{alertname="{a}",severity="{s}"}}', "value": 1}
                                for a, s in sorted(want)],
            }],
        })
    # the scenarios exercise every mirrored alert, firing and silent
    fired = {a for w in expected.values() for a, _ in w}
    if link == "infiniband":
        assert fired == set(ALERT_OF.values()), fired
    for quiet in ("healthy", "sync-at-link-speed", "mild-straggler"):
        assert not expected[quiet], (quiet, expected[quiet])
    spec = {"rule_files": [alerts.RECORDING_FILE, alerts.ALERTS_FILE],
            "evaluation_interval": "15s", "tests": tests}
    path = tmp_path / "agree.test.yml"
    path.write_text(json.dumps(spec, indent=1))
    r = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, (json.dumps({k: sorted(v) for k, v in expected.items()}, indent=1)
                               + "\n" + r.stdout[-6000:])
