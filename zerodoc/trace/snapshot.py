"""Profiler traces -> the run model (`RunSnapshot`), the same shape the live shim builds.

`TraceSource(spec)` reads every rank's trace once (a directory of traces, one file, or a
comma-separated list of files; `.json` or `.json.gz`), attributes it (`attribution.py`) and
serves `snapshot()` windows of the last N profiler steps like the other sources. Each file is
one rank: the rank comes from the trace's `distributedInfo`, else from the file name
(`rank-3`, `rank_3`, `rank3`), else a single file is rank 0.

Facts a trace does not carry are inferred where it shows them and otherwise come from
`TraceFacts` (command-line flags): world size (`distributedInfo`, else the number of files),
ZeRO stage (FSDP2/FSDP1: 3 when units are gathered again in backward, 2 when only in forward;
DDP: 0), dtypes (of the gathered and reduced tensors), group sizes (collective metadata,
`distributedInfo`), unit sizes (bytes of each unit's all-gather: padded, in the gather dtype),
device memory (`deviceProperties`). Per-step memory is not in a trace: the memory rules stay
silent unless `--device-memory` is given.
"""

from __future__ import annotations

import os
import re
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from ..errors import UserError
from ..runmodel import (CommTotals, DeviceTotals, RankFacts, RankWindow, RunSnapshot,
                     UnitFacts)
from .attribution import RankResult, attribute
from .events import RankEvents
from .stream import TraceError, read_trace

TRACE_SUFFIXES = (".json", ".json.gz")
_RANK_IN_NAME = re.compile(r"rank[-_.]?(\d+)", re.IGNORECASE)
US = 1e-6  # trace times are microseconds
FRAMEWORKS = ("fsdp2", "fsdp1", "deepspeed", "zero1", "ddp", "none")


@dataclass(kw_only=True)
class TraceFacts:
    """What the command line adds to what a trace shows (None: infer from the trace)."""

    world_size: int | None = None
    """Ranks in the job (default: distributedInfo, else the number of trace files)."""
    stage: int | None = None
    """Equivalent ZeRO stage 0-3 (default: inferred from when units are gathered)."""
    framework: str | None = None
    """fsdp2, fsdp1, deepspeed, zero1, ddp or none (default: from the trace's annotations)."""
    param_dtype: str | None = None
    """Dtype parameters are stored in (default: the all-gather dtype)."""
    link: str | None = None
    """Link class for the bandwidth rules (as `--link`)."""
    progress: bool = True
    """Report reading progress on stderr."""

    def __post_init__(self) -> None:
        if self.world_size is not None and self.world_size < 1:
            raise UserError(f"--world-size must be >= 1, not {self.world_size}")
        if self.stage is not None and self.stage not in (0, 1, 2, 3):
            raise UserError(f"--stage must be 0, 1, 2 or 3, not {self.stage}")
        if self.framework is not None and self.framework not in FRAMEWORKS:
            raise UserError(f"--framework must be one of {', '.join(FRAMEWORKS)}, "
                            f"not {self.framework!r}")


def is_trace_file(path: Path) -> bool:
    return path.is_file() and path.name.endswith(TRACE_SUFFIXES)


def trace_files(spec: str | os.PathLike | list) -> list[Path]:
    """The trace files a SOURCE names ([] when it names none)."""
    if isinstance(spec, (list, tuple)):
        parts = [Path(p) for p in spec]
    else:
        text = str(spec)
        parts = [Path(p.strip()) for p in text.split(",")] if "," in text else [Path(text)]
    out: list[Path] = []
    for p in parts:
        if p.is_dir():
            out += sorted(q for q in p.iterdir() if is_trace_file(q))
        elif is_trace_file(p):
            out.append(p)
        elif len(parts) > 1:
            raise UserError(f"{p}: not a trace file (.json or .json.gz)")
    return out


def looks_like_trace_dir(path: Path) -> bool:
    """A directory holding traces and no zerodoc run logs."""
    return path.is_dir() and not any(path.glob("rank-*.jsonl")) and bool(trace_files(path))


class _Progress:
    def __init__(self, enabled: bool, n_files: int):
        self.enabled = enabled and n_files > 0
        self.n = n_files
        self.i = 0
        self.name = ""

    def file(self, i: int, path: Path) -> None:
        self.i, self.name = i, path.name

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        pct = 100.0 * done / total if total else 100.0
        sys.stderr.write(f"\rzerodoc: reading traces {self.i + 1}/{self.n} {self.name}: "
                         f"{pct:3.0f}% of {total / 1e6:,.1f} MB ")
        self.open = done < total
        if done >= total:
            sys.stderr.write("\n")
        sys.stderr.flush()

    def abort(self) -> None:
        """End a progress line left open (an error follows on its own line)."""
        if getattr(self, "open", False):
            self.open = False
            sys.stderr.write("\n")
            sys.stderr.flush()


@dataclass
class RankTrace:
    rank: int
    path: Path
    header: dict
    result: RankResult
    pid: int | None = None


def read_rank(path: Path, progress=None,
              world_size: int | None = None) -> tuple[dict, RankResult, int | None]:
    ev = RankEvents()
    header = read_trace(path, ev.add, progress=progress)
    header["_bad_times"] = ev.bad_times
    if not ev.spans and not ev.comm_ops and not ev.comm_kernels and not ev.cpu_ops:
        raise TraceError(f"{path}: no profiler events (operators, annotations or kernels)")
    return header, attribute(ev, default_group_size(header) or world_size), ev.pid


def unlaunched_note(n: int, name: str) -> str:
    """What the report says of device operations left out (events.py: drop_unlaunched)."""
    return (f"{n:,} device operation{'s' if n != 1 else ''} in {name} not counted: launched "
            "before the profiler recorded the host (no launch in the trace; the previous "
            "step's work still running), left out as HTA leaves them out")


def default_group_size(header: dict) -> int | None:
    """Ranks of the default process group, from the trace's distributedInfo."""
    di = header.get("distributedInfo")
    if not isinstance(di, dict):
        return None
    for pg in di.get("pg_config") or ():
        if isinstance(pg, dict) and pg.get("pg_name") == "0" and isinstance(pg.get("pg_size"),
                                                                           int):
            return pg["pg_size"]
    ws = di.get("world_size")
    return ws if isinstance(ws, int) else None


def _rank_of(path: Path, header: dict, single: bool) -> int:
    di = header.get("distributedInfo")
    if isinstance(di, dict) and isinstance(di.get("rank"), int):
        return di["rank"]
    m = _RANK_IN_NAME.search(path.name)
    if m:
        return int(m.group(1))
    if single:
        return 0
    raise UserError(f"{path}: no rank in the trace (distributedInfo) nor in the file name; "
                    "name the files rank-N.json")


class TraceSource:
    """Profiler traces as a source (see the module docstring)."""

    def __init__(self, spec: str | os.PathLike | list, window: int | None = 20, *,
                 facts: TraceFacts | None = None):
        self.opts = facts or TraceFacts()
        files = trace_files(spec)
        if not files:
            raise UserError(f"no profiler traces (.json, .json.gz) at {spec}")
        self.window = window
        label = ",".join(str(f) for f in files) if len(files) <= 2 else \
            f"{files[0].parent} ({len(files)} files)"
        self.description = f"profiler traces {label}"
        prog = _Progress(self.opts.progress, len(files))
        self.ranks: dict[int, RankTrace] = {}
        for i, path in enumerate(files):
            prog.file(i, path)
            try:
                header, result, pid = read_rank(path, prog, self.opts.world_size)
            except BaseException:
                prog.abort()
                raise
            rank = _rank_of(path, header, len(files) == 1)
            if rank in self.ranks:
                raise UserError(f"{path} and {self.ranks[rank].path} are both rank {rank}")
            self.ranks[rank] = RankTrace(rank, path, header, result, pid)
        self.overlap = {r: t.result.overlap_ratio for r, t in self.ranks.items()}

    def snapshot(self) -> RunSnapshot:
        snap = RunSnapshot(source=self.description)
        world = self._world_size()
        for rank, t in sorted(self.ranks.items()):
            facts = self._facts(t, world)
            snap.ranks[rank] = window_of(facts, t.result, self.window)
            bad = t.header.get("_bad_times", 0)
            if bad:
                snap.log_notes.append(f"{bad} event{'s' if bad != 1 else ''} skipped in "
                                      f"{t.path.name}: NaN, infinite or negative times")
            if t.result.unlaunched:
                snap.log_notes.append(unlaunched_note(t.result.unlaunched, t.path.name))
        return snap

    # --- facts ---------------------------------------------------------------------
    def _world_size(self) -> int:
        if self.opts.world_size:
            return self.opts.world_size
        sizes = [t.header.get("distributedInfo", {}).get("world_size") for t in self.ranks.values()
                 if isinstance(t.header.get("distributedInfo"), dict)]
        sizes = [s for s in sizes if isinstance(s, int)]
        return max(sizes) if sizes else max(len(self.ranks), max(self.ranks) + 1)

    def _facts(self, t: RankTrace, world: int) -> RankFacts:
        res = t.result
        di = t.header.get("distributedInfo") if isinstance(t.header.get("distributedInfo"),
                                                           dict) else {}
        units = unit_facts(res, default_group_size(t.header) or world, self.opts.param_dtype)
        framework = self.opts.framework or {"unknown": "none"}.get(res.framework, res.framework)
        if framework == "ddp" and not self.opts.framework and any(
                c.phase == "optimizer" and c.collective == "broadcast" for c in res.collectives):
            framework = "zero1"  # ZeroRedundancyOptimizer broadcasts the updated shards
        stage = self.opts.stage if self.opts.stage is not None else _stage(framework, units)
        gathered = next((u for u in units if u.param_dtype), None)
        capacity = None
        for d in t.header.get("deviceProperties") or ():
            if isinstance(d, dict) and isinstance(d.get("totalGlobalMem"), int):
                capacity = d["totalGlobalMem"]
                break
        base = t.header.get("baseTimeNanoseconds")
        started = base / 1e9 if isinstance(base, (int, float)) else 0.0
        config: dict = {"source": "profiler trace", "trace_file": str(t.path)}
        if self.opts.link:
            config["link"] = self.opts.link
        if res.overlap_ratio is not None:
            config["trace_overlap_ratio"] = res.overlap_ratio
        return RankFacts(
            rank=t.rank, local_rank=t.rank, world_size=world, local_world_size=world,
            node=str(t.header.get("host_name", "")),
            run_id=str(t.header.get("trace_id") or t.path.parent.name),
            framework=framework, framework_version="", torch_version="",
            device_type=res.device_type, backend=str(di.get("backend", "") or "none"),
            zero_stage=stage, mesh_shape=(world,), mesh_dim_names=None,
            param_dtype=gathered.param_dtype if gathered else "",
            reduce_dtype=gathered.reduce_dtype if gathered else "",
            units=tuple(units), device_capacity_bytes=capacity, started_unix=started,
            pid=t.pid or 0, config=config)


def _stage(framework: str, units: list[UnitFacts]) -> int | None:
    if framework == "zero1":
        return 1
    if framework in ("ddp", "none") and not any(u.reshard_after_forward is not None
                                                for u in units):
        return 0 if framework == "ddp" else None
    flags = [u.reshard_after_forward for u in units if u.reshard_after_forward is not None]
    if not flags:
        return None
    return 3 if any(flags) else 2


def unit_facts(res: RankResult, default_group: int, param_dtype: str | None) -> list[UnitFacts]:
    """Static facts per unit, from its collectives (module docstring)."""
    by_unit: dict[str, list] = defaultdict(list)
    for c in res.collectives:
        by_unit[c.unit].append(c)
    out = []
    for name in res.unit_order:
        cs = by_unit.get(name, [])
        ag = [c for c in cs if c.collective == "all_gather" and c.numel]
        red = [c for c in cs if c.collective in ("reduce_scatter", "all_reduce")]
        if ag:
            top = max(ag, key=lambda c: c.numel)
            numel, size, dt = top.numel, top.nbytes // top.numel, top.dtype or ""
        elif red and any(c.numel for c in red):  # nothing gathered (DDP): the gradients
            steps = {c.step for c in red} or {0}
            numel = sum(c.numel or 0 for c in red if c.collective != "reduce_scatter") // len(
                steps) or max(c.numel or 0 for c in red)
            size = max((c.nbytes // c.numel for c in red if c.numel), default=0)
            dt = ""
        else:
            numel, size, dt = 0, 0, ""
        group = next((c.group_size for c in cs if c.group_size), None) or default_group
        rdt = next((c.dtype for c in red if c.dtype), "")
        reshard = None
        if ag:
            reshard = any(c.phase == "backward" for c in ag)
        gather_bytes = numel * size
        param_bytes = gather_bytes
        if param_dtype:
            from .events import dtype_info

            info = dtype_info(param_dtype)
            if info:
                param_bytes = numel * info[1]
        out.append(UnitFacts(name=name, params=numel, param_bytes=param_bytes,
                             gather_bytes=gather_bytes if ag else 0,
                             sharded_bytes=param_bytes // max(1, group) if ag else param_bytes,
                             reshard_after_forward=reshard, group_size=group,
                             param_dtype=dt, reduce_dtype=rdt))
    return out


def window_of(facts: RankFacts, res: RankResult, window: int | None) -> RankWindow:
    """Totals over the last `window` profiler steps (all when None)."""
    steps = res.steps[-window:] if window else res.steps
    w = RankWindow(facts=facts)
    keep = {s.step for s in steps}
    for s in steps:
        secs = (s.end - s.ts) * US
        if w.steps == 0:
            w.first_step = s.step
        w.steps += 1
        w.last_step = s.step
        w.step_seconds += secs
        w.last_step_seconds = secs
        w.max_step_seconds = max(w.max_step_seconds, secs)
        w.step_times.append(secs)
        w.optimizer_seconds += s.optimizer * US
        w.framework_seconds += s.framework * US
        for k, v in s.compute.items():
            if v > 0:
                w.compute[k] = w.compute.get(k, 0.0) + v * US
        for k, v in s.unit_framework.items():
            if v > 0:
                w.unit_framework[k] = w.unit_framework.get(k, 0.0) + v * US
    step_exposed = dict.fromkeys((s.step for s in steps), 0.0)
    for c in res.collectives:
        if c.step not in keep:
            continue
        secs = max(0.0, c.done - c.issue) * US
        exposed = min(secs, max(0.0, c.exposed) * US)
        step_exposed[c.step] += exposed
        hidden = secs - exposed if c.hidden is None else min(secs - exposed, c.hidden * US)
        w.comm.setdefault((c.unit, c.phase, c.collective), CommTotals()).add(
            CommTotals(1, c.nbytes, secs, exposed, hidden))
    w.exposed_times = list(step_exposed.values())
    if res.device_type == "cuda":
        dev = w.device = DeviceTotals(kernels_outside_steps=res.comm_outside)
        for s in steps:
            dev.busy_seconds += s.device_busy * US
            dev.compute_seconds += s.device_compute * US
            dev.comm_seconds += s.device_comm * US
            dev.exposed_comm_seconds += s.device_exposed * US
        for c in res.collectives:
            if c.step in keep:
                dev.comm_kernels[c.collective] = dev.comm_kernels.get(c.collective, 0) + 1
    w.other_seconds = max(0.0, w.step_seconds - w.compute_seconds - w.exposed_seconds
                          - w.optimizer_seconds - w.framework_seconds)
    if steps and facts.started_unix > 0:  # a trace without baseTimeNanoseconds has no
        # wall clock: its last step's time is unknown, not 1970 ("498776 h ago")
        w.updated_unix = facts.started_unix + (steps[-1].end - res.steps[0].ts) * US
    return w
