"""What a diagnosis rule returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum


class Severity(IntEnum):
    INFO = 10
    WARNING = 20
    ERROR = 30
    CRITICAL = 40

    @classmethod
    def parse(cls, name: str) -> "Severity":
        try:
            return cls[name.upper()]
        except KeyError:
            from ..errors import UserError

            raise UserError(f"unknown severity {name!r}; use one of "
                            f"{', '.join(s.name.lower() for s in cls)}") from None


@dataclass(frozen=True)
class Finding:
    code: str  # stable rule code, e.g. "ZD004"
    name: str  # slug, e.g. "exposed-all-gather"
    severity: Severity
    title: str  # one line for a person
    evidence: dict[str, object]  # the numbers that triggered it (base units)
    threshold: dict[str, object]  # the threshold(s) it applied
    fix: str  # what to change
    predicted: str | None = None  # predicted effect of the fix, where the planner can say
    ranks: tuple[int, ...] = ()  # ranks concerned (empty: the run)
    units: tuple[str, ...] = ()  # units concerned
    doc: str = ""  # docs anchor, e.g. "docs/rules.md#zd004"
    extra: dict[str, object] = field(default_factory=dict)
