"""The test support layer itself: the `slow` guard of tests/conftest.py and wait_until."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from tests.conftest import ProcessStarted
from tests.support.helpers import wait_until


def test_an_unmarked_test_cannot_start_a_process():
    """What keeps the `slow` marks true: `make test-fast` runs only unmarked tests, and an
    unmarked test that starts a process fails, whichever way it starts it."""
    with pytest.raises(ProcessStarted, match="test_an_unmarked_test_cannot_start_a_process"):
        subprocess.run([sys.executable, "-c", "pass"], check=True)
    import multiprocessing

    with pytest.raises(ProcessStarted):
        multiprocessing.get_context("spawn").Process(target=print).start()


@pytest.mark.slow
def test_a_slow_test_starts_processes():
    assert subprocess.run([sys.executable, "-c", "pass"]).returncode == 0


def test_wait_until_returns_the_value_once_true():
    box = []
    t = threading.Timer(0.05, box.append, args=("ready",))
    t.start()
    try:
        assert wait_until(lambda: box and box[0], timeout=10, what="the timer") == "ready"
    finally:
        t.cancel()


def test_wait_until_fails_naming_what_it_waited_for():
    start = time.monotonic()
    with pytest.raises(AssertionError, match=r"timed out after 0.2 s waiting for the moon"):
        wait_until(lambda: 0, timeout=0.2, what="the moon", interval=0.02)
    assert time.monotonic() - start >= 0.2


def test_job_scripts_are_code_with_their_usage():
    """The test programs are files (tests/support/jobs/), not string literals in tests: each
    compiles, says in its docstring how it is run, and is found by name; a wrong name fails."""
    import ast

    from tests.support.helpers import JOBS, job_command

    scripts = sorted(p for p in JOBS.glob("*.py") if p.name != "__init__.py")
    assert len(scripts) >= 7, scripts
    for path in scripts:
        tree = ast.parse(path.read_text(), filename=str(path))  # a SyntaxError fails here
        doc = ast.get_docstring(tree) or ""
        assert f"tests/support/jobs/{path.name}" in doc or \
            f"tests.support.jobs.{path.stem}" in doc, f"{path.name}: no usage line"
        assert job_command(path.stem)[1] == str(path)
    with pytest.raises(FileNotFoundError, match="no job script"):
        job_command("no_such_job")


def test_no_test_keeps_a_program_in_a_string():
    """A program handed to `python -c` or written to a .py file to run is a job script
    instead; `-c` stays only for a one-line command."""
    import ast
    from pathlib import Path

    tests = Path(__file__).resolve().parent
    found = []
    for path in sorted(tests.glob("test_*.py")) + sorted((tests / "support").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.List) and any(
                    isinstance(e, ast.Constant) and e.value == "-c" for e in node.elts):
                i = [getattr(e, "value", None) for e in node.elts].index("-c")
                prog = node.elts[i + 1] if i + 1 < len(node.elts) else None
                if not (isinstance(prog, ast.Constant) and isinstance(prog.value, str)
                        and "\n" not in prog.value.strip()):
                    found.append(f"{path.name}:{node.lineno}")
            # a program written to a .py file to be run: `(tmp / "x.py").write_text(...)`
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    node.func.attr == "write_text" and any(
                        isinstance(c, ast.Constant) and str(c.value).endswith(".py")
                        for c in ast.walk(node.func.value)):
                found.append(f"{path.name}:{node.lineno}")
    assert not found, f"programs kept in strings: {found} (make them tests/support/jobs/)"


def test_the_suite_runs_the_default_detail():
    """Issue 31: no suite-wide $ZERODOC_DETAIL (it once set "every" for every test, and the
    default was never run end to end); the caller's own is dropped too. A job attached with
    no option, as a user's, gets the default, adaptive detail: sampled steps."""
    import os

    from zerodoc.shim.config import AttachConfig

    assert "ZERODOC_DETAIL" not in os.environ
    assert AttachConfig.from_options().detail == "adaptive"
