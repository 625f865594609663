"""The default mode from attach, on one adapter (issue 31): no detail option, no
$ZERODOC_DETAIL, no run_dir.

    python tests/support/jobs/default_mode.py FRAMEWORK MASTER_PORT   (in the run's folder)

One gloo rank. Checked: no per-unit instrumentation at attach (step 1 is warm-up, not
sampled); step 1's clock started by the root pre-hook, which is gone once step 1 ended; every
step a detail step exactly when the sampler says; the run directory ./zerodoc-runs/<job id>;
the header's job id and `config.sampling` (floor and cap); steps 2 and 3 with the same units'
compute and comm rows as the same model's steps 2 and 3 with detail on every step (step 1
instrumented at attach, as before), at least forward and backward of all units but one (a
root container such as DeepSpeed's has no compute of its own). Prints `<framework> default mode ok`; a failed check is an
AssertionError (exit 1). `check()` is also run in the test process (tests/test_schedule.py)
for the adapters that need no build step.
"""

import json
import os
import sys
from pathlib import Path


def _train(framework: str, **options):
    """Attach to a fresh model, train 6 steps (the default mode: the attach-time and per-step
    checks), close; (monitor, {step: its detail-file record})."""
    import torch

    import zerodoc
    from zerodoc.demo import frameworks
    from zerodoc.demo.transformer import DemoConfig, batch
    from zerodoc.runlog.writer import DETAIL_DIR, detail_names

    cfg = DemoConfig(blocks=3, hidden=32, heads=2, vocab=64, seq=8, batch=2)
    torch.manual_seed(0)
    built = frameworks.build(framework, cfg, {})
    mon = zerodoc.attach(built.target, built.optimizer, port=False, stall_after_s=0,
                         **options)
    try:
        assert mon.unit_names, mon.unit_names
        if not options:
            assert mon.sampler.mode == "adaptive"
            assert not mon._detail_on  # step 1: no per-unit instrumentation at attach
        for i in range(1, 7):
            assert mon._detail_on == mon.sampler.due(i), i
            x, y = batch(cfg, i, 0)
            built.train_step(x, y)
            if i == 1:
                assert mon._root_hook is None  # its only job done
    finally:
        mon.close()
    steps = {}
    for name in detail_names(0):
        p = Path(mon.run_dir) / DETAIL_DIR / name
        if p.exists():
            steps.update({r["step"]: r for r in map(json.loads, open(p))
                          if r.get("type") == "step"})
    assert sorted(steps) == list(range(1, 7)), sorted(steps)
    return mon, steps


def check(framework: str) -> None:
    mon, steps = _train(framework)
    run_dir = Path("zerodoc-runs") / mon.job_id
    assert Path(mon.run_dir).resolve() == run_dir.resolve(), (mon.run_dir, run_dir)
    head = json.loads(open(run_dir / "rank-00000.jsonl").readline())
    assert head["job_id"] == mon.job_id
    assert head["config"]["sampling"] == {"mode": "adaptive", "every": None, "budget": 0.002,
                                          "floor_s": 15.0, "cap": 0.01}, head["config"]
    assert steps[1]["detail"] is False and steps[1]["step_s"] > 0
    # the witness: the same model with detail on every step (step 1 instrumented at attach,
    # as the default did before): steps 2 and 3 have the same units' rows
    _mon, every = _train(framework, detail="every", run_dir="every")
    for i in (2, 3):
        assert steps[i]["detail"] is True and every[i]["detail"] is True
        got = {(u, p) for u, p, _s in steps[i]["compute"]}
        want = {(u, p) for u, p, _s in every[i]["compute"]}
        assert got == want and len(got) >= 2 * (len(mon.unit_names) - 1), (i, got, want)
        assert {tuple(r[:3]) for r in steps[i]["comm"]} == \
            {tuple(r[:3]) for r in every[i]["comm"]}, i


def main() -> None:
    framework, port = sys.argv[1], sys.argv[2]
    os.environ.update(DS_ACCELERATOR="cpu", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        check(framework)
    finally:
        dist.destroy_process_group()
    print(f"{framework} default mode ok", flush=True)


if __name__ == "__main__":
    main()
