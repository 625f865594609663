"""Every alert's runbook_url lands on a section of docs/runbooks.md that answers the 2 a.m.
questions: what it means, how to confirm it, the fix, how to silence it for a known cause.

The witness is the generated rule files (what Prometheus sends) and the Markdown headings as
GitHub renders anchors, not the generator's own helper.
"""

from __future__ import annotations

import re

import pytest
import yaml

from tests.support.helpers import ROOT
from zerodoc.ops import alerts, resources

RUNBOOKS = ROOT / "docs" / "runbooks.md"


def github_anchor(heading: str) -> str:
    """GitHub's heading anchor: lower case, punctuation dropped, spaces to hyphens."""
    h = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return h.replace(" ", "-")


def sections(text: str) -> dict[str, str]:
    """{anchor: body} of the level-2 sections."""
    parts = re.split(r"^## (.+)$", text, flags=re.M)
    return {github_anchor(parts[i]): parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def generated_alerts() -> list[dict]:
    out = []
    for path in (ROOT / "rules" / alerts.ALERTS_FILE,
                 ROOT / "exporters" / "kubernetes" / alerts.PROMETHEUS_RULE_FILE):
        doc = yaml.safe_load(path.read_text())
        groups = doc["spec"]["groups"] if "spec" in doc else doc["groups"]
        out += [r for g in groups for r in g["rules"] if "alert" in r]
    return out


def test_every_runbook_url_resolves_to_an_anchor():
    found = sections(RUNBOOKS.read_text())
    rules = generated_alerts()
    assert len({r["alert"] for r in rules}) >= 10
    for r in rules:
        page, _, anchor = r["annotations"]["runbook_url"].partition("#")
        assert page == "docs/runbooks.md", r["alert"]
        assert anchor in found, f"{r['alert']}: no section #{anchor} in docs/runbooks.md"


@pytest.mark.parametrize("name", sorted({r["alert"] for r in generated_alerts()}))
def test_each_section_answers_the_questions(name):
    body = sections(RUNBOOKS.read_text())[name.lower()]
    for part in ("**Means.**", "**Confirm.**", "**Fix.**", "**Silence**"):
        assert part in body, f"{name}: no {part}"
    confirm = body.split("**Confirm.**")[1].split("**Fix.**")[0]
    # a command, a dashboard panel or a query to run, not only prose
    assert re.search(r"zerodoc report|zerodoc / |zerodoc_\w+\{", confirm), name
    silence = body.split("**Silence**")[1]
    assert f"alertname={name}" in silence and "amtool silence add" in silence, name
    assert "--duration=" in silence and "--comment=" in silence, name


def test_a_missing_section_fails(tmp_path):
    """The check can fail: drop one section and its alert no longer resolves."""
    text = RUNBOOKS.read_text()
    cut = re.sub(r"^## ZerodocSlowLink$.*?(?=^## )", "", text, flags=re.M | re.S)
    assert "zerodocslowlink" in sections(text) and "zerodocslowlink" not in sections(cut)


def test_runbook_base_prefixes_every_url():
    base = "https://git.example.com/ops/monitoring/-/blob/main/"
    rules = alerts.alerting_rules(runbook_base=base)
    assert all(r["annotations"]["runbook_url"].startswith(base + "docs/runbooks.md#")
               for r in rules)


def test_runbooks_travel_with_the_package():
    assert resources.runbooks().read_text() == RUNBOOKS.read_text()
    assert "docs/runbooks.md" in {rel for rel, _ in resources.files()}
