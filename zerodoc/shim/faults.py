"""Fault injection (a simulated slow link) is never silent.

`inject_latency_s` makes every parameter all-gather (or broadcast / gradient all-reduce, see
`zerodoc/shim/config.py`) complete that much later, beneath the measurement: tests and the demo use
it to prove that zerodoc finds a slow link. In a training job it would slow the job down, so:

- the environment variable `ZERODOC_INJECT_LATENCY_S` alone is ignored, with a warning; it
  acts only together with `ZERODOC_INJECT_LATENCY_ACK=slow-down-this-job` (a stale variable
  copied from a test environment can never slow a real job by accident);
- whenever it is on (option or acknowledged variable), attach warns loudly, the run facts say
  so (`config.fault_injection`, `config.inject_latency_s`) and the exporter serves
  `zerodoc_injected_latency_seconds` (0 when off) so a dashboard or alert can see it;
- it is a host-side delay for CPU/gloo runs; on CUDA it is ignored (with a warning): a GPU
  check injects its slow link on the device itself (`bench/gpu_check.py`).
"""

from __future__ import annotations

import logging
import warnings

ENV = "ZERODOC_INJECT_LATENCY_S"
ACK_ENV = "ZERODOC_INJECT_LATENCY_ACK"
ACK_VALUE = "slow-down-this-job"

log = logging.getLogger("zerodoc")


def from_env(environ) -> float:
    """The injected delay the environment asks for: 0 unless acknowledged."""
    raw = environ.get(ENV, "")
    if raw in ("", None):
        return 0.0
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"environment variable {ENV}={raw!r} is not a number") from None
    if value <= 0:
        return 0.0
    if environ.get(ACK_ENV, "") != ACK_VALUE:
        warnings.warn(f"zerodoc: {ENV}={raw} is IGNORED: it would slow every all-gather of "
                      f"this job by {value} s (a test fault injector). To really inject it, "
                      f"also set {ACK_ENV}={ACK_VALUE}.", stacklevel=3)
        return 0.0
    return value


def announce(seconds: float, device_type: str) -> float:
    """Warn that a fault is injected; returns the delay actually used (0 on CUDA)."""
    if seconds <= 0:
        return 0.0
    if device_type == "cuda":
        warnings.warn(f"zerodoc: inject_latency_s={seconds} ignored on CUDA (the simulated "
                      "slow link is a host-side delay for CPU/gloo tests)", stacklevel=4)
        return 0.0
    msg = (f"zerodoc: FAULT INJECTION ON: every parameter all-gather of this job completes "
           f"{seconds} s late (inject_latency_s). This deliberately slows training; it is "
           "meant for tests and the demo.")
    warnings.warn(msg, stacklevel=4)
    log.warning(msg)
    return seconds
