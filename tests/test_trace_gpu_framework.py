"""The profiler-trace source on a GPU trace: FSDP2's framework kernels charged to the unit
and phase of the FSDP span that launched them (issue 22), on a synthetic Kineto trace with
every kernel's unit, phase and duration injected (no GPU here, and no FSDP2 GPU trace in
tests/data: the CPU traces of tests/test_trace_source.py cover the CPU path)."""

from __future__ import annotations

from zerodoc.trace.attribution import attribute
from zerodoc.trace.events import RankEvents


def _trace() -> tuple[list[dict], dict, dict]:
    """(events, framework us per (unit, phase), compute us per (unit, phase)): kernels
    launched inside FSDP's spans are framework time of that span's unit (unnamed: the root),
    the others the unit's compute."""
    evs: list[dict] = []
    corr = [100]
    fw: dict = {}
    comp: dict = {}

    def span(name, ts, end):
        evs.append({"ph": "X", "cat": "user_annotation", "name": name, "ts": ts,
                    "dur": end - ts, "tid": 1, "pid": 1})

    def launch(ts, dev_ts, dur, into=None, key=None):
        corr[0] += 1
        evs.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": ts,
                    "dur": 2, "tid": 1, "pid": 1, "args": {"correlation": corr[0]}})
        evs.append({"ph": "X", "cat": "kernel",
                    "name": "void at::native::vectorized_elementwise_kernel", "ts": dev_ts,
                    "dur": dur, "tid": 7, "pid": 0,
                    "args": {"correlation": corr[0], "stream": 7}})
        if into is not None:
            into[key] = into.get(key, 0.0) + dur

    R, L = "(root)", "layers.0"
    span("ProfilerStep#1", 0, 3000)
    span("FSDP::pre_forward", 10, 40)
    launch(20, 100, 7, fw, (R, "forward"))
    span(f"FSDP::pre_forward ({L})", 50, 80)
    launch(60, 200, 11, fw, (L, "forward"))
    launch(100, 220, 50, comp, (L, "forward"))
    span(f"FSDP::post_forward ({L})", 300, 330)
    launch(310, 300, 13, fw, (L, "forward"))
    launch(350, 320, 20, comp, (R, "forward"))
    span("FSDP::post_forward", 400, 430)
    launch(410, 400, 18, fw, (R, "forward"))
    span("FSDP::pre_backward", 500, 520)
    launch(505, 520, 19, fw, (R, "backward"))
    span(f"FSDP::pre_backward ({L})", 600, 630)
    launch(610, 620, 23, fw, (L, "backward"))
    launch(700, 650, 60, comp, (L, "backward"))
    span(f"FSDP::post_backward_reshard ({L})", 900, 950)
    launch(910, 900, 29, fw, (L, "backward"))
    span("FSDP::post_backward_reshard", 1000, 1050)
    launch(1010, 1000, 31, fw, (R, "backward"))
    return evs, fw, comp


def test_gpu_framework_kernels_go_to_their_spans_unit_and_phase():
    evs, fw, comp = _trace()
    ev = RankEvents()
    for e in evs:
        ev.add(e)
    (step,) = attribute(ev).steps
    assert dict(step.unit_framework) == fw  # root 7 + 18 / 19 + 31, layers.0 11 + 13 / 23 + 29
    assert step.framework == sum(fw.values())
    assert dict(step.compute) == comp
