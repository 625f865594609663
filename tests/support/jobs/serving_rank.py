"""A one-process job that serves /metrics and waits: `python tests/support/jobs/serving_rank.py RUN_DIR STEPS`.

Attaches zerodoc to a Linear model (port 0: a free port), trains STEPS steps, prints its
endpoint (`host:port`) and waits until its stdin closes, then closes the monitor. Used by
tests/test_runlog_faults.py: the rank endpoints of two jobs given to one `report`.
"""

from __future__ import annotations

import sys
import warnings

import torch
import torch.nn as nn

import zerodoc


def main() -> None:
    run_dir, steps = sys.argv[1], int(sys.argv[2])
    model = nn.Linear(4, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mon = zerodoc.attach(model, port=0, run_dir=run_dir)
    for _ in range(steps):
        model(torch.randn(2, 4)).sum().backward()
        mon.step()
    print(mon.endpoint, flush=True)
    sys.stdin.read()
    mon.close()


if __name__ == "__main__":
    main()
