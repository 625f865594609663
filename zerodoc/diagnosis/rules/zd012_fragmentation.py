"""Fragmentation: the allocator reserves far more than is allocated.

Why: the caching allocator keeps freed blocks for reuse; odd-sized buffers (all-gather
outputs of different units, variable sequence lengths) fragment them, so a run can OOM with a
third of the device "free". Allocation retries mean it already had to flush its cache.

Evidence: reserved and allocated bytes (peak or current, as the GPU path reports them),
(reserved - allocated) / reserved, inactive split bytes, allocation retries.
Severity: WARNING when the ratio passes fragmentation_ratio_warn and the allocator holds a
large share of the device (fragmentation_min_reserved_fraction) or had to retry; ERROR with
retries; INFO when reserved is small (it costs nothing yet). Needs the GPU memory
populations; CPU runs never produce it.
Fix: `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`, fewer odd-sized buffers.
"""

from __future__ import annotations

from ..findings import Severity
from ...humanize import nbytes, pct
from .base import effect, finding, r6

CODE = "ZD012"
NAME = "fragmentation"
SEVERITY = Severity.WARNING
TIER = 0
EXPLAINS = ("ZD007",)


def evaluate(ctx) -> list:
    t = ctx.t
    worst = None
    for r, w in ctx.ranks.items():
        m = w.memory
        reserved = m.get("peak_reserved") or m.get("reserved")
        allocated = m.get("peak_allocated") if m.get("peak_reserved") else m.get("allocated")
        if not reserved or allocated is None:
            continue
        frag = (reserved - allocated) / reserved
        if worst is None or frag > worst[1]:
            worst = (r, frag, reserved, allocated, int(m.get("alloc_retries", 0)),
                     m.get("inactive_split"), ctx.capacity(w))
    if worst is None:
        return []
    r, frag, reserved, allocated, retries, split, cap = worst
    if frag < t.fragmentation_ratio_warn:
        return []
    big = cap is None or reserved >= t.fragmentation_min_reserved_fraction * cap
    if retries:
        severity = Severity.ERROR
    elif big:
        severity = Severity.WARNING
    else:
        severity = Severity.INFO
    return [finding(
        CODE, NAME, severity,
        f"rank {r}: {pct(frag)} of reserved memory ({nbytes(reserved - allocated)}) is not "
        f"allocated" + (f"; {retries} allocation retries" if retries else ""),
        evidence={"rank": r, "reserved_bytes": int(reserved), "allocated_bytes": int(allocated),
                  "fragmentation_ratio": r6(frag), "inactive_split_bytes": split,
                  "alloc_retries": retries, "capacity_bytes": cap},
        threshold={"fragmentation_ratio_warn": t.fragmentation_ratio_warn,
                   "fragmentation_min_reserved_fraction": t.fragmentation_min_reserved_fraction},
        fix=("Set `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`; avoid odd-sized buffers "
             "(pad variable sequence lengths to a few buckets); `torch.cuda.empty_cache()` "
             "only hides it."),
        predicted=f"up to {nbytes(reserved - allocated)} back as headroom on rank {r}",
        ranks=(r,),
        effects=(effect(ctx, "fragmentation_ratio", "down"),
                 effect(ctx, "min_headroom_fraction", "up")))]


def applied(before: dict, after: dict) -> str | None:
    """The fix shows when the run reports its allocator settings (`config["alloc_conf"]`,
    PYTORCH_CUDA_ALLOC_CONF); otherwise declare it with --applied ZD012."""
    if before.get("alloc_conf") != after.get("alloc_conf"):
        return f"allocator settings {before.get('alloc_conf')} -> {after.get('alloc_conf')}"
    return None
