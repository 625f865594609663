"""How the demo job is built for each sharding stack: name -> builder.

A builder takes the DemoConfig and returns a `Built`: what to give `zerodoc.attach()` and a
`train_step(x, y) -> loss` closure. One module per stack (`fw_*.py`), listed in BUILDERS.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# framework name -> "module:function"
BUILDERS: dict[str, str] = {
    "fsdp2": "zerodoc.demo.fw_fsdp2:build",
}


@dataclass
class Built:
    target: Any  # what zerodoc.attach() is given (a model or an engine)
    optimizer: Any  # the optimizer given to attach() (None: the adapter finds it)
    train_step: Callable[[Any, Any], float]  # forward + backward + optimizer step -> loss
    model: Any  # the nn.Module (for checks)


def names() -> list[str]:
    return list(BUILDERS)


def build(framework: str, cfg, spec: dict) -> Built:
    if framework not in BUILDERS:
        raise ValueError(f"unknown framework {framework!r}; known: {', '.join(BUILDERS)}")
    mod, _, fn = BUILDERS[framework].partition(":")
    return getattr(importlib.import_module(mod), fn)(cfg, spec)
