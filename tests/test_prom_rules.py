"""Issue 20 item 17: the Prometheus source reads its per-unit stats from the recording rules.

A live 2-rank demo scraped by a real Prometheus through zerodoc's file_sd targets (series
labelled with `run_id`), with zerodoc's recording rules loaded (generated with a 10 s rate
window for a 1 s scrape). Checked: the source's per-unit queries are the recorded series (none
aggregates the raw per-unit series), and its answers equal the raw aggregation over the same
span at the same instant (the recorded sample's evaluation time); without the rules loaded
(or told not to use them) the source aggregates the raw series itself.
"""

from __future__ import annotations

import math

import pytest

from tests.support.helpers import LiveDemo
from tests.support.promserver import PromServer
from zerodoc.ops import alerts
from zerodoc.ops.alerts import RuleOptions
from zerodoc.ops.alerts.recording import RULE_WINDOW, UNIT_RANKS
from zerodoc.sources import PrometheusSource

pytestmark = pytest.mark.slow
WINDOW = "10s"


@pytest.fixture(scope="module")
def prom_rules(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("promrules")
    rules = tmp / "zerodoc-recording.yml"
    rules.write_text(alerts.rule_files(opts=RuleOptions(window=WINDOW, alert_for="5s",
                                                        link="gloo-cpu"))[alerts.RECORDING_FILE])
    sd = tmp / "sd"
    sd.mkdir()
    with LiveDemo(tmp, name="rules-run", env={"ZERODOC_FILE_SD_DIR": str(sd)}) as demo:
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


def _differences(recorded, raw) -> list:
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
    for unit, row in raw.units.items():
        for f, s in row.items():
            r = recorded.units[unit][f]
            out += [(unit, f, a) for a in ("mean", "max")
                    if not math.isclose(getattr(r, a), getattr(s, a), rel_tol=1e-9,
                                        abs_tol=1e-12)]
    if recorded.sync != raw.sync:
        out.append(("sync", recorded.sync, raw.sync))
    return out


def test_recorded_answers_equal_the_raw_ones(prom_rules):
    """At a rule evaluation's own timestamp the recorded stats equal the raw aggregation over
    the rules' window. A scrape whose samples were appended while the rule group was being
    evaluated makes that one evaluation differ (later rules of the group see them, earlier
    ones do not), so the newest few evaluations are tried: one must agree exactly."""
    _demo, prom = prom_rules
    src = PrometheusSource(prom.url, window=5, run_id="rules-run")
    snap = src.snapshot()
    sel = 'run_id="rules-run"'
    rows = prom.query(f'{UNIT_RANKS}{{{sel}}}[15s]')
    stamps = sorted({float(t) for r in rows for t, _v in r["values"]}, reverse=True)[1:9]
    assert len(stamps) >= 4, stamps

    def rng(name: str, extra: str = "") -> str:
        return f"increase({name}{{{sel}{extra}}}[{WINDOW}])"

    ranks = tuple(sorted(snap.ranks))
    seen = []
    for t in stamps:
        src.recorded = True
        recorded = src._unit_stats(sel, rng, t, ranks, snap)
        src.recorded = False
        raw = src._unit_stats(sel, rng, t, ranks, snap)
        assert recorded.window_s == 10.0 and raw.window_s is None
        assert len(raw.comm) >= 8 and raw.units
        diff = _differences(recorded, raw)
        if not diff:
            return
        seen.append((t, diff[:3]))
    raise AssertionError(f"no evaluation agrees with the raw aggregation: {seen}")
