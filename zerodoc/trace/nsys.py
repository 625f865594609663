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
of the file); the report says so (`log_notes`).

Bounded memory: the database is opened read-only (`mode=ro`, never written, no index built);
ranks and the span come from aggregate queries; then one rank at a time is read, in chunks of
rows (by rowid), keeping about 50 bytes per kernel (interval, correlation, launch), and
attributed in slices of at most `SLICE_KERNELS` kernels cut where the device is idle
(`attribute_sliced`: the attribution's own arrays would take about 200 bytes per kernel of a
rank at once). A file that is not an SQLite database, or an export without the tables and
columns above, is refused with one line naming what is missing.
"""

from __future__ import annotations

import os
import re
import sqlite3
import sys
import urllib.parse
from array import array
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import UserError
from . import timeline as tl
from .attribution import RankResult, attribute
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
    return _meta(con, "EXPORT_SCHEMA_VERSION") or "unknown"


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


GOOD = 'start IS NOT NULL AND "end" IS NOT NULL AND start >= 0 AND "end" >= start'
CHUNK_ROWS = 1 << 18  # rows (by rowid) read at a time
_RANK_ROWS = f"globalPid IS ? AND deviceId IS ? AND {GOOD}"
PROCESS = 1 << 24  # the globalTids of a process: [globalPid, globalPid + PROCESS)


@dataclass
class Device:
    """One rank: a process and a device it ran kernels on."""

    gpid: int  # nsys globalPid (the tid bits zero)
    device: int
    kernels: int  # kernel rows, good or not
    bad: int  # rows with a missing, negative or backward time (skipped, counted)

    @property
    def pid(self) -> int:
        return self.gpid >> 24 & TID_BITS


class Export:
    """One export, open: its ranks (`devices`) and the capture's span, found with aggregate
    queries; `events(device)` then reads one rank's rows in chunks, so only one rank's events
    are in memory at a time (module docstring)."""

    def __init__(self, path: Path):
        self.path = path
        self.con = connect(path)
        try:
            self.have = check_schema(self.con, path)
            self.schema = schema_version(self.con)
            self.host = _meta(self.con, "EXPORT_HOST")
            self.devices = self._devices()
            self.comm, self.memory = self._kernel_names()
            self.nvtx_where = self._kept_nvtx() if self.have["NVTX_EVENTS"] else None
            self.span = self._span()
        except sqlite3.DatabaseError as e:
            self.close()
            raise NsysError(f"{path}: cannot read the export ({e})") from None
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        self.con.close()

    def _devices(self) -> list[Device]:
        rows = self.con.execute(
            f'SELECT globalPid, deviceId, count(*), sum(NOT ({GOOD})) FROM '
            "CUPTI_ACTIVITY_KIND_KERNEL GROUP BY globalPid, deviceId").fetchall()
        out = [Device(gp or 0, dev if dev is not None else -1, n, bad or 0)
               for gp, dev, n, bad in rows]
        if not out:
            raise NsysError(f"{self.path}: no CUDA kernels in the export (nothing ran on a "
                            "device while it was captured)")
        return sorted(out, key=lambda d: (d.device, d.pid))

    def _kernel_names(self) -> tuple[dict[int, str], np.ndarray]:
        """Name ids of NCCL kernels (id -> name) and of memory kernels, by a trace's rules."""
        comm, memory = {}, []
        for sid, name in self.con.execute(
                "SELECT id, value FROM StringIds WHERE id IN (SELECT DISTINCT demangledName "
                "FROM CUPTI_ACTIVITY_KIND_KERNEL)"):
            name = str(name or "")
            if COMM_KERNEL.match(name):
                comm[sid] = name
            elif NOT_COMPUTE.match(name):
                memory.append(sid)
        return comm, np.array(memory, dtype=np.int64)

    def _kept_nvtx(self) -> tuple[str, list]:
        """The WHERE clause selecting the NVTX ranges the model keeps (inline text or a
        StringIds id; LIKE is a superset, the prefixes are checked again in Python)."""
        pats = [p + "%" for p in KEPT_PREFIXES]
        likes = " OR ".join("value LIKE ?" for _ in pats)
        self.nvtx_ids = {r[0]: str(r[1]) for r in self.con.execute(
            f"SELECT id, value FROM StringIds WHERE {likes}", pats)}
        text = " OR ".join("text LIKE ?" for _ in pats)
        by_id = f" OR textId IN ({','.join('?' * len(self.nvtx_ids))})" if self.nvtx_ids else ""
        kinds = ",".join(map(str, NVTX_RANGES))
        return f"eventType IN ({kinds}) AND ({text}{by_id})", pats + list(self.nvtx_ids)

    def _span(self) -> tuple[float, float]:
        """From the first to the last kernel or memory operation of a rank, or kept NVTX
        range (microseconds)."""
        keys = {(d.gpid, d.device) for d in self.devices}
        lo, hi = np.inf, -np.inf
        tables = ["CUPTI_ACTIVITY_KIND_KERNEL"] + [t for t in (
            "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET") if self.have[t]]
        for t in tables:
            for gp, dev, a, b in self.con.execute(
                    f'SELECT globalPid, deviceId, min(start), max("end") FROM {t} WHERE {GOOD} '
                    "GROUP BY globalPid, deviceId"):
                if (gp or 0, dev if dev is not None else -1) in keys:
                    lo, hi = min(lo, a), max(hi, b)
        if self.nvtx_where is not None:
            where, args = self.nvtx_where
            a, b = self.con.execute(f'SELECT min(start), max("end") FROM NVTX_EVENTS WHERE '
                                    f"{where} AND {GOOD}", args).fetchone()
            if a is not None:
                lo, hi = min(lo, a), max(hi, b)
        return lo / NS_PER_US, hi / NS_PER_US

    def events(self, d: Device) -> RankEvents:
        """One rank's events (module docstring)."""
        ev = RankEvents(pid=d.pid)
        ev.events, ev.bad_times = d.kernels, d.bad
        try:
            self._kernels(ev, d)
            for t in ("CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"):
                if self.have[t]:
                    self._memory(ev, d, t)
            if self.have["CUPTI_ACTIVITY_KIND_RUNTIME"]:
                self._launches(ev, d)
            if self.nvtx_where is not None:
                self._annotations(ev, d)
        except sqlite3.DatabaseError as e:
            raise NsysError(f"{self.path}: cannot read the export ({e})") from None
        return ev

    def _chunks(self, table: str, columns: tuple[str, ...], where: str, args=()):
        """Integer columns of `table`'s rows matching `where`, as numpy arrays, CHUNK_ROWS
        rows (by rowid) at a time. SQLite writes each chunk's columns as text
        (`group_concat`, all in one scan, so aligned row by row) and numpy parses them:
        several times faster than a Python tuple per row. A NULL in a column must be replaced
        (`coalesce`) by the caller, or the columns would not line up."""
        lo, hi = self.con.execute(f'SELECT min(rowid), max(rowid) FROM "{table}"').fetchone()
        if lo is None:
            return
        sel = ", ".join(f"group_concat({c})" for c in columns)
        q = f'SELECT {sel} FROM "{table}" WHERE rowid >= ? AND rowid < ? AND ({where})'
        for first in range(lo, hi + 1, CHUNK_ROWS):
            texts = self.con.execute(q, (first, first + CHUNK_ROWS, *args)).fetchone()
            if texts[0] is None:
                continue
            yield [np.fromstring(t, dtype=np.int64, sep=",") for t in texts]

    def _kernels(self, ev: RankEvents, d: Device) -> None:
        cols = ("start", '"end"', "coalesce(correlationId, -1)", "coalesce(demangledName, -1)",
                "coalesce(streamId, 0)")
        comm_ids = np.array(list(self.comm), dtype=np.int64)
        for a, b, corr, name, stream in self._chunks("CUPTI_ACTIVITY_KIND_KERNEL", cols,
                                                     _RANK_ROWS, _key(d)):
            a, b = a / NS_PER_US, b / NS_PER_US
            comm = np.isin(name, comm_ids)
            mem = np.isin(name, self.memory)
            comp = ~(comm | mem)
            _extend(ev.kernel_ts, a[comp])
            _extend(ev.kernel_end, b[comp])
            _extend(ev.kernel_corr, corr[comp])
            _extend(ev.mem_ts, a[mem])
            _extend(ev.mem_end, b[mem])
            for i in np.flatnonzero(comm):
                text = self.comm[int(name[i])]
                ev.comm_kernels.append(Kernel(text, int(stream[i]), float(a[i]), float(b[i]),
                                              None, int(corr[i]), kernel_kind(text), None,
                                              None, None, None))
            ev._check_size()

    def _memory(self, ev: RankEvents, d: Device, table: str) -> None:
        for a, b in self._chunks(table, ("start", '"end"'), _RANK_ROWS, _key(d)):
            _extend(ev.mem_ts, a / NS_PER_US)
            _extend(ev.mem_end, b / NS_PER_US)

    def _launches(self, ev: RankEvents, d: Device) -> None:
        """Host launches of kernels (`*Launch*` runtime / driver calls) by the process."""
        ids = [r[0] for r in self.con.execute("SELECT id FROM StringIds WHERE value LIKE "
                                              "'%Launch%'")]
        if not ids:
            return
        where = ("globalTid >= ? AND globalTid < ? AND start IS NOT NULL AND correlationId IS "
                 f"NOT NULL AND nameId IN ({','.join('?' * len(ids))})")
        for a, tid, corr in self._chunks("CUPTI_ACTIVITY_KIND_RUNTIME", (
                "start", "globalTid", "correlationId"), where, [d.gpid, d.gpid + PROCESS, *ids]):
            _extend(ev.launch_corr, corr)
            _extend(ev.launch_tid, tid & TID_BITS)
            _extend(ev.launch_ts, a / NS_PER_US)
            ev._check_size()

    def _annotations(self, ev: RankEvents, d: Device) -> None:
        """The NVTX ranges the trace model keeps (module docstring), of the process."""
        where, args = self.nvtx_where
        q = (f'SELECT start, "end", text, textId, globalTid FROM NVTX_EVENTS WHERE {where} '
             "AND globalTid >= ? AND globalTid < ?")
        for start, end, text, tid, gtid in self.con.execute(q, args + [d.gpid,
                                                                      d.gpid + PROCESS]):
            if not _good(start, end):
                ev.bad_times += 1
                continue
            name = _NVTX_ARGS.sub("", text if text is not None else self.nvtx_ids.get(tid, ""))
            a, b = start / NS_PER_US, end / NS_PER_US
            if name.startswith(BACKWARD_FN):
                ev.backward_starts.append(a)
            elif name.startswith(ANNOTATION_PREFIXES):
                ev.spans.append(Span(name, gtid & TID_BITS, a, b))
        ev._check_size()


def _key(d: Device) -> tuple:
    return d.gpid or None, None if d.device < 0 else d.device


def _extend(arr, values: np.ndarray) -> None:
    """Append a numpy column to an `array.array` ("d" or "q"), in C."""
    arr.frombytes(np.ascontiguousarray(values, dtype=np.float64 if arr.typecode == "d"
                                       else np.int64).tobytes())


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _good(start, end) -> bool:
    return isinstance(start, int) and isinstance(end, int) and 0 <= start <= end


def _meta(con: sqlite3.Connection, name: str) -> str:
    try:
        row = con.execute("SELECT value FROM META_DATA_EXPORT WHERE name = ?", (name,)
                          ).fetchone()
    except sqlite3.Error:
        return ""
    return str(row[0]) if row else ""


SLICE_KERNELS = 500_000  # kernels attributed at a time (module docstring: bounded memory)


def attribute_sliced(ev: RankEvents, group_size: int | None,
                     limit: int | None = None) -> RankResult:
    """`attribute(ev)`, in slices of at most about `limit` kernels, for bounded memory: the
    attribution's own arrays take about 200 bytes per kernel, the events 50. The device
    timeline is cut only where the device is idle (between two intervals of the union of
    every kernel and memory operation), and each slice is attributed with all of the host's
    side (annotations, launches, steps) and its own device work: no kernel crosses a cut, so
    every union, each kernel's share of it and each collective's exposure are the same as in
    one pass, and each step's numbers are the sums of its slices'."""
    limit = SLICE_KERNELS if limit is None else limit
    kt, ke = np.asarray(ev.kernel_ts), np.asarray(ev.kernel_end)
    ct = np.array([k.ts for k in ev.comm_kernels], dtype=float)
    if len(kt) + len(ct) <= limit:
        return attribute(ev, group_size)
    mt, me = np.asarray(ev.mem_ts), np.asarray(ev.mem_end)
    ce = np.array([k.end for k in ev.comm_kernels], dtype=float)
    ends = tl.merge(np.concatenate([kt, ct, mt]), np.concatenate([ke, ce, me]))[1]
    starts = np.sort(np.concatenate([kt, ct]))  # kernels (not memory operations) counted
    before = np.searchsorted(starts, ends, side="right")  # kernels starting by each idle point
    cuts, done = [], 0
    for j in range(len(ends) - 1):
        if before[j + 1] - done > limit and before[j] > done:
            cuts.append(ends[j])
            done = before[j]
    cuts = np.array(cuts)
    del ends, starts, before
    ks, cs, ms = (np.searchsorted(cuts, x, side="right") for x in (kt, ct, mt))
    launches = _by_correlation(ev)
    # a stretch of memory operations alone is no slice (it would read as a CPU trace)
    n = len(cuts) + 1
    has = np.bincount(ks, minlength=n) + np.bincount(cs, minlength=n) > 0
    remap = np.maximum.accumulate(np.where(has, np.arange(n), 0))
    ks, cs, ms = remap[ks], remap[cs], remap[ms]
    parts, lengths = [], []
    for i in np.flatnonzero(has):
        part = RankEvents(spans=ev.spans, comm_ops=ev.comm_ops, busy=ev.busy,
                          backward_starts=ev.backward_starts, pid=ev.pid)
        sel = ks == i
        corr = np.asarray(ev.kernel_corr)[sel]
        _extend(part.kernel_ts, kt[sel])
        _extend(part.kernel_end, ke[sel])
        _extend(part.kernel_corr, corr)
        _extend(part.mem_ts, mt[ms == i])
        _extend(part.mem_end, me[ms == i])
        part.comm_kernels = [k for k, c in zip(ev.comm_kernels, cs) if c == i]
        _launches_of(part, launches, np.concatenate([corr, np.array(
            [k.correlation for k in part.comm_kernels], dtype=np.int64)]))
        lengths.append(tl.length(tl.merge(ct[cs == i], ce[cs == i])))
        parts.append(attribute(part, group_size))
        del part
    return _merged(parts, lengths)


def _by_correlation(ev: RankEvents) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The launches (correlation, thread, time), sorted by correlation; `ev`'s own arrays are
    emptied (they are not needed again, and a large rank's are tens of MB)."""
    lc = np.asarray(ev.launch_corr)
    order = np.argsort(lc, kind="stable")
    out = lc[order], np.asarray(ev.launch_tid)[order], np.asarray(ev.launch_ts)[order]
    del lc, order
    ev.launch_corr, ev.launch_tid, ev.launch_ts = array("q"), array("q"), array("d")
    return out


def _launches_of(part: RankEvents, launches, corr: np.ndarray) -> None:
    """Give a slice the launches of its own kernels (by correlation id)."""
    lc, lt, lts = launches
    if not len(lc) or not len(corr):
        return
    i = np.clip(np.searchsorted(lc, corr), 0, len(lc) - 1)
    i = np.unique(i[lc[i] == corr])
    _extend(part.launch_corr, lc[i])
    _extend(part.launch_tid, lt[i])
    _extend(part.launch_ts, lts[i])


def _merged(parts: list[RankResult], comm_lengths: list[float]) -> RankResult:
    """One `RankResult` from the slices' (the same steps in each: their numbers added; the
    units in the order `attribute` gives them; the overlap weighted by each slice's
    communication time)."""
    steps = parts[0].steps
    for p in parts[1:]:
        for st, add in zip(steps, p.steps):
            for name in ("optimizer", "framework", "device_busy", "device_compute",
                         "device_comm", "device_exposed"):
                setattr(st, name, getattr(st, name) + getattr(add, name))
            for mine, theirs in ((st.compute, add.compute),
                                 (st.unit_framework, add.unit_framework)):
                for k, v in theirs.items():
                    mine[k] += v
    colls = [c for p in parts for c in p.collectives]
    order: list[str] = []
    for c in sorted(colls, key=lambda c: (c.collective != "all_gather", c.issue)):
        if c.unit not in order:
            order.append(c.unit)
    total = sum(comm_lengths)
    overlap = sum((p.overlap_ratio or 0.0) * t for p, t in zip(parts, comm_lengths)) / total \
        if total > 0 else None
    return RankResult(parts[0].framework, parts[0].device_type, steps, colls, order, overlap,
                      sum(p.comm_kernels for p in parts), sum(p.comm_outside for p in parts))


def one_window(ev: RankEvents, span: tuple[float, float]) -> bool:
    """A capture without `ProfilerStep#N` ranges: one step (0) over the capture's span.
    Returns whether the window was added."""
    if any(STEP.match(s.name) for s in ev.spans):
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
            export = Export(path)
            try:
                self._add(export)
            finally:
                export.close()
        self.overlap = {r: t.result.overlap_ratio for r, t in self.ranks.items()}

    def _add(self, ex: Export) -> None:
        """Each rank of one export, read and attributed in turn (its events then dropped)."""
        added = False
        for d in ex.devices:
            rank = len(self.ranks)
            ev = ex.events(d)
            added |= one_window(ev, ex.span)
            header = {"host_name": ex.host, "trace_id": ex.path.stem,
                      "_bad_times": ev.bad_times, "nsys_pid": d.pid, "nsys_device": d.device,
                      "nsys_schema": ex.schema}
            self.ranks[rank] = RankTrace(rank, ex.path, header,
                                         attribute_sliced(ev, self.opts.world_size), d.pid)
            self.where[rank] = f"{ex.path.name} process {d.pid} device {d.device}"
            del ev
        if added:
            a, b = ex.span
            self.windowed.append(f"{ex.path.name}: no ProfilerStep ranges: one window (steps: "
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
