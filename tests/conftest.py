"""Suite-wide settings and the `slow` mark.

Per-unit detail (attach option `detail`, issue 19's tiers): the suite runs what users run,
the default (adaptive: per-unit detail on sampled steps). No suite-wide $ZERODOC_DETAIL
(issue 31: it hid the default from every test): a test whose subject needs every step's
per-unit numbers (a profiler or a floor held against each step) passes `detail="every"` to
attach() itself, with the reason beside it (and $ZERODOC_DETAIL from the caller's shell is
dropped, so a run of the suite always tests the default); `zerodoc demo` forces it for its own runs, and a
slow link injected (`inject_latency_s`) forces it too. `tests/support/helpers.detail_steps`
gives a run log's sampled steps (the others have no per-unit rows: not measured, not zero).

`slow` marks every test that starts another process: a multi-process demo job, Prometheus,
Alertmanager, promtool, a CLI in a subprocess, a fresh venv. `make test-fast` runs
`-m "not slow"` (the pure-Python parts); `make test` runs everything. The marks are applied
here, by module (SLOW_MODULES: every test of the file starts processes) and by fixture
(SLOW_FIXTURES: a test using one of these fixtures waits for a job or server), plus the
explicit `@pytest.mark.slow` in the files for single tests. They are kept true by a guard: a
test that is NOT marked slow and starts a process fails, naming itself, in every run.
"""

from __future__ import annotations

import os

import pytest

# The default whatever the caller's shell holds (subprocess ranks inherit the environment).
os.environ.pop("ZERODOC_DETAIL", None)

# Test modules whose every test (or module fixture) starts processes.
SLOW_MODULES = frozenset({
    "test_alert_delivery", "test_demo", "test_deepspeed", "test_exposure", "test_fsdp1",
    "test_hsdp", "test_integrations", "test_newuser", "test_ops_integration",
    "test_packaging", "test_profiler_witness", "test_remote_write", "test_stopped",
    "test_trace_hta", "test_zero1",
})

# Fixtures (any module) that start a demo job, a server or a subprocess.
SLOW_FIXTURES = frozenset({
    "live", "jobs", "runs", "pair", "recorded", "fleet", "dist", "venv", "z2", "z3",
    "ds_ready", "full", "grad_op", "zero1", "ddp", "hta_path", "grafana_client_dir",
    "pki",  # openssl makes the certificates
})


def pytest_collection_modifyitems(config, items):
    for item in items:
        module = item.module.__name__.rsplit(".", 1)[-1] if item.module else ""
        if module in SLOW_MODULES or SLOW_FIXTURES.intersection(item.fixturenames):
            item.add_marker(pytest.mark.slow)


class ProcessStarted(AssertionError):
    pass


def _refuse(nodeid: str):
    def refuse(*args, **kwargs):
        raise ProcessStarted(
            f"{nodeid} starts a process but is not marked slow: add its module to SLOW_MODULES "
            "or its fixture to SLOW_FIXTURES in tests/conftest.py, or mark it "
            "@pytest.mark.slow (`make test-fast` runs only tests that start no process)")
    return refuse


@pytest.hookimpl(hookwrapper=True)
def _no_process_unless_slow(item):
    """Patch every way a process is started while an unmarked test sets up and runs:
    subprocess (its `_fork_exec`, or os.posix_spawn), multiprocessing
    (_posixsubprocess.fork_exec) and os.fork."""
    if item.get_closest_marker("slow"):
        yield
        return
    import _posixsubprocess
    import subprocess

    refuse = _refuse(item.nodeid)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_posixsubprocess, "fork_exec", refuse)  # multiprocessing
        mp.setattr(subprocess, "_fork_exec", refuse)  # subprocess's own reference to it
        for name in ("posix_spawn", "posix_spawnp", "fork"):
            if hasattr(os, name):
                mp.setattr(os, name, refuse)
        yield


# fixtures are set up in pytest_runtest_setup: a module fixture starting a job counts too
pytest_runtest_setup = pytest_runtest_call = _no_process_unless_slow


@pytest.fixture
def gloo_world_1(tmp_path):
    """A gloo process group of one rank in this test process (an in-process FSDP model),
    destroyed afterwards."""
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.fail("a process group is already initialised in this test process")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
