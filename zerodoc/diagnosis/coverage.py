"""What the rules cannot see: a run with no data is not a healthy run.

The rules read per-unit collectives and per-step times. A run with no completed step, or
with no sharded units (zerodoc attached before `fully_shard` / `FSDP(...)` /
`deepspeed.initialize`, so no collective was ever measured) gives the rules nothing to
read; "no findings" would then be a false all-clear. `data_problems()` names what is
missing; the report prints it above the findings and fails `--fail-on`, the TUI shows it
where the top finding would be. Problems the shim itself noticed at attach time (an
optimizer holding none of the model's parameters) come from the run log header
(`config["attach_warnings"]`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..runmodel import RunSnapshot
from ..shim.guards import ATTACH_AFTER  # stdlib-only module: no torch


@dataclass(frozen=True)
class DataProblem:
    kind: str  # "no-ranks" | "no-steps" | "no-sharded-units" | "attach-warning"
    message: str
    fix: str


def _trace(w) -> bool:
    cfg = w.facts.config
    return isinstance(cfg, dict) and cfg.get("source") == "profiler trace"


def _dumps(w) -> bool:
    cfg = w.facts.config
    return isinstance(cfg, dict) and cfg.get("source") == "flightrec"


def data_problems(snap: RunSnapshot) -> list[DataProblem]:
    """What keeps the rules from reading this run ([] when they have data)."""
    if not snap.ranks:
        return [DataProblem("no-ranks", "no rank of the run reported anything",
                            "check that the job runs zerodoc.attach() and that the source "
                            "points at its run directory / endpoints")]
    out: list[DataProblem] = []
    first = snap.ranks[min(snap.ranks)]
    if _dumps(first):  # flight-recorder dumps hold collectives, never steps or units: the
        return []      # report says what they can say (zerodoc.report, "dumps")
    if not any(w.steps for w in snap.ranks.values()):
        ended = snap.ranks.keys() <= snap.ended_ranks
        out.append(DataProblem(
            "no-steps",
            "the run ended without a completed step: there is no data to diagnose" if ended
            else "no rank has completed a step yet: there is no data to diagnose",
            "a step ends at optimizer.step() of the optimizer passed to attach() (or at "
            "monitor.step() when none was): pass the optimizer that steps this model"))
    if not first.facts.units and not _trace(first):  # traces: trace.scope says what they can
        fw = first.facts.framework
        what = "no sharded units" if fw in ("none", "") else f"no sharded units ({fw})"
        out.append(DataProblem(
            "no-sharded-units",
            f"the run has {what}: zerodoc measured no collective, so the rules cannot say "
            "anything about sharding, communication or overlap",
            ATTACH_AFTER + "; attach() is given the sharded model (or the DeepSpeed engine)"))
    seen = {p.kind for p in out}
    for w in snap.ranks.values():
        cfg = w.facts.config if isinstance(w.facts.config, dict) else {}
        for warn in cfg.get("attach_warnings") or ():
            if not isinstance(warn, dict) or warn.get("kind") in seen:
                continue
            seen.add(warn.get("kind"))
            out.append(DataProblem(str(warn.get("kind", "attach-warning")),
                                   str(warn.get("message", "")).removeprefix("zerodoc: "),
                                   str(warn.get("fix", ""))))
    return out
