"""tests/support/jobs/flightrec_units.py's job for the other engines (FSDP1, ZeRO-1 over DDP,
DeepSpeed): one rank stops where the test chooses, every rank dumps its flight recorder; the
witness of tests/test_flightrec_engines.py.

    python -m tests.support.jobs.flightrec_engines SPEC_JSON   (via zerodoc.demo.launch.Job)

SPEC_JSON: as flightrec_units.py's ("framework": "fsdp1-full", "zero1", "deepspeed-3"...),
with "hang": {"rank", "module", "phase", "at_step"}; `module` is a path in the model the
builder returns (FSDP1: "blocks.1._fsdp_wrapped_module", the module FSDP1 runs after its
all-gather; ZeRO-1: "module.blocks.1", inside DDP; DeepSpeed: "blocks.1", whose pre-forward
hook runs after ZeRO-3's fetch, registered at initialize). Phases: "forward" (a forward
pre-hook of `module`), "backward" (a full backward hook of its `fc1`), "optimizer" (a step
pre-hook of the optimizer given to attach: ZeRO-1's, before its local step and parameter
broadcasts). The rest is flightrec_units.py's `main`, run with this `_hang`.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from tests.support.jobs import flightrec_units


def _hang(model, monitor, name: str, phase: str, at_step: int, marker: Path) -> None:
    calls = [0]

    def block(*_args, **_kwargs):
        calls[0] += 1
        if calls[0] >= at_step and not monitor._detail_on:
            marker.write_text(f"{calls[0]}\n")
            while True:
                time.sleep(3600)

    if phase == "optimizer":
        monitor.adapter.optimizer.register_step_pre_hook(block)
        return
    mod = model.get_submodule(name)
    if phase == "backward":
        mod.fc1.register_full_backward_hook(block)
    else:
        mod.register_forward_pre_hook(block)


if __name__ == "__main__":
    flightrec_units._hang = _hang
    flightrec_units.main(json.loads(sys.argv[1]))
