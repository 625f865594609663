"""Shared helpers for tests: run real multi-process demo jobs and read their run logs."""

from __future__ import annotations

import statistics
from pathlib import Path

from zerodoc.demo.launch import Job
from zerodoc.runlog import RankLog, read_rank_log

# Small but real: 4 transformer blocks, steps of ~0.1-0.3 s on 2 CPU cores.
SMALL_MODEL = {"blocks": 4, "hidden": 256, "heads": 4, "vocab": 1024, "seq": 128, "batch": 4}


def run_demo(tmp: Path, name: str, *, nprocs: int = 2, steps: int = 8, model: dict | None = None,
             attach: dict | None = None, timeout: float = 240.0, env: dict | None = None,
             extra: dict | None = None) -> dict[int, RankLog]:
    """Run the demo worker on `nprocs` gloo ranks; return each rank's parsed run log."""
    run_dir = tmp / name
    spec = {"model": {**SMALL_MODEL, **(model or {})}, "steps": steps,
            "attach": {"run_dir": str(run_dir), "port": False, **(attach or {})},
            **(extra or {})}
    job = Job(nprocs, spec, env=env).start()
    try:
        codes = job.wait(timeout)
    finally:
        job.stop()
    outs = job.outputs()
    assert codes == [0] * nprocs, f"ranks exited {codes}: {outs}"
    return {r: read_rank_log(run_dir / f"rank-{r:05d}.jsonl") for r in range(nprocs)}


def per_step(log: RankLog, unit: str, phase: str, coll: str, field: str,
             skip: int = 2) -> list[float]:
    """One number per step (after `skip` warm-up steps) for a unit/phase/collective."""
    out = []
    for s in log.steps[skip:]:
        t = s.comm.get((unit, phase, coll))
        out.append(getattr(t, field) if t is not None else 0.0)
    return out


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else 0.0
