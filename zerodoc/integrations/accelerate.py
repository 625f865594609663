"""Hugging Face Accelerate: attach zerodoc to what ``accelerator.prepare(...)`` returned.

    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    monitor = zerodoc.integrations.accelerate.attach(accelerator)
    for batch in loader:
        ...; accelerator.backward(loss); optimizer.step(); optimizer.zero_grad()
    monitor.close()                       # or: with attach(accelerator): ...

With the FSDP plugin (``fsdp_version=2``) the prepared model *is* the ``fully_shard``-ed
model and each wrapped layer is a unit; with DDP it is the ``DistributedDataParallel``
wrapper; with the DeepSpeed plugin the engine. The optimizer Accelerate returns is an
``AcceleratedOptimizer`` wrapper: zerodoc hooks the step of the optimizer inside it, which is
called once per real optimizer step (not on gradient-accumulation micro-batches; not when a
fp16 ``GradScaler`` skips a step).

Nothing here imports ``accelerate``: the prepared objects are found on the ``Accelerator``
instance given (its ``_models`` / ``_optimizers`` lists, what ``prepare`` filled), or passed
explicitly.
"""

from __future__ import annotations

from .common import attach_prepared

__all__ = ["attach", "prepared_model", "prepared_optimizer"]


def _prepared(accelerator, attr: str) -> list:
    found = getattr(accelerator, attr, None)
    return list(found) if isinstance(found, (list, tuple)) else []


def prepared_model(accelerator, model=None):
    """The model as ``accelerator.prepare`` returned it.

    ``model`` may be the prepared model or the user's original one (which Accelerate may have
    wrapped, e.g. in DDP): the prepared wrapper around it is returned. With no model, the
    one model ``prepare`` saw (the first, if several).
    """
    models = _prepared(accelerator, "_models")
    if model is None:
        if not models:
            raise ValueError("zerodoc: no prepared model on this Accelerator; call "
                             "accelerator.prepare(model, ...) first or pass model=")
        return models[0]
    if any(m is model for m in models):
        return model
    unwrap = getattr(accelerator, "unwrap_model", None)
    for m in models:
        try:
            if unwrap is not None and unwrap(m) is model:
                return m
        except Exception:
            continue
    return model


def prepared_optimizer(accelerator, optimizer=None):
    """The optimizer ``prepare`` returned (the first if several), or ``optimizer``."""
    if optimizer is not None:
        return optimizer
    optimizers = _prepared(accelerator, "_optimizers")
    return optimizers[0] if optimizers else None


def attach(accelerator, model=None, optimizer=None, **options):
    """``zerodoc.attach()`` on the model and optimizer ``accelerator.prepare`` returned.

    Args:
        accelerator: the ``accelerate.Accelerator`` after ``prepare(...)``.
        model, optimizer: optional; default to what ``prepare`` returned (the first of each).
            Pass them to choose among several; an original, unprepared model is mapped to
            its prepared wrapper.
        options: ``zerodoc.attach()`` keywords (``run_dir=``, ``port=``, ...).

    Returns the monitor (a context manager). A step ends at each real optimizer step; with no
    optimizer, call ``monitor.step()`` at the end of each step.
    """
    if accelerator is None:
        raise TypeError("zerodoc: attach() needs the Accelerator (after prepare)")
    return attach_prepared(prepared_model(accelerator, model),
                           prepared_optimizer(accelerator, optimizer), **options)
