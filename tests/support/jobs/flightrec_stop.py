"""A gloo job whose rank STOP stops before a collective the others enter; every rank dumps
its flight recorder (torch >= 2.8 records gloo's collectives too).

    python tests/support/jobs/flightrec_stop.py OUT_DIR WORLD STOP pickle|json|nodump

WORLD ranks (spawned processes, a file store in OUT_DIR) all-reduce five times on the world
group and broadcast twice on a group of ranks 0 and 1; then every rank but STOP starts a
sixth all-reduce (async: it stays pending, STOP never joins it) and writes its dump to
OUT_DIR/dumps/nccl_trace_rank_<rank> (torch's default name), once its recorder counts
the collectives before it complete. STOP writes its own dump
after its fifth all-reduce (`nodump`: it writes none, as a rank that died), then waits for
the others' dumps before everyone exits. `json`: rank 0 writes the JSON form of the dump.
The witness of tests/test_flightrec.py: STOP is the rank that stopped, known by
construction.
"""

from __future__ import annotations

import os
import pickle
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)  # the reader never sees half a dump


def settled(c10d) -> None:
    """Waits until this rank's recorder counts every collective it returned from as
    completed: gloo's wait() returns before the recorder's pg_status counts the work done
    (seen: 1 run in 4, a waiting rank's dump said the fifth all-reduce was not complete),
    and the witness is what the dumps say a moment later, as in a hung job's dumps."""
    deadline, status = time.monotonic() + 30, None
    while time.monotonic() < deadline:
        status = pickle.loads(c10d._dump_fr_trace()).get("pg_status") or {}
        if all(int(st["last_completed_collective"]) >= int(st["last_enqueued_collective"])
               for st in status.values()):
            return
        time.sleep(0.01)  # a condition: the recorder's count catches up
    # no witness: the dumps would say less than the job did (mp.spawn stops the others)
    raise SystemExit(f"the flight recorder never counted its collectives complete: {status}")


def rank_main(rank: int, world: int, stop: int, how: str, out: str) -> None:
    out_dir = Path(out)
    dumps = out_dir / "dumps"
    dist.init_process_group("gloo", init_method=f"file://{out_dir / 'store'}", rank=rank,
                            world_size=world)
    t = torch.ones(8)
    pair = dist.new_group([0, 1])
    for _ in range(5):
        dist.all_reduce(t)
    if rank in (0, 1):
        for _ in range(2):
            dist.broadcast(t, 0, group=pair)
    c10d = torch._C._distributed_c10d
    settled(c10d)
    if rank != stop:
        dist.all_reduce(t, async_op=True)  # pending: rank `stop` never enters it
    if rank != stop or how != "nodump":
        data = c10d._dump_fr_trace_json() if how == "json" and rank == 0 \
            else c10d._dump_fr_trace()
        data = data.encode() if isinstance(data, str) else data
        write(dumps / f"nccl_trace_rank_{rank}", data)
    others = [dumps / f"nccl_trace_rank_{r}" for r in range(world) if r != stop]
    deadline = time.monotonic() + 60
    while not all(p.exists() for p in others) and time.monotonic() < deadline:
        time.sleep(0.05)  # a condition: the others' dumps are written
    sys.stdout.flush()
    os._exit(0)  # the pending all-reduce never completes: no clean teardown


def main() -> None:
    out, world, stop, how = str(Path(sys.argv[1]).resolve()), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    (Path(out) / "dumps").mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")
    mp.spawn(rank_main, args=(world, stop, how, out), nprocs=world)


if __name__ == "__main__":
    main()
