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


DIRECTIONS = ("down", "up")


@dataclass(frozen=True)
class Predicted:
    """One machine-readable predicted effect of a finding's fix (`zerodoc compare` checks it
    against the run after the fix; docs/compare.md).

    `metric` names an observable (`zerodoc.diagnosis.observables.OBSERVABLES`, base units);
    `direction` is how the fix moves it; `value` the value predicted after the fix (None: only
    the direction is predicted); `now` the value the rule read, so the predicted change is
    `value - now`. `cost`: a price the fix is expected to exact (more memory held), not the
    benefit it is applied for. `lo`, `hi`: the range the value after the fix is predicted in
    (from the step model, `zerodoc.whatif`); None: no range, the change is judged by its size
    and direction (docs/compare.md, "Verdicts")."""

    metric: str
    direction: str  # "down" | "up"
    value: float | None = None
    now: float | None = None
    cost: bool = False
    lo: float | None = None
    hi: float | None = None

    def __post_init__(self) -> None:
        if self.direction not in DIRECTIONS:
            raise ValueError(f"Predicted.direction must be one of {DIRECTIONS}, "
                             f"not {self.direction!r}")

    def as_dict(self) -> dict:
        return {"metric": self.metric, "direction": self.direction, "value": self.value,
                "now": self.now, "cost": self.cost, "lo": self.lo, "hi": self.hi}


@dataclass(frozen=True)
class Finding:
    code: str  # stable rule code, e.g. "ZD004"
    name: str  # slug, e.g. "exposed-all-gather"
    severity: Severity
    title: str  # one line for a person
    evidence: dict[str, object]  # the numbers that triggered it (base units)
    threshold: dict[str, object]  # the threshold(s) it applied
    fix: str  # what to change
    predicted: str | None = None  # predicted effect of the fix, in words
    effects: tuple[Predicted, ...] = ()  # the same, machine-readable (first: the main benefit)
    ranks: tuple[int, ...] = ()  # ranks concerned (empty: the run)
    units: tuple[str, ...] = ()  # units concerned
    doc: str = ""  # docs anchor, e.g. "docs/rules.md#zd004"
    extra: dict[str, object] = field(default_factory=dict)
