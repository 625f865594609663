"""Base units to what a person reads. The only place the TUI converts units.

Table cells carry bare numbers (the column header names the unit) so that a column reads
and sorts as numbers; headline text carries the unit with the number. Sizes and rates are
decimal (1 MB = 10^6 bytes, 1 GB = 10^9 bytes), as in `zerodoc report` and `zerodoc plan`'s
default, so the same headroom reads the same number everywhere.
"""

from __future__ import annotations

import math

MS_PER_S = 1e3
MB = 1e6
GB = 1e9  # decimal, as in the report, the planner's default and nccl-tests' bandwidth


def num(v: float | None) -> str:
    """A bare number with 2-3 significant digits after the point, '-' for None/NaN."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    a = abs(v)
    if a == 0:
        return "0"
    if a < 10:
        return f"{v:.2f}"
    if a < 1000:
        return f"{v:.1f}"
    return f"{v:.0f}"


def ms_num(seconds: float | None) -> str:
    """Seconds as a bare number of milliseconds (table cells)."""
    return "-" if seconds is None else num(seconds * MS_PER_S)


def duration(seconds: float | None) -> str:
    """Seconds with a unit: 45 µs, 12.3 ms, 1.23 s, 4m 05s."""
    if seconds is None:
        return "-"
    a = abs(seconds)
    if a == 0:
        return "0 ms"
    if a < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if a < 1:
        return f"{num(seconds * 1e3)} ms"
    if a < 10:
        return f"{seconds:.2f} s"
    if a < 120:
        return f"{seconds:.0f} s"
    m, s = divmod(int(round(seconds)), 60)
    if m < 120:
        return f"{m}m {s:02d}s"
    return f"{m // 60}h {m % 60:02d}m"


def size(n: float | None) -> str:
    """Bytes with a decimal unit: 512 B, 3.1 MB, 12.7 GB."""
    if n is None:
        return "-"
    a = abs(n)
    for unit, scale in (("TB", 1e12), ("GB", GB), ("MB", MB), ("kB", 1e3)):
        if a >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


def mb_num(n: float | None) -> str:
    return "-" if n is None else num(n / MB)


def gb_num(n: float | None) -> str:
    return "-" if n is None else num(n / GB)


def rate(bytes_per_second: float | None) -> str:
    """Bandwidth in the decimal unit that fits it: 12.3 GB/s, 850 MB/s, 12.0 kB/s."""
    if bytes_per_second is None:
        return "-"
    a = abs(bytes_per_second)
    for scale, unit in ((GB, "GB/s"), (MB, "MB/s"), (1e3, "kB/s")):
        if a >= scale:
            return f"{num(bytes_per_second / scale)} {unit}"
    return f"{num(bytes_per_second)} B/s"


def pct(fraction: float | None) -> str:
    return "-" if fraction is None else f"{fraction * 100:.1f}%"


def pct_num(fraction: float | None) -> str:
    return "-" if fraction is None else f"{fraction * 100:.1f}"


def count(n: float | None) -> str:
    """Parameter-style counts: 789.8K, 1.2M, 7.0B."""
    if n is None:
        return "-"
    a = abs(n)
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if a >= scale:
            return f"{n / scale:.1f}{unit}"
    return f"{int(n)}"


def ago(seconds: float) -> str:
    if seconds < 1:
        return "just now"
    return f"{duration(round(seconds))} ago" if seconds >= 120 else f"{seconds:.0f} s ago"


def value(key: str, v: object) -> str:
    """A finding's evidence or threshold value, converted by its key's base-unit suffix."""
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, (list, tuple, set, frozenset)):
        items = list(v)
        shown = ", ".join(value(key, x) for x in items[:8])
        return shown + (f", … ({len(items)} in all)" if len(items) > 8 else "")
    if isinstance(v, dict):
        # Nested evidence: a named field converts by its own unit suffix
        # ({"exposed_seconds_per_step": 0.0032} -> "exposed: 3.20 ms/step"); keys that are
        # not field names (ranks: {"0": 1.2}) take the unit of the outer key.
        def item(k, x) -> str:
            if isinstance(k, str) and "_" in k:
                return f"{label(k)}: {value(k, x)}"
            return f"{k}: {value(key, x)}"
        return ", ".join(item(k, x) for k, x in list(v.items())[:8])
    if not isinstance(v, (int, float)):
        return str(v)
    k, per = _per_step(key.lower())
    if k.endswith(("_bytes_per_second", "_bps", "busbw", "algbw")):
        return rate(v) + per
    if k.endswith(("_seconds", "_s")):
        return duration(v) + per
    if k.endswith("_bytes"):
        return size(v) + per
    if k.endswith(("_fraction", "_share")):
        return pct(v)
    if k.endswith(("_params", "params")):
        return count(v)
    if isinstance(v, float):
        return num(v) + per
    return str(v) + per


def _per_step(key: str) -> tuple[str, str]:
    """The key without a threshold level (`_warn`, `_crit`) or `_per_step`, and the unit
    suffix that `_per_step` adds."""
    for level in ("_warn", "_crit", "_min", "_max"):
        if key.endswith(level):
            key = key[: -len(level)]
            break
    return (key[: -len("_per_step")], "/step") if key.endswith("_per_step") else (key, "")


def label(key: str) -> str:
    """An evidence key as words, its base-unit suffix dropped: exposed_seconds -> exposed."""
    k = key[: -len("_per_step")] if key.endswith("_per_step") else key
    for suffix in ("_bytes_per_second", "_seconds", "_bytes", "_s"):
        if k.endswith(suffix) and len(k) > len(suffix):
            k = k[: -len(suffix)]
            break
    return k.replace("_", " ")
