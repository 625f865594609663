"""`zerodoc` command line: one sub-command per module, registered in COMMANDS.

Each command module defines ``add_parser(subparsers)`` which registers its parser and sets
``func`` (called with the parsed args, returns an exit code). Command modules keep their
imports light; heavy imports (torch, Textual) happen inside ``func``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from ..errors import UserError

# name -> module; the order is the order in --help.
COMMANDS: list[tuple[str, str]] = [
    ("demo", "zerodoc.cli.demo"),
    ("plan", "zerodoc.cli.plan"),
    ("report", "zerodoc.cli.report"),
    ("compare", "zerodoc.cli.compare"),
    ("whatif", "zerodoc.cli.whatif"),
    ("linkprobe", "zerodoc.cli.linkprobe"),
    ("tui", "zerodoc.cli.tui"),
    ("targets", "zerodoc.cli.targets"),
    ("dashboards", "zerodoc.cli.dashboards"),
    ("stack", "zerodoc.cli.stack"),
    ("export", "zerodoc.cli.export"),
]


class Parser(argparse.ArgumentParser):
    """argparse with a one-line usage error (exit code 2): `zerodoc report: error: ...`,
    pointing at --help instead of printing the usage block. Sub-command parsers are made of
    the same class (argparse's default), so every `zerodoc` command line gets it."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    from ..version import __version__

    p = Parser(
        prog="zerodoc",
        description="Monitoring and diagnostics for sharded (FSDP / ZeRO) PyTorch training.",
    )
    p.add_argument("--version", action="version", version=f"zerodoc {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for _name, module in COMMANDS:
        importlib.import_module(module).add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    """The `zerodoc` console script."""
    return guarded(_main, argv)


def _main(argv: list[str] | None) -> int:
    from ..ops.resources import ResourcesMissing

    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except (UserError, ResourcesMissing) as e:
        print(f"zerodoc {args.command}: error: {e}", file=sys.stderr)
        return 2


# Exit codes of a command ended from outside, as a shell reports a process killed by the signal.
EXIT_BROKEN_PIPE = 128 + 13  # SIGPIPE: whoever read our output went away (`... | head`)
EXIT_INTERRUPTED = 128 + 2  # SIGINT: Ctrl-C


def guarded(func, *args) -> int:
    """Run a command line entry point so that a closed pipe and Ctrl-C end it quietly.

    The one mechanism every zerodoc command line goes through (`zerodoc ...` and the
    `python -m zerodoc.cli.<generator>` tools): the command's own `finally` blocks run (stopping
    child processes), then no traceback is printed. After a broken pipe stdout is pointed at
    /dev/null, so the interpreter's last flush cannot complain either.
    """
    try:
        code = func(*args)
        sys.stdout.flush()  # a pipe closed under buffered output fails here, not at exit
        return int(code or 0)
    except BrokenPipeError:
        _detach_stdout()
        return EXIT_BROKEN_PIPE
    except SystemExit:  # argparse after --help / --version / a usage error
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            _detach_stdout()
            return EXIT_BROKEN_PIPE
        raise
    except KeyboardInterrupt:
        try:
            sys.stdout.flush()
        except (BrokenPipeError, ValueError, OSError):
            _detach_stdout()
        return EXIT_INTERRUPTED


def _detach_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # stdout already closed or not a file
        pass


if __name__ == "__main__":
    sys.exit(main())
