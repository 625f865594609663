"""FSDP2 (`fully_shard`) instrumentation: units, collectives, per-unit compute.

A *unit* is each module `fully_shard` was applied to, named by its module path ("(root)" for
the model itself). Per unit we install:
- an all-gather and a reduce-scatter comm object that delegate to the one FSDP already had
  and time the call (public `set_custom_all_gather` / `set_custom_reduce_scatter`, or the
  param group's private `_all_gather_comm` / `_reduce_scatter_comm` where the public call
  refuses, e.g. several param groups);
- forward hooks on both sides of FSDP's own (prepend / append) that switch the recorder's
  clock between "framework" and the unit's compute;
- instance wrappers of the param group's `pre_backward` / `post_backward` doing the same in
  backward (there is no public per-unit backward hook).
On CUDA the same switches open and close the exposure windows of `cuda.py`: pre-forward and
pre-backward (where FSDP makes the compute stream wait for the unit's all-gather),
post-backward (where it waits for the previous unit's reduce-scatter) and, from an autograd
callback queued behind FSDP's own final callback, the end of backward.
All of it is built once (`build_plan`, at attach: closures, comm objects, which hook dict
entries and attributes) and put in place / taken out at each detail step
(`detailplan.DetailPlan`). Hook points: see `hookpoints.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import hookpoints as hp
from .comm import HostTimer
from .detailplan import DetailPlan
from .slowlink import SlowLink
from .recorder import (
    ALL_GATHER, ALL_REDUCE, BACKWARD, B_FRAMEWORK, REDUCE_SCATTER, Recorder, unit_bucket,
)
from ..runmodel import UnitFacts
from .adapters import Adapter, AdapterFacts
from .wiring import (
    DistProxy, dtype_name as _dtype_name, install_dist_proxy, install_forward_hooks,
    nbytes as _nbytes, torch_version, unit_facts_placeholder,
)

ROOT_NAME = "(root)"
REDUCTIONS = (REDUCE_SCATTER, ALL_REDUCE)
_SYNC = {"async_op": False}  # the collectives' keyword arguments (never mutated)
_ASYNC = {"async_op": True}


@dataclass
class Unit:
    index: int
    name: str
    module: Any
    groups: list[Any]
    is_root: bool
    facts: UnitFacts | None = None


@dataclass
class FSDP2Info:
    units: list[Unit]
    mesh_shape: tuple[int, ...] = ()
    mesh_dim_names: tuple[str, ...] | None = None
    param_dtype: str = ""
    reduce_dtype: str = ""
    zero_stage: int | None = None


def discover(model, registry: hp.HookRegistry) -> list[Unit] | None:
    """The FSDP2 units of `model`, outermost first; None if `model` is not FSDP2."""
    cls = hp.fsdp2_module_class()
    if cls is None:
        return None
    units: list[Unit] = []
    by_group: dict[int, Unit] = {}
    also: dict[int, list[str]] = {}
    for name, mod in model.named_modules():
        if not isinstance(mod, cls):
            continue
        try:
            groups = hp.fsdp2_param_groups(mod)
            registry.ok("FSDPState._fsdp_param_groups")
        except Exception as e:  # private: fail soft
            registry.missing("FSDPState._fsdp_param_groups", repr(e))
            groups = []
        # `fully_shard([m1, m2, ...])` (e.g. Accelerate's tied embedding + final norm + head):
        # one FSDP state, one param group, several modules. It is one unit (one all-gather),
        # named after all its modules; its forward compute is timed on the first one.
        shared = next((by_group[id(g)] for g in groups if id(g) in by_group), None)
        if shared is not None:
            also.setdefault(shared.index, []).append(name or ROOT_NAME)
            continue
        is_root = not any(p.name == "" or name.startswith(p.name + ".") for p in units)
        units.append(Unit(len(units), name, mod, groups, is_root))
        by_group.update((id(g), units[-1]) for g in groups)
    if not units:
        return None
    for u in units:
        if u.name == "":
            u.name = ROOT_NAME
        if u.index in also:
            u.name = "+".join([u.name, *also[u.index]])
    return units


def unit_facts(u: Unit) -> UnitFacts:
    params = param_bytes = gather_bytes = sharded_bytes = tensors = 0
    reshard = None
    group_size = replicate = 1
    pdt = rdt = ""
    for g in u.groups:
        mp = getattr(g, "mp_policy", None)
        for fp in getattr(g, "fsdp_params", ()):
            numel = fp._orig_size.numel()
            tensors += 1
            # dtype attrs on FSDPParam are set lazily (first forward): read the policy.
            orig = fp.sharded_param.dtype
            gdt = getattr(mp, "param_dtype", None) or orig
            params += numel
            param_bytes += numel * orig.itemsize
            # FSDP pads dim 0 to a multiple of the shard group size: the all-gather moves
            # padded bytes.
            padded = fp.padded_sharded_param_size.numel()
            ws = g.mesh_info.shard_mesh_size if hasattr(g.mesh_info, "shard_mesh_size") else 1
            gather_bytes += padded * ws * gdt.itemsize
            sharded_bytes += fp.sharded_param.to_local().numel() * orig.itemsize
            pdt = _dtype_name(gdt)
            rdt = _dtype_name(getattr(mp, "reduce_dtype", None) or gdt)
        mi = g.mesh_info
        group_size = getattr(mi, "shard_mesh_size", 1)
        replicate = getattr(mi, "replicate_mesh_size", 1)
        reshard = getattr(g, "post_forward_mesh_info", None) is not None
    if reshard and u.is_root and _root_keeps_params(u):
        reshard = False  # FSDP2 does not reshard a root after forward (hookpoints.py)
    return UnitFacts(name=u.name, params=params, param_bytes=param_bytes,
                     gather_bytes=gather_bytes, sharded_bytes=sharded_bytes,
                     reshard_after_forward=reshard, group_size=group_size,
                     param_dtype=pdt, reduce_dtype=rdt, replicate_size=replicate,
                     tensors=tensors)


def _root_keeps_params(u: Unit) -> bool:
    try:
        return hp.fsdp2_root_keeps_params(u.module)
    except Exception:  # noqa: BLE001 - private: keep what the param group says
        return False


_COMM_CLASSES: tuple | None = None


def _comm_classes():
    """The two wrapper classes, made once per process (a class statement per install cost
    ~50 us)."""
    global _COMM_CLASSES
    if _COMM_CLASSES is None:
        _COMM_CLASSES = _make_comm_classes()
    return _COMM_CLASSES


def _make_comm_classes():
    AllGatherBase, ReduceScatterBase = hp.fsdp2_comm_bases()
    ag_bases = (AllGatherBase,) if AllGatherBase is not None else ()
    rs_bases = (ReduceScatterBase,) if ReduceScatterBase is not None else ()

    class InstrumentedAllGather(*ag_bases):
        """Times each all-gather of one unit; delegates everything to FSDP's comm."""

        def __init__(self, inner, timer: HostTimer, unit: int):
            self.inner, self.timer, self.unit = inner, timer, unit
            # Host timer: the direct paths (no argument packing).
            self.host = not timer.device

        def allocate(self, size, *, dtype, device):
            return self.inner.allocate(size, dtype=dtype, device=device)

        def __call__(self, output_tensor, input_tensor, group, async_op=False):
            order = self.timer.order
            if order is not None:  # its sequence number (collorder.py)
                order.issued(group, self.unit, ALL_GATHER)
            if self.host:
                if async_op:
                    return self.timer.async_call3(self.inner, output_tensor, input_tensor,
                                                  group, self.unit, ALL_GATHER,
                                                  output_tensor.nbytes)
                return self.timer.sync_call(self.inner, (output_tensor, input_tensor, group),
                                            _SYNC, self.unit, ALL_GATHER, output_tensor.nbytes)
            return self.timer.call(self.inner, (output_tensor, input_tensor, group),
                                   _ASYNC if async_op else _SYNC, self.unit, ALL_GATHER,
                                   output_tensor.nbytes, async_op, group)

    class InstrumentedReduceScatter(*rs_bases):
        def __init__(self, inner, timer: HostTimer, unit: int):
            self.inner, self.timer, self.unit = inner, timer, unit

        def allocate(self, size, *, dtype, device):
            return self.inner.allocate(size, dtype=dtype, device=device)

        def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
            order = self.timer.order
            if order is not None:
                order.issued(group, self.unit, REDUCE_SCATTER)
            return self.timer.call(self.inner, (output_tensor, input_tensor, group, op),
                                   _ASYNC if async_op else _SYNC, self.unit, REDUCE_SCATTER,
                                   input_tensor.nbytes, async_op, group)

    return InstrumentedAllGather, InstrumentedReduceScatter


def _install_comm(u: Unit, comm, public_setter: str, private_attr: str, hook: str,
                  registry: hp.HookRegistry, plan: DetailPlan) -> None:
    """Put `comm` on every param group of `u` at each install; prefer the public setter.
    Tried once here: where it only sets the param groups' `private_attr` (torch 2.8-2.13),
    each install sets that attribute itself (what the setter does, without its checks); a
    setter that keeps the comm elsewhere is called at each install."""
    if not u.groups:
        return
    olds = [(g, getattr(g, private_attr)) for g in u.groups]
    setter = getattr(u.module, public_setter, None)
    try:
        if setter is None or len(u.groups) > 1:
            raise ValueError("public setter unavailable")
        setter(comm)
    except Exception:
        registry.ok(f"FSDPParamGroup.{private_attr}")
    else:
        registry.ok(f"FSDPModule.{public_setter}")
        placed = all(getattr(g, private_attr) is comm for g in u.groups)
        for g, old in olds:
            setattr(g, private_attr, old)  # installed at the detail steps only
        if not placed:
            plan.call(lambda: setter(comm),
                      lambda: [setattr(g, private_attr, old) for g, old in olds])
            return
    for g in u.groups:
        plan.attr(g, private_attr, comm)


class _DistProxy(DistProxy):
    """`torch.distributed` inside FSDP2's collectives module only, so the HSDP all-reduce
    (called as `dist.all_reduce`, no comm object) is timed and attributed to the unit whose
    post_backward is running. Everything else passes through."""

    def __init__(self, real, timer: HostTimer, current: list):
        super().__init__(real)
        self._timer, self._current = timer, current

    def all_reduce(self, tensor, *args, **kwargs):
        unit = self._current[0]
        if unit is None or kwargs.get("async_op") or len(args) > 2:
            return self._real.all_reduce(tensor, *args, **kwargs)
        return self._timer.sync_call(self._real.all_reduce, (tensor, *args), kwargs, unit,
                                     ALL_REDUCE, _nbytes(tensor))


def instrument(units: list[Unit], rec: Recorder, timer: HostTimer,
               registry: hp.HookRegistry, on_root_forward, slow_link_s: float = 0.0) -> list:
    """Install all per-unit instrumentation now; returns undo callables."""
    plan = build_plan(units, rec, timer, registry, on_root_forward, slow_link_s)
    plan.install()
    return [plan.remove]


def build_plan(units: list[Unit], rec: Recorder, timer: HostTimer,
               registry: hp.HookRegistry, on_root_forward,
               slow_link_s: float = 0.0) -> DetailPlan:
    """All per-unit instrumentation, built and not installed (`DetailPlan.install`)."""
    plan = DetailPlan(rec, timer)
    reducing = [None]  # index of the unit whose post_backward runs (HSDP all-reduce)
    if any(getattr(g, "_is_hsdp", False) for u in units for g in u.groups):
        mod = hp.fsdp2_collectives_module()
        install_dist_proxy(mod, _DistProxy(getattr(mod, "dist", None), timer, reducing),
                           "_fsdp_collectives.dist (HSDP all-reduce)", registry, None,
                           plan=plan)
    AG, RS = _comm_classes()
    tail = _TailWindow(timer, registry) if timer.device else None
    if tail is not None:  # a backward that raised left it queued: each sample starts afresh
        plan.call(tail.reset, _nothing)
    _wrap_prefetch(rec, registry, plan, units)
    for u in units:
        # --- collectives ---------------------------------------------------------
        try:
            if u.groups:
                inner_ag = u.groups[0]._all_gather_comm
                if slow_link_s > 0:
                    inner_ag = SlowLink(inner_ag, slow_link_s)
                inner_rs = u.groups[0]._reduce_scatter_comm
                _install_comm(u, AG(inner_ag, timer, u.index), "set_custom_all_gather",
                              "_all_gather_comm", "all_gather", registry, plan)
                _install_comm(u, RS(inner_rs, timer, u.index), "set_custom_reduce_scatter",
                              "_reduce_scatter_comm", "reduce_scatter", registry, plan)
        except Exception as e:
            registry.missing("FSDPParamGroup._all_gather_comm", repr(e))

        # --- forward compute (and the CUDA pre-forward window) ----------------------
        install_forward_hooks(
            u.module, u.module, rec, timer, u.index, registry, None,
            on_root_forward=on_root_forward if u.is_root else None,
            # After the root's forward, collectives belong to backward (public hooks only:
            # holds even if the private backward wrappers are unavailable).
            post_extra=_to_backward(rec) if u.is_root else None, plan=plan)

        # --- backward compute ----------------------------------------------------
        for g in u.groups:
            try:
                _wrap_backward(g, u.index, rec, timer, registry, plan, reducing, tail)
            except Exception as e:
                registry.missing("FSDPParamGroup.pre_backward/post_backward", repr(e))
    return plan


def _nothing() -> None:
    pass


def _wrap_prefetch(rec: Recorder, registry: hp.HookRegistry, plan: DetailPlan,
                   units: list[Unit] = ()) -> None:
    """Prefetch (FSDP's own in backward, `set_modules_to_forward_prefetch` /
    `..._backward_prefetch`) is framework work, of the unit prefetched (its copy-in, charged
    to that unit's framework bucket; a param group of no unit's: to "framework"). Forward
    prefetch runs inside FSDP's pre-forward hook (framework already); backward prefetch runs
    in `FSDPState._pre_backward` *after* the param group's `pre_backward` returned, when the
    unit's backward bucket is already current: without this its host time, and on CUDA the
    copy-in kernels it puts on the compute stream, were booked as the unit's compute (the
    first H100 run: ~0.75 ms per unit and step)."""
    try:
        cls = hp.fsdp2_param_group_class()
        orig = cls.__dict__["_prefetch_unshard"]
        fn = orig.__func__ if isinstance(orig, staticmethod) else None
        if fn is None:
            raise TypeError(f"not a staticmethod: {type(orig).__name__}")
    except Exception as e:
        registry.missing("FSDPParamGroup._prefetch_unshard", repr(e))
        return

    # the framework bucket (forward's: + the phase) of each param group's unit; a group of
    # no unit's: "framework" (one dict lookup per prefetch: the unit's bytes are its own)
    fw_of = {id(g): rec.framework_bucket(u.index, 0) for u in units for g in u.groups}

    def _prefetch_unshard(*args, **kwargs):
        b = fw_of.get(id(args[0])) if args else None
        b = B_FRAMEWORK if b is None else b + rec.phase
        rec.push(b)
        try:
            return fn(*args, **kwargs)
        finally:
            rec.remove(b)

    plan.attr(cls, "_prefetch_unshard", staticmethod(_prefetch_unshard))
    # Reported only when missing (a refinement of the backward hook point's numbers): each
    # hook point reported is a series on every rank, inside the series budget.


def _to_backward(rec: Recorder):
    def post(out) -> None:
        rec.phase = BACKWARD
    return post


class _TailWindow:
    """CUDA: once per backward, an autograd callback queued behind FSDP's final callback
    (queued by the root's pre-backward, which runs before any unit's) closes the window of
    the end-of-backward wait for the last reduce-scatters / all-reduces."""

    def __init__(self, timer, registry: hp.HookRegistry):
        self.timer, self.registry = timer, registry
        self.queued = False

    def queue(self) -> None:
        if self.queued:
            return
        try:
            hp.queue_autograd_callback(self._run)
            self.queued = True
            self.registry.ok("Variable._execution_engine.queue_callback")
        except Exception as e:
            self.registry.missing("Variable._execution_engine.queue_callback", repr(e))

    def reset(self) -> None:
        self.queued = False

    def _run(self) -> None:
        self.queued = False
        try:
            self.timer.tail(REDUCTIONS)
        except Exception as e:
            self.registry.error("fsdp2.backward_tail", e)


def _wrap_backward(g, idx: int, rec: Recorder, timer, registry: hp.HookRegistry,
                   plan: DetailPlan, reducing: list, tail: _TailWindow | None) -> None:
    orig_pre = g.pre_backward
    orig_post = g.post_backward
    bwd_bucket = unit_bucket(idx, BACKWARD)
    fw_bucket = rec.framework_bucket(idx, BACKWARD)  # the unit's own framework time
    push, switch, remove = rec.push, rec.switch, rec.remove
    window = timer.device  # the host timer's window marks are no-ops: not called

    def pre_backward(*args, **kwargs):
        rec.phase = BACKWARD
        first = bwd_bucket not in rec.stack  # FSDP runs it once per output; once is work
        push(fw_bucket)
        if first and window:
            timer.arrive(idx)
            if tail is not None:
                tail.queue()
        try:
            return orig_pre(*args, **kwargs)
        finally:
            if first:
                switch(fw_bucket, bwd_bucket)
                if window:
                    timer.ready(idx)
            else:
                remove(fw_bucket)

    def post_backward(*args, **kwargs):
        switch(bwd_bucket, fw_bucket)
        if window:
            # CUDA: FSDP makes the compute stream wait for the previous reduce-scatter here.
            timer.arrive(idx, claim=REDUCTIONS)
        reducing[0] = idx
        try:
            return orig_post(*args, **kwargs)
        finally:
            reducing[0] = None
            remove(fw_bucket)
            if window:
                timer.ready(idx, ())

    # instance attributes over the class's methods (removal deletes them again)
    plan.attr(g, "pre_backward", pre_backward)
    plan.attr(g, "post_backward", post_backward)
    registry.ok("FSDPParamGroup.pre_backward/post_backward")


def describe(units: list[Unit], registry: hp.HookRegistry) -> FSDP2Info:
    """Static facts of an FSDP2 model."""
    info = FSDP2Info(units=units)
    reshards = []
    for u in units:
        try:
            u.facts = unit_facts(u)
        except Exception as e:  # private attributes: fail soft, keep the unit's name
            registry.missing("FSDPParam attributes (unit facts)", repr(e))
            u.facts = unit_facts_placeholder(u.name)
        if u.facts.reshard_after_forward is not None:
            reshards.append(u.facts.reshard_after_forward)
        if u.groups and not info.mesh_shape:
            mesh = u.groups[0].mesh_info.mesh
            info.mesh_shape = tuple(int(x) for x in mesh.shape)
            names = getattr(mesh, "mesh_dim_names", None)
            info.mesh_dim_names = tuple(names) if names else None
            info.param_dtype = u.facts.param_dtype
            info.reduce_dtype = u.facts.reduce_dtype
    if reshards:
        info.zero_stage = 3 if any(reshards) else 2
    return info


class FSDP2Adapter(Adapter):
    """`fully_shard` (FSDP2): units are the modules fully_shard was applied to."""

    framework = "fsdp2"

    @classmethod
    def detect(cls, model, optimizer) -> bool:
        fsdp_cls = hp.fsdp2_module_class()
        return fsdp_cls is not None and any(isinstance(m, fsdp_cls) for m in model.modules())

    def discover(self) -> None:
        self.units = discover(self.model, self.registry) or []
        self.unit_names = [u.name for u in self.units]

    def facts(self) -> AdapterFacts:
        info = describe(self.units, self.registry)
        return AdapterFacts(
            framework=self.framework, framework_version=torch_version(),
            units=[u.facts for u in self.units if u.facts is not None],
            zero_stage=info.zero_stage, mesh_shape=info.mesh_shape,
            mesh_dim_names=info.mesh_dim_names, param_dtype=info.param_dtype,
            reduce_dtype=info.reduce_dtype,
            extra={"prefetch": hp.fsdp2_prefetch_facts([u.module for u in self.units])})

    def instrument(self, rec, timer, on_root_forward, slow_link_s: float) -> list:
        return instrument(self.units, rec, timer, self.registry, on_root_forward, slow_link_s)

    def plan(self, rec, timer, on_root_forward, slow_link_s: float) -> DetailPlan:
        return build_plan(self.units, rec, timer, self.registry, on_root_forward, slow_link_s)
