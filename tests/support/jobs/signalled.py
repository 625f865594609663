"""A one-rank FSDP2 job (gloo, world size 1) that trains until a signal stops it.

    python tests/support/jobs/signalled.py RUN_DIR READY_FILE MODE

Creates READY_FILE after its third step (the test then signals it). The loop:

- `readme`: the README's "Use it in a training job" block, read from README.md and run as
  is, with `model`, `optimizer` and an endless `loader` defined here;
- `after_loop`: close() after the loop, no try/finally (the README's loop before issue 32);
- `default` / `chained` / `ignored`: the `after_loop` loop with SIGTERM's disposition left
  at the default / set to a Python handler of the job's before attach (it writes
  READY_FILE + ".handler" and exits with status 7) / ignored before attach.

Used by tests/test_signals.py and bench/chaos_stops.py (`start`, `finish`); zerodoc's options come from the environment
(ZERODOC_RUN_DIR is set to RUN_DIR here; ZERODOC_PORT from the test).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import fully_shard

ROOT = Path(__file__).resolve().parents[3]


def readme_loop() -> str:
    """The python block under README.md's "## Use it in a training job"."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Use it in a training job", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


AFTER_LOOP = """
import zerodoc
monitor = zerodoc.attach(model, optimizer)
for batch in loader:
    loss = model(batch).sum(); loss.backward(); optimizer.step(); optimizer.zero_grad()
monitor.close()
"""


def start(tmp: Path, mode: str) -> tuple[subprocess.Popen, Path, Path]:
    """This job in `mode`, writing to tmp/run, once it has trained three steps: (the process,
    the run directory, the ready file). No /metrics server (ZERODOC_PORT=off)."""
    from tests.support.helpers import job_command, job_env, wait_until

    tmp.mkdir(parents=True, exist_ok=True)  # the file store beside the run directory
    run, ready = tmp / "run", tmp / "ready"
    env = job_env()
    env.update(ZERODOC_PORT="off", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(job_command("signalled", run, ready, mode), env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_until(lambda: ready.exists() or proc.poll() is not None, 120, "three steps")
    except AssertionError:
        proc.kill()
        raise
    if proc.poll() is not None:
        raise AssertionError(f"the job ended before its third step: {proc.communicate()[0]}")
    return proc, run, ready


def finish(proc: subprocess.Popen, timeout: float = 60) -> tuple[int, str]:
    """Wait for the job's end: (exit status, its output); killed past `timeout`."""
    try:
        out = proc.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    return proc.returncode, out


def main() -> None:
    run_dir, ready, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    os.environ["ZERODOC_RUN_DIR"] = run_dir
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{run_dir}.store", rank=0,
                            world_size=1)
    model = nn.Sequential(*(nn.Linear(16, 16) for _ in range(3)))
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)

    def endless():
        n = 0
        while True:
            n += 1
            if n == 4:
                Path(ready).touch()
            yield torch.randn(4, 16)

    if mode == "chained":
        def handler(signum, frame):
            Path(ready + ".handler").touch()
            sys.exit(7)
        signal.signal(signal.SIGTERM, handler)
    elif mode == "ignored":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    code = readme_loop() if mode == "readme" else AFTER_LOOP
    exec(compile(code, f"<{mode} loop>", "exec"),
         {"model": model, "optimizer": optimizer, "loader": endless()})


if __name__ == "__main__":
    main()
