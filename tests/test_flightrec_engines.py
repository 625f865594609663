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
import shutil

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
    # rank 1's dump missing or empty (a rank that could not write it): placed by its own run
    # log alone, at the collective before the awaited one (its peer completed it), and said
    for how in ("missing", "empty"):
        silent = tmp_path / how
        silent.mkdir()
        shutil.copy(dumps / "nccl_trace_rank_0", silent)
        if how == "empty":
            (silent / "nccl_trace_rank_1").write_text('{"version": "2.10", "entries": []}')
        got = json.loads(report(silent, "--runlog", run, "--world-size", "2", "--json").stdout)
        g = next(x for x in got["findings"] if x["code"] == "ZD013")["evidence"]
        assert g["dump"] == {"1": how} and g["confidence"] == "medium", g
        assert (g["rank"], g["unit"], g["phase"]) == (1, unit, named_phase), g
        assert g["place"]["confidence"] == "runlog" and g["place"]["from_rank"] == 1, g
        assert g["place"]["sequence"] == ev["sequence"] - 1, g
        same = ("step", "offset", "unit", "phase", "collective")
        assert [g["place"][k] for k in same] == [ev["place"][k] for k in same], (g, ev)


class _Group:
    """A process group as the order reads it: its name and its sequence number."""

    group_name = "7"

    def __init__(self):
        self.seq = 10

    def _get_sequence_number_for_group(self):
        return self.seq


def test_order_rows_one_per_collective_a_call_issued():
    """A call noted with begin / end (DeepSpeed's coalesced all-gather, FSDP1's reduction)
    gets one row per collective it issued on its group, none when it issued none; a
    collective no wrapper saw (the user's own) has no row and moves no other offset."""
    from zerodoc.shim.collorder import CollOrder
    from zerodoc.shim.recorder import ALL_GATHER, BACKWARD, FORWARD, REDUCE_SCATTER

    class Rec:
        phase = FORWARD

    rec, g = Rec(), _Group()
    order = CollOrder(rec)
    order.issued(g, 0, ALL_GATHER)
    g.seq += 1  # 11: unit 0's all-gather
    rec.phase = BACKWARD
    token = order.begin(g, 1, REDUCE_SCATTER)
    g.seq += 3  # 12-14: one call, three collectives
    order.end(token)
    g.seq += 1  # 15: the user's own, unwrapped
    order.end(order.begin(g, 2, ALL_GATHER))  # a call that issued nothing
    token = order.begin(g, 2, ALL_GATHER)
    g.seq += 1  # 16
    order.end(token)
    got = order.take({"7": 10}, {"7": 16})
    assert got == {"7": {"n": 6, "at": [[1, 0, FORWARD, ALL_GATHER],
                                        [2, 1, BACKWARD, REDUCE_SCATTER],
                                        [3, 1, BACKWARD, REDUCE_SCATTER],
                                        [4, 1, BACKWARD, REDUCE_SCATTER],
                                        [6, 2, BACKWARD, ALL_GATHER]]}}, got
    assert order.items == []


def test_a_stale_end_of_a_collective_every_member_entered_is_no_wait():
    """DeepSpeed's start-up broadcasts on its own group (gloo: no pg_config, the group's
    members guessed from the dumps) are async and never waited on: a rank's dump may keep
    them "started" although its peer saw the newest complete, which needs every member.
    That rank waits for nobody there: the rank behind in the default group is named with
    confidence high, not as a circle (seen on a real DeepSpeed ZeRO-3 job, rank 1's dump)."""
    from zerodoc.sources.flightrec import Group, RankDump, analyse

    def dump(rank, default, ds):
        return RankDump(rank, "ok", groups={
            "0": Group(desc="default_pg", entered=default[0], completed=default[1],
                       ops={default[0]: "gloo:all_reduce"}),
            "1": Group(desc="undefined", entered=ds[0], completed=ds[1],
                       ops={ds[0]: "gloo:broadcast"})})
    v = analyse({0: dump(0, (230, 229), (52, 52)), 1: dump(1, (229, 229), (52, 48))}, [0, 1])
    assert [(s["rank"], s["sequence"]) for s in v.stopped] == [(1, 230)], v
    assert v.confidence == "high" and list(v.waiting) == [0], v


@pytest.mark.parametrize("newest_end", [4, 8, 12])
def test_a_rank_without_a_dump_is_placed_by_its_own_log_only_where_it_agrees(
        tmp_path, capsys, newest_end):
    """Rank 0's dump: group 0's collectives 1-8 complete, 9 entered and waiting; rank 1 left
    no dump. Rank 1's log, 4 collectives a step, its newest step record ending at
    `newest_end`: at 4 it entered #8 (its peer completed it): step 2, offset 4 (unit b,
    backward); at 8 it finished the step holding #8: only its step (3) is said; at 12 its
    log is past the awaited #9 (another process's): nothing placed, and the notes say why."""
    from tests.test_flightrec import stopped_of
    from tests.test_flightrec_units import ORDER, _log

    dumps = tmp_path / "dumps"
    dumps.mkdir()
    entries = [{"collective_seq_id": k, "process_group": ["0", "default_pg"],
                "profiling_name": "gloo:all_gather",
                "state": "completed" if k < 9 else "started"} for k in range(1, 10)]
    (dumps / "nccl_trace_rank_0").write_text(json.dumps({"version": "2.10",
                                                         "entries": entries}))
    run = tmp_path / "run"
    run.mkdir()
    _log(run / "rank-00001.jsonl", [(s, 4 * s) for s in range(1, newest_end // 4 + 1)], ORDER)
    rep = stopped_of(capsys, dumps, "--runlog", run, "--world-size", "2")
    ev = next(x for x in rep["findings"] if x["code"] == "ZD013")["evidence"]
    assert ev["rank"] == 1 and ev["sequence"] == 9 and ev["dump"] == {"1": "missing"}, ev
    p = ev["place"]
    if newest_end == 4:
        assert (p["step"], p["offset"], p["unit"], p["phase"], p["sequence"],
                p["confidence"]) == (2, 4, "b", "backward", 8, "runlog"), p
        assert (ev["unit"], ev["phase"]) == ("b", "backward"), ev
    elif newest_end == 8:
        assert (p["step"], p["offset"], p["unit"], p["confidence"]) == (3, None, None,
                                                                        "runlog"), p
        assert ev["unit"] is None, ev
    else:
        assert p is None, p
        assert any("past the awaited #9" in n for n in rep["log_notes"]), rep["log_notes"]


def test_order_rows_are_bounded():
    """Past MAX_ROWS collectives a step (a ZeRO-1 broadcast per parameter of a big model) a
    collective gets no row, as an unwrapped one: the list, and the record, stay bounded."""
    from zerodoc.shim.collorder import MAX_ROWS, CollOrder
    from zerodoc.shim.recorder import BROADCAST, OPTIMIZER

    class Rec:
        phase = OPTIMIZER

    g, order = _Group(), CollOrder(Rec())
    for _ in range(MAX_ROWS + 10):
        order.issued(g, 0, BROADCAST)
        g.seq += 1
    token = order.begin(g, 0, BROADCAST)
    assert token is None and len(order.items) == MAX_ROWS
    got = order.take({"7": 10}, {"7": g.seq})["7"]
    assert got["n"] == MAX_ROWS + 10 and len(got["at"]) == MAX_ROWS
    assert got["at"][-1] == [MAX_ROWS, 0, OPTIMIZER, BROADCAST]
