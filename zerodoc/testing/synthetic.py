"""A deterministic synthetic run log, for the render benchmark, snapshot tests and docs.

Written through the real run-log writer (`zerodoc.runlog.replay.Replay`), so it is the
run directory a job would leave (schema 2) and every reader accepts it. A run written with
`end=False` stays open: `append_steps` continues its writers, as a live job would. The numbers follow a shape an operator would recognise: the last layers' all-gathers
are the most exposed, one rank (the straggler) computes slower, memory has some headroom.
Plain Python, no Textual.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from ..runmodel import RankFacts, UnitFacts
from ..runlog import RunLogWriter
from ..runlog.replay import Replay

GIB = 1 << 30


def unit_names(units: int) -> list[str]:
    """`(root)` then `layers.0 .. layers.N-2` (the root holds embeddings and the head)."""
    return ["(root)"] + [f"layers.{i}" for i in range(units - 1)]


def rank_facts(rank: int, world: int, units: int, *, run_id: str = "synthetic",
               started_unix: float = 1_700_000_000.0, config: dict | None = None) -> RankFacts:
    names = unit_names(units)
    ufacts = []
    for i, name in enumerate(names):
        params = 262_144_000 if i == 0 else 201_334_784  # ~7B-class layer sizes
        ufacts.append(UnitFacts(
            name=name, params=params, param_bytes=params * 4, gather_bytes=params * 2,
            sharded_bytes=params * 2 // world, reshard_after_forward=i != len(names) - 1,
            group_size=world, param_dtype="bfloat16", reduce_dtype="float32"))
    return RankFacts(
        rank=rank, local_rank=rank % 8, world_size=world, local_world_size=min(world, 8),
        node=f"node{rank // 8:02d}", run_id=run_id, framework="fsdp2",
        framework_version="2.13.0", torch_version="2.13.0", device_type="cuda",
        backend="nccl", zero_stage=3, mesh_shape=(world,), mesh_dim_names=("dp",),
        param_dtype="bfloat16", reduce_dtype="float32", units=tuple(ufacts),
        device_capacity_bytes=80 * GIB, started_unix=started_unix, pid=10_000 + rank,
        config=dict(config or {}))


def unsampled(rec: dict, k: int) -> dict:
    """The record as the shim writes a step outside the sampled ones (zerodoc.windowsamples): no
    per-unit rows, per-unit-derived sums null, collective counts and bytes per kind, and the
    K in force (every step carries it)."""
    coll: dict[str, list[int]] = {}
    for _u, _phase, kind, n, b, *_ in rec["comm"]:
        c = coll.setdefault(kind, [0, 0])
        c[0] += n
        c[1] += b
    return {**rec, "detail": False, "compute": [], "comm": [], "coll": coll,
            "compute_s": None, "exposed_s": None, "framework_s": None, "detail_k": k}


def sampled(rec: dict, k: int) -> dict:
    """The record of a sampled step: as without sampling, plus the K in force."""
    return {**rec, "detail": True, "detail_k": k}


def step_record(step: int, rank: int, world: int, units: int, end_unix: float,
                straggler: int | None = None) -> tuple[dict, float]:
    """One full step record (the shape the shim hands to the run-log writer) and its step
    seconds. Deterministic in its inputs."""
    slow = 1.3 if rank == straggler else 1.0
    wobble = 1.0 + 0.05 * math.sin(step * 0.7 + rank)  # visible in the sparklines
    compute, comm = [], []
    total_compute = total_exposed = 0.0
    for u in range(units):
        fwd = 0.004 * slow * wobble
        bwd = 2 * fwd
        compute += [[u, "forward", fwd], [u, "backward", bwd]]
        gather_bytes = (262_144_000 if u == 0 else 201_334_784) * 2
        ag_s = 0.006 * wobble
        # later layers hide less of their all-gather (prefetch falls behind)
        exposed = ag_s * min(1.0, 0.1 + 0.8 * u / max(1, units - 1)) / slow
        comm.append([u, "forward", "all_gather", 1, gather_bytes, ag_s, exposed, ag_s - exposed])
        if u != units - 1:
            comm.append([u, "backward", "all_gather", 1, gather_bytes, ag_s, exposed / 2,
                         ag_s - exposed / 2])
            total_exposed += exposed / 2
        comm.append([u, "backward", "reduce_scatter", 1, gather_bytes * 2, 0.008, 0.001, 0.007])
        total_compute += fwd + bwd
        total_exposed += exposed + 0.001
    optimizer = 0.05
    step_s = total_compute + total_exposed + optimizer + 0.02
    reserved = int((52 + 4 * (rank == straggler)) * GIB)
    rec = {
        "type": "step", "step": step, "end_unix": end_unix, "step_s": step_s,
        "optimizer_s": optimizer, "framework_s": 0.01, "other_s": 0.01, "self_s": 0.001,
        "compute_s": total_compute, "exposed_s": total_exposed, "compute": compute,
        "comm": comm,
        "mem": {"sharded_parameters": 7 * GIB // world * 2, "gradients": 7 * GIB // world * 2,
                "optimizer_state": 7 * GIB // world * 12, "device_allocated": reserved - GIB,
                "device_reserved": reserved, "capacity": 80 * GIB,
                "headroom": 80 * GIB - reserved},
        "errors": {},
    }
    return rec, step_s


# How long a synthetic rank's writer may take to write what is queued at close or flush: a
# rank queues its whole log ahead (queue_size 1 << 20), and on a loaded host (load average
# 200-400) the writer's own 5 s lost the last ~6,000 of 30,000 lines at close
# (tests/test_runlog.py's seek test). Waits end as soon as the writer is done.
WRITE_TIMEOUT = 120.0

# Open synthetic runs (end=False): append_steps continues their writers.
_OPEN: dict[Path, dict[int, Replay]] = {}
_SAMPLE: dict[Path, int | None] = {}  # their sample_every


def _sample(rec: dict, step: int, k: int | None) -> dict:
    if k is None:
        return rec
    return (sampled if step % k == 0 else unsampled)(rec, k)


def write_run(run_dir: str | os.PathLike, *, ranks: int = 64, units: int = 128,
              steps: int = 20, straggler: int | None = 3, started_unix: float = 1_700_000_000.0,
              end: bool = True, stop_rank_after: dict[int, int] | None = None,
              every_steps: int = 100, detail: bool = True,
              sample_every: int | None = None) -> Path:
    """Write a synthetic run dir; returns its path.

    `end`: close each rank cleanly (its "end" line); otherwise the run stays open for
    `append_steps`. `stop_rank_after`: {rank: steps} makes those ranks stop early without an
    end line (a hung or crashed rank). `sample_every`: K, per-unit detail on steps K, 2K, ...
    only (the others written as unsampled steps, as the shim does with sampling on).
    """
    run_dir = Path(run_dir)
    stop = stop_rank_after or {}
    replays = {}
    config = {} if sample_every is None else {
        "sampling": {"mode": "every" if sample_every == 1 else "adaptive",
                     "every": sample_every, "budget": 0.002}}
    for r in range(ranks):
        rep = Replay(RunLogWriter(run_dir, r, every_steps=every_steps, detail=detail,
                                  queue_size=1 << 20),
                     rank_facts(r, ranks, units, run_id=run_dir.name, started_unix=started_unix,
                                config=config))
        t = started_unix
        last = stop.get(r, steps)
        for s in range(1, last + 1):
            rec, step_s = step_record(s, r, ranks, units, t, straggler)
            t += step_s
            rec["end_unix"] = t
            rep.step(_sample(rec, s, sample_every))
        if r in stop:
            rep.close(end=False, timeout=WRITE_TIMEOUT)
        elif end:
            rep.close(end=True, timeout=WRITE_TIMEOUT)
        else:
            replays[r] = rep
    for rep in replays.values():
        rep.writer.flush(WRITE_TIMEOUT)
    if replays:
        _OPEN[run_dir.resolve()] = replays
        _SAMPLE[run_dir.resolve()] = sample_every
    return run_dir


def append_steps(run_dir: str | os.PathLike, *, ranks: int, units: int, first_step: int,
                 count: int = 1, end_unix: float | None = None,
                 straggler: int | None = 3, sample_every: int | None = None) -> None:
    """Append `count` steps to each rank of an open synthetic run (a live run advancing).
    `sample_every`: a new K from these steps on (adaptive K that changed)."""
    import time

    replays = _OPEN.get(Path(run_dir).resolve())
    if replays is None:
        raise ValueError(f"{run_dir} is not an open synthetic run (write_run(..., end=False))")
    t = end_unix if end_unix is not None else time.time()
    if sample_every is not None:
        _SAMPLE[Path(run_dir).resolve()] = sample_every
    k = _SAMPLE.get(Path(run_dir).resolve())
    for r in range(ranks):
        rep = replays[r]
        for s in range(first_step, first_step + count):
            rec, _ = step_record(s, r, ranks, units, t, straggler)
            rep.step(_sample(rec, s, k))
    for r in range(ranks):
        replays[r].writer.flush(WRITE_TIMEOUT)


def close_run(run_dir: str | os.PathLike, end: bool = True) -> None:
    """Close an open synthetic run (with the clean end lines, or as a killed job)."""
    for rep in _OPEN.pop(Path(run_dir).resolve(), {}).values():
        rep.close(end=end, timeout=WRITE_TIMEOUT)
