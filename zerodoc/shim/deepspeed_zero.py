"""DeepSpeed's ZeRO optimizers as the DeepSpeed adapter sees them: views and instance wrappers.

The views hand the monitor what it expects of a torch optimizer and a module: step boundaries
with torch's `Optimizer` hook API (`ZeroStepHooks`) and this rank's parameter / gradient
storage (`_MemoryView`). The wrappers (instance-scoped, undone on close) book DeepSpeed's own
bucket work as framework time, the offload gradient copies on the (offload) unit, and, for
ZeRO-3, the fetches of its `PartitionedParameterCoordinator` on the unit they are for.
Hook points: see `hookpoints.py`.
"""

from __future__ import annotations

from .deepspeed_comm import _State
from .detailplan import shadow_attr
from .recorder import BACKWARD, B_FRAMEWORK, FORWARD, unit_bucket


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


def wrap_framework(obj, name: str, hook: str, rec, registry, undo: list) -> None:
    """Time spent in `obj.name` is DeepSpeed's own work (collective waits excluded)."""
    try:
        orig = getattr(obj, name)

        def call(*args, **kwargs):
            rec.push(B_FRAMEWORK)
            try:
                return orig(*args, **kwargs)
            finally:
                rec.remove(B_FRAMEWORK)
        shadow_attr(obj, name, call, undo)
        registry.ok(hook)
    except Exception as e:
        registry.missing(hook, repr(e))


def install_stage3(st: _State, zero_opt, fetch_unit: dict, group_unit: dict, param_unit: dict,
                   undo: list, *, coord_prefix: str, stage3_prefix: str) -> None:
    """Wrap the ZeRO-3 parameter coordinator and gradient reduction. `fetch_unit` /
    `group_unit` / `param_unit` map id(fetch module) / id(group module) / id(param) to units;
    the prefixes are the name-mangling prefixes of the private methods wrapped."""
    rec, timer, registry = st.rec, st.timer, st.registry
    try:
        coord = zero_opt.parameter_offload.get_param_coordinator()
    except Exception as e:
        registry.missing("DeepSpeedZeroOptimizer_Stage3.parameter_offload", repr(e))
        return
    hook = "PartitionedParameterCoordinator.fetch_sub_module/release_sub_module"
    try:
        orig_fetch = coord.fetch_sub_module
        orig_release = coord.release_sub_module

        def fetch_sub_module(sub, forward, *args, **kwargs):
            if not forward:
                rec.phase = BACKWARD
            prev = st.unit
            fu = fetch_unit.get(id(sub))
            st.unit = prev if fu is None else fu
            ph = FORWARD if forward else BACKWARD
            fw = B_FRAMEWORK if fu is None else rec.framework_bucket(fu, ph)
            rec.push(fw)
            if fu is not None:
                # CUDA: the compute stream is where the module needs its parameters, before
                # DeepSpeed's fetch makes it wait (`wait_stream(allgather stream)`).
                timer.arrive(fu)
            try:
                return orig_fetch(sub, forward, *args, **kwargs)
            finally:
                st.unit = prev
                u = group_unit.get(id(sub))
                b = unit_bucket(u, ph) if u is not None else None
                if b is not None and (forward or not rec.has(b)):
                    rec.switch(fw, b)
                else:
                    rec.remove(fw)
                if fu is not None:
                    timer.ready(fu)  # the wait is over: claims the unit's fetches so far

        def release_sub_module(sub, forward=False, *args, **kwargs):
            u = group_unit.get(id(sub))
            fw = B_FRAMEWORK
            if u is not None:
                ph = FORWARD if forward else BACKWARD
                rec.remove(unit_bucket(u, ph))
                fw = rec.framework_bucket(u, ph)
            rec.push(fw)
            try:
                return orig_release(sub, forward, *args, **kwargs)
            finally:
                rec.remove(fw)

        shadow_attr(coord, "fetch_sub_module", fetch_sub_module, undo)
        shadow_attr(coord, "release_sub_module", release_sub_module, undo)
        registry.ok(hook)
    except Exception as e:
        registry.missing(hook, repr(e))

    # Attribution by the parameters being gathered (prefetches belong to later units).
    name = f"{coord_prefix}__all_gather_params_"
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
                registry.error("deepspeed all_gather_params attribution", e)
            try:
                return orig_gather(params, *args, **kwargs)
            finally:
                st.unit = prev
        shadow_attr(coord, name, all_gather_params_, undo)
        registry.ok(hook)
    except Exception as e:
        registry.missing(hook, repr(e) + "; fetches booked on the fetching module")

    wrap_framework(zero_opt, f"{stage3_prefix}__reduce_and_partition_ipg_grads",
                   "DeepSpeedZeroOptimizer_Stage3.__reduce_and_partition_ipg_grads",
                   rec, registry, undo)


def install_offload(zero_opt, stage3: bool, unit: int, rec, registry, undo: list) -> None:
    """Gradient copies to the host buffers in backward -> the (offload) unit."""
    b = unit_bucket(unit, BACKWARD)
    if stage3:
        name, hook = ("_offload_grad_partition_at_boundary",
                      "DeepSpeedZeroOptimizer_Stage3._offload_grad_partition_at_boundary")
    else:
        name, hook = ("copy_grads_in_partition",
                      "DeepSpeedZeroOptimizer.copy_grads_in_partition")
    try:
        orig = getattr(zero_opt, name)

        def call(*args, **kwargs):
            rec.push(b)
            try:
                return orig(*args, **kwargs)
            finally:
                rec.remove(b)
        shadow_attr(zero_opt, name, call, undo)
        registry.ok(hook)
    except Exception as e:
        registry.missing(hook, repr(e))
