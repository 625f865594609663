"""`python -m zerodoc.testing.rulecases RUN_DIR [CODE]`: a rule case skeleton (JSON) from a
real run, to edit into tests/data/rules/ (the format: `zerodoc.testing.rulecases`)."""

from __future__ import annotations

import json
import sys


def main(argv: list[str] | None = None) -> int:
    from ..runlog import load_run
    from ..testing.rulecases import case_from_snapshot

    argv = sys.argv[1:] if argv is None else argv
    snap = load_run(argv[0], window=None, stale_after_s=float("inf"))
    print(json.dumps(case_from_snapshot(snap, *(argv[1:2] or ["ZD000"])), indent=1))
    return 0
