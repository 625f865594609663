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
On the host, time the training thread spends blocked inside an asynchronous call (a slow link
that stalls the issue of a fetch) is exposed too, not the fetch's framework time
(`HostTimer.call_blocking_issue`).
Modules: this one is the adapter (detection, units, facts, instrumentation of the engine);
`deepspeed_comm.py` intercepts the collectives; `deepspeed_zero.py` holds the ZeRO optimizer
views (step boundary, memory) and its wrappers, the stage-3 parameter coordinator's included.
Hook points: see `hookpoints.py`.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

from ..runmodel import UnitFacts
from .adapters import Adapter, AdapterFacts
from .deepspeed_comm import _State, install_comm
from .detailplan import DetailPlan, shadow_attr
from .deepspeed_zero import (
    ZeroStepHooks, _MemoryView, install_offload, install_stage3, wrap_framework,
)
from .recorder import BACKWARD, FORWARD, unit_bucket

MODEL_UNIT = "(model)"
OFFLOAD_UNIT = "(offload)"
ROOT_UNIT = "(root)"

# Passed to `deepspeed_zero.install_stage3` when instrumenting, not bound at import (the tests
# simulate a DeepSpeed whose private methods were renamed by changing them here).
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
        self._install_detail(rec, timer, on_root_forward, slow_link_s, undo)
        return undo

    def plan(self, rec, timer, on_root_forward, slow_link_s: float) -> DetailPlan:
        """The same instrumentation as `instrument()`, built once (`detailplan.py`): the
        root's forward hooks go into its hook dicts, every instance-shadowed method (the
        backend's collectives, the engine's and the optimizer's wrapped methods) is an
        attribute write at each install; the wrappers' shared state starts afresh at each."""
        plan = DetailPlan(rec, timer)
        st = self._install_detail(rec, timer, on_root_forward, slow_link_s, plan)

        def fresh() -> None:  # what a new `_State` would hold
            st.unit, st.depth = 0, 0
        plan.call(fresh, lambda: None)
        return plan

    def _install_detail(self, rec, timer, on_root_forward, slow_link_s: float, sink) -> _State:
        """What a detail step puts in place: now (`sink` a list collecting the removals) or
        at each install of `sink`, a `DetailPlan`. Returns the wrappers' shared state."""
        st = _State(rec, timer, self.registry, 0)
        self._st = st
        plan = sink if isinstance(sink, DetailPlan) else None
        install_comm(st, slow_link_s, self.registry, sink)
        self._install_root_hooks(rec, on_root_forward, [] if plan else sink, plan)
        if self.stage3:
            self._install_stage3(st, sink)
        else:
            self._install_stage12(st, sink)
        if self.offload_unit is not None:
            self._install_offload(rec, sink)
        return st

    def _install_root_hooks(self, rec, on_root_forward, undo: list, plan=None) -> None:
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
            if plan is not None:
                plan.forward_pre_hook(self.module, pre, self.registry, prepend=True)
                plan.forward_hook(self.module, post, self.registry)
                self.registry.ok("nn.Module forward hooks (prepend)")
                return
            hs = [self.module.register_forward_pre_hook(pre, prepend=True),
                  self.module.register_forward_hook(post)]
            undo.extend(h.remove for h in hs)
            self.registry.ok("nn.Module forward hooks (prepend)")
        except Exception as e:
            self.registry.missing("nn.Module forward hooks (prepend)", repr(e))

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
            shadow_attr(eng, "backward", backward, undo)
            self.registry.ok("DeepSpeedEngine.backward (instance-wrapped)")
        except Exception as e:
            self.registry.missing("DeepSpeedEngine.backward (instance-wrapped)", repr(e))
        if self.stage >= 1:
            wrap_framework(self.zero_opt, "reduce_ipg_grads",
                           "DeepSpeedZeroOptimizer.reduce_ipg_grads", rec, self.registry, undo)

    def _install_stage3(self, st: _State, undo: list) -> None:
        install_stage3(st, self.zero_opt, self.fetch_unit, self.group_module_unit,
                       self.param_unit, undo, coord_prefix=_COORD, stage3_prefix=_STAGE3)

    def _install_offload(self, rec, undo: list) -> None:
        install_offload(self.zero_opt, self.stage3, self.offload_unit, rec, self.registry, undo)

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
