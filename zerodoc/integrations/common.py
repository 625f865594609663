"""What every trainer integration shares: find the optimizer that really steps, attach, close.

Standard library only at import time; torch and zerodoc's shim are imported by `attach()`.
"""

from __future__ import annotations

import os
import time
import warnings

# Framework wrappers around a torch optimizer: (module prefix of the wrapper's class, the
# attribute holding the wrapped optimizer). The wrapper's own step() calls the inner one's,
# and only the inner one runs torch's step hooks (the wrappers do not call
# Optimizer.__init__, so their step() is never patched with hooks).
_OPTIMIZER_WRAPPERS = (
    ("accelerate.", "optimizer"),          # AcceleratedOptimizer (and DeepSpeed's wrapper)
    ("lightning.", "_optimizer"),          # LightningOptimizer (lightning.pytorch)
    ("pytorch_lightning.", "_optimizer"),  # LightningOptimizer (standalone package)
)


def unwrap_optimizer(optimizer):
    """The torch optimizer under framework wrappers (Accelerate, Lightning); else itself."""
    seen: set[int] = set()
    while optimizer is not None and id(optimizer) not in seen:
        seen.add(id(optimizer))
        module = type(optimizer).__module__ or ""
        inner = None
        for prefix, attr in _OPTIMIZER_WRAPPERS:
            if module.startswith(prefix):
                inner = getattr(optimizer, attr, None)
                break
        if inner is None:
            return optimizer
        optimizer = inner
    return optimizer


def is_deepspeed_engine(model) -> bool:
    """A DeepSpeed engine (Accelerate / Trainer with a DeepSpeed plugin): attach() wants the
    engine alone, it finds the ZeRO optimizer and the step boundary itself."""
    return any(c.__name__ == "DeepSpeedEngine" and c.__module__.startswith("deepspeed.")
               for c in type(model).__mro__)


def attach_prepared(model, optimizer, **options):
    """`zerodoc.attach()` on what a framework prepared (its optimizer unwrapped)."""
    import zerodoc

    if is_deepspeed_engine(model):
        optimizer = None
    else:
        optimizer = unwrap_optimizer(optimizer)
    return zerodoc.attach(model, optimizer, **options)


def record_exception(monitor, integration: str, exc: BaseException | None) -> None:
    """Append an `exception` record to the run log (what ended the run), never raising."""
    writer = getattr(monitor, "_writer", None)
    if writer is None or exc is None or isinstance(exc, KeyboardInterrupt):  # a user stop
        return
    try:
        writer.write({"type": "exception", "end_unix": time.time(),
                      "step": getattr(monitor, "step_index", None),
                      "integration": integration, "error": type(exc).__name__,
                      "message": str(exc)[:500]})
    except Exception:  # the run log is best effort here; close() still runs
        pass


def close(monitor, integration: str, exc: BaseException | None = None) -> None:
    """Close `monitor` (records `exc` first when training ended with an exception; a
    KeyboardInterrupt is the user stopping the run: a clean close marked "interrupted")."""
    if monitor is None:
        return
    try:
        record_exception(monitor, integration, exc)
        monitor.close(interrupted=isinstance(exc, KeyboardInterrupt))
    except Exception as e:  # never into the training job
        warnings.warn(f"zerodoc: closing the monitor failed ({e!r})", stacklevel=2)


def world_size() -> int:
    try:
        import torch.distributed as dist

        return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    except Exception:
        return 1


# Accelerate sets this when it is given an FSDP plugin (the HF Trainer gives it one for
# `TrainingArguments(fsdp=...)`) or when `accelerate launch` runs an FSDP config
# (accelerate/accelerator.py, Accelerator.__init__). On CPU it then drops the plugin and
# prepare() wraps DDP, silently (accelerate/state.py: FSDP only for accelerator devices).
ACCELERATE_FSDP_ENV = "ACCELERATE_USE_FSDP"


def fsdp_requested(environ=None) -> str | None:
    """Why this process was asked to run FSDP (a short reason), or None. Checked by the DDP
    adapter: a DDP model in a process asked for FSDP is a fallback with no sharding."""
    env = os.environ if environ is None else environ
    if str(env.get(ACCELERATE_FSDP_ENV, "")).lower() == "true":
        return (f"{ACCELERATE_FSDP_ENV}=true: Accelerate or the HF Trainer was given an FSDP "
                "plugin or config and prepared DDP instead, as it does without a GPU")
    return None
