"""Diagnosis thresholds: the one place both the rules engine and the Prometheus alerting
rules (rules/*.yml, generated from this module) take their numbers from.

All ratios are plain fractions (0.15 = 15 %). Override per run with
`Thresholds(**overrides)` or `zerodoc report --threshold name=value`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields, replace

from .errors import UserError


@dataclass(frozen=True, kw_only=True)
class Thresholds:
    exposed_fraction_warn: float = 0.10
    """Exposed all-gather time / step time above which a run is losing time to waits."""
    exposed_fraction_crit: float = 0.25
    """... and above which it is badly exposed."""
    unit_exposed_ratio_warn: float = 0.50
    """A unit's exposed / total all-gather time: prefetch is not keeping up for that unit."""
    comm_compute_ratio_warn: float = 0.50
    """Exposed communication / compute: the step is communication-bound."""
    comm_compute_ratio_crit: float = 1.00
    headroom_fraction_warn: float = 0.10
    """Device memory headroom / capacity below which OOM is a risk."""
    headroom_fraction_crit: float = 0.05
    fragmentation_ratio_warn: float = 0.30
    """(reserved - allocated) / reserved on the GPU allocator."""
    straggler_ratio_warn: float = 1.25
    """A rank's compute time / the median rank's compute time."""
    slow_link_busbw_fraction: float = 0.25
    """Achieved bus bandwidth / the link's expected bandwidth, for large collectives."""
    slow_link_costly_busbw_fraction: float = 0.50
    """... and, with synchronous collectives (every second of them waited for), below this
    share too when waiting on the link beyond its expected time costs at least
    exposed_fraction_crit of the step: a link a fixed delay slows (small collectives on a
    fast host) is as slow as one that moves a quarter of the bytes."""
    slow_link_min_bytes: int = 1 << 20
    """Collectives smaller than this are latency-bound; the slow-link rule ignores them."""
    wrap_coarse_param_fraction: float = 0.50
    """One unit holding at least this share of all parameters (with >= 2 ranks)."""
    wrap_fine_median_bytes: int = 4 << 20
    """Median all-gather below this size (4 MiB: below it per-call latency dominates on every
    link class zerodoc knows, NCCL and gloo alike) ..."""
    wrap_fine_min_units: int = 16
    """... across at least this many units: wrapping is too fine."""
    overstaging_headroom_fraction: float = 0.20
    """ZeRO-2 must leave this share of device memory free to call ZeRO-3 over-staging."""
    offload_optimizer_fraction: float = 0.30
    """Optimizer step time / step time above which a CPU-offload run is crawling."""
    stale_after_seconds: float = 60.0
    """A rank with no new step for this long is stale (exporter-down alerts use it too)."""
    run_down_lookback_seconds: float = 3600.0
    """ZerodocRunDown: a run none of whose ranks answers fires if some rank answered within
    this long (and stops firing that long after the last answer: a run that died a day ago
    is not news; its target files are)."""
    fragmentation_min_reserved_fraction: float = 0.50
    """Fragmentation is only a risk (WARNING, not INFO) when the allocator holds at least this
    share of device memory, or has already had to retry an allocation."""
    dtype_traffic_ratio_warn: float = 1.5
    """Measured collective bytes / the bytes the declared dtype implies, above which a
    collective moves a wider dtype than configured."""
    launch_host_device_ratio_warn: float = 0.80
    """GPU: host launch time of the compute / its device time, at or above which (with the
    device caught up, below) a run is launch-bound."""
    launch_caught_up_fraction_warn: float = 0.50
    """GPU: share of unit compute segments the device had started before the host finished
    launching them."""
    alert_for: str = "5m"
    """How long an alert condition must hold before it fires."""

    @classmethod
    def with_overrides(cls, pairs: list[str] | None) -> "Thresholds":
        """Parse ["name=value", ...] (CLI) into a Thresholds."""
        t = cls()
        known = {f.name: f for f in fields(cls)}
        for pair in pairs or ():
            name, sep, raw = pair.partition("=")
            name = name.strip().replace("-", "_")
            if not sep or name not in known:
                raise UserError(f"unknown threshold {pair!r}; known: {', '.join(sorted(known))}")
            cur = getattr(t, name)
            try:
                val = type(cur)(raw) if not isinstance(cur, str) else raw
            except ValueError:
                raise UserError(f"threshold {name} needs a {type(cur).__name__}, got {raw!r}") \
                    from None
            if isinstance(val, (int, float)) and not (math.isfinite(val) and val >= 0):
                raise UserError(f"threshold {name} must be a finite number >= 0, got {raw!r}")
            if name == "alert_for" and not re.fullmatch(r"(\d+(ms|s|m|h|d|w|y))+", val):
                raise UserError(f"threshold alert_for needs a duration like 5m or 1h30m, "
                                f"got {raw!r}")
            t = replace(t, **{name: val})
        return t


DEFAULT = Thresholds()

# Expected bus bandwidth per link class (bytes/s), used by the slow-link rule and, for
# synchronous collectives, as the cost the link itself explains. "gloo-cpu" is the loopback
# baseline of a CPU/gloo run on one host: the healthy 2-rank demo (block wrap, 2-15 MB
# collectives) measured 0.11-0.23 GB/s aggregate busbw on 2 shared cores (typical 0.12).
LINK_BUSBW = {
    "nvlink": 150e9,
    "pcie": 20e9,
    "infiniband": 20e9,
    "ethernet": 5e9,
    "gloo-cpu": 1.2e8,
}

# A healthy link's own latency per collective call (seconds), beside its bandwidth: what a
# fixed link still costs per call (ZD005 prices its fix at min(the run's fitted latency, this),
# not 0). NCCL classes: order of magnitude, from NCCL's documented / nccl-tests small-message
# latencies (NVLink ~10-20 us, PCIe ~20-30 us, InfiniBand ~20-50 us, TCP Ethernet ~50-100 us).
# "gloo-cpu" measured on this 2-core box: gloo alone 0.6 ms per all-gather at 0.26 MB
# (docs/whatif.md); with FSDP's per-call work the healthy block-wrap demo's 2.1 MB all-gathers
# took 2.2-4.3 ms per call on a quiet host, their per-run fitted latencies 1.5 and 1.8 ms
# (two quiet runs), 0-12 ms at load 1-8, 0.8 +- 0.5 ms pooled over 13 runs (2026-11-25), and
# the slow-link run at 12:04 UTC fitted 32.1 ms with its 30 ms delay (2.1 ms healthy): ~2 ms.
LINK_LATENCY_S = {
    "nvlink": 15e-6,
    "pcie": 25e-6,
    "infiniband": 35e-6,
    "ethernet": 75e-6,
    "gloo-cpu": 2e-3,
}
