"""The old `python -m zerodoc.X` names kept as thin aliases (issue 21): each says on stderr,
in one line, which command it now is, then runs that command's main (argv unchanged)."""

from __future__ import annotations

import sys


def run_alias(old: str, new: str, main) -> None:
    """Run `main` as `python -m {new}` does, after a one-line note naming the new command."""
    from .main import guarded

    print(f"zerodoc: `python -m {old}` is now `{new}` (the old name is a thin alias)",
          file=sys.stderr)
    sys.exit(guarded(main))
