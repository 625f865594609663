"""Flight-recorder dumps + a zerodoc run log -> the stopped rank's unit and phase, for the
engines other than FSDP2 (issue 34, item 1): FSDP1, ZeRO-1 (ZeroRedundancyOptimizer over
DDP) and DeepSpeed ZeRO-3.

The witness is the job itself (tests/support/jobs/flightrec_engines.py): a real 2-rank gloo
run at zerodoc's default detail in which the test chooses where rank 1 blocks (a unit's
forward or backward, or ZeRO-1's optimizer step), on a step without per-unit detail. Torch's
own flight recorder dumps both ranks; the report must name rank 1 and the chosen unit and
phase. What a unit is per engine (docs/runlog.md, collorder): FSDP1, the wrapped module;
ZeRO-1, "(model)" (no per-module collective: its phases are told apart, backward buckets
against optimizer broadcasts; it has no forward collective); DeepSpeed ZeRO-3, the block
its fetch is booked on.
"""

from __future__ import annotations

import json

import pytest

from tests.test_deepspeed import ds_ready  # noqa: F401 - fixture: DeepSpeed's CPU op built
from tests.test_flightrec_units import hung_job, report

# (framework, module blocked in, phase) -> the (unit, phase) the report must name
CASES = {
    "fsdp1-forward": ("fsdp1-full", "blocks.1._fsdp_wrapped_module", "forward",
                      ("blocks.1", "forward")),
    "fsdp1-backward": ("fsdp1-full", "blocks.1._fsdp_wrapped_module", "backward",
                       ("blocks.1", "backward")),
    "zero1-backward": ("zero1", "module.blocks.1", "backward", ("(model)", "backward")),
    "zero1-optimizer": ("zero1", "module.blocks.1", "optimizer", ("(model)", "optimizer")),
    "deepspeed3-forward": ("deepspeed-3", "blocks.1", "forward", ("blocks.1", "forward")),
    "deepspeed3-backward": ("deepspeed-3", "blocks.1", "backward", ("blocks.1", "backward")),
}


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("case", list(CASES))
def test_dumps_and_runlog_name_the_stopped_ranks_unit_and_phase(case, tmp_path, request):
    framework, module, phase, (unit, named_phase) = CASES[case]
    if framework.startswith("deepspeed"):
        request.getfixturevalue("ds_ready")
    spec = {"hang": {"rank": 1, "module": module, "phase": phase, "at_step": 6}}
    rep, run, dumps = hung_job(tmp_path, spec, f"{module} ({phase})",
                               "tests.support.jobs.flightrec_engines", framework)
    st = rep["stopped"]
    assert (st["rank"], st["unit"], st["phase"]) == (1, unit, named_phase), (st, rep["findings"])
    assert st["confidence"] == "high" and st["process_group"] is not None, st
    f = next(x for x in rep["findings"] if x["code"] == "ZD013")
    ev = f["evidence"]
    # placed from rank 1's own step lines up to the step it stopped in
    assert ev["place"]["from_rank"] == 1 and ev["place"]["steps_past_log"] == 0, ev
    assert ev["place"]["step"] >= 6 or phase == "backward", ev
    assert f"{unit} ({named_phase})" in f["title"], f["title"]
    (w,) = ev["waiting"]
    assert w["rank"] == 0 and w["unit"] is not None, w  # the peer placed too
    # the dumps alone (no --runlog) still name the rank, and no unit
    alone = report(dumps, "--json")
    assert json.loads(alone.stdout)["stopped"]["unit"] is None, alone.stdout[-2000:]
