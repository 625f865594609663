"""`zerodoc linkprobe`: measure a link profile (time per call against size, per collective) on
a real process group, for `zerodoc whatif --link-profile` (zerodoc/whatif/linkprobe.py)."""

from __future__ import annotations

import math
import os
import sys

from .helpformat import DefaultsHelpFormatter

BACKENDS = ("gloo", "nccl")


def add_parser(sub) -> None:
    from ..whatif.linkprobe import DEFAULT_SIZES_MB
    from ..whatif.linkprofile import PROBED

    p = sub.add_parser(
        "linkprobe", help="measure a link profile (time per call against size) for whatif",
        description="Run the collectives alone over a size sweep on a real process group "
        "and write a link profile (JSON: backend, group size, host, per collective and size "
        "the median time per call and its spread) that `zerodoc whatif --link-profile` "
        "uses to price calls larger than a run's own. Launched by torchrun (RANK and "
        "WORLD_SIZE set) it measures the launcher's group, rank 0 writing the profile; "
        "otherwise it starts --nprocs local ranks. Measure on the host class the job runs "
        "on, with nothing else running. Exit status: 0, 2 on bad input.",
        formatter_class=DefaultsHelpFormatter)
    p.add_argument("--out", default="-", metavar="FILE",
                   help="where to write the profile ('-': standard output)")
    p.add_argument("--nprocs", type=int, default=2, metavar="N",
                   help="local ranks to start (ignored under torchrun)")
    p.add_argument("--backend", default="gloo", choices=BACKENDS,
                   help="process group backend (nccl: one GPU per rank)")
    p.add_argument("--sizes", default=",".join(f"{s:g}" for s in DEFAULT_SIZES_MB),
                   metavar="MB,...", help="sizes per call in MB (the all-gather's output, the "
                   "reduce-scatter's input, the all-reduce's tensor), comma-separated")
    p.add_argument("--reps", type=int, default=15, metavar="N",
                   help="calls per size and collective, 5 or more (each median's standard error "
                        "comes from their quartiles; after 2 warm-up rounds)")
    p.add_argument("--collectives", default=",".join(PROBED), metavar="KIND,...",
                   help=f"which to measure, of {', '.join(PROBED)}")
    p.set_defaults(func=run)


def parse_args(args):
    """(sizes in MB, collectives) from the command line; UserError on bad input."""
    from ..errors import UserError
    from ..whatif.linkprofile import PROBED

    sizes = []
    for s in args.sizes.split(","):
        try:
            v = float(s)
        except ValueError:
            raise UserError(f"--sizes: {s.strip()!r} is not a number of MB") from None
        if not (math.isfinite(v) and 0 < v <= 4096):
            raise UserError(f"--sizes: {s.strip()!r} must be in (0, 4096] MB")
        sizes.append(v)
    sizes = sorted(set(sizes))
    if len(sizes) < 2:
        raise UserError("--sizes: give 2 or more distinct sizes")
    close = [(a, b) for a, b in zip(sizes, sizes[1:]) if b < a * 1.01 or b - a < 0.001]
    if close:  # they would round to the same element counts (review rev4 S2)
        a, b = close[0]
        raise UserError(f"--sizes: {a:g} and {b:g} MB are too close (1 % and 1 kB apart "
                        "at least)")
    colls = [c.strip() for c in args.collectives.split(",") if c.strip()]
    bad = [c for c in colls if c not in PROBED]
    if bad or not colls:
        raise UserError(f"--collectives: unknown {', '.join(bad) or '(none given)'} "
                        f"(known: {', '.join(PROBED)})")
    if not 5 <= args.reps <= 10000:
        raise UserError(f"--reps must be between 5 and 10000 (the median's standard error "
                        f"comes from the quartiles: 5 calls per size at least), not {args.reps}")
    if not 2 <= args.nprocs <= 1024:
        raise UserError(f"--nprocs must be between 2 and 1024, not {args.nprocs}")
    if not args.out.strip():
        raise UserError("--out: give a file name, or - for standard output")
    if args.out != "-":
        d = os.path.dirname(os.path.abspath(args.out))
        if os.path.isdir(args.out):
            raise UserError(f"--out {args.out}: is a directory")
        if not os.path.isdir(d):
            raise UserError(f"--out {args.out}: no such directory {d}")
        if not os.access(d, os.W_OK):
            raise UserError(f"--out {args.out}: directory {d} is not writable")
    return sorted(set(sizes)), list(dict.fromkeys(colls))


def run(args) -> int:
    from ..errors import UserError
    from ..whatif.linkprobe import run_rank

    sizes, colls = parse_args(args)
    launched = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    if launched:  # torchrun: every rank runs this command
        try:
            rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        except ValueError:
            raise UserError(f"linkprobe: RANK={os.environ['RANK']!r} and WORLD_SIZE="
                            f"{os.environ['WORLD_SIZE']!r} must be integers (as torchrun "
                            "sets them)") from None
        if world < 2:
            raise UserError("linkprobe: WORLD_SIZE is 1: a link needs 2 or more ranks "
                            "(unset RANK and WORLD_SIZE to start --nprocs local ranks)")
        try:
            run_rank(rank, world, None, args.backend, sizes, args.reps, colls, args.out)
        except (ValueError, RuntimeError) as e:  # the launcher's environment, the group
            last = [ln for ln in str(e).strip().splitlines() if ln.strip()]
            raise UserError(f"linkprobe: rank {rank} of {world}: "
                            f"{last[-1] if last else type(e).__name__}") from None
        return 0
    if args.backend == "nccl":
        import torch

        have = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if have < args.nprocs:
            raise UserError(f"--backend nccl: {args.nprocs} ranks need {args.nprocs} GPUs, "
                            f"{have} found")
    import torch.multiprocessing as mp

    from ..demo.launch import free_port

    try:
        mp.spawn(run_rank, args=(args.nprocs, free_port(), args.backend, sizes, args.reps,
                                 colls, args.out), nprocs=args.nprocs)
    except Exception as e:  # a rank failed: its last line, not the traceback
        last = [ln for ln in str(e).strip().splitlines() if ln.strip()]
        raise UserError(f"linkprobe: a rank failed: {last[-1] if last else type(e).__name__}"
                        ) from None
    if args.out != "-":
        print(f"link profile written to {args.out}", file=sys.stderr)
    return 0
