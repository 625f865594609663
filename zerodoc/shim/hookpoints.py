"""Every torch internal zerodoc hooks into, named in one place.

Checked on torch 2.13.0 (CPU build, gloo). Public entry points are preferred; where only a
private attribute gives per-unit attribution it is listed here with the versions it was
read on, and every lookup goes through `HookRegistry`, which fails soft: a missing hook
point is reported once (a warning, the run log header, `zerodoc_hook_available{hook}=0`)
and zerodoc exports what still works.

| hook point                          | public? | what for                                  | checked |
|-------------------------------------|---------|-------------------------------------------|---------|
| `torch.distributed.fsdp.FSDPModule` | yes     | find the sharded units (FSDP2)            | 2.13    |
| `FSDPModule._get_fsdp_state()`      | no      | reach a unit's FSDPState                  | 2.13    |
| `FSDPState._fsdp_param_groups`      | no      | the unit's param groups (2.13: a list;    | 2.13    |
|   (`_fsdp_param_group` before)      |         |   older releases: one group or None)      |         |
| `FSDPModule.set_custom_all_gather`  | yes     | per-unit all-gather wrapper (>= 2.8)      | 2.13    |
| `FSDPModule.set_custom_reduce_scatter` | yes  | per-unit reduce-scatter wrapper (>= 2.8)  | 2.13    |
| `FSDPParamGroup._all_gather_comm`   | no      | the comm to delegate to; fallback install | 2.13    |
| `FSDPParamGroup._reduce_scatter_comm` | no    | same for reduce-scatter                   | 2.13    |
| `FSDPParamGroup.pre_backward`       | no      | backward start of a unit (instance-wrapped)| 2.13   |
| `FSDPParamGroup.post_backward`      | no      | backward end of a unit (instance-wrapped) | 2.13    |
| `FSDPParamGroup.fsdp_params`        | no      | per-unit parameter facts                  | 2.13    |
| `FSDPParamGroup.mesh_info` / `post_forward_mesh_info` | no | group size, reshard_after_forward | 2.13 |
| `FSDPParam._orig_size`, `.param_dtype`, `.orig_dtype`, `.padded_sharded_param_size` | no | unit bytes | 2.13 |
| `_fsdp_collectives.dist` (module global) | no | HSDP all-reduce per unit: a proxy for  | 2.13    |
|   in `torch.distributed.fsdp._fully_shard` |    |   `torch.distributed` in that module only |       |
| `FSDPParamGroup._is_hsdp`           | no      | whether a unit replicates (HSDP)          | 2.13    |
| `dist.Work` subclassing + `Work.get_future()` | yes | exposed time of async all-gathers     | 2.13    |
| `Optimizer.register_step_pre_hook/post_hook` | yes | step boundaries, optimizer time     | 2.13    |
| `nn.Module.register_forward_pre_hook(prepend=)` / `register_forward_hook(prepend=)` | yes | forward compute per unit | 2.13 |

The HSDP all-reduce in `_fsdp_collectives.foreach_reduce` is called as `dist.all_reduce`
(no comm object to replace), hence the module-scoped proxy.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

log = logging.getLogger("zerodoc")

CHECKED_TORCH_VERSIONS = ("2.13.0",)


class HookRegistry:
    """Records which hook points were found; warns once per missing one."""

    def __init__(self) -> None:
        self.status: dict[str, str] = {}  # hook -> "ok" | reason
        self.errors: dict[str, int] = {}  # hook -> errors caught at run time

    def ok(self, hook: str) -> None:
        self.status.setdefault(hook, "ok")

    def missing(self, hook: str, reason: str) -> None:
        if self.status.get(hook, "ok") == "ok":
            self.status[hook] = reason
            warnings.warn(f"zerodoc: hook point {hook} unavailable ({reason}); "
                          "the numbers that depend on it are not collected", stacklevel=3)

    def error(self, hook: str, exc: BaseException) -> None:
        """A failure inside zerodoc's own code at run time: counted, logged once."""
        n = self.errors.get(hook, 0)
        self.errors[hook] = n + 1
        if n == 0:
            log.warning("zerodoc: error in %s (counted, training continues): %r", hook, exc)


def fsdp2_module_class() -> type | None:
    try:
        from torch.distributed.fsdp import FSDPModule  # public since 2.6
        return FSDPModule
    except ImportError:
        try:
            from torch.distributed._composable.fsdp import FSDPModule  # 2.4 - 2.5
            return FSDPModule
        except ImportError:
            return None


def fsdp2_param_groups(module: Any) -> list[Any]:
    """The FSDPParamGroups of one fully_shard'ed module (empty if it owns no parameters)."""
    state = module._get_fsdp_state()
    groups = getattr(state, "_fsdp_param_groups", None)  # 2.13
    if groups is not None:
        return list(groups)
    group = getattr(state, "_fsdp_param_group", None)  # <= 2.12
    return [group] if group is not None else []


def fsdp2_comm_bases() -> tuple[type, type] | tuple[None, None]:
    """The AllGather / ReduceScatter protocol classes, where this torch has them."""
    try:
        from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter
        return AllGather, ReduceScatter
    except ImportError:
        return None, None


def fsdp2_set_unshard_async(model: Any, enabled: bool) -> bool:
    """Async unshard (needed for real overlap on CPU/gloo); private, used by the demo."""
    fn = getattr(model, "_set_unshard_async_op", None)
    if fn is None:
        return False
    fn(enabled)
    return True


def fsdp2_collectives_module():
    try:
        from torch.distributed.fsdp._fully_shard import _fsdp_collectives
        return _fsdp_collectives
    except ImportError:
        try:
            from torch.distributed._composable.fsdp import _fsdp_collectives  # 2.4 - 2.5
            return _fsdp_collectives
        except ImportError:
            return None
