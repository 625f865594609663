"""zerodoc: monitoring and diagnostics for sharded (FSDP / DeepSpeed ZeRO) PyTorch training.

Training jobs meet one function, :func:`attach`. Importing ``zerodoc`` is cheap: torch and the
exporter are imported when ``attach`` is called, Textual and Grafana tooling never.
"""

from __future__ import annotations

from .version import __version__

__all__ = ["attach", "__version__"]


def attach(model, optimizer=None, **options):
    """Instrument a sharded model (and its optimizer) and start exporting.

    Args:
        model: the model after ``fully_shard`` was applied (per block + root), an ``FSDP(...)``
            model, or a DeepSpeed engine. A model with no sharded units is still monitored
            (step time, memory), with a warning saying to attach after sharding.
        optimizer: its ``step()`` marks step boundaries (a step post-hook); built after
            sharding (one holding none of the model's parameters is warned about). Without
            one, call ``monitor.step()`` at the end of each step.
        run_dir: where this rank's run log goes (default: ``$ZERODOC_RUN_DIR`` or
            ``./zerodoc-runs/<job id>/``, one folder per run).
        port: Prometheus base port; each rank serves ``/metrics`` on ``port + LOCAL_RANK``.
            ``None``: ``$ZERODOC_PORT`` or 9730; ``0``: any free port; ``False``: no HTTP server.
        host: address to bind (default ``127.0.0.1``).
        Other keywords: see :class:`zerodoc.shim.config.AttachConfig`.

    Returns:
        A :class:`zerodoc.shim.monitor.Monitor`; also a context manager (``close()`` on exit).
        One monitor per process: attaching the same model again returns the monitor already
        attached, another model is refused (a no-op monitor, with a warning). A job that
        exits without ``close()`` is closed at interpreter exit.

    Never raises into the training job for zerodoc's own failures: a hook point that is
    missing, a port in use or an unwritable run directory is warned about once and counted.
    Bad arguments (no model, the arguments swapped, an unknown option, an option of the
    wrong type) do raise TypeError / ValueError at attach time, naming the mistake.
    """
    from .shim.monitor import attach as _attach

    return _attach(model, optimizer, **options)
