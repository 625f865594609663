"""The framework's time served in coarse Prometheus detail and with sampling (issue 19 / 22):
`zerodoc_framework_seconds_total` and `zerodoc_framework_unit_seconds_total` (per unit on
rank 0; per phase without the `unit` label on every other rank, at full detail too since issue
33, and in coarse mode) cover the detail steps that
`zerodoc_detail_steps_total` counts, and are true on them.

Witness, independent of zerodoc's definition: every FSDP2 unit's pre-forward sleeps DELAY
inside FSDP's own forward pre-hook (the demo worker's `framework_delay_s`, beneath the
measurement), so each detail step holds at least UNITS x DELAY of forward framework time, and
each unit at least DELAY. Two live 2-rank gloo jobs, rank 0 serving per-unit series and rank 1
its sums over units: one sampled (1 step in 8) in coarse mode, one with detail on every step
at the default (full) metrics detail. The served totals are
also held equal to the sums of the rank's own run log up to the step served.

Bounds: the sleep is at least DELAY (never less); FSDP's own pre-forward work on this small
model and the hooks add a few ms per unit, held to SLACK per unit and step on the mean over
the detail steps. A total that left the framework out, summed it twice or counted it over
every step instead of the detail steps falls outside (2 x DELAY per unit is beyond the bound).
"""

from __future__ import annotations

import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.helpers import LiveDemo, wait_until
from zerodoc.runlog import read_rank_log

DELAY = 0.02
SLACK = 0.015  # per unit and detail step: FSDP's own work + the hooks (mean, loaded box)
MODEL = {"blocks": 4}  # + the root: 5 units
UNITS = 5
SAMPLED_K = 8

pytestmark = pytest.mark.slow


def scrape(endpoint: str) -> list:
    with urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=10) as r:
        text = r.read().decode()
    return [s for fam in text_string_to_metric_families(text) for s in fam.samples]


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("framework_totals")
    attach = {"metrics_detail": "coarse", "metrics_unit_ranks": 1, "stall_after_s": 0}
    spec = {"framework_delay_s": DELAY}
    with LiveDemo(tmp, model=MODEL, name="sampled", spec=spec,
                  attach={**attach, "detail": SAMPLED_K}) as sampled, \
            LiveDemo(tmp, model=MODEL, name="every", spec=spec,
                     attach={"stall_after_s": 0, "detail": "every"}) as every:
        yield {"sampled": sampled, "every": every}


def served(demo: LiveDemo, rank: int) -> dict:
    """One scrape of a rank: its step, detail steps, steps, framework totals."""
    got: dict = {"unit": {}, "phase": {}}
    for s in scrape(demo.endpoints[rank]):
        if s.name == "zerodoc_last_step":
            got["step"] = int(s.value)
        elif s.name == "zerodoc_detail_steps_total":
            got["detail_steps"] = int(s.value)
        elif s.name == "zerodoc_step_duration_seconds_count":
            got["steps"] = int(s.value)
        elif s.name == "zerodoc_framework_seconds_total":
            got["framework"] = s.value
        elif s.name == "zerodoc_framework_unit_seconds_total":
            ph = s.labels["phase"]
            if "unit" in s.labels:
                got["unit"][(s.labels["unit"], ph)] = s.value
            got["phase"][ph] = got["phase"].get(ph, 0.0) + s.value
    return got


def agreed_scrape(demo: LiveDemo, rank: int, least_detail: int) -> tuple[dict, list]:
    """A scrape with at least `least_detail` detail steps whose totals equal the sums of the
    rank's run log up to the step it served (a scrape torn between a step's counters is
    taken again), and the run log's step records up to that step."""
    last: dict = {}

    def agrees():
        got = served(demo, rank)
        if got.get("detail_steps", 0) < least_detail:
            return None
        demo.wait_steps(got["step"] + 1)
        steps = [s for s in read_rank_log(demo.run_dir / f"rank-{rank:05d}.jsonl").steps
                 if s.step <= got["step"]]
        detail = [s for s in steps if s.detail]
        want = {"detail_steps": len(detail), "steps": len(steps),
                "framework": sum(s.framework_seconds for s in detail)}
        phase: dict = {}
        for s in detail:
            for (_u, ph), t in s.unit_framework.items():
                phase[ph] = phase.get(ph, 0.0) + t
        last["bad"] = bad = {k: (got.get(k), v) for k, v in want.items()
                             if got.get(k) != pytest.approx(v, rel=1e-9, abs=1e-12)}
        if set(phase) != set(got["phase"]) or any(
                got["phase"][p] != pytest.approx(v, rel=1e-9, abs=1e-12)
                for p, v in phase.items()):
            last["bad"] = bad = {**bad, "phase": (got["phase"], phase)}
        return None if bad else (got, steps)

    try:
        return wait_until(agrees, 120, f"rank {rank}'s served framework totals to match its "
                          "run log", interval=0.3)
    except AssertionError as e:
        raise AssertionError(f"{e}; (served, run log): {last.get('bad')}") from None


@pytest.mark.parametrize("kind", ["sampled", "every"])
def test_rank_1_serves_the_framework_time_of_its_detail_steps(jobs, kind):
    demo = jobs[kind]
    got, steps = agreed_scrape(demo, 1, least_detail=8)
    assert not got["unit"]  # coarse, or full on a rank but 0: per phase, no `unit` label
    n = got["detail_steps"]
    if kind == "every":
        assert n == got["steps"]
    else:  # sampled: detail on a part of the steps only (2 warm-up steps, then ~1 in 8)
        assert n < got["steps"]
    fwd = got["phase"]["forward"] / n
    assert UNITS * DELAY <= fwd <= UNITS * (DELAY + SLACK), (kind, fwd, n)
    # the step's framework time holds every unit's (and that of no unit): at least as much
    assert got["framework"] >= got["phase"]["forward"] + got["phase"].get("backward", 0.0)
    assert got["framework"] / n <= UNITS * (DELAY + 2 * SLACK), (kind, got["framework"], n)
    for s in steps[1:]:  # every step pays the delay; only the detail steps measure it
        assert s.step_seconds >= UNITS * DELAY, (kind, s.step, s.step_seconds)
        if s.detail:
            assert s.framework_seconds >= UNITS * DELAY, (kind, s.step, s.framework_seconds)
        else:  # not measured (the run log's null, read as 0 beside detail=False)
            assert s.framework_seconds == 0.0 and not s.unit_framework, (kind, s.step)


@pytest.mark.parametrize("kind", ["sampled", "every"])
def test_full_rank_serves_each_units_framework_time(jobs, kind):
    got, _steps = agreed_scrape(jobs[kind], 0, least_detail=8)
    n = got["detail_steps"]
    fwd = {u: t / n for (u, ph), t in got["unit"].items() if ph == "forward"}
    assert len(fwd) == UNITS
    bad = {u: t for u, t in fwd.items() if not DELAY <= t <= DELAY + SLACK}
    assert not bad, (kind, n, bad)
