"""The shim's hot path, piece by piece: cost per call x calls per step = cost per step.

    python bench/hotpath.py [--blocks 64] [--hidden 64] [--seq 16] [--batch 2] [--prefetch]
                            [--pairs 30] [--collect-blocks 64 80] [--instructions]

A 2-rank FSDP2 job (CPU, gloo) with an instrumented model (A) and a plain twin (B) prints:
- the zerodoc functions the training thread enters per step, and clock reads;
- the cost per call of each hot-path piece, measured on the real objects (recorder, a real
  unit's forward hooks in nn.Module dispatch, backward wrappers, the comm wrapper and host
  timer, optimizer hooks + step end with a real step's accumulators);
- their sum per step next to the measured A - B difference per step;
- the cost of one /metrics page (a Prometheus scrape: OpenMetrics, gzip) at each
  --collect-blocks size, i.e. what a scraper takes from the job's interpreter (it holds the
  GIL while it runs), after a step end and again before the next one.

A is attached with per-unit detail on every step (`detail="every"`): the pieces measured are
a detail step's (issue 19's sampled tier; an unsampled step enters none of them:
bench/gpu_hotpath.py measures both kinds).

Costs are CPU time (`thread_time`, not inflated by a loaded machine the way wall time is) or,
with --instructions, instructions counted by valgrind's callgrind (rank 0 runs in valgrind;
independent of the load; slow: ~15 min at 65 units with --pairs 4).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from zerodoc.demo.launch import Job  # noqa: E402


def _colls(calls: dict) -> int:
    return sum(n for k, n in calls.items()
               if k.startswith("fsdp2._make_comm_classes.Instrumented") and k.endswith("__call__"))


# How many times per step each priced piece runs, from the calls the training thread made
# (the names of the shim's functions it entered).
PRICED = {
    "forward hooks, 4 per unit (in nn.Module dispatch), per unit":
        lambda c: c.get("wiring.install_forward_hooks.outer_pre", 0),
    "backward wrappers pre+post, per unit":
        lambda c: c.get("fsdp2._wrap_backward.post_backward", 0),
    "collective, blocking (wrapper + timer)":
        lambda c: _colls(c) - c.get("comm.TimedWork.__init__", 0),
    "collective, async (wrapper + TimedWork + callback + wait)":
        lambda c: c.get("comm.TimedWork.__init__", 0),
    "optimizer pre/post hooks + step end (per step)":
        lambda c: c.get("monitor.Monitor._end_step", 0),
}


def run(args, blocks: int, tmp: Path, collect_only: bool = False) -> dict:
    out = tmp / f"hotpath-{blocks}.json"
    spec = {"model": {"blocks": blocks, "hidden": args.hidden, "seq": args.seq,
                      "batch": args.batch, "prefetch": args.prefetch},
            "attach": {"run_dir": str(tmp / f"run-{blocks}"), "port": 0, "detail": "every"},
            "pairs": args.pairs, "out": str(out), "collect_only": collect_only,
            "instructions": str(tmp / f"cg-{blocks}" / "cg") if args.instructions else None}
    if args.instructions:
        (tmp / f"cg-{blocks}").mkdir()
    job = Job(2, spec, module="bench.hotpath_worker", env={"PYTHONPATH": str(ROOT)}).start()
    try:
        codes = job.wait(4 * 3600)
    finally:
        job.stop()
    if any(codes):
        raise SystemExit(f"benchmark ranks failed: {job.outputs()}")
    return json.loads(out.read_text())


def _fmt(v: float, unit: str) -> str:
    return f"{v / 1e3:10.2f} us" if unit == "ns" else f"{v / 1e3:10.1f} k "


def report(res: dict) -> None:
    med = statistics.median
    unit = res["meter"]
    ab = res["ab"]
    print(f"FSDP2 CPU/gloo, 2 ranks, {res['units']} units, prefetch={res['prefetch']}, "
          f"{len(ab['A']['wall'])} A/B pairs (rank 0); costs in "
          + ("CPU time" if unit == "ns" else "instructions (k = thousands)"))
    calls = res["calls"]
    print(f"\ncalls per step into zerodoc on the training thread "
          f"({sum(calls.values())} calls, {res['clock_reads']} perf_counter reads):")
    for name, n in sorted(calls.items(), key=lambda kv: -kv[1]):
        print(f"  {n:6d}  {name}")
    print("\ncost per call x calls per step:")
    total = 0.0
    for name, c in res["micro"].items():
        count = PRICED.get(name)
        if count is not None:
            n = count(calls)
            total += c * n
            print(f"  {_fmt(c, unit)} x {n:5d} = {_fmt(c * n, unit)}   {name}")
        else:
            print(f"  {_fmt(c, unit)}                       {name}")
    print(f"\n  sum of the priced pieces: {_fmt(total, unit)} per step")
    if unit == "ns":
        a_t, b_t = med(ab["A"]["thread"]), med(ab["B"]["thread"])
        a_p, b_p = med(ab["A"]["process"]), med(ab["B"]["process"])
        pair = med(a - b for a, b in zip(ab["A"]["thread"], ab["B"]["thread"]))
        print(f"  measured, training thread CPU per step: A {a_t * 1e3:.2f} ms, B {b_t * 1e3:.2f} "
              f"ms, A-B {(a_t - b_t) * 1e6:.0f} us (median of per-pair differences "
              f"{pair * 1e6:.0f} us), ratio {a_t / b_t:.4f}")
        print(f"  measured, process CPU per step: A {a_p * 1e3:.2f} ms, B {b_p * 1e3:.2f} ms, "
              f"ratio {a_p / b_p:.4f}")
        plain = b_t * 1e9
    else:
        a_i, b_i = statistics.mean(ab["A"]["instr"]), statistics.mean(ab["B"]["instr"])
        pairs = [a - b for a, b in zip(ab["A"]["instr"], ab["B"]["instr"])]
        print(f"  measured instructions per step: A {a_i / 1e6:.1f} M, B {b_i / 1e6:.1f} M, "
              f"A-B {(a_i - b_i) / 1e6:+.2f} M (per pair: "
              + ", ".join(f"{d / 1e6:+.2f}" for d in pairs) + f" M), ratio {a_i / b_i:.4f}")
        print(f"  B steps: " + ", ".join(f"{b / 1e6:.1f}" for b in ab["B"]["instr"]) + " M "
              "(their spread is the measurement's noise)")
        plain = b_i
    a_w, b_w = med(ab["A"]["wall"]), med(ab["B"]["wall"])
    print(f"  measured, wall per step: A {a_w * 1e3:.2f} ms, B {b_w * 1e3:.2f} ms, "
          f"ratio {a_w / b_w:.4f} (load-sensitive{', and rank 0 ran in valgrind' if unit != 'ns' else ''})")
    print(f"  garbage collections per step: A {sum(ab['A']['gcn']) / len(ab['A']['gcn']):.1f}, "
          f"B {sum(ab['B']['gcn']) / len(ab['B']['gcn']):.1f}")
    print(f"  priced pieces / plain step: {total / plain:.2%}")


def report_page(units: int, c: dict) -> None:
    unit = c["unit"]
    new, same = c["page_new_step"], c["page_same_step"]
    line = (f"  {units} units ({c['samples']} samples, {c['bytes'] / 1024:.0f} KiB of text): "
            f"collect() {_fmt(c['families'], unit).strip()}; a Prometheus scrape (OpenMetrics, "
            f"gzip) {_fmt(new, unit).strip()} after a step end, {_fmt(same, unit).strip()} "
            f"before the next one")
    if unit == "ns":
        line += (f"; at 1 scrape/s: <= {new / 1e7:.2f} % of one core, at 10/s: "
                 f"<= {new / 1e6:.1f} %")
    print(line)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--blocks", type=int, default=64, help="transformer blocks (units = blocks+1)")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--seq", type=int, default=16)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--prefetch", action="store_true",
                   help="FSDP2 async unshard + explicit forward/backward prefetch")
    p.add_argument("--pairs", type=int, default=30, help="A/B step pairs measured")
    p.add_argument("--collect-blocks", type=int, nargs="*", default=[64, 80],
                   help="model sizes (blocks) at which the /metrics page is priced")
    p.add_argument("--instructions", action="store_true",
                   help="count instructions with valgrind's callgrind instead of CPU time")
    p.add_argument("--json", help="also write the raw numbers here")
    args = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.instructions and not (shutil.which("valgrind") and shutil.which("callgrind_control")):
        raise SystemExit("--instructions needs valgrind (Debian: apt-get install valgrind)")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        res = run(args, args.blocks, tmp)
        report(res)
        print("\n/metrics page (server thread; holds the GIL while it runs):")
        pages = {res["units"]: res["collect"]}
        for b in args.collect_blocks:
            if b + 1 not in pages:
                pages[b + 1] = run(args, b, tmp, collect_only=True)["collect"]
        for units in sorted(pages):
            report_page(units, pages[units])
        if args.json:
            Path(args.json).write_text(json.dumps({"main": res, "pages": pages}, indent=1))


if __name__ == "__main__":
    main()
