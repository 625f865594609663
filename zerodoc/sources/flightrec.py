"""PyTorch flight-recorder dumps as a source: who stopped the job, and where.

PyTorch keeps, per rank, a ring of the last collectives (`TORCH_NCCL_TRACE_BUFFER_SIZE` or
`TORCH_FR_BUFFER_SIZE` > 0; NCCL and, since 2.8, gloo) and dumps it on a timeout
(`TORCH_NCCL_DUMP_ON_TIMEOUT`) or on demand (`torch._C._distributed_c10d._dump_nccl_trace()`,
`_dump_fr_trace()`): one file per rank, a pickled dict (format versions 2.0-2.10), or the
same as JSON (`_dump_nccl_trace_json`). Each holds `entries` (collective `profiling_name`,
`process_group` (name, desc), `collective_seq_id` in that group, `state`), and from 2.2
`pg_config` (each group's global ranks) and from 2.4 `pg_status` (per group, by the rank's
local `pg_id`: the last collective enqueued, started, completed: it outlives the ring).

A hung job reads as: ranks that entered collective N of a group and did not complete it,
and a member of that group that never entered N. That member is what they wait for; if it
waits for nobody itself it stopped first (`stopped_ranks`). A rank whose dump is empty (a
rank holding the interpreter lock or a dead GPU cannot fill it) or missing has entered
nothing anyone can see: evidence that it stopped, not an error. Each file is one rank: the
number its name ends with (`nccl_trace_rank_3`, `_dump_3`), as torch's `fr_trace` reads it.

Read safely: a pickle may name only plain data (dict, list, tuple, str, numbers, None;
anything else is refused, with the name it asked for), every file is read whole under a size
bound (`MAX_DUMP_BYTES`, also after gzip), and only the fields used are kept.
"""

from __future__ import annotations

import bisect
import functools
import gc
import gzip
import io
import json
import os
import pickle
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import UserError
from ..runmodel import RankFacts, RankWindow, RunSnapshot

MAX_DUMP_BYTES = 256 << 20  # a 2,000-entry ring without stacks is ~0.4 MB (bench/flightrec.py);
# stacks add ~1-2 KB an entry: 20,000 entries with stacks fit
MAX_DIR_FILES = 65536
_RANK_AT_END = re.compile(r"(\d+)(?:\.(?:pkl|pickle|json))?(?:\.gz)?$")
SAFE_GLOBALS = {("collections", "OrderedDict"): dict}
MAX_WORKERS, PER_WORKER = 16, 64  # processes reading a big folder; files each at least
KEEP_OPS = 64  # per rank and group, the newest collectives' names kept (the waited ones)


class DumpRefused(UserError):
    """A dump that is not plain data, or too big to read: never unpickled further."""


class _PlainUnpickler(pickle.Unpickler):
    """Plain containers and scalars only: a GLOBAL / STACK_GLOBAL / extension code naming
    anything outside `SAFE_GLOBALS` is refused before it is imported."""

    def find_class(self, module: str, name: str):
        ok = SAFE_GLOBALS.get((module, name))
        if ok is None:
            raise DumpRefused(f"refers to {module}.{name}: a flight-recorder dump holds plain "
                              "data only, so it is not read")
        return ok

    def persistent_load(self, pid):
        raise DumpRefused("uses persistent ids: not a flight-recorder dump")


def read_bytes(path: Path) -> bytes:
    """The file's bytes (gunzipped when it is gzip), at most `MAX_DUMP_BYTES`."""
    with open(path, "rb") as f:
        raw = f.read(MAX_DUMP_BYTES + 1)
    if raw[:2] == b"\x1f\x8b":
        try:
            with gzip.GzipFile(fileobj=io.BytesIO(raw)) as g:
                raw = g.read(MAX_DUMP_BYTES + 1)
        except (OSError, EOFError) as e:
            raise ValueError(f"broken gzip: {e}") from None
    if len(raw) > MAX_DUMP_BYTES:
        raise DumpRefused(f"holds more than {MAX_DUMP_BYTES >> 20} MiB: not read")
    return raw


def load_dump(path: Path) -> dict:
    """One dump as a dict. DumpRefused (hostile or huge); ValueError (truncated, garbled:
    a rank that died while writing it)."""
    raw = read_bytes(path)
    head = raw.lstrip()[:1]
    collecting = gc.isenabled()
    gc.disable()  # a dump is ~50,000 small containers and no cycle: the collector's passes
    try:          # over them cost ~30 % (6.2 -> 4.5 ms for a 2,000-entry dump's pickle)
        if head == b"{":
            obj = json.loads(raw)
        else:
            # buffered: torch writes protocol 2 (no frames), and from a bare BytesIO the C
            # unpickler reads op by op through Python calls (16 ms a dump against 7.8)
            obj = _PlainUnpickler(io.BufferedReader(io.BytesIO(raw), len(raw) + 1)).load()
    except DumpRefused:
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError,
            AttributeError, MemoryError, RecursionError, OverflowError) as e:
        raise ValueError(f"not a readable dump ({type(e).__name__}: {str(e)[:80]})") from None
    finally:
        if collecting:
            gc.enable()
    if not isinstance(obj, dict) or not ("entries" in obj or "pg_status" in obj
                                         or "version" in obj):
        raise ValueError("not a flight-recorder dump (no entries, version or pg_status)")
    return obj


def _int(v) -> int | None:
    """A sequence number as the dumps write it (an int; a string in the JSON form)."""
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


@functools.lru_cache(maxsize=4096)
def _ranks_str(v: str) -> tuple[int, ...] | None:
    try:
        got = json.loads(v)
    except ValueError:
        return None
    return tuple(got) if isinstance(got, list) and all(type(x) is int for x in got) else None


def _ranks(v) -> list[int] | None:
    """pg_config's `ranks`: a string "[0, 1]" (a list in some versions); None: unknown."""
    if isinstance(v, str):  # the same few strings in every rank's dump: parsed once
        got = _ranks_str(v)
        return list(got) if got else None
    if isinstance(v, (list, tuple)) and v and all(isinstance(x, int) for x in v):
        return [int(x) for x in v]
    return None


@dataclass
class Group:
    """What one rank's dump says of one process group."""

    desc: str = ""
    entered: int | None = None  # newest collective sequence number it enqueued
    completed: int | None = None  # newest it saw complete (None: the dump does not say)
    ops: dict[int, str] = field(default_factory=dict)  # seq -> collective, as recorded


@dataclass
class RankDump:
    """One rank's dump, reduced to what the analysis reads. `status`: "ok", "empty" (no
    entries and no group status), "missing" (no file) or "unreadable"."""

    rank: int
    status: str
    version: str = ""
    backend: str = ""
    groups: dict[str, Group] = field(default_factory=dict)  # by group name (global)
    members: dict[str, list[int]] = field(default_factory=dict)  # pg_config, by name
    world: list[int] | None = None  # the default group's ranks (pg_config)
    note: str = ""


def _group_of(out: RankDump, local: dict, pg, pg_id) -> Group:
    """The Group of an entry's `process_group` (name, desc), or of its `pg_id` (1.x)."""
    named = isinstance(pg, tuple) and pg
    name = str(pg[0]) if named else str(pg_id if pg_id is not None else "")
    if pg_id is not None:
        local[str(pg_id)] = name
    g = out.groups.setdefault(name, Group(desc=str(pg[1]) if named and len(pg) > 1 else ""))
    g.entered = -1 if g.entered is None else g.entered
    g.completed = -1 if g.completed is None else g.completed
    return g


def reduce_dump(rank: int, d: dict) -> RankDump:
    """The fields the analysis needs, from one loaded dump (any 2.x version)."""
    out = RankDump(rank, "ok", version=str(d.get("version", "")))
    for name, cfg in (d.get("pg_config") or {}).items():
        if isinstance(cfg, dict):
            members = _ranks(cfg.get("ranks"))
            if members:
                out.members[str(cfg.get("name", name))] = members
                if cfg.get("desc") == "default_pg":
                    out.world = members
    local: dict[str, str] = {}  # the rank's pg_id -> group name (pg_status is by pg_id)
    entries = d.get("entries")
    by_key: dict = {}  # process_group as recorded -> Group (a ring names a few groups)
    for e in entries if isinstance(entries, list) else ():
        if type(e) is not dict or e.get("is_p2p"):
            continue  # p2p ops count per pair, not per group: no group-wide sequence
        seq = e.get("collective_seq_id", e.get("seq_id"))
        if type(seq) is not int and (seq := _int(seq)) is None:
            continue
        pg = e.get("process_group")
        key = (tuple(pg) if type(pg) is list else pg, e.get("pg_id"))
        g = by_key.get(key)
        if g is None:
            g = by_key[key] = _group_of(out, local, *key)
        g.ops[seq] = e.get("profiling_name")
        if seq > g.entered:
            g.entered = seq
        if seq > g.completed and e.get("state") == "completed":
            g.completed = seq
    for g in out.groups.values():  # -1: none seen
        if len(g.ops) > KEEP_OPS:  # names are read near the newest only: memory per rank
            g.ops = dict(sorted(g.ops.items())[-KEEP_OPS:])
        g.entered = None if g.entered < 0 else g.entered
        g.completed = None if g.completed < 0 else g.completed
    out.backend = next((str(op).split(":", 1)[0] for g in out.groups.values()
                        for op in g.ops.values() if ":" in str(op)), "")
    for pg_id, st in (d.get("pg_status") or {}).items():
        name = local.get(str(pg_id))
        if name is None or not isinstance(st, dict):
            continue  # a group this rank's ring holds no entry of: no name to match
        g = out.groups[name]
        g.entered = -1 if g.entered is None else g.entered
        g.completed = -1 if g.completed is None else g.completed
        enq, done = _int(st.get("last_enqueued_collective")), _int(
            st.get("last_completed_collective"))
        g.entered = max(-1 if enq is None else enq, g.entered)
        g.completed = max(-1 if done is None else done, g.completed)
        g.entered = None if g.entered < 0 else g.entered
        g.completed = None if g.completed < 0 else g.completed
    if not out.groups:
        out.status = "empty"
    return out


def dump_files(path: Path) -> dict[int, Path]:
    """rank -> file, for each file of a directory whose name ends with a number."""
    files = [path] if path.is_file() else sorted(p for p in path.iterdir() if p.is_file())
    if len(files) > MAX_DIR_FILES:
        raise UserError(f"{path}: {len(files)} files, more than {MAX_DIR_FILES} ranks read")
    out: dict[int, Path] = {}
    for f in files:
        m = _RANK_AT_END.search(f.name)
        if m:
            r = int(m.group(1))
            if r in out:
                raise UserError(f"{f} and {out[r]} are both rank {r}")
            out[r] = f
    return out


def looks_like_dumps(path: Path) -> bool:
    """A directory (or file) of flight-recorder dumps: no run logs, and its first numbered
    file starts as a pickle or as a JSON dump's keys."""
    if path.is_dir() and any(path.glob("rank-*.jsonl")):
        return False
    try:
        files = dump_files(path) if path.exists() else {}
        if not files:
            return False
        with open(files[min(files)], "rb") as f:
            head = f.read(512)
    except (OSError, UserError):
        return False
    if head[:2] == b"\x1f\x8b":
        try:
            head = gzip.GzipFile(fileobj=io.BytesIO(head)).read(512)
        except (OSError, EOFError):
            pass  # a short head cannot be gunzipped whole: its first bytes still show
    if head[:1] == b"\x80":
        return b"version" in head or b"entries" in head or b"pg_config" in head or \
            len(head) < 512
    if any(k in head for k in KINETO_KEYS):  # a profiler trace: its distributedInfo
        return False                          # holds "pg_config" too (PyTorch 2.x)
    return head.lstrip()[:1] == b"{" and any(
        k in head for k in (b'"comm_lib_version"', b'"entries"', b'"pg_config"', b'"pg_status"'))


# Keys a PyTorch profiler (Kineto) trace opens with, none of them a dump's
KINETO_KEYS = (b'"traceEvents"', b'"schemaVersion"', b'"distributedInfo"',
               b'"deviceProperties"', b'"displayTimeUnit"')


# --------------------------------------------------------------------------------------
# who waits for whom

NO_RECORD = ("empty", "missing", "unreadable")  # a rank that left no usable record


@dataclass
class Verdict:
    """What the dumps say: `stopped` (one dict per rank that stopped first: rank, evidence
    ("behind": its dump stops before the collective; or empty / missing / unreadable),
    process_group, desc, sequence (the first collective of the group it did not enter),
    collective, last_entered, waited_by), `waiting` (rank -> the group, sequence and
    collective it waits in, and for whom), `confidence` ("high": every stopped rank's own
    dump shows it behind; "medium": some rest on a dump that is empty or missing; "low":
    the ranks wait for each other in a circle), `notes` (what could not be matched)."""

    stopped: list[dict] = field(default_factory=list)
    waiting: dict[int, dict] = field(default_factory=dict)
    confidence: str | None = None
    notes: list[str] = field(default_factory=list)


def group_members(dumps: dict[int, RankDump], world: list[int]
                  ) -> tuple[dict[str, list[int]], set[str]]:
    """Global ranks of each group: pg_config, else the whole world for the default group,
    else the ranks whose dumps mention it (gloo's dumps carry no pg_config); and the names
    of the groups guessed so (a member without a dump is not in them)."""
    out: dict[str, list[int]] = {}
    seen: dict[str, set[int]] = {}
    for d in dumps.values():
        for name, members in d.members.items():
            out.setdefault(name, members)
        for name, g in d.groups.items():
            seen.setdefault(name, set()).add(d.rank)
            if g.desc == "default_pg" and name not in out:
                out[name] = list(world)
    guessed = set(seen) - set(out)
    for name in guessed:
        out[name] = sorted(seen[name])
    return out, guessed


def _edges(dumps: dict[int, RankDump], members: dict[str, list[int]], guessed: set[str]
           ) -> tuple[dict[int, list], set[int]]:
    """rank -> [(group, sequence it waits in, rank it waits for, first seq that rank
    lacks)]: it entered collective `seq` of the group and did not complete it, and that
    member entered only earlier ones (or left no record at all). And the ranks that wait in
    a guessed group with no member behind: for one the dumps do not list."""
    out: dict[int, list] = {}
    unseen: set[int] = set()
    for name, ranks in members.items():
        entered, silent = [], []  # (entered, rank) of members whose dump has the group
        for q in ranks:
            dq = dumps.get(q)
            gq = dq.groups.get(name) if dq else None
            if dq is not None and dq.status in NO_RECORD:
                silent.append(q)
            elif gq is not None and gq.entered is not None:
                entered.append((gq.entered, q))
        entered.sort()
        # a collective some member saw complete was entered by every member: a rank whose
        # newest is that old waits for nobody there, only its record of the end is stale
        # (an async collective nobody waited on: DeepSpeed's start-up broadcasts on gloo)
        done = max((c for _, q in entered
                    if (c := dumps[q].groups[name].completed) is not None), default=-1)
        behind: dict[int, list] = {}  # a sequence number -> members short of it (once each)
        for e_r, r in entered:
            g = dumps[r].groups[name]
            if (g.completed is not None and g.completed >= e_r) or e_r <= done:
                continue  # it completed all it entered: waits for nobody in this group
            if e_r not in behind:
                behind[e_r] = [(q, e + 1) for e, q in
                               entered[:bisect.bisect_left(entered, (e_r,))]]
            # a member with no record lacks the first collective not seen complete, by r or
            # by any member (a completed collective was entered by every member; a rank's
            # own record of its last completion can lag its return from the wait: gloo's
            # pg_status, read at once after it; r may have issued more, async)
            seen = max(done, -1 if g.completed is None else g.completed)
            lacks = seen + 1 if seen >= 0 else None
            short = behind[e_r] + [(q, lacks) for q in silent]
            if short:
                out.setdefault(r, []).extend((name, e_r, q, lacks) for q, lacks in short)
            elif name in guessed:
                unseen.add(r)
    return out, unseen


def _op(dumps: dict[int, RankDump], ranks, name: str, seq: int) -> str:
    """The collective `seq` of group `name`, as any of `ranks` recorded it."""
    for r in ranks:
        g = dumps[r].groups.get(name) if r in dumps else None
        if g is not None and g.ops.get(seq) is not None:
            return str(g.ops[seq])
    return "?"


def analyse(dumps: dict[int, RankDump], world: list[int]) -> Verdict:
    """Who stopped first, from every rank's dump (`dumps` holds one per rank of `world`,
    missing ones included)."""
    members, guessed = group_members(dumps, world)
    edges, unseen = _edges(dumps, members, guessed)
    v = Verdict()
    if not edges:
        return v
    targets = {q for es in edges.values() for _, _, q, _ in es}
    roots = sorted(q for q in targets if q not in edges and q not in unseen)
    circle = not roots
    if circle:  # each waits for another (collectives issued in different orders), or for
        # a member of a group the dumps do not list (no pg_config, its dump missing)
        roots = sorted(targets)
    for q in roots:
        into = [(r, e) for r, es in edges.items() for e in es if e[2] == q and r != q]
        by_group: dict[str, list] = {}
        for r, e in into:
            by_group.setdefault(e[0], []).append((r, e))
        name, ins = max(by_group.items(), key=lambda kv: (len(kv[1]), kv[0]))
        d = dumps[q]
        lacks = min((e[3] if e[3] is not None else e[1]) for _, e in ins)
        waiters = sorted({r for r, _ in ins})
        gq = d.groups.get(name)
        v.stopped.append({
            "rank": q, "evidence": "behind" if d.status == "ok" else d.status,
            "process_group": name, "desc": _desc(dumps, waiters, name), "sequence": lacks,
            "collective": _op(dumps, waiters, name, lacks),
            "last_entered": gq.entered if gq else None, "waited_by": waiters,
            "note": d.note})
    named = {(s["process_group"], s["rank"]) for s in v.stopped}
    for r, es in sorted(edges.items()):
        if r in roots and not circle:
            continue
        # the group the stopped rank is named in, where this rank waits for it there
        name, seq, _, _ = next((e for e in es if (e[0], e[2]) in named), es[0])
        v.waiting[r] = {"process_group": name, "desc": _desc(dumps, [r], name),
                        "sequence": seq, "collective": _op(dumps, [r], name, seq),
                        "waits_for": sorted({q for n, s, q, _ in es if (n, s) == (name, seq)})}
    v.confidence = "low" if circle else (
        "high" if all(s["evidence"] == "behind" for s in v.stopped) else "medium")
    return v


def _desc(dumps: dict[int, RankDump], ranks, name: str) -> str:
    for r in ranks:
        g = dumps[r].groups.get(name) if r in dumps else None
        if g is not None and g.desc:
            return g.desc
    return ""


# --------------------------------------------------------------------------------------
# the source

def read_dumps(path: Path, world_size: int | None = None
               ) -> tuple[dict[int, RankDump], list[int]]:
    """Every rank's dump of a directory (or one file), and the world: the default group's
    ranks in pg_config, else `world_size` ranks (--world-size: gloo's dumps carry no
    pg_config), else 0..the highest rank numbered. A rank of the world without a
    file is "missing", a file that cannot be read "unreadable" (a rank that died while
    writing it): both are evidence. A file that is not plain data raises DumpRefused."""
    files = dump_files(path)
    if not files:
        raise UserError(f"no flight-recorder dumps (files named ...<rank>) at {path}")
    items = sorted(files.items())
    workers = min(os.cpu_count() or 1, MAX_WORKERS, len(items) // PER_WORKER)
    if workers > 1:  # unpickling is most of the time: a 1,024-rank folder on every core
        from concurrent.futures import ProcessPoolExecutor

        chunks = [items[i::workers] for i in range(workers)]
        with ProcessPoolExecutor(workers) as pool:
            got = [d for part in pool.map(_read_all, chunks) for d in part]
    else:
        got = _read_all(items)
    refused = next((d for d in got if isinstance(d, str)), None)
    if refused is not None:
        raise DumpRefused(refused)
    dumps: dict[int, RankDump] = {d.rank: d for d in got}
    if world_size is not None and world_size <= max(files):
        raise UserError(f"--world-size {world_size}: {path} holds a dump of rank {max(files)}")
    world = next((d.world for d in dumps.values() if d.world), [])
    world = sorted(set(world) | set(range(world_size or max(files) + 1)))
    for r in world:
        dumps.setdefault(r, RankDump(r, "missing", note=f"no dump of rank {r}"))
    return dumps, world


def _read_all(items: list[tuple[int, Path]]) -> list:
    """RankDumps of (rank, file) pairs; the first refused file ends it as its message (a
    string: what crosses back from a worker process is plain data)."""
    out: list = []
    for r, f in items:
        try:
            out.append(reduce_dump(r, load_dump(f)))
        except DumpRefused as e:
            return [f"{f}: {e}"]
        except (ValueError, OSError) as e:
            out.append(RankDump(r, "unreadable", note=f"{f.name}: {e}"))
    return out


class FlightRecorderSource:
    """A folder of flight-recorder dumps (see the module docstring). Read once: a dump is
    the state at one moment, so every `snapshot()` is the same. The snapshot has one rank
    per dump with no steps (a dump holds no step timing); `stalls` carries the verdict:
    a "stuck" record per waiting rank (the collective it waits in) and per rank that
    stopped first (`in`: "flightrec", no collective: it did not reach the one the others
    wait in), each with `source: "flightrec"` for rule ZD013."""

    def __init__(self, spec: str | Path, world_size: int | None = None):
        self.path = Path(spec)
        self.dumps, self.world = read_dumps(self.path, world_size)
        self.verdict = analyse(self.dumps, self.world)
        n = sum(d.status != "missing" for d in self.dumps.values())
        self.description = f"flight-recorder dumps {self.path} ({n} of {len(self.world)} ranks)"
        self.places: dict[int, dict] = {}  # rank -> where it is (add_runlog), by step and unit
        self.runlog_notes: list[str] = []

    def add_runlog(self, run_dir: str | Path) -> None:
        """Place the verdict's collectives in steps, units and phases from a zerodoc run log
        of the same job (`--runlog`; flightrec_units.py): a stopped rank between its last
        entered collective of the group and the one it did not reach (`_stopped_in`), a
        waiting rank in the unit of the collective it waits in. Each rank's own log first,
        else any other's."""
        from .flightrec_units import RunLogOrders

        logs = RunLogOrders(run_dir)
        others = list(self.world)
        v = self.verdict
        for s in v.stopped:
            a = s["awaited_place"] = logs.place(s["process_group"], s["sequence"],
                                                [*s["waited_by"], *others])
            if s["evidence"] == "behind" and s["last_entered"] is not None:
                p = logs.place(s["process_group"], s["last_entered"], [s["rank"], *others])
                if p is not None:
                    self.places[s["rank"]] = {**p, "stopped_in": _stopped_in(p, a)}
            elif s["evidence"] != "behind":
                p = self._place_silent(logs, s)
                if p is not None:
                    self.places[s["rank"]] = {**p, "stopped_in": _stopped_in(p, a) if p[
                        "offset"] else {"unit": None, "phase": None}}
        for r, w in v.waiting.items():
            p = logs.place(w["process_group"], w["sequence"], [r, *others])
            if p is not None:
                self.places[r] = p
        wanted = {s["rank"] for s in v.stopped} | set(v.waiting)
        if wanted and not self.places:
            self.runlog_notes.append(
                f"run log {run_dir}: no collective placed in a unit (no `collorder` record "
                f"in the ranks' logs read ({len(logs.read)}): a zerodoc before issue 34, no "
                "detail step yet, or another job's run directory)")
        else:
            self.runlog_notes.append(
                f"run log {run_dir}: {len(self.places)} of {len(wanted)} ranks placed in a "
                "step and unit by their collectives' sequence numbers")

    def _place_silent(self, logs, s: dict) -> dict | None:
        """A stopped rank whose dump is empty, missing or unreadable, placed by its own run
        log alone (`confidence: "runlog"`: not from its dump). Its peers completed
        collective `sequence` - 1 of the group (their dumps say so), which needs every
        member: it entered that one, placed as a dumped rank's last. Without that (or where
        its own newest step record ends past that one: it finished that step), only its
        step: the one after its newest step record. None when its log has no collective
        order, or its newest step ends at or past the awaited collective (another process's
        log: the dump is of a newer one)."""
        r, name, seq = s["rank"], s["process_group"], s["sequence"]
        o = logs.rank(r)
        if o is None or not o.steps or seq is None:
            return None
        step, ends = o.steps[0]  # its newest step record
        if ends.get(name, -1) >= seq:
            self.runlog_notes.append(
                f"run log of rank {r}: its newest step ({step}) ends at #{ends[name]} of "
                f"process group {name}, past the awaited #{seq}: not the process whose dump "
                "is missing; not placed")
            return None
        last = seq - 1
        done = [self.dumps[w].groups.get(name) for w in s["waited_by"]]
        p = o.place(name, last) if last > ends.get(name, -1) and last >= 1 and any(
            g is not None and g.completed is not None and g.completed >= last
            for g in done) else None
        if p is None:
            p = {"step": step + 1, "offset": None, "of": None, "unit": None, "phase": None,
                 "collective": None, "steps_past_log": 0}
        return {**p, "sequence": last if p["offset"] is not None else None,
                "from_rank": r, "confidence": "runlog"}

    def snapshot(self) -> RunSnapshot:
        snap = RunSnapshot(source=self.description)
        backend = next((d.backend for d in self.dumps.values() if d.backend), "")
        for r in self.world:
            snap.ranks[r] = RankWindow(facts=self._facts(r, backend))
        snap.missing_ranks = {r for r, d in self.dumps.items() if d.status == "missing"}
        # a dump is what a stopped job left: no rank writes after it, none ended cleanly
        snap.stale_ranks = set(self.world)
        v = self.verdict
        for s in v.stopped:
            snap.stalls[s["rank"]] = _record(s, "flightrec", "", self.places.get(s["rank"]),
                                             confidence=v.confidence, dump=s["evidence"],
                                             last_entered=s["last_entered"],
                                             waited_by=s["waited_by"],
                                             awaited=s["collective"],
                                             awaited_place=s.get("awaited_place"))
        for r, w in v.waiting.items():
            snap.stalls[r] = _record({"rank": r, **w}, "collective", w["collective"],
                                     self.places.get(r), waits_for=w["waits_for"])
        snap.log_notes.extend(self.notes() + self.runlog_notes)
        return snap

    def notes(self) -> list[str]:
        """What the dumps hold, one line each (the report's notes)."""
        by = {}
        for d in self.dumps.values():
            by.setdefault(d.status, []).append(d.rank)
        out = [f"flight recorder: {len(by.get('ok', []))} dumps with entries"
               + "".join(f", {st} {_ranks_text(rs)}" for st, rs in sorted(by.items())
                         if st != "ok")]
        out += [d.note for d in self.dumps.values() if d.status == "unreadable"]
        if not self.verdict.stopped:
            out.append("flight recorder: no rank is behind another in any process group "
                       "(every rank entered the collectives its groups' others did): the "
                       "dumps name no rank that stopped")
        return out

    def _facts(self, r: int, backend: str) -> RankFacts:
        n = len(self.world)
        return RankFacts(
            rank=r, local_rank=r, world_size=n, local_world_size=n, node="",
            run_id=self.path.name, framework="none", framework_version="", torch_version="",
            device_type="cuda" if backend == "nccl" else "cpu", backend=backend or "none",
            zero_stage=None, mesh_shape=(n,), mesh_dim_names=None, param_dtype="",
            reduce_dtype="", units=(), device_capacity_bytes=None, started_unix=0.0, pid=0,
            config={"source": "flightrec", "dump_version": self.dumps[r].version})


# Collectives that end a unit's work in a phase (a gradient's reduce-scatter or all-reduce, a
# ZeRO-1 parameter broadcast after the local step); an all-gather starts one.
_ENDS_WORK = ("reduce_scatter", "all_reduce", "broadcast")
ENGINE_UNIT = "(model)"  # ZeRO-1's only unit, DeepSpeed's engine-wide collectives' unit


def _stopped_in(last: dict, awaited: dict | None) -> dict:
    """The unit and phase of a rank that entered collective `last` and not `awaited` (both
    placed). A collective that ends a unit's work in a phase (`_ENDS_WORK`): a rank short of
    it is still in that unit and phase (FSDP's reduce-scatter ends a unit's backward; the
    last collective may be the previous unit's all-gather, which FSDP prefetches as the unit's
    backward starts; a ZeRO-1 broadcast: the optimizer step). Where that one is the engine's
    own (`ENGINE_UNIT`: DeepSpeed's gradient bucket) and the last collective named a module
    unit in the same step and phase, the rank is in that module's work. Otherwise it is in
    the unit of its last collective: a unit's all-gather starts its work. A forward prefetch
    (opt-in in FSDP2, DeepSpeed's prefetch bucket) would place it one unit late."""
    if awaited and awaited.get("unit") and awaited.get("collective") in _ENDS_WORK:
        if awaited["unit"] == ENGINE_UNIT and last.get("unit") not in (None, ENGINE_UNIT) \
                and (last.get("step"), last.get("phase")) == (awaited.get("step"),
                                                                awaited.get("phase")):
            return {"unit": last["unit"], "phase": last["phase"]}
        return {"unit": awaited["unit"], "phase": awaited["phase"]}
    return {"unit": last.get("unit"), "phase": last.get("phase")}


def _record(s: dict, where: str, collective: str, place: dict | None, **extra) -> dict:
    """A watchdog-shaped "stuck" record (zerodoc/stalls.py) from the dumps' verdict; step,
    unit and phase from `place` (a run log of the same job, `add_runlog`), else None."""
    place = place or {}
    return {"type": "stall", "state": "stuck", "rank": s["rank"], "step": place.get("step"),
            "since_unix": 0.0, "unit": place.get("stopped_in", place).get("unit"),
            "phase": place.get("stopped_in", place).get("phase"),
            "in": where, "collective": collective, "stack": [], "source": "flightrec",
            "process_group": s["process_group"], "process_group_desc": s["desc"],
            "sequence": s["sequence"], "place": place or None, **extra}


def _ranks_text(ranks: list[int]) -> str:
    ranks = sorted(ranks)
    return f"rank{'s' if len(ranks) > 1 else ''} " + (
        ", ".join(map(str, ranks)) if len(ranks) <= 8
        else f"{', '.join(map(str, ranks[:8]))} and {len(ranks) - 8} more")
