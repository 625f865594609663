"""Demo builders: FSDP1 (`FullyShardedDataParallel`) with each sharding strategy.

The demo transformer is wrapped by an auto-wrap policy as `cfg.wrap` says (block: each
`Block` its own FSDP unit + the root; linear: every `nn.Linear`; root: the root only), on
CPU (`device_id=cpu`, gloo). Spec keys read here (all optional):
- "fsdp1": {"backward_prefetch": "BACKWARD_PRE" | "BACKWARD_POST" | None,
  "limit_all_gathers": bool, "forward_prefetch": bool, "hybrid_zero2": bool};
- "hsdp_replicas": replicate groups for `fsdp1-hybrid` (default 2 when the world size is
  an even number >= 4, else 1).
`cfg.prefetch` turns on FSDP1's `forward_prefetch`.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from .frameworks import Built, standard
from .transformer import Block, TinyTransformer


def _policy(wrap: str):
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    if wrap == "block":
        return ModuleWrapPolicy({Block})
    if wrap == "linear":
        return ModuleWrapPolicy({nn.Linear})
    return None  # root: one unit


def _hybrid_mesh(spec: dict):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    ws = dist.get_world_size()
    replicas = int(spec.get("hsdp_replicas", 1))
    if replicas <= 1:
        replicas = 2 if ws >= 4 and ws % 2 == 0 else 1
    if ws % replicas:
        raise ValueError(f"world size {ws} is not a multiple of hsdp_replicas={replicas}")
    return init_device_mesh("cpu", (replicas, ws // replicas),
                            mesh_dim_names=("replicate", "shard"))


def build(cfg, spec: dict, strategy: str = "FULL_SHARD") -> Built:
    from torch.distributed.fsdp import BackwardPrefetch, ShardingStrategy
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    opts = dict(spec.get("fsdp1", {}))
    kw = {}
    if strategy == "HYBRID_SHARD":
        if opts.get("hybrid_zero2"):
            strategy = "_HYBRID_SHARD_ZERO2"
        kw["device_mesh"] = _hybrid_mesh(spec)
    bp = opts.get("backward_prefetch", "BACKWARD_PRE")
    torch.manual_seed(cfg.seed)
    model = FSDP(
        TinyTransformer(cfg),
        sharding_strategy=ShardingStrategy[strategy],
        auto_wrap_policy=_policy(cfg.wrap),
        device_id=torch.device("cpu"),
        backward_prefetch=BackwardPrefetch[bp] if bp else None,
        forward_prefetch=bool(opts.get("forward_prefetch", cfg.prefetch)),
        limit_all_gathers=bool(opts.get("limit_all_gathers", True)),
        **kw,
    )
    opt = torch.optim.AdamW(model.parameters(), lr=spec.get("lr", 1e-3))
    return standard(model, opt)


def build_full_shard(cfg, spec: dict) -> Built:
    """ZeRO-3: parameters gathered for forward, freed, gathered again for backward."""
    return build(cfg, spec, "FULL_SHARD")


def build_shard_grad_op(cfg, spec: dict) -> Built:
    """ZeRO-2: parameters kept gathered from forward to backward."""
    return build(cfg, spec, "SHARD_GRAD_OP")


def build_no_shard(cfg, spec: dict) -> Built:
    """Plain data parallel (DDP-like all-reduce of gradients)."""
    return build(cfg, spec, "NO_SHARD")


def build_hybrid(cfg, spec: dict) -> Built:
    """HSDP: FULL_SHARD within a shard group, all-reduce across replicate groups."""
    return build(cfg, spec, "HYBRID_SHARD")
