"""What every rule module shares: building a `Finding` with its code, slug and doc anchor."""

from __future__ import annotations

from ..findings import Finding, Predicted, Severity
from ..observables import observe


def finding(code: str, name: str, severity: Severity, title: str, *,
            evidence: dict, threshold: dict, fix: str, predicted: str | None = None,
            effects=(), ranks=(), units=(), cost_seconds_per_step: float = 0.0,
            **extra) -> Finding:
    """A Finding; `cost_seconds_per_step` (the time per step it costs, where a rule can say)
    orders findings of equal severity, and is kept in `extra`. `effects`: the predicted
    effects of the fix, machine-readable (`effect()`); None entries are dropped."""
    return Finding(code=code, name=name, severity=severity, title=title, evidence=evidence,
                   threshold=threshold, fix=fix, predicted=predicted,
                   effects=tuple(e for e in effects if e is not None),
                   ranks=tuple(sorted(ranks)), units=tuple(units),
                   doc=f"docs/rules.md#{code.lower()}",
                   extra={"cost_seconds_per_step": float(max(0.0, cost_seconds_per_step)),
                          **extra})


def effect(ctx, metric: str, direction: str, value: float | None = None, *,
           cost: bool = False) -> Predicted | None:
    """A predicted effect on an observable: `now` is read from the run the way `zerodoc
    compare` reads it, so predicted and observed changes are measured alike. None when the
    run does not show the metric."""
    now = observe(ctx, metric)
    if now is None:
        return None
    return Predicted(metric, direction, None if value is None else r6(max(0.0, value)), r6(now),
                     cost)


# The observables the step model predicts: (observable, key in `zerodoc.whatif.answer`).
# The main benefit first (what the fixes act on), then the step.
MODEL_METRICS = (("exposed_comm_seconds_per_step", "exposed_comm_s"), ("step_seconds", "step_s"))


def whatif_model(ctx):
    """The step model fitted to this run (`zerodoc.whatif.fit`), once per diagnosis (cached on
    the context), for every rule that predicts a time; None when the run cannot carry one (no
    per-unit detail, no collectives): those rules fall back to their direction-only texts.
    Here, not on `Context`: the model reads the context (the planner's inputs), so the context
    must not import it."""
    if "_whatif_model" not in ctx.__dict__:
        from ...whatif import fit

        model = None
        if ctx.active:
            try:
                model = fit(ctx.snapshot, getattr(ctx, "link_profile", None))
            except Exception:  # noqa: BLE001 - a thin or odd run: predictions without the model
                model = None
        ctx.__dict__["_whatif_model"] = model
    return ctx.__dict__["_whatif_model"]


def whatif(ctx, changes) -> dict | None:
    """`zerodoc.whatif.answer` for `changes` on this run (cached per change), or None."""
    cache = ctx.__dict__.setdefault("_whatif_answers", {})
    if changes not in cache:
        model = whatif_model(ctx)
        ans = None
        if model is not None:
            from ...whatif import answer

            try:
                ans = answer(model, changes, memory=False)
            except Exception:  # noqa: BLE001 - a change the model cannot take
                ans = None
        cache[changes] = ans
    return cache[changes]


def model_effects(ctx, changes) -> tuple[list[Predicted], str | None]:
    """The predicted effects of a configuration change from the step model fitted to the run
    (`whatif` above, `zerodoc.whatif`): step time and exposed communication, each with its
    range, and the text that says so. The model's change (prediction - its replay of the run)
    is applied to the observable as `zerodoc compare` reads it, so `now` is the run's value.
    ([], None) when the run carries no model: the rule keeps its direction-only texts."""
    from ...whatif import summary

    ans = whatif(ctx, changes)
    if ans is None:
        return [], None
    out = []
    for metric, key in MODEL_METRICS:
        now = observe(ctx, metric)
        if now is None:
            continue
        base, pred = ans["baseline"][key], ans["predicted"][key]
        lo, hi = ans["predicted"][f"{key}_range"]
        after = lambda x: r6(max(0.0, now + x - base))  # noqa: E731
        out.append(Predicted(metric, "down" if pred <= base else "up", after(pred), r6(now),
                             lo=after(lo), hi=after(hi)))
    prof = getattr(ctx, "link_profile", None)
    priced = [r["collective"] for r in ans.get("link_model", {}).get("beyond_run_sizes", ())
              if r.get("priced_by") == "profile"]
    via = f"; calls beyond the run's sizes priced by the link profile {prof.path} " \
        f"({', '.join(priced)})" if prof is not None and priced else ""
    return out, f"what-if ({', '.join(changes.describe())}): {summary(ans)}{via}"


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
