"""Issue 10's table, measured: a 1,024-rank x 81-unit run, watched for a week.

    .venv/bin/python bench/scale.py [--ranks 1024] [--units 81] [--log-steps 86400]
                                    [--prom-ranks 128] [--refreshes 4] [--skip SECTION ...]

Sections (each prints its numbers as it goes; the ratios and budgets come last, each marked
met / missed):

- run log: bytes per step per rank at 81 units over 240 steps through the real writer with
  every row a real run writes (`zerodoc.testing.runlogbytes`: the framework's time per unit,
  the step's collectives, lean steps; default settings: an interval line every 100 steps),
  detail on every step and on 1 in 8; the series per rank from the catalog; the training
  thread's hand-over cost per
  step; a `--log-steps` long log (a day at 1 step/s by default; 604800 for a week) opened
  from its end: seconds and peak memory.
- series: a real 2-rank demo job with 80 blocks (81 units): series per rank from a real
  scrape of each rank's exporter.
- prometheus: a TSDB backfilled (`promtool tsdb create-blocks-from openmetrics`) with
  `--prom-ranks` ranks' series (the real scrapes above, relabelled per rank, 10 samples 15 s
  apart), a real Prometheus on it: its resident memory, the latency of every dashboard panel
  query (dashboards/*.json, variables = all) and recording rule, a zerodoc report from it
  (with the server's peak memory during it), and a TUI's refreshes on it (the first, then
  with per-unit numbers reused); both with the per-unit stats read from the recording rules
  (backfilled with `promtool tsdb create-blocks-from rules`) and per-rank figures from the
  ranks' rank-level totals (budget: <= 5 s to a first answer); in the same run, the same
  with the per-rank figures summed over the per-unit series, and everything aggregated from
  the raw per-unit series; and the per-rank recording rules on the rank-level series
  against the same rules summing the per-unit series (latency, same answers). `--prom-ranks 1024` measures the full size (~2 min to
  backfill 1.2 M series; a Prometheus peak of ~5 GB).
- tui: a `--ranks` x `--units` run written through the real writer (synthetic numbers), the
  real Textual app headless: first frame, then refreshes with one new step on every rank
  before each, per view; wall clock and this process's CPU time (the rate one free core
  gives; the box is shared).
- report: `zerodoc report` of that run directory (in process: source, rules, report).

Default run time: a few minutes on a 2-core box (`--ranks 256 --prom-ranks 32` for a
quick look).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

KIB = 1024
RESULTS: list[tuple[str, str, bool | None]] = []  # (what, value vs budget, met)


def budget(what: str, value: str, met: bool | None) -> None:
    RESULTS.append((what, value, met))


def clock():
    return time.perf_counter(), time.process_time()


def since(t):
    return time.perf_counter() - t[0], time.process_time() - t[1]


# --------------------------------------------------------------------------------------
# run log


def run_log_section(tmp: Path, units: int, log_steps: int) -> None:
    import tracemalloc

    from zerodoc.runmodel import CommTotals, RankWindow
    from zerodoc.runlog import RunLogWriter, log_window, read_rank_tail
    from zerodoc.runlog.replay import Replay
    from zerodoc.testing.synthetic import rank_facts, step_record

    from zerodoc.ops import cardinality as card
    from zerodoc.testing.runlogbytes import measure

    print(f"\n== run log ({units} units)")
    # every row a real run writes (framework per unit, coll, lean steps): runlogbytes
    for k in (1, 8):
        got = measure(units=units, steps=240, k=k, run_dir=tmp / f"bytes-k{k}")
        per_step = got["bytes_per_step"]
        rows = ", ".join(f"{t} {v['n']} x {v['bytes'] / v['n'] / 1e3:.1f} KB"
                         for t, v in got["lines"].items())
        print(f"  240 steps, detail 1 in {k}: {per_step:,.0f} B per step per rank on disk, "
              f"header ({got['header_bytes']:,} B once per segment) left out; lines: {rows}")
        budget(f"run log bytes per step per rank ({units} units, 240 steps, detail 1 in {k})",
               f"{per_step:,.0f} B <= 1,024 B (aim 960)", per_step <= 1024)
    print(f"  series per rank from the catalog: {card.total():,} (rank 0: "
          f"{card.total(rank0=True):,}; budget {card.BUDGET_FULL:,} for every rank but 0)")
    facts = rank_facts(0, 1024, units)
    run = tmp / "bytes"
    rep = Replay(RunLogWriter(run, 0), facts)
    n = 600
    hand = []
    for s in range(1, n + 1):
        rec = step_record(s, 0, 1024, units, 1.7e9 + s)[0]
        rep.fold(rec)  # the shim's bookkeeping (not the run log's cost)
        t = time.perf_counter()
        rep.hand_over(rec)  # what the training thread does for the run log
        hand.append(time.perf_counter() - t)
    rep.writer.close(n, rep.totals)
    detail = sum(p.stat().st_size for p in (run / "detail").iterdir())
    print(f"  detail files {detail / 2**20:.1f} MiB (bounded: the current and the previous "
          f"interval); old schema 1 wrote every step in full: {_schema1_bytes(units):,} B "
          "per step")
    med = statistics.median(hand) * 1e6
    print(f"  hand-over on the training thread: median {med:.1f} us per step "
          f"(p99 {sorted(hand)[int(0.99 * n)] * 1e6:.1f} us), no file I/O")
    days = log_steps / 86400
    print(f"  writing a {log_steps:,}-step log ({days:.1f} days at 1 step/s) ...", flush=True)
    longrun = tmp / "long"
    w = RunLogWriter(longrun, 0, detail=False, queue_size=1 << 16)
    w.write_header(facts)
    tot = RankWindow(facts=facts)
    unit = step_record(1, 0, 1024, units, 0.0)[0]
    t0 = 1.7e9
    for s in range(1, log_steps + 1):
        light = {"type": "step", "step": s, "end_unix": t0 + s, "step_s": unit["step_s"],
                 "optimizer_s": 0.05, "framework_s": 0.01, "other_s": 0.01, "wait_s": 0.0,
                 "self_s": 0.001, "compute_s": unit["compute_s"],
                 "exposed_s": unit["exposed_s"], "mem": unit["mem"]}
        _every_line(w, lambda: w.write(light))
        if s % 100 == 0:
            _scale_totals(tot, unit, facts, s, t0 + s, CommTotals)
            w._last_units_step = s - 1  # (a retried hand-over must not be skipped)
            _every_line(w, lambda: w.write_units(tot))
    w.flush(600)  # the bench reads it next: everything on disk first
    w.close(log_steps, tot, timeout=60)
    path = longrun / "rank-00000.jsonl"
    size = path.stat().st_size
    import numpy  # noqa: F401  (imported once by any reader; not part of opening a log)

    for window in (20, None):
        t = clock()
        win = log_window(read_rank_tail(path, window, detail=False), window, detail=False)
        wall, cpu = since(t)
        tracemalloc.start()
        log_window(read_rank_tail(path, window, detail=False), window, detail=False)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        what = "the last 20 steps" if window else "all steps"
        print(f"  opened {size / 2**20:,.0f} MiB from its end for {what}: {wall * 1e3:.0f} ms "
              f"(CPU {cpu * 1e3:.0f} ms), peak {peak / 2**20:.1f} MiB; {win.steps:,} steps")
        if window:
            budget(f"open a {days:.1f}-day log, last 20 steps", f"{wall:.3f} s < 1 s", wall < 1)
        else:
            budget(f"open a {days:.1f}-day log, all steps", f"{wall:.3f} s < 1 s", wall < 1)


def _every_line(w, hand_over) -> None:
    """The bench wants every line: when the writer's queue is full, wait and hand over
    again (a training job would drop and count instead)."""
    while True:
        before = w.dropped
        hand_over()
        if w.dropped == before:
            return
        w.dropped = before
        w._unlogged_drops = max(0, w._unlogged_drops - 1)
        time.sleep(0.001)


def _scale_totals(tot, rec, facts, steps, end, CommTotals) -> None:
    names = [u.name for u in facts.units]
    tot.steps = tot.last_step = steps
    tot.updated_unix = end
    tot.step_seconds = rec["step_s"] * steps
    tot.compute = {(names[u], p): s * steps for u, p, s in rec["compute"]}
    tot.comm = {(names[u], p, c): CommTotals(n * steps, b * steps, s * steps, e * steps,
                                             h * steps)
                for u, p, c, n, b, s, e, h in rec["comm"]}


def _schema1_bytes(units: int) -> int:
    import json

    from zerodoc.testing.synthetic import step_record

    return len(json.dumps(step_record(5, 0, 1024, units, 1.7e9)[0], separators=(",", ":")))


# --------------------------------------------------------------------------------------
# TUI and report


async def tui_bench(run_dir: Path, ranks: int, units: int, first_new: int, refreshes: int):
    from zerodoc.sources import open_source
    from zerodoc.tui.app import VIEWS, ZerodocApp, tune_gc
    from zerodoc.testing.synthetic import append_steps

    t = clock()
    source = open_source(str(run_dir), window=20)
    tune_gc()
    app = ZerodocApp(source, refresh=None, freeze_heap=True)
    n = first_new
    async with app.run_test(size=(160, 48)) as pilot:
        while app.frame is None:
            await asyncio.sleep(0.02)
        await pilot.pause()
        wall, cpu = since(t)
        from zerodoc.tui import views

        shown = views.unit_table(app.frame, views.MEAN)
        print(f"  first frame: {wall:.2f} s wall, {cpu:.2f} s CPU ({len(app.frame.findings)} "
              f"findings, {len(shown.rows)} units in the table; the source reads each rank's "
              f"log from its end)")
        assert len(shown.rows) == units, len(shown.rows)
        budget(f"TUI first frame, {ranks} x {units}", f"{cpu:.2f} s CPU < 3 s "
               f"({wall:.2f} s wall)", cpu < 3)
        worst = None
        for view in VIEWS:
            await pilot.press(str(VIEWS.index(view) + 1))
            await pilot.pause()
            walls, cpus = [], []
            for _ in range(refreshes):
                append_steps(run_dir, ranks=ranks, units=units, first_step=n,
                             end_unix=time.time())
                n += 1
                t = clock()
                frame = await app.refresh_now()
                await pilot.pause()
                w, c = since(t)
                walls.append(w)
                cpus.append(c)
                assert frame is not None and frame.source_error is None, frame.source_error
            rate_w, rate_c = 1 / statistics.fmean(walls), 1 / statistics.fmean(cpus)
            print(f"  {view:9s}: {rate_c:5.2f} refreshes/s CPU ({statistics.fmean(cpus) * 1e3:6.0f}"
                  f" ms), {rate_w:5.2f}/s wall")
            if worst is None or rate_c < worst[1]:
                worst = (view, rate_c, rate_w)
        budget(f"TUI refresh, {ranks} x {units} (slowest view: {worst[0]})",
               f"{worst[1]:.2f}/s CPU >= 2/s ({worst[2]:.2f}/s wall)", worst[1] >= 2)
    return n


def report_time(spec: str, what: str, window: int | None = 20,
                limit_s: float | None = None, recorded: bool = True,
                rank_series: bool = True) -> None:
    from zerodoc.diagnosis import diagnose
    from zerodoc.report import build_report, render_json
    from zerodoc.sources import open_source
    from zerodoc.thresholds import DEFAULT

    t = clock()
    src = open_source(spec, window=window)
    src.recorded = recorded  # Prometheus: per-unit stats from its recording rules, or not
    src.rank_series = rank_series  # ... and per-rank figures from the rank-level series
    snap = src.snapshot()
    findings = diagnose(snap)
    text = render_json(build_report(snap, findings, source=src.description, thresholds=DEFAULT,
                                    link=None, window=window))
    wall, cpu = since(t)
    print(f"  zerodoc report {what}: {wall:.2f} s wall, {cpu:.2f} s CPU ({len(snap.ranks)} "
          f"ranks, {len(findings)} findings: {' '.join(f.code for f in findings) or '-'}, "
          f"{len(text) / 1e6:.1f} MB of JSON)")
    budget(f"report time, {what}", f"{wall:.2f} s wall, {cpu:.2f} s CPU"
           + (f" (<= {limit_s:g} s)" if limit_s else ""),
           None if limit_s is None else wall <= limit_s)


def tui_section(tmp: Path, ranks: int, units: int, refreshes: int) -> None:
    from zerodoc.testing.synthetic import close_run, write_run

    print(f"\n== TUI and report ({ranks} ranks x {units} units)")
    run = tmp / "run"
    t = clock()
    # per-unit interval lines every 20 steps (the TUI reads them at this scale); the detail
    # files are not read by a front end at this scale and are left out to save bench time
    write_run(run, ranks=ranks, units=units, steps=21, started_unix=time.time() - 60,
              end=False, every_steps=20, detail=False)
    wall, cpu = since(t)
    print(f"  wrote the run through the real writer in {wall:.0f} s ({cpu:.0f} s CPU)")
    asyncio.run(tui_bench(run, ranks, units, 22, refreshes))
    report_time(str(run), f"run directory, {ranks} ranks")
    close_run(run)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--units", type=int, default=81)
    ap.add_argument("--log-steps", type=int, default=86_400)
    ap.add_argument("--prom-ranks", type=int, default=128)
    ap.add_argument("--refreshes", type=int, default=4)
    ap.add_argument("--skip", nargs="*", default=[],
                    choices=["runlog", "series", "prometheus", "tui"])
    args = ap.parse_args()
    if args.ranks < 2 or args.units < 2 or args.log_steps < 200 or args.prom_ranks < 2:
        ap.error("--ranks, --units, --prom-ranks >= 2 and --log-steps >= 200")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="zerodoc-scale-") as d:
        tmp = Path(d)
        if "runlog" not in args.skip:
            run_log_section(tmp, args.units, args.log_steps)
        scrapes = None
        if "series" not in args.skip or "prometheus" not in args.skip:
            from scale_prom import series_section  # noqa: E402 (bench/ is on sys.path)

            scrapes = series_section(tmp, args.units, budget)
        if "prometheus" not in args.skip and scrapes:
            from scale_prom import prometheus_section

            prometheus_section(tmp, scrapes, args.prom_ranks, budget, report_time)
        if "tui" not in args.skip:
            tui_section(tmp, args.ranks, args.units, args.refreshes)
    print(f"\n== ratios and budgets (load average {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} cores; {time.perf_counter() - t0:.0f} s in all)")
    width = max(len(w) for w, _v, _m in RESULTS) if RESULTS else 0
    for what, value, met in RESULTS:
        mark = "" if met is None else ("met" if met else "MISSED")
        print(f"  {what.ljust(width)}  {value}  {mark}")
    return 0 if all(m is not False for _w, _v, m in RESULTS) else 1


if __name__ == "__main__":
    sys.exit(main())
