"""The real monitor on the CUDA stand-in: `zerodoc.attach()` on a fake FSDP2 model
(`fakefsdp2.py` over `cudasim.py`) whose adapter is the real FSDP2 wiring
(`zerodoc.shim.fsdp2.instrument`) over the fake's units, with the GPU path's device recorder
and collective timer on stand-in events. Shared by tests/test_tiers.py and
bench/gpu_hotpath.py."""

from __future__ import annotations

import torch

from .cudasim import Sim
from .fakefsdp2 import FakeFSDP2


def units_spec(n: int) -> list:
    """(name, forward ms, backward ms, all-gather ms, reduce-scatter ms): root + blocks."""
    return [("(root)", 0.2, 0.4, 0.1, 0.1)] + [
        (f"blocks.{i}", 0.5, 1.0, 0.2, 0.3) for i in range(n - 1)]


def build(n: int):
    """(sim, fake FSDP2 model, a torch optimizer) of `n` units."""
    sim = Sim(launch_ms=0.005)
    fsdp = FakeFSDP2(sim, units_spec(n))
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(4))], lr=0.0)
    return sim, fsdp, opt


def _adapter_class(fsdp, names):
    from ..shim import fsdp2
    from ..shim.adapters import Adapter, AdapterFacts
    from ..shim.wiring import unit_facts_placeholder

    class FakeFSDP2Adapter(Adapter):
        framework = "fsdp2"

        def discover(self):
            self.units = [fsdp2.Unit(i, name, m, [g], i == 0) for i, (name, m, g) in
                          enumerate(zip(names, fsdp.modules, fsdp.groups))]
            self.unit_names = list(names)

        def facts(self):
            return AdapterFacts(framework="fsdp2", framework_version="sim",
                                units=[unit_facts_placeholder(n) for n in names])

        def instrument(self, rec, timer, on_root_forward, slow_link_s):
            return fsdp2.instrument(self.units, rec, timer, self.registry, on_root_forward)

        def plan(self, rec, timer, on_root_forward, slow_link_s):
            return fsdp2.build_plan(self.units, rec, timer, self.registry, on_root_forward)

        def memory_module(self):
            return fsdp.root
    return FakeFSDP2Adapter


def attach(sim, fsdp, opt, detail, run_dir: str, queue: list):
    """Attach the real monitor to the fake model on the stand-in's GPU path. `queue`
    receives autograd callbacks (the fake's step runs them); the caller restores
    `hookpoints.queue_autograd_callback` (returned as the second value) when done."""
    import zerodoc
    from ..shim import adapters, cuda
    from ..shim import hookpoints as hp
    from ..shim.devclock import DeviceRecorder, EventPool
    from ..shim.sampler import Sampler

    names = [m.uname for m in fsdp.modules]
    cls = _adapter_class(fsdp, names)
    real_detect, real_queue = adapters.detect, hp.queue_autograd_callback
    adapters.detect = lambda model, optimizer, registry: cls(model, optimizer, registry)
    hp.queue_autograd_callback = queue.append
    try:
        mon = zerodoc.attach(fsdp.root, opt, run_dir=run_dir, port=False, detail="off",
                             stall_after_s=0)
    finally:
        adapters.detect = real_detect
    # attach saw CPU parameters: now the GPU path, on the stand-in's events
    rec = DeviceRecorder(len(names), EventPool(sim.Event))
    mon.rec, mon.timer = rec, cuda.CudaTimer(rec, mon.registry, event_factory=sim.Event)
    mon.sampler = Sampler(detail, "sim")
    mon.facts.config["sampling"] = mon.sampler.header()
    mon._detail_plan()  # built for the new recorder and timer, as attach() does
    if mon.sampler.due(1):
        mon._install_detail()
    else:
        rec.pause()
    return mon, real_queue
