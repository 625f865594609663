"""Synthetic flight-recorder dumps (format 2.9, as torch's NCCL process groups write them),
for the tests and bench/flightrec.py: a job of `world` ranks, tensor-parallel groups of
`tp` ranks and the default group, where the ranks in `stopped` stop before a collective
the others enter. The witness is the construction: the stopped ranks are known.

Each rank's ring holds its last `ring` collectives (oldest evicted, as torch's ring does);
`pg_status` keeps every group's last enqueued / completed sequence number. The schedule
per step: per TP group `per_step` all-gathers, then an all-reduce on the default group.
A stopped rank enters nothing after `stop_after` collectives; every other rank enters one
more in each of its groups whose members include a stopped rank, and waits there.
"""

from __future__ import annotations

import pickle
from pathlib import Path

VERSION = "2.9"


def _entry(record: int, pg_id: int, name: str, desc: str, seq: int, op: str,
           done: bool) -> dict:
    return {"record_id": record, "pg_id": pg_id, "process_group": (name, desc),
            "thread_name": "pt_main_thread", "thread_id": "1", "collective_seq_id": seq,
            "p2p_seq_id": 0, "op_id": seq, "profiling_name": f"nccl:{op}",
            "time_created_ns": 1_700_000_000_000_000_000 + record * 1000,
            "input_sizes": [[4096, 1024]], "input_dtypes": ["BFloat16"],
            "output_sizes": [[4096 * 8, 1024]], "output_dtypes": ["BFloat16"],
            "state": "completed" if done else "scheduled",
            "time_discovered_started_ns": None, "time_discovered_completed_ns": None,
            "retired": done, "timeout_ms": 600000, "is_p2p": False}


def rank_dump(rank: int, world: int, *, tp: int = 8, steps: int = 50, per_step: int = 4,
              ring: int = 2000, stopped: tuple[int, ...] = (), stop_after: int | None = None,
              ) -> dict:
    """One rank's dump (a dict, as `pickle.loads` of torch's dump gives it)."""
    tp_first = rank - rank % tp
    tp_name, tp_ranks = f"tp{tp_first // tp}", list(range(tp_first, tp_first + tp))
    groups = [(0, "0", "default_pg", list(range(world))),
              (1, tp_name, "TENSOR_MODEL_PARALLEL_GROUP", tp_ranks)]
    schedule = []  # (pg_id, op) in the order this rank issues them
    for _ in range(steps):
        schedule += [(1, "_all_gather_base")] * per_step + [(0, "all_reduce")]
    limit = len(schedule) - 2 * (per_step + 1) if stop_after is None else stop_after
    pending = None  # the index of the collective this rank waits in
    if rank in stopped:
        schedule = schedule[:limit]
    elif stopped:
        blocked = {pg for pg, _, _, members in groups if set(members) & set(stopped)}
        # on until the first collective of a group that holds a stopped rank
        pending = next((i for i in range(limit, len(schedule)) if schedule[i][0] in blocked),
                       None)
        schedule = schedule[:None if pending is None else pending + 1]
    seq = {pg: 0 for pg, *_ in groups}
    entries = []
    for i, (pg, op) in enumerate(schedule):
        seq[pg] += 1
        entries.append((i, pg, seq[pg], op, i != pending))
    status = {str(pg): {"last_enqueued_collective": seq[pg], "last_started_collective": -1,
                        "last_completed_collective": max(
                            [s for _, p, s, _, d in entries if p == pg and d] or [0])}
              for pg, *_ in groups}
    names = {pg: (name, desc) for pg, name, desc, _ in groups}
    return {"version": VERSION, "nccl_version": "2.21.5",
            "pg_config": {name: {"name": name, "desc": desc, "ranks": str(members)}
                          for _, name, desc, members in groups},
            "pg_status": status,
            "entries": [_entry(i, pg, *names[pg], s, op, d) for i, pg, s, op, d
                        in entries[-ring:]]}


def write_dumps(out: Path, world: int, *, stopped: tuple[int, ...] = (),
                empty: tuple[int, ...] = (), missing: tuple[int, ...] = (), **kw) -> Path:
    """Every rank's dump in `out` as torch names them (`nccl_trace_rank_<rank>`), pickled;
    ranks in `empty` write a dump with no entries and no group status, ranks in `missing`
    none. `kw`: `rank_dump`'s. Returns `out`."""
    out.mkdir(parents=True, exist_ok=True)
    for r in range(world):
        if r in missing:
            continue
        d = rank_dump(r, world, stopped=stopped, **kw)
        if r in empty:
            d["entries"], d["pg_status"] = [], {}
        (out / f"nccl_trace_rank_{r}").write_bytes(pickle.dumps(d, protocol=2))
    return out
