"""Command-line options shared by several commands: which run a source shows (report, tui),
the warm-up step (report, tui, compare, whatif) and the diagnosis options (report, compare).
Standard library only at import: imported while the command line is parsed."""

from __future__ import annotations


def add_run_arguments(p) -> None:
    """`--run-id` and `--segment` for a command that opens a source (report, tui)."""
    import argparse

    p.add_argument("--run-id", default=argparse.SUPPRESS, metavar="ID",
                   help="Prometheus: the run to show when the server holds several (default: "
                        "the one with the newest step; also http://host:9090#run=ID)")
    p.add_argument("--segment", type=int, default=argparse.SUPPRESS, metavar="N",
                   help="run directory: an older segment of a reused run directory (0, 1, ...; "
                        "-2: the one before the newest; default: the newest)")


def add_warmup_argument(p) -> None:
    """`--include-warmup` (report, tui, compare, whatif)."""
    p.add_argument("--include-warmup", action="store_true",
                   help="keep step 1 (compile, allocator, first all-gathers) in a run "
                        "directory's window; by default a window that would start there "
                        "leaves it out and says so")


def diagnosis_options(args):
    """--window, --link, --threshold, --device-memory checked and parsed (report, compare):
    (window or None, link or None, Thresholds, device memory bytes or None)."""
    from ..errors import UserError
    from ..planner import parse_size
    from ..thresholds import LINK_BUSBW, Thresholds

    if args.window < 0:
        raise UserError(f"--window must be >= 0 (0: all steps), not {args.window}")
    if args.link is not None and args.link not in LINK_BUSBW:
        raise UserError(f"unknown link class {args.link!r}; known: {', '.join(LINK_BUSBW)}")
    thresholds = Thresholds.with_overrides(args.threshold)
    device_memory = parse_size(args.device_memory) if args.device_memory else None
    return args.window or None, args.link, thresholds, device_memory


def add_link_profile_argument(p) -> None:
    """`--link-profile FILE` (whatif, report, compare): the one option, the one help text."""
    p.add_argument("--link-profile", default=None, metavar="FILE",
                   help="a link profile measured on the run's host class (zerodoc linkprobe): "
                        "calls larger than the run's largest are priced by its measured "
                        "shape, anchored to the run's own fit (default: the fitted line is "
                        "extended, and the answer says how far)")


def link_profile_option(args):
    """The `--link-profile` file loaded (`LinkProfile`), or None; UserError: one line."""
    path = getattr(args, "link_profile", None)
    if path is None:
        return None
    from ..whatif.linkprofile import load_profile

    return load_profile(path)


def add_runlog_argument(p) -> None:
    """`--runlog RUNDIR` (report, tui): the one option, the one help text."""
    p.add_argument("--runlog", default=None, metavar="RUNDIR",
                   help="with a folder of flight-recorder dumps: a zerodoc run directory of "
                        "the same job; its run logs' process-group sequence numbers place the "
                        "stopped rank and the waiting ones in a step, unit and phase "
                        "(docs/report.md)")


def apply_runlog(args, source):
    """`--runlog`: the run directory joined to a dumps source (one line otherwise)."""
    if getattr(args, "runlog", None) is not None:
        from ..errors import UserError

        if not hasattr(source, "add_runlog"):
            raise UserError(f"--runlog goes with a folder of flight-recorder dumps, not "
                            f"{source.description}")
        source.add_runlog(args.runlog)
    return source
