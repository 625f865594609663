"""A new user's own training script: a small MLP-Mixer, FSDP2 on gloo, launched with torchrun.

Written from the README alone (the two zerodoc lines are marked). Not zerodoc's demo model.

    torchrun --standalone --nproc-per-node 2 train_mixer.py [--wrap block|root]
        [--steps N] [--forget-close] [--attach-before-shard]

--wrap root and the two --forget/--attach flags are the mistakes under test.
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard

import zerodoc  # zerodoc line 1


class MixerBlock(nn.Module):
    def __init__(self, tokens: int, channels: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(channels)
        self.token_mlp = nn.Sequential(nn.Linear(tokens, 4 * tokens), nn.GELU(),
                                       nn.Linear(4 * tokens, tokens))
        self.norm2 = nn.LayerNorm(channels)
        self.channel_mlp = nn.Sequential(nn.Linear(channels, 4 * channels), nn.GELU(),
                                         nn.Linear(4 * channels, channels))

    def forward(self, x):
        x = x + self.token_mlp(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channel_mlp(self.norm2(x))


class Mixer(nn.Module):
    def __init__(self, depth: int = 6, patches: int = 16, patch_dim: int = 48,
                 channels: int = 128, classes: int = 10):
        super().__init__()
        self.stem = nn.Linear(patch_dim, channels)
        self.blocks = nn.ModuleList(MixerBlock(patches, channels) for _ in range(depth))
        self.head = nn.Linear(channels, classes)

    def forward(self, x):
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x.mean(dim=1))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--wrap", choices=("block", "root"), default="block")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--forget-close", action="store_true")
    ap.add_argument("--attach-before-shard", action="store_true")
    args = ap.parse_args()

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = Mixer()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    if args.attach_before_shard:  # the mistake: attach (and an optimizer) before sharding
        monitor = zerodoc.attach(model, optimizer)
    if args.wrap == "block":
        for block in model.blocks:
            fully_shard(block)
    fully_shard(model)
    if not args.attach_before_shard:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        monitor = zerodoc.attach(model, optimizer)  # zerodoc line 2

    gen = torch.Generator().manual_seed(dist.get_rank())
    for _ in range(args.steps):
        x = torch.randn(128, 16, 48, generator=gen)
        y = torch.randint(0, 10, (128,), generator=gen)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    if not args.forget_close:
        monitor.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
