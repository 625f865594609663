"""`zerodoc tui`: live terminal UI over a run directory, rank endpoints or Prometheus."""

from __future__ import annotations

import sys

from ..errors import UserError


def add_parser(sub) -> None:
    p = sub.add_parser(
        "tui", help="live terminal UI: is it comm-bound, which unit, which rank",
        description="Watch a sharded training run live: overview (step time, exposed "
        "communication, comm/compute, worst unit and rank, memory headroom), per-unit table, "
        "findings with evidence and fix, per-rank comparison. Press ? inside for the keys.")
    p.add_argument("source", nargs="?", metavar="SOURCE",
                   help="a run directory (one that does not exist yet, in a directory that "
                        "does, is waited for), rank endpoints (host:port,...), a Prometheus (or "
                        "VictoriaMetrics) URL, PyTorch profiler traces, Nsight Systems .sqlite "
                        "exports or a folder of PyTorch flight-recorder dumps; "
                        "default: the newest run under ./zerodoc-runs")
    p.add_argument("--refresh", type=float, default=1.0, metavar="SECONDS",
                   help="seconds between refreshes (default: 1)")
    p.add_argument("--window", type=int, default=20, metavar="STEPS",
                   help="steps each rank's numbers are averaged over (default: 20; 0: all)")
    from ..trace import add_arguments

    add_arguments(p)
    from .options import add_run_arguments, add_warmup_argument

    add_run_arguments(p)
    add_warmup_argument(p)
    from .options import add_link_profile_argument, add_runlog_argument

    add_link_profile_argument(p)  # the findings' what-if, as report's
    add_runlog_argument(p)
    p.set_defaults(func=run)


def validate(args) -> None:
    if not 0 < args.refresh <= 3600:  # NaN fails too
        raise UserError(f"--refresh must be more than 0 and at most 3600 seconds, "
                        f"not {args.refresh:g}")
    if args.window < 0:
        raise UserError(f"--window must be >= 0 steps (0: all), not {args.window}")


def run(args) -> int:
    validate(args)
    from .options import link_profile_option

    profile = link_profile_option(args)  # a bad file: one line, before any terminal work
    from ..sources import open_source

    from ..trace import facts_from_args

    source = open_source(args.source, window=args.window or None,
                         trace_facts=facts_from_args(args), run_id=getattr(args, "run_id", None),
                         segment=getattr(args, "segment", None), wait=True,
                         skip_warmup=not args.include_warmup)
    from .options import apply_runlog

    apply_runlog(args, source)  # a wrong --runlog: one line, before any terminal work
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise UserError("needs an interactive terminal (stdin and stdout are not a TTY); "
                        "`zerodoc report` prints the same diagnosis as text")
    try:
        from ..tui.app import run_tui
    except ImportError as e:
        raise UserError(f"the TUI needs Textual ({e}); pip install 'zerodoc[tui]'") from None
    return run_tui(source, refresh=args.refresh, link_profile=profile)
