"""A user registers DDP's comm hook after `zerodoc.attach()`: it runs, and zerodoc still times.

    python -m tests.support.jobs.ddp_user_hook SPEC_JSON   (one rank; started by Job)

SPEC_JSON: {"run_dir": ..., "hook": "sum" | "twice" | "builtin" | "none",
"static_graph": bool, "accumulate": micro-batches per step (the first ones under
`no_sync()`), "steps": int, "detail": zerodoc's `detail` option, "bucket_cap_mb": DDP's}.

Each rank trains the same model, same data, three times in this process:
- "default": plain DDP, no comm hook, no zerodoc;
- "plain": plain DDP with the user's hook registered, no zerodoc (what the user expects);
- "zerodoc": attached first, the user's hook registered after `attach()` (the case of
  issue 32: torch allows one comm hook and zerodoc's took the slot).
The user's hook "sum" counts its calls and sums the gradients without averaging (unlike DDP's
default), so the losses show whose reduction ran: "zerodoc" must equal "plain" bitwise and
differ from "default". "builtin" asks for torch's C++ all-reduce
(`_register_builtin_comm_hook`), which cannot be chained: the error must name zerodoc.
"twice" registers "sum" twice: torch refuses the second, with zerodoc as without.
Prints `RESULT <json>` (losses, the hook's calls and its summed seconds per step for each
run, the error text of a refused registration, DDP's `_comm_hooks` and its logger's hook
name at the end); exit 0.
`launch(spec)` starts it on 2 ranks and returns each rank's RESULT (tests/test_ddp_comm_hook.py,
bench/chaos_ddp.py).
"""

import faulthandler
import json
import os
import sys
from contextlib import nullcontext
from time import perf_counter

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import zerodoc
from zerodoc.demo.transformer import DemoConfig, TinyTransformer, batch, loss_fn

CFG = DemoConfig(blocks=2, hidden=64, heads=4, vocab=256, seq=32, batch=2)


def sum_hook(state: dict, bucket):
    """A user's hook: counts its calls, sums the bucket over the ranks (no averaging), and
    adds the time from its call to its all-reduce's completion to `state["seconds"]` (the
    witness of zerodoc's bucket times)."""
    state["calls"] += 1
    t0 = perf_counter()
    fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()

    def done(f):
        state["seconds"] += perf_counter() - t0
        return f.value()[0]
    return fut.then(done)


def register(model, spec: dict, state: dict) -> str | None:
    """The user's registration; the error's text where it is refused."""
    try:
        if spec["hook"] in ("sum", "twice"):
            model.register_comm_hook(state, sum_hook)
        if spec["hook"] == "twice":
            model.register_comm_hook(state, sum_hook)
        elif spec["hook"] == "builtin":
            model._register_builtin_comm_hook(dist.BuiltinCommHookType.ALLREDUCE)
    except Exception as e:  # noqa: BLE001 - the test reads what the user was told
        return f"{type(e).__name__}: {e}"
    return None


def train(spec: dict, hooked: bool, attach: bool) -> dict:
    rank = dist.get_rank()
    torch.manual_seed(CFG.seed)
    model = DDP(TinyTransformer(CFG), static_graph=bool(spec.get("static_graph")),
                bucket_cap_mb=float(spec.get("bucket_cap_mb", 25)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    state = {"calls": 0, "seconds": 0.0}
    mon = None
    if attach:
        mon = zerodoc.attach(model, opt, port=False, run_dir=spec["run_dir"],
                             detail=spec.get("detail", "every"))
    error = register(model, spec, state) if hooked else None
    losses, calls, seconds = [], [], []
    accumulate = int(spec.get("accumulate", 1))
    for s in range(int(spec["steps"])):
        before, t_before = state["calls"], state["seconds"]
        for m in range(accumulate):
            x, y = batch(CFG, s * accumulate + m, rank)
            with model.no_sync() if m < accumulate - 1 else nullcontext():
                loss = loss_fn(model(x), y) / accumulate
                loss.backward()
            losses.append(loss.item())
        opt.step()
        opt.zero_grad()
        calls.append(state["calls"] - before)
        seconds.append(state["seconds"] - t_before)
    if mon is not None:
        mon.close()
    hooks = [getattr(h, "__qualname__", repr(h)) for h, _ in model._comm_hooks]
    named = model._get_ddp_logging_data().get("comm_hook")  # the name DDP's logger keeps
    return {"losses": losses, "calls": calls, "seconds": seconds, "error": error,
            "comm_hooks": hooks, "comm_hook_name": named}


def launch(spec: dict, timeout: float = 180) -> list[dict]:
    """This job on 2 gloo ranks (`spec` as above); each rank's RESULT. Raises where a rank
    failed (its output in the message); the others are stopped as soon as one fails. (The
    EADDRINUSE at the rendezvous once seen here came from `free_port()` handing out a port
    full of a flood's TIME_WAIT: fixed there, so no retry.)"""
    from tests.support.helpers import ROOT, wait_until
    from zerodoc.demo.launch import Job

    job = Job(2, spec, module="tests.support.jobs.ddp_user_hook",
              env={"PYTHONPATH": str(ROOT)}).start()
    try:
        wait_until(lambda: not job.running()
                   or any(p.poll() not in (None, 0) for p in job.procs),
                   timeout, "the job's ranks to end")
    finally:
        job.stop()
    outs = job.outputs()
    codes = [p.returncode for p in job.procs]
    if codes == [0, 0]:
        return [json.loads(next(x for x in out.splitlines()
                                if x.startswith("RESULT "))[7:]) for out, _ in outs]
    raise RuntimeError(f"ranks exited {codes}: {outs}")


def main() -> None:
    # a hung rank prints where it hangs and exits before `launch` gives up on it
    faulthandler.dump_traceback_later(150, exit=True)
    spec = json.loads(sys.argv[1])
    dist.init_process_group("gloo")
    out = {"default": train(spec, hooked=False, attach=False),
           "plain": train(spec, hooked=True, attach=False),
           "zerodoc": train(spec, hooked=True, attach=True)}
    dist.barrier()
    dist.destroy_process_group()
    print("RESULT", json.dumps(out), flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()
