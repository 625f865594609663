"""The `python -m` tools run from the cli package, under the names the docs give them.

The generators and helpers (`zerodoc/cli/`: rules_gen, dashboards_gen, metrics_doc,
webconfig, convert, rulecase) each have their own `if __name__ == "__main__":`; the old names
below the cli package (`zerodoc.ops.alerts`, `zerodoc.catalog`, `zerodoc.alerts`, ...) were
thin aliases importing these mains from below, dropped at 0.x (issue 31; tests/test_imports.py
fails on one coming back). Every `python -m zerodoc...` the README, docs/ and the Makefile
name is a tool that exists, and each tool is documented; `--help` runs each (slow: one
interpreter per tool).
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.support.helpers import ROOT

TOOLS = ("rules_gen", "dashboards_gen", "metrics_doc", "webconfig", "convert", "rulecase")
# What else `python -m zerodoc...` may name: the `zerodoc` command itself, and the processes
# zerodoc starts (the exporter sidecar, a demo rank), which are no user's command line.
OTHERS = ("zerodoc", "zerodoc.exporter.sidecar", "zerodoc.demo.worker")
NAMED = re.compile(r"-m (zerodoc[\w.]*\w)")


def documented() -> dict[str, set[str]]:
    """module -> the files (README, docs/, Makefile) that tell a reader to `python -m` it."""
    out: dict[str, set[str]] = {}
    for path in [ROOT / "README.md", ROOT / "Makefile", *sorted((ROOT / "docs").glob("*.md"))]:
        for mod in NAMED.findall(path.read_text(encoding="utf-8")):
            out.setdefault(mod, set()).add(path.name)
    return out


def test_the_docs_name_only_tools_that_exist_and_every_tool():
    named = documented()
    gone = {m: sorted(f) for m, f in named.items()
            if m not in OTHERS and m not in {f"zerodoc.cli.{t}" for t in TOOLS}}
    assert not gone, f"docs name `python -m` modules that are no tool: {gone}"
    undocumented = [t for t in TOOLS if f"zerodoc.cli.{t}" not in named]
    assert not undocumented, f"tools no doc names: {undocumented}"
    for tool in TOOLS:
        text = (ROOT / "zerodoc" / "cli" / f"{tool}.py").read_text(encoding="utf-8")
        assert 'if __name__ == "__main__":' in text, tool
        assert f'prog="python -m zerodoc.cli.{tool}"' in text, tool


@pytest.mark.slow
@pytest.mark.parametrize("tool", TOOLS)
def test_each_tool_prints_its_help_under_its_own_name(tool):
    r = subprocess.run([sys.executable, "-m", f"zerodoc.cli.{tool}", "--help"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"usage: python -m zerodoc.cli.{tool} "), r.stdout[:200]
