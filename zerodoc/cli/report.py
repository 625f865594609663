"""`zerodoc report [SOURCE]`: non-interactive diagnosis of one run (CI-friendly)."""

from __future__ import annotations

import sys

from .helpformat import DefaultsHelpFormatter

SEVERITY_NAMES = ("info", "warning", "error", "critical")


def add_parser(sub) -> None:
    p = sub.add_parser(
        "report", help="print the findings, per-unit table and step breakdown of a run",
        description="Diagnose one run and print the findings (most severe first), the "
        "per-unit table and the step breakdown. SOURCE is a run directory, rank endpoints "
        "(host:port[,host:port...] or host:9730-9737), a Prometheus or VictoriaMetrics URL "
        "(http://...), "
        "PyTorch profiler traces (a directory of them, or .json/.json.gz files separated by "
        "commas, one per rank), Nsight Systems SQLite exports (nsys export --type sqlite: "
        "a .sqlite file, a directory of them or files separated by commas; each process "
        "and device that ran kernels is a rank) or a folder of PyTorch flight-recorder dumps "
        "(one file per rank, pickle or JSON, as TORCH_NCCL_DUMP_ON_TIMEOUT writes them: read "
        "as plain data only, never run; they say which rank stopped the job); "
        "default: the latest run under ./zerodoc-runs. Exit status: 0, or 1 when a finding "
        "at or above --fail-on is present or when the run has no data to diagnose (no "
        "completed step, no sharded unit), 2 on bad input.",
        formatter_class=DefaultsHelpFormatter)
    p.add_argument("source", nargs="?", default=None, metavar="SOURCE",
                   help="run directory, host:port list / range, Prometheus URL, profiler "
                        "traces, Nsight Systems .sqlite exports, or flight-recorder dumps")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", dest="format", action="store_const", const="json",
                     help="machine-readable JSON (schema 1, docs/report.md)")
    fmt.add_argument("--markdown", dest="format", action="store_const", const="markdown",
                     help="Markdown (for a CI job summary or a PR comment)")
    p.add_argument("--window", type=int, default=20, metavar="STEPS",
                   help="steps to diagnose (the last N; 0: all). On rank endpoints a one-shot "
                        "report covers the steps done in the ~2 s after its first scrape "
                        "(at least one; the header says how many)")
    from .options import add_run_arguments, add_warmup_argument

    add_warmup_argument(p)
    add_run_arguments(p)
    p.add_argument("--threshold", action="append", default=[], metavar="NAME=VALUE",
                   help="override a threshold (repeatable), e.g. exposed_fraction_warn=0.2")
    p.add_argument("--link", default=None, metavar="CLASS",
                   help="link class for the bandwidth rules (nvlink, pcie, infiniband, "
                        "ethernet, gloo-cpu); default: inferred from the run")
    from .options import add_link_profile_argument

    add_link_profile_argument(p)  # the rules' predicted effects, as `zerodoc whatif`'s
    p.add_argument("--device-memory", default=None, metavar="SIZE",
                   help="device capacity to plan against, e.g. 80GB or 80GiB (default: what "
                        "the ranks report)")
    p.add_argument("--fail-on", default=None, metavar="SEVERITY",
                   help=f"exit 1 if a finding at or above this severity is present, or if "
                        f"the run has no data to diagnose ({', '.join(SEVERITY_NAMES)})")
    from .options import add_runlog_argument

    add_runlog_argument(p)
    from ..trace import add_arguments

    add_arguments(p)
    p.set_defaults(func=run, format="text")


def run(args) -> int:
    from ..diagnosis import Severity, diagnose
    from ..errors import UserError
    from ..report import RENDERERS, build_report
    from ..sources import open_source

    fail_on = Severity.parse(args.fail_on) if args.fail_on else None
    from .options import diagnosis_options

    window, _link, thresholds, device_memory = diagnosis_options(args)
    from ..trace import facts_from_args

    source = open_source(args.source, window=window, trace_facts=facts_from_args(args),
                         run_id=getattr(args, "run_id", None),
                         segment=getattr(args, "segment", None),
                         skip_warmup=not args.include_warmup)
    from .options import apply_runlog

    apply_runlog(args, source)
    snap = source.snapshot()
    if not snap.ranks:
        raise UserError(f"{source.description}: no ranks to report on")
    from .options import link_profile_option

    findings = diagnose(snap, thresholds, link=args.link, device_memory_bytes=device_memory,
                        link_profile=link_profile_option(args))
    from ..compare.history import annotate, history_path

    findings = annotate(findings, snap, history_path(args.source))
    from ..diagnosis.context import infer_link

    link = args.link or infer_link(snap.any_rank.facts)
    rep = build_report(snap, findings, source=source.description, thresholds=thresholds,
                       link=link, window=window)
    sys.stdout.write(RENDERERS[args.format](rep))
    if fail_on is not None and (rep["data_problems"] or
                                any(f.severity >= fail_on for f in findings)):
        return 1
    return 0
