"""Command-line options that choose which run a source shows (report, tui). Standard library
only: imported while the command line is parsed."""

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
