"""The trace witness of bench/gpu_check.py on a hand-built profiler trace (the shape Kineto
writes: kernels with their stream as tid and a correlation id, the runtime launch calls on
the CPU thread, FSDP's and the check's annotations), so the GPU check's parser is known to
read what it means before it first runs on a GPU."""

from __future__ import annotations

import pytest

from bench.gpu_check_trace import Trace, compare, witness

COMPUTE, AG = 7, 20


def trace():
    ev, corr = [], [0]

    def span(name, a, b):
        ev.append({"ph": "X", "cat": "user_annotation", "name": name, "ts": a, "dur": b - a,
                   "tid": 1})

    def kernel(stream, launch, start, end, name="k"):
        corr[0] += 1
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": launch,
                   "dur": 1, "tid": 1, "args": {"correlation": corr[0]}})
        ev.append({"ph": "X", "cat": "kernel", "name": name, "ts": start, "dur": end - start,
                   "tid": stream, "args": {"correlation": corr[0], "stream": stream}})

    # root: its all-gather (100 us of injected delay) and copy-out, then the embedding
    span("FSDP::pre_forward", 0, 10)
    span("gpu_check::link", 2, 4)
    kernel(AG, 3, 5, 105, "spin")
    kernel(COMPUTE, 8, 105, 110, "copy_out")
    kernel(COMPUTE, 12, 110, 160, "embed")
    # blocks.0: its all-gather (200 us) queued behind the root's; the compute waits for it
    span("FSDP::pre_forward (blocks.0)", 20, 30)
    span("gpu_check::link (blocks.0)", 21, 23)
    kernel(AG, 22, 105, 305, "spin")
    kernel(COMPUTE, 28, 305, 310, "copy_out")
    kernel(COMPUTE, 32, 310, 410, "block")
    span("FSDP::post_forward (blocks.0)", 40, 42)
    kernel(COMPUTE, 45, 410, 460, "head")
    span("FSDP::post_forward", 50, 52)
    return Trace.from_json({"traceEvents": ev})


def test_witness_reads_compute_collective_and_exposed():
    tr = trace()
    assert tr.guess_compute_stream("") == COMPUTE
    w = witness(tr, ["", "blocks.0"], {"": ["blocks.0"]}, "forward", COMPUTE)
    assert w[""] == pytest.approx({"compute": 100e-6, "collective": 100e-6, "exposed": 100e-6})
    # blocks.0: its gather ran 105-305 us; the compute stream was busy until 160 us
    assert w["blocks.0"] == pytest.approx({"compute": 100e-6, "collective": 200e-6,
                                           "exposed": 145e-6})


def test_compare_flags_differences_beyond_tolerance():
    theirs = {"u": {"collective": 0.010, "exposed": 0.004, "compute": 0.001}}
    rows, ok = compare({"u": {"collective": 0.0104, "exposed": 0.0041, "compute": 0.0011}},
                       theirs)
    assert ok and len(rows) == 3
    rows, ok = compare({"u": {"collective": 0.0110, "exposed": 0.004, "compute": 0.001}},
                       theirs)
    assert not ok and [r[-1] for r in rows] == ["FAIL", "ok", "ok"]
