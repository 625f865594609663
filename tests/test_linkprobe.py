"""`zerodoc linkprobe`: a link profile measured on a real 2-rank gloo group, checked against a
delay injected beneath the collective it times; its bad input (docs/whatif.md, "The link
profile")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from zerodoc.cli import main as cli
from zerodoc.demo.launch import free_port
from zerodoc.whatif.linkprofile import load_profile

ROOT = Path(__file__).resolve().parent.parent
INJECT_S = 0.10  # added to every all-gather of 2 MB or more, beneath the probe
# (tests/support/jobs/slowed_linkprobe.py: one rank as torchrun starts it)


@pytest.mark.slow
def test_probe_on_a_real_gloo_group_sees_a_delay_injected_beneath_it(tmp_path):
    out = tmp_path / "profile.json"
    port = free_port()
    procs = []
    for rank in range(2):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1",
               "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "tests.support.jobs.slowed_linkprobe", str(INJECT_S),
             "2000000", "linkprobe", "--out", str(out), "--sizes",
             "0.5,1,4", "--reps", "5", "--collectives", "all_gather,reduce_scatter"],
            env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        for p in procs:
            _, err = p.communicate(timeout=120)
            assert p.returncode == 0, err[-2000:]
    finally:  # a rank left waiting in the rendezvous would hold its port for 30 minutes
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    doc = json.loads(out.read_text())
    assert doc["kind"] == "zerodoc-link-profile" and doc["backend"] == "gloo"
    assert doc["group_size"] == 2 and doc["reps"] == 5 and doc["hosts"] == 1
    prof = load_profile(str(out))
    ag, rs = prof.curves["all_gather"], prof.curves["reduce_scatter"]
    assert ag.nbytes == (500_000, 1_000_000, 4_000_000) == rs.nbytes
    assert all(r["calls"] == 5 for r in doc["collectives"]["all_gather"])
    # the injected delay shows at 4 MB only, and only in the all-gather: the 4 MB all-gather
    # costs the delay plus its own few ms (3-7 ms here; under load up to ~10, the margin is
    # 50), the 1 MB one and the reduce-scatters (4-10 ms at 4 MB) under half the delay
    assert INJECT_S <= ag.median_s[2] <= INJECT_S + 0.05, ag
    assert ag.median_s[1] < INJECT_S * 0.5 and max(rs.median_s) < INJECT_S * 0.5, (ag, rs)
    assert all(0 < t for t in ag.median_s + rs.median_s)


@pytest.mark.parametrize("args,msg", [
    ("--sizes 1,abc", "--sizes: 'abc' is not a number of MB"),
    ("--sizes 1,0", "must be in (0, 4096] MB"),
    ("--sizes 1,1", "2 or more distinct sizes"),
    ("--reps 0", "--reps must be between 5 and 10000"),
    ("--reps 4", "--reps must be between 5 and 10000"),
    ("--nprocs 1", "--nprocs must be between 2 and 1024"),
    ("--collectives all_gather,broadcast", "--collectives: unknown broadcast"),
    ("--out /nonexistent-dir/p.json", "no such directory"),
    ("--backend mpi", "invalid choice"),
    ("--out= ", "--out: give a file name"),
])
def test_probe_bad_arguments_one_line_exit_2(args, msg, capsys, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(SystemExit) if "choice" in msg else _no_raise() as e:
        rc = cli.main(["linkprobe", *args.split()])
    rc = e.value.code if "choice" in msg else rc
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and msg in err[0], err


def test_probe_nccl_without_enough_gpus_one_line_exit_2(capsys, monkeypatch):
    import torch

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli.main(["linkprobe", "--backend", "nccl"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "2 ranks need 2 GPUs, 0 found" in err[0], err


class _no_raise:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize("env,msg", [
    ({"RANK": "0", "WORLD_SIZE": "x"}, "must be integers"),
    ({"RANK": "0", "WORLD_SIZE": "1"}, "WORLD_SIZE is 1"),
])
def test_probe_under_a_broken_launcher_environment_one_line_exit_2(env, msg, capsys,
                                                                  monkeypatch):
    """Under torchrun's variables gone wrong: one line, never a traceback (review rev4 S7)."""
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert cli.main(["linkprobe", "--sizes", "1,2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and msg in err[0], err


def test_probe_sizes_that_round_to_one_size_are_refused(capsys, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    assert cli.main(["linkprobe", "--sizes", "0.000001,0.000002,1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "too close" in err[0], err
