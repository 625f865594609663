"""close() gives FSDP1 back its own runtime functions, hooks and handles; training goes on.

    python -m tests.support.jobs.fsdp1_restore SPEC_JSON   (one rank; started by Job)

SPEC_JSON: {"run_dir": ...}. Each rank builds a FULL_SHARD FSDP1 demo model, attaches,
trains two steps, closes, trains a third, and prints `RESTORE [what was left patched]`;
exit 1 when anything was left. Used by tests/test_fsdp1.py.
"""

import json
import os
import sys

import torch.distributed as dist
from torch.distributed.fsdp import _runtime_utils as ru

import zerodoc
from zerodoc.demo import frameworks
from zerodoc.demo.model import DemoConfig, batch

NAMES = ("_pre_backward_hook", "_post_backward_hook", "_reduce_grad", "_reduce_grad_no_shard",
         "dist")


def main() -> None:
    dist.init_process_group("gloo")
    cfg = DemoConfig(blocks=2, hidden=64, heads=4, vocab=256, seq=32, batch=2)
    built = frameworks.build("fsdp1-full", cfg, {})
    before = {n: getattr(ru, n) for n in NAMES}
    hooks = {id(m): (len(m._forward_pre_hooks), len(m._forward_hooks))
             for m in built.model.modules()}
    mon = zerodoc.attach(built.target, built.optimizer, port=False,
                         run_dir=json.loads(sys.argv[1])["run_dir"])
    for step in range(2):
        built.train_step(*batch(cfg, step, dist.get_rank()))
    mon.close()
    bad = [n for n in NAMES if getattr(ru, n) is not before[n]]
    bad += [type(m).__name__ for m in built.model.modules()
            if (len(m._forward_pre_hooks), len(m._forward_hooks)) != hooks[id(m)]]
    bad += ["handle" for m in built.model.modules()
            if getattr(m, "_handle", None) is not None
            and "_all_gather_flat_param" in vars(m._handle)]
    built.train_step(*batch(cfg, 2, dist.get_rank()))  # trains on after close()
    dist.barrier()
    dist.destroy_process_group()
    print("RESTORE", bad, flush=True)
    os._exit(1 if bad else 0)


if __name__ == "__main__":
    main()
