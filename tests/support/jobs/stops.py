"""One rank of a demo job that is stopped from outside or fails in a chosen unit, for
tests/test_stop_placement.py and bench/chaos_stops.py: `python -m tests.support.jobs.stops
SPEC_JSON`, started by `zerodoc.demo.launch.Job(..., module=...)`.

SPEC_JSON: {"model": DemoConfig fields, "framework": demo framework name (fsdp2), "steps": N,
"attach": attach() options, "raise": {"rank", "module", "at_step"} (optional: on that rank, the
forward of `module` (a layer inside a unit: "blocks.1.fc1") raises RuntimeError("injected
failure in <module> at step <n>") at that step, or the first later one without per-unit
detail), "hang": the same keys (that module blocks forever in its forward instead)}.
The loop is the README's: attach, train, close() after the loop, no try/finally; a SIGTERM
(a preemption) or an exception ends the rank the way it would end a user's job.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def launch(run: Path, *, model: dict | None = None, **extra):
    """Two ranks of this job (a started `zerodoc.demo.launch.Job`) on the default detail,
    writing to `run` (the demo's small model, `model` on top; `extra`: "raise", ...)."""
    from tests.support.helpers import SMALL_MODEL, job_env
    from zerodoc.demo.launch import Job

    sp = {"model": {**SMALL_MODEL, **(model or {})}, "steps": 400,
          "attach": {"run_dir": str(run), "port": False, "stall_after_s": 2.0}, **extra}
    return Job(2, sp, module="tests.support.jobs.stops", env=job_env(),
               log_dir=str(run / "logs")).start()


def _raise_in(model, monitor, name: str, at_step: int) -> None:
    """The layer `name` raises when called at its `at_step`-th forward or the first later one
    on a step without per-unit detail (the default's usual step: no zerodoc hook or wrapper
    installed, `Monitor._detail_on`): a pre-hook, so it runs inside the enclosing unit's
    forward, as a failing layer would."""
    calls = [0]

    def fail(module, args):
        calls[0] += 1
        if calls[0] >= at_step and not monitor._detail_on:
            raise RuntimeError(f"injected failure in {name} at step {calls[0]}")

    model.get_submodule(name).register_forward_pre_hook(fail)


def _hang_in(model, monitor, name: str, at_step: int) -> None:
    """The layer or unit `name` blocks forever in a forward pre-hook from its `at_step`-th
    forward on, at the first such step without per-unit detail (as `_raise_in`)."""
    import time

    calls = [0]

    def block(module, args):
        calls[0] += 1
        while calls[0] >= at_step and not monitor._detail_on:
            time.sleep(3600)

    model.get_submodule(name).register_forward_pre_hook(block)


def main(spec: dict) -> None:
    import torch
    import torch.distributed as dist

    import zerodoc
    from zerodoc.demo import frameworks
    from zerodoc.demo.transformer import DemoConfig, batch

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    cfg = DemoConfig(**spec.get("model", {}))
    built = frameworks.build(spec.get("framework", "fsdp2"), cfg, spec)
    monitor = zerodoc.attach(built.target, built.optimizer, **spec.get("attach", {}))
    for key, inject in (("raise", _raise_in), ("hang", _hang_in)):
        what = spec.get(key)
        if what and what["rank"] == rank:
            inject(built.model, monitor, what["module"], int(what["at_step"]))
    for step in range(int(spec.get("steps", 20))):
        x, y = batch(cfg, step, rank)
        built.train_step(x, y)
    monitor.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
    sys.stdout.flush()
    os._exit(0)  # gloo teardown at interpreter exit aborts now and then (demo worker)
