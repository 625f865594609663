"""Fault rows of issue 32 for stopped runs (`bench/chaos.py --only faults`).

    rows(tmp) -> [{"fault", "said", "slowdown", "lost", "note"}]

Real jobs on the default detail (per-unit hooks on sampled steps only), gloo:
- SIGTERM to rank 1 of 2 (a preemption; FSDP2 with prefetch, whose all-gather waits have no
  torch.distributed frame): who `zerodoc report` names first, and how;
- a layer of `blocks.1` raising in forward on rank 1, on a step without per-unit detail:
  where the failure and the waiting peer are placed;
- Ctrl-C (SIGINT to the process) in the README's own loop, one rank: the run log's end.
said: ZD013's title (or the end record). slowdown: None (the faults end the job; the
handler's cost outside a signal is none: it is not on the step path). lost: end records the
stopped ranks should have written and did not (a SIGKILLed rank's missing end is the
expected loss, not counted here: nothing runs there).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path


def _lines(run: Path, rank: int) -> list[dict]:
    p = run / f"rank-{rank:05d}.jsonl"
    out = []
    for line in (p.read_text().splitlines() if p.exists() else ()):
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return out


def _top(run: Path) -> dict:
    out = subprocess.run([sys.executable, "-m", "zerodoc", "report", str(run), "--json"],
                         capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        return {"title": f"report failed: {out.stderr.strip()[-200:]}", "evidence": {}}
    found = json.loads(out.stdout)["findings"]
    return found[0] if found else {"title": "no finding", "evidence": {}}


def _where(rec: dict) -> str:
    coll = rec.get("collective") or rec.get("in")
    return f"{rec.get('state')} in {coll} of {rec.get('unit')} ({rec.get('phase')})"


def _stall(run: Path, rank: int) -> dict:
    recs = [x for x in _lines(run, rank) if x.get("type") == "stall"]
    return recs[-1] if recs else {}


def preempted(tmp: Path) -> dict:
    from tests.support.helpers import wait_until
    from tests.support.jobs import stops

    run = tmp / "preempted"
    job = stops.launch(run, model={"prefetch": True})
    try:
        wait_until(lambda: sum(r.get("type") == "step" for r in _lines(run, 1)) >= 5, 120,
                   "rank 1's 5th step", interval=0.2)
        os.kill(job.procs[1].pid, signal.SIGTERM)
        codes = job.wait(60)
    finally:
        job.stop(grace=1)
    ends = [x for x in _lines(run, 1) if x.get("type") == "end"]
    top = _top(run)
    return {"fault": "SIGTERM to rank 1 of 2 (default detail, FSDP2 prefetch)",
            "said": top["title"][:200], "slowdown": None,
            "lost": 0 if ends and ends[-1].get("terminated") else 1,
            "note": f"exit codes {codes}; rank 0 {_where(_stall(run, 0))}; named rank "
                    f"{top['evidence'].get('rank')} ({top['evidence'].get('state')})"}


def raised(tmp: Path) -> dict:
    from tests.support.jobs import stops

    run = tmp / "raised"
    job = stops.launch(run, model={"prefetch": True},
                       **{"raise": {"rank": 1, "module": "blocks.1.fc1", "at_step": 5}})
    try:
        codes = job.wait(120)
    finally:
        job.stop(grace=1)
    top = _top(run)
    own = _stall(run, 1)
    wrapped = any("/zerodoc/shim/" in s for s in own.get("stack", ()))
    return {"fault": "raise in blocks.1's forward, rank 1, a step without detail",
            "said": top["title"][:200], "slowdown": None, "lost": None,
            "note": f"exit codes {codes}; rank 1 {_where(own)} at step {own.get('step')}"
                    f"{' (a zerodoc wrapper on the stack!)' if wrapped else ''}; rank 0 "
                    f"{_where(_stall(run, 0))}"}


def ctrl_c(tmp: Path) -> dict:
    from tests.support.jobs.signalled import finish, start

    proc, run, _ = start(tmp / "ctrl-c", "readme")
    proc.send_signal(signal.SIGINT)
    code, _out = finish(proc)
    ends = [x for x in _lines(run, 0) if x.get("type") == "end"]
    end = ends[-1] if ends else None
    said = (f"end record {json.dumps({k: v for k, v in end.items() if k != 'end_unix'})}"
            if end else "no end record")
    return {"fault": "Ctrl-C in the README's loop (1 rank, SIGINT)", "said": said,
            "slowdown": None, "lost": 0 if end and end.get("interrupted") else 1,
            "note": f"exit code {code}"}


def rows(tmp: Path) -> list[dict]:
    out = []
    for fn in (preempted, raised, ctrl_c):
        d = tmp / fn.__name__
        d.mkdir(parents=True, exist_ok=True)
        try:
            out.append(fn(d))
        except Exception as e:  # noqa: BLE001 - a row that says so
            out.append({"fault": fn.__name__, "said": f"not run: {type(e).__name__}: {e}"[:200],
                        "slowdown": None, "lost": None, "note": ""})
    return out


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        for r in rows(Path(d)):
            print(json.dumps(r))
