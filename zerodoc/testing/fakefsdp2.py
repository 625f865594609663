"""FSDP2's CUDA stream behaviour on the CUDA stand-in (`cudasim.py`), for zerodoc's real
FSDP2 wiring (`zerodoc.shim.fsdp2.instrument`) to be driven through.

Per unit (torch 2.11/2.13 `_fsdp_param_group.py` / `_fsdp_collectives.py`, see docs/gpus.md):
- unshard: copy-in on the all-gather copy-in stream, the all-gather stream waits for it,
  the all-gather comm is called under that stream (``async_op=False``), an event is recorded
  there. With async unshard both streams are the current one and ``async_op=True``;
- wait_for_unshard: the current (compute) stream waits on that event (and on the Work, async),
  then copy-out kernels on the compute stream;
- pre_forward: unshard + wait, then the explicit forward prefetches; post_forward: reshard;
- pre_backward: unshard + wait + the default backward prefetch (previous unit in forward
  order); post_backward: the compute stream waits for the previous reduce-scatter, copy-in
  on it, the reduce-scatter stream waits for it, the comm is called under that stream, an
  event is recorded; the final callback (queued by the root's pre-backward, before any
  unit's) makes the compute stream wait for the last reduce-scatter.
Kernels are labelled with unit and phase so the simulator's log is the witness.
"""

from __future__ import annotations

import torch
from torch import nn

from zerodoc.testing.cudasim import Sim, SimComm, SimPG


class SimModule(nn.Module):
    """A unit's own layers: forward enqueues its compute kernel(s) on the current stream."""

    def __init__(self, sim: Sim, name: str, fwd_ms: float, children=()):
        super().__init__()
        self.sim, self.uname, self.fwd_ms = sim, name, fwd_ms
        self.kids = nn.ModuleList(children)

    def forward(self, x):
        self.sim.kernel(self.fwd_ms / 2, f"fwd:{self.uname}")
        for k in self.kids:
            x = k(x)
        self.sim.kernel(self.fwd_ms / 2, f"fwd:{self.uname}")
        return x


class FakeGroup:
    """An FSDPParamGroup as zerodoc's wrappers see it (comm objects, pre/post_backward)."""

    def __init__(self, fsdp: "FakeFSDP2", index: int, name: str, ag_ms: float, rs_ms: float):
        self.fsdp, self.index, self.name = fsdp, index, name
        self.result = None
        self.unsharded = False
        self.prefetch: list[FakeGroup] = []
        self._all_gather_comm = SimComm(fsdp.pg, ag_ms, lambda: f"ag:{name}:{fsdp.phase}")
        self._reduce_scatter_comm = SimComm(fsdp.pg, rs_ms, lambda: f"rs:{name}")

    def pre_backward(self, default_prefetch: bool = True, *unused):
        f = self.fsdp
        f.phase = "backward"
        f.unshard(self)
        f.wait_for_unshard(self)
        if default_prefetch:
            i = f.groups.index(self)
            if i > 0:
                f.unshard(f.groups[i - 1])

    def post_backward(self, *unused):
        f, sim = self.fsdp, self.fsdp.sim
        if f.last_rs is not None:
            ev, who = f.last_rs
            sim.current.wait_event(ev, f"rs:{who}")
        sim.kernel(f.copy_ms, f"rs-copyin:{self.name}")
        f.rs_stream.wait_stream(sim.current)
        with sim.stream(f.rs_stream):
            out = torch.empty(4)
            self._reduce_scatter_comm(output_tensor=out, input_tensor=torch.empty(8),
                                      group=f.group, op=None)
            f.last_rs = (f.rs_stream.record_event(), self.name)
        self.unsharded = False  # resharded after backward


class FakeFSDP2:
    def __init__(self, sim: Sim, units: list[tuple[str, float, float, float, float]], *,
                 async_op: bool = False, explicit_prefetch: bool = False,
                 reshard_after_forward: bool = True, copy_ms: float = 0.05,
                 legacy_nccl: bool = False):
        """`units`: (name, forward ms, backward ms, all-gather ms, reduce-scatter ms), the
        root first, then its blocks in forward order."""
        self.sim = sim
        self.pg = SimPG(sim, "fsdp", legacy=legacy_nccl)
        self.group = object()  # what FSDP hands its comms: one process group for all
        self.copy_in = _stream(sim, "ag_copy_in")
        self.prev_copyout = None
        self.ag_stream = _stream(sim, "all_gather")
        self.rs_stream = _stream(sim, "reduce_scatter")
        self.async_op, self.copy_ms = async_op, copy_ms
        self.reshard_after_forward = reshard_after_forward
        self.phase = "forward"
        self.last_rs = None
        self.callbacks: list = []
        self.bwd_ms = {}
        self.groups = [FakeGroup(self, i, name, ag, rs)
                       for i, (name, _f, _b, ag, rs) in enumerate(units)]
        blocks = [SimModule(sim, name, fwd) for name, fwd, _b, _a, _r in units[1:]]
        root_name, root_fwd = units[0][0], units[0][1]
        self.root = SimModule(sim, root_name, root_fwd, blocks)
        self.modules = [self.root, *blocks]
        for name, _f, bwd, _a, _r in units:
            self.bwd_ms[name] = bwd
        if explicit_prefetch:
            for a, b in zip(self.groups[1:], self.groups[2:]):
                a.prefetch = [b]
        for g, m in zip(self.groups, self.modules):
            m.register_forward_pre_hook(self._pre_forward(g), prepend=True)
            m.register_forward_hook(self._post_forward(g))

    # --- FSDP's own logic -------------------------------------------------------------
    def unshard(self, g: FakeGroup) -> None:
        if g.result is not None or g.unsharded:
            return
        sim = self.sim
        copy_in, ag = (sim.current, sim.current) if self.async_op else \
            (self.copy_in, self.ag_stream)
        with sim.stream(copy_in):
            sim.kernel(self.copy_ms, f"copyin:{g.name}:{self.phase}")
        if ag is not copy_in:
            ag.wait_stream(copy_in)
        with sim.stream(ag):
            work = g._all_gather_comm(output_tensor=torch.empty(8), input_tensor=torch.empty(4),
                                      group=self.group, async_op=self.async_op)
            ev = ag.record_event()
        g.result = (ev, work)

    def wait_for_unshard(self, g: FakeGroup) -> None:
        if g.result is None:
            return
        ev, work = g.result
        sim = self.sim
        if self.phase == "forward" and not self.async_op and self.prev_copyout is not None:
            # implicit prefetch: the all-gather streams wait for the previous copy-out
            self.copy_in.wait_event(self.prev_copyout)
            self.ag_stream.wait_event(self.prev_copyout)
        sim.current.wait_event(ev, f"ag:{g.name}:{self.phase}")
        if work is not None:
            work.wait()
        sim.kernel(self.copy_ms, f"copyout:{g.name}:{self.phase}")
        self.prev_copyout = sim.current.record_event()
        g.result = None
        g.unsharded = True

    def _pre_forward(self, g: FakeGroup):
        def hook(mod, args):
            if g.index == 0:
                self.phase = "forward"
            self.unshard(g)
            self.wait_for_unshard(g)
            for t in g.prefetch:
                self.unshard(t)
        return hook

    def _post_forward(self, g: FakeGroup):
        def hook(mod, args, out):
            if self.reshard_after_forward and g.index > 0:
                g.unsharded = False
        return hook

    # --- a training step --------------------------------------------------------------
    def step(self, queue: list) -> None:
        """Forward, backward (scripted in autograd's order), optimizer kernel. `queue` is
        where autograd callbacks land (zerodoc's, via the patched hook point)."""
        sim = self.sim
        self.root(torch.zeros(1))
        root, blocks = self.groups[0], self.groups[1:]
        self.phase = "backward"
        queue.append(self._final)  # the root state's pre-backward queues it first
        root.pre_backward(True)
        sim.kernel(self.bwd_ms[root.name] / 2, f"bwd:{root.name}")
        for g in reversed(blocks):
            g.pre_backward(True)
            sim.kernel(self.bwd_ms[g.name], f"bwd:{g.name}")
            g.post_backward()
        sim.kernel(self.bwd_ms[root.name] / 2, f"bwd:{root.name}")
        root.post_backward()
        while queue:
            queue.pop(0)()

    def _final(self) -> None:
        if self.last_rs is not None:
            ev, who = self.last_rs
            self.sim.current.wait_event(ev, f"rs:{who}")
            self.last_rs = None


def _stream(sim: Sim, name: str):
    from zerodoc.testing.cudasim import SimStream

    return SimStream(sim, name)
