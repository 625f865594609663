"""Writing a run log from step records that already exist (a synthetic run, or a schema-1
log being converted), through the real writer and the same bookkeeping the monitor does.

`Replay` folds each full step record into cumulative totals exactly as the shim's
`Monitor._end_step` does (same order of additions), hands the record to `RunLogWriter`
and, when an interval is due, the totals: the result is the run log the job would have
written. `python -m zerodoc.cli.convert` uses it to rewrite schema-1 logs as the current schema.
"""

from __future__ import annotations

from ..runmodel import CommTotals, RankFacts, RankWindow
from .writer import RunLogWriter


class Replay:
    def __init__(self, writer: RunLogWriter, facts: RankFacts, *, step_clock: bool = True):
        self.writer = writer
        self.facts = facts
        self.names = [u.name for u in facts.units]
        self.totals = RankWindow(facts=facts)
        if step_clock:  # "every T seconds" counts the recorded steps' time, not today's
            writer.clock = lambda: self.totals.updated_unix or facts.started_unix
            writer._last_units_time = facts.started_unix
        writer.write_header(facts)

    def step(self, rec: dict) -> None:
        """One full step record (schema-1 step line shape: unit indices in the rows)."""
        self.fold(rec)
        self.hand_over(rec)

    def fold(self, rec: dict) -> None:
        """Add the step to the cumulative totals (the shim's bookkeeping)."""
        tot, names = self.totals, self.names
        for u, phase, s in rec.get("compute", ()):
            key = (names[u], phase)
            tot.compute[key] = tot.compute.get(key, 0.0) + s
        for u, phase, s in rec.get("framework", ()):
            key = (names[u], phase)
            tot.unit_framework[key] = tot.unit_framework.get(key, 0.0) + s
        for u, phase, coll, *a in rec.get("comm", ()):
            key = (names[u], phase, coll)
            t = tot.comm.get(key)
            if t is None:
                tot.comm[key] = CommTotals(*a)
            else:
                t.add(CommTotals(*a))
        step_s = rec["step_s"]
        if rec.get("detail") is not None:  # a log with sampled steps (zerodoc.windowsamples)
            tot.detail_steps = (tot.detail_steps or 0) + (rec["detail"] is not False)
        tot.steps += 1
        tot.last_step = rec["step"]
        tot.first_step = tot.first_step or rec["step"]
        tot.step_seconds += step_s
        tot.last_step_seconds = step_s
        tot.max_step_seconds = max(tot.max_step_seconds, step_s)
        # null: not measured on an unsampled step
        tot.optimizer_seconds += rec.get("optimizer_s") or 0.0
        tot.framework_seconds += rec.get("framework_s") or 0.0
        tot.other_seconds += rec.get("other_s") or 0.0
        tot.self_seconds += rec.get("self_s") or 0.0
        host = rec.get("host_compute_s")
        tot.host_compute_seconds += sum(r[2] for r in rec.get("compute", ())) \
            if host is None else host
        launch = rec.get("launch") or (0, 0)
        tot.launch_checks += launch[0]
        tot.launch_caught_up += launch[1]
        tot.updated_unix = rec["end_unix"]
        if "mem" in rec:
            tot.memory = dict(rec["mem"])

    def hand_over(self, rec: dict) -> None:
        """What the training thread does with the run log at a step end: hand the record to
        the writer and, once per interval, a copy of the totals."""
        full = dict(rec)
        if rec.get("detail") is not False:  # an unsampled step's per-unit sums stay null
            full.setdefault("compute_s", sum(r[2] for r in rec.get("compute", ())))
            full.setdefault("exposed_s", sum(r[6] for r in rec.get("comm", ())))
        self.writer.write(full)
        if self.writer.units_due(rec["step"]):
            self.writer.write_units(self.totals)

    def close(self, end: bool = True, timeout: float = 5.0) -> None:
        """A clean close (final totals and the end record), or with `end` False the state a
        killed job leaves (no end). `timeout`: how long the writer may take to write what is
        still queued (the writer's bound is the job's, 5 s; what is left then is lost, so a
        tool that queued a long log ahead gives it more)."""
        if end:
            self.writer.close(self.totals.steps, self.totals, timeout=timeout)
        else:
            self.writer.abandon(timeout)
