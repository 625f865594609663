"""gloo's collectives alone, by size (docs/whatif.md, "The merge case's exposed
communication"): 2 ranks on this machine's CPU, `all_gather_into_tensor` (output allocated
per call, as FSDP2 does, and reused) and `reduce_scatter_tensor`, the sizes interleaved, a
barrier before each call; the median of `--reps` calls per size, ms.

    OMP_NUM_THREADS=1 python bench/gloo_sizes.py [--reps 20] [--sizes 0.263,1.05,3.16]

Sizes are the all-gather's output / the reduce-scatter's input in MB (each rank holds half).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

SIZES_MB = (0.263, 0.79, 1.05, 1.58, 1.9, 2.05, 2.15, 2.4, 3.16, 4.2)
KINDS = ("ag_fresh", "ag_reuse", "rs_fresh")


def _worker(rank: int, port: int, reps: int, sizes: tuple[float, ...]) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    times: dict[tuple[str, float], list[float]] = {}
    bufs: dict[float, torch.Tensor] = {}
    for rep in range(reps + 2):  # the first two rounds warm up
        for mb in sizes:
            n = int(mb * 1e6 / 4) // 2 * 2
            shard = torch.randn(n // 2)
            full = torch.randn(n)
            for kind in KINDS:
                dist.barrier()
                t = time.perf_counter()
                if kind == "ag_fresh":
                    dist.all_gather_into_tensor(torch.empty(n), shard)
                elif kind == "ag_reuse":
                    dist.all_gather_into_tensor(bufs.setdefault(mb, torch.empty(n)), shard)
                else:
                    dist.reduce_scatter_tensor(torch.empty(n // 2), full)
                if rep >= 2:
                    times.setdefault((kind, mb), []).append(time.perf_counter() - t)
    if rank == 0:
        for kind in KINDS:
            med = (statistics.median(times[(kind, mb)]) * 1e3 for mb in sizes)
            print(f"{kind:9}", "  ".join(f"{mb:g} MB {t:.2f}" for mb, t in zip(sizes, med)),
                  flush=True)
    dist.destroy_process_group()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=20, help="calls per size and kind")
    ap.add_argument("--sizes", default=",".join(f"{s:g}" for s in SIZES_MB),
                    help="sizes in MB, comma-separated")
    args = ap.parse_args(argv)
    try:
        sizes = tuple(float(s) for s in args.sizes.split(",") if s.strip())
    except ValueError:
        print(f"--sizes: not a list of numbers: {args.sizes!r}", file=sys.stderr)
        return 2
    if args.reps < 1 or not sizes or not all(0 < s <= 4096 for s in sizes):
        print("--reps must be >= 1 and --sizes in (0, 4096] MB", file=sys.stderr)
        return 2
    import torch.multiprocessing as mp

    from zerodoc.demo.launch import free_port

    mp.spawn(_worker, args=(free_port(), args.reps, sizes), nprocs=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
