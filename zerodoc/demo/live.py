"""Run the demo job and print a live per-step summary (the text front end)."""

from __future__ import annotations

import os
import sys
import time

from ..errors import UserError
from ..runmodel import RankWindow
from ..runlog import RunFollower, StepRecord, window_from_steps
from .launch import Job


def _validate(args) -> None:
    if not 1 <= args.ranks <= 64:
        raise UserError(f"--ranks must be between 1 and 64, not {args.ranks}")
    if args.steps < 0:
        raise UserError("--steps must be >= 0 (0 runs until Ctrl-C)")
    if not 0 <= args.slow_link_ms <= 60_000:  # also refuses nan
        raise UserError(f"--slow-link-ms must be between 0 and 60000, not {args.slow_link_ms}")
    if args.port is not None and not 0 <= args.port <= 65535:
        raise UserError(f"--port {args.port} is not a port number")
    for name in ("blocks", "hidden", "seq", "batch"):
        if getattr(args, name) < 1:
            raise UserError(f"--{name} must be >= 1")
    if args.hsdp_replicas < 1 or args.ranks % args.hsdp_replicas:
        raise UserError(f"--ranks {args.ranks} must be a multiple of --hsdp-replicas "
                        f"{args.hsdp_replicas}")
    if args.hsdp_replicas > 1 and args.framework not in ("fsdp2", "fsdp1-hybrid"):
        raise UserError("--hsdp-replicas needs --framework fsdp2 or fsdp1-hybrid")
    if args.hidden % 4:
        raise UserError("--hidden must be a multiple of 4 (the attention heads)")


def spec_from_args(args) -> dict:
    run_dir = args.run_dir or os.path.join("zerodoc-runs",
                                           time.strftime("demo-%Y%m%d-%H%M%S"))
    # a demo exists to be diagnosed: per-unit detail on every step ($ZERODOC_DETAIL wins)
    attach = {"run_dir": run_dir, "inject_latency_s": args.slow_link_ms / 1000.0,
              "detail": os.environ.get("ZERODOC_DETAIL") or "every"}
    if args.no_metrics:
        attach["port"] = False
    elif args.port is not None:
        attach["port"] = args.port
    return {
        "model": {"blocks": args.blocks, "hidden": args.hidden, "seq": args.seq,
                  "batch": args.batch, "wrap": args.wrap, "reshard_after_forward": args.reshard,
                  "prefetch": args.prefetch},
        "steps": args.steps if args.steps > 0 else 10**9,
        "framework": args.framework,
        "hsdp_replicas": args.hsdp_replicas,
        "attach": attach,
        # Ctrl-C: Job.stop() creates it, the ranks stop together and close cleanly
        "interrupt_file": os.path.join(run_dir, "logs", "stop-requested"),
    }


def _ms(s: float) -> str:
    return f"{s * 1e3:7.1f} ms"


def _mib(b: int | None) -> str:
    return f"{b / 2**20:.1f} MiB" if b else "-"


def _every(detail) -> str:
    """The attach `detail` setting in words ("1 step in 4", "sampled steps")."""
    from ..shim.sampler import parse

    try:
        mode, k = parse(detail)
    except (TypeError, ValueError):  # attach itself says what is wrong with it
        return "sampled steps"
    if k:
        return f"1 step in {k}"
    return "sampled steps, 1 in K adaptive" if mode == "adaptive" else "sampled steps"


def format_step(step: int, windows: dict[int, RankWindow],
                last: tuple[int, dict[int, RankWindow]] | None = None,
                detail=None) -> str:
    """Two lines per step: the step breakdown (slowest rank) and the top exposed units.
    Per-unit numbers (compute, exposed communication) exist on sampled steps only (1 in K,
    `attach(detail=...)`, `detail` here): a step without them shows the latest sampled
    step's, saying which (`last`: that step and its windows), or says that none was measured
    yet, never zeros."""
    slow = max(windows.values(), key=lambda w: w.step_seconds)
    mem = slow.memory
    head = f"step {step:5d} | step {_ms(slow.step_seconds)} (rank {slow.facts.rank}) | "
    tail = (f"params {_mib(mem.get('sharded_parameters'))} "
            f"optim {_mib(mem.get('optimizer_state'))} rss {_mib(mem.get('process_resident'))}")
    src, note = windows, ""
    if not all(w.unit_detail for w in windows.values()):
        k = next((w.detail_every for w in windows.values() if w.detail_every), None)
        if k is None and last is not None:
            k = next((w.detail_every for w in last[1].values() if w.detail_every), None)
        every = f"1 step in {k}" if k else _every(detail)
        if last is None:
            return (head + f"per-unit detail: not measured yet ({every}) | " + tail + "\n"
                    "           top exposed all-gathers: after the first sampled step")
        src, note = last[1], f" [sampled step {last[0]}; per-unit detail on {every}]"
    ref = max(src.values(), key=lambda w: w.step_seconds)
    comp, exp = ref.compute_seconds, ref.exposed_seconds
    frac = exp / ref.step_seconds if ref.step_seconds else 0.0
    ratio = exp / comp if comp else 0.0
    line1 = (head + f"compute {_ms(comp)} | exposed comm {_ms(exp)} ({frac:4.0%}) | "
             f"comm/compute {ratio:4.2f} | " + tail + note)
    ag = {}
    for w in src.values():
        for (unit, phase, coll), t in w.comm.items():
            if coll == "all_gather":
                ag[(unit, phase)] = max(ag.get((unit, phase), 0.0), t.exposed_seconds)
    top = sorted(ag.items(), key=lambda kv: -kv[1])[:3]
    line2 = "           top exposed all-gathers: " + ", ".join(
        f"{u} {p} {s * 1e3:.1f} ms" for (u, p), s in top)
    return line1 + "\n" + line2


def run_demo(args) -> int:
    _validate(args)
    spec = spec_from_args(args)
    run_dir = spec["attach"]["run_dir"]
    if not args.headless and sys.stdout.isatty():
        try:
            from ..tui import app  # noqa: F401  (the tui extra: Textual)
        except ImportError:
            pass
        else:
            return run_live_demo(args, spec)
    return run_text(args, spec, run_dir)


def run_live_demo(args, spec: dict) -> int:
    """`zerodoc demo` in a terminal: start the job, watch it live, stop it on quit."""
    from ..sources import open_source
    from ..tui import app

    run_dir = spec["attach"]["run_dir"]
    job = Job(args.ranks, spec, log_dir=os.path.join(run_dir, "logs")).start()
    finished = False
    try:
        source = open_source(run_dir)  # Job.start() created the run dir (its logs/ folder)
        app.tune_gc()
        app.ZerodocApp(source, refresh=1.0, job=job, freeze_heap=True).run()
        finished = not job.running()
    finally:
        job.stop()
    codes = [p.returncode for p in job.procs]
    print(f"zerodoc demo: {'done' if finished else 'stopped'}. Run log: {run_dir}",
          file=sys.stdout, flush=True)
    bad = [r for r, c in enumerate(codes) if c not in (0, None, -15)]
    if bad:
        print(f"zerodoc demo: rank(s) {bad} exited with an error; see {run_dir}/logs/rank-N.out",
              file=sys.stderr)
    return 0


def run_text(args, spec: dict, run_dir: str, out=sys.stdout) -> int:
    job = Job(args.ranks, spec, log_dir=os.path.join(run_dir, "logs")).start()
    follower = RunFollower(run_dir)
    print(f"zerodoc demo: {args.framework}, {args.ranks} ranks, wrap={args.wrap}, "
          f"reshard_after_forward={args.reshard}, prefetch={args.prefetch}, "
          f"slow link +{args.slow_link_ms:g} ms; run log {run_dir}", file=out, flush=True)
    shown_endpoints = False
    pending: dict[int, dict[int, StepRecord]] = {}
    last: tuple[int, dict[int, RankWindow]] | None = None  # the latest sampled step
    code = 0
    try:
        while True:
            running = job.running()
            for rank, rec in follower.poll():
                pending.setdefault(rec.step, {})[rank] = rec
            if not shown_endpoints and len(follower.logs) == args.ranks:
                eps = [f"{r}: {log.facts.metrics_endpoint or 'off'}"
                       for r, log in sorted(follower.logs.items())]
                print("metrics (rank: host:port): " + ", ".join(eps), file=out, flush=True)
                shown_endpoints = True
            for step in sorted(pending):
                if len(pending[step]) == args.ranks or not running:
                    recs = pending.pop(step)
                    windows = {r: window_from_steps(follower.logs[r].facts, [s])
                               for r, s in recs.items()}
                    print(format_step(step, windows, last, spec["attach"].get("detail")),
                          file=out, flush=True)
                    if all(w.unit_detail for w in windows.values()):
                        last = (step, windows)
            if not running:
                break
            time.sleep(0.2)
    except KeyboardInterrupt:
        print("\nzerodoc demo: interrupted, stopping the ranks at their next step "
              "(Ctrl-C again to kill them)", file=out, flush=True)
        code = 130
        if job.interrupt():
            print("zerodoc demo: every rank stopped and closed its run log cleanly",
                  file=out, flush=True)
    finally:
        job.stop()
    codes = [p.returncode for p in job.procs]
    if code == 0 and any(codes):
        bad = [r for r, c in enumerate(codes) if c]
        print(f"zerodoc demo: rank(s) {bad} failed; see {run_dir}/logs/rank-N.out",
              file=sys.stderr)
        for r in bad[:1]:
            try:
                with open(os.path.join(run_dir, "logs", f"rank-{r}.out")) as f:
                    tail = f.read()[-2000:]
                print(tail, file=sys.stderr)
            except OSError:
                pass
        return 1
    print(f"zerodoc demo: done. Run log: {run_dir}", file=out, flush=True)
    return code
