"""The run log: JSON lines per rank, readable with no server (schema 3).

Layout of a run directory::

    <run_dir>/rank-00000.jsonl        the rank's run log: every segment, append-only
    <run_dir>/detail/00000-a.jsonl    the latest steps with their full per-unit detail
    <run_dir>/detail/00000-b.jsonl    (two files, used in turn: bounded)

Records of `rank-NNNNN.jsonl` (one JSON object per line, "type" first):

- ``header``: ``schema`` (2), ``segment`` (0, 1, ... per restart), ``prev_header_at`` (byte
  offset of the previous segment's header or null), ``runlog`` (the writer's settings) and
  the rank's static facts (`RankFacts`; ``units`` lists `UnitFacts`, and other lines refer
  to units by their index in it).
- ``step``: one per completed step, the step's totals only: ``step``, ``end_unix``,
  ``step_s``, ``optimizer_s``, ``framework_s``, ``other_s``, ``wait_s``, ``self_s``,
  ``compute_s`` (all units' compute), ``exposed_s`` (all exposed communication), ``mem``
  ({population: bytes}), ``errors`` ({hook: count}, cumulative, when any); with sampling
  ``detail`` (false: an unsampled step, no per-unit rows, per-unit-derived sums null),
  ``detail_k`` and ``coll`` (docs/runlog.md, "Sampled steps").
- ``interval``: per-unit totals over steps ``first``..``last`` (every N steps or T seconds):
  ``steps``, ``detail_steps`` (with sampling: the sampled steps the per-unit totals cover),
  ``end_unix``, ``header_at`` (this segment's header offset), the scalar sums
  (``step_s`` ... ``self_s``), ``max_step_s`` and ``units``: columnar per-unit totals,
  ``{"compute": [{"phase", "unit": [index...], "seconds": [...]}...], "comm": [{"phase",
  "collective", "unit": [...], "count", "bytes", "seconds", "exposed", "hidden"}...]}``.
- ``total``: the same as ``interval`` but cumulative over the whole segment up to ``step``
  (every K intervals and at a clean close), so "all steps" is read from the end.
- ``dropped``: ``records`` the writer dropped since the last one (its queue was full: a slow
  filesystem), ``total`` so far.
- ``lost``: ``records`` / ``steps`` that failed writes lost since the last one (disk full,
  read-only, a size limit), ``total``, ``total_steps``, ``error``, ``path``.
- ``end``: written by `close()`: ``end_unix``, ``steps``, ``dropped`` (and ``lost``,
  ``lost_steps``, ``write_error`` after failed writes); ``"failed": true``
  when close() ran while an exception ended the training (after the watchdog's ``failed``
  record): then not a clean close; ``"interrupted": true`` when the user stopped the run
  (Ctrl-C, `close(interrupted=True)`): a clean close; ``"terminated": true`` when a SIGTERM
  did (after a ``stall`` record with ``"state": "terminated"``): a clean close too.
- Other types (e.g. ``stall``) are kept by readers in `RankLog.events`.

Detail files start with ``{"type": "detail", "segment", "header_at", "first_step"}`` and then
hold one full step record per line: a ``step`` line as above plus ``compute``
([[unit, phase, seconds]...]) and ``comm`` ([[unit, phase, collective, count, bytes,
seconds, exposed_s, hidden_s]...]): the steps of the current and the previous interval.

Schema 3 writes durations with 13 significant digits and ``units`` columns compactly (``unit`` 0..n-1 as n, a repeated number once, a
column equal to ``seconds`` by that name; docs/runlog.md); schema 2 logs (lists everywhere)
and schema 1 logs (every step line carrying its ``compute`` / ``comm`` rows, no segments) are
still read. `read_rank_log()` reads one segment in full, `read_rank_tail()` only what a
window needs, `load_run()` turns a run directory into a `RunSnapshot`, `RunFollower`
follows a live one.
"""

from __future__ import annotations

from .follow import RunFollower
from .reader import (
    DEFAULT_ROOT, latest_run, load_run, log_window, missing, rank_logs, read_detail,
    read_rank_log, read_rank_tail, window_from_steps,
)
from .records import (
    READS, SCHEMA, RankLog, RunLogError, StepRecord, StepTotals, UnitsBlock, facts_from_dict,
    rank_log_name,
)
from .segments import pick_segment
from .writer import DETAIL_DIR, RunLogBusy, RunLogWriter

__all__ = [
    "DEFAULT_ROOT", "DETAIL_DIR", "READS", "SCHEMA", "RankLog", "RunFollower", "RunLogBusy",
    "RunLogError", "RunLogWriter", "StepRecord", "StepTotals", "UnitsBlock",
    "facts_from_dict", "latest_run", "load_run", "log_window", "missing", "pick_segment",
    "rank_log_name", "rank_logs", "read_detail", "read_rank_log", "read_rank_tail",
    "window_from_steps",
]
