"""The run log's bytes per step per rank, measured through the real writer with every row a
real run writes (issue 33's budget: <= 1 KiB; bench/scale.py prints it, tests/test_runlog.py
checks it).

`synthetic.step_record` holds the compute and collective rows; a real run's step record
also holds the framework's time per unit and phase (`framework`), the step's collective
calls and bytes (`coll`), the K in force (`detail_k`) and the process group's sequence
number at the step's end (`seq`, issue 34: 8 digits, a run some 40,000 steps in), and a step
outside the sample is a lean record (`writer.lean_record`: step-level numbers, per-unit ones
null). `full_record` adds those, and `measure` the one `collorder` record a run with a
repeating schedule writes (zerodoc/shim/collorder.py, after its first detail step with
collectives), so the writer writes every line kind a real rank-1 log holds: step lines,
interval and total lines with their framework columns, the end record.
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

from ..runlog.replay import Replay
from ..runlog.writer import RunLogWriter, lean_record
from . import synthetic


SEQ_BASE = 10_000_000  # the group's sequence number before the first step measured


def order_record(rec: dict, units: int) -> dict:
    """The `collorder` record of a detail step's collectives (each comm row's calls in turn:
    a real run's order differs, its size does not)."""
    from ..catalog import COLLECTIVES, PHASES
    from ..shim.collorder import record

    rows, off = [], 0
    for u, ph, c, n, *_ in rec["comm"]:
        for _ in range(n):
            off += 1
            rows.append([off, u, PHASES.index(ph), COLLECTIVES.index(c)])
    return record(rec["step"], ["0"], {"0": {"n": off, "at": rows}},
                  [u.name for u in synthetic.rank_facts(1, 1024, units).units])


def full_record(step: int, units: int, end_unix: float, k: int = 1) -> dict:
    """A step record shaped as the shim hands it over: detail on steps 1, 2 and every K-th
    (K = 1: every step, the largest step lines), framework rows on detail steps."""
    rec = synthetic.step_record(step, 1, 1024, units, end_unix)[0]
    coll: dict[str, list[int]] = {}
    for _u, _ph, c, n, b, *_ in rec["comm"]:
        a = coll.setdefault(c, [0, 0])
        a[0] += n
        a[1] += b
    rec["coll"] = coll
    rec["detail_k"] = k
    rec["seq"] = [SEQ_BASE + step * sum(n for n, _ in coll.values())]
    if step > 2 and step % k:
        return lean_record((step, end_unix, rec["step_s"], rec["optimizer_s"], rec["self_s"],
                            rec["mem"], coll, None, None, k, rec["seq"]))
    wobble = 1.0 + 0.05 * math.sin(step * 1.3)
    rec["framework"] = [[u, ph, (0.0004 if ph == "forward" else 0.0007) * wobble * (1 + u % 7)]
                        for u in range(units) for ph in ("forward", "backward")]
    rec["framework_s"] = sum(r[2] for r in rec["framework"]) + 0.002
    rec["detail"] = True
    return rec


def measure(units: int = 81, steps: int = 240, k: int = 1,
            run_dir: Path | None = None) -> dict:
    """Write `steps` steps of one rank (the writer's defaults: an interval line every 100
    steps, a total line every 10 intervals and at the close) and measure its log: bytes per
    step with the header left out (as issue 33 measured a real demo's rank-1 log), the
    header, and the bytes by line type."""
    import json

    tmp = None
    if run_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="zerodoc-bytes-")
        run_dir = Path(tmp.name)
    try:
        facts = synthetic.rank_facts(1, 1024, units)
        rep = Replay(RunLogWriter(run_dir, 1, queue_size=1 << 16), facts)
        t = 1.7e9
        for s in range(1, steps + 1):
            rec = full_record(s, units, t, k)
            if s == 2:  # the first detail step past warm-up: the order, once
                rep.writer.write(order_record(rec, units))
            t += rec["step_s"]
            rec["end_unix"] = t
            rep.step(rec)
        rep.writer.flush(600)
        rep.writer.close(steps, rep.totals, timeout=600)
        data = (run_dir / "rank-00001.jsonl").read_bytes()
        lines = data.split(b"\n")[:-1]
        by_type: dict[str, list[int]] = {}
        for line in lines:
            by_type.setdefault(json.loads(line)["type"], []).append(len(line) + 1)
        header = by_type.pop("header")[0]
        return {"units": units, "steps": steps, "k": k, "header_bytes": header,
                "bytes_per_step": (len(data) - header) / steps,
                "lines": {t: {"n": len(v), "bytes": sum(v), "max": max(v)}
                          for t, v in by_type.items()}}
    finally:
        if tmp is not None:
            tmp.cleanup()
