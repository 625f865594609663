"""Hugging Face ``Trainer``: a ``TrainerCallback`` that attaches zerodoc when training begins.

    from zerodoc.integrations.hf import ZerodocCallback
    trainer = Trainer(model=model, args=args, train_dataset=ds)
    trainer.add_callback(ZerodocCallback(trainer))
    trainer.train()

``on_train_begin`` runs after the Trainer prepared the model and optimizer (Accelerate's
``prepare``): zerodoc gets the model as the Trainer wraps it (``trainer.model_wrapped``: the
``fully_shard``-ed model with FSDP, the ``DistributedDataParallel`` wrapper with DDP, the
DeepSpeed engine) and the optimizer inside Accelerate's wrapper. ``on_train_end`` closes the
monitor. The Trainer tells callbacks nothing when ``train()`` raises: the monitor then stays
open (a process that dies leaves no ``end`` record, so its ranks show as stale, not ended);
call ``callback.close()`` if you catch the exception and carry on. A later ``train()`` on the
same callback closes any monitor left open first.

Without the trainer (``callbacks=[ZerodocCallback()]``) the callback sees only the Trainer's
``model`` argument, which is the sharded model with FSDP but the *unwrapped* one with DDP.
"""

from __future__ import annotations

import warnings
import weakref

from transformers import TrainerCallback

from ..shim.config import AttachConfig
from .common import attach_prepared, close, world_size

__all__ = ["ZerodocCallback", "attach"]

INTEGRATION = "hf"


class ZerodocCallback(TrainerCallback):
    """Attach at ``on_train_begin``, close at ``on_train_end``.

    Args:
        trainer: the ``Trainer`` (recommended): its prepared ``model_wrapped`` is attached.
        options: ``zerodoc.attach()`` keywords (``run_dir=``, ``port=``, ...); unknown ones
            raise here, when the callback is made, not in the middle of a run.
    """

    def __init__(self, trainer=None, **options):
        AttachConfig.from_options(**dict(options))  # bad options raise now
        self.options = options
        self._trainer = weakref.ref(trainer) if trainer is not None else None
        self.monitor = None

    def _model(self, model):
        trainer = self._trainer() if self._trainer is not None else None
        wrapped = getattr(trainer, "model_wrapped", None) if trainer is not None else None
        return wrapped if wrapped is not None else model

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        self.close()  # a previous train() that raised
        target = self._model(model)
        if target is None:
            warnings.warn("zerodoc: the Trainer passed no model; not attached", stacklevel=2)
            return
        self.monitor = attach_prepared(target, optimizer, **self.options)
        adapter = getattr(self.monitor, "adapter", None)
        if (self._trainer is None and world_size() > 1
                and getattr(adapter, "framework", "") == "none"):
            warnings.warn("zerodoc: the Trainer's model is not sharded here (DDP?); pass the "
                          "trainer, ZerodocCallback(trainer), so its wrapped model is attached",
                          stacklevel=2)

    def on_train_end(self, args, state, control, **kwargs):
        self.close()

    def close(self) -> None:
        """Close the monitor now (idempotent)."""
        monitor, self.monitor = self.monitor, None
        close(monitor, INTEGRATION)


def attach(trainer, **options) -> ZerodocCallback:
    """Add a ``ZerodocCallback(trainer, **options)`` to ``trainer`` and return it."""
    callback = ZerodocCallback(trainer, **options)
    trainer.add_callback(callback)
    return callback
