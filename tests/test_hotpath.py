"""The hot path's shortcuts change no number: the /metrics page served from its caches is,
byte for byte, what prometheus_client's own encoders make of a fresh collector at the same
moment, step after step (new series, errors, a scrape between two step ends); the recorder's
returned clock reads are its bucket boundaries. (Timings and totals themselves are checked
against independent witnesses by test_shim.py, test_exposure.py, test_cuda_semantics.py.)"""

from __future__ import annotations

import gzip
import urllib.request

import pytest
import torch
import torch.distributed as dist
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

import zerodoc
from zerodoc.exporter.prometheus import ZerodocCollector
from zerodoc.shim.recorder import (
    ALL_GATHER, ALL_REDUCE, B_OTHER, B_WAIT, BACKWARD, FORWARD, REDUCE_SCATTER, Recorder,
)

PROMETHEUS = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
              "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1")
PLAIN = "text/plain"


@pytest.fixture
def fsdp2_monitor(tmp_path):
    """A real FSDP2 model (4 blocks + root) on a 1-rank gloo group in this process, with
    zerodoc attached and serving /metrics."""
    from zerodoc.demo.transformer import DemoConfig, batch, build, loss_fn

    if dist.is_initialized():
        pytest.fail("a process group is already initialised in this test process")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    from torch.distributed.device_mesh import init_device_mesh

    cfg = DemoConfig(blocks=4, hidden=32, seq=8, batch=2)
    # a CPU mesh: on a machine with a GPU, fully_shard's default mesh is on CUDA
    model = build(cfg, mesh=init_device_mesh("cpu", (1,)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    mon = zerodoc.attach(model, opt, run_dir=str(tmp_path / "run"), port=0)

    def step(i: int, comm: list) -> None:
        x, y = batch(cfg, i, 0)
        loss_fn(model(x), y).backward()
        for args in comm:  # what the comm wrappers record (world size 1 runs no collective)
            mon.rec.add_comm(*args)
        opt.step()
        opt.zero_grad()
    try:
        yield mon, step
    finally:
        mon.close()
        dist.destroy_process_group()


def _scrape(endpoint: str, accept: str, gz: bool) -> tuple[bytes, str]:
    headers = {"Accept": accept}
    if gz:
        headers["Accept-Encoding"] = "gzip"
    req = urllib.request.Request(f"http://{endpoint}/metrics", headers=headers)
    with urllib.request.urlopen(req, timeout=10) as r:
        body = r.read()
        if r.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        elif gz:
            raise AssertionError("gzip was accepted but not used")
        return body, r.headers["Content-Type"]


def _witness(mon, accept: str) -> tuple[bytes, str]:
    """prometheus_client's encoder over a fresh collector (no cache of any kind)."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(ZerodocCollector(mon))
    encoder, content_type = choose_encoder(accept)
    return encoder(reg), content_type


def test_the_cached_page_is_what_prometheus_client_encodes(fsdp2_monitor):
    mon, step = fsdp2_monitor
    assert mon.endpoint and len(mon.unit_names) == 5
    plan = [
        [(u, FORWARD, ALL_GATHER, 4096, 1e-3, 1e-3, 0.0) for u in range(5)],
        [(u, p, c, 4096, 2e-3, 1e-3, 1e-3) for u in range(5)
         for p, c in ((FORWARD, ALL_GATHER), (BACKWARD, REDUCE_SCATTER))],
        # new series: a collective kind not seen before
        [(1, BACKWARD, ALL_REDUCE, 512, 3e-4, 3e-4, 0.0)],
        [],
    ]
    pages = []
    for i, comm in enumerate(plan):
        step(i, comm)
        if i == 3:
            mon.registry.error("test.hook", RuntimeError("boom"))  # a live family changes
        for accept, gz in ((PROMETHEUS, True), (PLAIN, False), (PROMETHEUS, True)):
            body, ctype = _scrape(mon.endpoint, accept, gz)
            want, want_type = _witness(mon, accept)
            assert ctype == want_type
            assert body == want, f"step {i + 1}, {accept[:30]}: the page differs"
        pages.append(body)
    # The numbers moved with every step (a stale cache would have served the old ones).
    assert len(set(pages)) == len(pages)
    assert b'collective="all_reduce"' in pages[2] and b'hook="test.hook"' in pages[3]
    assert b"zerodoc_compute_seconds_total" in pages[0]


def test_the_recorders_clock_reads_are_its_bucket_boundaries():
    """push/remove return the clock read that closed the previous bucket: the span between
    them is exactly what the bucket was charged (what a blocking collective's time is)."""
    rec = Recorder(1)
    t0 = rec.push(B_WAIT)
    sum(range(10000))
    t1 = rec.remove(B_WAIT)
    assert t1 > t0 and rec.acc[B_WAIT] == t1 - t0
    assert rec.stack == [B_OTHER]


def test_the_lean_drain_returns_the_optimizer_time_and_leaves_unit_buckets_alone():
    """`drain_step` (a step without detail) hands back the optimizer's seconds and zeroes the
    4 step-level buckets only: a detail step's `drain()` left the unit buckets at zero and
    nothing charges them on a step without detail; a unit bucket left on the stack by
    mistake is not charged either (the next detail step starts from clean buckets)."""
    from zerodoc.shim.recorder import B_OPTIMIZER, unit_bucket

    rec = Recorder(50)
    ub = unit_bucket(49, BACKWARD)
    rec.push(ub)
    sum(range(1000))
    acc, _comm = rec.drain(rec.remove(ub))
    assert acc[ub] > 0 and all(x == 0.0 for x in rec.acc)  # the detail step's end
    for _ in range(3):  # steps without detail
        t0 = rec.push(B_OPTIMIZER)
        sum(range(1000))
        t1 = rec.remove(B_OPTIMIZER)
        rec.push(B_WAIT)  # step-level buckets are zeroed too
        assert rec.drain_step(t1 + 0.5) == pytest.approx(t1 - t0)
        assert rec.stack == [B_OTHER] and all(x == 0.0 for x in rec.acc)
    t0 = rec.push(B_OPTIMIZER)  # the optimizer still running at the step end
    assert rec.drain_step(t0 + 0.25) == pytest.approx(0.25)
    rec.push(ub)  # a unit bucket on the stack (never on such a step): not charged
    rec.drain_step(rec.last + 1.0)
    assert all(x == 0.0 for x in rec.acc) and rec.stack == [B_OTHER]
