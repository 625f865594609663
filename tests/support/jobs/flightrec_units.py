"""A zerodoc-watched FSDP2 gloo job (the demo model) in which one rank stops inside a unit
the test chooses, and every rank dumps its flight recorder: the witness of
tests/test_flightrec_units.py (`zerodoc report DUMPS --runlog RUNDIR`).

    python -m tests.support.jobs.flightrec_units SPEC_JSON   (via zerodoc.demo.launch.Job)

SPEC_JSON: as tests/support/jobs/stops.py's ("model", "framework", "steps", "attach"), plus
"hang": {"rank", "module", "phase", "at_step"}: that rank blocks in `module` (a sharded
unit, "blocks.1"): phase "forward", in a forward pre-hook registered after FSDP's own (FSDP2
prepends its pre-forward, so the unit's all-gather is issued first); "backward", in a full
backward hook of its `fc1` (inside the unit's backward, after FSDP2's pre-backward issued
its all-gathers); from its `at_step`-th call on, on the first such step without per-unit
detail (the default's usual step); it writes OUT/hung-<rank> as it blocks. "out": a folder; once OUT/dump exists every rank writes its flight recorder's dump
(torch's `_dump_fr_trace()`, TORCH_FR_BUFFER_SIZE set by the test) to
OUT/dumps/nccl_trace_rank_<rank> every 0.2 s (replaced whole), until OUT/stop exists: then
every rank ends at once (`os._exit`: the waiting ranks never leave their collective).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path


def _dumper(out: Path, rank: int) -> None:
    """The dump thread: a dump every 0.2 s once asked, the process's end when told."""
    import torch

    target = out / "dumps" / f"nccl_trace_rank_{rank}"
    while not (out / "stop").exists():
        if (out / "dump").exists():
            data = torch._C._distributed_c10d._dump_fr_trace()
            tmp = target.with_name(target.name + ".tmp")
            tmp.write_bytes(data.encode() if isinstance(data, str) else data)
            os.replace(tmp, target)  # the reader never sees half a dump
        time.sleep(0.2)
    sys.stdout.flush()
    os._exit(0)


def _hang(model, monitor, name: str, phase: str, at_step: int, marker: Path) -> None:
    calls = [0]

    def block(module, *args):
        calls[0] += 1
        if calls[0] >= at_step and not monitor._detail_on:
            marker.write_text(f"{calls[0]}\n")
            while True:
                time.sleep(3600)

    mod = model.get_submodule(name)
    if phase == "backward":  # inside the unit's backward: its all-gather is in (prefetched)
        getattr(mod, "fc1", mod).register_full_backward_hook(block)
    else:
        mod.register_forward_pre_hook(block)


def main(spec: dict) -> None:
    import torch
    import torch.distributed as dist

    import zerodoc
    from zerodoc.demo import frameworks
    from zerodoc.demo.transformer import DemoConfig, batch

    torch.set_num_threads(1)
    out = Path(spec["out"])
    (out / "dumps").mkdir(parents=True, exist_ok=True)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    cfg = DemoConfig(**spec.get("model", {}))
    built = frameworks.build(spec.get("framework", "fsdp2"), cfg, spec)
    monitor = zerodoc.attach(built.target, built.optimizer, **spec.get("attach", {}))
    threading.Thread(target=_dumper, args=(out, rank), daemon=True).start()
    hang = spec["hang"]
    if hang["rank"] == rank:
        _hang(built.model, monitor, hang["module"], hang.get("phase", "forward"),
              int(hang["at_step"]), out / f"hung-{rank}")
    for step in range(int(spec.get("steps", 400))):
        x, y = batch(cfg, step, rank)
        built.train_step(x, y)
    monitor.close()  # not reached while a rank hangs: the test ends the job (OUT/stop)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
