"""Flight-recorder dumps at scale: a 1,024-rank folder read and judged (issue 34, item 4).

    python bench/flightrec.py [--ranks 1024] [--ring 2000] [--dir DIR] [--keep]

Writes `--ranks` synthetic dumps (zerodoc.testing.flightrec: torch's 2.9 format, rings of
`--ring` collectives, the default 2,000, no stack frames; one rank stopped, known by
construction) unless DIR already holds them, then reads them in a fresh interpreter as
`zerodoc report DIR --json` does (the source and rule ZD013, not the rendering) and prints
the files' size, the wall and CPU seconds of the read (CPU: every reading process; a big
folder is read by one process per core, at most 16), its peak resident memory, and
whether the stopped rank was named. The issue's bound: <= 10 s for 1,024 ranks. Wall time
grows on a loaded machine; CPU time much less. Where the CPU goes (a 2,000-entry dump):
~5 ms unpickling, ~1 ms reducing it to what the analysis reads, the rest freeing it;
before issue 34's fix the unpickler read a bare BytesIO op by op (torch writes protocol 2,
no frames: 16 ms) with the cyclic collector passing over its ~50,000 containers.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

READ = """
import json, os, resource, sys, time
t0, c0 = time.perf_counter(), time.process_time()
from zerodoc.sources import open_source
from zerodoc.diagnosis.rules import zd013_rank_stopped as zd013
from zerodoc.report import stopped
from zerodoc.diagnosis.context import Context
snap = open_source(sys.argv[1]).snapshot()
found = stopped(zd013.evaluate(Context(snap)))
kids = resource.getrusage(resource.RUSAGE_CHILDREN)  # the reading processes, if any
print(json.dumps({"wall_s": time.perf_counter() - t0,
                  "cpu_s": time.process_time() - c0 + kids.ru_utime + kids.ru_stime,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "child_rss_mb": kids.ru_maxrss / 1024, "cores": os.cpu_count(),
                  "ranks": found and found["ranks"]}))
"""


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--ring", type=int, default=2000)
    ap.add_argument("--dir", type=Path, default=None)
    ap.add_argument("--keep", action="store_true", help="keep the generated dumps")
    a = ap.parse_args(argv)
    from zerodoc.testing.flightrec import write_dumps

    out = a.dir or Path(tempfile.mkdtemp(prefix="zd-flightrec-")) / "dumps"
    stop = (a.ranks * 2 // 3,)
    try:
        if not out.exists() or not any(out.iterdir()):
            t = time.perf_counter()
            write_dumps(out, a.ranks, stopped=stop, ring=a.ring,
                        steps=a.ring // 5 + 10)
            print(f"generated {a.ranks} dumps in {time.perf_counter() - t:.1f} s")
        size = sum(f.stat().st_size for f in out.iterdir())
        r = subprocess.run([sys.executable, "-c", READ, str(out)], capture_output=True,
                           text=True, cwd=ROOT)
        if r.returncode:
            sys.exit(r.stderr[-2000:])
        got = json.loads(r.stdout.strip().splitlines()[-1])
        print(f"{a.ranks} ranks x {a.ring} collectives: {size / 1e6:.0f} MB of dumps, read "
              f"and judged in {got['wall_s']:.2f} s wall ({got['cpu_s']:.2f} s CPU, "
              f"{got['cores']} cores), peak RSS {got['peak_rss_mb']:.0f} MB (each reading "
              f"process: {got['child_rss_mb']:.0f} MB at most); stopped rank named: {got['ranks']} (stopped: "
              f"{list(stop)}) {'ok' if got['ranks'] == list(stop) else 'WRONG'}")
    finally:
        if not a.keep and a.dir is None:
            shutil.rmtree(out.parent, ignore_errors=True)


if __name__ == "__main__":
    main()
