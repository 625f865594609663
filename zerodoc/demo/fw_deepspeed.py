"""Demo builders: DeepSpeed ZeRO stages 1, 2, 3 (2 and 3 also with the optimizer on the host).

Runs on CPU with `DS_ACCELERATOR=cpu` on the gloo group the worker already created. The
optimizer is a plain `torch.optim.AdamW` handed to `deepspeed.initialize`: DeepSpeed's own
Adam (fused / CPU Adam) would be compiled with g++ on first use (~3 min on 2 cores); its
communication op (`deepspeed_shm_comm`, ~45 s) is compiled once per machine into
`$TORCH_EXTENSIONS_DIR` (default ~/.cache/torch_extensions) whatever we do.

The demo's knobs map onto DeepSpeed's:
- `wrap` (stage 3): "block" makes each transformer block a `set_z3_leaf_modules` leaf (one
  fetch per block, like FSDP's per-block units); "linear" is DeepSpeed's default (one fetch
  per module owning parameters: too fine); "root" makes the whole model one leaf (too coarse).
- `reshard_after_forward` (stage 3): True -> `stage3_max_reuse_distance=0` (released after
  forward, gathered again in backward); False -> DeepSpeed's default reuse distance (kept).
- `prefetch` (stage 3): off -> `stage3_prefetch_bucket_size=0` (every fetch waits at once);
  on -> one block's parameters ahead.
- the demo sets `stage3_param_persistence_threshold=0` (every parameter sharded) and, for
  stages 1/2, a reduce bucket of about one block so gradients go in several buckets.
Anything in spec["ds_config"] is merged over this config (nested dicts merged).
"""

from __future__ import annotations

import os

from .frameworks import Built
from .transformer import Block, DemoConfig, TinyTransformer, loss_fn


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def ds_config(cfg: DemoConfig, stage: int, offload: bool, spec: dict) -> dict:
    block_numel = 12 * cfg.hidden * cfg.hidden + 13 * cfg.hidden  # one Block's parameters
    zero: dict = {"stage": stage, "reduce_bucket_size": block_numel,
                  "allgather_bucket_size": 5 * 10**8}
    if stage == 3:
        zero.update({
            "stage3_param_persistence_threshold": 0,
            "stage3_prefetch_bucket_size": block_numel if cfg.prefetch else 0,
            "stage3_max_reuse_distance": 0 if cfg.reshard_after_forward else 10**9,
        })
    if offload:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": False}
    conf = {
        "train_micro_batch_size_per_gpu": cfg.batch,
        "gradient_accumulation_steps": 1,
        "zero_optimization": zero,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
        # A client torch optimizer with offload: DeepSpeed would insist on its compiled
        # CPU Adam otherwise.
        "zero_force_ds_cpu_optimizer": False,
        "zero_allow_untested_optimizer": True,
    }
    return _merge(conf, spec.get("ds_config", {}))


def _build(cfg: DemoConfig, spec: dict, stage: int, offload: bool) -> Built:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import torch

    import deepspeed

    torch.manual_seed(cfg.seed)
    model = TinyTransformer(cfg)
    if stage == 3:
        from deepspeed.utils import set_z3_leaf_modules

        if cfg.wrap == "block":
            set_z3_leaf_modules(model, [Block])
        elif cfg.wrap == "root":
            set_z3_leaf_modules(model, [TinyTransformer])
    opt = torch.optim.AdamW(model.parameters(), lr=spec.get("lr", 1e-3))
    # The worker created the gloo group already: DeepSpeed adopts it.
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt,
                                           config=ds_config(cfg, stage, offload, spec))

    def train_step(x, y) -> float:
        loss = loss_fn(engine(x), y)
        engine.backward(loss)
        engine.step()
        return loss.item()

    return Built(target=engine, optimizer=None, train_step=train_step, model=engine.module)


def build_stage1(cfg, spec: dict) -> Built:
    return _build(cfg, spec, 1, False)


def build_stage2(cfg, spec: dict) -> Built:
    return _build(cfg, spec, 2, False)


def build_stage3(cfg, spec: dict) -> Built:
    return _build(cfg, spec, 3, False)


def build_stage2_offload(cfg, spec: dict) -> Built:
    return _build(cfg, spec, 2, True)


def build_stage3_offload(cfg, spec: dict) -> Built:
    return _build(cfg, spec, 3, True)
