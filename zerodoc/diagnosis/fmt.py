"""Numbers for people: the only place the diagnosis converts base units for display.

Findings keep base units in `evidence`; titles, fixes and predictions are sentences and use
these helpers. Decimal units (1 MB = 10^6 bytes, 1 GB/s = 10^9 bytes/s), always labelled.
"""

from __future__ import annotations


def nbytes(n: float | int | None) -> str:
    """"3.2 MB", "48.8 GB", "512 B"."""
    if n is None:
        return "-"
    n = float(n)
    sign = "-" if n < 0 else ""
    n = abs(n)
    for scale, unit in ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if n >= scale:
            return f"{sign}{n / scale:.3g} {unit}" if n / scale < 100 else \
                f"{sign}{n / scale:.0f} {unit}"
    return f"{sign}{n:.0f} B"


def rate(bps: float | None) -> str:
    """Bytes per second in the unit that fits: "150 GB/s", "25.1 MB/s", "12 kB/s"."""
    if bps is None:
        return "-"
    for scale, unit in ((1e9, "GB/s"), (1e6, "MB/s"), (1e3, "kB/s")):
        if abs(bps) >= scale:
            return f"{bps / scale:.3g} {unit}"
    return f"{bps:.3g} B/s"


def secs(s: float | None) -> str:
    """"12.3 ms", "1.25 s", "85 us"."""
    if s is None:
        return "-"
    if s == 0:
        return "0 s"
    a = abs(s)
    if a >= 1.0:
        return f"{s:.3g} s"
    if a >= 1e-3:
        return f"{s * 1e3:.3g} ms"
    return f"{s * 1e6:.3g} us"


def pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:.0f}%"


def value(key: str, v: object) -> str:
    """Format one evidence value by its key's unit suffix (the house naming convention)."""
    if isinstance(v, bool) or v is None:
        return str(v).lower() if isinstance(v, bool) else "-"
    if isinstance(v, (list, tuple)):
        return "[" + "; ".join(value(key, x) for x in v) + "]"
    if isinstance(v, dict):
        return ", ".join(f"{k}: {value(k if isinstance(k, str) and '_' in k else key, x)}"
                         for k, x in v.items())
    if not isinstance(v, (int, float)):
        return str(v)
    key = key.removesuffix("_per_step")
    if key.endswith("_unix"):
        import time

        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(v)) if v > 0 else "-"
    if key.endswith("_bytes_per_second"):
        return rate(v)
    if key.endswith("_bytes"):
        return nbytes(v)
    if key.endswith("_seconds"):
        return secs(v)
    if key.endswith("_fraction"):
        return pct(v)
    if key.endswith("_ratio"):
        return f"{v:.2f}x" if v >= 1.5 else f"{v:.2f}"
    if isinstance(v, float):
        return f"{v:.4g}"
    return f"{v:,}"
