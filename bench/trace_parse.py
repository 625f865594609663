"""How fast, and in how much memory, zerodoc reads a large profiler trace.

Makes a large but realistic trace by replicating a real one: a trace recorded here from the
demo (FSDP2, 2 gloo ranks, 4 profiled steps, shapes recorded), or any trace given with
--source. Each copy is shifted in time after the previous one, its ProfilerStep numbers,
External ids and correlations renumbered, and written in Kineto's own layout, until the file
reaches --size-gb. Then `zerodoc report` reads it in a fresh process and the bench prints the
parse time, the throughput and the process's peak resident memory (ru_maxrss), next to the
same for an import-only process (the baseline).

    python bench/trace_parse.py                  # 2 GB from a freshly recorded demo trace
    python bench/trace_parse.py --size-gb 0.5 --gzip
    python bench/trace_parse.py --source run/traces/rank-0.json --keep /tmp/big.json

Numbers in README / docs/report.md come from the first command on the 2-core dev box.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

STEP = re.compile(r"ProfilerStep#(\d+)$")


def record_demo_trace(tmp: Path) -> Path:
    from tests.support.helpers import run_demo

    run_demo(tmp, "bench", nprocs=2, steps=7, model={"batch": 8},
             extra={"profile": {"dir": str(tmp / "traces"), "wait": 2, "warmup": 1,
                                "active": 4}})
    return tmp / "traces" / "rank-0.json"


def load_source(path: Path) -> tuple[dict, list[dict]]:
    from zerodoc.trace.stream import read_trace

    events: list[dict] = []
    header = read_trace(path, events.append)
    header.pop("_events", None)
    return header, events


def replicate(header: dict, events: list[dict], out: Path, size_bytes: int,
              compress: bool) -> tuple[int, int]:
    """Write copies of `events` shifted in time until `out` holds `size_bytes`."""
    ts = [e["ts"] for e in events if isinstance(e.get("ts"), (int, float))]
    span = (max(e["ts"] + e.get("dur", 0) for e in events if "ts" in e and isinstance(
        e["ts"], (int, float))) - min(ts)) * 1.01 + 1000
    steps = sorted({int(m.group(1)) for e in events if isinstance(e.get("name"), str)
                    for m in [STEP.match(e["name"])] if m})
    nsteps = (steps[-1] - steps[0] + 1) if steps else 0
    ids = [v for e in events for k in ("External id", "correlation")
           for v in [(e.get("args") or {}).get(k)] if isinstance(v, int)]
    id_span = (max(ids) + 1) if ids else 0
    raw = open(out, "wb")
    f = gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=1) if compress else raw
    head = {k: v for k, v in header.items() if k != "traceName"}
    f.write(b'{\n' + b"".join(f'  "{k}": {json.dumps(v)},\n'.encode() for k, v in head.items())
            + b'  "traceEvents": [\n')
    copies = written = 0
    first = True
    while raw.tell() < size_bytes:
        chunk = []
        for e in events:
            e2 = dict(e)
            if isinstance(e2.get("ts"), (int, float)):
                e2["ts"] = e2["ts"] + copies * span
            name = e2.get("name")
            if isinstance(name, str) and nsteps:
                m = STEP.match(name)
                if m:
                    e2["name"] = f"ProfilerStep#{int(m.group(1)) + copies * nsteps}"
            args = e2.get("args")
            if isinstance(args, dict) and id_span:
                a2 = dict(args)
                for k in ("External id", "correlation"):
                    if isinstance(a2.get(k), int):
                        a2[k] += copies * id_span
                e2["args"] = a2
            text = json.dumps(e2, indent=2).replace("\n", "\n  ")
            chunk.append(("  " if first else ",\n  ") + text)
            first = False
        f.write("".join(chunk).encode())
        written += len(events)
        copies += 1
    f.write(b'\n  ],\n  "traceName": "replicated"\n}\n')
    f.close()
    if compress:
        raw.close()
    return copies, written


def measure(code: str) -> tuple[float, int, str]:
    """Run `code` in a fresh interpreter: (seconds, peak RSS bytes, stderr tail)."""
    wrapper = ("import resource, sys, time\nt = time.perf_counter()\n" + code +
               "\nprint('BENCH', time.perf_counter() - t, "
               "resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    res = subprocess.run([sys.executable, "-c", wrapper], capture_output=True, text=True,
                         env=env)
    if res.returncode != 0:
        raise SystemExit(f"bench child failed:\n{res.stderr[-3000:]}")
    line = next(x for x in res.stdout.splitlines() if x.startswith("BENCH"))
    _, secs, rss = line.split()
    other = [x for x in res.stdout.splitlines() if not x.startswith("BENCH")]
    return float(secs), int(rss), " ".join(other)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-gb", type=float, default=2.0)
    ap.add_argument("--source", type=Path, default=None, help="trace to replicate")
    ap.add_argument("--gzip", action="store_true", help="write and read .json.gz")
    ap.add_argument("--keep", type=Path, default=None, help="write the big trace here")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="zerodoc-bench-") as tmp:
        tmp = Path(tmp)
        src = args.source or record_demo_trace(tmp)
        header, events = load_source(src)
        out = args.keep or tmp / ("big-rank-0.json" + (".gz" if args.gzip else ""))
        t = time.perf_counter()
        copies, n = replicate(header, events, out, int(args.size_gb * 1e9), args.gzip)
        size = out.stat().st_size
        print(f"trace: {out.name}, {size / 1e9:.2f} GB on disk, {n:,} events "
              f"({copies} copies of {src.name}, {len(events):,} events), written in "
              f"{time.perf_counter() - t:.0f} s")
        del events
        base_s, base_rss, _ = measure("import zerodoc.trace.snapshot, numpy")
        code = (f"from zerodoc.trace import open_traces\n"
                f"s = open_traces({str(out)!r}, window=None).snapshot()\n"
                f"w = s.ranks[min(s.ranks)]\n"
                f"print('steps', w.steps, 'collectives', sum(c.count for c in w.comm.values()))")
        secs, rss, found = measure(code)
        print(f"baseline (imports only): peak RSS {base_rss / 2**20:.0f} MiB")
        print(f"parse + attribute + snapshot: {secs:.1f} s, {size / 1e6 / secs:.1f} MB/s, "
              f"{n / secs:,.0f} events/s, peak RSS {rss / 2**20:.0f} MiB "
              f"({(rss - base_rss) / 2**20:.0f} MiB above the baseline; "
              f"{rss / size:.2f} x the file size)")
        print(f"read: {found}")


if __name__ == "__main__":
    main()
