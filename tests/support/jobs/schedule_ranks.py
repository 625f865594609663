"""One rank of a 2-rank gloo job in the default mode, launched as srun or torchrun would
(issue 31: one job identity, one run directory, the same sampled steps on every rank).

    python tests/support/jobs/schedule_ranks.py STEPS SLEEP_S     (in the job's folder)

The rank and world come from srun's variables (SLURM_PROCID, SLURM_NTASKS; no RANK,
WORLD_SIZE or TORCHELASTIC_*: the process group is made by a tcp:// init method at
$ZD_TEST_INIT) or from torchrun's (RANK, WORLD_SIZE: env://). A small FSDP2 model; each step
sleeps SLEEP_S after the optimizer (part of the next step's wall time: the job's own slow
step). zerodoc attaches with its defaults (no run_dir, no detail option; no /metrics server,
no watchdog). Prints `rank R done`.
"""

import os
import sys
import time


def main() -> None:
    steps, sleep_s = int(sys.argv[1]), float(sys.argv[2])
    import torch
    import torch.distributed as dist

    if "SLURM_PROCID" in os.environ:
        rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
        dist.init_process_group("gloo", init_method=os.environ["ZD_TEST_INIT"], rank=rank,
                                world_size=world)
    else:
        dist.init_process_group("gloo")
        rank = dist.get_rank()
    import zerodoc
    from zerodoc.demo import frameworks
    from zerodoc.demo.transformer import DemoConfig, batch

    cfg = DemoConfig(blocks=3, hidden=32, heads=2, vocab=64, seq=8, batch=2)
    torch.manual_seed(0)
    built = frameworks.build("fsdp2", cfg, {})
    mon = zerodoc.attach(built.target, built.optimizer, port=False, stall_after_s=0)
    try:
        for i in range(1, steps + 1):
            x, y = batch(cfg, i, rank)
            built.train_step(x, y)
            if sleep_s:
                time.sleep(sleep_s)
    finally:
        mon.close()
        dist.destroy_process_group()
    print(f"rank {rank} done", flush=True)


if __name__ == "__main__":
    main()
