"""How fast, and in how much memory, `zerodoc report` reads a large Nsight Systems export.

    python bench/nsys_big.py [--gb 2] [--source EXPORT.sqlite] [--keep PATH]

Builds an export of about `--gb` GB by replicating a real one (default: the 2 x H100 send/recv
pair of tests/data/nsys, nsys-ai's, decompressed; `--source` another export, e.g. the full
original with its autograd-nvtx `aten::` ranges): every row of the kernel, memory, runtime and
NVTX tables copied again and again, shifted by the capture's span each time (correlation ids
shifted past the last one), so the copy is one long capture of the same two processes. Then,
in a fresh interpreter, `NsysSource` reads it and takes a snapshot (what `zerodoc report`
does), and the bench prints the file's size and rows, the wall and CPU time, and the peak
resident memory (VmHWM) beside an interpreter that only imported the same modules.

Large: run it alone on the machine (its time is the figure), `python bench/nsys_big.py`.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT / "tests" / "data" / "nsys" / "mfu_2gpu_before.sqlite.gz"
REPLICATED = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY",
              "CUPTI_ACTIVITY_KIND_MEMSET", "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS")

READ = r"""
import json, resource, sys, time
t0 = time.perf_counter()
from zerodoc.trace.nsys import open_nsys
from zerodoc.trace.scope import device_rows
if sys.argv[1] != "--import-only":
    snap = open_nsys(sys.argv[1], None, progress=False).snapshot()
    rows = device_rows(snap)
else:
    rows = []
secs = time.perf_counter() - t0
ru = resource.getrusage(resource.RUSAGE_SELF)
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM"))
print(json.dumps({"seconds": secs, "cpu_seconds": ru.ru_utime + ru.ru_stime, "peak_kib": hwm,
                  "device": rows}))
"""


def source_copy(src: Path, tmp: Path) -> Path:
    if src.suffix == ".gz":
        out = tmp / src.stem
        with gzip.open(src) as f, open(out, "wb") as g:
            shutil.copyfileobj(f, g)
        return out
    return src


def build(src: Path, out: Path, gb: float) -> dict:
    """Replicate `src`'s rows into `out` until it holds about `gb` GB."""
    if out.exists():
        out.unlink()
    con = sqlite3.connect(str(out))
    con.execute("PRAGMA journal_mode = OFF")
    con.execute("PRAGMA synchronous = OFF")
    con.execute("ATTACH DATABASE ? AS src", (f"file:{src}?mode=ro",))
    tables = con.execute("SELECT name, sql FROM src.sqlite_master WHERE type = 'table' AND "
                         "name NOT LIKE 'sqlite_%'").fetchall()
    for name, sql in tables:
        con.execute(sql)
        if name not in REPLICATED:
            con.execute(f'INSERT INTO main."{name}" SELECT * FROM src."{name}"')
    lo, hi = con.execute('SELECT min(start), max("end") FROM src.CUPTI_ACTIVITY_KIND_KERNEL'
                         ).fetchone()
    shift = hi - lo + 1_000_000
    corr = con.execute("SELECT max(correlationId) FROM src.CUPTI_ACTIVITY_KIND_RUNTIME"
                       ).fetchone()[0] + 1
    present = {n for n, _ in tables}
    inserts = []
    for t in REPLICATED:
        if t not in present:
            continue
        cols = [r[1] for r in con.execute(f'PRAGMA src.table_info("{t}")')]
        sel = ", ".join(f'"{c}" + :k * :shift' if c in ("start", "end") else
                        f'"{c}" + :k * :corr' if c == "correlationId" else f'"{c}"'
                        for c in cols)
        inserts.append(f'INSERT INTO main."{t}" SELECT {sel} FROM src."{t}"')
    k = 0
    target = gb * 1e9
    while out.stat().st_size < target:
        for q in inserts:
            con.execute(q, {"k": k, "shift": shift, "corr": corr})
        con.commit()
        k += 1
    rows = {t: con.execute(f'SELECT count(*) FROM main."{t}"').fetchone()[0]
            for t in REPLICATED if t in present}
    con.execute("DETACH DATABASE src")
    con.close()
    return {"copies": k, "rows": rows, "bytes": out.stat().st_size}


def run(arg: str) -> dict:
    res = subprocess.run([sys.executable, "-c", READ, arg], capture_output=True, text=True,
                         cwd=ROOT, check=True)
    return json.loads(res.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gb", type=float, default=2.0)
    ap.add_argument("--source", type=Path, default=DEFAULT)
    ap.add_argument("--keep", type=Path, help="write the big export here (else a temp dir)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="nsys_big.") as tmp:
        src = source_copy(args.source, Path(tmp))
        out = args.keep or Path(tmp) / "big.sqlite"
        t0 = time.perf_counter()
        info = build(src, out, args.gb)
        built = time.perf_counter() - t0
        base = run("--import-only")
        got = run(str(out))
    rows = ", ".join(f"{t.replace('CUPTI_ACTIVITY_KIND_', '')} {n:,}"
                     for t, n in info["rows"].items())
    print(f"export: {info['bytes'] / 1e9:.2f} GB, {info['copies']} copies of {args.source.name} "
          f"(built in {built:.0f} s); rows: {rows}")
    print(f"read + attribute + snapshot: {got['seconds']:.1f} s wall, {got['cpu_seconds']:.1f} s "
          f"CPU (on a shared machine the CPU time is the figure to trust), peak resident "
          f"{got['peak_kib'] / 1024:.0f} MiB ({(got['peak_kib'] - base['peak_kib']) / 1024:.0f} "
          f"MiB above an import-only interpreter, {base['peak_kib'] / 1024:.0f} MiB)")
    for r in got["device"]:
        print(f"  rank {r['rank']}: step {r['step_seconds']:.3f} s, compute "
              f"{r['compute_seconds']:.3f} s, NCCL {r['comm_seconds']:.3f} s, exposed "
              f"{r['exposed_comm_seconds']:.3f} s, kernels {r['comm_kernels']}")


if __name__ == "__main__":
    main()
