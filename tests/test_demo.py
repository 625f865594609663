"""`zerodoc demo` as a user runs it: the README command, flags, Ctrl-C, bad flags."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from tests.support.helpers import pids_gone, wait_until


def zerodoc(*args, timeout=240, **kw):
    return subprocess.run([sys.executable, "-m", "zerodoc", *args], capture_output=True,
                          text=True, timeout=timeout, **kw)


def test_headless_demo_prints_a_summary_per_step(tmp_path):
    out = zerodoc("demo", "--headless", "--steps", "4", "--port", "0",
                  "--run-dir", str(tmp_path / "run"))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    steps = [l for l in lines if l.startswith("step ")]
    assert [int(l.split()[1]) for l in steps] == [1, 2, 3, 4]
    assert all("comm/compute" in l and "exposed comm" in l for l in steps)
    tops = [l.split("top exposed all-gathers: ")[1] for l in lines if "top exposed" in l]
    assert len(tops) == 4
    for top in tops:  # "unit phase N ms", the phase in full (not "bac")
        phases = {e.split()[1] for e in top.split(", ")}
        assert phases <= {"forward", "backward"} and phases, top
    assert "metrics (rank: host:port): 0: 127.0.0.1:" in out.stdout
    assert "Traceback" not in out.stderr and "terminate called" not in out.stderr
    assert sorted(p.name for p in (tmp_path / "run").glob("rank-*.jsonl")) == \
        ["rank-00000.jsonl", "rank-00001.jsonl"]


def test_headless_demo_with_sampling_never_shows_zeros_for_unsampled_steps(tmp_path):
    """With per-unit detail on 1 step in 4 ($ZERODOC_DETAIL), a step without it shows the
    latest sampled step's per-unit numbers, naming that step (they equal that step's own
    line), or says that none was measured yet: never "compute 0.0 ms"."""
    import re

    env = dict(os.environ, ZERODOC_DETAIL="4")
    out = zerodoc("demo", "--headless", "--steps", "12", "--no-metrics",
                  "--run-dir", str(tmp_path / "run"), env=env)
    assert out.returncode == 0, out.stderr
    lines = [l for l in out.stdout.splitlines() if l.startswith("step ")]
    assert [int(l.split()[1]) for l in lines] == list(range(1, 13))
    recs = [json.loads(l) for l in (tmp_path / "run" / "rank-00000.jsonl").read_text()
            .splitlines()]
    detail = {r["step"]: r.get("detail", True) for r in recs if r.get("type") == "step"}
    sampled = [s for s, d in sorted(detail.items()) if d]
    assert sampled and len(sampled) < 12, detail  # some steps sampled, not all
    own = {}
    for line in lines:
        step = int(line.split()[1])
        assert "compute     0.0 ms" not in line, line
        per_unit = re.search(r"compute +([\d.]+) ms \| exposed comm +([\d.]+) ms", line)
        if step in sampled:
            assert per_unit and "[sampled step" not in line, line
            own[step] = per_unit.groups()
            continue
        before = [s for s in sampled if s < step]
        if not before:
            assert "per-unit detail: not measured yet (1 step in 4)" in line, line
            continue
        assert f"[sampled step {before[-1]}; per-unit detail on 1 step in 4]" in line, line
        assert per_unit.groups() == own[before[-1]], (line, own)


@pytest.mark.parametrize("args,msg", [
    (["--ranks", "0"], "--ranks"),
    (["--steps", "-1"], "--steps"),
    (["--ranks", "3", "--hsdp-replicas", "2"], "multiple"),
    (["--wrap", "nonsense"], "invalid choice"),
    (["--framework", "horovod"], "invalid choice"),
])
def test_bad_flags_give_one_line_errors(args, msg):
    out = zerodoc("demo", "--headless", *args, timeout=60)
    assert out.returncode == 2
    assert msg in out.stderr and "Traceback" not in out.stderr


def test_ctrl_c_stops_cleanly_leaving_no_process(tmp_path):
    """Ctrl-C on `--steps 0` (run until interrupted): no rank left, every run log ends with
    a clean "interrupted" end, no file_sd target stays behind (so Prometheus's
    ZerodocRunDown, which keys on targets without a clean close, stays quiet), and `zerodoc
    report` calls the run stopped by the user, not RUN STOPPED / ZD013."""
    env = {k: v for k, v in os.environ.items() if k != "ZERODOC_FILE_SD_DIR"}
    proc = subprocess.Popen([sys.executable, "-m", "zerodoc", "demo", "--headless",
                             "--steps", "0", "--port", "0", "--run-dir", str(tmp_path / "r")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        def stepping():  # both ranks' run logs with their first steps
            logs = list((tmp_path / "r").glob("rank-*.jsonl"))
            return len(logs) == 2 and all(p.read_text().count('"type":"step"') >= 2
                                          for p in logs) and logs

        logs = wait_until(stepping, 180, "the demo to start stepping", interval=0.3)
        pids = [int(l.split('"pid":')[1].split(",")[0])
                for p in logs for l in p.read_text().splitlines()[:1]]
        targets = tmp_path / "r" / "file_sd"
        assert sorted(t.name for t in targets.iterdir()) == ["rank-00000.json",
                                                              "rank-00001.json"]
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130
    assert "interrupted" in out
    assert "Traceback" not in err and "terminate called" not in err
    wait_until(lambda: pids_gone(pids), 5, f"every rank {pids} to exit (no rank left behind)")
    assert "every rank stopped and closed its run log cleanly" in out, out
    for log in logs:
        last = json.loads(log.read_text().splitlines()[-1])
        assert last["type"] == "end" and last.get("interrupted") is True, (log, last)
        assert "failed" not in last
    assert list(targets.iterdir()) == []
    rep = zerodoc("report", str(tmp_path / "r"), timeout=120)
    assert rep.returncode == 0, rep.stderr
    assert "run stopped by the user (Ctrl-C) after step" in rep.stdout, rep.stdout
    assert "RUN STOPPED" not in rep.stdout and "ZD013" not in rep.stdout, rep.stdout
    js = json.loads(zerodoc("report", str(tmp_path / "r"), "--json", timeout=120).stdout)
    assert js["ended_ranks"] == js["interrupted_ranks"] == [0, 1] and js["stopped"] is None
