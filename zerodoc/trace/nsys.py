"""Nsight Systems SQLite exports (`nsys export --type sqlite`) as a source, read like a trace.

`NsysSource(spec)` reads one export, a folder of them (one per node or rank) or a
comma-separated list, and fills the same event model a Kineto trace fills (`events.py`), so
the attribution (`attribution.py`) and the snapshot (`snapshot.TraceSource`) are the trace
path's, unchanged: per device the union of compute-kernel and of NCCL-kernel intervals, the
exposed part, NCCL kernels by kind, and per-unit compute where FSDP2's `FSDP::...` NVTX ranges
were captured (`nsys profile --pytorch=autograd-nvtx`, or `torch.autograd.profiler.emit_nvtx`).

What is read, and how it maps onto the trace model:

- `CUPTI_ACTIVITY_KIND_KERNEL` (start, end, deviceId, streamId, correlationId, globalPid,
  demangledName): one rank per (process, device) pair that ran kernels, numbered in file
  order, then device, then process. A kernel is classified by its demangled name exactly as a
  trace's kernel is (NCCL / memory / compute, `events.py`); an NCCL kernel's kind comes from
  its name (`ncclDevKernel_SendRecv` -> send_recv; no metadata in an export).
- `CUPTI_ACTIVITY_KIND_MEMCPY` / `_MEMSET`: memory operations (device busy, never compute).
- `CUPTI_ACTIVITY_KIND_RUNTIME`: the host launch (`*Launch*` calls) of each kernel, matched by
  correlation id within the process: the launching thread and moment, which place a kernel in
  a unit and phase.
- `NVTX_EVENTS` (push/pop and start/end ranges): the annotations the trace path keeps
  (`events.ANNOTATION_PREFIXES`: `ProfilerStep#N`, `FSDP::...`, `Optimizer.step#...`, ...),
  with autograd-nvtx's `, seq = N, op_id = M` suffix cut off; the starts of
  `autograd::engine::evaluate_function` ranges (where backward begins). Text inline or in
  `StringIds` (textId).

Times are nanoseconds in an export and microseconds in the model (divided by 1000). A capture
without `ProfilerStep#N` ranges is one window, step 0, over the capture's span: from the first
to the last kernel, memory operation or kept NVTX range of the file (the same for every rank
of the file); the report says so (`log_notes`). Rows are streamed from the database (opened
read-only, `mode=ro`, never written), and only what the model keeps is kept; a file that is
not an SQLite database, or an export without the tables and columns above, is refused with one
line naming what is missing.
"""

from __future__ import annotations

import os
import re
import sqlite3
import sys
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from ..errors import UserError
from .attribution import attribute
from .events import (ANNOTATION_PREFIXES, BACKWARD_FN, COMM_KERNEL, NOT_COMPUTE, STEP, Kernel,
                     RankEvents, Span, kernel_kind)
from .nsysfiles import nsys_files
from .snapshot import RankTrace, TraceFacts, TraceSource

NS_PER_US = 1000.0
NVTX_RANGES = (59, 60)  # NvtxPushPopRange, NvtxStartEndRange (ENUM_NSYS_EVENT_TYPE)
# globalTid / globalPid: the process id sits in bits 24-47, the thread id in bits 0-23
TID_BITS = 0xFFFFFF
# The columns read, per table: an export lacking one of these is refused (the schema changed)
KERNEL_COLS = ("start", "end", "deviceId", "streamId", "correlationId", "globalPid",
               "demangledName")
MEM_COLS = ("start", "end", "deviceId", "globalPid")
RUNTIME_COLS = ("start", "globalTid", "correlationId", "nameId")
NVTX_COLS = ("start", "end", "eventType", "text", "textId", "globalTid")
# autograd-nvtx appends the op's sequence number, id (and shapes) to its range names
_NVTX_ARGS = re.compile(r", (?:seq|op_id|sizes|input_op_ids) = .*$", re.DOTALL)
KEPT_PREFIXES = ANNOTATION_PREFIXES + (BACKWARD_FN,)
_SQLITE_MAGIC = b"SQLite format 3\x00"


class NsysError(UserError):
    """An export that cannot be read; the message says which file and why."""


def connect(path: Path) -> sqlite3.Connection:
    """The export opened read-only (a URI with `mode=ro`: nothing is ever written, no journal
    created), after checking it is an SQLite database at all."""
    try:
        with open(path, "rb") as f:
            magic = f.read(len(_SQLITE_MAGIC))
    except OSError as e:
        raise NsysError(f"cannot read {path}: {e.strerror or e}") from None
    if magic != _SQLITE_MAGIC:
        raise NsysError(f"{path}: not an SQLite database; export the report with "
                        "`nsys export --type sqlite`")
    uri = "file:" + urllib.parse.quote(str(path.resolve())) + "?mode=ro"
    try:
        con = sqlite3.connect(uri, uri=True)
        con.execute("PRAGMA query_only = ON")
    except sqlite3.Error as e:
        raise NsysError(f"{path}: cannot open ({e})") from None
    return con


def _columns(con: sqlite3.Connection, table: str) -> set[str]:
    return {r[1] for r in con.execute(f'PRAGMA table_info("{table}")')}


def schema_version(con: sqlite3.Connection) -> str:
    """The export's schema version (META_DATA_EXPORT), or "unknown"."""
    try:
        row = con.execute("SELECT value FROM META_DATA_EXPORT WHERE name = "
                          "'EXPORT_SCHEMA_VERSION'").fetchone()
    except sqlite3.Error:
        return "unknown"
    return str(row[0]) if row else "unknown"


def check_schema(con: sqlite3.Connection, path: Path) -> dict[str, bool]:
    """Which optional tables the export has; NsysError when the kernels cannot be read (no
    kernel table: captured without CUDA tracing, or not an nsys export; a column missing: a
    schema this reader does not know)."""
    try:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = "
                                            "'table'")}
    except sqlite3.DatabaseError as e:
        raise NsysError(f"{path}: not a readable SQLite database ({e})") from None
    version = schema_version(con)
    if "CUPTI_ACTIVITY_KIND_KERNEL" not in tables:
        what = "an Nsight Systems export without CUDA kernels (capture with --trace=cuda)" \
            if "META_DATA_EXPORT" in tables else "not an Nsight Systems export"
        raise NsysError(f"{path}: no CUPTI_ACTIVITY_KIND_KERNEL table: {what}")
    need = {"CUPTI_ACTIVITY_KIND_KERNEL": KERNEL_COLS, "StringIds": ("id", "value")}
    optional = {"CUPTI_ACTIVITY_KIND_MEMCPY": MEM_COLS, "CUPTI_ACTIVITY_KIND_MEMSET": MEM_COLS,
                "CUPTI_ACTIVITY_KIND_RUNTIME": RUNTIME_COLS, "NVTX_EVENTS": NVTX_COLS}
    have = {}
    for table, cols in {**need, **optional}.items():
        if table not in tables:
            if table in need:
                raise NsysError(f"{path}: no {table} table (export schema {version}): not "
                                "an export this reader knows")
            have[table] = False
            continue
        missing = [c for c in cols if c not in _columns(con, table)]
        if missing:
            raise NsysError(f"{path}: export schema {version} unknown: {table} has no "
                            f"{', '.join(missing)} column{'s' if len(missing) > 1 else ''}")
        have[table] = True
    return have


@dataclass
class Capture:
    """One export read: per (process, device) the events kept, and the capture's span."""

    path: Path
    events: dict[tuple[int, int], RankEvents]  # (process id, device) -> events
    span: tuple[float, float] | None  # microseconds, first to last kept row
    schema: str
    host: str


class _Reader:
    """Streams one export's rows into `RankEvents`, one per (process, device)."""

    def __init__(self, con: sqlite3.Connection, path: Path, have: dict[str, bool]):
        self.con, self.path, self.have = con, path, have
        self.ranks: dict[tuple[int, int], RankEvents] = {}
        self.by_pid: dict[int, list[RankEvents]] = {}
        self.lo, self.hi = float("inf"), float("-inf")
        self.kinds: dict[int, tuple[int, str]] = {}  # name id -> (0 compute|1 comm|2 mem, name)

    def _string(self, sid: int) -> str:
        row = self.con.execute("SELECT value FROM StringIds WHERE id = ?", (sid,)).fetchone()
        return str(row[0]) if row and row[0] is not None else ""

    def _kind(self, sid: int) -> tuple[int, str]:
        k = self.kinds.get(sid)
        if k is None:
            name = self._string(sid)
            k = self.kinds[sid] = (1 if COMM_KERNEL.match(name) else 2 if NOT_COMPUTE.match(
                name) else 0, name)
        return k

    def _span(self, a: float, b: float) -> None:
        if a < self.lo:
            self.lo = a
        if b > self.hi:
            self.hi = b

    def kernels(self) -> None:
        q = ('SELECT start, "end", globalPid, deviceId, streamId, correlationId, '
             'demangledName FROM CUPTI_ACTIVITY_KIND_KERNEL')
        ranks = self.ranks
        for start, end, gpid, dev, stream, corr, name in self.con.execute(q):
            key = ((gpid or 0) >> 24 & TID_BITS, dev if dev is not None else -1)
            ev = ranks.get(key)
            if ev is None:
                ev = ranks[key] = RankEvents(pid=key[0])
                self.by_pid.setdefault(key[0], []).append(ev)
            ev.events += 1
            if not _good(start, end):
                ev.bad_times += 1
                continue
            a, b = start / NS_PER_US, end / NS_PER_US
            self._span(a, b)
            kind, text = self._kind(name)
            if kind == 0:
                ev.kernel_ts.append(a)
                ev.kernel_end.append(b)
                ev.kernel_corr.append(corr if corr is not None else -1)
            elif kind == 1:
                ev.comm_kernels.append(Kernel(text, stream or 0, a, b, None, corr,
                                              kernel_kind(text), None, None, None, None))
            else:
                ev.mem_ts.append(a)
                ev.mem_end.append(b)
            if ev.events & 0xFFFF == 0:
                ev._check_size()

    def memory(self) -> None:
        for table in ("CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"):
            if not self.have[table]:
                continue
            q = f'SELECT start, "end", globalPid, deviceId FROM {table}'
            for start, end, gpid, dev in self.con.execute(q):
                ev = self.ranks.get(((gpid or 0) >> 24 & TID_BITS, dev))
                if ev is None:
                    continue  # a process or device that ran no kernel is no rank
                if not _good(start, end):
                    ev.bad_times += 1
                    continue
                a, b = start / NS_PER_US, end / NS_PER_US
                self._span(a, b)
                ev.mem_ts.append(a)
                ev.mem_end.append(b)

    def launches(self) -> None:
        """Host launches of kernels (`*Launch*` runtime / driver calls), per process."""
        if not self.have["CUPTI_ACTIVITY_KIND_RUNTIME"]:
            return
        ids = [r[0] for r in self.con.execute("SELECT id FROM StringIds WHERE value LIKE "
                                              "'%Launch%'")]
        if not ids:
            return
        marks = ",".join("?" * len(ids))
        q = ("SELECT start, globalTid, correlationId FROM CUPTI_ACTIVITY_KIND_RUNTIME "
             f"WHERE nameId IN ({marks})")
        for start, gtid, corr in self.con.execute(q, ids):
            evs = self.by_pid.get((gtid or 0) >> 24 & TID_BITS)
            if not evs or corr is None or start is None:
                continue
            for ev in evs:
                ev.launch_corr.append(corr)
                ev.launch_tid.append(gtid & TID_BITS)
                ev.launch_ts.append(start / NS_PER_US)

    def annotations(self) -> None:
        """The NVTX ranges the trace model keeps (module docstring), per process."""
        if not self.have["NVTX_EVENTS"]:
            return
        likes = " OR ".join("value LIKE ?" for _ in KEPT_PREFIXES)
        pats = [p + "%" for p in KEPT_PREFIXES]
        ids = {r[0]: str(r[1]) for r in self.con.execute(
            f"SELECT id, value FROM StringIds WHERE {likes}", pats)}
        text_likes = " OR ".join("text LIKE ?" for _ in KEPT_PREFIXES)
        marks = ",".join("?" * len(ids))
        by_id = f" OR textId IN ({marks})" if ids else ""
        q = (f'SELECT start, "end", text, textId, globalTid FROM NVTX_EVENTS WHERE eventType '
             f'IN ({",".join(map(str, NVTX_RANGES))}) AND ({text_likes}{by_id})')
        for start, end, text, tid, gtid in self.con.execute(q, pats + list(ids)):
            evs = self.by_pid.get((gtid or 0) >> 24 & TID_BITS)
            if not evs:
                continue
            name = _NVTX_ARGS.sub("", text if text is not None else ids.get(tid, ""))
            if not _good(start, end):
                for ev in evs:
                    ev.bad_times += 1
                continue
            a, b = start / NS_PER_US, end / NS_PER_US
            thread = gtid & TID_BITS
            if name.startswith(BACKWARD_FN):
                for ev in evs:
                    ev.backward_starts.append(a)
            elif name.startswith(ANNOTATION_PREFIXES):
                self._span(a, b)
                for ev in evs:
                    ev.spans.append(Span(name, thread, a, b))


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _good(start, end) -> bool:
    return isinstance(start, int) and isinstance(end, int) and 0 <= start <= end


def read_capture(path: Path) -> Capture:
    """Everything kept of one export (module docstring)."""
    con = connect(path)
    try:
        have = check_schema(con, path)
        r = _Reader(con, path, have)
        try:
            r.kernels()
            if not r.ranks:
                raise NsysError(f"{path}: no CUDA kernels in the export (nothing ran on a "
                                "device while it was captured)")
            r.memory()
            r.launches()
            r.annotations()
        except sqlite3.DatabaseError as e:
            raise NsysError(f"{path}: cannot read the export ({e})") from None
        host = _host(con)
        version = schema_version(con)
    finally:
        con.close()
    span = (r.lo, r.hi) if r.hi >= r.lo else None
    return Capture(path, r.ranks, span, version, host)


def _host(con: sqlite3.Connection) -> str:
    try:
        row = con.execute("SELECT value FROM META_DATA_EXPORT WHERE name = 'EXPORT_HOST'"
                          ).fetchone()
    except sqlite3.Error:
        return ""
    return str(row[0]) if row else ""


def one_window(ev: RankEvents, span: tuple[float, float] | None) -> bool:
    """A capture without `ProfilerStep#N` ranges: one step (0) over the capture's span.
    Returns whether the window was added."""
    if span is None or any(STEP.match(s.name) for s in ev.spans):
        return False
    ev.spans.append(Span("ProfilerStep#0", -1, span[0], span[1]))
    return True


class NsysSource(TraceSource):
    """Nsight Systems exports as a source (module docstring): ranks are (file, device,
    process) in order; the rest is `TraceSource`'s."""

    def __init__(self, spec: str | os.PathLike | list, window: int | None = 20, *,
                 facts: TraceFacts | None = None):
        self.opts = facts or TraceFacts()
        files = nsys_files(spec)
        if not files:
            raise UserError(f"no Nsight Systems exports (.sqlite) at {spec}")
        for f in files:
            if not f.is_file():
                raise NsysError(f"no file {f}")
        self.window = window
        label = ",".join(str(f) for f in files) if len(files) <= 2 else \
            f"{files[0].parent} ({len(files)} files)"
        self.description = f"Nsight Systems export {label}"
        self.ranks: dict[int, RankTrace] = {}
        self.where: dict[int, str] = {}
        self.windowed: list[str] = []
        for i, path in enumerate(files):
            if self.opts.progress:
                sys.stderr.write(f"zerodoc: reading Nsight Systems export {i + 1}/{len(files)} "
                                 f"{path.name} ({_size(path) / 1e6:,.1f} MB)\n")
                sys.stderr.flush()
            self._add(read_capture(path))
        self.overlap = {r: t.result.overlap_ratio for r, t in self.ranks.items()}

    def _add(self, cap: Capture) -> None:
        added = False
        for (pid, dev), ev in sorted(cap.events.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            rank = len(self.ranks)
            added |= one_window(ev, cap.span)
            header = {"host_name": cap.host, "trace_id": cap.path.stem,
                      "_bad_times": ev.bad_times, "nsys_pid": pid, "nsys_device": dev,
                      "nsys_schema": cap.schema}
            self.ranks[rank] = RankTrace(rank, cap.path, header,
                                         attribute(ev, self.opts.world_size), pid)
            self.where[rank] = f"{cap.path.name} process {pid} device {dev}"
        if added:
            a, b = cap.span
            self.windowed.append(f"{cap.path.name}: no ProfilerStep ranges: one window (steps: "
                                 f"1) over the capture's span, {(b - a) / 1e6:.6g} s from the "
                                 "first to the last kernel, memory operation or kept NVTX range")

    def snapshot(self):
        snap = super().snapshot()
        ranks = [f"rank {r} = {w}" for r, w in sorted(self.where.items())]
        if len(ranks) > 16:
            ranks = ranks[:8] + [f"... ({len(ranks) - 16} more)"] + ranks[-8:]
        snap.log_notes[:0] = ["Nsight Systems export: each (process, device) pair that ran "
                              "kernels is a rank, in file, device, process order: "
                              + "; ".join(ranks)] + self.windowed
        return snap

    def _facts(self, t: RankTrace, world: int):
        f = super()._facts(t, world)
        f.config.update({"trace_format": "nsys sqlite", "nsys_process": t.header["nsys_pid"],
                         "nsys_device": t.header["nsys_device"],
                         "nsys_schema": t.header["nsys_schema"]})
        return f


def open_nsys(spec, window: int | None = 20, **facts) -> NsysSource:
    """An `NsysSource` for `spec`; `facts` are `TraceFacts` fields (world_size=, stage=, ...)."""
    return NsysSource(spec, window, facts=TraceFacts(**facts))
