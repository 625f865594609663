"""How fast the TUI refreshes a big run: 64 ranks x 128 units (synthetic run log).

    .venv/bin/python bench/tui_render.py [--ranks 64] [--units 128] [--refreshes 20]

Writes a synthetic run directory (zerodoc.runlog.RunLogWriter, schema 1) to a temp dir,
opens it with `zerodoc.sources.open_source` like `zerodoc tui` does, runs the app headless
(`App.run_test`) and times the full refresh path: source snapshot + diagnose + widget update
+ the screen settling. Before each timed refresh one new step per rank is appended (as a
live run would, untimed), so nothing is coalesced away. Prints refreshes per second per view.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from zerodoc.sources import open_source  # noqa: E402
from zerodoc.tui.feed import default_diagnose  # noqa: E402
from zerodoc.tui.synthetic import append_steps, write_run  # noqa: E402


async def bench(run_dir: Path, ranks: int, units: int, steps: int, refreshes: int) -> int:
    from zerodoc.tui.app import VIEWS, ZerodocApp

    diagnose, why = default_diagnose()
    print(f"diagnose: {'zerodoc.diagnosis.diagnose' if diagnose else why}")
    source = open_source(str(run_dir), window=20)
    app = ZerodocApp(source, refresh=None)  # no timer: the bench drives every refresh
    next_step = steps + 1
    ok = True
    async with app.run_test(size=(160, 48)) as pilot:
        while app.frame is None:  # on_mount's first fetch: parses the whole run log
            await asyncio.sleep(0.05)
        t0 = time.perf_counter()
        await pilot.pause()
        print(f"first frame (parse {steps} steps x {ranks} ranks) shown; "
              f"{len(app.frame.findings)} findings")
        del t0
        results = {}
        for view in (*VIEWS, "all"):
            await pilot.press({"overview": "1", "units": "2", "findings": "3",
                               "ranks": "4", "all": "2"}[view])
            await pilot.pause()
            times, snap_times = [], []
            for _ in range(refreshes):
                append_steps(run_dir, ranks=ranks, units=units, first_step=next_step,
                             end_unix=time.time())
                next_step += 1
                t = time.perf_counter()
                frame = await app.refresh_now()
                if view == "all":  # render every view, not only the visible one
                    for v in VIEWS:
                        app._dirty.add(v)
                        app.query_one("#tabs").active = v
                        app._render_active()
                await pilot.pause()
                times.append(time.perf_counter() - t)
                assert frame is not None and frame.source_error is None, frame
                snap_times.append(frame.snapshot.ranks[0].last_step)
            assert snap_times[-1] == next_step - 1, (snap_times[-1], next_step - 1)
            mean = statistics.fmean(times)
            p95 = sorted(times)[max(0, int(0.95 * len(times)) - 1)]
            results[view] = 1 / mean
            print(f"  {view:9s} view: {1 / mean:5.2f} refreshes/s  "
                  f"(mean {mean * 1e3:6.1f} ms, p95 {p95 * 1e3:6.1f} ms, n={len(times)})")
            ok = ok and 1 / mean >= 2.0
        # coalesced: nothing new since the last refresh
        t = time.perf_counter()
        for _ in range(refreshes):
            await app.refresh_now()
            await pilot.pause()
        idle = (time.perf_counter() - t) / refreshes
        print(f"  unchanged run (coalesced): {1 / idle:5.1f} refreshes/s "
              f"(mean {idle * 1e3:.1f} ms)")
    worst = min(results.values())
    print(f"RESULT: {ranks} ranks x {units} units, window 20 steps: "
          f"{worst:.2f} refreshes/s worst view (full path: snapshot + diagnose + widget "
          f"update, a new step every refresh) — {'OK' if ok else 'BELOW'} the 2/s target")
    return 0 if ok else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--units", type=int, default=128)
    ap.add_argument("--steps", type=int, default=20, help="steps written before timing")
    ap.add_argument("--refreshes", type=int, default=10, help="timed refreshes per view")
    ap.add_argument("--run-dir", default=None, help="where to write (default: a temp dir)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="zerodoc-bench-") as tmp:
        run_dir = Path(args.run_dir or tmp) / "synthetic"
        t = time.perf_counter()
        write_run(run_dir, ranks=args.ranks, units=args.units, steps=args.steps,
                  started_unix=time.time() - 60, end=False)
        print(f"wrote {run_dir} ({args.ranks} ranks x {args.units} units x {args.steps} steps) "
              f"in {time.perf_counter() - t:.1f} s")
        return asyncio.run(bench(run_dir, args.ranks, args.units, args.steps, args.refreshes))


if __name__ == "__main__":
    sys.exit(main())
