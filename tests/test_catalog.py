"""The metric catalog: Prometheus naming rules, and the generated docs are current."""

from __future__ import annotations

import re

from tests.support.helpers import ROOT
from zerodoc import catalog


def test_names_follow_prometheus_conventions():
    for m in catalog.CATALOG:
        assert re.fullmatch(r"zerodoc_[a-z0-9_]+", m.name), m.name
        assert m.help and m.help.endswith("."), m.name
        if m.type == "counter":
            assert m.name.endswith("_total"), m.name
        if m.unit == "seconds":
            assert "_seconds" in m.name, m.name
        if m.unit == "bytes":
            assert "_bytes" in m.name, m.name
        assert not set(m.labels) & set(catalog.RANK_LABELS), m.name
        for bad in ("step", "pid", "param"):
            assert bad not in m.labels, (m.name, bad)


def test_metrics_doc_is_generated_from_the_catalog():
    from zerodoc.ops.metricsdoc import markdown

    doc = (ROOT / "docs" / "metrics.md").read_text()
    assert doc == markdown(), "run: python -m zerodoc.cli.metrics_doc > docs/metrics.md"
