"""What every framework adapter shares: collective sizes and dtype names, the module-scoped
`torch.distributed` proxy, the forward-hook placement around a framework's own hooks, the
torch version. One copy here instead of one per adapter.
"""

from __future__ import annotations

from typing import Any, Callable

from . import hookpoints as hp
from .recorder import FORWARD, unit_bucket


def nbytes(x) -> int:
    """Bytes of a tensor, or of a list / tuple of tensors (None: 0)."""
    if x is None:
        return 0
    if isinstance(x, (list, tuple)):
        return sum(t.numel() * t.element_size() for t in x)
    return x.numel() * x.element_size()


def dtype_name(dt) -> str:
    """"bfloat16" for torch.bfloat16 ("" for None)."""
    return str(dt).replace("torch.", "") if dt is not None else ""


def torch_version() -> str:
    import torch

    return torch.__version__.split("+")[0]


class DistProxy:
    """Stands in for `torch.distributed` inside one framework module only (a module global
    the framework looks up at call time). Subclasses define the collectives they time;
    everything else passes through to the real module."""

    def __init__(self, real):
        self._real = real

    def __getattr__(self, name):
        return getattr(self._real, name)


def install_dist_proxy(module, proxy: DistProxy, hook: str, registry: hp.HookRegistry,
                       undo: list | None, *, plan=None) -> bool:
    """Replace `module.dist` by `proxy` (undone on close; another tool's proxy installed
    later stays). Returns False (and reports the hook missing) when there is no `dist`.
    With `plan` (a `detailplan.DetailPlan`) the swap is made at each of its installs."""
    real = getattr(module, "dist", None) if module is not None else None
    if real is None:
        registry.missing(hook, "module or its `dist` reference not found")
        return False
    if isinstance(real, DistProxy):  # another monitor's proxy: leave it
        return False
    if plan is not None:
        plan.attr(module, "dist", proxy, only_if_ours=True)
    else:
        undo.append(hp.swap_attr(module, "dist", proxy))
    registry.ok(hook)
    return True


def install_forward_hooks(outer, inner, rec, timer, idx: int, registry: hp.HookRegistry,
                          undo: list, *, on_root_forward: Callable | None = None,
                          window: bool = True, pre_extra: Callable | None = None,
                          post_extra: Callable | None = None, plan=None) -> None:
    """The forward placement every adapter uses: hooks on `outer` run outside the
    framework's pre/post-forward (prepend pre-hook, plain post-hook), hooks on `inner` inside
    it. Between them the recorder's clock is on the unit's framework bucket (forward's, also
    for a recomputation in backward: a constant bucket, no per-call work); inside, on the
    unit's compute of the phase in force (forward, or backward's recomputation).
    With `window`, the switch into "framework" is where the unit needs its parameters and
    the switch into compute is where the wait for them is over (the CUDA exposure window).
    `outer` and `inner` may be the same module (FSDP2: the framework's hooks are hooks too).
    With `plan` (a `detailplan.DetailPlan`) the hooks are added to it, put in place by its
    install (the same order), not registered now (`undo` unused).
    """
    # Precomputed per unit: the compute bucket of phase p is `base + p`, the framework
    # bucket `fw`; the host timer's window marks are no-ops, so they are not called.
    base = unit_bucket(idx, 0)
    fw = rec.framework_bucket(idx, FORWARD)
    window = window and timer.device
    push, switch, remove = rec.push, rec.switch, rec.remove

    def outer_pre(mod, args):
        if on_root_forward is not None:
            on_root_forward()
        push(fw)
        if window:
            timer.arrive(idx)
        if pre_extra is not None:
            pre_extra()

    def inner_pre(mod, args):
        switch(fw, base + rec.phase)
        if window:
            timer.ready(idx)

    def inner_post(mod, args, out):
        switch(base + rec.phase, fw)

    def outer_post(mod, args, out):
        remove(fw)
        if post_extra is not None:
            post_extra(out)

    try:
        if plan is not None:
            plan.forward_pre_hook(outer, outer_pre, registry, prepend=True)
            plan.forward_pre_hook(inner, inner_pre, registry)
            plan.forward_hook(inner, inner_post, registry, prepend=True)
            plan.forward_hook(outer, outer_post, registry)
            registry.ok("nn.Module forward hooks (prepend)")
            return
        hs = [outer.register_forward_pre_hook(outer_pre, prepend=True),
              inner.register_forward_pre_hook(inner_pre),
              inner.register_forward_hook(inner_post, prepend=True),
              outer.register_forward_hook(outer_post)]
        undo.extend(h.remove for h in hs)
        registry.ok("nn.Module forward hooks (prepend)")
    except Exception as e:
        registry.missing("nn.Module forward hooks (prepend)", repr(e))


def unit_facts_placeholder(name: str) -> Any:
    """Facts of a unit whose private attributes could not be read (name kept)."""
    from ..runmodel import UnitFacts

    return UnitFacts(name=name, params=0, param_bytes=0, gather_bytes=0, sharded_bytes=0,
                     reshard_after_forward=None, group_size=1)
