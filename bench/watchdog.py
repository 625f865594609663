"""Cost of the stall watchdog (zerodoc/shim/watchdog.py), measured three ways.

    python bench/watchdog.py [--pairs 100] [--poll-ms 1]

1. One healthy poll (`Watchdog.check()` on a rank making progress): what the daemon thread
   spends every `poll_s` (5 s at the default 120 s threshold).
2. One stall report (`stuck()`: recorder position + a walk of the training thread's Python
   stack): paid once per stall.
3. The training thread: a real FSDP2 step (1 gloo rank, the demo model) A/B interleaved with
   the watchdog thread polling every `--poll-ms` (a thousand times more often than the
   default) against an idle one, order rotating; median step-time ratio. The training
   thread runs no watchdog code; this measures what the polls cost it (the interpreter
   lock, the CPU they take on a busy host), in wall time and in the training thread's own
   CPU time (less sensitive to other jobs on the host).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _micro(mon) -> dict:
    """Polls and stall reports timed on a second thread while the training thread waits
    60 frames deep (a realistic stack for the frame walk)."""
    import threading

    from zerodoc.shim.watchdog import Watchdog

    wd = Watchdog(mon, 120.0)
    release, ready, out = threading.Event(), threading.Event(), {}

    def deep(n: int) -> None:
        if n:
            return deep(n - 1)
        ready.set()
        release.wait(120)

    def measure() -> None:
        ready.wait(10)
        n = 20000
        t0 = time.perf_counter()
        for _ in range(n):
            wd.check()
        out["poll_seconds"] = (time.perf_counter() - t0) / n
        now, reps = time.perf_counter(), 200
        t0 = time.perf_counter()
        for _ in range(reps):
            rec = wd.stuck(now, mon.rec.last, mon.step_index, 1.0)
        out["stall_report_seconds"] = (time.perf_counter() - t0) / reps
        out["stack_frames"] = len(rec["stack"])
        release.set()

    t = threading.Thread(target=measure)
    t.start()
    deep(60)
    t.join()
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=100)
    p.add_argument("--poll-ms", type=float, default=1.0)
    p.add_argument("--blocks", type=int, default=4)
    a = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    import torch.distributed as dist

    import zerodoc
    from zerodoc.demo import frameworks
    from zerodoc.demo.launch import free_port
    from zerodoc.demo.transformer import DemoConfig, batch
    from zerodoc.shim.watchdog import Watchdog

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                            world_size=1)
    cfg = DemoConfig(blocks=a.blocks)
    built = frameworks.build("fsdp2", cfg, {})
    with tempfile.TemporaryDirectory() as tmp:
        mon = zerodoc.attach(built.target, built.optimizer, run_dir=tmp, port=False,
                             stall_after_s=0)  # no thread of its own: the bench drives one
        for step in range(5):
            built.train_step(*batch(cfg, step, 0))
        micro = _micro(mon)
        times = {"on": [], "off": []}
        cpu = {"on": [], "off": []}  # the training thread's own CPU time per step
        for i in range(2 * a.pairs):
            on = (i // 2 + i) % 2 == 0  # A B B A ...: the order rotates
            # Both arms start and stop a thread the same way; only A's polls (B's idles), so
            # the difference is the polling, not thread start-up or the host's scheduling.
            wd = Watchdog(mon, 3600.0, poll_s=a.poll_ms / 1000.0 if on else 3600.0).start()
            time.sleep(0.005)
            x, y = batch(cfg, i, 0)
            t0, c0 = time.perf_counter(), time.thread_time()
            built.train_step(x, y)
            times["on" if on else "off"].append(time.perf_counter() - t0)
            cpu["on" if on else "off"].append(time.thread_time() - c0)
            wd.stop()
        mon.close()
    dist.destroy_process_group()
    ratios = sorted(a_ / b_ for a_, b_ in zip(times["on"], times["off"]))
    med_on, med_off = statistics.median(times["on"]), statistics.median(times["off"])
    print(f"healthy poll:            {micro['poll_seconds'] * 1e6:8.2f} us "
          f"(every 5 s at the default threshold: {micro['poll_seconds'] / 5 * 1e6:.3f} us/s)")
    print(f"stall report (once):     {micro['stall_report_seconds'] * 1e6:8.1f} us")
    print(f"training step, watchdog polling every {a.poll_ms:g} ms vs idle "
          f"({a.pairs} pairs): median {med_on * 1e3:.2f} ms vs {med_off * 1e3:.2f} ms, "
          f"median pair ratio {statistics.median(ratios):.4f} "
          f"(IQR {ratios[len(ratios) // 4]:.4f}-{ratios[3 * len(ratios) // 4]:.4f})")
    cr = sorted(a_ / b_ for a_, b_ in zip(cpu["on"], cpu["off"]) if b_ > 0)
    print(f"training thread CPU per step: median {statistics.median(cpu['on']) * 1e3:.2f} ms "
          f"vs {statistics.median(cpu['off']) * 1e3:.2f} ms, median pair ratio "
          f"{statistics.median(cr):.4f} (IQR {cr[len(cr) // 4]:.4f}-{cr[3 * len(cr) // 4]:.4f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
