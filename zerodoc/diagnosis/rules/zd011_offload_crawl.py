"""CPU-offload crawl: with optimizer / parameter offload on, host work dominates the step.

Why: offloading optimizer state (and parameters) to host memory trades GPU memory for PCIe
transfers and a CPU optimizer step. It is worth it only when the GPU is memory-starved;
otherwise the step stalls on host transfers and throughput collapses.

Evidence: offload on (adapter facts, or host-resident state reported), optimizer time and
host-transfer time per step and their share of the step.
Fix: shard instead of offloading (a higher stage, more ranks); if offload must stay, pin host
memory and overlap transfers.
"""

from __future__ import annotations

from ..context import HOST_TRANSFERS
from ..findings import Severity
from ...humanize import nbytes, pct
from .base import effect, finding, r6

CODE = "ZD011"
NAME = "offload-crawl"
SEVERITY = Severity.WARNING
TIER = 0
EXPLAINS = ()


def evaluate(ctx) -> list:
    t = ctx.t
    if not ctx.offload or not ctx.active or ctx.step_seconds <= 0:
        return []
    opt = ctx.median(w.optimizer_seconds / w.steps for w in ctx.active.values())
    host = sum(v.seconds for v in ctx.views() if v.collective in HOST_TRANSFERS)
    frac = (opt + host) / ctx.step_seconds
    if frac < t.offload_optimizer_fraction:
        return []
    severity = Severity.ERROR if frac >= 2 * t.offload_optimizer_fraction else Severity.WARNING
    predicted = None
    inp = ctx.plan_input()
    if inp is not None and inp.device_memory_bytes:
        from ...planner import plan

        st = plan(inp).stage(ctx.stage)
        verdict = "fits" if st.fits else "does not fit: add ranks or a higher stage first"
        predicted = (f"without offload, {st.label} keeps everything on the device: "
                     f"{nbytes(st.total_bytes)} per rank ({verdict})")
    return [finding(
        CODE, NAME, severity,
        f"offload on: optimizer and host transfers take {pct(frac)} of the step",
        evidence={"optimizer_seconds_per_step": r6(opt),
                  "host_transfer_seconds_per_step": r6(host),
                  "step_seconds": r6(ctx.step_seconds), "offload_fraction": r6(frac)},
        threshold={"offload_optimizer_fraction": t.offload_optimizer_fraction},
        fix=("Offload only when the device is memory-starved: shard instead (a higher stage, "
             "more ranks). If offload stays: pinned host memory, overlapped transfers "
             "(DeepSpeed `overlap_comm`, `pin_memory: true`), a fast CPU optimizer "
             "(DeepSpeedCPUAdam)."),
        predicted=predicted, cost_seconds_per_step=opt + host,
        effects=(effect(ctx, "optimizer_and_host_seconds_per_step", "down"),
                 effect(ctx, "step_seconds", "down")))]


def applied(before: dict, after: dict) -> str | None:
    """The fix shows as offload switched off."""
    if before.get("offload") and not after.get("offload"):
        return "offload on -> off"
    return None
