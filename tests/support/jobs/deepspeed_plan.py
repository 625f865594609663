"""DeepSpeed's per-unit instrumentation is a plan (issue 19): built once, put in place and
taken out at each detail step.

    python tests/support/jobs/deepspeed_plan.py MASTER_PORT RUN_DIR

One gloo rank. For ZeRO-3, ZeRO-2 with CPU offload and ZeRO-1: the losses of 16 steps
without zerodoc; then attached with K = 2, twice: with the adapter's plan, and with the plan
withheld (every detail step registers afresh through `instrument()`, the witness). Per step:
whether it is a detail step, the forward hooks of every module, and which methods are shadowed
on DeepSpeed's backend, engine, optimizer and parameter coordinator. Checked: one plan for the
whole run; on every detail step the same hooks and shadowed methods as the fresh
registration's; on every other step those of the model without zerodoc (but for the
optimizer's `step`, wrapped for the whole run), after close exactly those; every detail step
measured and no other; the losses bitwise the plain run's.
Prints `<framework> plan ok` for each; any failed check is an AssertionError (exit 1).
Used by tests/test_deepspeed.py.
"""

import json
import os
import sys

os.environ.update(DS_ACCELERATOR="cpu", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0",
                  MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])

import torch.distributed as dist  # noqa: E402

import zerodoc  # noqa: E402
from zerodoc.demo import frameworks  # noqa: E402
from zerodoc.demo.transformer import DemoConfig, batch  # noqa: E402
from zerodoc.runlog.writer import DETAIL_DIR, detail_names  # noqa: E402

STEPS = 16


def state(eng) -> tuple:
    """The forward hooks of every module and the methods shadowed on DeepSpeed's objects."""
    import deepspeed.comm.comm as dcomm

    def name(fn):
        return getattr(fn, "__qualname__", repr(fn)).replace(".<locals>", "")
    hooks = tuple((tuple(name(f) for f in m._forward_pre_hooks.values()),
                   tuple(name(f) for f in m._forward_hooks.values()))
                  for m in eng.module.modules())
    objs = [dcomm.cdb, eng, eng.optimizer]
    if hasattr(eng.optimizer, "parameter_offload"):
        objs.append(eng.optimizer.parameter_offload.get_param_coordinator())
    shadowed = tuple(tuple(sorted(k for k, v in vars(o).items()
                                  if callable(v) and "zerodoc" in getattr(v, "__module__", "")))
                     for o in objs)
    return hooks, shadowed


def run(fw: str, cfg: DemoConfig, run_dir: str | None, plan: bool = True):
    import zerodoc.shim.deepspeed as zds

    built = frameworks.build(fw, cfg, {})
    eng = built.target
    bare = state(eng)
    saved = zds.DeepSpeedAdapter.plan
    if not plan:
        zds.DeepSpeedAdapter.plan = lambda self, *a: None
    try:
        mon = zerodoc.attach(eng, run_dir=run_dir, port=False, detail=2, stall_after_s=0) \
            if run_dir else None
        losses, seen, plans = [], [], set()
        for i in range(STEPS):
            if mon is not None:
                plans.add(id(mon._plan) if mon._plan is not None else None)
                seen.append((mon._detail_on, state(eng)))
            losses.append(built.train_step(*batch(cfg, i, 0)))
        if mon is not None:
            mon.close()
    finally:
        zds.DeepSpeedAdapter.plan = saved
    return losses, seen, plans, bare, state(eng)


def detail_steps(run_dir: str) -> dict:
    out = {}
    for name in detail_names(0):
        p = os.path.join(run_dir, DETAIL_DIR, name)
        if os.path.exists(p):
            for r in map(json.loads, open(p)):
                if r.get("type") == "step":
                    out[r["step"]] = r
    return out


def check(fw: str, cfg: DemoConfig, run_dir: str) -> None:
    plain, *_ = run(fw, cfg, None)
    losses, seen, plans, bare, after = run(fw, cfg, f"{run_dir}/{fw}")
    assert losses == plain, (losses, plain)  # bitwise
    assert len(plans - {None}) == 1, plans  # built once
    on = [s for d, s in seen if d]
    off = [s for d, s in seen[1:] if not d]  # (step 1: the monitor's own root hook)
    assert len(on) >= 2 and len(off) >= 2, [d for d, _s in seen]
    # outside detail steps: the model's own hooks, and of zerodoc only the step boundary
    # (the optimizer's `step`, wrapped for the whole run)
    idle = off[0]
    assert idle[0] == bare[0], "hooks left in place outside a detail step"
    extra = {n for a, b in zip(idle[1], bare[1]) for n in set(a) - set(b)}
    assert extra <= {"step"}, extra
    assert all(s == idle for s in off), "left in place outside a detail step"
    assert after == bare, "left in place after close"
    assert len(set(on)) == 1 and on[0] != bare, "not the same each install"
    f_losses, f_seen, f_plans, _b, _a = run(fw, cfg, f"{run_dir}/{fw}-fresh", plan=False)
    assert f_plans == {None} and f_losses == plain
    fresh = [s for d, s in f_seen if d]
    assert fresh and all(s == on[0] for s in fresh), "not what a fresh registration puts"
    assert all(s == idle for d, s in f_seen[1:] if not d)
    recs = detail_steps(f"{run_dir}/{fw}")
    detail = [r for r in recs.values() if r["detail"]]
    assert len(detail) >= 2
    for r in recs.values():
        if r["detail"]:
            assert r["compute"] and r["comm"], r["step"]
        else:
            assert r["compute"] == [] and r["comm"] == [], r["step"]
    print(fw, "plan ok", flush=True)


def main() -> None:
    dist.init_process_group("gloo")
    cfg = DemoConfig(blocks=2, hidden=64, heads=2, vocab=128, seq=16, batch=2)
    for fw in ("deepspeed-3", "deepspeed-2-offload", "deepspeed-1"):
        check(fw, cfg, sys.argv[2])
    dist.destroy_process_group()
    os._exit(0)


if __name__ == "__main__":
    main()
