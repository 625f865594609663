"""ZeRO-1 (`ZeroRedundancyOptimizer` + DDP) and plain DDP instrumentation.

One unit, "(model)": ZeRO-1 shards only the optimizer state, parameters are whole on every
rank and nothing is gathered per module, so there is no per-module unit to name (DDP's
gradient buckets are an implementation detail whose count changes when DDP rebuilds them
after the first step). Its facts are the whole model's.

Measured per step:
- forward / backward compute of the model: forward hooks outside and inside DDP's forward;
  backward from the first gradient reaching the model's output (a tensor hook) to the end of
  the autograd graph (an autograd engine callback queued at that moment);
- gradient all-reduce, one record per DDP bucket ("all_reduce", phase backward): a comm hook
  (public `register_comm_hook`) that does what DDP's default does (divide by the group size,
  async all-reduce) and takes the issue time and, from the future's callback, the completion
  time. DDP waits for all bucket futures in `finalize_backward`, in C++, after the graph has
  run; a second autograd callback queued behind it marks when that wait returned. The
  exposed time is the part of the buckets' completion that fell after the end of backward
  compute (capped at the return of DDP's wait); hidden = the rest of issue -> completion;
- ZeRO-1's parameter sync after the local step (`_sync_params`: every rank broadcasts its
  shard, async, then waits on all of them): each `dist.broadcast` ("broadcast", phase
  optimizer) through a proxy of the optimizer module's `dist`, installed while this
  optimizer's `_broadcast_params_from_rank` runs; exposed = the time `_sync_params` blocked
  in `wait()` (the `TimedWork` of comm.py).
On CUDA: each bucket's all-reduce is timed on the device (an event on the current stream
before the call, one recorded in the future's `then` callback, i.e. on a stream that waited
for the collective: `cuda.CudaTimer.issue/done`); the exposure window is the same span of the
compute stream (end of backward compute -> DDP's wait returned). ZeRO-1's broadcasts get a
window around `_sync_params` (where the compute stream waits for them).
Memory: the monitor is handed a view whose `state` is the local optimizer's (this rank's
shard) and whose step hooks are the `ZeroRedundancyOptimizer`'s.
Slow link (`inject_latency_s`, tests and demo): ZeRO-1's broadcasts complete that much later;
plain DDP, which gathers no parameters, has its bucket all-reduces delayed instead.
Collective order (`collorder.py`, detail steps): every bucket's all-reduce (on DDP's group;
a user's hook behind ours: whatever it issues there) and every broadcast is noted with unit
"(model)", so that a flight-recorder dump's sequence number names its phase (backward:
buckets; optimizer: broadcasts). DDP's own forward broadcast of buffers is not seen: no row
(the other offsets stay exact).
Not measured: `overlap_with_ddp=True` (the step runs inside DDP's hook; only detected and
reported in the facts), the C++ reducer's own copy of gradients into buckets (counted as
backward compute). DDP has no way to remove a comm hook: after `close()` ours stays
installed and only does DDP's default all-reduce. DDP allows one comm hook: a user's
`register_comm_hook` after attach puts the user's hook behind ours, which runs it in place of
the default and times it (`_take_registrations`). Hook points: see `hookpoints.py`.
"""

from __future__ import annotations

import warnings
from time import perf_counter
from typing import Any

import torch

import torch.distributed as dist

from . import hookpoints as hp
from .adapters import Adapter, AdapterFacts
from .detailplan import DetailPlan, shadow_attr
from .recorder import (
    ALL_REDUCE, BACKWARD, BROADCAST, B_FRAMEWORK, B_WAIT, OPTIMIZER, unit_bucket,
)
from .slowlink import DelayedWork, SlowLink
from .wiring import (
    DistProxy, dtype_name as _dtype_name, install_dist_proxy, install_forward_hooks,
    nbytes as _nbytes, torch_version,
)
from ..runmodel import UnitFacts

UNIT_NAME = "(model)"
UNIT = 0


def _tensors(obj, out: list) -> list:
    """Tensors needing grad in a forward output (tensor, or nested tuple / list / dict)."""
    if isinstance(obj, torch.Tensor):
        if obj.requires_grad:
            out.append(obj)
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            _tensors(x, out)
    elif isinstance(obj, dict):
        for x in obj.values():
            _tensors(x, out)
    return out


def find_ddp(model):
    cls = hp.ddp_class()
    if cls is None:
        return None
    if isinstance(model, cls):
        return model
    return next((m for m in model.modules() if isinstance(m, cls)), None)


class _ZeroDistProxy(DistProxy):
    """Stands in for `torch.distributed` inside `zero_redundancy_optimizer` only: while the
    adapter's optimizer broadcasts its parameters, each `broadcast` is timed (and, in tests,
    delayed beneath the measurement); otherwise everything passes through."""

    def __init__(self, real, adapter: "Zero1Adapter", live: list):
        super().__init__(real)
        self._a = adapter
        # its own switch ([True] while its plan is installed, or until `instrument()`'s
        # undo; the adapter's `active` has the same lifetime): a plan rebuilt over another
        # tool's wrapper of `dist` wraps a chain that still holds this proxy; reading the
        # adapter-wide `active` it would time every broadcast a second time (review of
        # 2026-11-27, as FSDP1's R3)
        self._live = live

    def broadcast(self, *args, **kwargs):
        a = self._a
        if not a.broadcasting or not self._live[0]:
            return self._real.broadcast(*args, **kwargs)
        tensor = kwargs.get("tensor", args[0] if args else None)
        fn = self._real.broadcast
        if a.slow_link_s > 0:
            fn = SlowLink(fn, a.slow_link_s)
        group, order = kwargs.get("group"), a.timer.order
        if order is not None:  # its sequence number (collorder.py)
            order.issued(group, UNIT, BROADCAST)
        return a.timer.call(fn, args, kwargs, UNIT, BROADCAST, _nbytes(tensor),
                            bool(kwargs.get("async_op", False)), group)


class _ZeroStepView:
    """What the monitor reads from "the optimizer": the step hooks of the
    `ZeroRedundancyOptimizer` (its step includes the parameter sync) and the state of its
    local optimizer (this rank's shard; the wrapper's own `.state` stays empty)."""

    def __init__(self, zero):
        self._zero = zero

    def register_step_pre_hook(self, hook):
        return self._zero.register_step_pre_hook(hook)

    def register_step_post_hook(self, hook):
        return self._zero.register_step_post_hook(hook)

    @property
    def state(self):
        return self._zero.optim.state


class DDPAdapter(Adapter):
    """Plain `DistributedDataParallel` (no sharding: ZeRO stage 0)."""

    framework = "ddp"
    zero_stage = 0
    # The simulated slow link (`inject_latency_s`) delays the parameter gather; DDP gathers
    # nothing, so here it delays the gradient all-reduce instead.
    delay_gradients = True

    @classmethod
    def detect(cls, model, optimizer) -> bool:
        return find_ddp(model) is not None

    def discover(self) -> None:
        self.ddp = find_ddp(self.model)
        self.unit_names = [UNIT_NAME]
        self.active = False
        self._buckets: list[list] = []  # [t_issue, nbytes, t_done] per bucket, this backward
        self._bwd_started = False
        self._t_compute_end: float | None = None
        self.slow_link_s = 0.0
        self._check_fsdp_fallback()

    def memory_module(self):
        return self.ddp.module if self.ddp is not None else self.model

    def _group_size(self) -> int:
        pg = getattr(self.ddp, "process_group", None)
        if pg is not None:
            return pg.size()
        return dist.get_world_size() if dist.is_initialized() else 1

    # --- static facts ---------------------------------------------------------------
    def _unit_facts(self, group: int, replicate: int) -> UnitFacts:
        params = [p for p in self.memory_module().parameters()]
        n = sum(p.numel() for p in params)
        nbytes = sum(_nbytes(p) for p in params)
        dt = _dtype_name(params[0].dtype) if params else ""
        # Parameters are whole on every rank; the post-step sync moves all of them.
        return UnitFacts(name=UNIT_NAME, params=n, param_bytes=nbytes, gather_bytes=nbytes,
                         sharded_bytes=nbytes, reshard_after_forward=None, group_size=group,
                         param_dtype=dt, reduce_dtype=dt, replicate_size=replicate)

    def _ddp_facts(self) -> dict[str, Any]:
        d = self.ddp
        if d is None:
            return {"ddp": False}
        cap = getattr(d, "bucket_bytes_cap", None)
        out = {"ddp": True, "ddp_bucket_cap_bytes": cap,
                "gradient_as_bucket_view": getattr(d, "gradient_as_bucket_view", None),
                "find_unused_parameters": getattr(d, "find_unused_parameters", None),
                "static_graph": getattr(d, "static_graph", None),
                "broadcast_buffers": getattr(d, "broadcast_buffers", None)}
        if self.framework == "ddp" and self.fsdp_requested:
            out["fsdp_requested"] = self.fsdp_requested
        return out

    def _check_fsdp_fallback(self) -> None:
        """Asked for FSDP, running DDP (Accelerate / the HF Trainer without a GPU): say so
        once, at start-up (rank 0); the run facts keep it for the report."""
        from ..integrations.common import fsdp_requested

        self.fsdp_requested = fsdp_requested() if self.framework == "ddp" else None
        if self.fsdp_requested and (not dist.is_initialized() or dist.get_rank() == 0):
            warnings.warn(f"zerodoc: asked for FSDP, running DDP: no sharding "
                          f"({self.fsdp_requested}). Every rank holds the whole model and "
                          "optimizer state; gradients are all-reduced.", stacklevel=4)

    def facts(self) -> AdapterFacts:
        n = self._group_size()
        u = self._unit_facts(n, n)
        return AdapterFacts(framework=self.framework, framework_version=torch_version(),
                            units=[u], zero_stage=self.zero_stage, mesh_shape=(n,),
                            param_dtype=u.param_dtype, reduce_dtype=u.reduce_dtype,
                            extra=self._ddp_facts())

    # --- instrumentation ------------------------------------------------------------
    def instrument(self, rec, timer, on_root_forward, slow_link_s: float) -> list:
        self.rec, self.timer, self.slow_link_s = rec, timer, slow_link_s
        self.active = True
        undo: list = [self._deactivate]
        self._install_detail(on_root_forward, undo, None)
        return undo

    def plan(self, rec, timer, on_root_forward, slow_link_s: float) -> DetailPlan:
        """The same instrumentation as `instrument()`, built once (`detailplan.py`): the
        forward hooks go into the hook dicts, `active` (what the comm hook and the backward
        callbacks check) and ZeRO-1's wrappers are attribute writes at each install."""
        self.rec, self.timer, self.slow_link_s = rec, timer, slow_link_s
        plan = DetailPlan(rec, timer)
        plan.attr(self, "active", True)
        self._install_detail(on_root_forward, [], plan)
        return plan

    def _install_detail(self, on_root_forward, undo: list, plan) -> None:
        """What a detail step puts in place: now (`undo` collects the removals) or, with
        `plan`, at each of its installs."""
        hook = "Variable._execution_engine.queue_callback"
        try:
            callbacks = hp.autograd_callbacks_available()
            reason = "not found"
        except Exception as e:  # noqa: BLE001 - without it neither backward end nor DDP's wait
            callbacks, reason = False, repr(e)
        if callbacks:
            self.registry.ok(hook)
        else:
            self.registry.missing(hook, reason)
        self._install_forward(on_root_forward, undo, backward=callbacks, plan=plan)
        if self.ddp is not None and callbacks:
            self._install_comm_hook()

    def _deactivate(self) -> None:
        self.active = False

    def install_always(self, rec, timer) -> list:
        """DDP's comm hook: registered once, before the first backward (DDP allows one hook
        and wants it before backward; a user's later one runs behind it); it times buckets
        only while `active`."""
        self.rec, self.timer, self.active = rec, timer, False
        if self.ddp is not None and hp.autograd_callbacks_available():
            self._install_comm_hook()
        return []

    def _install_forward(self, on_root_forward, undo: list, backward: bool,
                         plan=None) -> None:
        rec, timer = self.rec, self.timer
        bwd = unit_bucket(UNIT, BACKWARD)
        outer = self.ddp if self.ddp is not None else self.model
        device = timer.device

        def pre_extra() -> None:
            self._bwd_started = False

        def post_extra(out) -> None:
            rec.phase = BACKWARD
            if not backward or not self.active or not torch.is_grad_enabled():
                return
            try:
                for t in _tensors(out, []):
                    t.register_hook(on_output_grad)
            except Exception as e:
                self.registry.error("ddp.output_grad_hook", e)

        def on_output_grad(grad):
            # The first gradient reaching the model's output: backward compute starts.
            if self._bwd_started or not self.active:
                return None
            self._bwd_started = True
            try:
                rec.phase = BACKWARD
                rec.push(bwd)
                self._buckets = []
                hp.queue_autograd_callback(on_compute_end)
            except Exception as e:
                self.registry.error("ddp.backward_start", e)
            return None

        def on_compute_end():
            # Queued before DDP's finalize_backward (DDP queues it at its last bucket):
            # the graph has run, DDP is about to wait for its buckets.
            try:
                rec.switch(bwd, B_WAIT)
                if device:
                    timer.arrive(UNIT)
                self._t_compute_end = perf_counter()
                hp.queue_autograd_callback(on_wait_end)
            except Exception as e:
                self.registry.error("ddp.backward_end", e)

        def on_wait_end():
            try:
                if device:
                    rec.remove(B_WAIT)
                    timer.ready(UNIT, (ALL_REDUCE,))  # the device timer books the buckets
                else:
                    self._account_buckets(perf_counter())
            except Exception as e:
                self.registry.error("ddp.bucket_wait", e)

        install_forward_hooks(outer, self.memory_module(), rec, timer, UNIT, self.registry,
                              undo, on_root_forward=on_root_forward, window=False,
                              pre_extra=pre_extra, post_extra=post_extra, plan=plan)

    def _account_buckets(self, t_end: float) -> None:
        """DDP's wait for its buckets returned at `t_end`: record each bucket's all-reduce."""
        rec = self.rec
        t0 = self._t_compute_end if self._t_compute_end is not None else t_end
        rec.remove(B_WAIT)
        cursor = t0
        exposed_total = 0.0
        for t_issue, nbytes, t_done in sorted(self._buckets, key=lambda b: b[2] or t_end):
            done = min(t_done if t_done is not None else t_end, t_end)
            exposed = max(0.0, done - cursor)
            cursor = max(cursor, done)
            seconds = max(0.0, done - t_issue)
            exposed = min(exposed, seconds)
            exposed_total += exposed
            rec.add_comm(UNIT, BACKWARD, ALL_REDUCE, nbytes, seconds, exposed,
                         seconds - exposed)
        # The wait's remainder (DDP copying buckets back into .grad) is framework time.
        extra = max(0.0, (t_end - t0) - exposed_total)
        rec.acc[B_WAIT] -= extra
        rec.acc[B_FRAMEWORK] += extra
        self._buckets = []
        self._t_compute_end = None

    def _install_comm_hook(self) -> None:
        """DDP's comm hook: ours, registered once at attach (DDP allows one, for good). It
        does DDP's default all-reduce, or the user's hook registered after attach
        (`_take_registrations`), timing the bucket while `active` (a detail step)."""
        reg, ddp = self.registry, self.ddp
        if getattr(self, "_comm_hook_ours", False):
            return
        if getattr(ddp, "_comm_hooks", None):
            reg.missing("DistributedDataParallel.register_comm_hook",
                        "the model already has a comm hook; gradient buckets not timed")
            return
        pg = ddp.process_group
        size = pg.size()
        device = self.timer.device
        default = self._device_hook(pg, size) if device else self._host_hook(pg, size)
        chained = self._chained_device_hook(pg) if device else self._chained_host_hook(pg)
        self._user_hook: tuple | None = None  # (hook, state) the user registered after attach

        def hook(state, bucket):
            user = self._user_hook
            return default(state, bucket) if user is None else chained(user, bucket)

        try:
            ddp.register_comm_hook(None, hook)
        except Exception as e:
            reg.missing("DistributedDataParallel.register_comm_hook", repr(e))
            return
        self._comm_hook_ours = True
        reg.ok("DistributedDataParallel.register_comm_hook")
        self._take_registrations(hook)

    def _take_registrations(self, ours) -> None:
        """A user's `register_comm_hook` after attach would meet torch's "can only be called
        once" (the C++ reducer keeps its first hook for good): the DDP instance's
        `register_comm_hook` is shadowed so that the call does what torch's does (its own
        checks, the logger's hook name, `_comm_hooks`) and puts the user's hook behind ours,
        which then runs it in place of the default and times its future. Torch's rules stay:
        a second registration is refused as torch refuses it. A built-in (C++) hook cannot run
        behind a Python one: `_register_builtin_comm_hook` raises, naming zerodoc and the way
        out. Both stay after `close()`, as our hook does."""
        ddp = self.ddp

        def register_comm_hook(state: object, hook) -> None:
            self._register_user_hook(ours, state, hook)

        def _register_builtin_comm_hook(comm_hook_type) -> None:
            raise RuntimeError(BUILTIN_HOOK_REFUSED.format(comm_hook_type))

        try:  # without it a user's later registration meets torch's error, as before
            register_comm_hook.__doc__ = type(ddp).register_comm_hook.__doc__
            ddp.register_comm_hook = register_comm_hook
            ddp._register_builtin_comm_hook = _register_builtin_comm_hook
        except Exception as e:  # noqa: BLE001 - attach never raises for zerodoc's own part
            self.registry.error("ddp.user_comm_hook", e)

    def _register_user_hook(self, ours, state: object, hook) -> None:
        if self._user_hook is not None:  # torch's rule, unchanged by zerodoc
            raise RuntimeError("register_comm_hook or register_builtin_comm_hook can only be "
                               "called once.")
        ddp = self.ddp
        check = getattr(ddp, "_check_comm_hook", None)
        if check is not None:
            check(hook)  # torch's checks of the hook; a mistake raises as without zerodoc
        try:  # torch's bookkeeping, where this torch keeps it
            name = getattr(getattr(ddp, "logger", None), "_set_comm_hook_name", None)
            if name is not None:
                name(hook.__qualname__)
            hooks = getattr(ddp, "_comm_hooks", None)
            if isinstance(hooks, list):  # what DDP's Python reducer (compiled autograd) calls
                hooks[:] = [(hook, state) if isinstance(h, tuple) and h[0] is ours else h
                            for h in hooks]
        except Exception as e:  # noqa: BLE001 - the user's hook is taken regardless
            self.registry.error("ddp.user_comm_hook", e)
        self._user_hook = (hook, state)

    def _timed(self, t_issue: float, nbytes: int, fut, value):
        """Book one bucket issued at `t_issue`, done when `fut` completes; the future DDP
        gets holds `value(fut)`."""
        entry = [t_issue, nbytes, None]
        self._buckets.append(entry)

        def done(f):
            entry[2] = perf_counter()
            return value(f)
        return fut.then(done)

    def _host_hook(self, pg, size: int):
        """What DDP does without a hook (torch's default_hooks.allreduce_hook): average =
        divide, then sum-all-reduce; bitwise the same gradients."""

        def hook(state, bucket):
            t_issue = perf_counter()
            tensor = bucket.buffer()
            tensor.div_(size)
            if self.active:
                self._note(pg)
            work = dist.all_reduce(tensor, group=pg, async_op=True)
            if self.delay_gradients and self.slow_link_s > 0 and self.active:
                work = DelayedWork(work, self.slow_link_s)  # simulated slow link
            fut = work.get_future()
            if not self.active:
                return fut.then(_first)
            return self._timed(t_issue, _nbytes(tensor), fut, _first)
        return hook

    def _note(self, pg) -> None:
        """A bucket's all-reduce on DDP's group `pg`, in the step's collective order
        (collorder.py; detail steps only): unit "(model)", phase backward."""
        order = self.timer.order
        if order is not None:
            order.issued(pg, UNIT, ALL_REDUCE)

    def _begin(self, pg):
        """The user's comm hook in place of the default: whatever it issues on DDP's group
        (none, one or several collectives) is noted as the bucket's (collorder.py)."""
        order = self.timer.order
        return order.begin(pg, UNIT, ALL_REDUCE) if order is not None else None

    def _chained_host_hook(self, pg):
        """The user's hook in place of the default; on a detail step its future is timed
        like ours (bytes: the bucket's, before whatever the hook does with them; the
        simulated slow link does not delay it). A failure of zerodoc's own part leaves the
        user's hook running untimed; the user's hook's own errors reach DDP unchanged."""

        def chained(user, bucket):
            fn, state = user
            if not self.active:
                return fn(state, bucket)
            try:
                nbytes, t_issue = _nbytes(bucket.buffer()), perf_counter()
                token = self._begin(pg)
            except Exception as e:  # noqa: BLE001 - the user's hook runs regardless
                self.registry.error("ddp.user_comm_hook", e)
                return fn(state, bucket)
            try:
                fut = fn(state, bucket)
            finally:
                if token is not None:
                    self.timer.order.end(token)
            try:
                return self._timed(t_issue, nbytes, fut, _value)
            except Exception as e:  # noqa: BLE001 - not a future: DDP says so
                self.registry.error("ddp.user_comm_hook", e)
                return fut
        return chained

    def _device_hook(self, pg, size: int):
        """The comm hook on CUDA: DDP's default all-reduce, its device time recorded by
        `CudaTimer.issue` (before the call, current stream) and `done` (in the future's
        callback, on a stream that waited for the collective)."""
        timer = self.timer

        def hook(state, bucket):
            tensor = bucket.buffer()
            tensor.div_(size)
            h = None
            if self.active:
                h = timer.issue(UNIT, ALL_REDUCE, _nbytes(tensor), pg)
                self._note(pg)
            work = dist.all_reduce(tensor, group=pg, async_op=True)

            def done(f):
                if h is not None:
                    timer.done(h)
                return f.value()[0]
            return work.get_future().then(done)
        return hook

    def _chained_device_hook(self, pg):
        """The user's hook on CUDA, timed as `_device_hook` times the default (bytes: the
        bucket's; the group: DDP's)."""
        timer = self.timer

        def chained(user, bucket):
            fn, state = user
            h = token = None
            if self.active:
                try:
                    h = timer.issue(UNIT, ALL_REDUCE, _nbytes(bucket.buffer()), pg)
                    token = self._begin(pg)
                except Exception as e:  # noqa: BLE001 - the user's hook runs regardless
                    self.registry.error("ddp.user_comm_hook", e)
            try:
                fut = fn(state, bucket)
            finally:
                if token is not None:
                    timer.order.end(token)
            if h is None:
                return fut

            def done(f):
                timer.done(h)
                return f.value()
            try:
                return fut.then(done)
            except Exception as e:  # noqa: BLE001 - not a future: DDP says so
                self.registry.error("ddp.user_comm_hook", e)
                return fut
        return chained


BUILTIN_HOOK_REFUSED = (
    "zerodoc: DDP allows one comm hook and zerodoc's, registered at zerodoc.attach(), holds "
    "it; a built-in C++ hook ({}) cannot run behind it. Register its Python equivalent with "
    "register_comm_hook (torch.distributed.algorithms.ddp_comm_hooks.default_hooks: "
    "allreduce_hook, fp16_compress_hook, bf16_compress_hook), which zerodoc runs in its place, "
    "or register the built-in before zerodoc.attach() (zerodoc then leaves the comm hook to "
    "it and does not time the gradient buckets).")


def _first(f):
    """The value of an all-reduce's future: the list of its one tensor."""
    return f.value()[0]


def _value(f):
    return f.value()


class Zero1Adapter(DDPAdapter):
    """`ZeroRedundancyOptimizer` (optimizer state sharded: ZeRO-1), usually over DDP."""

    framework = "zero1"
    zero_stage = 1
    delay_gradients = False  # the slow link delays the parameter broadcasts

    @classmethod
    def detect(cls, model, optimizer) -> bool:
        zcls = hp.zero_optimizer_class()
        return zcls is not None and isinstance(optimizer, zcls)

    def discover(self) -> None:
        super().discover()
        self.broadcasting = False

    def facts(self) -> AdapterFacts:
        f = super().facts()
        opt = self.optimizer
        n = getattr(opt, "world_size", None) or self._group_size()
        replicate = self._group_size() if self.ddp is not None else n
        f.units = [self._unit_facts(n, replicate)]
        f.mesh_shape = (n,)
        try:
            local = sum(p.numel() for g in opt.optim.param_groups for p in g["params"])
        except Exception as e:
            self.registry.missing("ZeroRedundancyOptimizer.optim", repr(e))
            local = None
        f.extra.update({
            "optimizer_class": type(getattr(opt, "optim", opt)).__name__,
            "parameters_as_bucket_view": getattr(opt, "parameters_as_bucket_view", None),
            "overlap_with_ddp": getattr(opt, "_overlap_with_ddp", None),
            "zero_local_params": local,
        })
        return f

    def _install_detail(self, on_root_forward, undo: list, plan) -> None:
        super()._install_detail(on_root_forward, undo, plan)
        self._install_broadcasts(undo, plan)

    def step_optimizer(self):
        if hasattr(getattr(self.optimizer, "optim", None), "state"):
            self.registry.ok("ZeroRedundancyOptimizer.optim")
            return _ZeroStepView(self.optimizer)
        self.registry.missing("ZeroRedundancyOptimizer.optim", "no local optimizer; "
                              "optimizer state bytes read from the wrapper")
        return self.optimizer

    def _install_broadcasts(self, undo: list, plan=None) -> None:
        reg, opt = self.registry, self.optimizer
        if getattr(opt, "_overlap_with_ddp", False):
            reg.missing("ZeroRedundancyOptimizer._broadcast_params_from_rank",
                        "overlap_with_ddp=True: parameter sync runs in DDP's hook")
            return
        try:
            zmod = hp.zero_optimizer_module()
            orig = opt._broadcast_params_from_rank
        except Exception as e:  # noqa: BLE001 - private: fail soft
            reg.missing("ZeroRedundancyOptimizer._broadcast_params_from_rank", repr(e))
            return

        def _broadcast_params_from_rank(rank):
            prev, self.broadcasting = self.broadcasting, True
            try:
                return orig(rank)
            finally:
                self.broadcasting = prev

        shadow_attr(opt, "_broadcast_params_from_rank", _broadcast_params_from_rank,
                    plan if plan is not None else undo)
        reg.ok("ZeroRedundancyOptimizer._broadcast_params_from_rank")
        live = [plan is None]  # instrument(): on until its undo; a plan: while installed
        if plan is None:
            undo.append(lambda: live.__setitem__(0, False))
        else:
            plan.call(lambda: live.__setitem__(0, True), lambda: live.__setitem__(0, False))
        install_dist_proxy(zmod, _ZeroDistProxy(getattr(zmod, "dist", None), self, live),
                           "zero_redundancy_optimizer.dist (broadcast proxy)", reg, undo,
                           plan=plan)
        if self.timer.device:
            self._install_sync_window(opt, undo, plan)

    def _install_sync_window(self, opt, undo: list, plan=None) -> None:
        """CUDA: `_sync_params` issues every broadcast, then makes the compute stream wait
        for them: its span is the broadcasts' exposure window."""
        reg, rec, timer = self.registry, self.rec, self.timer
        try:
            orig = opt._sync_params
        except AttributeError as e:
            reg.missing("ZeroRedundancyOptimizer._sync_params", repr(e))
            return
        fw = rec.framework_bucket(UNIT, OPTIMIZER)  # the unit's own framework time

        def _sync_params(*args, **kwargs):
            if not self.active:
                return orig(*args, **kwargs)
            rec.phase = OPTIMIZER
            rec.push(fw)
            timer.arrive(UNIT)
            try:
                return orig(*args, **kwargs)
            finally:
                rec.remove(fw)
                timer.ready(UNIT, (BROADCAST,))

        shadow_attr(opt, "_sync_params", _sync_params, plan if plan is not None else undo)
        reg.ok("ZeroRedundancyOptimizer._sync_params")
