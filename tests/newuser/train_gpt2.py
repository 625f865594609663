"""A new user's own training script: a small GPT-2 (Hugging Face `GPT2Config`), FSDP2 on gloo.

Written from the README alone (the two zerodoc lines are marked), with zerodoc's defaults:
no `detail=` option, so per-unit detail comes from sampled steps (adaptive). Not zerodoc's
demo model.

    torchrun --standalone --nproc-per-node 2 train_gpt2.py [--steps N] [--slow-link-ms MS]

--slow-link-ms is the ground truth of tests/test_default_mode.py, injected *beneath*
everything zerodoc wraps: torch.distributed's own all-gather function (which FSDP2's default
all-gather calls) completes MS later on every call, on every step, whether zerodoc samples
that step or not. zerodoc's own `inject_latency_s` is not used: it forces detail on every
step, and this script exists to test the default mode.
"""

import argparse
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard
from transformers import GPT2Config, GPT2LMHeadModel

import zerodoc  # zerodoc line 1


def slow_down_all_gathers(delay_s: float) -> None:
    """Every all-gather of the process completes `delay_s` later (a slow link): a synchronous
    call returns late; an asynchronous one hands back a Work whose wait() returns late."""
    name = "all_gather_single" if hasattr(dist, "all_gather_single") else \
        "all_gather_into_tensor"  # the function FSDP2's DefaultAllGather calls (torch >= 2.13)
    real = getattr(dist, name)

    class LateWork:
        def __init__(self, work):
            self.work = work

        def wait(self, timeout=None):
            ok = self.work.wait() if timeout is None else self.work.wait(timeout)
            time.sleep(delay_s)
            return ok

        def __getattr__(self, attr):
            return getattr(self.work, attr)

    def late(*args, async_op=False, **kwargs):
        work = real(*args, async_op=async_op, **kwargs)
        if async_op and work is not None:
            return LateWork(work)
        time.sleep(delay_s)
        return work

    setattr(dist, name, late)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--slow-link-ms", type=float, default=0.0)
    args = ap.parse_args()

    dist.init_process_group("gloo")
    if args.slow_link_ms > 0:
        slow_down_all_gathers(args.slow_link_ms / 1000.0)
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=512, n_positions=64, n_embd=128, n_layer=6, n_head=4)
    model = GPT2LMHeadModel(cfg)
    for block in model.transformer.h:
        fully_shard(block)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    monitor = zerodoc.attach(model, optimizer)  # zerodoc line 2

    gen = torch.Generator().manual_seed(dist.get_rank())
    try:
        for _ in range(args.steps):
            ids = torch.randint(0, cfg.vocab_size, (8, 64), generator=gen)
            logits = model(input_ids=ids).logits
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, cfg.vocab_size),
                                   ids[:, 1:].reshape(-1))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    finally:
        monitor.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
