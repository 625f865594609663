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

Work queued before the capture: a kernel, copy or set whose correlation id no CUDA runtime call
of its process carries was launched before the capture began; it is left out, by the trace
reader's rule (`RankEvents.drop_unlaunched`, HTA's), with the process's runtime calls of each
slice as `host_corr` (a process without runtime calls keeps everything).

Bounded memory: the database is opened read-only (`mode=ro`, never written, no index built);
ranks come from `SELECT DISTINCT` and the span from plain aggregates (no GROUP BY: SQLite would
sort every row). Then, one rank at a time, the kernel, memcpy and memset rows are streamed in
start order (`_Rows`: by rowid while the table holds them so, as nsys writes it, checked per
chunk; else through `ORDER BY start`), the three tables side by side, and attributed in slices
of about `SLICE_KERNELS` kernels cut where the device is idle (`_Pending.take`: no row pending
or still to come crosses the cut, so every union, credit and exposure is the one-pass result
and the steps' numbers add up), each slice with the rank's whole host side (derived once:
`HostSide`) and the launches of its own rows, looked up by correlation id in the chunks of the
runtime table whose ids meet the slice's (`Export.host_calls`, `_runtime_zones`). Memory holds
a slice, not the rank. A file that is not an SQLite database, or an export without the tables
and columns above, is refused with one line naming what is missing.
"""

from __future__ import annotations

import os
import re
import sqlite3
import sys
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import UserError
from . import timeline as tl
from .attribution import HostSide, RankResult, attribute
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
ZONE_ROWS = 1 << 16  # rows (by rowid) of the runtime table per entry of its coarse index
SLICE_KERNELS = 250_000  # kernels attributed at a time (module docstring: bounded memory)
_RANK_ROWS = f"globalPid IS ? AND deviceId IS ? AND {GOOD}"
PROCESS = 1 << 24  # the globalTids of a process: [globalPid, globalPid + PROCESS)
KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
MEMORY_TABLES = ("CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")
KERNEL_READ = ("start", '"end"', "coalesce(correlationId, -1)", "coalesce(demangledName, -1)",
               "coalesce(streamId, 0)")
COMPUTE, COMM, MEMORY = 0, 1, 2  # what a device row is (`Export._classes`)
_FAR = 1 << 62


@dataclass
class Device:
    """One rank: a process and a device it ran kernels on."""

    gpid: int  # nsys globalPid (the tid bits zero)
    device: int
    bad: int  # kernel rows with a missing, negative or backward time (skipped, counted)

    @property
    def pid(self) -> int:
        return self.gpid >> 24 & TID_BITS


class _Unsorted(Exception):
    """A table's rows of a rank do not come in start order by rowid."""


class _Rows:
    """One table's good rows of one rank in start order, as numpy column chunks (`next()`,
    None at the end). By rowid ranges (`Export._chunks`) while the rows come in start order,
    as nsys writes them (checked on every chunk: `_Unsorted` if not); `ordered`: an
    `ORDER BY start` query instead (SQLite sorts in its own bounded memory, spilling to
    temporary files, never beside the export). `frontier` (ns): no row still to come starts
    before it."""

    def __init__(self, ex: "Export", table: str, cols: tuple[str, ...], d: Device,
                 ordered: bool):
        self.kernels = table == KERNEL
        self.frontier = -np.inf
        self._cur = self._it = None
        if ordered:
            self._cur = ex.con.execute(f'SELECT {", ".join(cols)} FROM "{table}" WHERE '
                                       f"{_RANK_ROWS} ORDER BY start, rowid", _key(d))
        else:
            self._it = ex._chunks(table, cols, _RANK_ROWS, _key(d))

    def next(self) -> list[np.ndarray] | None:
        if self._cur is not None:
            rows = self._cur.fetchmany(CHUNK_ROWS)
            cols = list(np.array(rows, dtype=np.int64).T) if rows else None
        else:
            cols = next(self._it, None)
            if cols is not None and (cols[0][0] < self.frontier or
                                     np.any(cols[0][1:] < cols[0][:-1])):
                raise _Unsorted
        self.frontier = np.inf if cols is None else cols[0][-1]
        return cols


class _Pending:
    """Device rows read and not yet attributed: chunks of columns (`NAMES`; times in
    microseconds), cut where the device is idle (`take`)."""

    NAMES = ("ts", "end", "corr", "cls", "name", "stream")

    def __init__(self):
        self.chunks: list[dict] = []
        self.kernels = 0

    def add(self, rows: dict) -> None:
        self.chunks.append(rows)
        self.kernels += int(np.count_nonzero(rows["cls"] != MEMORY))

    def _joined(self) -> dict | None:
        if len(self.chunks) > 1:
            self.chunks = [{n: np.concatenate([c[n] for c in self.chunks]) for n in self.NAMES}]
        return self.chunks[0] if self.chunks else None

    def take(self, safe: float, limit: int) -> list[dict]:
        """Slices of the rows pending, of at least `limit` kernels each, each ending where the
        device is idle (at the end of an interval of the union of every row pending) at or
        before `safe` (no row still to come starts earlier); the rest stays pending."""
        rows = self._joined()
        _s, e = tl.merge(rows["ts"], rows["end"])
        e = e[:np.searchsorted(e, safe, side="right")]
        kernel = rows["cls"] != MEMORY
        before = np.searchsorted(np.sort(rows["ts"][kernel]), e, side="right")
        cuts, done = [], 0
        while True:  # the first idle moment after `limit` more kernels, then again
            j = int(np.searchsorted(before, done + limit))
            if j >= len(e):
                break
            cuts.append(e[j])
            done = before[j]
        if not cuts:
            return []
        # the interval after an idle moment starts after it: a row is in the slice of the
        # first cut at or after its start
        where = np.searchsorted(np.array(cuts), rows["ts"], side="left")
        out = [{n: c[where == i] for n, c in rows.items()} for i in range(len(cuts))]
        self.chunks = [{n: c[where == len(cuts)] for n, c in rows.items()}]
        self.kernels = int(np.count_nonzero(self.chunks[0]["cls"] != MEMORY))
        return out

    def rest(self) -> dict | None:
        rows = self._joined()
        self.chunks, self.kernels = [], 0
        return rows


class Export:
    """One export, open: its ranks (`devices`) and the capture's span, found with aggregate
    queries; `host_events(device)` reads one rank's host side and `rank_result(...)` streams
    its device rows in start order, attributing them slice by slice (module docstring)."""

    def __init__(self, path: Path):
        self.path = path
        self.con = connect(path)
        try:
            self.have = check_schema(self.con, path)
            self.schema = schema_version(self.con)
            self.host = _meta(self.con, "EXPORT_HOST")
            self.kind: dict[int, int] = {}  # kernel name id -> COMPUTE / COMM / MEMORY
            self.comm: dict[int, str] = {}  # NCCL kernel name id -> name
            self.devices = self._devices()
            self.nvtx_where = self._kept_nvtx() if self.have["NVTX_EVENTS"] else None
            self.mem_corr = {t: "coalesce(correlationId, -1)" if self.have[t] and
                             "correlationId" in _columns(self.con, t) else "-1"
                             for t in MEMORY_TABLES}
            self.span = self._span()
            self._zones = self._launch_ids = None
            self._has_runtime: dict[int, bool] = {}
        except sqlite3.DatabaseError as e:
            self.close()
            raise NsysError(f"{path}: cannot read the export ({e})") from None
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        self.con.close()

    def _devices(self) -> list[Device]:
        pairs = self.con.execute(f"SELECT DISTINCT globalPid, deviceId FROM {KERNEL}").fetchall()
        bad = {k[:2]: k[2] for k in self.con.execute(
            f"SELECT globalPid, deviceId, count(*) FROM {KERNEL} WHERE NOT ({GOOD}) GROUP BY "
            "globalPid, deviceId")}
        out = [Device(gp or 0, dev if dev is not None else -1, bad.get((gp, dev), 0))
               for gp, dev in pairs]
        if not out:
            raise NsysError(f"{self.path}: no CUDA kernels in the export (nothing ran on a "
                            "device while it was captured)")
        return sorted(out, key=lambda d: (d.device, d.pid))

    def _classes(self, names: np.ndarray) -> np.ndarray:
        """COMPUTE / COMM / MEMORY for kernel name ids, by a trace's rules (`events.py`); each
        id's name looked up in StringIds once."""
        ids, inv = np.unique(names, return_inverse=True)
        new = [int(i) for i in ids if int(i) not in self.kind]
        for i in range(0, len(new), 500):
            part = new[i:i + 500]
            found = dict(self.con.execute(f"SELECT id, value FROM StringIds WHERE id IN "
                                          f"({','.join('?' * len(part))})", part))
            for sid in part:
                name = str(found.get(sid) or "")
                self.kind[sid] = COMM if COMM_KERNEL.match(name) else \
                    MEMORY if NOT_COMPUTE.match(name) else COMPUTE
                if self.kind[sid] == COMM:
                    self.comm[sid] = name
        return np.array([self.kind[int(i)] for i in ids], dtype=np.int8)[inv]

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
        range (microseconds). Every kernel row is a rank's; memory operations are those of
        the ranks' (process, device) pairs."""
        bounds = [self.con.execute(f'SELECT min(start), max("end") FROM {KERNEL} WHERE {GOOD}'
                                   ).fetchone()]
        ranks = " OR ".join("(globalPid IS ? AND deviceId IS ?)" for _ in self.devices)
        args = [x for d in self.devices for x in _key(d)]
        for t in MEMORY_TABLES:
            if self.have[t]:
                bounds.append(self.con.execute(f'SELECT min(start), max("end") FROM {t} WHERE '
                                               f"{GOOD} AND ({ranks})", args).fetchone())
        if self.nvtx_where is not None:
            where, args = self.nvtx_where
            bounds.append(self.con.execute(f'SELECT min(start), max("end") FROM NVTX_EVENTS '
                                           f"WHERE {where} AND {GOOD}", args).fetchone())
        got = [b for b in bounds if b[0] is not None]
        lo = min((a for a, _ in got), default=np.inf)
        hi = max((b for _, b in got), default=-np.inf)
        return lo / NS_PER_US, hi / NS_PER_US

    def host_events(self, d: Device) -> RankEvents:
        """One rank's host side: the NVTX ranges kept (module docstring); no device rows."""
        ev = RankEvents(pid=d.pid)
        ev.bad_times = d.bad
        if self.nvtx_where is not None:
            self._wrapped(self._annotations, ev, d)
        return ev

    def rank_result(self, d: Device, host: RankEvents, group_size: int | None) -> RankResult:
        """One rank attributed slice by slice (module docstring), its device rows streamed in
        start order: by rowid when the export holds them so, else sorted by SQLite."""
        try:
            return self._wrapped(self._streamed, d, host, group_size, False)
        except _Unsorted:
            return self._wrapped(self._streamed, d, host, group_size, True)

    def _wrapped(self, fn, *args):
        try:
            return fn(*args)
        except sqlite3.DatabaseError as e:
            raise NsysError(f"{self.path}: cannot read the export ({e})") from None

    def _streamed(self, d: Device, host: RankEvents, group_size: int | None,
                  ordered: bool) -> RankResult:
        """Read the kernel and memory tables side by side (always the one whose rows so far
        start earliest), and attribute the rows pending whenever `SLICE_KERNELS` kernels are
        and the device was idle since: every row still to come starts later."""
        streams = [_Rows(self, KERNEL, KERNEL_READ, d, ordered)]
        streams += [_Rows(self, t, ("start", '"end"', self.mem_corr[t]), d, ordered)
                    for t in MEMORY_TABLES if self.have[t]]
        pending, slices = _Pending(), _Slices(self, d, host, group_size)
        limit = SLICE_KERNELS
        while streams:
            s = min(streams, key=lambda r: r.frontier)
            cols = s.next()
            if cols is None:
                streams.remove(s)
                continue
            pending.add(self._rows(s, cols))
            if pending.kernels >= limit:
                safe = min((r.frontier for r in streams), default=np.inf) / NS_PER_US
                taken = pending.take(safe, SLICE_KERNELS)
                for rows in taken:
                    slices.add(rows)
                # no idle moment yet: read on (and look again after as many more kernels)
                limit = SLICE_KERNELS if taken else pending.kernels + SLICE_KERNELS
        if pending.kernels:
            for rows in pending.take(np.inf, SLICE_KERNELS):
                slices.add(rows)
        rows = pending.rest()
        if rows is not None:
            slices.add(rows)
        return slices.result()

    def _rows(self, s: _Rows, cols: list[np.ndarray]) -> dict:
        """A chunk's columns as `_Pending` keeps them."""
        n = len(cols[0])
        if s.kernels:
            a, b, corr, name, stream = cols
            cls = self._classes(name)
        else:
            (a, b, corr), name, stream = cols, np.full(n, -1), np.zeros(n, dtype=np.int64)
            cls = np.full(n, MEMORY, dtype=np.int8)
        return {"ts": a / NS_PER_US, "end": b / NS_PER_US, "corr": corr, "cls": cls,
                "name": name, "stream": stream}

    def _chunks(self, table: str, columns: tuple[str, ...], where: str, args=()):
        """Integer columns of `table`'s rows matching `where`, as numpy arrays, CHUNK_ROWS
        rows (by rowid) at a time, in rowid order (empty chunks skipped). SQLite writes each
        chunk's columns as text (`group_concat`, all in one scan, so aligned row by row) and
        numpy parses them: several times faster than a Python tuple per row. A NULL in a
        column must be replaced (`coalesce`) by the caller, or the columns would not line
        up."""
        lo, hi = self.con.execute(f'SELECT min(rowid), max(rowid) FROM "{table}"').fetchone()
        if lo is None:
            return
        for first in range(lo, hi + 1, CHUNK_ROWS):
            cols = self._text_columns(table, columns, where, (first, first + CHUNK_ROWS, *args))
            if cols is not None:
                yield cols

    def _text_columns(self, table: str, columns, where: str, args, empty: bool = False):
        """`_chunks`' query for the rowids [args[0], args[1]) (None: no row); `empty`: a
        column may be NULL for every row (a FILTER clause), then read as no value."""
        sel = ", ".join(f"group_concat({c})" for c in columns)
        texts = self.con.execute(f'SELECT {sel} FROM "{table}" WHERE rowid >= ? AND rowid < ? '
                                 f"AND ({where})", args).fetchone()
        if texts[0] is None:
            return None
        return [np.fromstring(t, dtype=np.int64, sep=",") if t is not None or not empty
                else np.zeros(0, dtype=np.int64) for t in texts]

    def host_calls(self, d: Device, corr: np.ndarray):
        """The process's host runtime calls that carry one of the correlation ids `corr`:
        (their ids: every call, for the no-launch-in-the-capture rule; the launches, sorted by
        id, the first of each: ids, threads, times). Only the runtime table's chunks whose
        range of ids meets `corr`'s are read (`_runtime_zones`)."""
        none = (np.zeros(0, dtype=np.int64),) * 3
        c = corr[corr >= 0]
        if not self.have[RUNTIME] or not len(c) or not self.launched_here(d):
            return np.zeros(0, dtype=np.int64), none
        lo, hi = int(c.min()), int(c.max())
        firsts, zlo, zhi = self._runtime_zones()
        hit = np.flatnonzero((zlo <= hi) & (zhi >= lo))
        launch = f"nameId IN ({','.join(map(str, self._launches()))})"
        cols = ["correlationId"] + [f"{c}) FILTER (WHERE {launch}" for c in (
            "correlationId", "globalTid", "start")]  # every call's id; the launches'
        got = []
        for run in np.split(hit, np.flatnonzero(np.diff(hit) > 1) + 1):
            if len(run):
                got.append(self._text_columns(
                    RUNTIME, cols, "correlationId BETWEEN ? AND ? AND globalTid >= ? AND "
                    "globalTid < ? AND start IS NOT NULL", (
                        int(firsts[run[0]]), int(firsts[run[-1]]) + self._zone_rows, lo, hi,
                        d.gpid, d.gpid + PROCESS), empty=True))
        got = [g for g in got if g is not None]
        if not got:
            return np.zeros(0, dtype=np.int64), none
        ids, lc, tid, start = (np.concatenate(x) for x in zip(*got))
        order = np.argsort(lc, kind="stable")
        return ids, (lc[order], (tid & TID_BITS)[order], (start / NS_PER_US)[order])

    def launched_here(self, d: Device) -> bool:
        """Whether the process has any host runtime call with a correlation id: if not
        (a device-only capture), no device row is left out for want of its launch."""
        if d.gpid not in self._has_runtime:
            self._has_runtime[d.gpid] = self.have[RUNTIME] and self.con.execute(
                f"SELECT 1 FROM {RUNTIME} WHERE globalTid >= ? AND globalTid < ? AND "
                "correlationId IS NOT NULL LIMIT 1", (d.gpid, d.gpid + PROCESS)).fetchone() \
                is not None
        return self._has_runtime[d.gpid]

    def _runtime_zones(self):
        """Per ZONE_ROWS rows (by rowid) of the runtime table: the first rowid and the
        smallest and largest correlation id (a coarse index, one scan, kept)."""
        if self._zones is None:
            n = self._zone_rows = ZONE_ROWS
            lo, hi = self.con.execute(f"SELECT min(rowid), max(rowid) FROM {RUNTIME}").fetchone()
            firsts = np.arange(lo, hi + 1, n) if lo is not None else np.zeros(0, int)
            zones = [self.con.execute(f"SELECT min(correlationId), max(correlationId) FROM "
                                      f"{RUNTIME} WHERE rowid >= ? AND rowid < ?",
                                      (int(f), int(f) + n)).fetchone() for f in firsts]
            self._zones = (firsts, np.array([_FAR if a is None else a for a, _ in zones]),
                           np.array([-_FAR if b is None else b for _, b in zones]))
        return self._zones

    def _launches(self) -> np.ndarray:
        """Name ids of kernel launches (`*Launch*` runtime / driver calls)."""
        if self._launch_ids is None:
            self._launch_ids = np.array([r[0] for r in self.con.execute(
                "SELECT id FROM StringIds WHERE value LIKE '%Launch%'")], dtype=np.int64)
        return self._launch_ids

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


class _Slices:
    """One rank's slices of device rows, each attributed with the rank's whole host side
    (`attribute`; what it derives from the host side built once: `HostSide`), and their sum
    (`result`)."""

    def __init__(self, ex: Export, d: Device, host: RankEvents, group_size: int | None):
        self.ex, self.d, self.host, self.group_size = ex, d, host, group_size
        self.derived: HostSide | None = None  # built once, for every slice
        self.parts: list[RankResult] = []
        self.comm_lengths: list[float] = []
        self.memory_only: list[tuple[np.ndarray, np.ndarray]] = []
        self.unlaunched = 0  # left out of the memory-only slices

    def add(self, rows: dict) -> None:
        h = self.host
        part = RankEvents(spans=h.spans, comm_ops=h.comm_ops, busy=h.busy,
                          backward_starts=h.backward_starts, pid=h.pid)
        cls, corr = rows["cls"], rows["corr"]
        for c, (ts, end, cr) in ((COMPUTE, ("kernel_ts", "kernel_end", "kernel_corr")),
                                 (MEMORY, ("mem_ts", "mem_end", "mem_corr"))):
            sel = cls == c
            _extend(getattr(part, ts), rows["ts"][sel])
            _extend(getattr(part, end), rows["end"][sel])
            _extend(getattr(part, cr), corr[sel])
        for i in np.flatnonzero(cls == COMM):
            text = self.ex.comm[int(rows["name"][i])]
            part.comm_kernels.append(Kernel(text, int(rows["stream"][i]), float(rows["ts"][i]),
                                            float(rows["end"][i]), None, int(corr[i]),
                                            kernel_kind(text), None, None, None, None))
        ids, launches = self.ex.host_calls(self.d, corr)
        if self.ex.launched_here(self.d):
            # -1 is no operation's id (those are kept anyway): the rule applies even to a
            # slice none of whose operations was launched in the capture
            _extend(part.host_corr, np.append(ids, -1))
        _launches_of(part, launches, corr)
        part.drop_unlaunched()
        if not part.is_gpu:  # memory operations alone: device busy, nothing else
            self.unlaunched += part.unlaunched
            self.memory_only.append(tl.merge(part.mem_ts, part.mem_end))
            return
        self.comm_lengths.append(tl.length(tl.merge([k.ts for k in part.comm_kernels],
                                                    [k.end for k in part.comm_kernels])))
        if self.derived is None:
            self.derived = HostSide(self.host)
        self.parts.append(attribute(part, self.group_size, self.derived))

    def result(self) -> RankResult:
        if not self.parts:  # no kernel counted: the host side alone
            self.parts.append(attribute(self.host, self.group_size))
            self.comm_lengths.append(0.0)
        res = self.parts[0] if len(self.parts) == 1 else _merged(self.parts, self.comm_lengths)
        res.unlaunched += self.unlaunched
        if self.memory_only:
            ws = np.array([s.ts for s in res.steps], dtype=float)
            we = np.array([s.end for s in res.steps], dtype=float)
            for busy in self.memory_only:
                for st, v in zip(res.steps, tl.overlap_each(ws, we, busy)):
                    st.device_busy += float(v)
        return res


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


def _launches_of(part: RankEvents, launches, corr: np.ndarray) -> None:
    """Give a slice the launches of its own device rows (by correlation id; `launches`
    sorted by it)."""
    lc, lt, lts = launches
    if not len(lc) or not len(corr):
        return
    i = np.clip(np.searchsorted(lc, corr), 0, len(lc) - 1)
    i = np.sort(i[lc[i] == corr])
    i = i[np.concatenate(([True], i[1:] != i[:-1]))]  # unique (np.unique hashes: slow)
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
                      sum(p.comm_kernels for p in parts), sum(p.comm_outside for p in parts),
                      sum(p.unlaunched for p in parts))


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
        """Each rank of one export, read and attributed in turn."""
        added = False
        for d in ex.devices:
            rank = len(self.ranks)
            host = ex.host_events(d)
            added |= one_window(host, ex.span)
            result = ex.rank_result(d, host, self.opts.world_size)
            header = {"host_name": ex.host, "trace_id": ex.path.stem,
                      "_bad_times": host.bad_times, "nsys_pid": d.pid, "nsys_device": d.device,
                      "nsys_schema": ex.schema}
            self.ranks[rank] = RankTrace(rank, ex.path, header, result, d.pid)
            self.where[rank] = f"{ex.path.name} process {d.pid} device {d.device}"
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
