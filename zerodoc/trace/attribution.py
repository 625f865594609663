"""From one rank's trace events to per-step, per-unit, per-phase numbers.

Steps are the profiler's `ProfilerStep#N` spans (the whole trace, host and device, is one
step when there are none). Within a step:

- **Phase** of a moment: `optimizer` inside an `Optimizer.step#...` span; `backward` from
  the first backward marker of the step on (the end of FSDP2's root `FSDP::post_forward`, the
  first `autograd::engine::evaluate_function`, a `## backward ##` span); `forward` before.
  A collective's phase is the phase of its issue on the host.
- **Unit** of a collective: FSDP2 names it: the innermost `FSDP::<what> (<unit>)` span around
  the collective's host op on the same thread (no unit in the label: the root, "(root)").
  FSDP1's spans name no unit: the k-th all-gather of a step's forward is `unit-k` (FSDP1
  gathers its units in execution order, the root first); in backward, gathers and
  reduce-scatters go to the units of the same flat-parameter size in reverse order. Anything
  else (DDP, ZeRO-1, DeepSpeed, plain `torch.distributed`) is "(model)".
- **Collective time, bytes, exposure**:
  - GPU traces: each communication kernel (`^nccl.*Kernel`, HTA's rule) is one collective,
    every one of them, of the kind its metadata or name says (all_gather, reduce_scatter,
    all_reduce, broadcast, send_recv, all_to_all, ..., else "other"); time = the kernel's
    duration; bytes = its `record_param_comms` metadata (message elements x dtype size).
    Its step is the profiler step during which the kernel ran on the device (module
    "GPU steps" below); its phase and unit those of its launch on the host (none found: the
    device time). Exposed / hidden = the part of the kernel's share of the communication
    union (the part no earlier-starting communication kernel covered, clipped to its step)
    during which no / some compute kernel ran on the device: per step they add up to the
    union of communication kernels minus / intersected with the union of compute kernels,
    HolisticTraceAnalysis's measure.
  - CPU traces: each `c10d::<collective>` op is one collective, issued at the op's start,
    completed at the end of gloo's own run of it on its worker thread; bytes = the op's
    largest tensor argument (needs `record_shapes=True`). Exposed = the time the issuing
    thread was blocked on it: the thread runs no operator from the moment it is waiting
    (inside the collective's own call, or idle in a `wait()`) until the collective
    completes. A synchronous call claims its whole [issue, completion]; a collective that
    completes while the thread is blocked in another call is not waited on (exposed 0).
- **Compute** per unit and phase (FSDP2): the time between FSDP's pre- and post-hooks of the
  unit (`FSDP::pre_forward (u)` ... `FSDP::post_forward (u)`, `FSDP::pre_backward (u)` ...
  the unit's first `FSDP::post_backward_*`) minus nested units, FSDP's own work and blocked
  time: wall time on CPU (what the live shim's clock counts). Without unit spans: one unit
  "(model)" per phase (operator time on the loop's thread).
- **GPU steps**: device time is the union of kernel intervals over all streams (as HTA
  merges them), never a sum, clipped to the profiler step's span: the device work the step's
  wall time held (the device may run behind the host; work after the last step's span is
  outside every step). Each compute kernel is credited its share of the compute union
  (`timeline.credit`) and that share goes, by the kernel's launch on the host, to the
  optimizer (launched inside `Optimizer.step`), to FSDP's own work (launched in an FSDP2
  span outside the unit's compute), to the unit and phase it was launched from (FSDP2), or
  to "(model)" and the launch's phase. So per step compute + optimizer + framework = the
  compute union (HTA's compute time) <= the step, and exposed communication = the
  communication union minus the compute union. Memory copies and sets are neither (in
  "other", as HTA's non-compute time).
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from . import timeline as tl
from .events import STEP, CommOp, RankEvents

MODEL = "(model)"
ROOT = "(root)"
FRAMEWORK = "framework"  # the first item of a region label of FSDP's own work (`_regions`)
FSDP2 = re.compile(r"FSDP::(\w+)(?: \((.*?)\))?(?: \[pg=\d+\])?$")
FSDP1 = "FullyShardedDataParallel."
WAIT_SPANS = ("all_gather_copy_out", "post_backward_rs_wait")  # FSDP2 waits inside these
POST_BWD = ("post_backward_accumulate", "post_backward_reshard", "post_backward_rs_wait",
            "post_backward_reduce")


@dataclass
class Collective:
    step: int
    unit: str
    phase: str
    collective: str
    tid: int
    issue: float  # microseconds
    done: float
    nbytes: int
    numel: int | None
    dtype: str | None
    group_size: int | None
    exposed: float = 0.0
    hidden: float | None = None  # GPU: measured; None: the rest of the time


@dataclass
class StepNumbers:
    step: int
    ts: float
    end: float
    optimizer: float = 0.0
    framework: float = 0.0
    compute: dict = field(default_factory=lambda: defaultdict(float))  # (unit, phase) -> us
    # the part of `framework` inside FSDP2 spans that name their unit (the root's name none:
    # "(root)"), by (unit, phase): phase that of the moment (us)
    unit_framework: dict = field(default_factory=lambda: defaultdict(float))
    # GPU: unions of device intervals within the step's span (us), HTA's temporal breakdown
    device_busy: float = 0.0  # any kernel or memory op
    device_compute: float = 0.0  # compute kernels (= compute + optimizer + framework)
    device_comm: float = 0.0  # communication kernels
    device_exposed: float = 0.0  # communication while no compute kernel ran


@dataclass
class RankResult:
    """One rank's trace, attributed. Times in microseconds (converted by the snapshot)."""

    framework: str  # fsdp2 | fsdp1 | ddp | unknown
    device_type: str  # cpu | cuda
    steps: list[StepNumbers]
    collectives: list[Collective]
    unit_order: list[str]
    overlap_ratio: float | None  # GPU: comm time overlapped by compute / comm time (HTA's)
    comm_kernels: int = 0  # GPU: communication kernels in the trace
    comm_outside: int = 0  # GPU: of those, ran outside every profiler step (not counted)
    unlaunched: int = 0  # GPU: device operations left out, launched before the trace began


def _unit_of_label(label: str | None) -> str:
    return ROOT if not label else label


def detect_framework(ev: RankEvents) -> str:
    names = {s.name.split(" ")[0] for s in ev.spans}
    if any(n.startswith("FSDP::") for n in names):
        return "fsdp2"
    if any(n.startswith(FSDP1) for n in names):
        return "fsdp1"
    if any(n.startswith("DistributedDataParallel.") for n in names):
        return "ddp"
    return "unknown"


def _steps(ev: RankEvents) -> list[StepNumbers]:
    out = []
    for s in ev.spans:
        m = STEP.match(s.name)
        if m:
            out.append(StepNumbers(int(m.group(1)), s.ts, s.end))
    out.sort(key=lambda x: x.ts)
    if not out:  # no schedule: the whole trace is one step
        times = [s.ts for s in ev.spans] + [o.ts for o in ev.comm_ops]
        ends = [s.end for s in ev.spans] + [o.end for o in ev.comm_ops]
        for iv in ev.busy.values():
            if len(iv.starts):
                times.append(iv.starts[0])
                ends.append(max(iv.ends))
        # and the device's work (it may run after the host's last operator)
        for a, b in ((ev.kernel_ts, ev.kernel_end), (ev.mem_ts, ev.mem_end),
                     ([k.ts for k in ev.comm_kernels], [k.end for k in ev.comm_kernels])):
            if len(a):
                times.append(min(a))
                ends.append(max(b))
        if times:
            out.append(StepNumbers(0, min(times), max(ends)))
    return out


class _Phases:
    def __init__(self, ev: RankEvents, steps: list[StepNumbers], framework: str):
        self.starts = np.array([s.ts for s in steps])
        self.ends = np.array([s.end for s in steps])
        self.numbers = [s.step for s in steps]
        opt = [(s.ts, s.end) for s in ev.spans if s.name.startswith("Optimizer.step#")
               or s.name == "## optimizer ##"]
        self.optimizer = tl.merge([a for a, _ in opt], [b for _, b in opt])
        marks = list(ev.backward_starts)
        marks += [s.ts for s in ev.spans if s.name == "## backward ##"]
        if framework == "fsdp2":
            marks += [s.end for s in ev.spans if s.name == "FSDP::post_forward"]
        marks = np.sort(np.array(marks, dtype=float))
        self.backward_from = np.full(len(steps), np.inf)
        for i, st in enumerate(steps):
            k = np.searchsorted(marks, st.ts)
            if k < len(marks) and marks[k] < st.end:
                self.backward_from[i] = marks[k]

    def step_index(self, t: float) -> int | None:
        i = int(np.searchsorted(self.starts, t, side="right")) - 1
        if i < 0 or t >= self.ends[i]:
            return None
        return i

    def phase(self, i: int, t: float) -> str:
        s, e = self.optimizer
        k = int(np.searchsorted(s, t, side="right")) - 1
        if k >= 0 and t < e[k]:
            return "optimizer"
        return "backward" if t >= self.backward_from[i] else "forward"


class _Units:
    """Unit of a collective: innermost FSDP2 span on the issuing thread; FSDP1 by order."""

    def __init__(self, ev: RankEvents, framework: str, seg: dict | None = None):
        self.framework = framework
        self.seg: dict[int, tuple] = {} if seg is None else seg
        if framework == "fsdp2" and seg is None:
            per_tid = defaultdict(list)
            for s in ev.spans:
                m = FSDP2.match(s.name)
                if m and m.group(1) in ("all_gather", "post_backward_reduce",
                                        "all_gather_copy_out", "pre_forward", "pre_backward"):
                    per_tid[s.tid].append((s.ts, s.end, _unit_of_label(m.group(2))))
            for tid, ivs in per_tid.items():
                a, b, lab = tl.segments(ivs)
                self.seg[tid] = (np.array(a), np.array(b), lab)
        # FSDP1, per step: units in the order of their forward all-gathers, per size
        self.fwd: dict[int, list[tuple[int, str]]] = defaultdict(list)  # step -> (numel, name)
        self.taken: dict[tuple, int] = defaultdict(int)  # (step, coll, numel) -> used

    def unit(self, step: int, tid: int, t: float, coll: str, numel: int | None,
             phase: str) -> str:
        if self.framework == "fsdp2":
            seg = self.seg.get(tid)
            if seg is not None:
                k = int(np.searchsorted(seg[0], t, side="right")) - 1
                if k >= 0 and t < seg[1][k]:
                    return seg[2][k]
            return MODEL
        if self.framework == "fsdp1" and numel and coll in ("all_gather", "reduce_scatter"):
            return self._fsdp1(step, coll, numel, phase)
        return MODEL

    def _fsdp1(self, step: int, coll: str, numel: int, phase: str) -> str:
        """FSDP1 names no unit. In forward, FSDP1 gathers its units in execution order, the
        root first: the k-th forward all-gather of a step is `unit-k`. In backward it gathers
        and reduces them in reverse order: among the units of the same size, the next one
        from the back."""
        order = self.fwd[step]
        if coll == "all_gather" and phase == "forward":
            name = f"unit-{len(order)}"
            order.append((numel, name))
            return name
        same = [name for n, name in order if n == numel][::-1]
        i = self.taken[(step, coll, numel)]
        self.taken[(step, coll, numel)] += 1
        return same[i] if i < len(same) else MODEL


def _host_ops(ev: RankEvents) -> list[tuple[CommOp, float]]:
    """CPU traces: (c10d op, completion) pairs. Completion = the end of gloo's own run of the
    collective on its worker thread, up to its last operator (the copy into the output):
    after that gloo marks the work done and runs the completion callbacks inside the same
    range (Python ones wait for the GIL), which is not the collective's time."""
    issued = sorted((o for o in ev.comm_ops if o.kind == "c10d"), key=lambda o: o.ts)
    runs = sorted((o for o in ev.comm_ops if o.kind == "gloo"), key=lambda o: o.ts)
    fits = {"reduce_scatter": ("reduce_scatter", "all_reduce"), "barrier": ("barrier",
            "all_reduce")}
    worker = {}
    for tid in {r.tid for r in runs}:
        iv = ev.busy.get(tid)
        worker[tid] = tl.merge(iv.starts, iv.ends) if iv is not None else tl.EMPTY
    used = [False] * len(runs)
    j = 0
    out = []
    for op in issued:
        while j < len(runs) and used[j]:
            j += 1
        done = op.end
        for k in range(j, min(len(runs), j + 16)):
            r = runs[k]
            if not used[k] and r.ts >= op.ts - 1.0 and \
                    r.collective in fits.get(op.collective, (op.collective,)):
                used[k] = True
                ws, we = worker[r.tid]
                i = int(np.searchsorted(ws, r.end, side="left")) - 1  # last op starting inside
                last = we[i] if i >= 0 and ws[i] >= r.ts else r.end
                done = max(min(last, r.end), op.end)
                if op.itemsize is None and r.itemsize is not None:  # TensorList arguments
                    op.dtype, op.itemsize = r.dtype, r.itemsize
                break
        out.append((op, done))
    return out


def _wait_spans(ev: RankEvents) -> dict[int, tuple]:
    """Per thread, FSDP2's spans that hold a wait() on an earlier collective (as sets)."""
    per_tid = defaultdict(lambda: ([], []))
    for s in ev.spans:
        m = FSDP2.match(s.name)
        if m and m.group(1) in WAIT_SPANS:
            per_tid[s.tid][0].append(s.ts)
            per_tid[s.tid][1].append(s.end)
    return {tid: (np.array(a), np.array(b)) for tid, (a, b) in per_tid.items()}


def _cpu_exposure(colls: list[Collective], ev: RankEvents, blocked_ops) -> None:
    """Exposed time of CPU collectives from the issuing thread's timeline (module doc)."""
    waits = _wait_spans(ev)
    by_tid = defaultdict(list)
    for c in colls:
        by_tid[c.tid].append(c)
    for tid, cs in by_tid.items():
        iv = ev.busy.get(tid)
        busy = tl.merge(iv.starts, iv.ends) if iv is not None else tl.EMPTY
        ops = blocked_ops.get(tid, tl.EMPTY)
        busy = tl.subtract(busy, ops)  # inside a collective's own call the thread is blocked
        bs, be = busy
        ws, we = waits.get(tid, tl.EMPTY)
        # idle stretch around each completion: (end of the last operator before it, ...)
        stretch: dict[int, list[Collective]] = defaultdict(list)
        for c in cs:
            k = int(np.searchsorted(bs, c.done, side="right")) - 1
            if k >= 0 and c.done < be[k]:
                continue  # the thread was running an operator: nobody waited
            stretch[k].append(c)
        for k, group in stretch.items():
            start = be[k] if k >= 0 else -np.inf
            waited, sync = [], []
            for c in group:
                # a framework wait span around the completion, opened after the issue: the
                # thread waited from there (an async collective, waited on later)
                j = int(np.searchsorted(ws, c.done, side="right")) - 1
                floor = ws[j] if j >= 0 and c.done < we[j] else -np.inf
                if floor > c.issue:
                    waited.append((c, floor))
                elif c.issue >= start:
                    sync.append(c)  # issued and waited in one stretch: a blocking call
                else:
                    waited.append((c, -np.inf))
            claims = tl.merge([c.issue for c in sync], [c.done for c in sync])
            for c in sync:
                c.exposed = c.done - c.issue
            p = start
            for c, floor in sorted(waited, key=lambda x: x[0].done):
                a = max(c.issue, p, floor)
                if c.done > a:
                    win = (np.array([a]), np.array([c.done]))
                    c.exposed = tl.length(win) - tl.intersect_length(win, claims)
                p = max(p, c.done)


def _windows(steps) -> tuple[np.ndarray, np.ndarray]:
    return np.array([s.ts for s in steps], dtype=float), np.array([s.end for s in steps],
                                                                  dtype=float)


def _launches(ev: RankEvents):
    """Sorted launch correlations and the permutation into the launch arrays."""
    lc = np.asarray(ev.launch_corr)
    order = np.argsort(lc, kind="stable")
    return lc[order], order


def _gpu_collectives(ev: RankEvents, steps, add) -> tuple[float | None, int]:
    """GPU traces: one collective per communication kernel (module docstring). Returns the
    overall overlap (HTA's comm-comp overlap) and how many kernels ran outside every step."""
    compute = tl.merge(ev.kernel_ts, ev.kernel_end)
    by_ext = {o.ext_id: o for o in ev.comm_ops if o.kind == "rpc" and o.ext_id is not None}
    lc, order = _launches(ev)
    ks = sorted(ev.comm_kernels, key=lambda k: k.ts)
    starts = np.array([k.ts for k in ks], dtype=float)
    ends = np.array([k.end for k in ks], dtype=float)
    ws, we = _windows(steps)
    ca, cb = tl.credit(starts, ends)
    step = np.searchsorted(we, starts, side="right")  # the first step ending after the start
    inside = step < len(ws)
    inside[inside] = ws[step[inside]] < ends[inside]
    stp = np.clip(step, 0, max(len(ws) - 1, 0))
    pa = np.maximum(ca, ws[stp]) if len(ws) else ca
    pb = np.maximum(np.minimum(cb, we[stp]), pa) if len(ws) else cb
    hidden = tl.overlap_each(pa, pb, compute) if len(ks) else np.zeros(0)
    for j, k in enumerate(ks):
        if not inside[j]:
            continue
        op = by_ext.get(k.ext_id)
        tid, host = -1, None
        if op is not None:
            tid, host = op.tid, op.ts
        elif k.correlation is not None and len(lc):
            i = int(np.searchsorted(lc, k.correlation))
            if i < len(lc) and lc[i] == k.correlation:
                tid, host = int(ev.launch_tid[order[i]]), float(ev.launch_ts[order[i]])
        coll = k.collective
        if coll == "other" and op is not None:
            coll = op.collective
        pick = (lambda a, b: a if a is not None else b)
        hid = float(hidden[j])
        add(tid, host, k.ts, k.end, coll, pick(k.numel, op.numel if op else None),
            pick(k.dtype, op.dtype if op else None), pick(k.itemsize, op.itemsize if op else None),
            pick(k.group_size, op.group_size if op else None),
            max(0.0, float(pb[j] - pa[j]) - hid), hid, step_index=int(step[j]))
    comm = tl.merge(starts, ends)
    total = tl.length(comm)
    overlap = tl.intersect_length(comm, compute) / total if total > 0 else None
    return overlap, int(len(ks) - np.count_nonzero(inside))


def _device_steps(ev: RankEvents, steps) -> None:
    """Per step, the unions of device intervals within its span (HTA's temporal breakdown)."""
    ws, we = _windows(steps)
    compute = tl.merge(ev.kernel_ts, ev.kernel_end)
    comm = tl.merge([k.ts for k in ev.comm_kernels], [k.end for k in ev.comm_kernels])
    busy = tl.merge(np.concatenate([compute[0], comm[0], np.asarray(ev.mem_ts)]),
                    np.concatenate([compute[1], comm[1], np.asarray(ev.mem_end)]))
    parts = {"device_busy": busy, "device_compute": compute, "device_comm": comm,
             "device_exposed": tl.subtract(comm, compute)}
    for name, a in parts.items():
        for st, v in zip(steps, tl.overlap_each(ws, we, a)):
            setattr(st, name, float(v))


def _region_codes(ev: RankEvents, framework: str) -> tuple[list, list]:
    """The compute regions (`_regions`) as disjoint segments per thread, each with the index
    of its label: (labels, [(thread, starts, ends, label indexes)])."""
    labels: list = ["optimizer", "framework", (MODEL, "forward"), (MODEL, "backward")]
    index = {lab: i for i, lab in enumerate(labels)}
    out = []
    for tid, ivs in _regions(ev, framework).items():
        a, b, labs = tl.segments(ivs)
        if not a:
            continue
        for lab in labs:
            if lab not in index:
                index[lab] = len(labels)
                labels.append(lab)
        out.append((tid, np.array(a), np.array(b), np.array([index[lab] for lab in labs])))
    return labels, out


def _gpu_compute(ev: RankEvents, steps, phases: "_Phases", framework: str,
                 regions: tuple | None = None) -> None:
    """GPU: each compute kernel's share of the compute union, per step, to the optimizer,
    FSDP's own work, its unit and phase, or "(model)" (module docstring: GPU steps).
    `regions`: `_region_codes(ev, framework)`, when already computed."""
    _device_steps(ev, steps)
    for st in steps:
        st.optimizer = st.framework = 0.0
        st.unit_framework.clear()
    kt = np.asarray(ev.kernel_ts, dtype=float)
    if not len(kt) or not steps:
        return
    ws, we = _windows(steps)
    k_tid, k_host, _dur = _kernel_hosts(ev)
    # the moment that says the phase: the launch, else the kernel's own start on the device
    hs = np.searchsorted(phases.starts, k_host, side="right") - 1
    host_ok = np.isfinite(k_host) & (hs >= 0)
    host_ok[host_ok] = k_host[host_ok] < phases.ends[hs[host_ok]]
    ds = np.clip(np.searchsorted(ws, kt, side="right") - 1, 0, len(ws) - 1)
    ref_t = np.where(host_ok, k_host, kt)
    ref_i = np.where(host_ok, hs, ds)
    backward = ref_t >= phases.backward_from[ref_i]
    codes = np.where(backward, 3, 2)
    labels, segs = regions if regions is not None else _region_codes(ev, framework)
    for tid, a, b, lab_codes in segs:
        sel = np.flatnonzero(host_ok & (k_tid == tid))
        k = np.searchsorted(a, k_host[sel], side="right") - 1
        hit = (k >= 0) & (k_host[sel] < b[np.clip(k, 0, None)])
        codes[sel[hit]] = lab_codes[k[hit]]
    codes[host_ok & tl.contains(phases.optimizer, k_host)] = 0
    ca, cb = tl.credit(kt, np.asarray(ev.kernel_end, dtype=float))
    pi, wi, ln = tl.split(ca, cb, ws, we)
    n = len(labels)
    # per step, label and phase (a unit's framework time goes to the phase of its kernels)
    sums = np.bincount((wi * n + codes[pi]) * 2 + backward[pi], weights=ln,
                       minlength=len(steps) * n * 2)
    for flat in np.flatnonzero(sums > 0):
        ic, bwd = divmod(int(flat), 2)
        i, c = divmod(ic, n)
        v = float(sums[flat])
        lab = labels[c]
        if c == 0:
            steps[i].optimizer += v
        elif c == 1:
            steps[i].framework += v
        elif _is_framework(lab):
            steps[i].framework += v
            steps[i].unit_framework[(lab[1], "backward" if bwd else "forward")] += v
        else:
            steps[i].compute[lab] += v


class HostSide:
    """What `attribute` derives from a rank's host side alone (annotations, backward marks):
    framework, steps, phases, FSDP2 unit segments, compute regions. Built once when a rank is
    attributed in slices that share one host side and differ in device work (nsys.py), so
    that each slice costs its own size; its steps must come from `ProfilerStep#N` spans."""

    def __init__(self, ev: RankEvents):
        self.framework = detect_framework(ev)
        self.steps = _steps(ev)
        self.phases = _Phases(ev, self.steps, self.framework)
        self.unit_seg = _Units(ev, self.framework).seg
        self.regions = _region_codes(ev, self.framework)


def attribute(ev: RankEvents, group_size: int | None = None,
              host: HostSide | None = None) -> RankResult:
    """Attribute one rank's events (see the module docstring). `group_size`: ranks of the
    default process group, for collectives whose recorded shapes are one rank's input.
    `host`: the host side's derived structures, when already built for `ev`'s host side."""
    ev.finish()
    ev.drop_unlaunched()
    if host is None:
        framework = detect_framework(ev)
        steps = _steps(ev)
        phases = _Phases(ev, steps, framework)
        units = _Units(ev, framework)
    else:
        framework, phases = host.framework, host.phases
        steps = [StepNumbers(s.step, s.ts, s.end) for s in host.steps]
        units = _Units(ev, framework, host.unit_seg)
    gpu = ev.is_gpu
    colls: list[Collective] = []

    def add(tid, host, issue, done, coll, numel, dtype, itemsize, group, exposed=0.0,
            hidden=None, step_index=None):
        i = phases.step_index(host) if step_index is None else step_index
        if i is None or (coll == "barrier" and not gpu):
            return
        j = phases.step_index(host) if host is not None else None
        phase = phases.phase(j, host) if j is not None else phases.phase(i, issue)
        unit = units.unit(phases.numbers[i], tid, host, coll, numel, phase) \
            if host is not None else MODEL
        colls.append(Collective(phases.numbers[i], unit, phase, coll, tid, issue, done,
                                (numel or 0) * (itemsize or 0), numel, dtype, group, exposed,
                                hidden))

    overlap = None
    outside = 0
    if gpu:
        overlap, outside = _gpu_collectives(ev, steps, add)
    else:
        ops: dict[int, tuple[list, list]] = defaultdict(lambda: ([], []))
        for op, done in _host_ops(ev):
            ops[op.tid][0].append(op.ts)
            ops[op.tid][1].append(op.end)
            numel = op.numel
            if op.per_rank and numel:
                numel = numel * (group_size or 1) if group_size else None
            add(op.tid, op.ts, op.ts, done, op.collective, numel, op.dtype, op.itemsize,
                op.group_size or (group_size if op.per_rank else None))
        _cpu_exposure(colls, ev, {tid: tl.merge(a, b) for tid, (a, b) in ops.items()})
    if gpu:
        _gpu_compute(ev, steps, phases, framework, host.regions if host else None)
    else:
        _compute(ev, steps, phases, framework, colls)
    order: list[str] = []
    for c in sorted(colls, key=lambda c: (c.collective != "all_gather", c.issue)):
        if c.unit not in order:
            order.append(c.unit)
    return RankResult(framework, "cuda" if gpu else "cpu", steps, colls, order, overlap,
                      len(ev.comm_kernels), outside, ev.unlaunched)


def _framework_label(unit: str) -> tuple:
    """The label of FSDP's own work for `unit` (FSDP2's span names it)."""
    return (FRAMEWORK, unit, None)


def _is_framework(lab) -> bool:
    return isinstance(lab, tuple) and len(lab) == 3 and lab[0] == FRAMEWORK


def _regions(ev: RankEvents, framework: str) -> dict[int, list]:
    """Per thread: nested labelled intervals for the compute segmentation (FSDP2): FSDP's own
    spans labelled as its work for the unit they name (`_framework_label`), a unit's compute
    between its pre- and post-hooks labelled (unit, phase)."""
    per_tid: dict[int, list] = defaultdict(list)
    if framework != "fsdp2":
        return per_tid
    by = defaultdict(list)  # (tid, unit) -> [(kind, span)]
    for s in ev.spans:
        m = FSDP2.match(s.name)
        if m:
            unit = _unit_of_label(m.group(2))
            by[(s.tid, unit)].append((m.group(1), s))
            per_tid[s.tid].append((s.ts, s.end, _framework_label(unit)))
    for (tid, unit), items in by.items():
        items.sort(key=lambda x: x[1].ts)
        fw = _framework_label(unit)
        for i, (kind, s) in enumerate(items):
            if kind == "pre_forward":
                post = next((p for k, p in items[i + 1:] if k == "post_forward"), None)
                if post is not None:
                    per_tid[tid].append((s.ts, post.end, fw))
                    per_tid[tid].append((s.end, post.ts, (unit, "forward")))
            elif kind == "pre_backward":
                posts = []
                for k, p in items[i + 1:]:
                    if k == "pre_backward":
                        break
                    if k in POST_BWD:
                        posts.append(p)
                if posts:
                    per_tid[tid].append((s.ts, max(p.end for p in posts), fw))
                    per_tid[tid].append((s.end, posts[0].ts, (unit, "backward")))
    return per_tid


def _kernel_hosts(ev: RankEvents):
    """GPU compute kernels: (launching thread, host launch time, duration) arrays."""
    kt = np.asarray(ev.kernel_ts)
    dur = np.asarray(ev.kernel_end) - kt
    corr = np.asarray(ev.kernel_corr)
    k_tid = np.full(len(kt), -1, dtype=np.int64)
    k_host = np.full(len(kt), np.nan)
    if len(ev.launch_corr) and len(kt):
        lc = np.asarray(ev.launch_corr)
        order = np.argsort(lc, kind="stable")
        lc = lc[order]
        pos = np.clip(np.searchsorted(lc, corr), 0, len(lc) - 1)
        found = lc[pos] == corr
        k_tid[found] = np.asarray(ev.launch_tid)[order][pos[found]]
        k_host[found] = np.asarray(ev.launch_ts)[order][pos[found]]
    return k_tid, k_host, dur


def main_thread(ev: RankEvents) -> int | None:
    """The training loop's thread: where the ProfilerStep spans are (else the busiest)."""
    for s in ev.spans:
        if STEP.match(s.name):
            return s.tid
    return max(ev.busy, key=lambda t: len(ev.busy[t])) if ev.busy else None


def _compute(ev: RankEvents, steps, phases: _Phases, framework: str, colls) -> None:
    """CPU: fill each step's compute (per unit and phase), framework and optimizer time."""
    for st in steps:
        st.optimizer = tl.intersect_length(phases.optimizer, (np.array([st.ts]),
                                                              np.array([st.end])))
    blocked = defaultdict(lambda: ([], []))
    for c in colls:
        if c.exposed > 0:
            blocked[c.tid][0].append(c.done - c.exposed)
            blocked[c.tid][1].append(c.done)
    regions = _regions(ev, framework)
    if not regions:
        _model_compute(ev, steps, phases)
        return
    for tid, ivs in regions.items():
        a, b, labs = tl.segments(ivs)
        blk = tl.merge(*blocked[tid]) if tid in blocked else tl.EMPTY
        for lo, hi, lab in zip(a, b, labs):
            i = phases.step_index(lo)
            if i is None:
                continue
            seg = (np.array([lo]), np.array([hi]))
            secs = (hi - lo) - tl.intersect_length(seg, blk)
            if _is_framework(lab):
                steps[i].framework += secs
                steps[i].unit_framework[(lab[1], phases.phase(i, lo))] += secs
            else:
                steps[i].compute[lab] += secs


def _model_compute(ev: RankEvents, steps, phases: _Phases) -> None:
    """CPU, no unit spans: operator time on the loop's thread of each step, split by phase,
    all booked on one unit "(model)"."""
    tid = main_thread(ev)
    iv = ev.busy.get(tid) if tid is not None else None
    busy = tl.merge(iv.starts, iv.ends) if iv is not None else tl.EMPTY
    for i, st in enumerate(steps):
        cut = min(max(phases.backward_from[i], st.ts), st.end)
        for lo, hi, ph in ((st.ts, cut, "forward"), (cut, st.end, "backward")):
            if hi <= lo:
                continue
            piece = tl.subtract((np.array([lo]), np.array([hi])), phases.optimizer)
            secs = tl.intersect_length(piece, busy)
            if secs > 0:
                st.compute[(MODEL, ph)] += secs
