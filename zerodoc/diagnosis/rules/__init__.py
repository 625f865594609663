"""The rule registry: one module per rule, listed here explicitly (no discovery magic).

A rule module has CODE (stable, "ZD0nn"), NAME (slug), SEVERITY (its usual severity),
TIER (0: a cause, 1: a configuration choice, 2: a symptom; orders equal-severity findings),
EXPLAINS (codes of findings this one, when it fires at WARNING or above, is the cause of), a
docstring (title line, why, evidence, fix) and ``evaluate(ctx) -> list[Finding]``; and where
the fix shows in the configuration, ``applied(before, after) -> str | None`` over two runs'
`observables.config_facts()` (what changed, or None), used by `zerodoc compare`.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Callable

from ..findings import Severity
from . import (
    zd001_wrap_too_coarse, zd002_wrap_too_fine, zd003_over_staging, zd004_exposed_all_gather,
    zd005_slow_link, zd006_comm_bound, zd007_low_headroom, zd008_layer_too_big,
    zd009_dtype_mismatch, zd010_straggler, zd011_offload_crawl, zd012_fragmentation,
    zd013_rank_stopped,
    zd014_launch_bound,
)


@dataclass(frozen=True)
class Rule:
    code: str
    name: str
    severity: Severity
    title: str  # the docstring's first line
    tier: int
    explains: tuple[str, ...]
    evaluate: Callable
    module: str
    applied: Callable | None = None  # (facts before, facts after) -> what changed, or None

    @property
    def doc(self) -> str:
        return f"docs/rules.md#{self.code.lower()}"

    @classmethod
    def of(cls, mod: ModuleType) -> "Rule":
        title = (mod.__doc__ or "").strip().splitlines()[0] if mod.__doc__ else mod.NAME
        return cls(mod.CODE, mod.NAME, mod.SEVERITY, title, mod.TIER, tuple(mod.EXPLAINS),
                   mod.evaluate, mod.__name__, getattr(mod, "applied", None))


RULES: tuple[Rule, ...] = tuple(Rule.of(m) for m in (
    zd001_wrap_too_coarse,
    zd002_wrap_too_fine,
    zd003_over_staging,
    zd004_exposed_all_gather,
    zd005_slow_link,
    zd006_comm_bound,
    zd007_low_headroom,
    zd008_layer_too_big,
    zd009_dtype_mismatch,
    zd010_straggler,
    zd011_offload_crawl,
    zd012_fragmentation,
    zd013_rank_stopped,
    zd014_launch_bound,
))

BY_CODE: dict[str, Rule] = {r.code: r for r in RULES}
