"""A one-process job that attaches zerodoc and never calls close().

    python tests/support/jobs/exit_without_close.py RUN_DIR exit|crash

Trains three steps of a Linear model, then either returns normally (`exit`) or raises an
uncaught RuntimeError("the job crashed") (`crash`). Used by tests/test_guardrails.py: a
normal exit ends the run log and removes the file_sd target; a crash leaves the rank dead.
"""

from __future__ import annotations

import sys

import torch
import torch.nn as nn

import zerodoc


def main():
    run_dir, how = sys.argv[1], sys.argv[2]
    model = nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mon = zerodoc.attach(model, opt, run_dir=run_dir, port=0)
    for _ in range(3):
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
    if how == "crash":
        raise RuntimeError("the job crashed")
    return mon  # no monitor.close(); kept referenced until the interpreter exits


if __name__ == "__main__":
    monitor = main()
