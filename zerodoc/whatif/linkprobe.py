"""Measure a link profile (`linkprofile`): the collectives alone over a size sweep on a real
process group, the medians and their spread per size; `zerodoc linkprobe` runs it.

Every call is preceded by a barrier, so the ranks start it together; per call the time is
the smallest over the ranks (the link-attributable time, as `linkfit.fit_links` takes from a
run), and per size the median of `reps` calls after two warm-up rounds. The sizes are
interleaved (each round runs every size once), so a drift of the host spreads over all of
them instead of bending the curve. The all-gather's output is allocated per call, as FSDP2
does."""

from __future__ import annotations

import datetime
import json
import math
import os
import socket
import statistics
import time

from .linkprofile import KIND, PROBED, SCHEMA

DEFAULT_SIZES_MB = (0.125, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 6.0, 8.0)
WARMUP_ROUNDS = 2


def _stats(xs: list[float]) -> dict:
    """Median, quartiles and the median's standard error (from the interquartile range:
    robust to the odd slow call), seconds."""
    xs = sorted(xs)  # 5 or more (`measure` refuses fewer)
    med = statistics.median(xs)
    q1, _, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    sd = (q3 - q1) / 1.349
    return {"median_s": med, "q1_s": q1, "q3_s": q3,
            "se_s": 1.2533 * sd / math.sqrt(len(xs)), "calls": len(xs)}


def measure(sizes_mb, reps: int, collectives, device=None) -> dict | None:
    """Run the sweep on the initialised default process group; rank 0 gets the profile's
    document, the other ranks None."""
    import torch
    import torch.distributed as dist

    if reps < 5:
        raise ValueError(f"reps={reps}: 5 or more calls per size (a median's standard "
                         "error comes from their quartiles)")
    n, rank = dist.get_world_size(), dist.get_rank()
    sync = (lambda: torch.cuda.synchronize(device)) if device is not None and \
        device.type == "cuda" else (lambda: None)
    elems = [max(n, int(mb * 1e6 / 4) // n * n) for mb in sizes_mb]
    times: dict[tuple[str, int], list[float]] = {}
    for rnd in range(reps + WARMUP_ROUNDS):
        for numel in elems:
            for coll in collectives:
                full = torch.ones(numel, device=device)
                shard = torch.ones(numel // n, device=device)
                sync()
                dist.barrier()
                t0 = time.perf_counter()
                if coll == "all_gather":
                    dist.all_gather_into_tensor(torch.empty(numel, device=device), shard)
                elif coll == "reduce_scatter":
                    dist.reduce_scatter_tensor(torch.empty(numel // n, device=device), full)
                else:
                    dist.all_reduce(full)
                sync()
                dt = time.perf_counter() - t0
                if rnd >= WARMUP_ROUNDS:
                    times.setdefault((coll, numel), []).append(dt)
    mine = {"host": socket.gethostname(), "times": times}
    every: list = [None] * n
    dist.all_gather_object(every, mine)
    if rank != 0:
        return None
    curves = {}
    for coll in collectives:
        rows = []
        for numel in elems:
            per_rank = [e["times"][(coll, numel)] for e in every]
            calls = [min(ts) for ts in zip(*per_rank)]  # the link's part of each call
            rows.append({"bytes": numel * 4, **_stats(calls)})
        curves[coll] = rows
    hosts = sorted({e["host"] for e in every})
    import torch as _t

    return {"kind": KIND, "schema": SCHEMA, "backend": dist.get_backend(), "group_size": n,
            "host": hosts[0] if len(hosts) == 1 else f"{len(hosts)} hosts: {hosts[0]}, ...",
            "hosts": len(hosts), "device": "cpu" if device is None else str(device.type),
            "torch": _t.__version__, "reps": reps, "dtype": "float32",
            "bytes": "per call, algorithm bytes: the all-gather's output, the "
                     "reduce-scatter's input, the all-reduce's tensor",
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(
                timespec="seconds"),
            "collectives": curves}


def _device(backend: str):
    import torch

    if backend != "nccl":
        return None
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    return torch.device("cuda", local)


def run_rank(rank: int, world: int, port: int | None, backend: str, sizes_mb, reps: int,
             collectives, out: str) -> None:
    """One rank of the probe: joins the group (`port`: a local group started by the probe;
    None: the launcher's environment, e.g. torchrun), measures, rank 0 writes `out`."""
    import warnings

    import torch
    import torch.distributed as dist

    # torch 2.13 calls all_gather_into_tensor / reduce_scatter_tensor deprecated: FSDP2 and
    # DeepSpeed still call them, and they are what the profile measures
    warnings.filterwarnings("ignore", category=FutureWarning, module="torch.distributed")
    if port is not None:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                          LOCAL_RANK=str(rank))
        torch.set_num_threads(1)
        dist.init_process_group(backend, rank=rank, world_size=world)
    else:
        dist.init_process_group(backend)
    try:
        doc = measure(sizes_mb, reps, collectives, _device(backend))
        if doc is not None:
            text = json.dumps(doc, indent=1) + "\n"
            if out == "-":
                print(text, end="", flush=True)
            else:
                with open(out, "w", encoding="utf-8") as f:
                    f.write(text)
    finally:
        dist.destroy_process_group()
