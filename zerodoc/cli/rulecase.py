"""`python -m zerodoc.cli.rulecase RUN_DIR [CODE]`: a rule case skeleton (JSON) from a
real run, to edit into tests/data/rules/ (the format: `zerodoc.testing.rulecases`)."""

from __future__ import annotations

import argparse
import json
import sys

from .main import guarded


def main(argv: list[str] | None = None) -> int:
    from ..errors import UserError
    from ..runlog import load_run
    from ..testing.rulecases import case_from_snapshot

    p = argparse.ArgumentParser(
        prog="python -m zerodoc.cli.rulecase",
        description="Print a rule case skeleton (JSON) from a real run directory, every step "
                    "of its newest segment, to edit into tests/data/rules/.")
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (rank-*.jsonl)")
    p.add_argument("code", metavar="CODE", nargs="?", default="ZD000",
                   help="the rule the case is for (default: ZD000, to fill in)")
    args = p.parse_args(argv)
    try:
        snap = load_run(args.run_dir, window=None, stale_after_s=float("inf"))
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(case_from_snapshot(snap, args.code), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(guarded(main))  # a closed pipe or Ctrl-C ends it quietly
