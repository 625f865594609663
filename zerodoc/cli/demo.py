"""`zerodoc demo`: a real FSDP2 job on local gloo ranks, instrumented, with a live summary."""

from __future__ import annotations

from .helpformat import DefaultsHelpFormatter
from ..demo import frameworks
from ..demo.frameworks import WRAPS


def add_parser(sub) -> None:
    p = sub.add_parser(
        "demo", help="run a small FSDP2 training job on local CPU ranks, instrumented",
        description="Start a small transformer on N local ranks (gloo, FSDP2 fully_shard), "
        "instrumented by zerodoc: each rank serves /metrics and appends to a run log, and "
        "a live summary is printed per step. Flags reproduce real (mis)configurations.",
        formatter_class=DefaultsHelpFormatter)
    p.add_argument("--ranks", type=int, default=2, help="local ranks (processes)")
    p.add_argument("--framework", choices=frameworks.names(), default="fsdp2",
                   help="sharding stack to run the demo model under")
    p.add_argument("--hsdp-replicas", type=int, default=1,
                   help="FSDP2 only: replicate groups of a 2-D (HSDP) mesh; ranks must be a "
                        "multiple (e.g. --ranks 4 --hsdp-replicas 2)")
    p.add_argument("--steps", type=int, default=100, help="training steps; 0 runs until Ctrl-C")
    p.add_argument("--wrap", choices=WRAPS, default="block",
                   help="sharding granularity: per block (right), per linear (too fine), "
                        "root only (too coarse)")
    p.add_argument("--no-reshard-after-forward", dest="reshard", action="store_false",
                   help="keep gathered parameters from forward to backward (ZeRO-2-like)")
    p.add_argument("--prefetch", action="store_true",
                   help="async unshard + explicit forward/backward prefetch (real overlap)")
    p.add_argument("--slow-link-ms", type=float, default=0.0,
                   help="simulate a slow link: every all-gather completes this much later")
    p.add_argument("--blocks", type=int, default=4, help="transformer blocks")
    p.add_argument("--hidden", type=int, default=256, help="hidden size")
    p.add_argument("--seq", type=int, default=128, help="sequence length")
    p.add_argument("--batch", type=int, default=4, help="micro-batch per rank")
    p.add_argument("--port", type=int, default=None,
                   help="Prometheus base port (rank r serves base+r); 0 picks free ports; "
                        "default $ZERODOC_PORT or 9730")
    p.add_argument("--no-metrics", action="store_true", help="serve no /metrics")
    p.add_argument("--run-dir", default=None,
                   help="run log directory (default ./zerodoc-runs/demo-<time>)")
    p.add_argument("--headless", action="store_true",
                   help="plain text output (no interactive terminal UI)")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..demo.live import run_demo

    return run_demo(args)
