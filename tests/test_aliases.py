"""Issue 21: every `python -m zerodoc.X` that users had before the restructuring keeps working
as a thin alias of the command it became: the same output (here `--help`, and `--check` of
the generators against the committed files), and one line on stderr naming the new command.
Each case starts two interpreters (slow)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.helpers import ROOT

# old name -> (the module now run by `python -m`, the command the note names)
ALIASES = {
    "zerodoc.alerts": ("zerodoc.ops.alerts", "python -m zerodoc.ops.alerts"),
    "zerodoc.grafana.build": ("zerodoc.ops.grafana.build", "python -m zerodoc.ops.grafana.build"),
    "zerodoc.diagnosis.testdata": ("zerodoc.testing.rulecases",
                                   "python -m zerodoc.testing.rulecases"),
    "zerodoc.cli": ("zerodoc", "zerodoc"),
}


def run_module(module: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def check_same(old: str, *args: str) -> None:
    new_module, new_command = ALIASES[old]
    got, want = run_module(old, *args), run_module(new_module, *args)
    assert want.returncode == 0, want.stderr
    assert got.returncode == 0, got.stderr
    assert got.stdout == want.stdout
    note = got.stderr.replace(want.stderr, "", 1).strip()
    assert note == (f"zerodoc: `python -m {old}` is now `{new_command}` "
                    f"(the old name is a thin alias)"), got.stderr


@pytest.mark.slow
@pytest.mark.parametrize("old", sorted(ALIASES))
def test_old_name_prints_the_new_commands_help(old):
    check_same(old, "--help")
    assert run_module(old, "--help").stdout.startswith("usage: ")  # help, not an empty match


@pytest.mark.slow
@pytest.mark.parametrize("old", ["zerodoc.alerts", "zerodoc.grafana.build"])
def test_old_generator_name_checks_the_committed_files(old):
    """The generator runs, not only its parser: --check exits 0 under both names (the
    committed files are up to date) and prints the same."""
    check_same(old, "--check")


def test_every_old_name_is_an_alias_of_a_module_that_runs():
    """Fast: each old name and its new module exist as files that `python -m` can run."""
    for old, (new, _) in ALIASES.items():
        for mod in (old, new):
            path = ROOT.joinpath(*mod.split("."))
            assert (path / "__main__.py").is_file() or path.with_suffix(".py").is_file(), mod
