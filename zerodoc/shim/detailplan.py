"""The per-unit instrumentation of detail steps, built once and then only put in and taken out.

A sample (issue 19's tiers, `sampler.py`) pays the install of the per-unit hooks and comm
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
        self._compiled: bool | None = None  # True once `_compile` grouped the attributes
        self._objs: list = []

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
        self._compiled = None

    def call(self, install: Callable, remove: Callable) -> None:
        self.calls.append((install, remove))

    # --- the sample's install and removal ------------------------------------------
    def _compile(self) -> None:
        """The attributes grouped per object for the install's loop: an object whose
        attributes are plain instance-dict entries (no `__setattr__` of its own, no data
        descriptor of that name) is written through its `__dict__` in one `update`, and
        restored the same way (the old values present in one `update`, the absent ones
        popped)."""
        objs: dict[int, list] = {}
        for obj, name, new, old, ours in self.attrs:
            e = objs.setdefault(id(obj), [obj, [], [], [], False])
            e[1].append(name)
            e[2].append(new)
            e[3].append(old)
            e[4] = e[4] or ours
        self._objs = []
        for obj, names, news, olds, ours in objs.values():
            own = obj.__dict__
            cls = type(obj)
            fast = not ours and type(own) is dict and cls.__setattr__ is object.__setattr__ \
                and not any(hasattr(getattr(cls, n, None), "__set__") for n in names)
            back = {n: o for n, o in zip(names, olds) if o is not _MISSING}
            gone = tuple(n for n, o in zip(names, olds) if o is _MISSING)
            self._objs.append((obj, own, fast, tuple(zip(names, olds)), dict(zip(names, news)),
                               back, gone, ours))
        self._compiled = True

    def install(self) -> bool:
        """Put everything in place. False (nothing put in place) when an attribute the plan
        sets was changed by someone else since it was built (`stale`)."""
        if self.installed:
            return True
        if self._compiled is None:
            self._compile()
        done = 0
        try:
            for obj, own, fast, pairs, news, _back, _gone, _ours in self._objs:
                for name, old in pairs:
                    if own.get(name, _MISSING) is not old:
                        self._restore(self._objs[:done])  # (none when the first differs)
                        return False
                if fast:
                    own.update(news)
                else:
                    for name, new in news.items():
                        setattr(obj, name, new)
                done += 1
        except BaseException:
            self._restore(self._objs[:done + 1])  # what was set, the failing one's part too
            raise
        self.installed = True
        for d, key, fn, prepend in self.hooks:
            d[key] = fn
            if prepend:
                d.move_to_end(key, last=False)
        for install, _remove in self.calls:
            install()
        return True

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
        self._restore(self._objs, on_error)

    @staticmethod
    def _restore(objs, on_error=None) -> None:
        for obj, own, fast, pairs, news, back, gone, ours in reversed(objs):
            if fast:
                own.update(back)
                for name in gone:
                    own.pop(name, None)
                continue
            for name, old in pairs:
                try:
                    if ours and own.get(name, _MISSING) is not news[name]:
                        continue  # wrapped again since: ours stays, passing through
                    if old is _MISSING:
                        if name in own:  # (an install that failed half-way)
                            delattr(obj, name)
                    else:
                        setattr(obj, name, old)
                except Exception as e:  # noqa: BLE001
                    if on_error is not None:
                        on_error(e)

    def stale(self) -> bool:
        """Whether an attribute the plan sets was changed by someone else since it was built
        (a user's own comm set between samples, another tool's wrapper): then its saved
        `old` and the wrappers' inner objects are out of date and the plan is rebuilt (the
        install checks this itself and refuses)."""
        for obj, name, _new, old, _ours in self.attrs:
            if obj.__dict__.get(name, _MISSING) is not old:
                return True
        return False


def shadow_attr(obj, name: str, value, undo) -> None:
    """Shadow a method on one instance; undo restores the class's (or the previous) one.
    `undo`: a list of undo callables (shadowed now), or a `DetailPlan` (shadowed at each of
    its installs, restored at each removal). The adapters' one way to do it (DeepSpeed,
    ZeRO-1)."""
    if isinstance(undo, DetailPlan):
        undo.attr(obj, name, value)
        return
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
