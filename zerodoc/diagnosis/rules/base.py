"""What every rule module shares: building a `Finding` with its code, slug and doc anchor."""

from __future__ import annotations

from ..findings import Finding, Severity


def finding(code: str, name: str, severity: Severity, title: str, *,
            evidence: dict, threshold: dict, fix: str, predicted: str | None = None,
            ranks=(), units=(), cost_seconds_per_step: float = 0.0, **extra) -> Finding:
    """A Finding; `cost_seconds_per_step` (the time per step it costs, where a rule can say)
    orders findings of equal severity, and is kept in `extra`."""
    return Finding(code=code, name=name, severity=severity, title=title, evidence=evidence,
                   threshold=threshold, fix=fix, predicted=predicted,
                   ranks=tuple(sorted(ranks)), units=tuple(units),
                   doc=f"docs/rules.md#{code.lower()}",
                   extra={"cost_seconds_per_step": float(max(0.0, cost_seconds_per_step)),
                          **extra})


def grade(value: float, warn: float, crit: float | None = None, *, below: bool = False,
          crit_severity: Severity = Severity.ERROR) -> Severity | None:
    """WARNING past `warn`, `crit_severity` past `crit` (`below`: smaller is worse)."""
    def past(limit):
        return value < limit if below else value >= limit
    if crit is not None and past(crit):
        return crit_severity
    if past(warn):
        return Severity.WARNING
    return None


def top(items, key, n: int = 5):
    return sorted(items, key=key, reverse=True)[:n]


def r6(x: float) -> float:
    """Evidence numbers rounded to 6 significant digits (stable JSON, no float noise)."""
    return float(f"{x:.6g}")
