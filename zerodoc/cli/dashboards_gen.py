"""`python -m zerodoc.cli.dashboards_gen`: write (or --check) zerodoc's Grafana dashboards
(`make dashboards`). The generator is `zerodoc.ops.grafana.build`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..ops.grafana.build import DASHBOARDS_DIR, render_all, stale_files
from .main import guarded


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m zerodoc.cli.dashboards_gen",
                                description="Generate zerodoc's Grafana dashboards (JSON).")
    p.add_argument("--out", default=str(DASHBOARDS_DIR), help="output directory")
    p.add_argument("--check", action="store_true", help="exit 1 if the files are stale")
    a = p.parse_args(argv)
    if a.check:
        stale = stale_files(a.out)
        for name in stale:
            print(f"stale: {Path(a.out) / name} (run `python -m zerodoc.cli.dashboards_gen`)",
                  file=sys.stderr)
        return 1 if stale else 0
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, text in render_all().items():
        (out / name).write_text(text)
        print(f"wrote {out / name}")
    return 0


if __name__ == "__main__":
    sys.exit(guarded(main))  # a closed pipe or Ctrl-C ends it quietly
