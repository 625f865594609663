"""How ZD013 and the watchdog's frame placement read what a stopped rank left (issue 32, item
4), on their own: run snapshots built from records of the shapes the real runs write
(tests/test_stopped.py and tests/test_signals.py run the real jobs), and the framework
functions the placement matches, looked up in the installed torch / DeepSpeed."""

from __future__ import annotations

from zerodoc.diagnosis import diagnose
from zerodoc.shim import hookpoints
from zerodoc.testing.rulecases import snapshot_from_dict


def _snap(stalls: dict, ended: list[int], ranks: int = 2) -> object:
    return snapshot_from_dict({"units": [{"name": "(root)", "params": 1000},
                                         {"name": "blocks.0", "params": 1000}],
                               "ranks": [{"steps": 6, "updated_unix": 40.0}] * ranks,
                               "ended_ranks": ended, "stalls": stalls})


TERM = {"type": "stall", "state": "terminated", "signal": "SIGTERM", "step": 7,
        "since_unix": 50.0, "in": "compute", "unit": "blocks.0", "phase": "forward",
        "collective": "", "stack": ["train.py:10 main"]}
WAITING = {"type": "stall", "state": "failed", "step": 7, "since_unix": 50.5,
           "in": "collective", "unit": "blocks.0", "phase": "backward",
           "collective": "all_gather", "error": "RuntimeError: Connection reset by peer",
           "stack": ["x.py:1 wait_for_unshard"]}


def test_a_terminated_rank_is_named_first_as_terminated():
    """Rank 1 recorded a SIGTERM and closed ("terminated" record, clean end); rank 0 failed
    in a collective after it: rank 1 stopped first, terminated, rank 0 waited."""
    f = diagnose(_snap({"0": WAITING, "1": TERM}, ended=[1]))[0]
    assert f.code == "ZD013" and f.severity.name == "CRITICAL"
    assert (f.evidence["rank"], f.evidence["state"], f.evidence["signal"]) == \
        (1, "terminated", "SIGTERM")
    assert f.evidence["waiting_ranks"] == [0]
    assert f.title.startswith("rank 1 stopped first: terminated by SIGTERM in blocks.0")
    assert "killed" not in f.title and "crashed" not in f.title


def test_a_terminated_rank_whose_end_was_lost_is_still_terminated():
    """The handler's end record did not make it (its write timed out): the "terminated"
    record still says what happened, not "(killed, crashed, or hung)"."""
    f = diagnose(_snap({"0": WAITING, "1": TERM}, ended=[]))[0]
    assert f.evidence["rank"] == 1 and f.evidence["state"] == "terminated", f.evidence
    assert "crashed" not in f.title


def test_a_whole_job_terminated_is_said_once_as_info():
    """Every rank recorded the SIGTERM and closed: the job was stopped from outside (INFO),
    not "nothing to say" and not a crash."""
    f = [x for x in diagnose(_snap({"0": TERM, "1": {**TERM, "since_unix": 50.2}},
                                   ended=[0, 1])) if x.code == "ZD013"]
    assert len(f) == 1 and f[0].severity.name == "INFO", f
    assert f[0].evidence["whole_job"] and f[0].evidence["rank"] is None
    assert "whole job was terminated by SIGTERM after step 6" in f[0].title


def test_every_stack_point_exists_in_the_installed_releases(monkeypatch):
    """The framework functions the placement matches by name (hookpoints.STACK_POINTS) are
    all in the installed torch (and DeepSpeed, where installed), and a renamed one is
    reported, not silently never matched."""
    assert hookpoints.stack_points_missing() == []
    gone = ("torch.distributed.fsdp._fully_shard._fsdp_param_group",
            "FSDPParamGroup.wait_for_unshard_renamed")
    monkeypatch.setitem(hookpoints.STACK_POINTS, gone, ("all_gather", ""))
    assert hookpoints.stack_points_missing() == [": ".join(gone)]


def test_a_rank_stopped_between_the_units_work_is_said_so():
    """A terminated (or failed) rank with no unit, phase or collective (a step without
    detail, the thread in the user's own code): ZD013 says it was outside the units' work,
    not "(outside the sharded units) (optimizer ...)" from a stale phase."""
    between = {**TERM, "in": "outside units", "unit": None, "phase": None}
    f = diagnose(_snap({"0": WAITING, "1": between}, ended=[1]))[0]
    assert f.evidence["rank"] == 1 and "(optimizer, " not in f.title, f.title
    assert "terminated by SIGTERM in code outside the sharded units, not in their forward " \
           "or backward nor the optimizer" in f.title, f.title
