"""The per-unit instrumentation of detail steps, built once and then only put in and taken out.

A sample (issue 19's tiers, `sampling.py`) pays the install of the per-unit hooks and comm
wrappers at the end of the step before it and their removal at its own end. Everything that
does not change between samples is built once (`DetailPlan`, at attach): the hook closures,
the comm wrapper objects, which hook dict entries and which attributes to set. Installing is
then a few dict and attribute writes per unit, removal the same in reverse.

Forward hooks go straight into the module's hook dict (`nn.Module._forward_pre_hooks` /
`_forward_hooks`, private: hookpoints.py) under a key torch handed out once at build time
(`RemovableHandle.id`, unique in the process): the same key re-inserted, moved to the front
for a prepend hook, is what `register_forward_pre_hook(prepend=True)` does with a new key, so
the order against FSDP's own hooks and the user's (registered since) is the same as a fresh
registration's. Where a module keeps its hooks elsewhere, the plan registers through the
public API at every install (`registry.missing` says so once).
"""

from __future__ import annotations

from typing import Any, Callable

from . import hookpoints as hp

_MISSING = object()
HOOK_DICT = "nn.Module._forward_pre_hooks / _forward_hooks (hook dict)"


class DetailPlan:
    """What one install puts in place, in order; `remove()` takes it out in reverse.

    - hooks: (hook dict, key, function, prepend): `d[key] = fn` (then moved to the front);
      removal `d.pop(key)`.
    - attrs: (object, name, new, old, only_if_ours): `setattr(obj, name, new)`; removal
      restores `old` (deletes the attribute when `old` is `_MISSING`: an instance attribute
      shadowing the class's); with `only_if_ours`, only while `new` is still in place (another
      tool that wrapped it since keeps its wrapper, ours passes through).
    - calls: (install, remove) pairs for what has no cheap form (the public fallbacks).
    Built for one recorder and timer (`rec`, `timer`): the monitor rebuilds it when they are
    replaced."""

    def __init__(self, rec: Any = None, timer: Any = None):
        self.rec, self.timer = rec, timer
        self.hooks: list[tuple[dict, int, Callable, bool]] = []
        self.attrs: list[tuple[Any, str, Any, Any, bool]] = []
        self.calls: list[tuple[Callable, Callable]] = []
        self.installed = False

    # --- building (once) -------------------------------------------------------------
    def forward_pre_hook(self, module, fn: Callable, registry: hp.HookRegistry, *,
                         prepend: bool = False) -> None:
        self._hook(module, fn, registry, post=False, prepend=prepend)

    def forward_hook(self, module, fn: Callable, registry: hp.HookRegistry, *,
                     prepend: bool = False) -> None:
        self._hook(module, fn, registry, post=True, prepend=prepend)

    def _hook(self, module, fn, registry, *, post: bool, prepend: bool) -> None:
        register = module.register_forward_hook if post else module.register_forward_pre_hook
        slot = hp.module_hook_slot(module, fn, post=post, prepend=prepend)
        if slot is not None:
            self.hooks.append((slot[0], slot[1], fn, prepend))
            return
        registry.missing(HOOK_DICT, "not where torch 2.0-2.13 keep them; each install "
                                    "registers through the public register_*: the same "
                                    "numbers, a slower install")
        handle: list = []

        def install() -> None:
            handle.append(register(fn, prepend=prepend))

        def remove() -> None:
            while handle:
                handle.pop().remove()
        self.calls.append((install, remove))

    def attr(self, obj, name: str, new: Any, *, only_if_ours: bool = False) -> None:
        """Set `obj.name = new` at every install (the instance's own value, or the class's
        for a class, as it is now, is what removal restores)."""
        old = obj.__dict__.get(name, _MISSING)  # an instance's dict, or a class's mapping
        self.attrs.append((obj, name, new, old, only_if_ours))

    def call(self, install: Callable, remove: Callable) -> None:
        self.calls.append((install, remove))

    # --- the sample's install and removal ------------------------------------------
    def install(self) -> None:
        if self.installed:
            return
        self.installed = True
        for obj, name, new, _old, _ours in self.attrs:
            setattr(obj, name, new)
        for d, key, fn, prepend in self.hooks:
            d[key] = fn
            if prepend:
                d.move_to_end(key, last=False)
        for install, _remove in self.calls:
            install()

    def remove(self, on_error: Callable[[BaseException], None] | None = None) -> None:
        """Take everything out (a failing part is reported to `on_error` and the rest still
        taken out)."""
        if not self.installed:
            return
        self.installed = False
        for _install, remove in reversed(self.calls):
            try:
                remove()
            except Exception as e:  # noqa: BLE001 - never into the job
                if on_error is not None:
                    on_error(e)
        for d, key, _fn, _prepend in self.hooks:
            d.pop(key, None)
        for obj, name, new, old, ours in reversed(self.attrs):
            try:
                if ours and obj.__dict__.get(name, _MISSING) is not new:
                    continue  # wrapped again since: ours stays, passing through
                if old is _MISSING:
                    if name in obj.__dict__:  # (an install that failed half-way)
                        delattr(obj, name)
                else:
                    setattr(obj, name, old)
            except Exception as e:  # noqa: BLE001
                if on_error is not None:
                    on_error(e)

    def stale(self) -> bool:
        """Whether an attribute the plan sets was changed by someone else since it was built
        (a user's own comm set between samples, another tool's wrapper): then its saved
        `old` and the wrappers' inner objects are out of date and the plan is rebuilt."""
        for obj, name, _new, old, _ours in self.attrs:
            if obj.__dict__.get(name, _MISSING) is not old:
                return True
        return False
