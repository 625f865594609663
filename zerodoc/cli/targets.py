"""`zerodoc targets`: the Prometheus scrape targets of a run, from its run log headers."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from ..errors import UserError
from ..exporter.targets import run_targets, write_atomic

FORMATS = ("file_sd", "static")


def add_parser(sub) -> None:
    p = sub.add_parser(
        "targets", help="print or write the Prometheus scrape targets of a run",
        description="Build the scrape targets of a run (one per rank: host:port and the "
        "labels job, rank, local_rank, node, run_id) from the run log headers. "
        "file_sd: a JSON file for Prometheus file_sd_configs; static: a static_configs "
        "block to paste under a scrape job.")
    p.add_argument("run_dir", nargs="?", default=None, metavar="RUN_DIR",
                   help="run directory (default: the latest run under ./zerodoc-runs)")
    p.add_argument("--write", metavar="FILE", default=None,
                   help="write the targets to FILE (atomically) instead of printing them; "
                        "its directory must exist (or --mkdir)")
    p.add_argument("--mkdir", action="store_true",
                   help="with --write: create FILE's directory when it does not exist")
    p.add_argument("--format", choices=FORMATS, default="file_sd", help="output format")
    p.add_argument("--job", default=None,
                   help="value of the job label (default $ZERODOC_JOB or 'zerodoc')")
    p.add_argument("--include-ended", action="store_true",
                   help="also list ranks whose run log says they finished")
    p.set_defaults(func=run)


def format_static(entries: list[dict]) -> str:
    """A `static_configs:` block (YAML) for a scrape job."""
    lines = ["static_configs:"]
    for e in entries:
        lines.append(f"  - targets: [{', '.join(json.dumps(t) for t in e['targets'])}]")
        labels = ", ".join(f"{k}: {json.dumps(v)}" for k, v in e["labels"].items())
        lines.append(f"    labels: {{{labels}}}")
    return "\n".join(lines) + "\n"


def render(entries: list[dict], fmt: str) -> str:
    if fmt == "static":
        return format_static(entries)
    return json.dumps(entries, indent=1) + "\n"


def run(args) -> int:
    from ..runlog import latest_run

    if args.mkdir and not args.write:
        raise UserError("--mkdir goes with --write FILE")
    if args.write:
        out = Path(args.write)
        if out.is_dir() or args.write.endswith(("/", os.sep)):
            raise UserError(f"--write {args.write}: is a directory; give a file name "
                            "(e.g. zerodoc.json)")
        if out.parent.exists() and not out.parent.is_dir():
            raise UserError(f"cannot write {args.write}: {out.parent} is not a directory")
        if not out.parent.is_dir() and not args.mkdir:
            raise UserError(f"--write {args.write}: directory {out.parent} does not exist "
                            "(create it, or add --mkdir)")
    run_dir = Path(args.run_dir) if args.run_dir else latest_run()
    entries, warnings = run_targets(run_dir, args.job, args.include_ended)
    for w in warnings:
        print(f"zerodoc targets: warning: {w}", file=sys.stderr)
    if not entries:
        raise UserError(f"{run_dir}: no rank serves /metrics (all finished, or started "
                        "with port=False)")
    text = render(entries, args.format)
    if args.write:
        try:
            path = write_atomic(args.write, text)
        except OSError as e:
            raise UserError(f"cannot write {args.write}: {e.strerror or e}") from None
        print(f"zerodoc targets: {len(entries)} target(s) written to {path}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
