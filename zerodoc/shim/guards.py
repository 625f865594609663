"""The guardrails of `attach()`: the mistakes users make, said once, clearly, at attach time.

- Bad arguments raise (TypeError, naming what is wrong): no model, the arguments swapped,
  something that is not a module or an optimizer. Option types are checked by
  `zerodoc.shim.config.AttachConfig`.
- One monitor per process: attaching the same model again returns the monitor already
  attached (with a warning); attaching another model while one is attached is refused (a
  no-op monitor, with a warning). Two monitors would write the same rank log twice.
- Nothing sharded found: the message says to call attach after fully_shard / FSDP(...) /
  deepspeed.initialize, and at the first step end the monitor looks again, so a model that
  was sharded after attach() is named as such.
- An optimizer holding none of the model's trainable parameters (built before fully_shard /
  FSDP replaced them): the model is not being trained; said once.
- The start-up line on rank 0: run directory, /metrics address, and what was found.
- A run directory that cannot be written is the user's configuration: one warning per node,
  not an internal error.

Warnings are given on rank 0 (per node for node-local problems), so a 1,024-rank job prints
each one once, not 1,024 times.
"""

from __future__ import annotations

import sys
import warnings

ATTACH_AFTER = "call zerodoc.attach() after fully_shard(...) / FSDP(...) / deepspeed.initialize(...)"

# Monitors attached in this process and not closed yet (one is the rule).
_LIVE: list = []


# --- arguments -------------------------------------------------------------------------------

def _is_optimizer(obj) -> bool:
    from torch.optim import Optimizer

    return isinstance(obj, Optimizer) or (
        hasattr(obj, "param_groups") and callable(getattr(obj, "step", None)))


def check_arguments(model, optimizer) -> None:
    """Raise TypeError for arguments attach() cannot mean."""
    import torch.nn as nn

    usage = "zerodoc.attach(model, optimizer=None)"
    if model is None:
        raise TypeError(f"{usage}: model is None; pass the model after fully_shard(...) / "
                        "FSDP(...), or the engine deepspeed.initialize() returned")
    if not isinstance(model, nn.Module):
        if _is_optimizer(model):
            swapped = " (the arguments are swapped)" if isinstance(optimizer, nn.Module) \
                else ""
            raise TypeError(f"{usage}: the first argument is an optimizer "
                            f"({type(model).__name__}){swapped}; the model comes first")
        raise TypeError(f"{usage}: model must be a torch.nn.Module (the sharded model or a "
                        f"DeepSpeed engine), not {type(model).__name__}")
    if optimizer is None:
        return
    if isinstance(optimizer, nn.Module):
        raise TypeError(f"{usage}: optimizer is a module ({type(optimizer).__name__}); pass "
                        "the optimizer whose step() ends a training step, or None")
    if not callable(getattr(optimizer, "step", None)):
        raise TypeError(f"{usage}: optimizer must have a step() method (a torch optimizer), "
                        f"not {type(optimizer).__name__}")


class NullMonitor:
    """What attach() returns when disabled or when it could not attach: does nothing."""

    endpoint = None
    run_dir = None

    def __init__(self, reason: str = ""):
        self.reason = reason

    def step(self) -> None:
        pass

    def close(self, interrupted: bool = False) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# --- one monitor per process -----------------------------------------------------------------

def existing_monitor(model, optimizer, stacklevel: int = 3):
    """None when nothing is attached in this process. Otherwise the monitor to return instead
    of attaching again: the live one for the same model (reuse), or a no-op monitor (refuse)."""
    if not _LIVE:
        return None
    for mon in _LIVE:
        if mon.model is model:
            warnings.warn(
                f"zerodoc.attach(): this {type(model).__name__} is already attached (run log "
                f"{mon.run_dir}); returning the monitor already attached. Call close() on it "
                "before attaching again.", stacklevel=stacklevel)
            return mon
    mon = _LIVE[0]
    why = (f"a monitor is already attached in this process (to a "
           f"{type(mon.model).__name__}, run log {mon.run_dir}); one monitor per process")
    warnings.warn(f"zerodoc.attach(): {why}: this call does nothing. close() the first "
                  "monitor before attaching another model.", stacklevel=stacklevel)
    return NullMonitor(why)


def register(mon) -> None:
    _LIVE.append(mon)


def unregister(mon) -> None:
    try:
        _LIVE.remove(mon)
    except ValueError:
        pass


# --- what was found ----------------------------------------------------------------------------

def problem(kind: str, message: str, fix: str) -> dict:
    """An attach-time problem as the run log header keeps it (`config["attach_warnings"]`;
    the report lists it, `zerodoc.diagnosis.coverage`)."""
    return {"kind": kind, "message": message, "fix": fix}


def no_units_message(model) -> str:
    return (f"zerodoc: no sharded units found in {type(model).__name__}: {ATTACH_AFTER}. "
            "Only step time and memory are measured.")


def sharded_after_attach(mon) -> str | None:
    """At the first step end of a monitor that found no units: is the model sharded now?
    Returns the message to warn with, or None."""
    from . import adapters, hookpoints as hp

    try:
        found = adapters.detect(mon.model, mon.optimizer, hp.HookRegistry())
    except Exception:  # noqa: BLE001 - a best-effort hint, never into the job
        return None
    if found.framework == "none":
        return None
    return (f"zerodoc: the model was sharded after attach() ({found.framework} units appeared "
            f"at the first step); zerodoc measures no collectives for this run: {ATTACH_AFTER}.")


OPTIMIZER_FIX = "create the optimizer after fully_shard(...) / FSDP(...), from model.parameters()"


def optimizer_problem(model, optimizer, framework: str) -> str | None:
    """A message when a torch optimizer holds none of the model's trainable parameters."""
    if optimizer is None or framework == "deepspeed" or not _is_optimizer(optimizer):
        return None
    try:
        held = {id(p) for g in optimizer.param_groups for p in g.get("params", ())}
        trainable = [p for p in model.parameters() if p.requires_grad]
    except Exception:  # noqa: BLE001 - an exotic optimizer: no opinion
        return None
    if not held or not trainable or any(id(p) in held for p in trainable):
        return None
    return (f"zerodoc: the optimizer ({type(optimizer).__name__}) holds none of the model's "
            f"{len(trainable)} trainable parameters, so optimizer.step() does not update this "
            "model. It was probably created before fully_shard(...) / FSDP(...), which replace "
            "the parameters: create the optimizer after sharding.")


# Wrapper attributes that are not part of the user's own module paths.
_WRAPPER_SEGMENTS = ("_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_orig_mod")


def block_container(model) -> str | None:
    """The attribute path of the model's repeated blocks ("blocks", "model.layers",
    "transformer.h"): the module whose direct children include the most parameters held by
    >= 2 children of one class. What a wrap fix should name (`for block in model.<path>`);
    "" when the model itself is the sequence of blocks, None when it has no repeated blocks."""
    import torch.nn as nn

    root = model
    while isinstance(getattr(root, "module", None), nn.Module):  # DDP, DeepSpeed, FSDP1
        root = root.module
    best, best_params = None, 0
    for name, mod in root.named_modules():
        kids = list(mod.named_children())
        by_class: dict[type, list] = {}
        for _n, child in kids:
            by_class.setdefault(type(child), []).append(child)
        for cls, same in by_class.items():
            if len(same) < 2:
                continue
            n = sum(p.numel() for c in same for p in c.parameters())
            if n > best_params:
                best, best_params = name, n
    if best is None:
        return None
    return ".".join(p for p in best.split(".") if p and p not in _WRAPPER_SEGMENTS)


def startup_line(mon, problems: list[str]) -> str:
    """One line: where the numbers go and what was found."""
    f = mon.facts
    where = f"rank {mon.rank} of {mon.world_size}"
    if mon.unit_names:
        stage = f", ZeRO-{f.zero_stage}-like" if f.zero_stage is not None else ""
        found = (f"{f.framework} {f.framework_version}: {len(mon.unit_names)} sharded "
                 f"unit{'s' if len(mon.unit_names) != 1 else ''}{stage}")
    elif f.framework != "none":
        found = f"{f.framework} {f.framework_version}: no per-unit collectives"
    else:
        found = "no sharded units (see the warning)"
    out = [f"zerodoc: attached on {where}: {found}"]
    off = getattr(mon._writer, "off", None)
    out.append("no run log" if mon._writer is None else
               f"no run log ({mon.run_dir}: refused, see the warning)" if off else
               f"run log {mon.run_dir}")
    if mon.endpoint:
        port = mon.endpoint.rpartition(":")[2]
        scheme = getattr(mon._server, "scheme", "http")  # https when TLS is on
        out.append(f"/metrics on {scheme}://{mon.endpoint}/metrics"
                   + (" (each rank: base port + LOCAL_RANK)" if mon.local_world_size > 1
                      and mon.cfg.port else f" (port {port})" if not mon.cfg.port else ""))
    elif mon.cfg.port is False:
        out.append("no /metrics server (port=False)")
    else:
        out.append("no /metrics server (see the warning)")
    return " · ".join(out)


def say(line: str) -> None:
    """Print a start-up line on stderr; never raises."""
    try:
        print(line, file=sys.stderr, flush=True)
    except Exception:  # noqa: BLE001 - a closed stderr must not stop the job
        pass


def uncaught_exception() -> BaseException | None:
    """At interpreter exit: the exception that ended the main program, if one did."""
    return getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
