"""One rank of the demo job: `python -m zerodoc.demo.worker SPEC_JSON`.

Started by `zerodoc.demo.launch` with RANK / LOCAL_RANK / WORLD_SIZE / MASTER_ADDR /
MASTER_PORT set. SPEC_JSON holds {"model": DemoConfig fields, "steps": N, "attach": attach()
options, "lr": float, "profile": {"dir", "wait", "warmup", "active", "gzip"} (optional: record
PyTorch profiler traces of steps wait+warmup+1 ... wait+warmup+active, one file per rank,
`<dir>/rank-N.json[.gz]`, ProfilerStep#K being zerodoc's step K+1)}; tests may add "hang":
{"rank_to_hang", "unit", "after_steps"}, and "framework_delay_s" (FSDP2: every unit's own
pre-forward, inside FSDP's hook, sleeps that long: framework time beneath the measurement,
a witness of the shim's framework totals). "stop_file" (tests) ends the run cleanly once any
rank sees that file; "interrupt_file" (`zerodoc demo`: `Job.stop()` creates it on Ctrl-C) the
same, recorded as stopped by the user (the run log's end says "interrupted"). Ends with
destroy_process_group() and os._exit(): gloo jobs whose ranks exit at different times
otherwise abort at interpreter exit now and then (gloo teardown).
"""

from __future__ import annotations

import json
import os
import signal
import sys


def run(spec: dict) -> int:
    import torch
    import torch.distributed as dist

    import zerodoc
    from zerodoc.demo import frameworks
    from zerodoc.demo.transformer import DemoConfig, batch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    for dotted in spec.get("break_hooks", ()):  # tests: simulate a missing hook point
        _break(dotted)
    if spec.get("framework_delay_s"):  # tests: known framework time in every unit's hook
        _delay_fsdp2_pre_forward(float(spec["framework_delay_s"]))
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    cfg = DemoConfig(**spec.get("model", {}))
    built = frameworks.build(spec.get("framework", "fsdp2"), cfg, spec)
    monitor = zerodoc.attach(built.target, built.optimizer, **spec.get("attach", {}))
    if spec.get("hang"):  # tests: one rank blocks forever in one unit's forward
        _hang(built.model, rank, **spec["hang"])
    steps = int(spec.get("steps", 20))
    stop_file = spec.get("stop_file")  # tests: end the run cleanly once this file exists
    interrupt_file = spec.get("interrupt_file")  # the launcher's Ctrl-C: a clean stop
    files = [f for f in (stop_file, interrupt_file) if f]
    interrupted = False
    losses = []
    prof = _profiler(spec.get("profile"), rank)
    try:
        for step in range(steps):
            x, y = batch(cfg, step, rank)
            losses.append(built.train_step(x, y))
            if prof is not None:
                prof.step()
            if files and _all_see(files):
                interrupted = bool(interrupt_file) and _all_see([interrupt_file])
                break
    finally:
        if prof is not None:
            prof.stop()
        monitor.close(interrupted=interrupted)
    if spec.get("check_restore"):
        _check_restored(built.model)
    if spec.get("losses_file"):
        with open(f"{spec['losses_file']}.{rank}", "w") as f:
            json.dump(losses, f)
    dist.barrier()
    dist.destroy_process_group()
    return 0


def _all_see(paths: list[str]) -> bool:
    """Whether any rank sees one of `paths` (every rank gets the same answer: they stop
    together, at the same step)."""
    import torch
    import torch.distributed as dist

    flag = torch.tensor([1.0 if any(os.path.exists(p) for p in paths) else 0.0])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def _profiler(opts: dict | None, rank: int):
    """A started torch.profiler (CPU activities, shapes) writing this rank's trace, or None."""
    if not opts:
        return None
    import torch

    out = os.path.join(opts["dir"], f"rank-{rank}.json" + (".gz" if opts.get("gzip") else ""))
    os.makedirs(opts["dir"], exist_ok=True)
    prof = torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True,
        schedule=torch.profiler.schedule(wait=int(opts.get("wait", 1)),
                                         warmup=int(opts.get("warmup", 1)),
                                         active=int(opts.get("active", 3)), repeat=1),
        on_trace_ready=lambda p: p.export_chrome_trace(out))
    prof.start()
    return prof


def _hang(model, rank: int, *, rank_to_hang: int, unit: str, after_steps: int = 2) -> None:
    """A forward pre-hook on `unit` of rank `rank_to_hang` that sleeps forever from its
    `after_steps`-th call on (registered after attach: it runs inside the unit's forward)."""
    if rank != rank_to_hang:
        return
    import time

    calls = [0]

    def block(module, args):
        calls[0] += 1
        if calls[0] > after_steps:
            while True:
                time.sleep(3600)

    model.get_submodule(unit).register_forward_pre_hook(block)


def _delay_fsdp2_pre_forward(seconds: float) -> None:
    """FSDP2's param group pre-forward (run inside FSDP's forward pre-hook, once per unit and
    forward) sleeps `seconds` first: framework time the shim cannot have made up."""
    import time

    from zerodoc.shim.hookpoints import fsdp2_param_group_class

    FSDPParamGroup = fsdp2_param_group_class()  # the one place naming FSDP2's internals
    real = FSDPParamGroup.pre_forward

    def pre_forward(self, *args, **kwargs):
        time.sleep(seconds)
        return real(self, *args, **kwargs)

    FSDPParamGroup.pre_forward = pre_forward


def _break(dotted: str) -> None:
    import importlib

    mod, _, name = dotted.rpartition(".")

    def missing(*a, **k):
        raise AttributeError(f"simulated missing hook point ({dotted})")
    setattr(importlib.import_module(mod), name, missing)


def _check_restored(model) -> None:
    """After close(): FSDP's own comms and methods are back (raises if not)."""
    from zerodoc.shim import hookpoints as hp

    for mod in model.modules():
        if not hasattr(mod, "_get_fsdp_state"):
            continue
        for g in hp.fsdp2_param_groups(mod):
            for attr in ("_all_gather_comm", "_reduce_scatter_comm"):
                name = type(getattr(g, attr)).__name__
                if name.startswith("Instrumented"):
                    raise AssertionError(f"{attr} still instrumented: {name}")
            if "pre_backward" in g.__dict__ or "post_backward" in g.__dict__:
                raise AssertionError("backward wrappers still installed")
        if mod._forward_pre_hooks and len(mod._forward_pre_hooks) > 1:
            raise AssertionError(f"forward pre hooks left: {len(mod._forward_pre_hooks)}")


def main() -> None:
    # Ctrl-C is handled by the launcher, which asks us to stop (interrupt_file) or, if we do
    # not, terminates us; don't print tracebacks.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    spec = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    code = 1
    try:
        code = run(spec)
    except Exception as e:  # one line, not a traceback, then a clean exit code
        print(f"zerodoc demo worker rank {os.environ.get('RANK')}: {type(e).__name__}: {e}",
              file=sys.stderr, flush=True)
        if os.environ.get("ZERODOC_DEBUG"):
            import traceback

            traceback.print_exc()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
