"""What `bench/gpu_check.py` trains and how it injects a known slow link on the device.

- `build_model`: a ~1.1 B-parameter bf16 transformer (20 blocks of width 2048).
- `calibrate_cycles_per_ms`: `torch.cuda._sleep` cycles per millisecond, measured the way
  torch's own tests do (`get_cycles_per_ms`: timed events, trimmed mean of 10 runs), once,
  before any measured step (it synchronises; the measured steps never do).
- `DeviceSlowLink`: FSDP2's all-gather comm object for the check: before the real NCCL
  all-gather it spins `torch.cuda._sleep` for the unit's delay *on the stream the collective
  runs on* (the all-gather stream for `async_op=False`; for `async_op=True` a side stream
  that first waits on the current stream, and the NCCL call is made with that side stream
  current, so the process group's stream waits on the delay, not the compute stream). It is
  installed beneath zerodoc (zerodoc wraps whatever comm it finds), and annotated
  `gpu_check::link (<fqn>)` for the trace witness: ground truth beneath the measurement.
- `world_size_1_all_gathers`: FSDP2 (torch >= 2.9) skips its all-gather and reduce-scatter at
  world size 1 (one GPU: NCCL cannot put two ranks on one device). This re-enables the regular
  all-gather path for the check only, by giving FSDP's "world size 1?" tests in
  `unshard` / `wait_for_unshard` a group that answers 2 while every other caller (the
  all-gather and copy-in/out arithmetic) sees the real size 1. NCCL then really runs a
  1-rank all-gather. The reduce-scatter stays skipped (its test and its arithmetic share one
  function). Restored on exit.
"""

from __future__ import annotations

import contextlib
import sys

import torch
import torch.nn.functional as F
from torch import nn

HIDDEN, BLOCKS, HEADS, VOCAB = 2048, 20, 16, 32000


class Block(nn.Module):
    def __init__(self, h: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
        self.qkv, self.proj = nn.Linear(h, 3 * h), nn.Linear(h, h)
        self.fc1, self.fc2 = nn.Linear(h, 4 * h), nn.Linear(4 * h, h)

    def forward(self, x):
        b, t, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, h // self.heads).unbind(2)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                           v.transpose(1, 2), is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, h))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Model(nn.Module):
    def __init__(self, h: int = HIDDEN, blocks: int = BLOCKS, heads: int = HEADS,
                 vocab: int = VOCAB):
        super().__init__()
        self.embed = nn.Embedding(vocab, h)
        self.blocks = nn.ModuleList(Block(h, heads) for _ in range(blocks))
        self.norm, self.head = nn.LayerNorm(h), nn.Linear(h, vocab, bias=False)

    def forward(self, ids):
        x = self.embed(ids)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x))


def build_model(device) -> Model:
    torch.manual_seed(0)
    with torch.device(device):
        m = Model()
    return m.to(torch.bfloat16)


def n_params(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


def batch(device, step: int, bsz: int = 4, seq: int = 1024):
    g = torch.Generator(device="cpu").manual_seed(step)
    return torch.randint(0, VOCAB, (bsz, seq), generator=g).to(device, non_blocking=False)


def train_step(model, opt, ids) -> None:
    """One step; nothing here reads a value back to the host."""
    logits = model(ids)
    loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), ids.view(-1))
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def calibrate_cycles_per_ms(n: int = 10) -> float:
    torch.cuda._sleep(1_000_000)  # warm up
    vals = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        torch.cuda._sleep(1_000_000)
        b.record()
        b.synchronize()
        vals.append(1_000_000 / a.elapsed_time(b))
    vals.sort()
    trim = vals[2:-2] if len(vals) > 4 else vals
    return sum(trim) / len(trim)


def _real_group(group):
    return getattr(group, "_zd_real", group)


def make_slow_link_class():
    from zerodoc.shim.hookpoints import fsdp2_comm_bases

    AllGather, _rs = fsdp2_comm_bases()  # FSDP2's internals are named in hookpoints.py
    if AllGather is None:
        raise RuntimeError("this torch has no FSDP2 AllGather comm class (>= 2.8): "
                           "cannot inject the device slow link")

    class DeviceSlowLink(AllGather):
        """FSDP2 all-gather comm: the unit's delay on the collective's stream, then NCCL."""

        def __init__(self, fqn: str, delay_ms: float, cycles_per_ms: float):
            self.fqn, self.delay_ms, self.cpm = fqn, delay_ms, cycles_per_ms
            self.side = torch.cuda.Stream()

        def allocate(self, size, *, dtype, device):
            return torch.empty(size, dtype=dtype, device=device)

        def __call__(self, output_tensor, input_tensor, group, async_op=False):
            import torch.distributed as dist

            real = _real_group(group)
            name = f"gpu_check::link ({self.fqn})" if self.fqn else "gpu_check::link"
            with torch.profiler.record_function(name):
                # The issue marker: a minimal kernel on the issuing stream, the witness's
                # start of the collective (where zerodoc's issue event sits too).
                torch.cuda._sleep(1)
                if not async_op:  # current stream = the collective's stream
                    if self.delay_ms > 0:
                        torch.cuda._sleep(int(self.delay_ms * self.cpm))
                    return dist.all_gather_into_tensor(output_tensor, input_tensor, group=real,
                                                       async_op=False)
                self.side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(self.side):
                    if self.delay_ms > 0:
                        torch.cuda._sleep(int(self.delay_ms * self.cpm))
                    return dist.all_gather_into_tensor(output_tensor, input_tensor, group=real,
                                                       async_op=True)
    return DeviceSlowLink


class _SizeTwoForShortcut:
    """A process group whose size() is 2 only for FSDP's world-size-1 shortcut tests."""

    def __init__(self, real):
        self._zd_real = real

    def size(self) -> int:
        caller = sys._getframe(1).f_code.co_name
        return 2 if caller in ("unshard", "wait_for_unshard") else self._zd_real.size()

    def __getattr__(self, name):
        return getattr(self._zd_real, name)


@contextlib.contextmanager
def world_size_1_all_gathers():
    from zerodoc.shim.hookpoints import fsdp2_param_group_class

    FSDPParamGroup = fsdp2_param_group_class()  # FSDP2's internals are named in hookpoints.py
    prop = FSDPParamGroup.__dict__.get("_all_gather_process_group")
    if not isinstance(prop, property):
        raise RuntimeError("FSDPParamGroup._all_gather_process_group is not a property in "
                           "this torch: cannot re-enable all-gathers at world size 1")

    def patched(self):
        pg = prop.fget(self)
        return _SizeTwoForShortcut(pg) if pg.size() == 1 else pg

    FSDPParamGroup._all_gather_process_group = property(patched)
    try:
        yield
    finally:
        FSDPParamGroup._all_gather_process_group = prop


def shard_fsdp2(model: Model, setup: str, delays_ms: dict[str, float], cycles_per_ms: float,
                base_ms: float = 0.0):
    """fully_shard per block + root; the check's device slow link on every unit: `delays_ms`
    for the units named there, `base_ms` for the others. At world size 1 NCCL's in-place
    all-gather launches no device op, so a unit without a delay has nothing the profiler can
    see; `base_ms` gives every collective a device op of its own."""
    from torch.distributed.fsdp import fully_shard

    from zerodoc.shim import hookpoints as hp

    reshard = setup != "no-reshard"
    for blk in model.blocks:
        fully_shard(blk, reshard_after_forward=reshard)
    fully_shard(model, reshard_after_forward=reshard)
    Link = make_slow_link_class()
    fqns = {m: n for n, m in model.named_modules()}  # FSDP's fqns: "" for the root
    for m in [model, *model.blocks]:
        link = Link(fqns[m], delays_ms.get(fqns[m] or "(root)", base_ms), cycles_per_ms)
        for g in hp.fsdp2_param_groups(m):
            g._all_gather_comm = link
    if setup == "async-explicit":
        for m in [model, *model.blocks]:
            m._set_unshard_async_op(True)
        blocks = list(model.blocks)
        for a, b in zip(blocks, blocks[1:]):
            a.set_modules_to_forward_prefetch([b])
            b.set_modules_to_backward_prefetch([a])
    return [fqns[m] for m in [model, *model.blocks]]
