"""A flight-recorder dump's sequence number -> the step, unit and phase that issued it, from a
zerodoc run log of the same job (`zerodoc report DUMPS --runlog RUNDIR`).

The run log (docs/runlog.md) keeps two things for this (zerodoc/shim/collorder.py): each
step record's `seq`, every process group's sequence number at the step's end (in the order
of the newest `collorder` record's `groups`, by `ProcessGroup.group_name`: what a dump's
`process_group[0]` says), and `collorder` records: per group, the count of collectives in a
detail step (`n`) and `[offset, unit, phase, kind]` for each one the per-unit wrappers
issued (offset 1: the group's first collective of the step; unit, phase and kind: indices
into the record's `units`, `phases`, `kinds`), written when they change.

Collective S of group G falls in the step after the newest step whose end number E is below
S, at offset S - E. Where the log's newest step ends earlier than that (a rank that stopped
in mid-step has not written the step it stopped in; a log read before its writer caught up),
the schedule is taken to repeat: offset (S - E - 1) mod n + 1 of step E's + 1 + (S - E - 1)
div n, said in the placement (`steps_past_log`). An offset no wrapper issued (the user's own
collective on that group) has no unit: placed as the step alone.

Each rank's log is read from its end, newest segment only (`scan.reverse_lines`): a dump is
the state of the newest process of each rank.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import UserError
from ..runlog.records import rank_log_name
from ..runlog.scan import kind_of, reverse_lines

MAX_STEPS_READ = 4096  # step lines read back per rank at most (a dump holds the newest ones)


class RankOrder:
    """What one rank's run log says: its newest `collorder` record (groups and order) and
    the step records after it, newest first, as (step, {group: number at the step's end})."""

    def __init__(self, rec: dict, steps: list[tuple[int, dict]]):
        self.groups = [str(g) for g in rec.get("groups") or []]
        self.order = rec.get("order") or {}
        self.names = {k: rec.get(k) if isinstance(rec.get(k), list) else []
                      for k in ("units", "phases", "kinds")}
        self.steps = steps

    def _name(self, table: str, i) -> str | None:
        names = self.names[table]
        return str(names[i]) if type(i) is int and 0 <= i < len(names) else None

    def place(self, group: str, seq: int) -> dict | None:
        """Where collective `seq` of `group` was issued: {step, offset, unit, phase,
        collective, steps_past_log}; None when this log cannot say."""
        g = self.order.get(group)
        if not isinstance(g, dict):
            return None
        end = next(((s, e[group]) for s, e in self.steps if e.get(group, seq) < seq), None)
        if end is None:
            return None
        n = int(g.get("n") or 0)
        off, past = seq - end[1], 0
        if n > 0 and off > n:  # past the log's newest step: the schedule repeats
            past, off = (off - 1) // n, (off - 1) % n + 1
        row = next((r for r in g.get("at", ()) if isinstance(r, list) and len(r) >= 4
                    and r[0] == off), None)
        return {"step": end[0] + 1 + past, "offset": off, "of": n or None,
                "unit": self._name("units", row[1]) if row else None,
                "phase": self._name("phases", row[2]) if row else None,
                "collective": self._name("kinds", row[3]) if row else None,
                "steps_past_log": past}


def read_rank(path: Path) -> RankOrder | None:
    """The newest `collorder` record of one rank's log and its steps after it (None: the
    log holds none: an older zerodoc, a job without process groups, or no detail step yet)."""
    steps: list[tuple[int, list]] = []
    try:
        with open(path, "rb") as f:
            end = f.seek(0, 2)
            for _, line in reverse_lines(f, end):
                kind = kind_of(line)
                if kind == "header":
                    return None  # the newest segment has no order record
                if kind == "step" and b'"seq":' in line and len(steps) < MAX_STEPS_READ:
                    rec = _loads(line)
                    if rec and isinstance(rec.get("seq"), list):
                        steps.append((int(rec.get("step") or 0), rec["seq"]))
                elif kind == "collorder":
                    rec = _loads(line)
                    if rec and isinstance(rec.get("order"), dict):
                        groups = [str(g) for g in rec.get("groups") or []]
                        return RankOrder(rec, [(s, dict(zip(groups, seq))) for s, seq in steps
                                               if len(seq) == len(groups)])
    except OSError:
        return None
    return None


def _loads(line: bytes) -> dict | None:
    try:
        d = json.loads(line)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    return d if isinstance(d, dict) else None


class RunLogOrders:
    """Every rank's `RankOrder` of a run directory, read once each on demand."""

    def __init__(self, run_dir: str | Path):
        self.path = Path(run_dir)
        if not self.path.is_dir() or not any(self.path.glob("rank-*.jsonl")):
            raise UserError(f"--runlog {run_dir}: not a zerodoc run directory (no "
                            "rank-*.jsonl run logs in it)")
        self._ranks: dict[int, RankOrder | None] = {}
        self.read: set[int] = set()

    def rank(self, r: int) -> RankOrder | None:
        if r not in self._ranks:
            self._ranks[r] = read_rank(self.path / rank_log_name(r))
            self.read.add(r)
        return self._ranks[r]

    def place(self, group: str, seq: int | None, ranks: list[int]) -> dict | None:
        """Collective `seq` of `group` placed by the first of `ranks` whose log can (the
        rank itself first: its own schedule), with `from_rank` said."""
        if seq is None or seq < 1:
            return None
        for r in ranks:
            o = self.rank(r)
            got = o.place(group, seq) if o is not None else None
            if got is not None:
                return {**got, "from_rank": r}
        return None

    def any_order(self, ranks) -> bool:
        return any(self.rank(r) is not None for r in ranks)
