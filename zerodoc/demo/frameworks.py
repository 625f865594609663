"""How the demo job is built for each sharding stack: name -> builder.

A builder takes the DemoConfig and returns a `Built`: what to give `zerodoc.attach()` and a
`train_step(x, y) -> loss` closure. One module per stack (`fw_*.py`), listed in BUILDERS.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import WRAPS  # noqa: F401  (the command line reads it here)

# framework name -> "module:function"
BUILDERS: dict[str, str] = {
    "fsdp2": "zerodoc.demo.fw_fsdp2:build",
    "deepspeed-1": "zerodoc.demo.fw_deepspeed:build_stage1",
    "deepspeed-2": "zerodoc.demo.fw_deepspeed:build_stage2",
    "deepspeed-3": "zerodoc.demo.fw_deepspeed:build_stage3",
    "deepspeed-2-offload": "zerodoc.demo.fw_deepspeed:build_stage2_offload",
    "deepspeed-3-offload": "zerodoc.demo.fw_deepspeed:build_stage3_offload",
    "fsdp1-full": "zerodoc.demo.fw_fsdp1:build_full_shard",
    "fsdp1-grad-op": "zerodoc.demo.fw_fsdp1:build_shard_grad_op",
    "fsdp1-no-shard": "zerodoc.demo.fw_fsdp1:build_no_shard",
    "fsdp1-hybrid": "zerodoc.demo.fw_fsdp1:build_hybrid",
    "zero1": "zerodoc.demo.fw_zero1:build",
    "ddp": "zerodoc.demo.fw_zero1:build_ddp",
}


@dataclass
class Built:
    target: Any  # what zerodoc.attach() is given (a model or an engine)
    optimizer: Any  # the optimizer given to attach() (None: the adapter finds it)
    train_step: Callable[[Any, Any], float]  # forward + backward + optimizer step -> loss
    model: Any  # the nn.Module (for checks)


def standard(model, opt) -> Built:
    """A plain torch loop: forward, loss, backward, optimizer step."""
    from .transformer import loss_fn

    def train_step(x, y) -> float:
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.item()

    return Built(target=model, optimizer=opt, train_step=train_step, model=model)


def names() -> list[str]:
    return list(BUILDERS)


def build(framework: str, cfg, spec: dict) -> Built:
    if framework not in BUILDERS:
        raise ValueError(f"unknown framework {framework!r}; known: {', '.join(BUILDERS)}")
    mod, _, fn = BUILDERS[framework].partition(":")
    return getattr(importlib.import_module(mod), fn)(cfg, spec)
