"""`python -m zerodoc.cli.metrics_doc > docs/metrics.md`: the metric catalog as Markdown (the
text is `zerodoc.ops.metricsdoc`'s)."""

from __future__ import annotations

import argparse
import sys

from .main import guarded


def main(argv: list[str] | None = None) -> int:
    from ..ops.metricsdoc import markdown

    argparse.ArgumentParser(
        prog="python -m zerodoc.cli.metrics_doc",
        description="Print the metric catalog as Markdown (docs/metrics.md: a test fails "
                    "when the committed file differs).").parse_args(argv)
    print(markdown(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(guarded(main))  # a closed pipe or Ctrl-C ends it quietly
