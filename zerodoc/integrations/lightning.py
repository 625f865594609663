"""Lightning: a ``Callback`` that attaches zerodoc at fit start and closes at fit end.

    from zerodoc.integrations.lightning import ZerodocCallback
    trainer = L.Trainer(strategy=ModelParallelStrategy(...), callbacks=[ZerodocCallback()])
    trainer.fit(model, loader)

``on_fit_start`` runs after the strategy has set the model up: zerodoc gets the module as the
strategy wraps it (``trainer.strategy.model``: the ``fully_shard``-ed LightningModule under
``ModelParallelStrategy``, the ``FullyShardedDataParallel`` wrapper under ``FSDPStrategy``,
``DistributedDataParallel`` under DDP) and the optimizer ``configure_optimizers`` returned.
A step ends at that optimizer's step. Lightning runs forward and backward *inside*
``optimizer.step(closure)``; zerodoc times the closure apart, so the optimizer's time is its
own. With several optimizers or manual optimization the step ends at ``on_train_batch_end``
instead (optimizer time is then not split out).

Closed at ``on_fit_end``; on an exception or Ctrl-C Lightning calls ``on_exception``: an
``exception`` record (type and message) goes into the run log, then the monitor is closed.
``teardown`` closes whatever is still open.

Works with ``lightning`` (``lightning.pytorch``) or, when only it is installed, the standalone
``pytorch_lightning`` package.
"""

from __future__ import annotations

try:
    from lightning.pytorch import Callback
except ImportError:  # the standalone package
    from pytorch_lightning import Callback

from ..shim.config import AttachConfig
from .common import attach_prepared, close

__all__ = ["ZerodocCallback"]

INTEGRATION = "lightning"


class ZerodocCallback(Callback):
    """Attach at ``on_fit_start``; close at ``on_fit_end`` / ``on_exception`` / ``teardown``.

    Args:
        options: ``zerodoc.attach()`` keywords (``run_dir=``, ``port=``, ...); unknown ones
            raise here, when the callback is made.
    """

    def __init__(self, **options):
        AttachConfig.from_options(**dict(options))  # bad options raise now
        self.options = options
        self.monitor = None
        self._manual_steps = False

    def on_fit_start(self, trainer, pl_module) -> None:
        self._close()
        model = getattr(trainer.strategy, "model", None) or pl_module
        optimizers = list(getattr(trainer, "optimizers", None) or ())
        single = len(optimizers) == 1 and getattr(pl_module, "automatic_optimization", True)
        self._manual_steps = not single
        self.monitor = attach_prepared(model, optimizers[0] if single else None,
                                       **self.options)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self._manual_steps and self.monitor is not None:
            self.monitor.step()

    def on_fit_end(self, trainer, pl_module) -> None:
        self._close()

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        self._close(exception)

    def teardown(self, trainer, pl_module, stage: str) -> None:
        self._close()

    def _close(self, exc: BaseException | None = None) -> None:
        monitor, self.monitor = self.monitor, None
        close(monitor, INTEGRATION, exc)
