"""`zerodoc compare BEFORE AFTER`: did the fix do what was predicted?"""

from __future__ import annotations

import sys

from .helpformat import DefaultsHelpFormatter


def add_parser(sub) -> None:
    p = sub.add_parser(
        "compare", help="compare two runs: what changed, and did each fix do what was predicted",
        description="Diagnose BEFORE and AFTER (each a run directory, rank endpoints "
        "host:port[,...], a Prometheus URL or PyTorch profiler traces) and show what changed in the configuration and "
        "in the measurements, and, for each finding of BEFORE whose fix shows in AFTER's "
        "configuration, the predicted effect against the observed one with a verdict "
        "(confirmed, partly, not confirmed, missed, made worse, or inconclusive with the "
        "reason: a predicted range that holds the value before, a change within the runs' "
        "noise, a run still being written; not judged when another change than the one "
        "predicted for was applied). Changes are judged against the runs' own noise (each "
        "run's per-step spread); with no configuration change a change beyond it is the "
        "environment's, never better or worse. Outcomes are appended to a history "
        "file beside the run directories, which `zerodoc report` and the TUI read back. "
        "Exit status: 0, or 1 with --fail-on-worse when a fix made things worse or the step "
        "got slower, 2 on bad input.",
        formatter_class=DefaultsHelpFormatter)
    p.add_argument("before", metavar="BEFORE", help="the run before the fix")
    p.add_argument("after", metavar="AFTER", help="the run with the fix")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", dest="format", action="store_const", const="json",
                     help="machine-readable JSON (schema 1, docs/compare.md)")
    fmt.add_argument("--markdown", dest="format", action="store_const", const="markdown",
                     help="Markdown (for a PR comment)")
    p.add_argument("--window", type=int, default=20, metavar="STEPS",
                   help="steps of each run to compare (the last N; 0: all)")
    from .options import add_warmup_argument

    add_warmup_argument(p)
    p.add_argument("--applied", action="append", default=[], metavar="CODE",
                   help="treat this finding's fix as applied although the configuration "
                        "does not show it (repeatable), e.g. ZD006 after a bigger micro-batch")
    p.add_argument("--noise", type=float, default=0.05, metavar="FRACTION",
                   help="the floor for what the runs give no per-step spread of (counts, "
                        "bytes, memory): a relative change within it counts as unchanged; "
                        "times are judged against the runs' own per-step noise (a run "
                        "without per-step figures: a stated floor of 15 %%)")
    p.add_argument("--threshold", action="append", default=[], metavar="NAME=VALUE",
                   help="override a threshold for both diagnoses (repeatable)")
    p.add_argument("--link", default=None, metavar="CLASS",
                   help="link class for the bandwidth rules (default: inferred per run)")
    p.add_argument("--device-memory", default=None, metavar="SIZE",
                   help="device capacity to plan against, e.g. 80GB")
    from .options import add_link_profile_argument

    add_link_profile_argument(p)  # the predictions judged are made with it, as report's
    p.add_argument("--no-history", action="store_true",
                   help="do not append the outcomes to the history file")
    p.add_argument("--fail-on-worse", action="store_true",
                   help="exit 1 when a fix made things worse or the step time got worse")
    from ..trace import add_arguments

    add_arguments(p)  # facts profiler traces lack: applied to the side(s) that are traces
    p.set_defaults(func=run, format="text")


def run(args) -> int:
    from ..compare import history
    from ..compare.judge import compare, side
    from ..compare.render import RENDERERS
    from ..diagnosis import BY_CODE
    from ..errors import UserError
    from .options import diagnosis_options
    from ..sources import open_source
    from ..trace import facts_from_args, is_trace_spec, refuse_facts

    window, link, thresholds, memory = diagnosis_options(args)
    from .options import link_profile_option

    profile = link_profile_option(args)
    if not 0 <= args.noise < 1:
        raise UserError(f"--noise must be a fraction in [0, 1), not {args.noise:g}")
    applied = {c.strip().upper() for c in args.applied}
    unknown = sorted(applied - set(BY_CODE))
    if unknown:
        raise UserError(f"--applied {', '.join(unknown)}: not a rule code "
                        f"(known: {', '.join(sorted(BY_CODE))})")
    trace_facts = facts_from_args(args)
    if not any(is_trace_spec(s) for s in (args.before, args.after)):
        refuse_facts(trace_facts)
    sides = []
    for name, spec in (("BEFORE", args.before), ("AFTER", args.after)):
        source = open_source(spec, window=window,
                             trace_facts=trace_facts if is_trace_spec(spec) else None,
                             skip_warmup=not args.include_warmup)
        snap = source.snapshot()
        if not snap.ranks:
            raise UserError(f"{name} {source.description}: no ranks to compare")
        sides.append(side(snap, source.description, thresholds=thresholds, link=link,
                          device_memory_bytes=memory, window=window, link_profile=profile))
    doc = compare(*sides, applied=applied, noise=args.noise, thresholds=thresholds)
    if not args.no_history:
        history.record(history.history_path(args.before), doc, sides[0].snapshot)
    sys.stdout.write(RENDERERS[args.format](doc))
    return 1 if args.fail_on_worse and doc["summary"]["worse"] else 0
