"""FSDP1 (`FullyShardedDataParallel`) instrumentation: units, collectives, per-unit compute.

A *unit* is each FullyShardedDataParallel instance (one per module an auto-wrap policy or
a manual wrap chose), named by the module path of the module it wraps with FSDP's own
prefixes removed ("(root)" for the outermost). Each unit owns one `FlatParamHandle`.

Per unit we install:
- an instance wrapper of the handle's `_all_gather_flat_param` (FSDP1's all-gather; on CPU
  it calls `dist.all_gather` in list form, synchronously): count, output bytes (the padded
  unsharded flat parameter), time; all exposed, as the call blocks the compute thread;
- forward hooks on the FSDP instance (outside FSDP's pre/post-forward, which runs inside
  `FullyShardedDataParallel.forward`) and on the wrapped module (inside it), switching the
  recorder's clock between "framework" and the unit's compute.
Once per adapter (module globals of `torch.distributed.fsdp._runtime_utils`, looked up by
FSDP at call time and restored by the undo):
- `_pre_backward_hook` / `_post_backward_hook`: a unit's backward compute (they are bound
  into `functools.partial`s at every forward, so attach before the forward you want seen);
- `_reduce_grad` / `_reduce_grad_no_shard`: which unit's gradient is being reduced, and
  a proxy for that module's `dist` reference timing `reduce_scatter_single` (sharded
  strategies), `all_reduce` (NO_SHARD; HSDP's inter-group all-reduce) on their own.
Handles the adapter does not know (another model) pass through untouched. On CUDA the
switches open and close the exposure windows of `cuda.py` (pre-forward, pre-backward; the
end-of-backward wait on the post-backward stream from an autograd callback queued behind
FSDP's final callback). On a detail step every wrapped collective is noted in the step's
collective order (`collorder.py`) with its unit and the group it runs on (the handle's
process group; the reduction's `group=`, HSDP's inter-node all-reduce included), so that a
flight-recorder dump's sequence number names it. Hook points: see `hookpoints.py`. Strategy -> equivalent ZeRO
stage: docs/frameworks.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from time import perf_counter
from typing import Any

from . import hookpoints as hp
from .adapters import Adapter, AdapterFacts
from .detailplan import DetailPlan
from .recorder import (
    ALL_GATHER, ALL_REDUCE, BACKWARD, B_FRAMEWORK, REDUCE_SCATTER, unit_bucket,
)
from .slowlink import SlowLink
from .wiring import (
    DistProxy, dtype_name as _dtype_name, install_dist_proxy, install_forward_hooks,
    nbytes as _nbytes, torch_version, unit_facts_placeholder,
)
from ..runmodel import UnitFacts

ROOT_NAME = "(root)"
# FSDP1 ShardingStrategy name -> equivalent ZeRO stage (0: plain data parallel).
ZERO_STAGE = {"FULL_SHARD": 3, "HYBRID_SHARD": 3, "SHARD_GRAD_OP": 2,
              "_HYBRID_SHARD_ZERO2": 2, "NO_SHARD": 0}
_HYBRID = ("HYBRID_SHARD", "_HYBRID_SHARD_ZERO2")
_WRAPPER_PREFIXES = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.",
                     "_offload_wrapped_module.")


def _enum_name(v) -> str | None:
    return None if v is None else getattr(v, "name", str(v))


def clean_name(path: str) -> str:
    """Module path without FSDP's (and activation checkpointing's) wrapper segments."""
    path += "."
    for p in _WRAPPER_PREFIXES:
        path = path.replace(p, "")
    return path.rstrip(".") or ROOT_NAME


@dataclass
class Unit:
    index: int
    name: str
    module: Any  # the FullyShardedDataParallel instance
    handle: Any  # its FlatParamHandle (None: the unit owns no parameters)
    is_root: bool
    facts: UnitFacts | None = None


def discover(model, registry: hp.HookRegistry) -> list[Unit]:
    """The FSDP1 units of `model`, outermost first (empty if none)."""
    cls = hp.fsdp1_class()
    if cls is None:
        return []
    units: list[Unit] = []
    paths: list[str] = []
    for path, mod in model.named_modules():
        if not isinstance(mod, cls):
            continue
        try:
            handle = mod._handle
            registry.ok("FSDP._handle")
        except AttributeError as e:
            registry.missing("FSDP._handle", repr(e))
            handle = None
        is_root = not any(p == "" or path.startswith(p + ".") for p in paths)
        paths.append(path)
        units.append(Unit(len(units), clean_name(path), mod, handle, is_root))
    return units


def strategy_name(u: Unit) -> str | None:
    return _enum_name(getattr(u.module, "sharding_strategy", None))


def unit_facts(u: Unit) -> UnitFacts:
    h = u.handle
    if h is None:
        return unit_facts_placeholder(u.name)
    fp = h.flat_param
    orig = getattr(h, "_orig_param_dtype", None) or fp.dtype
    gdt = getattr(h, "_fwd_bwd_param_dtype", None) or orig
    rdt = getattr(h, "_reduce_dtype", None) or gdt
    params = fp._unpadded_unsharded_size.numel()
    shard = fp._sharded_size.numel()  # this rank's shard, padded (NO_SHARD: everything)
    sharded = h.uses_sharded_strategy
    ws = h.world_size if sharded else 1
    strategy = strategy_name(u)
    # The root's parameters stay gathered after forward under FULL_SHARD (FSDP1 frees them
    # in post-forward only for non-roots); SHARD_GRAD_OP-like strategies never reshard there.
    reshard = (ZERO_STAGE.get(strategy or "", 0) == 3 and not u.is_root) if sharded else None
    group = h.world_size if sharded else h.process_group.size()
    replicate = group  # NO_SHARD: the gradient all-reduce spans the whole group
    if sharded:
        inter = getattr(u.module, "_inter_node_pg", None)  # HSDP: the replicate group
        replicate = inter.size() if inter is not None and strategy in _HYBRID else 1
    return UnitFacts(
        name=u.name, params=params, param_bytes=params * orig.itemsize,
        # FSDP pads the flat parameter to a multiple of the group size; the all-gather
        # moves the padded bytes (NO_SHARD gathers nothing: its compute-time bytes).
        gather_bytes=shard * ws * gdt.itemsize if sharded else params * gdt.itemsize,
        sharded_bytes=shard * orig.itemsize,
        reshard_after_forward=reshard,
        group_size=group, replicate_size=replicate,
        param_dtype=_dtype_name(gdt), reduce_dtype=_dtype_name(rdt),
        tensors=_num_params(fp))


def _num_params(fp) -> int | None:
    """The original parameters flattened into the unit's FlatParameter (None: unknown)."""
    n = getattr(fp, "_num_params", None)
    return n if isinstance(n, int) and n >= 0 else None


class _DistProxy(DistProxy):
    """Stands in for `torch.distributed` inside FSDP1's `_runtime_utils` only. While a known
    unit's gradient is reduced (`adapter.reducing` set) its reduce-scatter / all-reduce are
    timed and attributed to that unit; otherwise everything passes through."""

    def __init__(self, real, adapter: "FSDP1Adapter", live: list):
        super().__init__(real)
        self._a = adapter
        self._live = live  # its plan's: [True] while that plan is installed

    def _timed(self, name: str, coll: int, tensor, args, kwargs):
        fn = getattr(self._real, name)
        a = self._a
        unit = a.reducing
        if unit is None or not self._live[0]:
            return fn(*args, **kwargs)
        a.reduce_calls += 1
        if coll == ALL_REDUCE and a.delay_all_reduce_s > 0:
            fn = SlowLink(fn, a.delay_all_reduce_s)  # NO_SHARD: see FSDP1Adapter.instrument
        group, order = kwargs.get("group"), a.timer.order
        # its sequence number(s) (collorder.py): a `reduce_scatter_single` may be several
        token = order.begin(group, unit, coll) if order is not None else None
        try:
            return a.timer.call(fn, args, kwargs, unit, coll, _nbytes(tensor),
                                bool(kwargs.get("async_op", False)), group)
        finally:
            if token is not None:
                order.end(token)

    def reduce_scatter_single(self, output, input, *args, **kwargs):  # noqa: A002
        return self._timed("reduce_scatter_single", REDUCE_SCATTER, input,
                           (output, input, *args), kwargs)

    def reduce_scatter_tensor(self, output, input, *args, **kwargs):  # torch < 2.13
        return self._timed("reduce_scatter_tensor", REDUCE_SCATTER, input,
                           (output, input, *args), kwargs)

    def all_reduce(self, tensor, *args, **kwargs):
        return self._timed("all_reduce", ALL_REDUCE, tensor, (tensor, *args), kwargs)


class FSDP1Adapter(Adapter):
    """`FullyShardedDataParallel` (FSDP1): units are the FSDP instances."""

    framework = "fsdp1"

    @classmethod
    def detect(cls, model, optimizer) -> bool:
        fsdp_cls = hp.fsdp1_class()
        return fsdp_cls is not None and any(isinstance(m, fsdp_cls) for m in model.modules())

    def discover(self) -> None:
        self.units = discover(self.model, self.registry)
        self.unit_names = [u.name for u in self.units]
        self.by_handle = {id(u.handle): u.index for u in self.units if u.handle is not None}
        self.active = False
        self.reducing: int | None = None
        self.reduce_calls = 0
        self.delay_all_reduce_s = 0.0
        self._tail_queued = False

    # --- static facts ---------------------------------------------------------------
    def facts(self) -> AdapterFacts:
        units = []
        for u in self.units:
            try:
                u.facts = unit_facts(u)
                self.registry.ok("FlatParamHandle attributes (unit facts)")
            except Exception as e:  # private attributes: fail soft, keep the unit's name
                self.registry.missing("FlatParamHandle attributes (unit facts)", repr(e))
                u.facts = unit_facts_placeholder(u.name)
            units.append(u.facts)
        strategies = sorted({s for s in (strategy_name(u) for u in self.units) if s})
        stages = [ZERO_STAGE[s] for s in strategies if s in ZERO_STAGE]
        root = next((u for u in self.units if u.is_root), None)
        extra: dict[str, Any] = {}
        mesh_shape: tuple[int, ...] = ()
        mesh_names = None
        if root is not None:
            m = root.module
            off = getattr(m, "cpu_offload", None)
            extra = {
                "sharding_strategy": "+".join(strategies) if strategies else None,
                "backward_prefetch": _enum_name(getattr(m, "backward_prefetch", None)),
                "limit_all_gathers": getattr(m, "limit_all_gathers", None),
                "forward_prefetch": getattr(m, "forward_prefetch", None),
                "cpu_offload": getattr(off, "offload_params", None) if off is not None else None,
                "use_orig_params": getattr(m, "_use_orig_params", None),
            }
            mesh_shape, mesh_names = self._mesh(root)
        pdt = next((f.param_dtype for f in units if f.param_dtype), "")
        rdt = next((f.reduce_dtype for f in units if f.reduce_dtype), "")
        return AdapterFacts(
            framework=self.framework, framework_version=torch_version(), units=units,
            zero_stage=max(stages) if stages else None, mesh_shape=mesh_shape,
            mesh_dim_names=mesh_names, param_dtype=pdt, reduce_dtype=rdt, extra=extra)

    def _mesh(self, root: Unit) -> tuple[tuple[int, ...], tuple[str, ...] | None]:
        m = root.module
        try:
            shard = m.process_group.size()
            inter = getattr(m, "_inter_node_pg", None)  # HSDP only
            if strategy_name(root) in _HYBRID and inter is not None:
                return (inter.size(), shard), ("replicate", "shard")
            return (shard,), None
        except Exception as e:
            self.registry.missing("FSDP.process_group / _inter_node_pg", repr(e))
            return (), None

    # --- instrumentation ------------------------------------------------------------
    def instrument(self, rec, timer, on_root_forward, slow_link_s: float) -> list:
        plan = self.plan(rec, timer, on_root_forward, slow_link_s)
        plan.install()
        return [plan.remove]

    def plan(self, rec, timer, on_root_forward, slow_link_s: float) -> DetailPlan:
        """All per-unit instrumentation, built once (`detailplan.py`): installed at each
        detail step's start, removed at its end."""
        self.rec, self.timer = rec, timer
        # The simulated slow link delays the all-gathers; NO_SHARD gathers nothing, so
        # there it delays the gradient all-reduce instead (as for DDP).
        self.delay_all_reduce_s = slow_link_s if self._facts_stage() == 0 else 0.0
        plan = DetailPlan(rec, timer)
        # This plan's own switch. Module globals wrapped by another tool since our install
        # keep our wrapper inside their chain after removal (`only_if_ours`); a plan rebuilt
        # over them wraps that chain again. The old plan's wrappers read its own cell, off
        # for good once it is dropped: they pass through and never charge a second time.
        live = [False]

        def activate() -> None:
            self.active = live[0] = True
            self._tail_queued = False  # a backward that raised dropped its callback

        def deactivate() -> None:
            self.active = live[0] = False
        plan.call(activate, deactivate)
        for u in self.units:
            self._instrument_unit(u, on_root_forward, slow_link_s, plan)
        self._install_globals(plan, live)
        return plan

    def _facts_stage(self) -> int | None:
        stages = [ZERO_STAGE.get(strategy_name(u) or "") for u in self.units]
        stages = [x for x in stages if x is not None]
        return max(stages) if stages else None

    def _instrument_unit(self, u: Unit, on_root_forward, slow_link_s: float,
                         plan: DetailPlan) -> None:
        rec, timer, reg = self.rec, self.timer, self.registry
        idx = u.index
        # --- all-gather --------------------------------------------------------------
        h = u.handle
        if h is not None and h.uses_sharded_strategy:
            try:
                orig = h._all_gather_flat_param
                inner = orig
                if slow_link_s > 0:  # a simulated slow link beneath the measurement
                    slow = SlowLink(lambda t, async_op=False: orig(t), slow_link_s)
                    inner = slow

                pg = getattr(h, "process_group", None)

                def all_gather_flat_param(padded_unsharded, _inner=inner, _idx=idx, _pg=pg):
                    if not self.active:
                        return orig(padded_unsharded)
                    order = timer.order
                    if order is not None:  # its sequence number (collorder.py)
                        order.issued(_pg, _idx, ALL_GATHER)
                    return timer.call(_inner, (padded_unsharded,), {}, _idx, ALL_GATHER,
                                      _nbytes(padded_unsharded), False, _pg)

                plan.attr(h, "_all_gather_flat_param", all_gather_flat_param)  # instance
                reg.ok("FlatParamHandle._all_gather_flat_param")
            except AttributeError as e:
                reg.missing("FlatParamHandle._all_gather_flat_param", repr(e))

        # --- forward compute: outside and inside FSDP's own pre/post-forward ------------
        try:
            inner_mod = u.module.module  # public: the wrapped module
        except AttributeError as e:
            reg.missing("FSDP.module", repr(e))
            return
        install_forward_hooks(
            u.module, inner_mod, rec, timer, idx, reg, None,
            on_root_forward=on_root_forward if u.is_root else None,
            post_extra=self._to_backward if u.is_root else None, plan=plan)

    def _to_backward(self, out) -> None:
        self.rec.phase = BACKWARD  # collectives after the root's forward belong to backward

    def _install_globals(self, plan: DetailPlan, live: list) -> None:
        """Wrap FSDP1's backward hooks and gradient reduction (module globals)."""
        reg = self.registry
        try:
            ru = hp.fsdp1_runtime()
        except Exception as e:  # noqa: BLE001 - a private module: fail soft
            reg.missing("fsdp._runtime_utils", repr(e))
            return
        rec, timer, by_handle = self.rec, self.timer, self.by_handle

        def wrap(name: str, make) -> None:
            orig = getattr(ru, name, None)
            if orig is None or not callable(orig):
                reg.missing(f"_runtime_utils.{name}", "not found")
                return
            # (another tool's wrapper installed over ours since stays: swap_attr's rule)
            plan.attr(ru, name, make(orig), only_if_ours=True)
            reg.ok(f"_runtime_utils.{name}")

        def make_pre(orig):
            def _pre_backward_hook(state, module, handle, *args, **kwargs):
                idx = by_handle.get(id(handle)) if live[0] else None
                if idx is None:
                    return orig(state, module, handle, *args, **kwargs)
                bucket = unit_bucket(idx, BACKWARD)
                rec.phase = BACKWARD
                if rec.has(bucket):  # FSDP runs it once per output tensor; once is work
                    return orig(state, module, handle, *args, **kwargs)
                fw = rec.framework_bucket(idx, BACKWARD)
                rec.push(fw)
                timer.arrive(idx)
                try:
                    return orig(state, module, handle, *args, **kwargs)
                finally:
                    rec.switch(fw, bucket)
                    timer.ready(idx)
                    if timer.device and not self._tail_queued:
                        # Behind FSDP's final callback (queued by the root's first
                        # pre-backward hook, inside `orig`): the end-of-backward wait.
                        self._queue_tail()
            return _pre_backward_hook

        def make_post(orig):
            def _post_backward_hook(state, handle, *args, **kwargs):
                idx = by_handle.get(id(handle)) if live[0] else None
                if idx is None:
                    return orig(state, handle, *args, **kwargs)
                fw = rec.framework_bucket(idx, BACKWARD)
                rec.switch(unit_bucket(idx, BACKWARD), fw)
                try:
                    return orig(state, handle, *args, **kwargs)
                finally:
                    rec.remove(fw)
            return _post_backward_hook

        def make_reduce(coll: int):
            def make(orig):
                def reduce(state, handle, *args, **kwargs):
                    idx = by_handle.get(id(handle)) if live[0] else None
                    if idx is None:
                        return orig(state, handle, *args, **kwargs)
                    prev, self.reducing = self.reducing, idx
                    n0 = self.reduce_calls
                    t0 = perf_counter()
                    rec_phase = rec.phase
                    try:
                        return orig(state, handle, *args, **kwargs)
                    finally:
                        self.reducing = prev
                        if self.reduce_calls == n0:
                            # Nothing went through the proxy (a user comm hook, another
                            # torch): time the whole reduction as one collective.
                            dt = perf_counter() - t0
                            grad = handle.flat_param.grad
                            nbytes = _nbytes(grad) if grad is not None else 0
                            rec.add_comm(idx, rec_phase, coll, nbytes, dt, dt, 0.0)
                return reduce
            return make

        wrap("_pre_backward_hook", make_pre)
        wrap("_post_backward_hook", make_post)
        wrap("_reduce_grad", make_reduce(REDUCE_SCATTER))
        wrap("_reduce_grad_no_shard", make_reduce(ALL_REDUCE))

        install_dist_proxy(ru, _DistProxy(getattr(ru, "dist", None), self, live),
                           "_runtime_utils.dist (reduce-scatter / all-reduce proxy)", reg,
                           None, plan=plan)

    def _queue_tail(self) -> None:
        def tail() -> None:
            self._tail_queued = False
            try:
                self.timer.tail((REDUCE_SCATTER, ALL_REDUCE))
            except Exception as e:
                self.registry.error("fsdp1.backward_tail", e)
        try:
            hp.queue_autograd_callback(tail)
            self._tail_queued = True
        except Exception as e:
            self.registry.missing("Variable._execution_engine.queue_callback", repr(e))
