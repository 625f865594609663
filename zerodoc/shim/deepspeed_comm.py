"""DeepSpeed collectives: the `deepspeed.comm` backend interception of the DeepSpeed adapter.

Every `deepspeed.comm` call ends in a method of DeepSpeed's backend object
(`deepspeed.comm.comm.cdb`, a `TorchBackend`); `install_comm` shadows those methods on that
object with timed wrappers while attached, and undo puts the originals back. Asynchronous calls
(ZeRO-3 parameter fetches) return the timer's `TimedWork`, which DeepSpeed's
`AllGatherCoalescedHandle.wait()` waits on. The simulated slow link sits beneath the
measurement. On a detail step each call is noted in the step's collective order
(`collorder.py`: `begin` / `end`, one row per collective the call issued on its group; the
unit is the one the call is booked on), so that a flight-recorder dump's sequence number
names it. DeepSpeed's own collectives all pass here (the loss-scale overflow and grad-norm
all-reduces included). Hook points: see `hookpoints.py`.
"""

from __future__ import annotations

import inspect
import time

from .detailplan import shadow_attr
from .recorder import ALL_GATHER, ALL_REDUCE, BROADCAST, REDUCE_SCATTER
from .slowlink import DelayedWork, sleep_until
from .wiring import nbytes as _nbytes

# DeepSpeed backend method -> (collective, position and name of the tensor(s) counted,
# position of `async_op`). Bytes follow the FSDP2 convention: all-gather output,
# reduce-scatter input, all-reduce / reduce / broadcast the tensor. The positions are those of
# `TorchBackend` in 0.19.8 (its decorators hide the signature; `deepspeed.comm.all_reduce`
# passes `async_op` positionally).
COMM_METHODS: dict[str, tuple[int, int, str, int]] = {
    "all_gather_into_tensor": (ALL_GATHER, 0, "output_tensor", 3),
    "all_gather": (ALL_GATHER, 0, "tensor_list", 3),
    "all_gather_coalesced": (ALL_GATHER, 0, "output_tensors", 3),
    "all_gather_base": (ALL_GATHER, 0, "output_tensor", 3),
    "reduce_scatter_tensor": (REDUCE_SCATTER, 1, "input_tensor", 4),
    "reduce_scatter": (REDUCE_SCATTER, 1, "input_list", 4),
    "reduce": (REDUCE_SCATTER, 0, "tensor", 4),
    "all_reduce": (ALL_REDUCE, 0, "tensor", 3),
    "all_reduce_coalesced": (ALL_REDUCE, 0, "tensors", 3),
    "broadcast": (BROADCAST, 0, "tensor", 3),
}


class _State:
    """What the hot-path wrappers share: the recorder, the timer and the unit to book on."""

    def __init__(self, rec, timer, registry, model_unit: int):
        self.rec = rec
        self.timer = timer
        self.registry = registry
        self.unit = model_unit  # where a collective issued now is booked
        self.depth = 0  # re-entrancy guard: a backend method calling another


def _arg_pos(fn, name: str, default: int | None) -> int | None:
    """Position of argument `name` of `fn` (its real signature if visible, else `default`)."""
    try:
        names = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return default
    if name in names:
        return names.index(name)
    return default


def _async_op(args: tuple, kwargs: dict, pos: int | None) -> bool:
    if "async_op" in kwargs:
        return bool(kwargs["async_op"])
    return bool(args[pos]) if pos is not None and len(args) > pos else False


def _delayed(orig, delay_s: float, async_pos: int | None):
    """The simulated slow link, beneath the measurement: completes `delay_s` late."""

    def call(*args, **kwargs):
        work = orig(*args, **kwargs)
        if _async_op(args, kwargs, async_pos) and work is not None \
                and hasattr(work, "get_future"):
            return DelayedWork(work, delay_s)
        sleep_until(time.perf_counter() + delay_s)  # spun at the end, as the others
        return work
    return call


def _group(args: tuple, kwargs: dict, pos: int | None):
    """The call's process group (None: the default), as `_async_op` reads `async_op`."""
    if "group" in kwargs:
        return kwargs["group"]
    return args[pos] if pos is not None and len(args) > pos else None


def _wrap_comm(orig, coll: int, t_pos: int, t_name: str, async_default: int, st: _State,
               delay_s: float):
    async_pos = _arg_pos(orig, "async_op", async_default)
    # `group` comes just before `async_op` in every method of COMM_METHODS
    group_pos = _arg_pos(orig, "group", async_default - 1)
    inner = _delayed(orig, delay_s, async_pos) if delay_s > 0 and coll == ALL_GATHER else orig
    timer = st.timer

    def call(*args, **kwargs):
        if st.depth:
            return orig(*args, **kwargs)
        try:
            nbytes = _nbytes(args[t_pos] if len(args) > t_pos else kwargs.get(t_name))
            async_op = _async_op(args, kwargs, async_pos)
            group = _group(args, kwargs, group_pos)
            order = timer.order
            # its sequence number(s) (collorder.py)
            token = order.begin(group, st.unit, coll) if order is not None else None
        except Exception as e:  # never break the job
            st.registry.error("deepspeed.comm wrapper", e)
            return orig(*args, **kwargs)
        st.depth += 1
        try:
            if timer.device:
                return timer.call(inner, args, kwargs, st.unit, coll, nbytes, async_op,
                                  group)
            # On the host a call that blocks (a slow link under a ZeRO-3 parameter fetch) is
            # exposed communication, not the fetch's framework time (issue 20 item 9).
            return timer.call_blocking_issue(inner, args, kwargs, st.unit, coll, nbytes,
                                             async_op)
        finally:
            st.depth -= 1
            if token is not None:
                order.end(token)

    call.__wrapped__ = orig
    return call


def install_comm(st: _State, slow_link_s: float, registry, undo: list) -> None:
    """Shadow the collective methods of `deepspeed.comm.comm.cdb` with timed wrappers."""
    hook = "deepspeed.comm.comm.cdb (TorchBackend methods)"
    try:
        import deepspeed.comm.comm as dcomm

        cdb = dcomm.cdb
        if cdb is None:
            raise AttributeError("deepspeed.comm backend not initialised")
        n = 0
        for name, (coll, t_pos, t_name, a_pos) in COMM_METHODS.items():
            orig = getattr(cdb, name, None)
            if orig is None:
                continue
            wrapper = _wrap_comm(orig, coll, t_pos, t_name, a_pos, st, slow_link_s)
            shadow_attr(cdb, name, wrapper, undo)
            n += 1
        if not n:
            raise AttributeError("no collective methods on the backend")
        registry.ok(hook)
    except Exception as e:
        registry.missing(hook, repr(e))
