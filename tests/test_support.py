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
