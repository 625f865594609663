"""Runs the rules, links causes to the symptoms they explain, orders the findings.

Ordering (docs/rules.md, "Order"): most severe first; a cause that fires at WARNING or above
and explains other findings (Rule.EXPLAINS: wrap too fine -> exposed all-gather, ...) is
raised to the severity of the worst finding it explains, and the explained ones are marked
`extra["explained_by"]`; at equal severity a finding comes after those that explain it, causes
before configuration choices before symptoms (tier), then the costlier first
(`extra["cost_seconds_per_step"]`), then by code.
A rule that raises becomes one INFO finding (code ZD000) instead of taking the report down.
"""

from __future__ import annotations

import dataclasses

from .context import Context
from .findings import Finding, Severity
from .rules import BY_CODE, RULES, Rule


def _rule_error(rule: Rule, e: Exception) -> Finding:
    return Finding(code="ZD000", name="rule-error", severity=Severity.INFO,
                   title=f"rule {rule.code} ({rule.name}) failed: {type(e).__name__}: {e}",
                   evidence={"rule": rule.code}, threshold={},
                   fix="Report this as a zerodoc bug, with the run log if you can share it.",
                   doc="docs/rules.md#zd000", extra={"cost_seconds_per_step": 0.0})


def evaluate(ctx: Context, rules=None) -> list[Finding]:
    found: list[Finding] = []
    for rule in RULES if rules is None else rules:
        try:
            found.extend(rule.evaluate(ctx))
        except Exception as e:  # noqa: BLE001 - one broken rule must not hide the others
            found.append(_rule_error(rule, e))
    return order(found)


def _tier(f: Finding) -> int:
    r = BY_CODE.get(f.code)
    return r.tier if r else 3


def order(found: list[Finding]) -> list[Finding]:
    """Link causes and symptoms, raise causes, sort (see module docstring)."""
    found = list(found)
    codes = {f.code for f in found}
    explained_by: dict[str, list[str]] = {}
    for f in found:
        rule = BY_CODE.get(f.code)
        if rule is None or f.severity < Severity.WARNING:
            continue
        for c in rule.explains:
            if c in codes:
                explained_by.setdefault(c, []).append(f.code)
    # Raise causes to the severity of what they explain (chains: repeat until stable).
    for _ in range(4):
        sev = {f.code: f.severity for f in found}
        changed = False
        for i, f in enumerate(found):
            rule = BY_CODE.get(f.code)
            if rule is None or f.severity < Severity.WARNING:
                continue
            worst = max((sev[c] for c in rule.explains if c in sev), default=f.severity)
            if worst > f.severity:
                extra = dict(f.extra)
                extra.setdefault("raised_from", f.severity.name.lower())
                found[i] = dataclasses.replace(f, severity=worst, extra=extra)
                changed = True
        if not changed:
            break
    out = []
    for f in found:
        extra = dict(f.extra)
        if f.code in explained_by:
            extra["explained_by"] = sorted(set(explained_by[f.code]))
        rule = BY_CODE.get(f.code)
        if rule is not None and f.severity >= Severity.WARNING:
            ex = sorted(c for c in rule.explains if c in codes)
            if ex:
                extra["explains"] = ex
        out.append(dataclasses.replace(f, extra=extra))
    out.sort(key=lambda f: (-int(f.severity), "explained_by" in f.extra, _tier(f),
                            -float(f.extra.get("cost_seconds_per_step", 0.0)), f.code))
    return out
