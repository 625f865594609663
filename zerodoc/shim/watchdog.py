"""The watchdog: notices when this rank stops making progress, and records where it is stuck.

A daemon thread wakes every `poll_s` (at most 5 s) and reads what the training thread
already maintains, nothing more: `Recorder.last` (the clock of the last bucket switch; every
unit hook, collective wait and optimizer step moves it), `Monitor.step_index`, the end of the
last step (`Monitor._step_start`) and the slowest step so far (`totals.max_step_seconds`).
The training thread runs no watchdog code at all.

A rank is **stuck** when nothing moved for `stall_after_s` *and* no step ended for
max(`stall_after_s`, `STEP_FACTOR` x the slowest step so far): a run whose steps take five
minutes, with a three-minute layer, is slow, not stuck. Then, once per stall, the watchdog
works out where the rank is: from the recorder, the unit and phase (the innermost unit
bucket on its stack, and whether the top is a collective wait, unit compute, the framework's
hooks, the optimizer or code outside the units); from the training threads' Python stacks
(`sys._current_frames()`), the collective being waited on (a zerodoc timing frame: its unit
and collective) and the innermost frames; on a GPU, the oldest collective the device has not
finished (a CUDA event query, no sync). It writes one run-log record and publishes it for
the exporter; when progress comes back it writes a "resumed" record.

When `Monitor.close()` runs while an exception propagates (a collective raised because a
peer died: gloo's "Connection reset by peer"), `failed()` records where from the traceback;
the "end" record that follows is then not a clean close (sources leave the rank out of
`RunSnapshot.ended_ranks`). A SIGTERM (signals.py) has `signalled()` record where the
training thread was (a "terminated" record, then an end marked `"terminated": true`: a clean
close of a run stopped from outside, which ZD013 names as such).

On a step without per-unit detail (no zerodoc wrapper on the stack) a stall, a failure or a
signal is placed by the stack's frames alone (`_from_frames`): the unit's module, param group
or handle as a frame's `self` (or a framework function's `handle` / `current_submodule`), and
the framework's own functions (hookpoints.STACK_POINTS: FSDP2's `wait_for_unshard`, FSDP1's
`_unshard`, DeepSpeed's `fetch_sub_module`, ...) for the collective and the phase.

Records (run log, docs/report.md "Stalls")::

    {"type": "stall", "state": "stuck", "rank", "step", "since_unix", "detected_unix",
     "stalled_s", "in", "unit", "phase", "collective", "in_collective_s", "stack",
     "threshold_s", "slowest_step_s"}
    {"type": "stall", "state": "resumed", "rank", "step", "since_unix", "resumed_unix",
     "stalled_s"}
    {"type": "stall", "state": "failed", "rank", "step", "since_unix", "error", "in",
     "unit", "phase", "collective", "stack"}
    {"type": "stall", "state": "terminated", "rank", "step", "since_unix", "signal", "in",
     "unit", "phase", "collective", "stack"}

Nothing here signals, raises into or synchronises the job; every error is counted
(`zerodoc_errors_total{hook="watchdog"}`).
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from time import perf_counter

from .hookpoints import FRAMEWORK_MODULES, STACK_PHASE_LOCAL, STACK_UNIT_LOCALS, stack_point
from .recorder import (
    B_FRAMEWORK, B_OPTIMIZER, B_OTHER, B_WAIT, COLLECTIVES, OPTIMIZER, PHASES, bucket_unit,
)

STEP_FACTOR = 3.0  # no step for this many times the slowest step: not just a slow step
STACK_FRAMES = 12


def poll_interval(stall_after_s: float) -> float:
    return min(5.0, max(0.05, stall_after_s / 10.0))


def _unit_name(names: list[str], u) -> str | None:
    return names[u] if isinstance(u, int) and 0 <= u < len(names) else None


def _collective_of(frame, names: list[str]) -> dict | None:
    """A zerodoc timing frame (`HostTimer.sync_call`, `TimedWork.wait`, the CUDA and
    DeepSpeed equivalents): the collective it times, and since when."""
    if not str(frame.f_globals.get("__name__", "")).startswith("zerodoc.shim"):
        return None
    try:
        loc = frame.f_locals
    except Exception:  # noqa: BLE001 - a frame we cannot read is not one of ours
        return None
    unit, coll, t0 = loc.get("unit"), loc.get("coll"), loc.get("t0")
    me = loc.get("self")
    if not (isinstance(unit, int) and isinstance(coll, int)) and me is not None:
        unit, coll = getattr(me, "_unit", None), getattr(me, "_coll", None)
        t0 = loc.get("t_wait", getattr(me, "_t_issue", None))
    if isinstance(unit, int) and isinstance(coll, int) and 0 <= coll < len(COLLECTIVES):
        return {"unit": _unit_name(names, unit), "collective": COLLECTIVES[coll],
                "t0": t0 if isinstance(t0, float) else None}
    return None


def _describe(frames: list, names: list[str]) -> tuple[dict | None, list[str]]:
    """(collective found in the frames, innermost-last "file:line function" lines)."""
    found = None
    for fr in reversed(frames):  # innermost first: the wait that is blocking
        found = _collective_of(fr, names)
        if found is not None:
            break
    lines = [f"{fr.f_code.co_filename}:{fr.f_lineno} {fr.f_code.co_name}"
             for fr in frames[-STACK_FRAMES:]]
    return found, lines


# torch.distributed functions -> the collective they run (frames of steps without per-unit
# detail, where no zerodoc wrapper is on the stack)
_DIST_CALLS = {
    "all_gather_into_tensor": "all_gather", "_all_gather_base": "all_gather",
    "all_gather": "all_gather", "all_gather_single": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter",
    "reduce_scatter": "reduce_scatter", "reduce_scatter_single": "reduce_scatter",
    "all_reduce": "all_reduce", "broadcast": "broadcast",
}


def unit_objects(adapter) -> dict[int, int]:
    """id() of the objects that stand for a unit on a Python stack (its module, its FSDP2
    param groups, its FSDP1 handle; DeepSpeed stage 3: the modules it fetches for) -> unit
    index. Built once; read by the watchdog."""
    out: dict[int, int] = {}
    for u in getattr(adapter, "units", None) or ():
        idx = getattr(u, "index", None)
        if not isinstance(idx, int):
            continue
        for obj in (getattr(u, "module", None), getattr(u, "handle", None),
                    *(getattr(u, "groups", None) or ())):
            if obj is not None:
                out[id(obj)] = idx
    for attr in ("fetch_unit", "group_module_unit"):  # DeepSpeed: id(module) -> unit
        out.update({k: v for k, v in (getattr(adapter, attr, None) or {}).items()
                    if isinstance(k, int) and isinstance(v, int)})
    return out


def _unit_in(frame, objs: dict[int, int]) -> int | None:
    """The unit a frame works for: its `self`, or a framework function's `handle` (FSDP1),
    `current_submodule` (DeepSpeed's fetch) or `state` (FSDP1: the FSDP module) local."""
    names = frame.f_code.co_varnames
    local = None
    for key in STACK_UNIT_LOCALS:
        if key in names:
            local = local if local is not None else frame.f_locals
            obj = local.get(key)
            if obj is not None and id(obj) in objs:
                return objs[id(obj)]
    return None


def _point_phase(frame, point: tuple[str, str]) -> str | None:
    """The phase a stack point's frame says: the table's, else its `forward` flag
    (DeepSpeed's `fetch_sub_module(current_submodule, forward)`), else None."""
    if point[1]:
        return point[1]
    if STACK_PHASE_LOCAL not in frame.f_code.co_varnames:
        return None
    flag = frame.f_locals.get(STACK_PHASE_LOCAL)
    return ("forward" if flag else "backward") if isinstance(flag, bool) else None


def _from_frames(frames: list, objs: dict[int, int], names: list[str]) -> dict | None:
    """Where the training thread is, from its Python frames alone (a step without per-unit
    detail: the hooks are not installed, the recorder knows nothing), innermost first: the
    innermost frame working for a unit (`_unit_in`); at or inside it, the collective issued
    or waited on (a torch.distributed call, or a framework function known to do one:
    hookpoints.STACK_POINTS, e.g. FSDP2's `wait_for_unshard`, whose wait is a C++
    `Work.wait()` with no frame of its own) and whether the framework's own code runs there
    (the innermost frame past torch's generic layers is a stack point or one of its modules,
    `FRAMEWORK_MODULES`, rather than the model's or the user's code);
    the phase from a framework function that says it, else from a `backward` frame outside.
    Free on the hot path: read by the watchdog thread only once a stall is seen, or from a
    failure's traceback."""
    unit = coll = phase = framework = None
    backward = False
    for fr in reversed(frames):  # innermost first
        try:
            name = fr.f_code.co_name
            mod = str(fr.f_globals.get("__name__", ""))
            point = stack_point(fr)
            if unit is None:
                if coll is None and name in _DIST_CALLS and mod.startswith("torch.distributed"):
                    coll = _DIST_CALLS[name]
                if point is not None:
                    coll = coll or point[0] or None
                if framework is None and (point is not None or not mod.startswith("torch")
                                          or mod.startswith(FRAMEWORK_MODULES)):
                    # the innermost frame past torch's generic layers (nn, autograd,
                    # utils): the framework's code, or the model's / the user's
                    framework = point is not None or mod.startswith(FRAMEWORK_MODULES)
                unit = _unit_in(fr, objs)
            if point is not None and phase is None:
                phase = _point_phase(fr, point)
            if name in ("backward", "_engine_run_backward") and mod.startswith("torch"):
                backward = True
                break
        except Exception:  # noqa: BLE001 - a frame we cannot read
            continue
    if unit is None and coll is None and phase is None and not backward:
        return None  # nothing on the stack says where
    return {"unit": _unit_name(names, unit) if unit is not None else None,
            "collective": coll or "", "framework": bool(framework),
            "phase": phase or ("backward" if backward else "forward")}


def _chain(frame) -> list:
    out = []
    while frame is not None:
        out.append(frame)
        frame = frame.f_back
    return out[::-1]  # outermost first


class Watchdog:
    """One per monitor; `start()` launches the thread, `stop()` ends it."""

    def __init__(self, monitor, stall_after_s: float, *, poll_s: float | None = None,
                 clock=perf_counter, wall=time.time):
        self.m = monitor
        self.stall_after_s = float(stall_after_s)
        self.poll_s = poll_s if poll_s is not None else poll_interval(self.stall_after_s)
        self.clock, self.wall = clock, wall
        self.thread_id = threading.get_ident()  # attach() runs on the training thread
        self.current: dict | None = None  # the stall in progress (the exporter reads it)
        self.count = 0  # stalls detected since attach
        self._mark: tuple | None = None  # (progress clock, step) when the stall was seen
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- lifecycle ----------------------------------------------------------------------
    def start(self) -> "Watchdog":
        self._thread = threading.Thread(target=self._run, name="zerodoc-watchdog", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout=1.0)

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.check()
            except Exception as e:  # noqa: BLE001 - never into the job
                self.m.registry.error("watchdog", e)

    # --- detection ----------------------------------------------------------------------
    def _progress(self) -> tuple[float, float, int]:
        """(clock of the last bucket switch or step end, clock of the last step end, step)."""
        m = self.m
        step_end = m._step_start if m._step_start is not None else m._t_attach
        return max(m.rec.last, step_end), step_end, m.step_index

    def check(self) -> dict | None:
        """One look; returns the record written, if any."""
        if getattr(self.m, "_closed", False):
            return None
        progress, step_end, step = self._progress()
        now = self.clock()
        if self.current is not None:
            if (progress, step) != self._mark:
                return self._resumed(now, step)
            return None
        slowest = float(self.m.totals.max_step_seconds or 0.0)
        limit = max(self.stall_after_s, STEP_FACTOR * slowest)
        if now - progress < self.stall_after_s or now - step_end < limit:
            return None
        rec = self.stuck(now, progress, step, slowest)
        self._mark = (progress, step)
        self.current = rec
        self.count += 1
        self._write(rec)
        return rec

    def _unix(self, t: float, now: float) -> float:
        return round(self.wall() - (now - t), 3)

    def _position(self) -> dict:
        """Where the recorder says the training thread is (on a step without per-unit
        detail only whether it is in the optimizer: the phase is None outside it)."""
        rec, names = self.m.rec, self.m.unit_names
        stack = list(rec.stack)
        top = stack[-1] if stack else 0
        phase = PHASES[rec.phase] if 0 <= rec.phase < len(PHASES) else str(rec.phase)
        unit = None
        n_units = getattr(rec, "n_units", len(names))
        for b in reversed(stack):
            bu = bucket_unit(b, n_units)
            if bu is not None:
                unit = _unit_name(names, bu[0])
                break
        if top == B_OTHER and getattr(self.m, "_t_opt", None) is not None:
            top = B_OPTIMIZER  # a step without detail times its optimizer off the stack
            phase = PHASES[OPTIMIZER]
        elif top == B_OTHER and not getattr(self.m, "_detail_on", True):
            phase = None  # no hook keeps the phase between samples: the frames may say it
        bu = bucket_unit(top, n_units)
        where = {B_WAIT: "collective", B_FRAMEWORK: "framework",
                 B_OPTIMIZER: "optimizer"}.get(top, "outside units" if bu is None else
                                                 "framework" if bu[2] else "compute")
        return {"in": where, "unit": unit, "running_unit": unit, "phase": phase}

    def _gpu_collective(self) -> dict | None:
        """CUDA: the oldest collective the device has not finished (`CudaTimer._pending`, in
        issue order: no end event yet, or one that has not fired; event queries only)."""
        timer = getattr(self.m, "timer", None)
        for c in list(getattr(timer, "_pending", ()) or ()):
            try:
                if getattr(c, "seconds", None) is not None:
                    continue  # read back already
                end = getattr(c, "e1", None)
                ev = getattr(end, "ev", end)  # a devclock Mark, or a bare event
                if ev is None or not ev.query():
                    return {"unit": _unit_name(self.m.unit_names, c.unit),
                            "collective": COLLECTIVES[c.coll],
                            "phase": PHASES[c.phase] if 0 <= c.phase < 3 else str(c.phase)}
            except Exception:  # noqa: BLE001
                return None
        return None

    def _locate(self, frames_by_thread: dict, now: float) -> dict:
        pos = self._position()
        names = self.m.unit_names
        coll, lines = None, []
        ordered = [self.thread_id] + [t for t in frames_by_thread if t != self.thread_id]
        for tid in ordered:
            frame = frames_by_thread.get(tid)
            if frame is None:
                continue
            found, stack = _describe(_chain(frame), names)
            if tid == self.thread_id or (found and coll is None):
                lines = stack
            if found and coll is None:
                coll = found
        out = {**pos, "collective": "", "in_collective_s": None, "stack": lines}
        if coll is not None:
            out.update(collective=coll["collective"], unit=coll["unit"] or pos["unit"],
                       **{"in": "collective"})
            if coll["t0"] is not None:
                out["in_collective_s"] = round(max(0.0, now - coll["t0"]), 3)
        elif pos["unit"] is None and not getattr(self.m, "_detail_on", True):
            # A step without per-unit detail: the frames say where (module, param group)
            frame = frames_by_thread.get(self.thread_id)
            self._place_by_frames(out, _chain(frame) if frame is not None else [])
        if out["collective"] == "" and pos["in"] != "collective":
            gpu = self._gpu_collective()
            if gpu is not None:
                out.update(collective=gpu["collective"], unit=gpu["unit"], phase=gpu["phase"],
                           **{"in": "gpu collective"})
        return out

    def _place_by_frames(self, out: dict, frames: list) -> None:
        """A step without per-unit detail (no zerodoc wrapper on the stack, the recorder
        knows nothing): `out` placed from the frames alone (`_from_frames`: the unit's module,
        param group or handle, the phase, the collective, the framework's own code), where
        they show one."""
        objs = getattr(self, "_objs", None)
        if objs is None:
            objs = self._objs = unit_objects(getattr(self.m, "adapter", None))
        found = _from_frames(frames, objs, self.m.unit_names) if frames else None
        if found is not None:
            unit = found["unit"] or out.get("unit")
            out.update(unit=unit, running_unit=unit, phase=found["phase"],
                       collective=found["collective"],
                       **{"in": "collective" if found["collective"] else
                          "framework" if found["framework"] else
                          "compute" if found["unit"] else out.get("in")})

    def stuck(self, now: float, progress: float, step: int, slowest: float) -> dict:
        frames = {tid: f for tid, f in sys._current_frames().items()
                  if tid != threading.get_ident()}
        where = self._locate(frames, now)
        return {"type": "stall", "state": "stuck", "rank": self.m.rank, "step": step + 1,
                "since_unix": self._unix(progress, now), "detected_unix": round(self.wall(), 3),
                "stalled_s": round(now - progress, 3), **where,
                "threshold_s": self.stall_after_s, "slowest_step_s": round(slowest, 6)}

    def _resumed(self, now: float, step: int) -> dict:
        cur = self.current or {}
        rec = {"type": "stall", "state": "resumed", "rank": self.m.rank, "step": cur.get("step"),
               "since_unix": cur.get("since_unix"), "resumed_unix": round(self.wall(), 3),
               "stalled_s": round(self.wall() - float(cur.get("since_unix") or self.wall()), 3),
               "steps_done": step}
        self.current = None
        self._mark = None
        self._write(rec)
        return rec

    def failed(self, exc: BaseException) -> dict:
        """Where the rank was when `exc` ended its training (called from close())."""
        frames = []
        tb = exc.__traceback__
        while tb is not None:
            frames.append(tb.tb_frame)
            tb = tb.tb_next
        err = "".join(traceback.format_exception_only(type(exc), exc)).strip()[:500]
        return self._final("failed", frames, error=err)

    def signalled(self, signal_name: str, frame) -> dict:
        """Where the training thread was when a signal stopped the run (SIGTERM: the
        handler's `frame`, monitor.py `_terminated`): a "terminated" record."""
        return self._final("terminated", _chain(frame) if frame is not None else [],
                           signal=signal_name)

    def _final(self, state: str, frames: list, **what) -> dict:
        """The last record of a run that ended on `frames` (outermost first): "failed" or
        "terminated", placed as a stall is (`_locate`)."""
        now = self.clock()
        pos = self._position()
        found, lines = _describe(frames, self.m.unit_names)
        out = {"type": "stall", "state": state, "rank": self.m.rank,
               "step": self.m.step_index + 1, "since_unix": round(self.wall(), 3),
               **what, **pos, "collective": "", "stack": lines}
        if found is not None:
            out.update(collective=found["collective"], unit=found["unit"] or pos["unit"],
                       **{"in": "collective"})
            if found["t0"] is not None:
                out["since_unix"] = self._unix(found["t0"], now)
        elif pos["unit"] is None and not getattr(self.m, "_detail_on", True):
            # a step without per-unit detail (the default mode's usual step): the frames
            # say where, as a stall's do (`_locate`)
            self._place_by_frames(out, frames)
        self.current = None
        self._write(out)
        return out

    def _write(self, rec: dict) -> None:
        w = getattr(self.m, "_writer", None)
        if w is None:
            return
        try:
            w.write(rec)
        except Exception as e:  # noqa: BLE001
            self.m.registry.error("watchdog", e)


__all__ = ["Watchdog", "STEP_FACTOR", "poll_interval"]
