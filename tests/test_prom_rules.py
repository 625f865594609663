"""Issue 20 item 17: the Prometheus source reads its per-unit stats from the recording rules.

A live 2-rank demo scraped by a real Prometheus through zerodoc's file_sd targets (series
labelled with `run_id`), with zerodoc's recording rules loaded (generated with a 10 s rate
window for a 1 s scrape). Checked: the source's per-unit queries are the recorded series (none
aggregates the raw per-unit series), and its answers equal the raw aggregation over the same
span at the same instant (the recorded sample's evaluation time); without the rules loaded
(or told not to use them) the source aggregates the raw series itself. Per rank, compute
and exposed time come from the rank-level series (`zerodoc_rank_*`, a few per rank), not
from sums over every per-unit series, and the report built from them equals the one built
from those sums at the same instant.
"""

from __future__ import annotations

import math
import time

import pytest

from tests.support.helpers import LiveDemo
from tests.support.promserver import PromServer
from zerodoc.ops import alerts
from zerodoc.ops.alerts import RuleOptions
from zerodoc.catalog import RANK_COMPUTE, RANK_EXPOSED
from zerodoc.diagnosis import diagnose
from zerodoc.ops.alerts.recording import RULE_WINDOW, UNIT_RANKS
from zerodoc.report import build_report, render_json, render_text
from zerodoc.sources import PrometheusSource
from zerodoc.thresholds import DEFAULT

pytestmark = pytest.mark.slow
WINDOW = "10s"


@pytest.fixture(scope="module")
def prom_rules(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("promrules")
    rules = tmp / "zerodoc-recording.yml"
    # the per-unit groups evaluated every scrape (not once per window), over the same window
    # as the rank-level rules (not twice it): the tests compare several recent evaluations
    # with the raw series over WINDOW
    rules.write_text(alerts.rule_files(opts=RuleOptions(
        window=WINDOW, unit_window=WINDOW, alert_for="5s", link="gloo-cpu",
        unit_interval="1s"))[alerts.RECORDING_FILE])
    sd = tmp / "sd"
    sd.mkdir()
    # Per-unit detail on every step: these tests hold the recording rules against the raw
    # series over a 5 s window, per unit; with sampled detail such a window can hold no
    # sampled step, and both paths then read 0 (nothing to compare, and a fallback that gave
    # nothing would pass)
    with LiveDemo(tmp, name="rules-run", env={"ZERODOC_FILE_SD_DIR": str(sd)},
                  attach={"detail": "every"}) as demo:
        with PromServer(tmp, file_sd=[str(sd / "*.json")], rule_files=[str(rules)]) as prom:
            sel = 'run_id="rules-run"'
            prom.wait_for(f"zerodoc_run_info{{{sel}}}", min_results=2, timeout=60)
            # both ranks in the rules' window, and a few evaluations of them recorded
            prom.wait_for(f"{UNIT_RANKS}{{{sel}}} == 2", timeout=60)
            prom.wait_for(f"count_over_time({UNIT_RANKS}{{{sel}}}[15s]) >= 8", timeout=60)
            prom.wait_for(f"{RULE_WINDOW}{{{sel}}}", timeout=30)  # the group's last
            yield demo, prom


def _spy(src: PrometheusSource) -> list[str]:
    seen: list[str] = []
    real = src._query

    def query(expr, at=None, timeout_s=None):
        seen.append(expr)
        return real(expr, at, timeout_s)
    src._query = query
    return seen


def test_per_unit_stats_come_from_the_recording_rules(prom_rules):
    _demo, prom = prom_rules
    src = PrometheusSource(prom.url, window=5)
    seen = _spy(src)
    snap = src.snapshot()
    st = snap.unit_stats
    assert st.window_s == 10.0 and st.comm and st.units
    assert any("unit_job:zerodoc_collective_calls:per_step_mean" in e for e in seen)
    # no query aggregates the raw per-unit series by unit (what cost 43.5 s at 1,024 ranks)
    raw = [e for e in seen if "by (unit, phase" in e and "zerodoc_collective_" in e
           and "unit_job:" not in e and "unit_phase_job:" not in e]
    assert raw == [], raw
    # told not to use them: the raw aggregation, over the snapshot's window
    plain = PrometheusSource(prom.url, window=5, recorded=False)
    seen = _spy(plain)
    assert plain.snapshot().unit_stats.window_s is None
    assert not any("unit_job:" in e for e in seen)


def _differences(recorded, raw, raw_units=None) -> list:
    """Where the recorded stats differ from the raw aggregation: the per-collective ones from
    `raw`, the per-unit compute ones from `raw_units` (default `raw`)."""
    out = []
    if recorded.comm.keys() != raw.comm.keys():
        return [("keys", sorted(recorded.comm), sorted(raw.comm))]
    for key, stats in raw.comm.items():
        for f, s in stats.items():
            r = recorded.comm[key][f]
            out += [(key, f, a, getattr(r, a), getattr(s, a))
                    for a in ("min", "median", "mean", "max", "n")
                    if not math.isclose(getattr(r, a), getattr(s, a), rel_tol=1e-9,
                                        abs_tol=1e-12)]
    for unit, row in (raw_units or raw).units.items():
        for f, s in row.items():
            r = recorded.units[unit][f]
            out += [(unit, f, a) for a in ("mean", "max")
                    if not math.isclose(getattr(r, a), getattr(s, a), rel_tol=1e-9,
                                        abs_tol=1e-12)]
    if recorded.sync != raw.sync:
        out.append(("sync", recorded.sync, raw.sync))
    return out


def test_recorded_answers_equal_the_raw_ones(prom_rules):
    """The recorded stats equal the raw aggregation over the rules' window at the instant of
    the per-step rates they aggregate. Two groups record them (recording.py): at a stamp t of
    the aggregates' group (`zerodoc.units`), the per-unit compute stats are the rates
    group's newest evaluation at or before t and the collective stats aggregate the rates of
    that evaluation or of the one before (the groups run side by side: which one the
    aggregates read depends on whether the rates group had finished), so both are tried. A
    scrape whose samples were appended while a group was being evaluated makes that one
    evaluation differ (later rules of the group see them, earlier ones do not), so the newest
    few evaluations are tried: one must agree exactly."""
    _demo, prom = prom_rules
    src = PrometheusSource(prom.url, window=5, run_id="rules-run")
    snap = src.snapshot()
    sel = 'run_id="rules-run"'
    rows = prom.query(f'{UNIT_RANKS}{{{sel}}}[15s]')
    stamps = sorted({float(t) for r in rows for t, _v in r["values"]}, reverse=True)[1:9]
    assert len(stamps) >= 4, stamps

    def rng(name: str, extra: str = "") -> str:
        return f"increase({name}{{{sel}{extra}}}[{WINDOW}])"

    # the rates group's evaluation stamps (one of its recorded series)
    rows = prom.query(f'{alerts.recording.PER_STEP["calls"]}{{{sel}}}[20s]')
    rates_at = sorted({float(t) for r in rows for t, _v in r["values"]})
    ranks = tuple(sorted(snap.ranks))
    seen = []
    for t in stamps:
        src.recorded = True
        recorded = src._unit_stats(sel, rng, t, ranks, snap)
        src.recorded = False
        before = [x for x in rates_at if x <= t][-2:]
        assert len(before) == 2, (t, rates_at)
        raws = [src._unit_stats(sel, rng, x, ranks, snap) for x in before]
        assert recorded.window_s == 10.0 and all(r.window_s is None for r in raws)
        assert all(len(r.comm) >= 8 and r.units for r in raws)
        for raw in raws:
            diff = _differences(recorded, raw, raws[-1])
            if not diff:
                return
            seen.append((t, before, diff[:3]))
    raise AssertionError(f"no evaluation agrees with the raw aggregation: {seen}")


PER_UNIT = ("zerodoc_compute_seconds_total", "zerodoc_collective_exposed_seconds_total")


def _per_rank_sums(seen: list[str]) -> list[str]:
    """The queries that sum a rank's per-unit series (what cost 1.4-6.8 s each at 1,024
    ranks)."""
    return [e for e in seen if "sum by (rank)" in e and any(n in e for n in PER_UNIT)]


def _pin_interval(src: PrometheusSource) -> None:
    """The scrape interval measured once (the window's span and the evaluation instant derive
    from it: two snapshots at the same `at` must not differ by a jittered scrape)."""
    measured: dict = {}
    real = src._scrape_interval
    src._scrape_interval = lambda sel: measured.setdefault(sel, real(sel))


def _settled() -> float:
    """An instant whose scrapes are all in the TSDB: a sample is stamped when its scrape
    starts and appended when it ends (up to the 1 s scrape timeout later, more on a loaded
    box), so an instant of `now` can gain samples between two queries."""
    return time.time() - 5.0


def _report(src: PrometheusSource, snap, at: float) -> tuple[str, str]:
    """Text and JSON of the report generated at `at` (the snapshots' instant: a live run's
    "last write N s ago" is then the same in both)."""
    rep = build_report(snap, diagnose(snap), source=src.description, thresholds=DEFAULT,
                       link=None, window=src.window, generated_unix=at)
    return render_text(rep), render_json(rep)


@pytest.mark.parametrize("window", [5, None], ids=["window", "cumulative"])
def test_per_rank_figures_come_from_the_rank_level_series(prom_rules, window):
    """The snapshot's per-rank compute and exposed time are read from the rank-level series
    (no query sums the per-unit ones) and equal those sums, evaluated at the same instant:
    the same report, number for number."""
    _demo, prom = prom_rules
    src = PrometheusSource(prom.url, window=window, run_id="rules-run")
    seen = _spy(src)
    _pin_interval(src)
    at = _settled()
    snap = src.snapshot(at=at)
    seen_new = list(seen)
    seen.clear()
    src.rank_series = False
    ref = src.snapshot(at=at)
    assert [e for e in seen_new if RANK_COMPUTE in e] and \
        [e for e in seen_new if RANK_EXPOSED in e]
    assert _per_rank_sums(seen_new) == [], _per_rank_sums(seen_new)
    assert len(_per_rank_sums(seen)) == 2  # the witness: the sums over units
    assert not [e for e in seen if "zerodoc_rank_" in e]
    assert sorted(snap.ranks) == sorted(ref.ranks) == [0, 1]
    for r, w in snap.ranks.items():
        for f in ("compute_total", "exposed_total"):
            a, b = getattr(w, f), getattr(ref.ranks[r], f)
            assert a > 0 and math.isclose(a, b, rel_tol=1e-9), (r, f, a, b)
    got, want = _report(src, snap, at), _report(src, ref, at)
    assert got[0] == want[0]
    assert got[1] == want[1]


def test_ranks_without_rank_level_series_fall_back_to_the_sums(prom_rules):
    """A rank of an older zerodoc serves no rank-level series: its figures come from the sums
    over its per-unit series (simulated: the rank-level answers withheld)."""
    _demo, prom = prom_rules
    src = PrometheusSource(prom.url, window=5, run_id="rules-run")
    seen = _spy(src)
    real = src._query

    def withheld(expr, at=None, timeout_s=None):
        rows = real(expr, at, timeout_s)
        return [] if "zerodoc_rank_" in expr else rows
    src._query = withheld
    _pin_interval(src)
    at = _settled()
    snap = src.snapshot(at=at)
    assert len(_per_rank_sums(seen)) == 2
    src.rank_series = False
    ref = src.snapshot(at=at)
    for r, w in snap.ranks.items():
        assert w.compute_total > 0 and w.compute_total == ref.ranks[r].compute_total
        assert w.exposed_total == ref.ranks[r].exposed_total


def test_rules_without_the_framework_series_fall_back_to_the_raw_ones(prom_rules,
                                                                      monkeypatch):
    """A server whose rule file predates the framework's recorded series (zerodoc upgraded
    before the rules were redeployed: the recorded names are not there) still gives every
    unit's framework time, from the raw series (review of 2026-11-27: it gave none, and the
    report said "not recorded")."""
    from zerodoc.sources import prometheus as pm

    _demo, prom = prom_rules
    have = PrometheusSource(prom.url, window=5).snapshot().unit_stats.units
    fw = {u: row["framework_seconds"] for u, row in have.items() if "framework_seconds" in row}
    # one rank: every rank but rank 0 serves its framework time summed over units (issue 33)
    assert fw and all(s.n == 1 for s in fw.values()), fw
    old = {a: f"{name}_not_in_an_older_rule_file" for a, name in pm.UNIT_FRAMEWORK.items()}
    monkeypatch.setattr(pm, "UNIT_FRAMEWORK", old)
    src = PrometheusSource(prom.url, window=5)
    seen = _spy(src)
    st = src.snapshot().unit_stats
    assert st.window_s == 10.0  # still the recorded path for everything else
    assert any("zerodoc_framework_unit_seconds_total" in e for e in seen)  # the raw series
    got = {u: row["framework_seconds"] for u, row in st.units.items()
           if "framework_seconds" in row}
    assert set(got) == set(fw) and all(s.n == 1 and s.mean > 0 for s in got.values()), got
