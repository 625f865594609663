"""Launch-bound: the GPU waits for the host to launch its kernels.

Why: on a GPU the host normally runs ahead, queueing kernels the device works through; the
device time of a unit's compute is then much longer than the host's time launching it. When
the two are about equal and the device has already started a unit's kernels before the host
finished launching them, the device is being fed only as fast as Python can launch: the
step is CPU-bound (too many small kernels, per-op Python overhead, a starved or contended
CPU), and a faster GPU would not make it faster.

Evidence: per step, the host's launch time of the units' compute and its device time (median
rank), their ratio, and the fraction of unit compute segments the device had already
started when the host finished launching them ("caught up"); the ranks where it holds. GPU
runs only (on CPU the two times are one).
Severity: WARNING when host launch time >= launch_host_device_ratio_warn of the device time
and the device caught up in >= launch_caught_up_fraction_warn of the segments (a device
that is merely behind with a full launch queue has host ~ device time too, but never caught
up: no finding).
Fix: fewer, larger kernels: torch.compile (kernel fusion), CUDA graphs
(torch.compile(mode="reduce-overhead")), a bigger micro-batch or longer sequences per rank
(more work per launch); less Python per step (hooks, logging, per-step .item()); enough CPU
cores per rank, the data loader out of the training thread.
"""

from __future__ import annotations

from ..findings import Severity
from ...humanize import secs
from .base import finding, r6

CODE = "ZD014"
NAME = "launch-bound"
SEVERITY = Severity.WARNING
TIER = 0
EXPLAINS = ()


def evaluate(ctx) -> list:
    t = ctx.t
    per: dict[int, tuple[float, float, float]] = {}
    for r, w in ctx.active.items():
        if w.facts.device_type != "cuda" or not w.launch_checks or w.compute_seconds <= 0:
            continue
        dev = w.compute_seconds / w.steps  # the sampled steps' mean (zerodoc.windowsamples)
        host = w.per_sampled_step(w.host_compute_seconds)  # launched on sampled steps only
        if host is None:
            continue
        per[r] = (host, dev, w.launch_caught_up / w.launch_checks)
    if not per:
        return []
    bound = [r for r, (h, d, c) in per.items()
             if h >= t.launch_host_device_ratio_warn * d and c >= t.launch_caught_up_fraction_warn]
    if not bound:
        return []
    host = ctx.median(per[r][0] for r in bound)
    dev = ctx.median(per[r][1] for r in bound)
    caught = ctx.median(per[r][2] for r in bound)
    ratio = host / dev if dev > 0 else 0.0
    return [finding(
        CODE, NAME, Severity.WARNING,
        f"launch-bound on {len(bound)} of {len(per)} ranks: the host takes {secs(host)} to "
        f"launch {secs(dev)} of GPU compute per step, and the GPU had caught up with it in "
        f"{caught:.0%} of the unit segments",
        evidence={"host_compute_seconds_per_step": r6(host),
                  "device_compute_seconds_per_step": r6(dev),
                  "host_device_ratio": r6(ratio), "caught_up_fraction": r6(caught),
                  "ranks_launch_bound": len(bound), "ranks_measured": len(per)},
        threshold={"launch_host_device_ratio_warn": t.launch_host_device_ratio_warn,
                   "launch_caught_up_fraction_warn": t.launch_caught_up_fraction_warn},
        fix=("Launch fewer, larger kernels: torch.compile the blocks (fusion) or capture them "
             "with CUDA graphs (torch.compile(mode='reduce-overhead')); give each launch more "
             "work (bigger micro-batch, longer sequences per rank); take Python work out of "
             "the step (per-step .item(), logging, extra hooks) and give each rank enough CPU "
             "cores."),
        ranks=bound)]
