"""What the TUI shows, fetched off the UI thread: one `Frame` per refresh.

`Feed.fetch()` asks the source for a snapshot, asks the rules engine for findings
(`zerodoc.diagnosis.diagnose`), keeps per-step history and remembers ranks that went away.
It never raises: a failing source or engine becomes a message in the frame, and the last
good numbers stay on screen. Plain Python, no Textual, so the bench and tests drive it
directly.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

from ..runmodel import RankWindow, RunSnapshot, busbw
from ..thresholds import DEFAULT as DEFAULT_THRESHOLDS
from ..humanize import duration
from .history import History, Series

Diagnose = Callable[[RunSnapshot], list]


@dataclass(slots=True)
class UnitTotals:
    """One unit on one rank, per step (window totals / steps), base units."""

    ag_seconds: float = 0.0
    ag_exposed_seconds: float = 0.0
    ag_bytes: float = 0.0
    ag_count: float = 0.0
    rs_seconds: float = 0.0
    rs_exposed_seconds: float = 0.0
    ar_seconds: float = 0.0  # all-reduce: DDP buckets, ZeRO-1/2, FSDP1 NO_SHARD
    ar_exposed_seconds: float = 0.0
    compute_seconds: float = 0.0
    ag_busbw: float | None = None  # bytes/s; None when no all-gather was timed

    @property
    def ag_exposed_fraction(self) -> float | None:
        return self.ag_exposed_seconds / self.ag_seconds if self.ag_seconds > 0 else None


def unit_totals(w: RankWindow) -> dict[str, UnitTotals]:
    """Per-unit, per-step numbers of one rank in one pass over its window."""
    n = w.per_unit_steps or 1
    out: dict[str, UnitTotals] = {u.name: UnitTotals() for u in w.facts.units}
    for (unit, _phase, coll), t in w.comm.items():
        u = out.get(unit)
        if u is None:
            u = out[unit] = UnitTotals()
        if coll == "all_gather":
            u.ag_seconds += t.seconds
            u.ag_exposed_seconds += t.exposed_seconds
            u.ag_bytes += t.bytes
            u.ag_count += t.count
        elif coll == "reduce_scatter":
            u.rs_seconds += t.seconds
            u.rs_exposed_seconds += t.exposed_seconds
        elif coll == "all_reduce":
            u.ar_seconds += t.seconds
            u.ar_exposed_seconds += t.exposed_seconds
    for (unit, _phase), s in w.compute.items():
        u = out.get(unit)
        if u is None:
            u = out[unit] = UnitTotals()
        u.compute_seconds += s
    groups = {uf.name: uf.group_size for uf in w.facts.units}
    for name, u in out.items():
        if u.ag_seconds > 0:
            u.ag_busbw = busbw(u.ag_bytes / u.ag_seconds, "all_gather",
                               groups.get(name, w.facts.world_size))
        u.ag_seconds /= n
        u.ag_exposed_seconds /= n
        u.ag_bytes /= n
        u.ag_count /= n
        u.rs_seconds /= n
        u.rs_exposed_seconds /= n
        u.ar_seconds /= n
        u.ar_exposed_seconds /= n
        u.compute_seconds /= n
    return out


class LazyUnits(dict):
    """rank -> that rank's `unit_totals`, computed when first asked for (a view aggregated
    over ranks reads `zerodoc.unitstats` instead, so at a thousand ranks none are)."""

    def __init__(self, snap: RunSnapshot, cache: dict):
        super().__init__()
        self._snap, self._cache = snap, cache

    def _get(self, r):
        w = self._snap.ranks.get(r)
        if w is None:
            return None
        hit = self._cache.get(r)
        if hit is None or hit[0] is not w:
            hit = self._cache[r] = (w, unit_totals(w))
        return hit[1]

    def get(self, r, default=None):
        got = self._get(r)
        return default if got is None else got

    def __getitem__(self, r):
        got = self._get(r)
        if got is None:
            raise KeyError(r)
        return got

    def __contains__(self, r) -> bool:
        return r in self._snap.ranks

    def __iter__(self):
        return iter(self._snap.ranks)

    def __len__(self) -> int:
        return len(self._snap.ranks)

    def keys(self):
        return self._snap.ranks.keys()

    def items(self):
        return ((r, self[r]) for r in self._snap.ranks)

    def values(self):
        return (self[r] for r in self._snap.ranks)


@dataclass
class Frame:
    """Everything one refresh shows. Treat as immutable once built."""

    description: str
    snapshot: RunSnapshot  # gone ranks keep their last window; stale_ranks is complete
    findings: list = field(default_factory=list)  # zerodoc Finding, most severe first
    fetched_unix: float = 0.0
    good_unix: float | None = None  # when the source last answered
    source_error: str | None = None
    diagnose_error: str | None = None
    stale: dict[int, str] = field(default_factory=dict)  # rank -> why
    ended: set[int] = field(default_factory=set)  # ranks whose run recorded a clean end
    data_problems: list = field(default_factory=list)  # what the rules cannot see (coverage)
    missing: set[int] = field(default_factory=set)  # world size has them, no source shows
    history: dict[int, Series] = field(default_factory=dict)
    units: dict[int, dict[str, UnitTotals]] = field(default_factory=dict)
    window: int | None = None
    signature: tuple = ()
    # rules waiting for sampled steps (zerodoc.diagnosis.waiting): {"rules", "samples",
    # "message"}, or None
    waiting: dict | None = None

    @property
    def run_ended(self) -> bool:
        """The run is over: some rank recorded a clean end and no rank is still live (the
        others, if any, stopped without one: they are stale)."""
        ranks = set(self.snapshot.ranks)
        return bool(self.ended & ranks) and ranks <= self.ended | set(self.stale)

    @cached_property
    def fresh_ranks(self) -> list[int]:
        """Ranks to aggregate over: the non-stale ones, or all when every rank is stale
        (once per frame: every view and caption asks, a thousand ranks each time)."""
        fresh = [r for r in sorted(self.snapshot.ranks) if r not in self.stale]
        return fresh or sorted(self.snapshot.ranks)


def _error_text(e: BaseException) -> str:
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    name = type(e).__name__
    plain = ("UserError", "RunLogError", "RunLogInvalid")  # their message says it all
    return f"{name}: {msg}" if msg and name not in plain else (msg or name)


def _data_problems(snap: RunSnapshot) -> list:
    try:
        from ..diagnosis.coverage import data_problems
    except ImportError:
        return []
    try:
        return data_problems(snap) if snap.ranks else []
    except Exception:  # noqa: BLE001 - odd data must not take the UI down
        return []


def _waiting(snap: RunSnapshot) -> dict | None:
    try:
        from ..diagnosis import waiting
    except ImportError:
        return None
    try:
        return waiting(snap)
    except Exception:  # noqa: BLE001 - odd data must not take the UI down
        return None


def default_diagnose() -> tuple[Diagnose | None, str | None]:
    try:
        from ..diagnosis import diagnose
    except ImportError as e:
        return None, f"diagnosis engine unavailable ({e})"
    return diagnose, None


class Feed:
    """Turns a `Source` into `Frame`s. Call `fetch()` from one thread at a time."""

    def __init__(self, source, *, diagnose: Diagnose | None = None,
                 clock: Callable[[], float] = time.time, history: int = 120,
                 stale_after_s: float | None = None):
        self.source = source
        self.description = getattr(source, "description", str(source))
        if diagnose is None:
            diagnose, self._no_engine = default_diagnose()
        else:
            self._no_engine = None
        self.diagnose = diagnose
        self.clock = clock
        self.stale_after_s = stale_after_s if stale_after_s is not None else \
            getattr(source, "stale_after_s", DEFAULT_THRESHOLDS.stale_after_seconds)
        self.history = History(history)
        self.window = getattr(source, "window", None)
        self._known: dict[int, RankWindow] = {}  # last window of every rank ever seen
        self._ended: set[int] = set()  # ranks whose run recorded a clean end
        self._good_unix: float | None = None
        self._findings: list = []
        self._diag_error: str | None = self._no_engine
        self._diag_key: tuple | None = None
        self._units: dict[int, tuple[RankWindow, dict[str, UnitTotals]]] = {}
        self._points = getattr(source, "take_points", None)
        self.refreshes = 0

    # -- the source ------------------------------------------------------------------
    def _snapshot(self) -> tuple[RunSnapshot, set[int]]:
        snap = self.source.snapshot()
        if not isinstance(snap, RunSnapshot) or not isinstance(snap.ranks, dict) or \
                not all(isinstance(w, RankWindow) for w in snap.ranks.values()):
            raise TypeError(f"source returned {type(snap).__name__}, not a RunSnapshot")
        return snap, set(getattr(snap, "ended_ranks", ()) or ())


    def fetch(self) -> Frame:
        now = self.clock()
        self.refreshes += 1
        source_error = None
        ended: set[int] = set()
        try:
            snap, ended = self._snapshot()
            self._good_unix = now
        except Exception as e:  # noqa: BLE001 - any source failure is shown, never raised
            source_error = _error_text(e)
            snap = RunSnapshot(source=self.description)
        # A rank that recorded a clean end stays ended, also when its source goes away
        # (endpoints of a finished job); reported again without an end, it runs again.
        for r in snap.ranks:
            if r in ended:
                self._ended.add(r)
            else:
                self._ended.discard(r)
        ended = set(self._ended)
        # Ranks the source no longer reports keep their last window and are stale.
        stale: dict[int, str] = {}
        ranks = dict(snap.ranks)
        for r in sorted(set(self._known) - set(ranks)):
            ranks[r] = self._known[r]
            if r not in ended:
                stale[r] = "stopped reporting" if source_error is None else "source unreachable"
        for r, w in ranks.items():
            if r in stale or r in ended:
                continue
            last = w.updated_unix or w.facts.started_unix
            if last and now - last > self.stale_after_s and self._points is not None:
                stale[r] = f"no step for {duration(now - last)}"
        for r in snap.stale_ranks - ended:
            stale.setdefault(r, "source marks it stale")
        # Another rank far ahead in wall-clock time also means this one stopped.
        newest = max((w.updated_unix for w in ranks.values()), default=0.0)
        for r, w in ranks.items():
            if r not in stale and r not in ended and w.updated_unix and \
                    newest - w.updated_unix > self.stale_after_s:
                stale[r] = f"{duration(newest - w.updated_unix)} behind rank " \
                           f"{max(ranks, key=lambda k: ranks[k].updated_unix)}"
        self._known.update(snap.ranks)
        ended &= set(ranks) - set(stale)
        full = RunSnapshot(source=snap.source or self.description,
                           ranks=dict(sorted(ranks.items())), stale_ranks=set(stale),
                           ended_ranks=set(ended), stalls=dict(snap.stalls),
                           missing_ranks=set(snap.missing_ranks), unit_stats=snap.unit_stats,
                           log_notes=list(snap.log_notes), jobs=snap.jobs)

        self._history_update(full)
        findings, diag_error = self._diagnose(full)
        problems = _data_problems(full) if source_error is None or full.ranks else []
        waiting = _waiting(full)
        units = LazyUnits(full, self._units)
        sig = (
            tuple((r, w.steps, w.last_step, w.updated_unix) for r, w in full.ranks.items()),
            tuple(sorted(stale.items())), tuple(sorted(ended)), source_error, diag_error,
            tuple((f.code, f.title, f.ranks, f.units) for f in findings),
            tuple((r, w.per_unit_steps, w.detail_last_step) for r, w in full.ranks.items()),
            None if waiting is None else (tuple(waiting["rules"]), waiting["message"]),
        )
        return Frame(
            description=self.description, snapshot=full, findings=findings,
            fetched_unix=now, good_unix=self._good_unix, source_error=source_error,
            diagnose_error=diag_error, stale=stale, ended=ended, data_problems=problems,
            missing=set(full.missing_ranks),
            history={r: self.history.series(r) for r in full.ranks}, units=units,
            window=self.window, signature=sig, waiting=waiting)

    # -- pieces ----------------------------------------------------------------------
    def _history_update(self, snap: RunSnapshot) -> None:
        take = getattr(self.source, "take_points", None)
        if take is not None:  # a run directory: the per-step lines are the history
            for r, pts in take().items():
                self.history.add_points(r, pts)
        else:
            for r, w in snap.ranks.items():
                if r not in snap.stale_ranks:
                    self.history.add_window(r, w)

    def _diagnose(self, snap: RunSnapshot) -> tuple[list, str | None]:
        if self.diagnose is None:
            return [], self._no_engine
        key = (tuple((r, w.steps, w.last_step, w.updated_unix, w.per_unit_steps,
                      w.detail_last_step) for r, w in snap.ranks.items()),
               tuple(sorted(snap.stale_ranks)), tuple(sorted(snap.ended_ranks)),
               tuple(sorted((r, s.get("state"), s.get("since_unix"))
                            for r, s in snap.stalls.items())))
        if key == self._diag_key:  # same numbers, same findings: skip the rules
            return self._findings, self._diag_error
        try:
            findings = list(self.diagnose(snap) or ())
            err = None
            findings = self._with_history(findings, snap)
        except Exception as e:  # noqa: BLE001 - a rule bug must not take the UI down
            findings, err = self._findings, f"diagnosis failed: {_error_text(e)}"
        self._diag_key, self._findings, self._diag_error = key, findings, err
        return findings, err

    def _with_history(self, findings: list, snap: RunSnapshot) -> list:
        """What `zerodoc compare` learned about these rules' predictions (a note per
        finding); never an error."""
        try:
            from ..compare.history import annotate, history_path

            return annotate(findings, snap, history_path(getattr(self.source, "run_dir", None)))
        except Exception:  # noqa: BLE001 - the history is a bonus, never a failure
            return findings
