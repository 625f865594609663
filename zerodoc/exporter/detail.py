"""How much per-unit detail a rank exports to Prometheus (`metrics_detail`).

- `full` (default): every rank serves its per-unit series (compute per unit and phase,
  collectives per unit, phase and kind); the run's per-unit facts and the framework's time
  per unit (`zerodoc_framework_unit_seconds_total`) come from rank 0 only, every other rank
  serving that one summed over its units per phase (issue 33: 81 units x 2 phases per rank
  broke the series budget) and counting the folded series in
  `zerodoc_exporter_omitted_series{reason="unit_detail"}`.
- `coarse` (jobs of thousands of ranks): `metrics_unit_ranks` ranks spread evenly over the
  job (rank 0 first) keep their per-unit series; every other rank serves the same metrics
  summed over units (no `unit` label) and counts what it left out in
  `zerodoc_exporter_omitted_series{reason="unit_detail"}`.

The run log keeps full per-unit detail in both modes. Standard library only (attach-time
validation imports it without the exporter).
"""

from __future__ import annotations

import os

DETAILS = ("full", "coarse")
DEFAULT_DETAIL = "full"
DEFAULT_UNIT_RANKS = 8
DETAIL_ENV = "ZERODOC_METRICS_DETAIL"
UNIT_RANKS_ENV = "ZERODOC_METRICS_UNIT_RANKS"


def unit_detail_ranks(world_size: int, k: int) -> set[int]:
    """The ranks that keep per-unit series in coarse mode: k of them, evenly spread."""
    world = max(1, int(world_size))
    k = max(0, min(int(k), world))
    return {i * world // k for i in range(k)}


def has_unit_detail(detail: str, rank: int, world_size: int, k: int) -> bool:
    return detail != "coarse" or rank in unit_detail_ranks(world_size, k)


def options_from_env(options: dict) -> dict:
    """Fill `metrics_detail` / `metrics_unit_ranks` from the environment when not given."""
    if "metrics_detail" not in options:
        raw = os.environ.get(DETAIL_ENV, "").strip().lower()
        if raw:
            options["metrics_detail"] = raw
    if "metrics_unit_ranks" not in options:
        raw = os.environ.get(UNIT_RANKS_ENV, "").strip()
        if raw:
            try:
                options["metrics_unit_ranks"] = int(raw)
            except ValueError:
                raise ValueError(f"environment variable {UNIT_RANKS_ENV}={raw!r} is not a "
                                 "number of ranks") from None
    return options


def check(detail: object, unit_ranks: object) -> None:
    """Raise TypeError / ValueError naming the option (attach time, never later)."""
    if detail not in DETAILS:
        raise ValueError(f"zerodoc.attach(): metrics_detail must be one of "
                         f"{', '.join(repr(d) for d in DETAILS)} (or ${DETAIL_ENV}), "
                         f"not {detail!r}")
    if isinstance(unit_ranks, bool) or not isinstance(unit_ranks, int):
        raise TypeError(f"zerodoc.attach(): metrics_unit_ranks must be an int >= 0, "
                        f"not {unit_ranks!r} ({type(unit_ranks).__name__})")
    if unit_ranks < 0:
        raise ValueError(f"zerodoc.attach(): metrics_unit_ranks must be >= 0, not {unit_ranks}")
