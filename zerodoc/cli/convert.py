"""`python -m zerodoc.cli.convert SRC_RUN_DIR DST_RUN_DIR [--every N]`: a schema-1 run
directory rewritten as the current schema (3) (`zerodoc.runlog.convert`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..runlog import convert
from ..runlog.convert import convert_log
from ..runlog.reader import rank_logs
from .main import guarded


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m zerodoc.cli.convert",
                                 description=convert.__doc__.splitlines()[0])
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--every", type=int, default=100, help="steps per interval line")
    args = ap.parse_args(argv)
    src, dst = Path(args.src), Path(args.dst)
    paths = rank_logs(src)
    if not paths:
        print(f"{src}: no rank-*.jsonl run logs", file=sys.stderr)
        return 2
    if rank_logs(dst):
        print(f"{dst} already holds run logs; convert into an empty directory",
              file=sys.stderr)
        return 2
    for p in paths:
        n = convert_log(p, dst, args.every)
        print(f"{p.name}: {n} steps")
    return 0


if __name__ == "__main__":
    sys.exit(guarded(main))  # a closed pipe or Ctrl-C ends it quietly
