"""Per-unit numbers from sampled steps (issue 19): the run log reader's counts, the report's
wording, rules that wait for samples, and the TUI picking up detail that appears after it
opened (issue 20 item 1), agreeing with `zerodoc report` on the same directory.

Run logs are written with the real writer (`zerodoc.tui.synthetic.write_run`, through
`RunLogWriter`), with unsampled steps as the shim writes them (`"detail": false`, empty
`compute` / `comm`, per-unit-derived step fields null)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from zerodoc.sources import open_source
from zerodoc.tui.synthetic import append_steps, close_run, write_run

SIZE = (120, 36)


async def until(pilot, cond, timeout: float = 20.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        await pilot.pause(0.05)
    raise AssertionError(f"timed out waiting for {what}")


# --------------------------------------------------------------------------------------
# the TUI opened before the job wrote anything (issue 20 item 1)


async def test_tui_opened_on_an_empty_run_dir_picks_up_per_unit_detail(tmp_path):
    pytest.importorskip("textual")
    from zerodoc.tui.app import ZerodocApp

    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)  # what `zerodoc demo` has when its TUI opens
    app = ZerodocApp(open_source(str(run)), refresh=0.1)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.frame is not None, what="first frame")
        write_run(run, ranks=2, units=4, steps=6, started_unix=time.time() - 6, end=False,
                  straggler=None)
        await until(pilot, lambda: app.frame.snapshot.ranks.get(1) is not None
                    and app.frame.snapshot.ranks[1].last_step == 6, what="step 6")

        def unit_compute():
            u = app.frame.units.get(0)
            return u is not None and u["layers.0"].compute_seconds > 0

        await until(pilot, unit_compute, what="per-unit compute of layers.0")
        await until(pilot, lambda: any(f.code == "ZD004" for f in app.frame.findings),
                    what="a per-unit finding")
        close_run(run)
