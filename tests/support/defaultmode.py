"""What a run recorded in the default mode (per-unit detail on sampled steps) holds, read from
its run logs line by line here, not through zerodoc's readers: the independent side of
tests/test_default_mode.py (live runs) and tests/test_default_recorded.py (recorded ones).

`launch` starts a user's script as torchrun does (one process per rank with RANK /
LOCAL_RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT), with zerodoc's defaults: every
ZERODOC_* variable of the caller removed, only the run directory and a free port set.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from tests.support.helpers import ROOT

GLOO_EXIT_ABORT = -6  # SIGABRT in gloo's teardown after a clean end (tests/test_newuser.py)
ALL_CLEAR = "nothing the rules know of is wrong"
MIN_WINDOW_SAMPLES = 3  # the rule: fewer in the window, the newest 3 before it


def launch(script: Path, run_dir: Path, ranks: int, *args: str, env: dict | None = None,
           timeout: float = 600) -> list[tuple[int, str]]:
    """`script` on `ranks` local processes; returns (exit code, stderr) per rank, each
    checked: 0, or gloo's teardown abort after a clean end."""
    from zerodoc.demo.launch import _die_with_parent, free_port

    base = {k: v for k, v in os.environ.items() if not k.startswith("ZERODOC_")}
    base.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(ranks),
                LOCAL_WORLD_SIZE=str(ranks), OMP_NUM_THREADS="1", ZERODOC_RUN_DIR=str(run_dir),
                ZERODOC_PORT="0", PYTHONUNBUFFERED="1", **(env or {}))
    base["PYTHONPATH"] = os.pathsep.join([str(ROOT), base.get("PYTHONPATH", "")])
    procs = [subprocess.Popen([sys.executable, str(script), *args],
                              env=dict(base, RANK=str(r), LOCAL_RANK=str(r)),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              start_new_session=True, preexec_fn=_die_with_parent)
             for r in range(ranks)]
    try:
        errs = [p.communicate(timeout=timeout)[1] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    out = [(p.returncode, e) for p, e in zip(procs, errs)]
    for code, err in out:
        assert code == 0 or (code == GLOO_EXIT_ABORT and "Traceback" not in err), err[-3000:]
    return out


def records(run_dir: Path, rank: int) -> list[dict]:
    path = Path(run_dir) / f"rank-{rank:05d}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def header(run_dir: Path, rank: int) -> dict:
    return next(r for r in records(run_dir, rank) if r.get("type") == "header")


def steps(run_dir: Path, rank: int) -> dict[int, dict]:
    """The rank's step records by step number."""
    return {r["step"]: r for r in records(run_dir, rank) if r.get("type") == "step"}


def sampled_steps(run_dir: Path, rank: int) -> list[int]:
    return sorted(s for s, r in steps(run_dir, rank).items() if r.get("detail"))


def ranks(run_dir: Path) -> list[int]:
    return sorted(int(p.stem.split("-")[1]) for p in Path(run_dir).glob("rank-*.jsonl"))


def median_step_s(run_dir: Path, rank: int) -> float:
    return statistics.median(r["step_s"] for s, r in steps(run_dir, rank).items() if s > 1)


def per_unit_steps(run_dir: Path, rank: int, first: int, last: int) -> list[int]:
    """The sampled steps a window [first, last] takes its per-unit numbers from, by the
    issue's rule: its own (step 1, the warm-up, never), or where it holds fewer than 3, the
    newest 3 up to its end."""
    mine = [s for s in sampled_steps(run_dir, rank) if s >= 2 and s <= last]
    inside = [s for s in mine if s >= first]
    return inside if len(inside) >= MIN_WINDOW_SAMPLES else mine[-MIN_WINDOW_SAMPLES:]


def check_no_all_clear_without_a_sample(run_dir: Path, rep: dict, text: str,
                                        window: int) -> str:
    """A report (its --json `rep` and its `text`) over the last `window` steps never says
    'nothing wrong' where a rank's window holds no sampled step of its own: it names the rules
    not evaluated, or takes the newest samples from before the window and names their steps.
    Returns which of the three held ('sampled', 'not evaluated', 'named')."""
    rs = ranks(run_dir)
    last = min(max(steps(run_dir, r)) for r in rs)
    first = max(2, last - window + 1)
    inside = {r: [s for s in sampled_steps(run_dir, r) if first <= s <= last] for r in rs}
    if all(inside.values()):
        return "sampled"  # every rank sampled inside the window: an all-clear may stand
    assert ALL_CLEAR not in text, text
    per_unit = rep["window"]["per_unit"]
    if rep["waiting"]:  # not evaluated: the rules are named, in the text too
        assert rep["waiting"]["rules"] and "not evaluated" in text, text
        return "not evaluated"
    fewest = min(rs, key=lambda r: len(inside[r]))
    newest = per_unit_steps(run_dir, fewest, first, last)
    assert per_unit["before_window"] > 0, per_unit
    for s in newest:
        assert str(s) in per_unit["text"], (newest, per_unit["text"])
    assert per_unit["text"] in text
    return "named"
