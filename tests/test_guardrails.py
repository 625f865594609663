"""attach()'s guardrails: the mistakes a new user makes, said clearly, never a corrupt run log.

In-process on one rank (no process group: the shim reads RANK / LOCAL_RANK from the
environment), plus a subprocess where the behaviour is at interpreter exit. The multi-rank
versions of the same mistakes run in tests/test_newuser.py.
"""

from __future__ import annotations

import copy
import json
import logging
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from tests.support.helpers import ROOT, job_command, job_env
import zerodoc
from zerodoc.runlog import read_rank_log
from zerodoc.exporter.targets import run_targets


def _train(model, opt, steps: int) -> None:
    for _ in range(steps):
        model(torch.randn(4, model.in_features)).sum().backward()
        opt.step()
        opt.zero_grad()


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


@pytest.fixture
def rank0(monkeypatch):
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "ZERODOC_RUN_DIR",
              "ZERODOC_PORT", "ZERODOC_DISABLE", "ZERODOC_FILE_SD_DIR"):
        monkeypatch.delenv(k, raising=False)


# --- bad arguments raise (README: "Bad arguments to attach() ... do raise") ------------------

def test_bad_arguments_raise_naming_the_mistake(rank0, tmp_path):
    model = nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cases = [
        ((opt, model), {}, "arguments are swapped"),
        ((None,), {}, "model is None"),
        ((opt,), {}, "first argument is an optimizer"),
        (("model",), {}, "must be a torch.nn.Module"),
        ((model, model), {}, "optimizer is a module"),
        ((model, 3), {}, "must have a step"),
        ((model, opt), {"run_dir": 123}, "run_dir must be a path"),
        ((model, opt), {"memory_every": "x"}, "memory_every must be an int"),
        ((model, opt), {"memory_every": True}, "memory_every must be an int"),
        ((model, opt), {"port": "9730"}, "port must be an int"),
        ((model, opt), {"host": None}, "host must be"),
        ((model, opt), {"nvml": "yes"}, "nvml must be True or False"),
        ((model, opt), {"run_log": 1}, "run_log must be True or False"),
        ((model, opt), {"inject_latency_s": "1"}, "inject_latency_s must be a number"),
    ]
    for args, kw, words in cases:
        with pytest.raises(TypeError, match=words):
            zerodoc.attach(*args, **{"port": False, "run_dir": str(tmp_path / "r"), **kw})
    for kw, words in (({"memory_every": 0}, "memory_every must be >= 1"),
                      ({"port": 70000}, "port 70000 is not in 0..65535"),
                      ({"inject_latency_s": float("nan")}, "inject_latency_s must be a finite")):
        with pytest.raises(ValueError, match=words):
            zerodoc.attach(model, opt, run_dir=str(tmp_path / "r"), **kw)
    assert not (tmp_path / "r").exists()  # nothing was attached, nothing written


# --- one monitor per process ---------------------------------------------------------------

def test_attaching_twice_never_double_writes(rank0, tmp_path):
    """Bug 1: a second attach() of the same model wrote a second header and every step twice
    into the same rank log (12 steps counted for a 6-step run)."""
    model = nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    run = tmp_path / "twice"
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        first = zerodoc.attach(model, opt, run_dir=str(run), port=False)
        again = zerodoc.attach(model, opt, run_dir=str(run), port=False)
        other = zerodoc.attach(nn.Linear(2, 2), run_dir=str(run), port=False)
    try:
        assert again is first  # reuse, said once
        assert any("already attached" in str(x.message) for x in w)
        assert other is not first and other.run_dir is None  # refused: a no-op monitor
        assert any("one monitor per process" in str(x.message) for x in w)
        other.step()
        _train(model, opt, 6)
    finally:
        first.close()
        other.close()
    lines = _lines(run / "rank-00000.jsonl")
    assert [x["type"] for x in lines].count("header") == 1
    assert [x["step"] for x in lines if x["type"] == "step"] == [1, 2, 3, 4, 5, 6]
    assert read_rank_log(run / "rank-00000.jsonl").ended
    # closed: attaching again is allowed (and in a new run directory writes a fresh log)
    with pytest.warns(UserWarning, match="no sharded units"):
        third = zerodoc.attach(model, opt, run_dir=str(tmp_path / "after"), port=False)
    assert third is not first
    third.close()


# --- what was found, and what is wrong -------------------------------------------------------

def test_startup_line_and_no_units_hint_on_rank_0_only(rank0, tmp_path, capfd, monkeypatch):
    model = nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        mon = zerodoc.attach(model, opt, run_dir=str(tmp_path / "s"), port=0)
    mon.close()
    err = capfd.readouterr().err
    line = next(x for x in err.splitlines() if x.startswith("zerodoc: attached"))
    assert "rank 0 of 1" in line and "no sharded units" in line
    assert f"run log {tmp_path / 's'}" in line and f"http://{mon.endpoint}/metrics" in line
    msgs = [str(x.message) for x in w]
    assert any("no sharded units" in m and "after fully_shard(...) / FSDP(...) / "
               "deepspeed.initialize(...)" in m for m in msgs), msgs
    head = read_rank_log(tmp_path / "s" / "rank-00000.jsonl").facts
    assert [p["kind"] for p in head.config["attach_warnings"]] == ["no-sharded-units"]

    monkeypatch.setenv("RANK", "1")  # another rank of the same job: silent
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        mon = zerodoc.attach(model, opt, run_dir=str(tmp_path / "s1"), port=False)
    mon.close()
    assert not [x for x in w if "zerodoc" in str(x.message)]
    assert "zerodoc: attached" not in capfd.readouterr().err


@pytest.mark.slow
def test_optimizer_holding_none_of_the_models_parameters_is_said(rank0, tmp_path):
    """An optimizer built before fully_shard / FSDP holds the replaced parameters: the model
    is not trained. Here the same situation without a process group: an optimizer over a
    copy of the model."""
    model = nn.Linear(4, 4)
    stale = torch.optim.SGD(copy.deepcopy(model).parameters(), lr=0.1)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        mon = zerodoc.attach(model, stale, run_dir=str(tmp_path / "o"), port=False)
    before = [p.detach().clone() for p in model.parameters()]
    _train(model, stale, 2)
    mon.close()
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # really
    assert any("holds none of the model's 2 trainable parameters" in str(x.message)
               for x in w)
    out = subprocess.run([sys.executable, "-m", "zerodoc", "report", str(tmp_path / "o"),
                          "--fail-on", "critical"], capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "holds none of the model's" in out.stdout and "NO DATA" in out.stdout


# --- a run directory that cannot be written is the user's configuration -------------------

def test_unwritable_run_dir_is_one_config_warning_not_an_error(rank0, tmp_path, caplog,
                                                              monkeypatch):
    """Bug 7: every rank printed "error in file_sd (counted ...)" and it counted toward the
    internal-errors alert."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    run = blocker / "run"  # under a regular file: cannot be created, even as root
    model = nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    caplog.set_level(logging.WARNING, logger="zerodoc")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        mon = zerodoc.attach(model, opt, run_dir=str(run), port=0)
    _train(model, opt, 2)
    mon.close()
    ours = [str(x.message) for x in w if "cannot write" in str(x.message)]
    assert len(ours) == 1 and "ZERODOC_RUN_DIR" in ours[0] and str(run) in ours[0], ours
    assert mon.registry.errors == {}  # zerodoc_errors_total stays 0
    assert "error in" not in caplog.text
    assert mon.endpoint  # the exporter still works

    monkeypatch.setenv("RANK", "1")  # a second rank on the same node: no second warning
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        mon = zerodoc.attach(model, opt, run_dir=str(run), port=0)
    mon.close()
    assert not [x for x in w if "cannot write" in str(x.message)]
    assert mon.registry.errors == {}


# --- interpreter exit without close() --------------------------------------------------------

@pytest.mark.slow
def test_exit_without_close(rank0, tmp_path):
    """Bug 6: a job that forgets close() left its log without an end and its file_sd target
    behind forever. Now a normal exit ends both; a crash (uncaught exception) still leaves
    the rank visibly dead (no end, target kept: its `up` goes to 0)."""
    procs = {how: subprocess.Popen(job_command("exit_without_close", tmp_path / how, how),
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   cwd=ROOT, env=job_env())
             for how in ("exit", "crash")}  # both at once: half the wall time
    outs = {how: p.communicate(timeout=180) for how, p in procs.items()}
    for how, p in procs.items():
        run = tmp_path / how
        assert p.returncode == (0 if how == "exit" else 1), outs[how][1]
        log = read_rank_log(run / "rank-00000.jsonl")
        targets = list((run / "file_sd").glob("*.json"))
        assert [s.step for s in log.steps] == [1, 2, 3]
        if how == "exit":
            assert log.ended and targets == []
            assert run_targets(run)[0] == []  # `zerodoc targets` lists no live rank
        else:
            assert not log.ended and len(targets) == 1
            assert "the job crashed" in outs[how][1]
            # the watchdog's record of where the uncaught exception ended the rank
            failed = [e for e in log.events if e.get("type") == "stall"]
            assert failed and failed[-1]["state"] == "failed", log.events
            assert "RuntimeError: the job crashed" in failed[-1]["error"]
