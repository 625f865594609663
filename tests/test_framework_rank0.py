"""The framework's time per unit from a source that has it summed over units (issue 33: a
Prometheus or scraped rank other than rank 0 serves `zerodoc_framework_unit_seconds_total`
per phase, without the `unit` label; sources file it under RANK_TOTAL_UNIT). The what-if
must not take that sum for a unit: the rank is priced per step, and the answer says why."""

from __future__ import annotations

from tests.test_whatif import _fw_per_unit, synthetic
from zerodoc.catalog import RANK_TOTAL_UNIT
from zerodoc.whatif import Changes, answer, fit


def _summed_over_units(d) -> None:
    """What a rank other than rank 0 serves: its framework time per unit, summed per phase."""
    _fw_per_unit(d)
    r = d["ranks"][0]
    by_phase: dict[str, float] = {}
    for _unit, phase, s in r["unit_framework"]:
        by_phase[phase] = by_phase.get(phase, 0.0) + s
    r["unit_framework"] = [[RANK_TOTAL_UNIT, p, s] for p, s in by_phase.items()]


def test_a_sum_over_units_is_priced_per_step_and_said_so():
    per_unit, _ = synthetic(extra=_fw_per_unit)
    assert answer(fit(per_unit), Changes())["framework"]["pricing"] == "per unit"
    summed, _ = synthetic(extra=_summed_over_units)
    w = next(iter(summed.ranks.values()))
    assert {u for u, _p in w.unit_framework} == {RANK_TOTAL_UNIT}  # the shape under test
    m = fit(summed)
    assert not any(rm.framework_per_unit for rm in m.ranks)
    got = answer(m, Changes())["framework"]
    assert got["pricing"] == "per step"
    assert "rank 0 alone" in got["note"], got["note"]
