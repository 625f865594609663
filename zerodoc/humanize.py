"""Numbers as text for people: the one place zerodoc converts base units for display.

Everything else keeps base units (seconds, bytes, bytes per second, fractions); the report,
the findings' sentences, the TUI, the planner and compare turn them into text here. Sizes
and rates are decimal (1 MB = 10^6 bytes, 1 GB/s = 10^9 bytes/s) unless a caller asks the
planner's binary units, and always labelled. Standard library only.

Two registers, kept apart because their outputs are part of what users read and tests pin:

- sentences (findings, report, compare): `nbytes`, `rate`, `secs`, `pct`, `value`, 3
  significant digits, whole percents;
- cells and headlines (the TUI): `num` and the `*_num` helpers (bare numbers, the column
  header names the unit), `duration`, `size`, `bandwidth`, `percent`, `count`, `ago`,
  `evidence_value`, `label`;
- the planner's sizes in a chosen unit: `format_bytes`, `format_count`;
- plain-text tables: `table`.
"""

from __future__ import annotations

import math

from .errors import UserError


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


# --- the planner's sizes, in a unit the user picks -----------------------------------------

# Size units of the plan table: decimal (10^3 steps) and binary (2^10 steps).
UNITS = {"tb": (10**12, "TB"), "gb": (10**9, "GB"), "mb": (10**6, "MB"), "kb": (10**3, "kB"),
         "tib": (2**40, "TiB"), "gib": (2**30, "GiB"), "mib": (2**20, "MiB"),
         "kib": (2**10, "KiB")}
UNIT_CHOICES = ("auto", "gb", "gib", "mb", "mib")


def unit_scale(units: str) -> tuple[int, str]:
    try:
        return UNITS[units]
    except KeyError:
        raise UserError(f"units must be one of {', '.join(UNIT_CHOICES)}, "
                        f"got {units!r}") from None


def format_bytes(n: int | float, units: str = "gb", digits: int = 1) -> str:
    """"48.8 GB" (units="gb", 10^9), "45.4 GiB" (units="gib", 2^30), "6.5 MB", ...,
    labelled; units="auto": the decimal unit that fits this number (below 1000 of it, at
    least 1: "16.0 GB", not "16000.0 MB")."""
    if units == "auto":
        if n == 0:
            return "0 B"
        units = next((u for u in ("tb", "gb", "mb", "kb") if abs(n) >= UNITS[u][0]), "kb")
        scale, label = unit_scale(units)
        if abs(n) / scale < 10:  # one more digit below 10: "1.12 TB", "3.25 GB"
            digits += 1
        return f"{n / scale:.{digits}f} {label}"
    scale, label = unit_scale(units)
    return f"{n / scale:.{digits}f} {label}"


def format_count(n: int) -> str:
    for scale, suffix in ((10**12, "T"), (10**9, "B"), (10**6, "M"), (10**3, "K")):
        if n >= scale:
            return f"{n / scale:.4g}{suffix}"
    return str(n)


# --- cells and headlines (the TUI) -------------------------------------------------------
# Table cells carry bare numbers (the column header names the unit) so that a column reads
# and sorts as numbers; headline text carries the unit with the number.

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


def bandwidth(bytes_per_second: float | None) -> str:
    """Bandwidth in the decimal unit that fits it: 12.3 GB/s, 850 MB/s, 12.0 kB/s."""
    if bytes_per_second is None:
        return "-"
    a = abs(bytes_per_second)
    for scale, unit in ((GB, "GB/s"), (MB, "MB/s"), (1e3, "kB/s")):
        if a >= scale:
            return f"{num(bytes_per_second / scale)} {unit}"
    return f"{num(bytes_per_second)} B/s"


def percent(fraction: float | None) -> str:
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


def evidence_value(key: str, v: object) -> str:
    """A finding's evidence or threshold value, converted by its key's base-unit suffix (the
    TUI's finding detail: long lists shortened, nested field names as words)."""
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, (list, tuple, set, frozenset)):
        items = list(v)
        shown = ", ".join(evidence_value(key, x) for x in items[:8])
        return shown + (f", … ({len(items)} in all)" if len(items) > 8 else "")
    if isinstance(v, dict):
        # Nested evidence: a named field converts by its own unit suffix
        # ({"exposed_seconds_per_step": 0.0032} -> "exposed: 3.20 ms/step"); keys that are
        # not field names (ranks: {"0": 1.2}) take the unit of the outer key.
        def item(k, x) -> str:
            if isinstance(k, str) and "_" in k:
                return f"{label(k)}: {evidence_value(k, x)}"
            return f"{k}: {evidence_value(key, x)}"
        return ", ".join(item(k, x) for k, x in list(v.items())[:8])
    if not isinstance(v, (int, float)):
        return str(v)
    k, per = _per_step(key.lower())
    if k.endswith(("_bytes_per_second", "_bps", "busbw", "algbw")):
        return bandwidth(v) + per
    if k.endswith(("_seconds", "_s")):
        return duration(v) + per
    if k.endswith("_bytes"):
        return size(v) + per
    if k.endswith(("_fraction", "_share")):
        return percent(v)
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


# --- plain-text tables (report, compare) -----------------------------------------------------

def table(head, rows, numbers_right: bool = True) -> list[str]:
    """Rows of cells as aligned lines, two spaces between columns, no trailing blanks. The
    first column is left-aligned; the others right-aligned (numbers) or, with
    `numbers_right=False`, left-aligned (words)."""
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    out = []
    for r in [head, *rows]:
        rest = zip(r[1:], widths[1:])
        cells = [str(r[0]).ljust(widths[0])] + [
            str(c).rjust(w) if numbers_right else str(c).ljust(w) for c, w in rest]
        out.append("  ".join(cells).rstrip())
    return out
