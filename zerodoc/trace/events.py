"""What zerodoc keeps of a profiler trace: the event model, filled one event at a time.

`RankEvents.add(event)` is called for every event of one rank's trace (see `stream.py`) and
keeps only what the attribution needs, compactly, so memory grows with the number of
collectives and annotations, not with the trace:

- `Span`s for the user annotations that carry structure: `ProfilerStep#N`, FSDP2's
  `FSDP::<what> (<unit>)`, FSDP1's `FullyShardedDataParallel.*`, `Optimizer.step#...`,
  `DistributedDataParallel.*`, and phase markers named like `## forward ##`;
- `CommOp`s: the host side of collectives (`c10d::<collective>` ops and `record_param_comms`
  with their shapes/metadata, gloo's `gloo:<collective>` runs on its worker threads);
- `Kernel`s for communication kernels on GPU traces;
- plain number arrays for everything else: per thread, the intervals when an operator ran
  (merged on the fly: nested operators cost nothing); compute-kernel intervals and launch
  correlations; memory-operation intervals; the starts of autograd's backward functions
  (where backward begins).

Device operations are classified by name exactly as HolisticTraceAnalysis does
(`hta.utils.utils.get_kernel_type`), so that device time per category is the same set of
intervals HTA merges: communication = `^nccl.*Kernel`; memory = `gpu_memcpy` / `gpu_memset`
events and kernels named `Memcpy*` / `Memset*` / `dma*`; compute = every other kernel except
those named `...Memcpy...`, `Memset...` or `...Sync` (HTA counts those as neither).

Device operations whose launch the trace does not hold are left out, as HTA's
`Trace._filter_irrelevant_gpu_kernels` leaves them out: the profiler starts recording the host
and the device at one moment, but the device may still be running work the host queued before
it (the previous, unprofiled step's kernels, up to tens of milliseconds of them). Those kernels
have no launch, so no thread, phase or unit, and they are not the traced steps' work: counted,
they are credited to the first step (HTA's `trace_diff/test` trace: 546 kernels in the first
39 ms of step 1009, 6.5 % more compute than HTA). `RankEvents.drop_unlaunched()` does it once
every event is read; a trace that records no host runtime call (a device-only capture) keeps
every operation.

Traces of PyTorch 1.8-1.9 name the categories otherwise (`Operator`, `Runtime`, `Kernel`,
`Memcpy`, `Memset`; step markers are `Operator`s): they are read as today's (`LEGACY_CATS`).
"""

from __future__ import annotations

import math
import re
from array import array
from dataclasses import dataclass, field

import numpy as np

MAX_KEPT = 2_000_000  # objects kept per trace (about 200 B each): bounded memory
STEP = re.compile(r"ProfilerStep#(\d+)$")
ANNOTATION_PREFIXES = ("ProfilerStep#", "FSDP::", "FullyShardedDataParallel.", "Optimizer.step#",
                       "DistributedDataParallel.", "DeepSpeed", "## ")
BACKWARD_FN = "autograd::engine::evaluate_function"
# Operators that only wrap Python (hooks, autograd.Function backwards): a thread inside one of
# them is not computing unless a child operator runs (a wait() in a hook happens there).
PY_WRAPPER = re.compile(r"autograd::engine::evaluate_function.*|torch::autograd::AccumulateGrad|"
                        r"PythonSubclass|\w*[A-Za-z]Backward")

# c10d op (without "c10d::" and trailing "_") -> collective, as zerodoc names them.
C10D = {
    "_allgather_base": "all_gather", "allgather": "all_gather",
    "allgather_into_tensor_coalesced": "all_gather", "allgather_coalesced": "all_gather",
    "_reduce_scatter_base": "reduce_scatter", "reduce_scatter": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "allreduce": "all_reduce", "allreduce_coalesced": "all_reduce",
    "broadcast": "broadcast",
    # DeepSpeed ZeRO-1/2 reduce each gradient bucket to its owner rank: the per-owner reduces of
    # a bucket are its reduce-scatter (the live DeepSpeed adapter books them the same way).
    "reduce": "reduce_scatter",
    "barrier": "barrier",
}
# gloo:<name> / nccl:<name> / record_param_comms "Collective name" -> collective.
NAMED = {
    "all_gather": "all_gather", "allgather": "all_gather", "_allgather_base": "all_gather",
    "all_gather_into_tensor": "all_gather", "allgather_into_tensor_coalesced": "all_gather",
    "_all_gather_base": "all_gather", "all_gather_base": "all_gather",
    "reduce_scatter": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter", "reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "all_reduce": "all_reduce", "allreduce": "all_reduce", "allreduce_coalesced": "all_reduce",
    "broadcast": "broadcast", "reduce": "reduce_scatter", "barrier": "barrier",
}
# Kinds of NCCL kernels that are no collective zerodoc's live path books (trace-only): kernel
# metadata "Collective name" / record_param_comms -> kind.
KERNEL_NAMED = {
    **NAMED,
    "send": "send_recv", "recv": "send_recv", "_send": "send_recv", "_recv": "send_recv",
    "sendrecv": "send_recv", "recv_any_source": "send_recv", "batch_isend_irecv": "send_recv",
    "all_to_all": "all_to_all", "alltoall": "all_to_all", "alltoall_base": "all_to_all",
    "all_to_all_single": "all_to_all", "alltoallv": "all_to_all",
    "gather": "gather", "scatter": "scatter",
}
# NCCL kernel name -> kind: `ncclKernel_<Coll>_...`, `ncclDevKernel_<Coll>_...`,
# `ncclSymkDevKernel_<Coll>_...`; `Generic` and unknown names say no kind (metadata or "other").
COMM_KERNEL = re.compile(r"nccl.*Kernel")  # HTA's is_comm_kernel (matched at the start)
KERNEL_KIND = re.compile(r"nccl\w*?Kernel_([A-Za-z]+)")
KERNEL_NAME_KINDS = {
    "allgather": "all_gather", "reducescatter": "reduce_scatter", "allreduce": "all_reduce",
    "broadcast": "broadcast", "reduce": "reduce_scatter", "sendrecv": "send_recv",
    "send": "send_recv", "recv": "send_recv", "alltoall": "all_to_all",
    "alltoallv": "all_to_all",
}
# HTA's non-compute kernels (`hta.utils.utils.is_compute_kernel`), matched at the start.
NOT_COMPUTE = re.compile(r"(nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")
MEMORY_OPS = ("gpu_memcpy", "gpu_memset")
# Host-side calls that carry the correlation of the device operation they enqueue (launches,
# async copies / sets): `cuda_runtime`, `cuda_driver` (and other backends' `*_runtime`).
HOST_CALLS = ("_runtime", "_driver")
# The categories of PyTorch 1.8-1.9's traces (Kineto's TensorBoard plugin samples) -> today's:
# then a `record_function` range (ProfilerStep#N, ...) was an `Operator` too.
LEGACY_CATS = {"Operator": "cpu_op", "Runtime": "cuda_runtime", "Driver": "cuda_driver",
               "Kernel": "kernel", "Memcpy": "gpu_memcpy", "Memset": "gpu_memset"}


def kernel_kind(name: str, collective_name=None) -> str:
    """The kind of a communication kernel: its `Collective name` metadata, else its name,
    else "other" (a kernel is never dropped for want of a kind)."""
    kind = KERNEL_NAMED.get(str(collective_name or "").strip().lower())
    if kind is None:
        m = KERNEL_KIND.match(name)
        kind = KERNEL_NAME_KINDS.get(m.group(1).lower()) if m else None
    return kind or "other"


# dtype names in traces ("float" in shapes, "Float"/"BFloat16" in NCCL metadata) -> (name, bytes)
DTYPES = {
    "float": ("float32", 4), "float32": ("float32", 4), "double": ("float64", 8),
    "float64": ("float64", 8), "half": ("float16", 2), "float16": ("float16", 2),
    "c10::half": ("float16", 2), "bfloat16": ("bfloat16", 2), "c10::bfloat16": ("bfloat16", 2),
    "int": ("int32", 4), "int32": ("int32", 4), "long": ("int64", 8), "int64": ("int64", 8),
    "long int": ("int64", 8), "signed char": ("int8", 1), "char": ("int8", 1), "int8": ("int8", 1),
    "unsigned char": ("uint8", 1), "uint8": ("uint8", 1), "byte": ("uint8", 1),
    "bool": ("bool", 1), "short": ("int16", 2), "int16": ("int16", 2),
    "c10::float8_e4m3fn": ("float8_e4m3fn", 1), "float8_e4m3fn": ("float8_e4m3fn", 1),
    "c10::float8_e5m2": ("float8_e5m2", 1), "float8_e5m2": ("float8_e5m2", 1),
}


def dtype_info(name: str | None) -> tuple[str, int] | None:
    if not name:
        return None
    return DTYPES.get(str(name).strip().lower())


@dataclass(slots=True)
class Span:
    """An annotation (user_annotation) on one thread."""

    name: str
    tid: int
    ts: float  # microseconds, as in the trace
    end: float


@dataclass(slots=True)
class CommOp:
    """The host side of one collective (or its run on gloo's worker thread)."""

    kind: str  # "c10d" | "rpc" (record_param_comms) | "gloo" | "nccl" (the async range)
    collective: str  # all_gather | reduce_scatter | all_reduce | broadcast | barrier
    tid: int
    ts: float
    end: float
    ext_id: int | None
    numel: int | None  # largest tensor of the call, elements
    dtype: str | None  # "float32", ...
    itemsize: int | None
    group_size: int | None = None
    per_rank: bool = False  # shapes give one rank's input only (list-form all-gather)


@dataclass(slots=True)
class Kernel:
    """A communication kernel on a GPU stream."""

    name: str
    stream: int
    ts: float
    end: float
    ext_id: int | None
    correlation: int | None
    collective: str  # kernel_kind(): all_gather ... send_recv, all_to_all, other
    numel: int | None
    dtype: str | None
    itemsize: int | None
    group_size: int | None


class _Intervals:
    """Intervals appended in (mostly) start order; overlapping neighbours merged on the fly."""

    __slots__ = ("starts", "ends", "_a", "_b")

    def __init__(self):
        self.starts = array("d")
        self.ends = array("d")
        self._a = self._b = None

    def add(self, a: float, b: float) -> None:
        if self._a is not None:
            if self._a <= a <= self._b:
                if b > self._b:
                    self._b = b
                return
            self.starts.append(self._a)
            self.ends.append(self._b)
        self._a, self._b = a, b

    def flush(self) -> None:
        if self._a is not None:
            self.starts.append(self._a)
            self.ends.append(self._b)
            self._a = self._b = None

    def __len__(self) -> int:
        return len(self.starts) + (self._a is not None)


def _elems(d) -> int:
    """Elements of one shapes entry: a tensor's dims, or nested lists of them (TensorList)."""
    if not isinstance(d, list) or not d:
        return 0  # a scalar argument
    if all(isinstance(x, int) for x in d):
        n = 1
        for x in d:
            n *= x
        return n
    return sum(_elems(x) for x in d)


def _numel(dims) -> int | None:
    """Elements of the largest tensor (or tensor list) among an op's arguments."""
    if not isinstance(dims, list):
        return None
    return max((_elems(d) for d in dims), default=0) or None


def _shape_dtype(args: dict) -> tuple[str | None, int | None]:
    for t in args.get("Input type") or ():
        info = dtype_info(t)
        if info:
            return info
    return None, None


def _int(v) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


@dataclass
class RankEvents:
    """Everything kept of one rank's trace (see the module docstring)."""

    spans: list[Span] = field(default_factory=list)
    comm_ops: list[CommOp] = field(default_factory=list)
    comm_kernels: list[Kernel] = field(default_factory=list)
    busy: dict[int, _Intervals] = field(default_factory=dict)  # tid -> operator intervals
    backward_starts: array = field(default_factory=lambda: array("d"))
    kernel_ts: array = field(default_factory=lambda: array("d"))  # compute kernels
    kernel_end: array = field(default_factory=lambda: array("d"))
    kernel_corr: array = field(default_factory=lambda: array("q"))
    mem_ts: array = field(default_factory=lambda: array("d"))  # memory ops, other kernels
    mem_end: array = field(default_factory=lambda: array("d"))
    mem_corr: array = field(default_factory=lambda: array("q"))
    host_corr: array = field(default_factory=lambda: array("q"))  # every host runtime call
    launch_corr: array = field(default_factory=lambda: array("q"))  # cuda runtime launches
    launch_tid: array = field(default_factory=lambda: array("q"))
    launch_ts: array = field(default_factory=lambda: array("d"))
    pid: int | None = None
    events: int = 0
    cpu_ops: int = 0
    bad_times: int = 0  # events skipped: NaN, infinite or negative ts / dur
    unlaunched: int = 0  # device operations left out: their launch is not in the trace

    def _check_size(self) -> None:
        """Memory grows with what is kept (collectives, annotations, kernels): past
        MAX_KEPT of them the trace is refused, not read into a MemoryError."""
        kept = len(self.spans) + len(self.comm_ops) + len(self.comm_kernels) + \
            len(self.kernel_ts) // 8 + len(self.launch_ts) // 8
        if kept > MAX_KEPT:
            from .stream import TraceError

            raise TraceError(f"over {MAX_KEPT:,} collectives, annotations and kernels in one "
                             "trace: more than zerodoc reads at once; profile fewer steps "
                             "(torch.profiler schedule active=...)")

    def add(self, ev: dict) -> None:
        self.events += 1
        if self.events & 0xFFFF == 0:
            self._check_size()
        if ev.get("ph") != "X":
            return
        cat = ev.get("cat")
        name = ev.get("name")
        if not isinstance(name, str):
            return
        try:
            ts = float(ev["ts"])
            dur = float(ev.get("dur", 0.0))
        except (KeyError, TypeError, ValueError):
            return
        if not (math.isfinite(ts) and math.isfinite(dur) and dur >= 0.0):
            self.bad_times += 1  # NaN, infinite or negative: never into the numbers
            return
        end = ts + dur
        if cat in LEGACY_CATS:
            cat = LEGACY_CATS[cat]
            if cat == "cpu_op" and name.startswith(ANNOTATION_PREFIXES):
                cat = "user_annotation"  # record_function ranges were operators then
        if cat == "cpu_op":
            self._cpu_op(ev, name, ts, end)
        elif cat == "user_annotation":
            if name.startswith(ANNOTATION_PREFIXES):
                self.spans.append(Span(name, _tid(ev), ts, end))
                if self.pid is None and name.startswith("ProfilerStep#"):
                    self.pid = _int(ev.get("pid"))
            elif name.startswith(("nccl:", "gloo:")):
                self._named_comm(ev, name, ts, end, name[:4])
        elif cat == "kernel":
            args = ev.get("args") or {}
            if COMM_KERNEL.match(name):
                self._kernel(name, args, ts, end)
            elif not NOT_COMPUTE.match(name):
                self.kernel_ts.append(ts)
                self.kernel_end.append(end)
                self.kernel_corr.append(_int(args.get("correlation")) or -1)
            else:
                self._mem(ts, end, args)
        elif cat in MEMORY_OPS:
            self._mem(ts, end, ev.get("args") or {})
        elif isinstance(cat, str) and cat.endswith(HOST_CALLS):
            args = ev.get("args") or {}
            corr = _int(args.get("correlation"))
            if corr is not None:
                self.host_corr.append(corr)
                if "Launch" in name:
                    self.launch_corr.append(corr)
                    self.launch_tid.append(_tid(ev))
                    self.launch_ts.append(ts)

    def _mem(self, ts: float, end: float, args: dict) -> None:
        self.mem_ts.append(ts)
        self.mem_end.append(end)
        self.mem_corr.append(_int(args.get("correlation")) or -1)

    def _cpu_op(self, ev: dict, name: str, ts: float, end: float) -> None:
        self.cpu_ops += 1
        tid = _tid(ev)
        if name.startswith("c10d::"):
            op = name[6:].rstrip("_")
            coll = C10D.get(op)
            if coll is not None:
                args = ev.get("args") or {}
                dt, size = _shape_dtype(args)
                # the list-form all-gather's output lists are not recorded, only the input
                self.comm_ops.append(CommOp("c10d", coll, tid, ts, end, _int(args.get(
                    "External id")), _numel(args.get("Input Dims")), dt, size,
                    per_rank=op in ("allgather", "allgather_coalesced")))
                return
        elif name == "record_param_comms":
            args = ev.get("args") or {}
            coll = KERNEL_NAMED.get(str(args.get("Collective name", "")).strip().lower())
            if coll is not None:
                info = dtype_info(args.get("dtype"))
                n = max(_int(args.get("In msg nelems")) or 0, _int(args.get("Out msg nelems"))
                        or 0) or None
                self.comm_ops.append(CommOp(
                    "rpc", coll, tid, ts, end, _int(args.get("External id")), n,
                    info[0] if info else None, info[1] if info else None,
                    _int(args.get("Group size"))))
            return
        elif name.startswith(("gloo:", "nccl:")):
            self._named_comm(ev, name, ts, end, name[:4])
            return
        elif PY_WRAPPER.fullmatch(name):
            if name.startswith(BACKWARD_FN):
                self.backward_starts.append(ts)
            return  # a wrapper: its children are what ran
        iv = self.busy.get(tid)
        if iv is None:
            iv = self.busy[tid] = _Intervals()
        iv.add(ts, end)

    def _named_comm(self, ev: dict, name: str, ts: float, end: float, kind: str) -> None:
        coll = NAMED.get(name.split(":", 1)[1].strip().lower())
        if coll is None:
            return
        args = ev.get("args") or {}
        dt, size = _shape_dtype(args)
        self.comm_ops.append(CommOp(kind, coll, _tid(ev), ts, end, _int(args.get("External id")),
                                    _numel(args.get("Input Dims")), dt, size))

    def _kernel(self, name: str, args: dict, ts: float, end: float) -> None:
        coll = kernel_kind(name, args.get("Collective name"))
        info = dtype_info(args.get("dtype"))
        n = max(_int(args.get("In msg nelems")) or 0, _int(args.get("Out msg nelems")) or 0)
        self.comm_kernels.append(Kernel(
            name, _int(args.get("stream")) or 0, ts, end, _int(args.get("External id")),
            _int(args.get("correlation")), coll, n or None, info[0] if info else None,
            info[1] if info else None, _int(args.get("Group size"))))

    def finish(self) -> None:
        for iv in self.busy.values():
            iv.flush()

    def drop_unlaunched(self) -> int:
        """Leave out the device operations (compute and communication kernels, memory ops)
        whose correlation no host runtime call of the trace carries: work queued before the
        profiler began recording (module docstring). A trace without host runtime calls keeps
        everything, as does an operation without a correlation. Returns how many were left
        out (also in `unlaunched`)."""
        if not len(self.host_corr):
            return 0
        # sorted and searched (numpy 2.4's hash-based np.unique / np.isin take ~1 s per
        # million ids; a sort takes ~20 ms)
        host = np.sort(np.asarray(self.host_corr, dtype=np.int64))

        def kept(corr) -> np.ndarray:
            c = np.asarray(corr, dtype=np.int64)
            i = np.clip(np.searchsorted(host, c), 0, len(host) - 1)
            return (c < 0) | (host[i] == c)

        dropped = 0
        for ts, end, corr in (("kernel_ts", "kernel_end", "kernel_corr"),
                              ("mem_ts", "mem_end", "mem_corr")):
            if len(getattr(self, corr)) != len(getattr(self, ts)):
                continue  # a reader that keeps no correlations for these
            keep = kept(getattr(self, corr))
            if keep.all():
                continue
            dropped += int(len(keep) - np.count_nonzero(keep))
            for name in (ts, end, corr):
                a = getattr(self, name)
                setattr(self, name, array(a.typecode, np.asarray(a)[keep].tobytes()))
        if self.comm_kernels:
            keep = kept([-1 if k.correlation is None else k.correlation
                         for k in self.comm_kernels])
            dropped += int(len(keep) - np.count_nonzero(keep))
            self.comm_kernels = [k for k, ok in zip(self.comm_kernels, keep) if ok]
        self.unlaunched += dropped
        return dropped

    @property
    def is_gpu(self) -> bool:
        return bool(self.comm_kernels or self.kernel_ts)


def _tid(ev: dict) -> int:
    t = ev.get("tid")
    if isinstance(t, int):
        return t
    try:
        return int(t)
    except (TypeError, ValueError):
        return hash(t) & 0x7FFFFFFF
