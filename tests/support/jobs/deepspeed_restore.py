"""close() gives DeepSpeed back its own methods; a renamed private method is reported.

    python tests/support/jobs/deepspeed_restore.py MASTER_PORT RUN_DIR

One gloo rank. For ZeRO-3, ZeRO-2 with CPU offload, and ZeRO-3 with the private methods
zerodoc patches renamed: attach, train two steps, close, train on, and check that every hook,
backend method, engine/optimizer attribute and coordinator method is DeepSpeed's own again.
Prints `<framework> restored` for each; any failed check is an AssertionError (exit 1).
Used by tests/test_deepspeed.py.
"""

import os
import sys

os.environ.update(DS_ACCELERATOR="cpu", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0",
                  MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])

import torch.distributed as dist  # noqa: E402

import zerodoc  # noqa: E402
from zerodoc.demo import frameworks  # noqa: E402
from zerodoc.demo.transformer import DemoConfig, batch  # noqa: E402

RENAMED_MISSING = {"PartitionedParameterCoordinator.__all_gather_params_",
                   "DeepSpeedZeroOptimizer_Stage3.__reduce_and_partition_ipg_grads"}
BACKEND = ("all_gather_into_tensor", "all_reduce", "reduce_scatter_tensor", "broadcast")
ENGINE_METHODS = ("step", "backward", "call", "reduce_ipg_grads", "copy_grads_in_partition")


def check(fw: str, cfg: DemoConfig, run_dir: str) -> None:
    import deepspeed.comm.comm as dcomm

    import zerodoc.shim.deepspeed as zds

    if fw.endswith("renamed"):  # a DeepSpeed whose private methods were renamed
        zds._COORD, zds._STAGE3 = "_Gone", "_Gone"
    built = frameworks.build(fw.replace("-renamed", ""), cfg, {})
    eng = built.target

    def hooks() -> int:
        return sum(len(m._forward_pre_hooks) + len(m._forward_hooks)
                   for m in eng.module.modules())

    before = hooks()
    mon = zerodoc.attach(eng, run_dir=run_dir + "/" + fw, port=False)
    assert type(mon).__name__ == "Monitor", mon
    for i in range(2):
        built.train_step(*batch(cfg, i, 0))
    assert mon.step_index == 2, mon.step_index
    missing = {h for h, v in mon.registry.status.items() if v != "ok"}
    if fw.endswith("renamed"):  # reported, and the rest still works
        assert missing == RENAMED_MISSING, mon.registry.status
        assert mon.totals.compute, mon.totals.compute
    else:
        assert not missing, mon.registry.status
    mon.close()
    built.train_step(*batch(cfg, 2, 0))
    assert hooks() == before, (hooks(), before)
    shadowed = [n for n in BACKEND if n in vars(dcomm.cdb)]
    assert not shadowed, shadowed
    for obj in (eng, eng.optimizer):
        left = [k for k, v in vars(obj).items()
                if callable(v) and getattr(v, "__name__", "") in ENGINE_METHODS]
        assert not left, left
    if hasattr(eng.optimizer, "parameter_offload"):
        coord = eng.optimizer.parameter_offload.get_param_coordinator()
        left = [k for k in vars(coord) if "fetch_sub_module" in k or "release_sub_module" in k
                or k.endswith("__all_gather_params_")]
        assert not left, left
    print(fw, "restored", flush=True)


def main() -> None:
    dist.init_process_group("gloo")
    cfg = DemoConfig(blocks=2, hidden=64, heads=2, vocab=128, seq=16, batch=2)
    for fw in ("deepspeed-3", "deepspeed-2-offload", "deepspeed-3-renamed"):
        check(fw, cfg, sys.argv[2])
    dist.destroy_process_group()
    os._exit(0)


if __name__ == "__main__":
    main()
