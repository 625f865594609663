"""`zerodoc` command line: one sub-command per module, registered in COMMANDS.

Each command module defines ``add_parser(subparsers)`` which registers its parser and sets
``func`` (called with the parsed args, returns an exit code). Command modules keep their
imports light; heavy imports (torch, Textual) happen inside ``func``.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from .errors import UserError

# name -> module; the order is the order in --help.
COMMANDS: list[tuple[str, str]] = [
    ("demo", "zerodoc.demo.cli"),
    ("plan", "zerodoc.plan_cli"),
    ("report", "zerodoc.report_cli"),
    ("tui", "zerodoc.tui_cli"),
    ("targets", "zerodoc.targets_cli"),
    ("dashboards", "zerodoc.dashboards_cli"),
    ("stack", "zerodoc.stack_cli"),
]


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    p = argparse.ArgumentParser(
        prog="zerodoc",
        description="Monitoring and diagnostics for sharded (FSDP / ZeRO) PyTorch training.",
    )
    p.add_argument("--version", action="version", version=f"zerodoc {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for _name, module in COMMANDS:
        importlib.import_module(module).add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except UserError as e:
        print(f"zerodoc {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
