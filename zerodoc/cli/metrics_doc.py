"""`python -m zerodoc.catalog > docs/metrics.md`: the metric catalog as Markdown (the text is
`zerodoc.ops.metricsdoc`'s)."""

from __future__ import annotations


def main() -> int:
    from ..ops.metricsdoc import markdown

    print(markdown(), end="")
    return 0
