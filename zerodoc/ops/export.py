"""The operations files as a tree to commit (GitOps): what `zerodoc export DIR` writes.

The tree has the layout of zerodoc's own source tree — `dashboards/` (+ `provisioning/`),
`rules/` (+ `tests/`), `exporters/` (Prometheus, Alertmanager, Kubernetes), `docs/runbooks.md`
— so the relative paths inside the files (`rule_files: ../rules/...`, `runbook_url:
docs/runbooks.md#...`) hold in the copy. The rule files are generated with the caller's
options (thresholds, link class, window, `for:`, runbook base URL); everything else is the
installed copy as is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from . import alerts, resources
from .alerts import RuleOptions
from ..thresholds import DEFAULT, Thresholds

RULE_TESTS = "rules/tests/"
K8S_RULE = f"exporters/kubernetes/{alerts.PROMETHEUS_RULE_FILE}"


@dataclass
class ExportTree:
    files: dict[str, bytes] = field(default_factory=dict)
    """Relative path ('/'-separated) -> content."""
    notes: list[str] = field(default_factory=list)
    """What the caller should know (e.g. the promtool tests left out)."""


def build(t: Thresholds = DEFAULT, opts: RuleOptions | None = None) -> ExportTree:
    """The files of an export, in memory."""
    o = opts or RuleOptions()
    tree = ExportTree({rel: p.read_bytes() for rel, p in resources.files()})
    for name, text in alerts.rule_files(t, o).items():
        tree.files[f"rules/{name}"] = text.encode()
    tree.files[K8S_RULE] = alerts.prometheus_rule(t, o).encode()
    if t != DEFAULT or replace(o, runbook_base="") != RuleOptions():
        # The promtool suite pins the default thresholds, link, window and for:.
        for rel in [r for r in tree.files if r.startswith(RULE_TESTS)]:
            del tree.files[rel]
        tree.notes.append("rules/tests/ left out: its promtool cases are written for the "
                          "default thresholds, link, window and for:")
    elif o.runbook_base:
        for rel in [r for r in tree.files if r.startswith(RULE_TESTS)]:
            tree.files[rel] = re.sub(
                rb'(runbook_url: ")(docs/runbooks\.md#)',
                lambda m: m.group(1) + o.runbook_base.encode() + m.group(2), tree.files[rel])
    return tree


def differences(tree: ExportTree, dest: str | Path) -> list[str]:
    """Relative paths whose file under `dest` is missing or differs."""
    dest = Path(dest)
    out = []
    for rel, data in sorted(tree.files.items()):
        p = dest / rel
        try:
            same = p.read_bytes() == data
        except OSError:
            same = False
        if not same:
            out.append(rel)
    return out


def write(tree: ExportTree, dest: str | Path) -> list[str]:
    """Write the files that differ (other files under `dest` are left alone); returns them."""
    dest = Path(dest)
    changed = differences(tree, dest)
    for rel in changed:
        p = dest / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(f".{p.name}.zerodoc-tmp")
        tmp.write_bytes(tree.files[rel])
        tmp.replace(p)
    return changed
