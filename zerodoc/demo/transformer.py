"""The demo's small transformer and the ways it can be sharded (right and wrong)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import WRAPS


@dataclass(kw_only=True)
class DemoConfig:
    blocks: int = 4
    """Transformer blocks (each one sharded unit with --wrap block)."""
    hidden: int = 256
    heads: int = 4
    vocab: int = 1024
    seq: int = 128
    batch: int = 4
    wrap: str = "block"
    """block: fully_shard each block + root (right); linear: every Linear (too fine);
    root: only the root (too coarse)."""
    reshard_after_forward: bool = True
    """True: ZeRO-3-like (gather again in backward); False: ZeRO-2-like."""
    prefetch: bool = False
    """Async unshard + explicit forward/backward prefetch (real overlap on gloo)."""
    seed: int = 0

    def __post_init__(self) -> None:
        if self.wrap not in WRAPS:
            raise ValueError(f"wrap must be one of {', '.join(WRAPS)}, not {self.wrap!r}")
        if self.hidden % self.heads:
            raise ValueError("hidden must be a multiple of heads")
        for name in ("blocks", "hidden", "heads", "vocab", "seq", "batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")


class Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, d // self.heads).unbind(2)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                           v.transpose(1, 2), is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class TinyTransformer(nn.Module):
    def __init__(self, cfg: DemoConfig):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab, cfg.hidden)
        self.blocks = nn.ModuleList(Block(cfg.hidden, cfg.heads) for _ in range(cfg.blocks))
        self.norm = nn.LayerNorm(cfg.hidden)
        self.head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x))


def build(cfg: DemoConfig, mesh=None) -> TinyTransformer:
    """Create the model and apply fully_shard as `cfg.wrap` says (needs a process group)."""
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(cfg.seed)
    model = TinyTransformer(cfg)
    kw = {"reshard_after_forward": cfg.reshard_after_forward}
    if mesh is not None:
        kw["mesh"] = mesh
    if cfg.wrap == "block":
        for blk in model.blocks:
            fully_shard(blk, **kw)
    elif cfg.wrap == "linear":
        for mod in model.modules():
            if isinstance(mod, nn.Linear):
                fully_shard(mod, **kw)
    fully_shard(model, **kw)
    if cfg.prefetch:
        from ..shim.hookpoints import fsdp2_set_unshard_async

        fsdp2_set_unshard_async(model, True)
        # Forward order (module definition order here): the root prefetches the first
        # unit, each unit the next; in backward each unit prefetches the previous one.
        # Nothing prefetches the root, nor the last unit's backward all-gather.
        units = [m for m in model.modules()
                 if hasattr(m, "set_modules_to_forward_prefetch") and m is not model]
        if units:
            model.set_modules_to_forward_prefetch([units[0]])
        for i, m in enumerate(units):
            if i + 1 < len(units):
                m.set_modules_to_forward_prefetch([units[i + 1]])
            if i > 0:
                m.set_modules_to_backward_prefetch([units[i - 1]])
    return model


def batch(cfg: DemoConfig, step: int, rank: int):
    g = torch.Generator().manual_seed(cfg.seed * 100003 + step * 1009 + rank)
    tokens = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


def loss_fn(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
