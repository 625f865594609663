"""What an idle /metrics sidecar costs the rank: its exporter threads' CPU with no requests.

    python bench/sidecar_idle.py [--seconds S] [--runs N]

A live 2-rank demo job (gloo, CPU; `tests/support/helpers.LiveDemo`) serving /metrics from
sidecars (`ZERODOC_EXPORTER_SIDECAR=1`, zerodoc/exporter/sidecar.py). Each rank is scraped
once (its sidecar is up and a page was rendered), then nobody scrapes for S seconds (default
10): printed is the kernel's CPU time (/proc/PID/task/TID/stat, 10 ms ticks, read from
outside the rank) of each rank's threads named `zd-metrics*` over that stretch (the
publisher thread in sidecar mode), the same threads' run time in nanoseconds from the
scheduler (/proc/PID/task/TID/schedstat, first field), and each rank's sidecar's CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def exporter_runtime_ns(pid: int) -> int:
    """The scheduler's run time (ns) of the rank's threads named zd-metrics*."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            if open(f"/proc/{pid}/task/{tid}/comm").read().startswith("zd-metrics"):
                total += int(open(f"/proc/{pid}/task/{tid}/schedstat").read().split()[0])
        except (OSError, ValueError, IndexError):  # the thread ended; no schedstat
            pass
    return total


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=10.0, help="idle stretch (default 10)")
    p.add_argument("--runs", type=int, default=2, help="idle stretches, one job")
    a = p.parse_args(argv)
    from chaos import _get, server_threads_cpu, sidecar_cpu
    from tests.support.helpers import LiveDemo

    tmp = Path(tempfile.mkdtemp(prefix="zerodoc-idle-"))
    out = []
    with LiveDemo(tmp, name="idle", env={"ZERODOC_EXPORTER_SIDECAR": "1"}) as demo:
        demo.wait_steps(5)
        for ep in demo.endpoints:
            _get(ep, None, "/metrics")
        time.sleep(1.5)  # that scrape's stats notice and page are done
        for _ in range(a.runs):
            pids = [p.pid for p in demo.job.procs]
            t0 = time.monotonic()
            cpu0 = [server_threads_cpu(p) for p in pids]
            side0 = [sidecar_cpu(p) for p in pids]
            ns0 = [exporter_runtime_ns(p) for p in pids]
            time.sleep(a.seconds)
            cpu1 = [server_threads_cpu(p) for p in pids]
            side1 = [sidecar_cpu(p) for p in pids]
            ns1 = [exporter_runtime_ns(p) for p in pids]
            secs = time.monotonic() - t0
            out.append({"seconds": round(secs, 2),
                        "rank_exporter_cpu_s": [round(y - x, 3) for x, y in zip(cpu0, cpu1)],
                        "rank_exporter_runtime_ms": [round((y - x) / 1e6, 3)
                                                     for x, y in zip(ns0, ns1)],
                        "sidecar_cpu_s": [round(y - x, 3) for x, y in zip(side0, side1)]})
    for r in out:
        print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
