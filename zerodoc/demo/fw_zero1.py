"""Demo builders: DDP + `ZeroRedundancyOptimizer` (ZeRO-1), and plain DDP (stage 0).

The demo transformer is replicated whole (`cfg.wrap` does not apply: nothing is wrapped).
Spec keys read here (optional): "zero1": {"parameters_as_bucket_view": bool,
"bucket_cap_mb": float}.
"""

from __future__ import annotations

import torch

from .frameworks import Built, standard
from .transformer import TinyTransformer


def _ddp(cfg, spec: dict):
    from torch.nn.parallel import DistributedDataParallel as DDP

    opts = spec.get("zero1", {})
    torch.manual_seed(cfg.seed)
    kw = {}
    if "bucket_cap_mb" in opts:
        kw["bucket_cap_mb"] = float(opts["bucket_cap_mb"])
    return DDP(TinyTransformer(cfg), **kw)


def _built(model, opt) -> Built:
    return standard(model, opt)


def build(cfg, spec: dict) -> Built:
    """ZeRO-1: AdamW state sharded over the ranks; parameters broadcast after each step."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    model = _ddp(cfg, spec)
    opt = ZeroRedundancyOptimizer(
        model.parameters(), optimizer_class=torch.optim.AdamW, lr=spec.get("lr", 1e-3),
        parameters_as_bucket_view=bool(spec.get("zero1", {}).get("parameters_as_bucket_view",
                                                                False)))
    return _built(model, opt)


def build_ddp(cfg, spec: dict) -> Built:
    """Plain data parallel: every rank holds everything, gradients all-reduced."""
    model = _ddp(cfg, spec)
    return _built(model, torch.optim.AdamW(model.parameters(), lr=spec.get("lr", 1e-3)))
