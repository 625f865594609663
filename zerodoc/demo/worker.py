"""One rank of the demo job: `python -m zerodoc.demo.worker SPEC_JSON`.

Started by `zerodoc.demo.launch` with RANK / LOCAL_RANK / WORLD_SIZE / MASTER_ADDR /
MASTER_PORT set. SPEC_JSON holds {"model": DemoConfig fields, "steps": N, "attach": attach()
options, "lr": float}. Ends with destroy_process_group() and os._exit(): gloo jobs whose ranks
exit at different times otherwise abort at interpreter exit (see shared/PROBES.md).
"""

from __future__ import annotations

import json
import os
import signal
import sys


def run(spec: dict) -> int:
    import torch
    import torch.distributed as dist

    import zerodoc
    from zerodoc.demo.model import DemoConfig, batch, build, loss_fn

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    cfg = DemoConfig(**spec.get("model", {}))
    model = build(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=spec.get("lr", 1e-3))
    monitor = zerodoc.attach(model, opt, **spec.get("attach", {}))
    steps = int(spec.get("steps", 20))
    losses = []
    try:
        for step in range(steps):
            x, y = batch(cfg, step, rank)
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
    finally:
        monitor.close()
    if spec.get("losses_file"):
        with open(f"{spec['losses_file']}.{rank}", "w") as f:
            json.dump(losses, f)
    dist.barrier()
    dist.destroy_process_group()
    return 0


def main() -> None:
    # Ctrl-C is handled by the launcher, which terminates us; don't print tracebacks.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    spec = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    code = 1
    try:
        code = run(spec)
    except Exception as e:  # one line, not a traceback, then a clean exit code
        print(f"zerodoc demo worker rank {os.environ.get('RANK')}: {type(e).__name__}: {e}",
              file=sys.stderr, flush=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
