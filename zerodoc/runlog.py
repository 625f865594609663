"""The run log: one JSON-lines file per rank, readable with no server.

Layout of a run directory::

    <run_dir>/rank-00000.jsonl   header line, then one line per completed step, then "end"
    <run_dir>/rank-00001.jsonl
    ...

Line types (schema 1):

- ``{"type": "header", "schema": 1, ...RankFacts}`` — static facts; ``units`` is a list of
  `UnitFacts` objects, and step lines refer to units by their index in it.
- ``{"type": "step", "step": N, "end_unix": t, "step_s", "optimizer_s", "framework_s",
  "other_s", "wait_s", "self_s", "compute_s" (sum of compute rows), "exposed_s" (sum of
  exposed comm), "compute": [[unit, phase, seconds]...], "comm": [[unit, phase,
  collective, count, bytes, seconds, exposed_s, hidden_s]...], "mem": {population: bytes},
  "errors": {hook: count}, on GPU also "host_compute_s" (the host's launch time of the
  compute rows, which are device time) and "launch": [segments checked, caught up]}``
  — one per completed step, written and flushed at the step's end,
  so a crashed job leaves every completed step on disk.
- ``{"type": "end", "end_unix": t, "steps": N}`` — written by a clean `close()`.
- any other type (``{"type": "stall", ...}``: the watchdog, zerodoc/shim/watchdog.py) is kept
  as it is in `RankLog.events` (the newest `MAX_EVENTS`).

`load_run()` turns a run directory into a `RunSnapshot` (totals over the last K steps);
`read_rank_log()` gives the per-step records.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from .errors import UserError
from .model import CommTotals, RankFacts, RankWindow, RunSnapshot, UnitFacts
from .stalls import last_stall

SCHEMA = 1
DEFAULT_ROOT = "zerodoc-runs"
MAX_EVENTS = 256  # non-step records kept per rank by the readers


class RunLogError(UserError):
    """A run directory or run log that cannot be read; the message says why."""


def rank_log_name(rank: int) -> str:
    return f"rank-{rank:05d}.jsonl"


# --------------------------------------------------------------------------------------
# writing (used inside the training job: stdlib only, never raises into the job)


class RunLogWriter:
    """Appends JSON lines for one rank; each line is flushed when written."""

    def __init__(self, run_dir: str | os.PathLike, rank: int):
        self.path = Path(run_dir) / rank_log_name(rank)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Line-buffered text file: every record reaches the OS when its line ends.
        self._f = open(self.path, "a", buffering=1, encoding="utf-8")

    def write_header(self, facts: RankFacts) -> None:
        rec = {"type": "header", "schema": SCHEMA, **dataclasses.asdict(facts)}
        self._f.write(json.dumps(rec, separators=(",", ":"), default=str) + "\n")

    def write(self, record: dict) -> None:
        self._f.write(json.dumps(record, separators=(",", ":")) + "\n")

    def close(self, steps: int) -> None:
        if self._f.closed:
            return
        self.write({"type": "end", "end_unix": time.time(), "steps": steps})
        self._f.close()


# --------------------------------------------------------------------------------------
# reading


@dataclass
class StepRecord:
    step: int
    end_unix: float
    step_seconds: float
    optimizer_seconds: float
    framework_seconds: float
    other_seconds: float
    self_seconds: float
    compute: dict[tuple[str, str], float]
    comm: dict[tuple[str, str, str], CommTotals]
    memory: dict[str, int]
    errors: dict[str, int]
    host_compute_seconds: float = 0.0
    launch_checks: int = 0
    launch_caught_up: int = 0


@dataclass
class RankLog:
    facts: RankFacts
    steps: list[StepRecord] = field(default_factory=list)
    ended: bool = False  # a clean close was recorded
    bad_lines: int = 0  # truncated or malformed lines skipped
    events: list[dict] = field(default_factory=list)  # other record types, in order

    def add_event(self, rec: dict) -> None:
        self.events.append(rec)
        if len(self.events) > MAX_EVENTS:
            del self.events[:-MAX_EVENTS]


def facts_from_dict(d: dict) -> RankFacts:
    """RankFacts from a header dict (run log header, or a cached scrape)."""
    try:
        units = tuple(UnitFacts(**u) for u in d["units"])
        names = {f.name for f in dataclasses.fields(RankFacts)}
        kw = {k: v for k, v in d.items() if k in names}
        kw["units"] = units
        kw["mesh_shape"] = tuple(kw.get("mesh_shape") or ())
        if kw.get("mesh_dim_names") is not None:
            kw["mesh_dim_names"] = tuple(kw["mesh_dim_names"])
        return RankFacts(**kw)
    except (KeyError, TypeError, ValueError) as e:
        raise RunLogError(f"run log header is not a zerodoc schema-{SCHEMA} header: {e}") from e


def _step_from_dict(d: dict, unit_names: list[str]) -> StepRecord:
    compute = {}
    for u, phase, s in d.get("compute", ()):
        key = (unit_names[u], phase)
        compute[key] = compute.get(key, 0.0) + float(s)
    comm: dict[tuple[str, str, str], CommTotals] = {}
    for u, phase, coll, n, b, s, ex, hid in d.get("comm", ()):
        key = (unit_names[u], phase, coll)
        t = comm.get(key)
        if t is None:  # the common case: one row per key (hot in the TUI at 64 x 128)
            comm[key] = CommTotals(int(n), int(b), float(s), float(ex), float(hid))
        else:
            t.add(CommTotals(int(n), int(b), float(s), float(ex), float(hid)))
    return StepRecord(
        step=int(d["step"]),
        end_unix=float(d["end_unix"]),
        step_seconds=float(d["step_s"]),
        optimizer_seconds=float(d.get("optimizer_s", 0.0)),
        framework_seconds=float(d.get("framework_s", 0.0)),
        other_seconds=float(d.get("other_s", 0.0)),
        self_seconds=float(d.get("self_s", 0.0)),
        compute=compute,
        comm=comm,
        memory={k: int(v) for k, v in d.get("mem", {}).items()},
        errors={k: int(v) for k, v in d.get("errors", {}).items()},
        host_compute_seconds=float(d.get("host_compute_s", d.get("compute_s", 0.0))),
        launch_checks=int(d.get("launch", (0, 0))[0]),
        launch_caught_up=int(d.get("launch", (0, 0))[1]),
    )


def read_rank_log(path: str | os.PathLike) -> RankLog:
    """Parse one rank's log. A torn last line (crash mid-write) is skipped and counted."""
    path = Path(path)
    try:
        fh = open(path, encoding="utf-8", errors="replace")
    except OSError as e:
        raise RunLogError(f"cannot read run log {path}: {e.strerror or e}") from e
    with fh:
        first = fh.readline()
        if not first.strip():
            raise RunLogError(f"{path}: empty run log (the rank wrote no header yet)")
        try:
            head = json.loads(first)
        except json.JSONDecodeError as e:
            raise RunLogError(f"{path}: first line is not JSON ({e.msg})") from e
        if not isinstance(head, dict) or head.get("type") != "header":
            raise RunLogError(f"{path}: first line is not a zerodoc header")
        if head.get("schema") != SCHEMA:
            raise RunLogError(f"{path}: run log schema {head.get('schema')!r}, "
                              f"this zerodoc reads schema {SCHEMA}")
        log = RankLog(facts=facts_from_dict(head))
        names = [u.name for u in log.facts.units]
        for line in fh:
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                kind = rec.get("type")
                if kind == "step":
                    log.steps.append(_step_from_dict(rec, names))
                elif kind == "end":
                    log.ended = True
                elif isinstance(kind, str) and kind != "header":
                    log.add_event(rec)
            except (json.JSONDecodeError, KeyError, TypeError, ValueError, IndexError,
                    AttributeError):
                log.bad_lines += 1
    return log


def window_from_steps(facts: RankFacts, steps: Iterable[StepRecord],
                      errors: dict[str, int] | None = None) -> RankWindow:
    """Fold step records into one RankWindow (totals over those steps)."""
    w = RankWindow(facts=facts)
    for s in steps:
        if w.steps == 0:
            w.first_step = s.step
        w.steps += 1
        w.last_step = s.step
        w.step_seconds += s.step_seconds
        w.last_step_seconds = s.step_seconds
        w.max_step_seconds = max(w.max_step_seconds, s.step_seconds)
        w.optimizer_seconds += s.optimizer_seconds
        w.framework_seconds += s.framework_seconds
        w.other_seconds += s.other_seconds
        w.self_seconds += s.self_seconds
        w.host_compute_seconds += s.host_compute_seconds
        w.launch_checks += s.launch_checks
        w.launch_caught_up += s.launch_caught_up
        w.updated_unix = s.end_unix
        w.step_times.append(s.step_seconds)
        for k, v in s.compute.items():
            w.compute[k] = w.compute.get(k, 0.0) + v
        for k, t in s.comm.items():
            w.comm.setdefault(k, CommTotals()).add(t)
        if s.memory:
            w.memory = dict(s.memory)
        if s.errors:
            w.errors = dict(s.errors)
    if errors:
        w.errors = dict(errors)
    return w


def rank_logs(run_dir: str | os.PathLike) -> list[Path]:
    return sorted(Path(run_dir).glob("rank-*.jsonl"))


def load_run(run_dir: str | os.PathLike, window: int | None = 20,
             stale_after_s: float = 30.0) -> RunSnapshot:
    """A RunSnapshot from a run directory: each rank's totals over its last `window` steps
    (all steps when None). Ranks whose log has no clean end and no step for `stale_after_s`
    seconds are listed as stale."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunLogError(f"no run directory at {run_dir}")
    paths = rank_logs(run_dir)
    if not paths:
        raise RunLogError(f"{run_dir} holds no rank-*.jsonl run logs")
    snap = RunSnapshot(source=str(run_dir))
    now = time.time()
    for p in paths:
        log = read_rank_log(p)
        steps = log.steps[-window:] if window else log.steps
        w = window_from_steps(log.facts, steps)
        snap.ranks[log.facts.rank] = w
        last = w.updated_unix or log.facts.started_unix
        if not log.ended and now - last > stale_after_s:
            snap.stale_ranks.add(log.facts.rank)
        stall = last_stall(log.events)
        if stall is not None:
            snap.stalls[log.facts.rank] = stall
        if log.ended and not _failed(stall):
            snap.ended_ranks.add(log.facts.rank)
    return snap


def _failed(stall: dict | None) -> bool:
    """The rank closed while an exception propagated (its "end" is not a clean close)."""
    return stall is not None and stall.get("state") == "failed"


def latest_run(root: str | os.PathLike = DEFAULT_ROOT) -> Path:
    """The most recently written run directory under `root`."""
    root = Path(root)
    candidates = [d for d in root.glob("*") if d.is_dir() and rank_logs(d)] if root.is_dir() else []
    if not candidates:
        raise RunLogError(f"no zerodoc runs under {root.resolve()} "
                          "(run `zerodoc demo`, or pass a run directory)")
    return max(candidates, key=lambda d: max(p.stat().st_mtime for p in rank_logs(d)))


class RunFollower:
    """Follows a live run directory: `poll()` parses only what was appended since the last
    call (a line still being written stays for the next poll). Used by the demo and the TUI."""

    def __init__(self, run_dir: str | os.PathLike, keep: int | None = None):
        self.run_dir = Path(run_dir)
        self.keep = keep  # keep only the last N step records per rank (None: all)
        self.logs: dict[int, RankLog] = {}
        self._pos: dict[Path, int] = {}
        self._names: dict[Path, list[str]] = {}
        self._rank_of: dict[Path, int] = {}

    def poll(self) -> list[tuple[int, StepRecord]]:
        """New step records since the last poll, as (rank, record)."""
        new: list[tuple[int, StepRecord]] = []
        for p in rank_logs(self.run_dir):
            try:
                with open(p, "rb") as f:
                    f.seek(self._pos.get(p, 0))
                    chunk = f.read()
            except OSError:
                continue
            end = chunk.rfind(b"\n")
            if end < 0:
                continue
            self._pos[p] = self._pos.get(p, 0) + end + 1
            for raw in chunk[:end].splitlines():
                try:
                    rec = json.loads(raw)
                except json.JSONDecodeError:
                    continue
                kind = rec.get("type") if isinstance(rec, dict) else None
                if kind == "header":
                    facts = facts_from_dict(rec)
                    self.logs[facts.rank] = RankLog(facts=facts)
                    self._names[p] = [u.name for u in facts.units]
                    self._rank_of[p] = facts.rank
                elif p in self._rank_of:
                    log = self.logs[self._rank_of[p]]
                    if kind == "step":
                        try:
                            s = _step_from_dict(rec, self._names[p])
                        except (KeyError, TypeError, ValueError, IndexError):
                            log.bad_lines += 1
                            continue
                        log.steps.append(s)
                        new.append((log.facts.rank, s))
                    elif kind == "end":
                        log.ended = True
                    elif isinstance(kind, str):
                        log.add_event(rec)
        if self.keep:
            for log in self.logs.values():
                if len(log.steps) > self.keep:
                    del log.steps[:-self.keep]
        return new

    def snapshot(self, window: int | None = 20) -> RunSnapshot:
        snap = RunSnapshot(source=str(self.run_dir))
        for rank, log in sorted(self.logs.items()):
            steps = log.steps[-window:] if window else log.steps
            snap.ranks[rank] = window_from_steps(log.facts, steps)
        self.annotate(snap)
        return snap

    def annotate(self, snap: RunSnapshot) -> None:
        """Clean closes and the watchdog's records of the followed ranks, into `snap`."""
        for rank, log in self.logs.items():
            stall = last_stall(log.events)
            if stall is not None:
                snap.stalls[rank] = stall
            if log.ended and not _failed(stall):
                snap.ended_ranks.add(rank)
