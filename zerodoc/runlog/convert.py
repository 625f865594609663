"""Rewrite a schema-1 run directory in the current schema (3), through the real writer.

    python -m zerodoc.cli.convert SRC_RUN_DIR DST_RUN_DIR [--every N]

Each rank's step records are replayed (`zerodoc.runlog.replay.Replay`): the per-step
totals, interval and total lines and the detail files are what the shim would have written
for those steps; nothing is recomputed by hand. A log with a clean end gets one; a log
without one (a killed job) does not. Used to regenerate tests/data/scenarios.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import UserError
from .reader import rank_logs
from .records import check_header, facts_from_dict
from .replay import Replay
from .writer import RunLogWriter


def convert_log(src: Path, dst_dir: Path, every: int) -> int:
    """Convert one schema-1 rank log; returns the number of steps written."""
    lines = [x for x in src.read_text(encoding="utf-8").splitlines() if x.strip()]
    head = check_header(json.loads(lines[0]), str(src))
    if head.get("schema") != 1:
        raise UserError(f"{src}: schema {head.get('schema')}, not a schema-1 log")
    facts = facts_from_dict(head)
    writer = RunLogWriter(dst_dir, facts.rank, every_steps=every)
    rep = Replay(writer, facts)
    ended = False
    n = 0
    for raw in lines[1:]:
        try:
            rec = json.loads(raw)
        except json.JSONDecodeError:
            continue  # a torn line: a schema-1 reader skipped it too
        if rec.get("type") == "step":
            rep.step(rec)
            n += 1
        elif rec.get("type") == "end":
            ended = True
        elif rec.get("type") != "header":
            writer.write(rec)
    rep.close(end=ended)
    return n
