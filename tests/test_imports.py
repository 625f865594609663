"""Import hygiene, in one place: no import circle inside the package, every import runs from a
higher layer to a lower one (or within its layer), the shim (which runs inside the training
ranks) imports nothing of the analysis, CLI or TUI side, and what an import pulls in at run
time (torch, Textual, Grafana tooling, trainer frameworks) stays where it belongs.

The static checks read the source (every `import` statement, also those inside functions:
a lazy import is still a dependency), so they run in the fast subset. The run-time checks
start a fresh interpreter each (`slow`). The layers are docs/architecture.md's, bottom up.
An `if __name__ == "__main__":` block and a `__main__.py` count with the module or package
they are in: a `python -m zerodoc.X` alias below the commands (the old names dropped at 0.x,
issue 31) imports its `cli/` main upwards, in a circle with it, and fails here.
"""

from __future__ import annotations

import ast
import json
import subprocess
from pathlib import Path

import pytest

from tests.support.helpers import ROOT, job_command, job_env

# Bottom up: a module may import its own layer and the layers below it, never one above.
LAYERS: tuple[tuple[str, frozenset[str]], ...] = (
    ("base", frozenset({"version", "errors"})),
    ("vocabulary", frozenset({"catalog", "thresholds", "runmodel", "humanize", "windowsamples",
                              "stalls", "unitstats", "planner"})),
    ("in the job", frozenset({"__init__", "shim", "exporter", "runlog", "integrations"})),
    ("analysis", frozenset({"trace", "sources", "diagnosis", "report", "compare", "whatif",
                            "measures"})),
    ("terminal UI", frozenset({"tui"})),
    ("demo job", frozenset({"demo"})),
    ("operations", frozenset({"ops"})),
    ("commands and test support", frozenset({"cli", "__main__", "testing"})),
)
LAYER_OF = {part: i for i, (_name, parts) in enumerate(LAYERS) for part in parts}
TOP = len(LAYERS) - 1
# What the shim may import: it runs inside every training rank.
SHIM_MAY_IMPORT = frozenset({"version", "errors", "catalog", "thresholds", "runmodel",
                             "windowsamples", "stalls", "shim", "exporter", "runlog", "integrations"})


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph(root: Path, package: str = "zerodoc") -> dict[str, set[str]]:
    """module -> the package's modules it imports (a `from P import n` counts as P.n when n
    is a module, else as P): every import statement, in functions and `__main__` blocks too."""
    mods = {module_name(p, root): p for p in sorted((root / package).rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for mod, path in mods.items():
        pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        found: set[str] = set()

        def visit(node: ast.AST) -> None:
            for ch in ast.iter_child_nodes(node):
                if isinstance(ch, ast.Import):
                    found.update(a.name for a in ch.names)
                elif isinstance(ch, ast.ImportFrom):
                    if ch.level:
                        base = pkg.split(".")[: len(pkg.split(".")) - ch.level + 1]
                        src = ".".join(base + ([ch.module] if ch.module else []))
                    else:
                        src = ch.module or ""
                    for a in ch.names:
                        found.add(f"{src}.{a.name}" if f"{src}.{a.name}" in mods else src)
                visit(ch)

        visit(ast.parse(path.read_text(), str(path)))
        graph[mod] = {m for m in found if m in mods and m != mod}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def part(mod: str) -> str:
    """The layer table's name for a module: zerodoc.X.* -> X; the package root -> __init__."""
    bits = mod.split(".")
    return "__init__" if len(bits) == 1 else bits[1]


def layer(mod: str) -> int:
    return LAYER_OF[part(mod)]


def no_circle(graph) -> list[str]:
    return [" <-> ".join(c) for c in cycles(graph)]


def layers_only_downward(graph) -> list[str]:
    unknown = sorted({part(m) for m in graph} - LAYER_OF.keys())
    if unknown:
        return [f"zerodoc.{u} is in no layer of tests/test_imports.py LAYERS" for u in unknown]
    return [f"{m} ({LAYERS[layer(m)][0]}) imports {d} ({LAYERS[layer(d)][0]})"
            for m, deps in sorted(graph.items()) for d in sorted(deps) if layer(d) > layer(m)]


def shim_imports_only_the_jobs_side(graph) -> list[str]:
    return [f"{m} imports {d}" for m, deps in sorted(graph.items())
            if part(m) == "shim" for d in sorted(deps) if part(d) not in SHIM_MAY_IMPORT]


STATIC = {"no import circle": no_circle, "layers only downward": layers_only_downward,
          "the shim imports only the job's side": shim_imports_only_the_jobs_side}

# Run time: (statement, top-level packages or zerodoc modules that must not be imported,
# environment overrides). Each runs in a fresh interpreter.
RUNTIME = {
    "import zerodoc: no torch": (
        "import zerodoc", ("torch",), {}),
    "the shim and exporter: no TUI or Grafana tooling": (
        "import zerodoc, zerodoc.shim.monitor, zerodoc.exporter.prometheus",
        ("textual", "rich", "grafana_foundation_sdk", "grafana_client", "niquests"), {}),
    "the command line: no Textual, no Grafana tooling, no TUI modules": (
        "import zerodoc, zerodoc.cli.main, zerodoc.cli.tui, zerodoc.exporter.targets; "
        "zerodoc.cli.main.build_parser()",
        ("textual", "rich", "grafana_foundation_sdk", "grafana_client", "niquests", "urllib3",
         "urllib3_future", "zerodoc.tui"), {}),
    "file_sd targets (written in the ranks): standard library only": (
        "import zerodoc.exporter.targets",
        ("torch", "prometheus_client", "grafana_foundation_sdk", "grafana_client", "yaml",
         "urllib3", "numpy"), {}),
    "trainer integrations: no framework": (
        "import zerodoc, zerodoc.integrations, zerodoc.integrations.common, "
        "zerodoc.integrations.accelerate",
        ("torch", "transformers", "accelerate", "lightning", "pytorch_lightning", "torchtitan"),
        {}),
    "the GPU modules import without CUDA": (
        "import zerodoc.shim.cuda, zerodoc.shim.cuda_memory, zerodoc.shim.devclock, "
        "zerodoc.shim.nvml", (), {"CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin"}),
}

CASES = [pytest.param("static", name, id=name) for name in STATIC] + [
    pytest.param("runtime", name, id=name, marks=pytest.mark.slow) for name in RUNTIME]


@pytest.mark.parametrize("kind,name", CASES)
def test_import_hygiene(kind, name):
    if kind == "static":
        bad = STATIC[name](import_graph(ROOT))
        assert not bad, f"{name}: " + "; ".join(bad)
        return
    statement, forbidden, env = RUNTIME[name]
    # an environment override is the whole environment (no CUDA variables inherited); the
    # job finds the package on PYTHONPATH, the repository root
    out = subprocess.run(job_command("imported_modules", statement, json.dumps(forbidden)),
                         capture_output=True, text=True, timeout=120, cwd=ROOT,
                         env=job_env(env or None))
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "", f"{name}: imported {out.stdout.strip()}"


def test_the_checks_find_what_they_look_for(tmp_path):
    """The static checks can fail: a circle, an upward import, a shim reaching for the TUI
    and a `python -m` alias below the commands (a `__main__` block, and a `__main__.py`, each
    running a cli main), planted in a throwaway package, are each reported."""
    pkg = tmp_path / "zerodoc"
    for rel, text in {
        "__init__.py": "",
        "catalog.py": "from .ops import cardinality\n",  # vocabulary -> operations: upward
        "ops/__init__.py": "",
        "ops/cardinality.py": "from .. import catalog\n",  # ... and a circle with it
        "shim/__init__.py": "",
        "shim/monitor.py": "def f():\n    from ..tui import app\n",  # lazy, still counted
        "tui/__init__.py": "",
        "tui/app.py": "",
        "runlog/__init__.py": "",
        "runlog/convert.py": "if __name__ == '__main__':\n    from ..cli.convert import main\n",
        "ops/alerts/__init__.py": "",
        "ops/alerts/__main__.py": "from ...cli.rules_gen import main\n",
        "cli/__init__.py": "",
        "cli/convert.py": "from ..runlog import convert\n",
        "cli/rules_gen.py": "from ..ops import alerts\n",
    }.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    graph = import_graph(tmp_path)
    assert no_circle(graph) == ["zerodoc.catalog <-> zerodoc.ops.cardinality",
                                "zerodoc.cli.convert <-> zerodoc.runlog.convert"]
    assert layers_only_downward(graph) == [
        "zerodoc.catalog (vocabulary) imports zerodoc.ops.cardinality (operations)",
        "zerodoc.ops.alerts.__main__ (operations) imports zerodoc.cli.rules_gen "
        "(commands and test support)",
        "zerodoc.runlog.convert (in the job) imports zerodoc.cli.convert "
        "(commands and test support)",
        "zerodoc.shim.monitor (in the job) imports zerodoc.tui.app (terminal UI)"]
    assert shim_imports_only_the_jobs_side(graph) == ["zerodoc.shim.monitor imports zerodoc.tui.app"]
