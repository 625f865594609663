"""DeepSpeed ZeRO (stages 0-3) instrumentation: `attach()` is given a `deepspeed.initialize` engine.

Collectives are intercepted at the `deepspeed.comm` level: DeepSpeed keeps its own references
to the torch.distributed functions, and every `deepspeed.comm` call ends in a method of its
backend object (`deepspeed.comm.comm.cdb`, a `TorchBackend`). We wrap those methods on that
object while attached and put the originals back on close. We never turn on DeepSpeed's comms
logger: it synchronises the device after every op.

Units (labels stay bounded):
- ``(model)``: collectives that belong to the engine rather than to one module: stage 1/2
  gradient buckets (all-reduce; `reduce` to each owner rank when `use_multi_rank_bucket_allreduce`
  is off, booked as reduce_scatter: the per-owner reduces of one bucket are its reduce-scatter),
  the post-step parameter all-gather, the grad-norm all-reduce, ZeRO-3's bucketed gradient
  reduce-scatter, its post-step all-gather of persistent parameters and its trace checks.
  Stage 0/1/2 have no other unit: forward compute is the root module's forward, backward
  compute is `engine.backward`. Bucket counts show in the collective count.
- ZeRO-3 fetch groups: DeepSpeed fetches parameters per module owning them (or per
  `set_z3_leaf_modules` leaf, fetched whole). Modules inside a repeated container
  (`ModuleList` / `Sequential`: transformer blocks) are grouped to the container's element
  ("blocks.3"): one unit per block, the block's per-module fetches show as its count. A
  module outside any container is its own unit ("embed", "head"); the root's own
  parameters are "(root)". A coalesced all-gather spanning units (DeepSpeed's prefetch
  bucket) is booked once, on the unit holding most of its parameters.
- ``(offload)`` (only with `offload_optimizer`): host transfers of the gradients in
  backward (its backward "compute"). The host optimizer step is the optimizer time: the step
  boundary is DeepSpeed's ZeRO optimizer `step()`, once per `engine.step()` at a gradient
  accumulation boundary, which covers grad-norm, the (host) optimizer step, the copy back to
  the model parameters and the post-step all-gather.

Exposure: synchronous collectives are fully exposed; asynchronous ones (ZeRO-3 parameter
fetches) return a `TimedWork` that DeepSpeed's `AllGatherCoalescedHandle.wait()` waits on.
Hook points: see `hookpoints.py`.
"""

from __future__ import annotations

import inspect
import sys
import time
import warnings
from typing import Any

from ..model import UnitFacts
from .adapters import Adapter, AdapterFacts
from .recorder import (
    ALL_GATHER, ALL_REDUCE, BACKWARD, BROADCAST, B_FRAMEWORK, FORWARD, REDUCE_SCATTER,
    unit_bucket,
)
from .slowlink import DelayedWork

MODEL_UNIT = "(model)"
OFFLOAD_UNIT = "(offload)"
ROOT_UNIT = "(root)"

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

_COORD = "_PartitionedParameterCoordinator"  # name-mangling prefix of its private methods
_STAGE3 = "_DeepSpeedZeroOptimizer_Stage3"


def deepspeed_engine_class():
    """DeepSpeedEngine if DeepSpeed was imported by the job (never imports it itself)."""
    if "deepspeed" not in sys.modules:
        return None
    try:
        from deepspeed.runtime.engine import DeepSpeedEngine
        return DeepSpeedEngine
    except Exception:
        return None


def _nbytes(x) -> int:
    if x is None:
        return 0
    if isinstance(x, (list, tuple)):
        return sum(t.numel() * t.element_size() for t in x)
    return x.numel() * x.element_size()


def _dtype_name(dt) -> str:
    return str(dt).replace("torch.", "") if dt is not None else ""


def _is_leaf(module) -> bool:
    return bool(getattr(module, "_z3_leaf", False))  # deepspeed.utils.z3_leaf_module


def _container_types():
    import torch.nn as nn

    return (nn.ModuleList, nn.Sequential)


def group_name(root, path: str) -> str:
    """The unit of the module at `path`: the element of the first repeated container on the
    way down ("blocks.3"), else the module itself ("(root)" for the root)."""
    if not path:
        return ROOT_UNIT
    containers = _container_types()
    mod = root
    parts = path.split(".")
    for i, part in enumerate(parts):
        if isinstance(mod, containers):
            return ".".join(parts[: i + 1])
        mod = getattr(mod, part)
    return path


def fetch_modules(root) -> list[tuple[str, Any]]:
    """Modules DeepSpeed stage 3 fetches parameters for: z3 leaf modules (whole subtree) and
    modules that own parameters directly."""
    out: list[tuple[str, Any]] = []
    skip: list[str] = []
    for name, mod in root.named_modules():
        if any(name == s or name.startswith(s + ".") for s in skip):
            continue
        if _is_leaf(mod):
            out.append((name, mod))
            skip.append(name)
        elif any(True for _ in mod.parameters(recurse=False)):
            out.append((name, mod))
    return out


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
        time.sleep(delay_s)
        return work
    return call


def _wrap_comm(orig, coll: int, t_pos: int, t_name: str, async_default: int, st: _State,
               delay_s: float):
    async_pos = _arg_pos(orig, "async_op", async_default)
    inner = _delayed(orig, delay_s, async_pos) if delay_s > 0 and coll == ALL_GATHER else orig
    timer = st.timer

    def call(*args, **kwargs):
        if st.depth:
            return orig(*args, **kwargs)
        try:
            nbytes = _nbytes(args[t_pos] if len(args) > t_pos else kwargs.get(t_name))
            async_op = _async_op(args, kwargs, async_pos)
        except Exception as e:  # never break the job
            st.registry.error("deepspeed.comm wrapper", e)
            return orig(*args, **kwargs)
        st.depth += 1
        try:
            return timer.call(inner, args, kwargs, st.unit, coll, nbytes, async_op)
        finally:
            st.depth -= 1

    call.__wrapped__ = orig
    return call


def _set_instance_attr(obj, name: str, value, undo: list) -> None:
    """Shadow a method on one instance; undo restores the class's (or the previous) one."""
    had = name in obj.__dict__
    prev = obj.__dict__.get(name)
    setattr(obj, name, value)

    def restore():
        if had:
            setattr(obj, name, prev)
        else:
            try:
                delattr(obj, name)
            except AttributeError:
                pass
    undo.append(restore)


class _Handle:
    def __init__(self, hooks: list, fn):
        self._hooks, self._fn = hooks, fn

    def remove(self) -> None:
        if self._fn in self._hooks:
            self._hooks.remove(self._fn)


class ZeroStepHooks:
    """Step boundaries of a DeepSpeed ZeRO optimizer, with torch's `Optimizer` hook API.

    DeepSpeed's ZeRO optimizers are not `torch.optim.Optimizer`s; their `step()` runs once per
    `engine.step()` at a gradient-accumulation boundary and covers grad-norm, the (possibly
    host) optimizer step, the copy back to the model parameters and the post-step all-gather.
    We shadow `step` on the instance while a hook is registered. `state` is the sharded
    optimizer state of this rank (Adam moments + the fp32 master partition) for memory.
    """

    def __init__(self, zero_opt, registry):
        self.zero_opt = zero_opt
        self.registry = registry
        self._pre: list = []
        self._post: list = []
        self._installed = False

    def _install(self) -> None:
        if self._installed:
            return
        opt = self.zero_opt
        orig = opt.step  # bound (or an earlier instance wrapper)
        had = "step" in opt.__dict__
        pre, post = self._pre, self._post

        def step(*args, **kwargs):
            for h in list(pre):
                h(opt, args, kwargs)
            out = orig(*args, **kwargs)
            for h in list(post):
                h(opt, args, kwargs)
            return out

        opt.step = step
        self._installed = True

        def restore():
            if had:
                opt.step = orig
            else:
                opt.__dict__.pop("step", None)
            self._installed = False
        self._restore = restore
        self.registry.ok("DeepSpeedZeroOptimizer.step (instance-wrapped)")

    def _maybe_uninstall(self) -> None:
        if self._installed and not self._pre and not self._post:
            self._restore()

    def register_step_pre_hook(self, fn):
        self._install()
        self._pre.append(fn)
        return _StepHandle(self, self._pre, fn)

    def register_step_post_hook(self, fn):
        self._install()
        self._post.append(fn)
        return _StepHandle(self, self._post, fn)

    @property
    def state(self) -> dict:
        opt = self.zero_opt
        out: dict = {}
        base = getattr(opt, "optimizer", None)
        for k, v in getattr(base, "state", {}).items():
            out[id(k)] = v
        for attr in ("single_partition_of_fp32_groups", "fp32_partitioned_groups_flat"):
            for i, t in enumerate(getattr(opt, attr, None) or ()):
                if t is not None:
                    out[(attr, i)] = {"fp32_master": t}
        return out


class _StepHandle(_Handle):
    def __init__(self, owner: ZeroStepHooks, hooks: list, fn):
        super().__init__(hooks, fn)
        self._owner = owner

    def remove(self) -> None:
        super().remove()
        self._owner._maybe_uninstall()


class _GradSlot:
    """Stands in for a parameter in the memory walk: no parameter bytes, `grad` = a
    gradient buffer DeepSpeed owns."""

    __slots__ = ("grad",)

    def __init__(self, grad):
        self.grad = grad

    def numel(self) -> int:
        return 0

    def element_size(self) -> int:
        return 1


def gradient_buffers(opt) -> list:
    """This rank's gradient storage in a ZeRO optimizer: the flat partition buffer (stage
    1/2 `grads_in_partition` or `averaged_gradients`, stage 3 `grad_partitions_flat_buffer`)
    and, with offload, the host fp32 partition gradients. Not the model's `.grad`s: in
    stages 1/2 those are views of the reused reduction buckets."""
    import torch

    out: list = []
    flat = getattr(opt, "grads_in_partition", None)
    if flat is None:
        flat = getattr(opt, "grad_partitions_flat_buffer", None)
    if isinstance(flat, torch.Tensor):
        out.append(flat)
    else:
        avg = getattr(opt, "averaged_gradients", None) or {}
        for v in (avg.values() if isinstance(avg, dict) else avg):
            if isinstance(v, torch.Tensor):
                out.append(v)
            elif isinstance(v, (list, tuple)):
                out.extend(t for t in v if isinstance(t, torch.Tensor))
    for attr in ("single_partition_of_fp32_groups", "fp32_partitioned_groups_flat"):
        for t in getattr(opt, attr, None) or ():
            g = getattr(t, "grad", None)
            if g is not None:
                out.append(g)
    return out


class _MemoryView:
    """`parameters()` yields this rank's parameter storage (ZeRO-3: the local shards), then
    its gradient buffers as `_GradSlot`s (what `memory.gradient_bytes` reads)."""

    def __init__(self, module, zero_opt, stage: int, registry):
        self.module, self.zero_opt, self.stage = module, zero_opt, stage
        self.registry = registry

    def parameters(self):
        stage3 = self.stage >= 3
        for p in self.module.parameters():
            t = getattr(p, "ds_tensor", None) if stage3 else None
            if t is not None:
                yield t
            elif self.stage >= 1:  # the ZeRO optimizer owns the gradients, not .grad
                yield _ParamOnly(p)
            else:
                yield p
        if self.stage >= 1:
            try:
                for g in gradient_buffers(self.zero_opt):
                    yield _GradSlot(g)
            except Exception as e:
                self.registry.error("deepspeed gradient buffers", e)


class _ParamOnly:
    """A parameter without its `.grad` (a view of a reduction bucket in stages 1/2)."""

    __slots__ = ("p",)
    grad = None

    def __init__(self, p):
        self.p = p

    def numel(self) -> int:
        return self.p.numel()

    def element_size(self) -> int:
        return self.p.element_size()

    @property
    def device(self):
        return self.p.device


class DeepSpeedAdapter(Adapter):
    """A `deepspeed.initialize` engine, ZeRO stage 0-3, optionally with optimizer offload."""

    framework = "deepspeed"

    @classmethod
    def detect(cls, model, optimizer) -> bool:
        engine_cls = deepspeed_engine_class()
        if engine_cls is None:
            return False
        if isinstance(model, engine_cls):
            return True
        if any(hasattr(p, "ds_id") for p in getattr(model, "parameters", lambda: ())()):
            warnings.warn("zerodoc: attach() was given a DeepSpeed ZeRO-3 module; pass the "
                          "engine from deepspeed.initialize() to see its collectives",
                          stacklevel=4)
        return False

    # --- discovery --------------------------------------------------------------------
    def discover(self) -> None:
        eng = self.model
        self.engine = eng
        self.module = eng.module
        self.zero_opt = eng.optimizer
        try:
            self.stage = int(eng.zero_optimization_stage())
        except Exception as e:
            self.registry.missing("DeepSpeedEngine.zero_optimization_stage", repr(e))
            self.stage = 0
        try:
            off = eng.zero_offload_optimizer()
            self.offload = str(getattr(off, "device", "none") or "none").split(".")[-1] \
                if off is not None else "none"
        except Exception as e:
            self.registry.missing("DeepSpeedEngine.zero_offload_optimizer", repr(e))
            self.offload = "none"
        self.stage3 = self.stage >= 3
        names = [MODEL_UNIT]
        self.param_unit: dict[int, int] = {}  # id(param) -> unit
        self.group_module_unit: dict[int, int] = {}  # id(module) -> unit (compute spans)
        self.fetch_unit: dict[int, int] = {}  # id(fetch module) -> unit
        self.unit_params: dict[int, list] = {}
        if self.stage3:
            index = {}
            modules = dict(self.module.named_modules())
            for path, mod in fetch_modules(self.module):
                g = group_name(self.module, path)
                if g not in index:
                    index[g] = len(names)
                    names.append(g)
                    gmod = self.module if g == ROOT_UNIT else modules.get(g, mod)
                    self.group_module_unit[id(gmod)] = index[g]
                u = index[g]
                self.fetch_unit[id(mod)] = u
                params = list(mod.parameters(recurse=_is_leaf(mod)))
                self.unit_params.setdefault(u, []).extend(params)
                for p in params:
                    self.param_unit.setdefault(id(p), u)
        self.offload_unit = None
        if self.offload != "none":
            self.offload_unit = len(names)
            names.append(OFFLOAD_UNIT)
        self.unit_names = names

    # --- static facts -----------------------------------------------------------------
    def facts(self) -> AdapterFacts:
        import deepspeed

        eng = self.engine
        ws = self._world_size()
        units = [self._model_facts(ws)]
        for u in range(1, len(self.unit_names)):
            if u == self.offload_unit:
                units.append(UnitFacts(name=OFFLOAD_UNIT, params=0, param_bytes=0,
                                       gather_bytes=0, sharded_bytes=0,
                                       reshard_after_forward=None, group_size=1))
                continue
            units.append(self._stage3_unit_facts(u, ws))
        pdt = rdt = ""
        try:
            p = next(self.module.parameters())
            t = getattr(p, "ds_tensor", None)
            pdt = _dtype_name((t if t is not None else p).dtype)
            rdt = _dtype_name(eng.communication_data_type)
        except Exception as e:
            self.registry.missing("DeepSpeedEngine.communication_data_type", repr(e))
        return AdapterFacts(
            framework=self.framework, framework_version=deepspeed.__version__.split("+")[0],
            units=units, zero_stage=self.stage, mesh_shape=(ws,), mesh_dim_names=("dp",),
            param_dtype=pdt, reduce_dtype=rdt, extra=self._config_facts())

    def _world_size(self) -> int:
        try:
            return int(self.engine.dp_world_size)
        except Exception:
            import torch.distributed as dist

            return dist.get_world_size() if dist.is_initialized() else 1

    def _model_facts(self, ws: int) -> UnitFacts:
        if self.stage3:
            # Persistent parameters (ds_persist) are gathered by the engine after the step.
            gather = 0
            for p in self.module.parameters():
                if getattr(p, "ds_persist", False):
                    gather += p.ds_tensor.ds_numel * ws * p.ds_tensor.element_size()
            return UnitFacts(name=MODEL_UNIT, params=0, param_bytes=0, gather_bytes=gather,
                             sharded_bytes=0, reshard_after_forward=None, group_size=ws)
        params = sum(p.numel() for p in self.module.parameters())
        pbytes = sum(p.numel() * p.element_size() for p in self.module.parameters())
        gather = 0
        pdt = ""
        try:  # the flat, padded bit16 groups the post-step all-gather fills
            for t in self.zero_opt.bit16_groups_flat:
                gather += t.numel() * t.element_size()
                pdt = _dtype_name(t.dtype)
        except Exception:
            gather = pbytes if self.stage >= 1 else 0
        return UnitFacts(name=MODEL_UNIT, params=params, param_bytes=pbytes,
                         gather_bytes=gather, sharded_bytes=pbytes,
                         reshard_after_forward=False, group_size=ws, param_dtype=pdt)

    def _stage3_unit_facts(self, u: int, ws: int) -> UnitFacts:
        params = param_bytes = gather = sharded = 0
        dt = ""
        try:
            for p in self.unit_params.get(u, ()):
                t = p.ds_tensor
                params += p.ds_numel
                param_bytes += p.ds_numel * t.element_size()
                sharded += t.numel() * t.element_size()
                if not getattr(p, "ds_persist", False):
                    gather += t.ds_numel * ws * t.element_size()  # padded, as gathered
                dt = _dtype_name(t.dtype)
        except Exception as e:
            self.registry.missing("ZeRO-3 parameter attributes (ds_tensor, ds_numel)", repr(e))
        return UnitFacts(name=self.unit_names[u], params=params, param_bytes=param_bytes,
                         gather_bytes=gather, sharded_bytes=sharded,
                         reshard_after_forward=True, group_size=ws, param_dtype=dt,
                         reduce_dtype=dt)

    def _config_facts(self) -> dict:
        eng = self.engine
        out: dict[str, Any] = {"offload_optimizer": self.offload}
        getters = {
            "offload_param": lambda: (lambda o: str(o.device).split(".")[-1] if o else "none")(
                eng.zero_offload_param()),
            "overlap_comm": eng.zero_overlap_comm,
            "contiguous_gradients": eng.zero_contiguous_gradients,
            "reduce_scatter": eng.zero_reduce_scatter,
            "reduce_bucket_size": eng.zero_reduce_bucket_size,
            "allgather_bucket_size": eng.zero_allgather_bucket_size,
            "gradient_accumulation_steps": eng.gradient_accumulation_steps,
            "fp16": eng.fp16_enabled,
            "bf16": eng.bfloat16_enabled,
        }
        if self.stage3:
            getters.update({
                "prefetch_bucket_size": eng.zero_prefetch_bucket_size,
                "max_live_parameters": eng.zero_max_live_parameters,
                "max_reuse_distance": eng.zero_max_reuse_distance,
                "param_persistence_threshold": eng.zero_param_persistence_threshold,
                "z3_leaf_modules": lambda: sum(1 for m in self.module.modules() if _is_leaf(m)),
                "fetch_modules": lambda: len(self.fetch_unit),
            })
        for k, fn in getters.items():
            try:
                v = fn()
                out[k] = v if isinstance(v, (bool, int, float, str)) or v is None else str(v)
            except Exception as e:
                self.registry.missing(f"DeepSpeedEngine config ({k})", repr(e))
        out["unit_grouping"] = "repeated-container element" if self.stage3 else "(model)"
        return out

    # --- instrumentation ----------------------------------------------------------------
    def instrument(self, rec, timer, on_root_forward, slow_link_s: float) -> list:
        undo: list = []
        st = _State(rec, timer, self.registry, 0)
        self._st = st
        self._install_comm(st, slow_link_s, undo)
        self._install_root_hooks(rec, on_root_forward, undo)
        if self.stage3:
            self._install_stage3(st, undo)
        else:
            self._install_stage12(st, undo)
        if self.offload_unit is not None:
            self._install_offload(rec, undo)
        return undo

    def _install_comm(self, st: _State, slow_link_s: float, undo: list) -> None:
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
                _set_instance_attr(cdb, name, wrapper, undo)
                n += 1
            if not n:
                raise AttributeError("no collective methods on the backend")
            self.registry.ok(hook)
        except Exception as e:
            self.registry.missing(hook, repr(e))

    def _install_root_hooks(self, rec, on_root_forward, undo: list) -> None:
        stage12 = not self.stage3
        fwd = unit_bucket(0, FORWARD)

        def pre(mod, args):
            on_root_forward()
            if stage12:
                rec.push(fwd)

        def post(mod, args, out):
            if stage12:
                rec.remove(fwd)
            rec.phase = BACKWARD  # collectives after the root's forward belong to backward

        try:
            hs = [self.module.register_forward_pre_hook(pre, prepend=True),
                  self.module.register_forward_hook(post)]
            undo.extend(h.remove for h in hs)
            self.registry.ok("nn.Module forward hooks (prepend)")
        except Exception as e:
            self.registry.missing("nn.Module forward hooks (prepend)", repr(e))

    def _wrap_framework(self, obj, name: str, hook: str, rec, undo: list) -> None:
        """Time spent in `obj.name` is DeepSpeed's own work (collective waits excluded)."""
        try:
            orig = getattr(obj, name)

            def call(*args, **kwargs):
                rec.push(B_FRAMEWORK)
                try:
                    return orig(*args, **kwargs)
                finally:
                    rec.remove(B_FRAMEWORK)
            _set_instance_attr(obj, name, call, undo)
            self.registry.ok(hook)
        except Exception as e:
            self.registry.missing(hook, repr(e))

    def _install_stage12(self, st: _State, undo: list) -> None:
        rec = st.rec
        bwd = unit_bucket(0, BACKWARD)
        eng = self.engine
        try:
            orig = eng.backward

            def backward(*args, **kwargs):
                rec.phase = BACKWARD
                rec.push(bwd)
                try:
                    return orig(*args, **kwargs)
                finally:
                    rec.remove(bwd)
            _set_instance_attr(eng, "backward", backward, undo)
            self.registry.ok("DeepSpeedEngine.backward (instance-wrapped)")
        except Exception as e:
            self.registry.missing("DeepSpeedEngine.backward (instance-wrapped)", repr(e))
        if self.stage >= 1:
            self._wrap_framework(self.zero_opt, "reduce_ipg_grads",
                                 "DeepSpeedZeroOptimizer.reduce_ipg_grads", rec, undo)

    def _install_stage3(self, st: _State, undo: list) -> None:
        rec, timer = st.rec, st.timer
        try:
            coord = self.zero_opt.parameter_offload.get_param_coordinator()
        except Exception as e:
            self.registry.missing("DeepSpeedZeroOptimizer_Stage3.parameter_offload", repr(e))
            return
        fetch_unit, group_unit, param_unit = (self.fetch_unit, self.group_module_unit,
                                              self.param_unit)
        hook = "PartitionedParameterCoordinator.fetch_sub_module/release_sub_module"
        try:
            orig_fetch = coord.fetch_sub_module
            orig_release = coord.release_sub_module

            def fetch_sub_module(sub, forward, *args, **kwargs):
                if not forward:
                    rec.phase = BACKWARD
                prev = st.unit
                st.unit = fetch_unit.get(id(sub), prev)
                rec.push(B_FRAMEWORK)
                try:
                    return orig_fetch(sub, forward, *args, **kwargs)
                finally:
                    rec.remove(B_FRAMEWORK)
                    st.unit = prev
                    fu = fetch_unit.get(id(sub))
                    if fu is not None:
                        timer.wait_point(fu)  # its parameters are needed now (CUDA pairing)
                    u = group_unit.get(id(sub))
                    if u is not None:
                        b = unit_bucket(u, FORWARD if forward else BACKWARD)
                        if forward or not rec.has(b):
                            rec.push(b)

            def release_sub_module(sub, forward=False, *args, **kwargs):
                u = group_unit.get(id(sub))
                if u is not None:
                    rec.remove(unit_bucket(u, FORWARD if forward else BACKWARD))
                rec.push(B_FRAMEWORK)
                try:
                    return orig_release(sub, forward, *args, **kwargs)
                finally:
                    rec.remove(B_FRAMEWORK)

            _set_instance_attr(coord, "fetch_sub_module", fetch_sub_module, undo)
            _set_instance_attr(coord, "release_sub_module", release_sub_module, undo)
            self.registry.ok(hook)
        except Exception as e:
            self.registry.missing(hook, repr(e))

        # Attribution by the parameters being gathered (prefetches belong to later units).
        name = f"{_COORD}__all_gather_params_"
        hook = "PartitionedParameterCoordinator.__all_gather_params_"
        try:
            orig_gather = getattr(coord, name)

            def all_gather_params_(params, *args, **kwargs):
                prev = st.unit
                try:
                    weight: dict[int, int] = {}
                    for p in params:
                        u = param_unit.get(id(p))
                        if u is not None:
                            weight[u] = weight.get(u, 0) + p.ds_numel
                    if weight:
                        st.unit = max(sorted(weight), key=weight.__getitem__)
                except Exception as e:
                    self.registry.error("deepspeed all_gather_params attribution", e)
                try:
                    return orig_gather(params, *args, **kwargs)
                finally:
                    st.unit = prev
            _set_instance_attr(coord, name, all_gather_params_, undo)
            self.registry.ok(hook)
        except Exception as e:
            self.registry.missing(hook, repr(e) + "; fetches booked on the fetching module")

        self._wrap_framework(self.zero_opt, f"{_STAGE3}__reduce_and_partition_ipg_grads",
                             "DeepSpeedZeroOptimizer_Stage3.__reduce_and_partition_ipg_grads",
                             rec, undo)

    def _install_offload(self, rec, undo: list) -> None:
        """Gradient copies to the host buffers in backward -> the (offload) unit."""
        b = unit_bucket(self.offload_unit, BACKWARD)
        if self.stage3:
            name, hook = ("_offload_grad_partition_at_boundary",
                          "DeepSpeedZeroOptimizer_Stage3._offload_grad_partition_at_boundary")
        else:
            name, hook = ("copy_grads_in_partition",
                          "DeepSpeedZeroOptimizer.copy_grads_in_partition")
        try:
            orig = getattr(self.zero_opt, name)

            def call(*args, **kwargs):
                rec.push(b)
                try:
                    return orig(*args, **kwargs)
                finally:
                    rec.remove(b)
            _set_instance_attr(self.zero_opt, name, call, undo)
            self.registry.ok(hook)
        except Exception as e:
            self.registry.missing(hook, repr(e))

    # --- step boundary and memory --------------------------------------------------------
    def step_optimizer(self):
        import torch

        opt = self.zero_opt
        if opt is None:
            return None
        if isinstance(opt, torch.optim.Optimizer):  # stage 0 without a DeepSpeed wrapper
            return opt
        return ZeroStepHooks(opt, self.registry)

    def memory_module(self):
        return _MemoryView(self.module, self.zero_opt, self.stage, self.registry)
