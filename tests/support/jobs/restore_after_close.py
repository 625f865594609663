"""close() gives the framework back its own functions, hooks and handles; training goes on.

    python -m tests.support.jobs.restore_after_close SPEC_JSON   (one rank; started by Job)

SPEC_JSON: {"run_dir": ..., "framework": "fsdp1-full" | "zero1"}. Each rank builds the demo
model with that framework, attaches, trains two steps, closes, checks that every module's
hooks are as before plus the framework's own patch points, trains on, and prints
`RESTORE [what was left patched] [losses]`; exit 1 when anything was left. Used by
tests/test_fsdp1.py and tests/test_zero1.py.
"""

import json
import os
import sys

import torch
import torch.distributed as dist

import zerodoc
from zerodoc.demo import frameworks
from zerodoc.demo.transformer import DemoConfig, batch


def fsdp1_checks(built):
    """FSDP1's runtime functions and flat-parameter handles, as they were before attach."""
    from torch.distributed.fsdp import _runtime_utils as ru

    names = ("_pre_backward_hook", "_post_backward_hook", "_reduce_grad",
             "_reduce_grad_no_shard", "dist")
    before = {n: getattr(ru, n) for n in names}

    def left() -> list:
        bad = [n for n in names if getattr(ru, n) is not before[n]]
        return bad + ["handle" for m in built.model.modules()
                      if getattr(m, "_handle", None) is not None
                      and "_all_gather_flat_param" in vars(m._handle)]
    return left


def zero1_checks(built):
    """ZeroRedundancyOptimizer's module `dist` and its optimizer's own methods."""
    from torch.distributed.optim import zero_redundancy_optimizer as zro

    def left() -> list:
        bad = [] if zro.dist is dist else ["zero_redundancy_optimizer.dist"]
        return bad + (["optimizer"] if "_broadcast_params_from_rank" in vars(built.optimizer)
                      else [])
    return left


CHECKS = {"fsdp1-full": (fsdp1_checks, 1), "zero1": (zero1_checks, 2)}  # (+ steps after close)


def params_differ_between_ranks(model) -> bool:
    for t in [p.detach().clone() for p in model.parameters()]:
        ref = t.clone()
        dist.broadcast(ref, src=0)
        if not torch.equal(ref, t):
            return True
    return False


def main() -> None:
    spec = json.loads(sys.argv[1])
    checks, after = CHECKS[spec["framework"]]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    cfg = DemoConfig(blocks=2, hidden=64, heads=4, vocab=256, seq=32, batch=2)
    built = frameworks.build(spec["framework"], cfg, {})
    left = checks(built)
    hooks = {id(m): (len(m._forward_pre_hooks), len(m._forward_hooks))
             for m in built.model.modules()}
    mon = zerodoc.attach(built.target, built.optimizer, port=False, run_dir=spec["run_dir"])
    losses = [built.train_step(*batch(cfg, s, rank)) for s in range(2)]
    mon.close()
    bad = left()
    bad += [type(m).__name__ for m in built.model.modules()
            if (len(m._forward_pre_hooks), len(m._forward_hooks)) != hooks[id(m)]]
    # trains on after close() (ZeRO-1: DDP cannot drop a comm hook; ours stays and only
    # averages, as DDP's own all-reduce does)
    losses += [built.train_step(*batch(cfg, s, rank)) for s in range(2, 2 + after)]
    if spec["framework"] == "zero1" and params_differ_between_ranks(built.model):
        bad.append("parameters differ between ranks")
    dist.barrier()
    dist.destroy_process_group()
    print("RESTORE", bad, losses, flush=True)
    os._exit(1 if bad else 0)


if __name__ == "__main__":
    main()
