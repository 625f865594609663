"""The Prometheus series budget: at 81 units a rank other than rank 0 serves at most 1,200
series by default and 150 in coarse mode, the run's per-unit facts and the framework's time
per unit come from rank 0 only, and what the catalog counts is what a real exporter serves.

Witnesses: real scrapes of two live 2-rank gloo jobs (81 units: 80 blocks + the root), one
at each detail level, compared series for series with `zerodoc.ops.cardinality`; and the coarse
rank's totals over units against its own run log (which keeps full per-unit detail).
"""

from __future__ import annotations

import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.helpers import LiveDemo, wait_until
from zerodoc.ops import cardinality as card
from zerodoc.catalog import CATALOG, Metric
from zerodoc.exporter.detail import unit_detail_ranks
from zerodoc.runlog import read_rank_log

TINY_81 = {"blocks": 80, "hidden": 16, "heads": 2, "vocab": 64, "seq": 8, "batch": 2}
# the per-unit series (folded over units in coarse mode): every `unit`-scoped metric
UNIT_SERIES = tuple(m.name for m in CATALOG if m.scope in ("unit", "unit_rank0"))
FRAMEWORK = "zerodoc_framework_unit_seconds_total"


def scrape(endpoint: str) -> str:
    with urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=10) as r:
        return r.read().decode()


def samples(text: str) -> list:
    return [s for fam in text_string_to_metric_families(text) for s in fam.samples]


# --------------------------------------------------------------------------------------
# the budget, from the catalog


@pytest.mark.parametrize("shape,budget", [(card.CPU_FSDP2, card.BUDGET_FULL),
                                          (card.GPU_FSDP2, card.BUDGET_GPU)], ids=["cpu", "gpu"])
def test_budget_holds_at_81_units(shape, budget):
    assert shape.units == card.BUDGET_UNITS == 81
    assert card.BUDGET_FULL == 1200
    assert card.total(shape) <= budget
    assert card.total(shape, unit_detail=False) <= card.BUDGET_COARSE
    # rank 0 adds the run's per-unit facts (9 per unit) and the framework's time per unit and
    # phase (2 per unit, in place of the other ranks' 2 sums over units), once per run
    assert card.total(shape, rank0=True) - card.total(shape) == 11 * shape.units - 2


def test_every_labelled_metric_says_what_it_grows_with():
    """A metric with a bounded label declares its count (`per`), and one with `unit` its
    scope, so the budget counts it (the live scrape below checks the counts)."""
    for m in CATALOG:
        info_only = m.type == "info" and "unit" not in m.labels
        if m.labels and not info_only:
            assert m.per, m.name
        if "unit" in m.labels:  # the stall gauge: at most one series per rank, on every rank
            assert m.scope in ("unit", "unit_rank0", "run") or m.per == "stalled", m.name
        assert not m.per or hasattr(card.CPU_FSDP2, m.per), m.name


def test_a_new_per_unit_metric_breaks_the_budget(monkeypatch):
    extra = Metric("zerodoc_collective_queued_seconds_total", "counter", "seconds", "x.",
                   ("unit", "phase", "collective"), "unit", "unit_collective_keys")
    monkeypatch.setattr(card, "CATALOG", CATALOG + (extra,))
    assert card.total() > card.BUDGET_FULL
    # ... while in coarse mode it costs one series per (phase, collective)
    assert card.total(unit_detail=False) <= card.BUDGET_COARSE


def test_unit_sample_spreads_over_the_job():
    assert unit_detail_ranks(1024, 8) == {0, 128, 256, 384, 512, 640, 768, 896}
    assert unit_detail_ranks(2, 8) == {0, 1} and unit_detail_ranks(2, 1) == {0}
    assert unit_detail_ranks(1024, 0) == set()
    assert card.job_total(1024, 8, coarse=True) < 1024 * card.BUDGET_COARSE


def test_detail_options_are_checked_at_attach_time(monkeypatch):
    from zerodoc.shim.config import AttachConfig

    assert AttachConfig.from_options().metrics_detail == "full"
    monkeypatch.setenv("ZERODOC_METRICS_DETAIL", "coarse")
    monkeypatch.setenv("ZERODOC_METRICS_UNIT_RANKS", "16")
    cfg = AttachConfig.from_options()
    assert (cfg.metrics_detail, cfg.metrics_unit_ranks) == ("coarse", 16)
    assert AttachConfig.from_options(metrics_detail="full").metrics_detail == "full"
    with pytest.raises(ValueError, match="metrics_detail must be one of 'full', 'coarse'"):
        AttachConfig.from_options(metrics_detail="fine")
    with pytest.raises(TypeError, match="metrics_unit_ranks must be an int"):
        AttachConfig.from_options(metrics_unit_ranks="8")
    monkeypatch.setenv("ZERODOC_METRICS_UNIT_RANKS", "eight")
    with pytest.raises(ValueError, match="ZERODOC_METRICS_UNIT_RANKS"):
        AttachConfig.from_options()


# --------------------------------------------------------------------------------------
# real scrapes


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """Two live 2-rank jobs of 81 units, side by side: default detail, and coarse with rank 0
    alone keeping unit detail."""
    tmp = tmp_path_factory.mktemp("cardinality")
    with LiveDemo(tmp, model=TINY_81, name="full") as full, \
            LiveDemo(tmp, model=TINY_81, name="coarse",
                     attach={"metrics_detail": "coarse", "metrics_unit_ranks": 1}) as coarse:
        full.wait_steps(3)
        coarse.wait_steps(3)
        yield {"full": full, "coarse": coarse}


@pytest.mark.slow
def test_live_scrapes_match_the_catalog_and_the_budget(jobs):
    got = {(mode, r): card.count_exposition(scrape(ep))
           for mode, demo in jobs.items() for r, ep in enumerate(demo.endpoints)}
    for (mode, r), counts in got.items():
        want = card.series_count(card.CPU_FSDP2, rank0=r == 0,
                                 unit_detail=mode == "full" or r == 0)
        diff = {k: (counts.get(k, 0), want.get(k, 0)) for k in set(counts) | set(want)
                if counts.get(k, 0) != want.get(k, 0)}
        assert not diff, f"{mode} rank {r}: (served, catalog) {diff}"
    per_rank = {k: sum(v.values()) for k, v in got.items()}
    assert per_rank[("full", 1)] <= card.BUDGET_FULL
    assert per_rank[("coarse", 1)] <= card.BUDGET_COARSE
    # facts once per run: rank 1 serves no zerodoc_unit_* series at all
    assert not [k for k in got[("full", 1)] if k.startswith("zerodoc_unit_")]
    assert got[("full", 0)]["zerodoc_unit_parameters"] == 81
    assert "zerodoc_collective_busbw_bytes_per_second" not in got[("full", 0)]


@pytest.mark.slow
def test_omitted_series_are_counted(jobs):
    def omitted(text):
        return {s.labels["reason"]: s.value for s in samples(text)
                if s.name == "zerodoc_exporter_omitted_series"}

    full = {r: scrape(ep) for r, ep in enumerate(jobs["full"].endpoints)}
    coarse1 = scrape(jobs["coarse"].endpoints[1])
    facts0 = sum(n for k, n in card.count_exposition(full[0]).items()
                 if k.startswith("zerodoc_unit_"))
    assert omitted(full[0]) == {"unit_facts": 0, "unit_detail": 0}
    # the framework's time per unit: rank 0's per unit; rank 1 sums it over units per phase
    fw0 = card.count_exposition(full[0])[FRAMEWORK]
    assert fw0 == 2 * 81 and card.count_exposition(full[1])[FRAMEWORK] == 2
    assert omitted(full[1]) == {"unit_facts": facts0, "unit_detail": fw0 - 2}
    per_unit = sum(card.count_exposition(full[0])[k] for k in UNIT_SERIES)  # all per unit
    folded = sum(card.count_exposition(coarse1)[k] for k in UNIT_SERIES)
    assert omitted(coarse1) == {"unit_facts": facts0, "unit_detail": per_unit - folded}
    info = [s for s in samples(coarse1) if s.name == "zerodoc_run_info"]
    assert info[0].labels["metrics_detail"] == "coarse"


@pytest.mark.slow
def test_coarse_totals_equal_the_run_log(jobs):
    """The coarse rank's totals over units are the sums of its run log's per-unit records up
    to the step it served (a scrape torn between a step's counters and its step number is
    retried)."""
    demo = jobs["coarse"]
    bad = None
    last: dict = {}

    def served_matches_run_log() -> bool:
        """A scrape can land between a rank's counter updates: compared again until a whole
        step agrees."""
        got = {}
        for s in samples(scrape(demo.endpoints[1])):
            if s.name == "zerodoc_last_step":
                got["step"] = int(s.value)
            elif s.name == "zerodoc_collective_exposed_seconds_total":
                assert "unit" not in s.labels
                got[(s.labels["phase"], s.labels["collective"])] = s.value
            elif s.name == "zerodoc_compute_seconds_total":
                assert "unit" not in s.labels
                got[s.labels["phase"]] = s.value
        demo.wait_steps(got["step"] + 1)
        log = read_rank_log(demo.run_dir / "rank-00001.jsonl")
        want: dict = {}
        for st in log.steps:
            if st.step <= got["step"]:
                for (_u, ph, c), t in st.comm.items():
                    want[(ph, c)] = want.get((ph, c), 0.0) + t.exposed_seconds
                for (_u, ph), sec in st.compute.items():
                    want[ph] = want.get(ph, 0.0) + sec
        last["bad"] = bad = {k: (got.get(k), v) for k, v in want.items()
                             if got.get(k) != pytest.approx(v, rel=1e-9, abs=1e-12)}
        return not bad and set(want) == set(got) - {"step"}

    try:
        wait_until(served_matches_run_log, 30, "rank 1's served totals to match its run log",
                   interval=0.2)
    except AssertionError as e:
        raise AssertionError(f"{e}; (served, run log): {last.get('bad')}") from None


@pytest.mark.slow
def test_rank_level_totals_equal_the_sums_of_the_per_unit_series(jobs):
    """Every rank, at both detail levels, serves its compute per phase and exposed time per
    (phase, collective) summed over its units: in the same scrape, equal to the sums of the
    per-unit (or, coarse, unit-less) series it serves beside them."""
    from zerodoc.catalog import RANK_COMPUTE, RANK_EXPOSED

    per_unit = {"zerodoc_compute_seconds_total": RANK_COMPUTE,
                "zerodoc_collective_exposed_seconds_total": RANK_EXPOSED}
    for mode, demo in jobs.items():
        for r, ep in enumerate(demo.endpoints):
            sums: dict = {}
            ranked: dict = {}
            for s in samples(scrape(ep)):
                key = (s.labels.get("phase"), s.labels.get("collective"))
                if s.name in per_unit:
                    k = (per_unit[s.name], *key)
                    sums[k] = sums.get(k, 0.0) + s.value
                elif s.name in per_unit.values():
                    assert "unit" not in s.labels, s
                    ranked[(s.name, *key)] = s.value
            assert len(ranked) == 5 and set(ranked) == set(sums), (mode, r, ranked, sums)
            assert any(v > 0 for v in ranked.values())
            bad = {k: (v, sums[k]) for k, v in ranked.items()
                   if v != pytest.approx(sums[k], rel=1e-9, abs=1e-12)}
            assert not bad, (mode, r, bad)


@pytest.mark.slow
def test_a_coarse_run_reads_through_the_sources(jobs):
    """Sources file a coarse rank's unit-less totals as its totals (not as a unit); the rules
    engine gets every rank's totals and rank 0's per-unit numbers, and finds what it finds
    in the run directory, which keeps full per-unit detail."""
    from zerodoc.catalog import RANK_TOTAL_UNIT
    from zerodoc.diagnosis import diagnose
    from zerodoc.sources import EndpointsSource, RunDirSource

    demo = jobs["coarse"]
    snap = EndpointsSource(demo.endpoints, window=None).snapshot()
    ref = RunDirSource(demo.run_dir, window=None).snapshot()
    assert sorted(snap.ranks) == [0, 1] and not snap.stale_ranks
    w0, w1 = snap.ranks[0], snap.ranks[1]
    assert {u for u, *_ in w1.comm} == {RANK_TOTAL_UNIT}
    assert RANK_TOTAL_UNIT not in {u for u, *_ in w0.comm}
    assert len(w1.facts.units) == len(w0.facts.units) == 81  # rank 0's facts, shared
    got, want = diagnose(snap), diagnose(ref)
    assert got and want
    assert (got[0].code, got[0].severity) == (want[0].code, want[0].severity)
