"""Framework adapters: one per sharding stack, chosen by `detect()`.

An adapter finds the sharded units of what `attach()` was given, installs the per-unit
instrumentation (feeding the shared `Recorder` through a timer), and states the static facts
(framework, equivalent ZeRO stage, mesh, dtypes, per-unit sizes). The monitor does the rest:
step boundaries, totals, run log, exporter. Adding a stack = one module with an `Adapter`
subclass + one line in `ADAPTERS`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

from ..runmodel import UnitFacts
from . import hookpoints as hp


@dataclass
class AdapterFacts:
    framework: str
    framework_version: str
    units: list[UnitFacts]
    zero_stage: int | None = None
    mesh_shape: tuple[int, ...] = ()
    mesh_dim_names: tuple[str, ...] | None = None
    param_dtype: str = ""
    reduce_dtype: str = ""
    extra: dict[str, Any] = field(default_factory=dict)  # framework-specific facts


class Adapter:
    """Base: no sharding framework recognised (step time and memory only)."""

    framework = "none"

    def __init__(self, model, optimizer, registry: hp.HookRegistry):
        self.model = model
        self.optimizer = optimizer
        self.registry = registry
        self.unit_names: list[str] = []

    @classmethod
    def detect(cls, model, optimizer) -> bool:
        return True

    def discover(self) -> None:
        """Find the units (fills `unit_names`); called before the Recorder exists."""

    def facts(self) -> AdapterFacts:
        from .wiring import torch_version

        return AdapterFacts(framework=self.framework, framework_version=torch_version(),
                            units=[])

    def instrument(self, rec, timer, on_root_forward, slow_link_s: float) -> list:
        """Install instrumentation; return undo callables."""
        return []

    def plan(self, rec, timer, on_root_forward, slow_link_s: float):
        """The per-unit instrumentation built once (a `detailplan.DetailPlan`) that the
        monitor installs at each detail step's start and removes at its end, instead of
        `instrument()` (which builds it anew each time). None: this adapter has none; the
        monitor calls `instrument()`."""
        return None

    def install_always(self, rec, timer) -> list:
        """Instrumentation that stays for the whole run (installed once at attach, before
        the first backward), idle outside detail steps; return undo callables. Most
        adapters have none: all of theirs is per-unit and comes and goes with `instrument`."""
        return []

    def step_optimizer(self):
        """The object whose step() marks step boundaries (a torch Optimizer) or None."""
        return self.optimizer

    def memory_module(self):
        """The module whose parameters are this rank's (sharded) parameters."""
        return self.model


# Checked in order; the first whose detect() is true wins. The base Adapter is last.
ADAPTERS: list[str] = [
    "zerodoc.shim.deepspeed:DeepSpeedAdapter",
    "zerodoc.shim.fsdp1:FSDP1Adapter",
    "zerodoc.shim.zero1:Zero1Adapter",
    "zerodoc.shim.zero1:DDPAdapter",
    "zerodoc.shim.fsdp2:FSDP2Adapter",
]


def detect(model, optimizer, registry: hp.HookRegistry) -> Adapter:
    for path in ADAPTERS:
        mod, _, name = path.partition(":")
        try:
            cls = getattr(importlib.import_module(mod), name)
        except Exception as e:  # an adapter whose framework is not importable
            registry.missing(path, repr(e))
            continue
        try:
            if cls.detect(model, optimizer):
                return cls(model, optimizer, registry)
        except Exception as e:
            registry.error(f"detect {name}", e)
    return Adapter(model, optimizer, registry)
