"""`zerodoc whatif` (issue 22): the step model fitted to a measured run.

Synthetic snapshots (zerodoc.testing.rulecases) with an injected link (latency + bandwidth)
check the link fit and each change against hand-computed ground truth; real 2-rank CPU/gloo
demo runs check the predictions against the run that makes the change for real
(bench/whatif.py prints the same cases as a table)."""

from __future__ import annotations

import json
from dataclasses import replace
import math
import re
import statistics
import subprocess
import sys

import pytest

from zerodoc.cli import main as cli
from zerodoc.diagnosis.context import Context
from zerodoc.testing.rulecases import snapshot_from_dict
from zerodoc.planner import plan
from zerodoc.cli.whatif import render_text
from zerodoc.whatif import Changes, answer, fit, fit_links
from zerodoc.whatif import summary as zerodoc_summary

LAT, BW = 0.004, 200e6  # injected link: 4 ms per call, 200 MB/s bus bandwidth (2 ranks)


def call_s(nbytes: float, n: int = 2) -> float:
    return LAT + nbytes * (n - 1) / n / BW


def synthetic(units=(("(root)", 100_000), ("l0", 250_000), ("l1", 500_000),
                     ("l2", 1_000_000), ("l3", 2_000_000)), *, fwd=0.01, bwd=0.02,
              reshard=True, hidden=False, extra=None, link=None):
    """A synchronous (gloo-like) run: every collective exposed, the step their sum plus the
    compute, 50 ms optimizer and 1 ms framework per collective call; `link`: the time per
    call of nbytes (default `call_s`)."""
    compute, comm = [], []
    calls = 0
    for name, params in units:
        nbytes = params * 4
        compute += [[name, "forward", fwd], [name, "backward", bwd]]
        t = (link or call_s)(nbytes)
        rows = [[name, "forward", "all_gather", 1, nbytes, t, t, 0.0],
                [name, "backward", "reduce_scatter", 1, nbytes, t, t, 0.0]]
        if reshard:
            rows.append([name, "backward", "all_gather", 1, nbytes, t, t, 0.0])
        comm += rows
        calls += len(rows)
    step = sum(r[2] for r in compute) + sum(r[5] for r in comm) + 0.05 + 0.001 * calls
    d = {"run": {"backend": "gloo", "device_type": "cpu", "param_dtype": "float32",
                 "reduce_dtype": "float32", "zero_stage": 3 if reshard else 2,
                 "world_size": 2},
         "units": [{"name": n, "params": p, "dtype_bytes": 4, "reshard_after_forward": reshard}
                   for n, p in units],
         "ranks": [{"steps": 10, "step": step, "optimizer": 0.05, "framework": 0.001 * calls,
                    "compute": compute, "comm": comm,
                    "memory": {"sharded_parameters": 7_700_000, "optimizer_state": 15_400_000,
                               "gradients": 7_700_000}}],
         "copies": 2, "expect": {"code": "ZD000"}}
    if extra:
        extra(d)
    return snapshot_from_dict(d), step


def test_link_fit_recovers_the_injected_latency_and_bandwidth():
    snap, _ = synthetic()
    f = fit_links(snap)[("all_gather", 2)]
    assert f.latency_s == pytest.approx(LAT, rel=1e-6)
    assert f.bandwidth == pytest.approx(BW, rel=1e-6)
    assert f.resid_s == pytest.approx(0, abs=1e-9) and f.points == 10  # 5 units x 2 phases


def test_link_fit_spread_is_the_residual_of_noisy_points():
    """Noise of +-1 ms on alternate points: the residual says ~1 ms, the fit stays close."""
    def noisy(d):
        for i, row in enumerate(d["ranks"][0]["comm"]):
            row[5] += 0.001 if i % 2 else -0.001
    snap, _ = synthetic(extra=noisy)
    f = fit_links(snap)[("all_gather", 2)]
    assert 0.0005 < f.resid_s < 0.002
    assert f.latency_s == pytest.approx(LAT, abs=0.0015)


def test_replay_reproduces_the_step_and_exposure():
    snap, step = synthetic()
    a = answer(fit(snap), Changes())
    assert a["baseline"]["step_s"] == pytest.approx(step, rel=1e-9)
    assert a["measured"]["step_s"] == pytest.approx(step, rel=1e-9)
    assert a["baseline"]["exposed_comm_s"] == pytest.approx(
        a["measured"]["exposed_comm_s"], rel=1e-9)
    lo, hi = a["predicted"]["step_s_range"]
    assert lo <= step <= hi


def test_peer_wait_the_faster_rank_waits_inside_the_collectives():
    """Rank 1 computes each unit's forward 5 ms slower: rank 0 waits for it inside the next
    collective (the next unit's all-gather; after the last unit, its backward all-gather).
    The link is rank 1's time (the smallest), the step the slower rank's, and the worst
    rank's exposed time rank 0's: link + 5 x 5 ms."""
    import copy

    def skew(d):
        r0 = d["ranks"][0]
        r1 = copy.deepcopy(r0)
        for row in r1["compute"]:
            if row[1] == "forward":
                row[2] += 0.005
        r1["step"] += 5 * 0.005
        r0["step"] = r1["step"]
        for row in r0["comm"]:
            if (row[1], row[2]) == ("forward", "all_gather") and row[0] != "(root)" or \
                    (row[0], row[1], row[2]) == ("l3", "backward", "all_gather"):
                row[5] += 0.005
                row[6] += 0.005
        d["ranks"], d["copies"] = [r0, r1], 1
    snap, _ = synthetic(extra=skew)
    a = answer(fit(snap), Changes())
    step = snap.ranks[1].mean_step_seconds
    assert a["measured"]["step_s"] == pytest.approx(step, rel=1e-9)
    assert a["baseline"]["step_s"] == pytest.approx(step, rel=1e-9)
    exp0 = snap.ranks[0].exposed_seconds / 10
    assert a["measured"]["exposed_comm_s"] == pytest.approx(exp0, rel=1e-9)
    assert a["baseline"]["exposed_comm_s"] == pytest.approx(exp0, rel=1e-9)
    assert a["predicted"]["peer_wait_s"] == pytest.approx(0.025, rel=1e-9)


SIX = (("(root)", 100_000), ("l0", 250_000), ("l1", 500_000), ("l2", 1_000_000),
       ("l3", 2_000_000), ("l4", 400_000))


def _spread(delta):
    """Ground truth beneath: two ranks of the same mean compute, and at every collective
    call (a meeting point) one of them arrives late, the two taking turns call by call (the
    late one spent the time outside the units: `other`), by `delta(unit)` at that unit's
    calls. The late arrival starts each collective: the step is the link + compute + the
    lateness of every call; each rank waits inside the calls where the other is late (its
    exposed time: the link + those waits)."""
    import copy

    def extra(d):
        r0 = d["ranks"][0]
        r1 = copy.deepcopy(r0)
        late = [delta(row[0]) for row in r0["comm"]]
        for r, rank in enumerate((r0, r1)):
            waits = 0.0
            for i, row in enumerate(rank["comm"]):
                if i % 2 != r:  # the other rank is late here: this one waits
                    row[5] += late[i]
                    row[6] += late[i]
                    waits += late[i]
            rank["other"] = sum(late) - waits  # its own lateness
            rank["step"] += sum(late)
        d["ranks"], d["copies"] = [r0, r1], 1
    return extra


def test_arrival_spread_the_ranks_wait_for_each_other_at_every_call():
    """The ranks take turns arriving 1 ms late at each of the 18 calls (`_spread`): their
    mean compute is the same, so the waits are no compute difference. The replay reproduces
    the step and the exposed time (the model before missed both: no peer wait, the step
    short of 9 of the 18 ms). Merged units (12 calls left), late by 1 ms at each call too,
    are predicted on B; the range reaches 12/18 of that spread down and all of A's up."""
    delta = 0.001
    snap, _ = synthetic(SIX, extra=_spread(lambda _u: delta))
    m = fit(snap)
    a = answer(m, Changes())
    assert a["measured"]["step_s"] == pytest.approx(snap.ranks[0].mean_step_seconds)
    assert a["baseline"]["step_s"] == pytest.approx(a["measured"]["step_s"], rel=1e-9)
    exposed_a = snap.ranks[0].exposed_seconds / 10
    assert a["baseline"]["exposed_comm_s"] == pytest.approx(exposed_a, rel=1e-9)
    assert a["baseline"]["exposed_comm_s"] - sum(
        3 * call_s(p * 4) for _n, p in SIX) == pytest.approx(9 * delta, rel=1e-6)
    # B: root, (l0+l1), (l2+l3), l4 measured the same way (12 calls)
    merged = (("(root)", 100_000), ("l0..l1", 750_000), ("l2..l3", 3_000_000),
              ("l4", 400_000))
    b, _ = synthetic(merged, extra=_spread(lambda _u: delta))
    exposed_b = max(w.exposed_seconds for w in b.ranks.values()) / 10
    p = answer(m, Changes(merge=2))["predicted"]
    assert p["exposed_comm_s"] == pytest.approx(exposed_b, rel=1e-9)
    assert p["arrival_wait_s"] == pytest.approx(6 * delta, rel=1e-9)
    lo, hi = (m.replay(Changes(merge=2), bound=z).arrival_wait_s for z in (-2, 2))
    assert (lo, hi) == pytest.approx((6 * delta * 12 / 18, 9 * delta), rel=1e-9)


def test_arrival_spread_kept_from_fit_to_fit_takes_each_fits_time_outside_the_units():
    """The arrival spread's per-unit part is kept while the per-unit numbers are unchanged
    (`stepmodel.UnitPart`); the time outside the units is a per-step number, taken on every
    fit: rank 1 5 ms slower outside the units leaves rank 0 5 ms less of unexplained wait per
    step (the replay's step has it from rank 1), as a fresh fit gives."""
    import dataclasses

    from zerodoc.whatif import stepmodel

    snap, _ = synthetic(SIX, extra=_spread(lambda _u: 0.001))
    r0 = fit(snap).ranks[0]
    wait = r0.arrival_wait_per_call_s * r0.arrival_calls
    assert wait > 0.005
    more = dataclasses.replace(snap, ranks={
        r: dataclasses.replace(w, other_seconds=w.other_seconds + 0.005 * w.steps * (r == 1))
        for r, w in snap.ranks.items()})
    built = stepmodel.PARTS_BUILT[0]
    m = fit(more)
    assert stepmodel.PARTS_BUILT[0] == built  # the per-unit part was kept
    r0 = m.ranks[0]
    assert r0.arrival_wait_per_call_s * r0.arrival_calls == pytest.approx(wait - 0.005,
                                                                          rel=1e-9)
    stepmodel.MEMO = False
    try:
        fresh = fit(more)
    finally:
        stepmodel.MEMO = True
    for ch in (Changes(), Changes(merge=2)):
        assert json.dumps(answer(m, ch, memory=False), sort_keys=True, default=repr) == \
            json.dumps(answer(fresh, ch, memory=False), sort_keys=True, default=repr)


def test_reshard_after_forward_off_drops_the_backward_all_gathers():
    snap, step = synthetic()
    m = fit(snap)
    a = answer(m, Changes(reshard_after_forward=False))
    ag = sum(call_s(p * 4) for p in (100_000, 250_000, 500_000, 1_000_000, 2_000_000))
    # the backward all-gathers and their framework time (1 ms per call) go
    assert a["predicted"]["step_s"] == pytest.approx(step - ag - 0.005, rel=1e-9)
    # memory: the planner's ZeRO-3 with the whole model kept gathered
    ctx = Context(snap)
    want = plan(ctx.plan_input(reshard_after_forward=False, prefetch_depth=0)) \
        .stage("zero3").total_bytes
    assert a["predicted"]["peak_bytes"] == want > a["baseline"]["peak_bytes"]
    # and back: a ZeRO-2-like run predicted with resharding on
    snap2, step2 = synthetic(reshard=False)
    b = answer(fit(snap2), Changes(reshard_after_forward=True))
    assert b["predicted"]["step_s"] == pytest.approx(step2 + ag + 0.005, rel=1e-9)


def test_merging_units_pays_the_latency_once_per_merged_unit():
    snap, step = synthetic()
    a = answer(fit(snap), Changes(merge=2))  # root, (l0+l1), (l2+l3)
    b = [100_000, 750_000, 3_000_000]
    comm = sum(3 * call_s(p * 4) for p in b)
    # the framework time (15 ms: 1 ms per call in the run) is priced per byte: the bytes stay
    want = 5 * 0.03 + comm + 0.05 + 0.015
    assert a["predicted"]["step_s"] == pytest.approx(want, rel=1e-9)
    assert a["predicted"]["exposed_comm_s"] == pytest.approx(comm, rel=1e-9)
    assert step - a["predicted"]["step_s"] == pytest.approx(2 * 3 * LAT, rel=1e-6)
    # the range reaches a cost per call (9 calls: 9 ms)
    assert a["predicted"]["step_s_range"][0] <= want - 0.006


def _merged_truth(units, parts, fw_per_byte=None):
    """Run B of a merge measured for real, synthetically: `units` with the compute of their
    `parts` (units merged) and, with `fw_per_byte`, a framework time per byte moved."""
    def extra(d):
        r = d["ranks"][0]
        for row in r["compute"]:
            k = parts.get(row[0], 1)
            r["step"] += row[2] * (k - 1)
            row[2] *= k
        if fw_per_byte is not None:
            _fw_per_byte(d, fw_per_byte)
    snap, _ = synthetic(units, extra=extra)
    return snap, snap.ranks[0].mean_step_seconds


def _fw_per_byte(d, per_byte):
    r = d["ranks"][0]
    fw = per_byte * sum(row[3] * row[4] for row in r["comm"])
    r["step"] += fw - r["framework"]
    r["framework"] = fw


def test_merge_prices_the_framework_time_per_byte():
    """Ground truth beneath: FSDP's copies cost 2 ms per MB moved in A and in B (the merged
    run moves the same bytes in fewer calls); B predicted from A lands on B."""
    snap, _ = synthetic(extra=lambda d: _fw_per_byte(d, 2e-9))
    a = answer(fit(snap), Changes(merge=2))
    _, step_b = _merged_truth((("(root)", 100_000), ("l0..l1", 750_000), ("l2..l3", 3_000_000)),
                              {"l0..l1": 2, "l2..l3": 2}, fw_per_byte=2e-9)
    assert a["predicted"]["step_s"] == pytest.approx(step_b, rel=1e-9)
    lo, hi = a["predicted"]["step_s_range"]
    assert lo <= step_b <= hi


FW_CALL, FW_BYTE = 0.0004, 1.5e-9  # injected framework time: 0.4 ms per call, 1.5 ms per MB


def _fw_per_unit(d, per_call=FW_CALL, per_byte=FW_BYTE, noise=None, per_tensor=0.0):
    """The framework's time recorded per unit (ground truth: a part per call and a part per
    byte, with `per_tensor` one per parameter tensor of the unit at each call, `noise[i]`
    seconds added to unit i's), the step's total their sum."""
    r = d["ranks"][0]
    tensors = {u["name"]: u.get("tensors", 0) for u in d["units"]}
    per_unit: dict[str, float] = {}
    for row in r["comm"]:
        per_unit[row[0]] = per_unit.get(row[0], 0.0) + row[3] * (
            per_call + per_byte * row[4] + per_tensor * tensors[row[0]])
    if noise:
        for i, name in enumerate(per_unit):
            per_unit[name] += noise[i % len(noise)]
    r["unit_framework"] = [[name, "backward", s] for name, s in per_unit.items()]
    total = sum(per_unit.values())
    r["step"] += total - r["framework"]
    r["framework"] = total


def test_framework_fit_recovers_the_injected_per_call_and_per_byte_parts():
    """Ground truth beneath: FSDP's time per unit is 0.4 ms per call + 1.5 ms per MB moved.
    With the run's framework time recorded per unit (units of several sizes), the fit
    recovers both parts, and a merge (fewer calls, the same bytes) is predicted on B, which
    the step's total priced per byte (older logs) misses by the calls' part."""
    snap, _ = synthetic(extra=_fw_per_unit)
    m = fit(snap)
    f = m.ranks[0].framework_fit
    assert f is not None and f.units == 5
    assert f.per_call_s == pytest.approx(FW_CALL, rel=1e-6)
    assert f.per_byte_s == pytest.approx(FW_BYTE, rel=1e-6)
    assert f.rest_s == pytest.approx(0, abs=1e-12)
    a = answer(m, Changes(merge=2))
    assert a["framework"]["pricing"] == "per unit"
    assert a["baseline"]["step_s"] == pytest.approx(a["measured"]["step_s"], rel=1e-9)
    step_b = _merge2_predicted_on_b(a, _fw_per_unit)
    # the same run with the framework time per step only: priced per byte, 6 calls x 0.4 ms
    # too dear (15 calls -> 9)
    old, _ = synthetic(extra=lambda d: (_fw_per_unit(d), d["ranks"][0].pop("unit_framework")))
    b = answer(fit(old), Changes(merge=2))
    assert b["framework"]["pricing"] == "per step"
    assert b["predicted"]["step_s"] - step_b == pytest.approx(6 * FW_CALL, rel=1e-6)


def test_framework_fit_kept_from_fit_to_fit_takes_each_fits_total():
    """The framework fit is read from the per-unit numbers and kept while they are unchanged
    (`stepmodel.UnitPart`); the time of no unit is the rank's per-step total beyond its
    units' and is taken on every fit: 5 ms more framework time per step outside the units
    (per-unit numbers unchanged) is `rest_s`, the replay's step 5 ms longer, as a fresh fit
    gives."""
    import dataclasses

    from zerodoc.whatif import stepmodel

    snap, _ = synthetic(extra=_fw_per_unit)
    base = answer(fit(snap), Changes(merge=2), memory=False)
    more = dataclasses.replace(snap, ranks={
        r: dataclasses.replace(w, framework_seconds=w.framework_seconds + 0.005 * w.steps,
                               step_seconds=w.step_seconds + 0.005 * w.steps)
        for r, w in snap.ranks.items()})
    built = stepmodel.PARTS_BUILT[0]
    m = fit(more)
    assert stepmodel.PARTS_BUILT[0] == built  # the per-unit part was kept
    assert m.ranks[0].framework_fit.rest_s == pytest.approx(0.005, rel=1e-9)
    a = answer(m, Changes(merge=2), memory=False)
    assert a["baseline"]["step_s"] - base["baseline"]["step_s"] == pytest.approx(0.005, rel=1e-6)
    stepmodel.MEMO = False
    try:
        fresh = answer(fit(more), Changes(merge=2), memory=False)
    finally:
        stepmodel.MEMO = True
    assert json.dumps(a, sort_keys=True, default=repr) == \
        json.dumps(fresh, sort_keys=True, default=repr)


def test_framework_beyond_the_runs_largest_unit_widens_only_the_high_end():
    """A merge whose units make larger calls than any of the run's: the point stays the
    fitted line's (here the truth: the injected parts are linear and noise-free, so the
    line's own range is the point), the range's high end prices the bytes of a unit beyond
    the run's largest call past the fit's largest unit at the run's average framework time
    per byte (FSDP2's copies into larger fresh buffers cost more per byte inside a real step,
    docs/whatif.md), and the answer says how far beyond it goes. Within the run's sizes
    nothing changes."""
    snap, _ = synthetic(extra=_fw_per_unit)
    m = fit(snap)
    f = m.ranks[0].framework_fit
    sizes = [p * 4 for p in (100_000, 250_000, 500_000, 1_000_000, 2_000_000)]
    line = [3 * (FW_CALL + FW_BYTE * x) for x in sizes]  # the truth per unit and step
    # the run's own framework time over its bytes (3 calls of x per unit and step)
    avg = sum(line) / sum(3 * x for x in sizes)
    assert f.per_byte_avg_s == pytest.approx(avg, rel=1e-9)
    assert f.max_call_bytes == f.max_bytes == 8_000_000
    # within the run's sizes the range is the line's, which for a noise-free run is the truth
    base_lo, base_hi = m.replay(Changes(), bound=-2), m.replay(Changes(), bound=+2)
    assert base_lo.framework_s == pytest.approx(sum(line), rel=1e-6)
    assert base_hi.framework_s == pytest.approx(sum(line), rel=1e-6)
    ch = Changes(merge=2)  # (root) 0.4 MB, l0..l1 3 MB, l2..l3 12 MB per call (beyond 8 MB)
    a = answer(m, ch)
    over = a["framework"]["beyond_run_sizes"]
    assert over["largest_measured_bytes"] == 8_000_000
    assert over["largest_predicted_bytes"] == pytest.approx(12_000_000)
    assert over["ratio"] == pytest.approx(1.5)
    truth = [3 * (FW_CALL + FW_BYTE * x) for x in (4e5, 3e6, 12e6)]
    point = m.replay(ch).framework_s
    lo, hi = a["predicted"]["framework_s_range"]
    assert point == pytest.approx(sum(truth), rel=1e-6)
    assert lo == pytest.approx(point, rel=1e-6)
    # the 12 MB unit: the line's point at the run's largest unit (8 MB), the 4 MB past it at
    # the run's average price per byte (dearer than the line's: it carries the per-call part)
    assert avg > FW_BYTE
    high_12 = 3 * (FW_CALL + FW_BYTE * 8e6 + 4e6 * avg)
    assert hi == pytest.approx(truth[0] + truth[1] + high_12, rel=1e-6)
    text = render_text(a)
    assert "framework: units up to 1.5x the run's largest (12.00 MB per call against " \
        "8.00 MB): priced along the fitted line, the range's high end at the run's " \
        f"framework time per byte ({avg * 1e9:.2f} ms per MB" in text
    # a change within the run's sizes: no note, the line's range (the truth)
    same = answer(m, Changes(reshard_after_forward=False))
    assert same["framework"]["beyond_run_sizes"] is None
    assert same["predicted"]["framework_s_range"][1] == pytest.approx(
        same["predicted"]["framework_s"], rel=1e-6)


def test_framework_beyond_is_judged_by_the_largest_call_not_the_average():
    """Reduce-scatters twice the all-gathers' bytes (fp32 gradients, bf16 parameters):
    resharding off drops the backward all-gathers, so a unit's bytes per call on average
    rise, but no call is larger than the run's: nothing is beyond (review rev5 S1)."""
    def rs_double(d):
        for row in d["ranks"][0]["comm"]:
            if row[2] == "reduce_scatter":
                row[4] *= 2
        _fw_per_unit(d)

    snap, _ = synthetic(extra=rs_double)
    m = fit(snap)
    a = answer(m, Changes(reshard_after_forward=False))
    assert a["framework"]["beyond_run_sizes"] is None
    assert a["predicted"]["framework_s_range"][1] == pytest.approx(
        a["predicted"]["framework_s"], rel=1e-6)
    assert answer(m, Changes(merge=2))["framework"]["beyond_run_sizes"]["ratio"] == \
        pytest.approx(24e6 / 16e6)


FW_TENSOR = 0.00002  # injected: 20 us per parameter tensor at each call
TENSORS = {"(root)": 19, "l0": 2, "l1": 2, "l2": 4, "l3": 2}


def _tensors(counts):
    def extra(d):
        for u in d["units"]:
            u["tensors"] = counts[u["name"]]
    return extra


def test_framework_fit_recovers_a_part_per_parameter_tensor():
    """Ground truth beneath: FSDP's time per unit is 0.4 ms per call + 20 us per parameter
    tensor at each call + 1.5 ms per MB, the units' tensor counts recorded (a 19-tensor
    root, 2-4 elsewhere). The fit recovers the three parts and predicts the merged run B
    (its units hold their parts' tensors); the same run without the counts (an older log)
    is priced per call + per byte, says so, and misses B."""
    def run(d, counts=TENSORS):
        _tensors(counts)(d)
        _fw_per_unit(d, per_tensor=FW_TENSOR)
    snap, _ = synthetic(extra=run)
    m = fit(snap)
    f = m.ranks[0].framework_fit
    assert f.per_tensor and f.per_tensor_s == pytest.approx(FW_TENSOR, rel=1e-6)
    assert f.per_call_s == pytest.approx(FW_CALL, rel=1e-6)
    assert f.per_byte_s == pytest.approx(FW_BYTE, rel=1e-6)
    a = answer(m, Changes(merge=2))
    assert a["framework"]["note"].startswith("per call + per tensor + per byte")
    assert a["baseline"]["step_s"] == pytest.approx(a["measured"]["step_s"], rel=1e-9)
    step_b = _merge2_predicted_on_b(a, lambda d: run(d, {"(root)": 19, "l0..l1": 4,
                                                         "l2..l3": 6}))

    def old_log(d):
        run(d)
        for u in d["units"]:
            del u["tensors"]
    old = fit(synthetic(extra=old_log)[0])
    b = answer(old, Changes(merge=2))
    assert old.ranks[0].framework_fit.per_tensor_s == 0
    assert "parameter tensor counts are not known" in b["framework"]["note"]
    assert abs(b["predicted"]["step_s"] - step_b) > 1e-4


def test_framework_fit_tensor_counts_that_follow_the_bytes_keep_per_call_and_per_byte():
    """Every unit 2 tensors: nothing parts a cost per tensor from one per call; the fit is
    per call + per byte and says why."""
    snap, _ = synthetic(extra=lambda d: (_tensors(dict.fromkeys(TENSORS, 2))(d),
                                         _fw_per_unit(d)))
    m = fit(snap)
    f = m.ranks[0].framework_fit
    assert not f.per_tensor and f.per_call_s == pytest.approx(FW_CALL, rel=1e-6)
    assert "do not vary apart from their bytes" in answer(m, Changes())["framework"]["note"]


def _merge2_predicted_on_b(a: dict, framework) -> float:
    """B of `Changes(merge=2)` on `synthetic()`'s units measured (root, l0+l1, l2+l3: their
    parts' compute, `framework(d)` its framework time): `a`'s predicted step lands on it,
    inside its range. B's step."""
    def truth(d):
        _merged_truth_compute(d, {"l0..l1": 2, "l2..l3": 2})
        framework(d)
    b_run, _ = synthetic((("(root)", 100_000), ("l0..l1", 750_000), ("l2..l3", 3_000_000)),
                         extra=truth)
    step_b = b_run.ranks[0].mean_step_seconds
    assert a["predicted"]["step_s"] == pytest.approx(step_b, rel=1e-9)
    lo, hi = a["predicted"]["step_s_range"]
    assert lo <= step_b <= hi
    return step_b


def _merged_truth_compute(d, parts):
    r = d["ranks"][0]
    for row in r["compute"]:
        k = parts.get(row[0], 1)
        r["step"] += row[2] * (k - 1)
        row[2] *= k


def test_framework_fit_with_noise_keeps_the_truth_inside_its_range():
    """Noise of +-0.3 ms on the units' framework time: the fit lands near the injected
    parts with standard errors > 0, and B's framework time is inside the prediction's
    range; the range is wider than the exact fit's."""
    noise = (0.0003, -0.0003, 0.0003, -0.0003, 0.0003)
    snap, _ = synthetic(extra=lambda d: _fw_per_unit(d, noise=noise))
    m = fit(snap)
    f = m.ranks[0].framework_fit
    assert f.se_call_s > 0 and f.se_per_byte_s > 0
    assert f.per_call_s == pytest.approx(FW_CALL, abs=0.0003)
    assert f.per_byte_s == pytest.approx(FW_BYTE, rel=0.25)
    merged = m._units(m.ranks[0], Changes(merge=2))
    truth = sum(3 * FW_CALL + FW_BYTE * sum(v[0] * v[1] for p in u.comm.values()
                                            for v in p.values()) for u in merged)
    lo = m._framework_s(m.ranks[0], merged, True, -2.0)
    hi = m._framework_s(m.ranks[0], merged, True, +2.0)
    assert lo < truth < hi
    exact, _ = synthetic(extra=_fw_per_unit)
    me = fit(exact)
    assert hi - lo > me._framework_s(me.ranks[0], merged, True, 2.0) - \
        me._framework_s(me.ranks[0], merged, True, -2.0)


def test_framework_fit_needs_three_units_with_collectives():
    """Two units cannot part a cost per call from a cost per byte: per-step pricing."""
    snap, _ = synthetic((("(root)", 100_000), ("l0", 250_000)), extra=_fw_per_unit)
    m = fit(snap)
    assert m.ranks[0].framework_fit is None
    assert answer(m, Changes(merge=2))["framework"]["pricing"] == "per step"


def test_framework_fit_units_of_one_size_keep_the_per_step_pricing():
    """Units of one size cannot part a cost per call from one per byte: a fit would price
    it per call only, with no range (a merge then predicted at the calls' share, the range
    a point). The per-step pricing (per byte, the range to per call) is kept, and the
    answer says why."""
    same = tuple((n, 250_000) for n in ("(root)", "l0", "l1", "l2", "l3"))
    snap, _ = synthetic(same, extra=_fw_per_unit)
    m = fit(snap)
    assert m.ranks[0].framework_fit is None
    a = answer(m, Changes(merge=2))
    assert a["framework"]["pricing"] == "per step"
    assert "of one size" in a["framework"]["note"]
    lo, hi = a["predicted"]["step_s_range"]
    assert hi > lo


def test_framework_fit_ranks_with_the_same_units_do_not_narrow_its_range():
    """Eight ranks that measured the same units (the same sizes, the same noise) are not
    eight times the evidence of one: the pooled fit's standard errors equal one rank's."""
    import copy

    noise = (0.0003, -0.0003, 0.0003, -0.0003, 0.0003)

    def copies(n):
        def extra(d):
            _fw_per_unit(d, noise=noise)
            d["ranks"] = [copy.deepcopy(d["ranks"][0]) for _ in range(n)]
            d["copies"] = 1
        return extra
    one = fit(synthetic(extra=copies(1))[0]).ranks[0].framework_fit
    eight = fit(synthetic(extra=copies(8))[0]).ranks[0].framework_fit
    assert one.ranks == 1 and eight.ranks == 8
    assert eight.per_call_s == pytest.approx(one.per_call_s, rel=1e-9)
    assert eight.se_call_s == pytest.approx(one.se_call_s, rel=1e-9)
    assert eight.se_per_byte_s == pytest.approx(one.se_per_byte_s, rel=1e-9)


def test_whatif_text_says_how_the_framework_time_is_priced():
    from zerodoc.cli.whatif import render_text

    snap, _ = synthetic(extra=_fw_per_unit)
    text = render_text(answer(fit(snap), Changes(merge=2), memory=False))
    assert "priced per unit: 400 us per call" in text and "+ 1.50 ms per MB" in text
    assert "no part per tensor: the units' parameter tensor counts are not known" in text
    snap, _ = synthetic(extra=lambda d: (_tensors(TENSORS)(d),
                                         _fw_per_unit(d, per_tensor=FW_TENSOR)))
    text = render_text(answer(fit(snap), Changes(merge=2), memory=False))
    assert "400 us per call (± 0) + 20.0 us per parameter tensor (± 0.0)" in text
    old, _ = synthetic()
    text = render_text(answer(fit(old), Changes(merge=2), memory=False))
    assert "per byte of the step's total" in text
    assert "has the framework's time per step only" in text


def test_merge_beyond_the_fitted_sizes_a_noise_hidden_slope_widens_the_range():
    """The run's calls span 1-2 MB and noise (+3 ms on the small calls, -3 ms on the large)
    makes the fitted slope negative: latency only. A merge prices 5.8 MB calls: the
    bandwidth the noise hid (200 MB/s, injected) must be inside the range, not priced as
    infinite with no error."""
    units = (("(root)", 100_000), ("l0", 250_000), ("l1", 300_000), ("l2", 400_000),
             ("l3", 500_000))

    def hide(d):
        for row in d["ranks"][0]["comm"]:
            if row[0] != "(root)":
                dt = 0.003 if row[4] <= 1_200_000 else -0.003
                row[5] += dt
                row[6] += dt
                d["ranks"][0]["step"] += dt
    snap, _ = synthetic(units, extra=hide)
    f = fit_links(snap)[("all_gather", 2)]
    assert f.bandwidth is None and f.se_seconds_per_wire_byte > 0
    a = answer(fit(snap), Changes(merge=4))  # root, (l0..l3)
    b, step_b = _merged_truth((("(root)", 100_000), ("l0..l3", 1_450_000)), {"l0..l3": 4})
    exposed_b = b.ranks[0].exposed_seconds / 10
    p = a["predicted"]
    assert p["exposed_comm_s"] < exposed_b  # the point: latency only, too fast
    lo, hi = p["exposed_comm_s_range"]
    assert lo <= exposed_b <= hi
    lo, hi = p["step_s_range"]
    assert lo <= step_b <= hi


def test_merge_per_block_groups_by_the_block_container():
    units = (("(root)", 100_000), ("blocks.0.a", 200_000), ("blocks.0.b", 300_000),
             ("blocks.1.a", 400_000), ("blocks.1.b", 500_000), ("head", 600_000))
    snap, step = synthetic(units)
    m = fit(snap)
    assert m.block_container == "blocks"
    merged = m._units(m.ranks[0], Changes(merge="blocks"))
    assert [u.name for u in merged] == ["(root)..head", "blocks.0.a..blocks.0.b",
                                        "blocks.1.a..blocks.1.b"]
    a = answer(m, Changes(merge="blocks"))
    assert step - a["predicted"]["step_s"] == pytest.approx(3 * 3 * LAT, rel=1e-6)
    # each merged unit against the sum of its parts: two units' 3 calls become 3, so 3
    # latencies fewer
    change = {u["unit"]: u["exposed_change_s"] for u in a["units"]}
    assert change["blocks.0.a..blocks.0.b"] == pytest.approx(-3 * LAT, rel=1e-6)
    assert change["(root)..head"] == pytest.approx(-3 * LAT, rel=1e-6)


def test_latency_and_bandwidth_changes():
    snap, step = synthetic()
    m = fit(snap)
    calls = 15
    a = answer(m, Changes(latency_add_s=-0.002, latency_kind="all_gather"))
    assert step - a["predicted"]["step_s"] == pytest.approx(10 * 0.002, rel=1e-6)
    a = answer(m, Changes(latency_set_s=0.0))
    assert step - a["predicted"]["step_s"] == pytest.approx(calls * LAT, rel=1e-6)
    wire = sum(3 * p * 4 / 2 for p in (100_000, 250_000, 500_000, 1_000_000, 2_000_000))
    a = answer(m, Changes(bandwidth_scale=2.0))
    assert step - a["predicted"]["step_s"] == pytest.approx(wire / BW / 2, rel=1e-6)
    a = answer(m, Changes(bandwidth_set=BW / 4))
    assert a["predicted"]["step_s"] - step == pytest.approx(3 * wire / BW, rel=1e-6)


def test_world_size_changes_the_wire_bytes_and_the_planner_memory():
    snap, step = synthetic()
    a = answer(fit(snap), Changes(world_size=8))
    wire = sum(3 * p * 4 for p in (100_000, 250_000, 500_000, 1_000_000, 2_000_000))
    # ring all-gather / reduce-scatter: (n-1)/n of the bytes: 1/2 -> 7/8 (optimizer / 4)
    more = wire * (7 / 8 - 1 / 2) / BW
    assert a["predicted"]["step_s"] == pytest.approx(step + more - 0.05 * 3 / 4, rel=1e-9)
    ctx = Context(snap)
    p8 = plan(ctx.plan_input(world_size=8, prefetch_depth=0))
    assert a["predicted"]["peak_bytes"] == p8.stage("zero3").total_bytes
    assert a["predicted"]["peak_bytes"] < a["baseline"]["peak_bytes"]
    # the traffic: the planner's formulas (ZeRO-3: 3 Psi nominal, (N-1)/N of it on the wire)
    z3 = p8.stage("zero3")
    assert a["predicted"]["comm_bytes"] == z3.comm_bytes_per_step
    assert a["predicted"]["comm_wire_bytes"] == pytest.approx(z3.comm_wire_bytes_per_step,
                                                              abs=1)
    b = answer(fit(snap), Changes(world_size=8, reshard_after_forward=False))
    p8b = plan(ctx.plan_input(world_size=8, reshard_after_forward=False)).stage("zero3")
    assert b["predicted"]["comm_bytes"] == p8b.comm_bytes_per_step  # 2 Psi


def test_micro_batch_scales_compute():
    snap, step = synthetic()
    a = answer(fit(snap), Changes(micro_batch_scale=2.0))
    assert a["predicted"]["step_s"] - step == pytest.approx(5 * 0.03, rel=1e-9)


def test_prefetch_hides_all_gathers_behind_the_previous_unit():
    """Asynchronous unshard with prefetch 1 on units of equal size: in forward each unit's
    all-gather (4 + 2 = 6 ms... here 4 ms + 0.4 MB / 200 MB/s = 5 ms) runs during the
    previous unit's 10 ms compute, so only the first one (the root's) waits; in backward the
    same with the reduce-scatters queued in between (synchronous on gloo)."""
    units = tuple((f"l{i}", 200_000) for i in range(4))
    units = (("(root)", 200_000),) + units
    snap, step = synthetic(units)
    a = answer(fit(snap), Changes(prefetch=1))
    c = call_s(800_000)
    assert c == pytest.approx(0.006)
    # forward: root waits for its own gather (c); l0..l3 were issued one unit earlier and
    # ran during 10 ms of compute: hidden. Backward (l3, l2, l1, l0, root): l3's gather is
    # not prefetched (c); each later one was issued at the previous unit's start, queued on
    # the channel behind nothing, done before its compute ends -> hidden; every
    # reduce-scatter is synchronous (c each, 5 of them).
    want_exposed = c + c + 5 * c
    assert a["predicted"]["exposed_comm_s"] == pytest.approx(want_exposed, rel=1e-9)
    assert a["predicted"]["step_s"] == pytest.approx(
        step - 15 * c + want_exposed, rel=1e-9)


def test_prefetch_on_a_cpu_backend_the_step_range_holds_the_contention():
    """On gloo / CPU the collectives are CPU work on the compute's cores: the 8 all-gathers
    the prefetch hides (4 in forward, 4 in backward, 6 ms each: worked out by hand above)
    can slow the compute by as much. A B whose compute took every hidden ms (full
    contention) and one whose compute took none both fall in the step range; the point
    keeps the measured compute. On a GPU (its own engines for the collectives) no such
    term."""
    units = (("(root)", 200_000),) + tuple((f"l{i}", 200_000) for i in range(4))
    snap, step = synthetic(units)
    a = answer(fit(snap), Changes(prefetch=1))
    c = call_s(800_000)
    p = a["predicted"]
    assert a["contention_s"] == pytest.approx(8 * c, rel=1e-9)
    lo, hi = p["step_s_range"]
    assert lo <= p["step_s"] < p["step_s"] + 8 * c <= hi
    assert hi == pytest.approx(p["step_s"] + 8 * c, rel=1e-9)  # noise-free: nothing else
    assert "the step's high end holds 48.0 ms" in render_text(a)

    def on_gpu(d):
        d["run"]["device_type"] = "cuda"
    gpu = answer(fit(synthetic(units, extra=on_gpu)[0]), Changes(prefetch=1))
    assert gpu["contention_s"] == 0.0
    assert gpu["predicted"]["step_s_range"][1] == pytest.approx(gpu["predicted"]["step_s"])
    # a change that hides nothing more (the replay) adds none
    assert answer(fit(snap), Changes())["contention_s"] == 0.0
    # an NCCL run whose parameters are offloaded to the CPU reads device "cpu": its
    # collectives still run on the GPU's engines (review rev7)

    def offloaded(d):
        d["run"]["backend"] = "nccl"
    off = answer(fit(synthetic(units, extra=offloaded)[0]), Changes(prefetch=1))
    assert off["contention_s"] == 0.0


def _async_run(noise: float = 0.001):
    """A gloo run with asynchronous unshard, prefetch 1 (4 forward and 4 backward
    all-gathers hidden behind the previous unit's compute, as the hand-worked prefetch case
    above), its link times +/- `noise` on alternate calls."""
    units = (("(root)", 200_000),) + tuple((f"l{i}", 200_000) for i in range(4))

    def prefetched(d):
        r = d["ranks"][0]
        gathers = [row for row in r["comm"] if row[2] == "all_gather"]
        hidden = 0.0
        for k, row in enumerate(gathers):
            row[5] += noise if k % 2 else -noise
            row[6] = row[5]
        for row in gathers:
            if row[0] != "(root)" and not (row[1] == "backward" and row[0] == "l3"):
                row[6], row[7] = 0.0, row[5]  # prefetched: hidden
                hidden += row[5]
        r["step"] -= hidden
        d["run"]["config"] = {"prefetch": {"unshard_async": True, "forward": 1}}
    return synthetic(units, extra=prefetched)[0]


def test_contention_is_measured_against_the_replay_priced_alike():
    """On an asynchronous run with a noisy link the replay's high end hides more than its
    point: a replay (or the same prefetch again) adds no contention (rev7: the high end less
    the point gave 4.9 ms here); going back to synchronous unshard un-hides the 8 gathers,
    and the step's low end holds the compute they no longer slow."""
    snap = _async_run()
    m = fit(snap)
    assert not m.semantics.sync_unshard and m.semantics.prefetch == 1
    for ch in (Changes(), Changes(prefetch=1)):
        a = answer(m, ch, memory=False)
        assert a["contention_s"] == 0.0 and a["contention_removed_s"] == 0.0
    sync = answer(m, Changes(prefetch=0), memory=False)
    from zerodoc.whatif.stepmodel import hidden_s
    assert sync["contention_s"] == 0.0
    lo_base = hidden_s(m.replay(bound=-2.0))
    assert lo_base > 0 and sync["contention_removed_s"] == pytest.approx(lo_base, rel=1e-9)
    assert "gives the compute its cores back: the step's low end" in render_text(sync)


def _on_gpu(d):
    d["run"]["device_type"] = "cuda"
    d["run"]["backend"] = "nccl"


def test_async_reductions_resharding_off_stay_hidden():
    """FSDP2 on NCCL with resharding off (ZeRO-2-like): each unit's reduce-scatter runs
    during the next unit's backward (hidden); only the last one (the root's) is waited for
    at the end of backward. The backward units have nothing to gather, so they must not wait
    for the channel the reductions use (review rev7: the replay serialised them, 24 ms
    long here, and booked none of it as exposed)."""
    units = (("(root)", 200_000),) + tuple((f"l{i}", 200_000) for i in range(4))
    c = call_s(800_000)

    def zero2(d):
        _on_gpu(d)
        rs = [row for row in d["ranks"][0]["comm"] if row[2] == "reduce_scatter"]
        for row in rs[1:]:  # every unit's but the root's (the last): hidden
            row[6], row[7] = 0.0, row[6]
        d["ranks"][0]["step"] -= 4 * c
    snap, step = synthetic(units, reshard=False, extra=zero2)
    m = fit(snap)
    assert not m.semantics.sync_reduce
    a = answer(m, Changes(), memory=False)
    assert a["baseline"]["step_s"] == pytest.approx(step - 4 * c, rel=1e-9)  # as measured
    assert a["baseline"]["exposed_comm_s"] == pytest.approx(5 * c + c, rel=1e-9)
    from zerodoc.whatif.stepmodel import hidden_s
    assert hidden_s(m.replay()) == pytest.approx(4 * c, rel=1e-9)


def test_a_gather_queued_behind_an_async_reduction_is_exposed():
    """FSDP2 on NCCL, resharding on, synchronous unshard, one channel: each backward
    all-gather after the first waits for the previous unit's reduce-scatter (6 ms), then
    runs (6 ms): the compute waits 12 ms for it, which the run measures as that
    all-gather's exposed time. Worked out by hand: forward 5 x 6 ms, backward 6 + 4 x 12 ms,
    the root's reduction at the end 6 ms: 90 ms exposed, the step 150 ms of compute + 90 +
    50 ms optimizer + 15 ms framework (rev7: the replay booked 66 ms)."""
    units = (("(root)", 200_000),) + tuple((f"l{i}", 200_000) for i in range(4))
    c = call_s(800_000)
    snap, step = synthetic(units, extra=_on_gpu)
    m = fit(snap)
    m.semantics = replace(m.semantics, sync_reduce=False)  # the reductions asynchronous
    r = m.replay()
    assert r.exposed_s == pytest.approx(5 * c + c + 4 * 2 * c + c, rel=1e-9)
    assert r.step_s == pytest.approx(0.150 + 15 * c + 0.050 + 0.015, rel=1e-9)
    assert r.step_s == pytest.approx(step, rel=1e-9)  # every call waited for, as measured


# --- the command ------------------------------------------------------------------------


@pytest.mark.parametrize("args,msg", [
    ("--latency foo", "not a time"),
    ("--latency nope=2ms", "unknown collective"),
    ("--latency all_gather=3ms..2ms", "low end is above"),
    ("--latency all_gather=0..2ms", "not a time"),
    ("--merge 1", "--merge"),
    ("--prefetch 3", "--prefetch"),
    ("--bandwidth x0", "number > 0"),
    ("--bandwidth 5G", "size"),
    ("--micro-batch-scale nan", "--micro-batch-scale"),
    ("--world-size 0", "--world-size"),
    ("--window -2", "--window"),
])
def test_bad_arguments_one_line_exit_2(args, msg, capsys):
    from pathlib import Path

    run = str(Path(__file__).parent / "data" / "scenarios" / "slow-link-50ms")
    assert cli.main(["whatif", run, *args.split()]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and msg in err[0], err


# --- the rules predict from the same model ----------------------------------------------


def test_rules_time_predictions_are_the_models_answer_with_a_range(monkeypatch):
    """ZD005 on a recorded slow-link run: its exposed-comm and step effects are the model's
    change (prediction - replay) applied to the value compare reads, with the model's range,
    and its text quotes the model; without per-unit detail the rule keeps its own arithmetic
    (no range)."""
    from pathlib import Path

    from zerodoc.diagnosis import diagnose
    from zerodoc.runlog import load_run

    snap = load_run(Path(__file__).parent / "data" / "scenarios" / "slow-link-50ms",
                    window=None, stale_after_s=float("inf"))
    f = next(f for f in diagnose(snap) if f.code == "ZD005")
    # its all-gathers' slope is hidden by the noise (a fit, priced as fitted: no bandwidth set)
    assert fit(snap).links[("all_gather", 2)].bandwidth is None
    ans = answer(fit(snap), Changes(latency_set_s=0.002, latency_set_low_s=0.0,
                                    latency_kind="all_gather"))
    by = {e.metric: e for e in f.effects}
    for metric, key in (("exposed_comm_seconds_per_step", "exposed_comm_s"),
                        ("step_seconds", "step_s")):
        e = by[metric]
        base, pred = ans["baseline"][key], ans["predicted"][key]
        lo, hi = ans["predicted"][f"{key}_range"]
        assert e.value == pytest.approx(e.now + pred - base, rel=1e-5)
        # (an exposed time below 0 is 0: the range's low end reaches it here, the check
        # run's noise taken in)
        assert (e.lo, e.hi) == (pytest.approx(max(0.0, e.now + lo - base), rel=1e-5),
                                pytest.approx(e.now + hi - base, rel=1e-5))
        assert e.lo < e.value < e.hi < e.now
    assert f.effects[0].metric == "exposed_comm_seconds_per_step"
    assert "what-if (latency set to 2 ms, range from 0 ms (all_gather)):" in f.predicted
    assert "each from the model's replay of the run (its step within" in f.predicted

    import zerodoc.whatif

    def no_model(snapshot):
        raise zerodoc.whatif.stepmodel.UserError("no rank with per-unit detail")

    monkeypatch.setattr(zerodoc.whatif, "fit", no_model)  # a run the model cannot take
    f = next(f for f in diagnose(snap) if f.code == "ZD005")
    assert all(e.lo is None for e in f.effects) and "what-if" not in f.predicted
    assert f.effects[0].metric == "exposed_comm_seconds_per_step" and f.effects[0].value


def _slow_link_run(delay: float, noise=(0.0,) * 10, lat: float = 0.0005, bw: float = 330e6):
    """The demo's shape (a 2.1 MB root, four 3.16 MB blocks; ZeRO-3 on gloo: every
    collective synchronous, exposed) on a healthy link of `lat` per call + `bw` bus
    bandwidth (330 MB/s: what the demo's all-gathers fit on an idle host), each all-gather
    `delay` later (the demo's --slow-link-ms) plus `noise[i]` (the i-th all-gather, forward
    then backward per unit). Returns the snapshot: ground truth beneath what the rule and
    the model read."""
    units = [("(root)", 524_800)] + [(f"blocks.{i}", 789_760) for i in range(4)]

    def extra(d):
        rank = d["ranks"][0]
        i = 0
        for row in rank["comm"]:
            t = lat + row[4] / 2 / bw
            if row[2] == "all_gather":
                t += delay + noise[i]
                i += 1
            row[5] = row[6] = t
        rank["framework"] = 0.0
        rank["step"] = (sum(r[2] for r in rank["compute"]) + sum(r[5] for r in rank["comm"])
                        + rank["optimizer"])

    snap, _ = synthetic(tuple(units), extra=extra)
    return snap


def test_zd005_prediction_is_the_models_answer_for_its_fix_a_hidden_slope_included():
    """Issue 22 (the lead's idle run 3): the demo's slow link (+30 ms per all-gather) with
    per-call noise of the size the real runs show (1.4-3.4 ms residual) that hides the
    all-gathers' slope (fitted negative: kept at 0 with its standard error). ZD005 priced
    such a fit at the link class's 120 MB/s, 2.7x slower than the healthy link, and its
    prediction missed the healthy run (ground truth here) while `zerodoc whatif` with the
    delay removed did not; now the rule's change is the delay removed at the per-byte cost
    the run fitted, its effects are the model's answer for that change, its text names
    it, and the healthy run's exposed communication and step are inside its ranges."""
    from zerodoc.diagnosis import diagnose
    from zerodoc.diagnosis.observables import observe

    noise = (0.004, 0.003, -0.002, 0.0015, -0.001, 0.0025, -0.003, 0.0, 0.001, -0.002)
    slow, healthy = _slow_link_run(0.030, noise), _slow_link_run(0.0)
    ag = fit(slow).links[("all_gather", 2)]
    assert ag.bandwidth is None and ag.se_seconds_per_wire_byte > 0  # the slope hidden
    assert fit(healthy).links[("all_gather", 2)].bandwidth == pytest.approx(330e6, rel=1e-6)

    f = next(f for f in diagnose(slow) if f.code == "ZD005")
    by = {e.metric: e for e in f.effects}
    ctx_b = Context(healthy)
    for metric in ("exposed_comm_seconds_per_step", "step_seconds"):
        e = by[metric]
        truth = observe(ctx_b, metric)  # the healthy run: what the fix gives
        assert e.lo <= truth <= e.hi, (metric, e, truth)
    change = Changes(latency_set_s=0.002, latency_set_low_s=0.0, latency_kind="all_gather")
    assert "what-if (latency set to 2 ms, range from 0 ms (all_gather)):" in f.predicted, \
        f.predicted
    assert "fixed delay per call removed (latency set to the link class's healthy 2 ms per " \
        "call; the range down to latency 0) and the per-byte cost the run fitted" \
        in f.predicted and "bandwidth set" not in f.predicted
    ans = answer(fit(slow), change, memory=False)
    assert f.extra["whatif"].endswith(zerodoc_summary(ans))
    for metric, key in (("exposed_comm_seconds_per_step", "exposed_comm_s"),
                        ("step_seconds", "step_s")):
        e = by[metric]
        assert e.value == pytest.approx(e.now + ans["predicted"][key] - ans["baseline"][key],
                                        rel=1e-5)
    # the change `zerodoc whatif` is told (the delay removed) lands inside the same range
    told = answer(fit(slow), Changes(latency_add_s=-0.030, latency_kind="all_gather"))
    e = by["exposed_comm_seconds_per_step"]
    assert e.lo <= e.now + told["predicted"]["exposed_comm_s"] - \
        told["baseline"]["exposed_comm_s"] <= e.hi


def test_zd005_keeps_a_healthy_links_per_call_latency():
    """Issue 22 (12:04 UTC): a healthy gloo all-gather still costs ~2 ms per call (gloo plus
    FSDP's per-call work); the run's fit puts it into the latency with the injected delay, and
    the fix priced as "latency 0" removed both: the prediction fell below the healthy run
    (ground truth here: 2 ms + 1 GB/s per call, the quiet host's fits 0.84-1.35 GB/s, +30 ms
    per all-gather with the noise of an idle host) by more than the bench's exposed bound
    (max(25 %, 5 ms)) and outside its own range. With the latency set to gloo-cpu's healthy
    2 ms per call (`LINK_LATENCY_S`), the range down to latency 0, the point is within the
    bound and the truth inside the range;
    `zerodoc whatif --latency all_gather=0ms..2ms` gives the same numbers."""
    from zerodoc.diagnosis import diagnose
    from zerodoc.diagnosis.observables import observe
    from zerodoc.thresholds import LINK_LATENCY_S

    healthy_lat = LINK_LATENCY_S["gloo-cpu"]
    assert healthy_lat == pytest.approx(0.002)
    noise = (0.0006, -0.0004, 0.0003, -0.0005, 0.0004, -0.0002, 0.0005, -0.0003, 0.0001, -0.0004)
    slow = _slow_link_run(0.030, noise, lat=healthy_lat, bw=1e9)
    healthy = _slow_link_run(0.0, lat=healthy_lat, bw=1e9)
    ag = fit(slow).links[("all_gather", 2)]
    assert ag.latency_s > 0.030  # the healthy per-call cost sits in the fitted latency
    ctx_b = Context(healthy)
    truth = observe(ctx_b, "exposed_comm_seconds_per_step")
    bound = max(0.25 * truth, 0.005)

    def predicted(change):
        ans = answer(fit(slow), change, memory=False)
        base = ans["baseline"]["exposed_comm_s"]
        now = observe(Context(slow), "exposed_comm_seconds_per_step")
        return [now + x - base for x in (ans["predicted"]["exposed_comm_s"],
                                         *ans["predicted"]["exposed_comm_s_range"])]

    old, _old_lo, old_hi = predicted(Changes(latency_set_s=0.0, latency_kind="all_gather"))
    assert old < truth - bound and old_hi < truth, (old, old_hi, truth, bound)

    f = next(f for f in diagnose(slow) if f.code == "ZD005")
    e = next(e for e in f.effects if e.metric == "exposed_comm_seconds_per_step")
    assert abs(e.value - truth) <= bound and e.lo <= truth <= e.hi, (e, truth, bound)
    assert e.lo <= old + 1e-9  # the range reaches down to latency 0
    step = next(e for e in f.effects if e.metric == "step_seconds")
    assert step.lo <= observe(ctx_b, "step_seconds") <= step.hi
    assert "latency set to the link class's healthy 2 ms per call; the range down to " \
        "latency 0" in f.predicted, f.predicted
    assert "what-if (latency set to 2 ms, range from 0 ms (all_gather)" in f.predicted
    # one source of predictions: the CLI's change is the rule's
    told = predicted(Changes(latency_set_s=0.002, latency_set_low_s=0.0,
                             latency_kind="all_gather"))
    assert told == [pytest.approx(x, rel=1e-5) for x in (e.value, e.lo, e.hi)]


def test_whatif_latency_set_with_a_low_end_is_zd005s_change(capsys):
    """`zerodoc whatif --latency all_gather=0ms..2ms`: the change ZD005 prices its fix with
    (the latency set to 2 ms, the range's low end at 0): the same answer as the model's."""
    from pathlib import Path

    run = str(Path(__file__).parent / "data" / "scenarios" / "slow-link-50ms")

    def cli_answer(latency):
        assert cli.main(["whatif", run, "--latency", latency, "--json"]) == 0
        return json.loads(capsys.readouterr().out)

    got, zero, two = (cli_answer(f"all_gather={v}") for v in ("0ms..2ms", "0ms", "2ms"))
    assert got["changes"] == ["latency set to 2 ms, range from 0 ms (all_gather)"]
    for key in ("step_s", "exposed_comm_s"):
        assert got["predicted"][key] == pytest.approx(two["predicted"][key], rel=1e-9)
        assert got["predicted"][key] > zero["predicted"][key]
        # the low end is latency 0's, the high end the set latency's
        assert got["predicted"][f"{key}_range"] == [
            pytest.approx(zero["predicted"][f"{key}_range"][0], rel=1e-9),
            pytest.approx(two["predicted"][f"{key}_range"][1], rel=1e-9)]


def test_zd005_prices_the_fixed_link_at_the_class_figure_where_the_fit_shows_a_slower_path():
    """A path slow per byte (a visible slope below the link class's bandwidth) or one the run
    cannot resolve (every call one size: no slope, no error) is priced at the class figure:
    the rule's text says so and its change sets the bandwidth."""
    from zerodoc.diagnosis import diagnose
    from zerodoc.diagnosis.rules.zd005_slow_link import _class_priced

    snap = _slow_link_run(0.030)
    ag = fit(snap).links[("all_gather", 2)]
    assert ag.bandwidth == pytest.approx(330e6, rel=1e-6)
    assert not _class_priced(ag, 120e6) and _class_priced(ag, 400e6)
    flat = replace(ag, seconds_per_wire_byte=0.0, se_seconds_per_wire_byte=0.0)
    hidden = replace(ag, seconds_per_wire_byte=0.0, se_seconds_per_wire_byte=1e-9)
    assert _class_priced(flat, 120e6) and not _class_priced(hidden, 120e6)
    f = next(f for f in diagnose(snap, link="nvlink") if f.code == "ZD005")
    assert "bus bandwidth at the link class's 150 GB/s" in f.predicted, f.predicted
    assert "latency set to the link class's healthy 15 us per call" in f.predicted
    assert "what-if (latency set to 0.015 ms, range from 0 ms, bandwidth set to 150 GB/s)" \
        in f.predicted
    f = next(f for f in diagnose(snap) if f.code == "ZD005")  # gloo-cpu: 120 MB/s < 330
    assert "the bus bandwidth the run fitted (330 MB/s)" in f.predicted, f.predicted
    assert "what-if (latency set to 2 ms, range from 0 ms (all_gather)):" in f.predicted
    # a fitted latency below the class's healthy one is kept (a fix does not slow a call)
    from zerodoc.diagnosis.rules.zd005_slow_link import _modelled
    assert "latency kept at the fitted 1 ms per call (below the link class's healthy 2 ms)" \
        in _modelled(["all_gather"], None, [ag], 0.001, 0.002, "what-if")


def test_bench_states_the_load_per_case():
    """bench/whatif.py flags a pair whose 1-minute load average passed 1 per core (the runs
    queued for the CPU: the comparison measures the host) and gives the compute's drift."""
    from bench.whatif import table, with_load

    r = {"case": "slowlink", "what": "w", "a": {"step_s": 0.52, "exposed_comm_s": 0.35},
         "baseline": {"step_s": 0.52, "exposed_comm_s": 0.35},
         "predicted": {"step_s": 0.22, "exposed_comm_s": 0.05, "step_s_range": [0.2, 0.24]},
         "b": {"step_s": 0.21, "exposed_comm_s": 0.05}, "step_error": 0.04, "step_bound": 0.15,
         "step_ok": True, "exposed_error_s": -0.004, "exposed_bound_s": 0.0125,
         "exposed_ok": True, "in_range": True, "compute_a_s": 0.1365, "compute_b_s": 0.1301,
         "same_compute": True}
    idle = with_load(r, [0.3, 1.6, 2.0], cores=2)
    assert not idle["loaded"] and idle["load_per_core_max"] == pytest.approx(1.0)
    assert idle["compute_drift"] == pytest.approx(0.1301 / 0.1365 - 1)
    assert "LOADED" not in table(idle) and "(drift A -> B -4.7 %)" in table(idle)
    busy = with_load(r, [1.0, 2.1, 1.5], cores=2)
    assert busy["loaded"] and "LOADED HOST: load average up to 1.05 per core" in table(busy)
    assert json.loads(json.dumps(busy))["loaded"] is True
    # the other processes' share of the cores, from /proc/stat less the runs' own CPU time:
    # (wall, busy CPU s, children's CPU s) samples 10 s apart on 2 cores
    from bench.whatif import others_share

    assert others_share((0.0, 100.0, 5.0), (10.0, 112.0, 15.0), cores=2) == pytest.approx(0.1)
    assert others_share((0.0, 100.0, 5.0), (10.0, 110.0, 15.0), cores=2) == 0.0
    assert others_share(None, (10.0, 110.0, 15.0)) is None
    shown = table(with_load(r, [0.3, 1.6, 2.0], cores=2, others=0.42))
    assert "other processes used 42 % of the cores during the pair" in shown


def test_bench_refit_judges_kept_pairs_against_their_ranges(tmp_path, capsys):
    """`bench/whatif.py --refit` fits kept pairs again (here the recorded per-linear run as
    a merge case's A, the recorded block-wrapped one as its B) and reports B's measured
    exposed time (read here through the source, not the bench) against the range."""
    from pathlib import Path

    from bench.whatif import main as bench
    from zerodoc.sources import open_source

    rec = Path(__file__).parent / "data" / "scenarios"
    (tmp_path / "0-merge-a").symlink_to(rec / "wrap-linear")
    (tmp_path / "0-merge-b").symlink_to(rec / "healthy-block")
    (tmp_path / "1-nothing-a").mkdir()  # not a case: left alone
    args = ["--refit", str(tmp_path), "--steps", "10", "--warmup", "1"]
    assert bench(args + ["--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert bench(args) == 0
    out = capsys.readouterr().out
    b = open_source(str(rec / "healthy-block"), window=9).snapshot()
    exposed = max(w.exposed_seconds / w.steps for w in b.ranks.values())
    lo, hi = row["predicted"]["exposed_comm_s_range"]
    held = lo <= exposed <= hi
    assert row["b"]["exposed_comm_s"] == pytest.approx(exposed, rel=1e-9)
    line = next(ln for ln in out.splitlines() if "0-merge" in ln)
    assert f"exposed B {exposed * 1e3:6.1f} ms" in line and "ZD002" in line
    assert (" in   bound" if held else " OUT  bound") in line
    matched = row["same_compute"]
    assert f"all pairs: 1 pairs; B's exposed time in the range {int(held)}, " in out
    assert ("compute within 15 %: 1 pairs" in out) == matched
    assert bench(["--refit", str(tmp_path / "1-nothing-a")]) == 2
    assert "no kept pairs" in capsys.readouterr().err
    assert bench(["--refit", str(tmp_path / "absent")]) == 2


# --- against real runs: 2 gloo ranks of the demo, A measured, B predicted, B measured -----
# bench/whatif.py runs the same cases and prints them as a table (docs/whatif.md). The model
# predicts B at A's load; on this shared machine the load moves between runs. A pair that
# misses is run again exactly once and the second pair's result stands (no third, the bounds
# never loosened); each pair states the other processes' share of the cores during it
# (bench/whatif.py `timed_pair`: /proc/stat less the runs' own CPU time). Never chosen on the
# pair's own compute: its move from A to B is partly the change's own effect (the slow link's
# timer thread, docs/whatif.md). A systematic miss fails: both pairs miss. Why once whatever
# the load (measured, 2026-11-29): two full-suite runs on a clean clone each had one pair of
# the five miss with the others' share at 1.2 % and 0.9 % (ZD003's step 20 % under its
# range's low end; the slow link's step +18.4 % against 15 %) while the same tests alone held
# 5 of 5: a miss the load criterion (re-run only above OTHERS_MAX, 5 %) could not see; a
# random miss of probability p now fails with p^2.


@pytest.fixture(scope="module")
def real_runs(tmp_path_factory):
    from bench.whatif import demo_run

    tmp = tmp_path_factory.mktemp("whatif-runs")
    made = {"n": 0}

    def run(flags: tuple[str, ...], _side: str = ""):
        made["n"] += 1
        return demo_run(tmp / f"run{made['n']}", flags, steps=12)  # the last 9 read

    return run


_PAIRS: dict = {}  # (case, attempt) -> (A, B, other processes' share of the cores)


def _pair(real_runs, case, a_flags, b_flags, attempt):
    """A case's A and B, run back to back (a B measured minutes after its A compares two
    loads of this shared host, not two configurations), with the others' load during them."""
    from bench.whatif import timed_pair

    if (case, attempt) not in _PAIRS:
        _PAIRS[(case, attempt)] = timed_pair(real_runs, a_flags, b_flags)
    return _PAIRS[(case, attempt)]


def _judged(real_runs, case, a_flags, b_flags, judge):
    """`judge(A, B)` -> (held, result) on a fresh pair; a pair that missed is replaced once,
    and the second pair's result stands (the comment above). Returns (result, A, B, {pair: 1
    or 2, others_cpu_share: per pair})."""
    shares = []
    for attempt in (0, 1):
        a, b, others = _pair(real_runs, case, a_flags, b_flags, attempt)
        shares.append(others)
        held, result = judge(a, b)
        if held:
            break
    return result, a, b, {"pair": attempt + 1, "others_cpu_share": shares}


def _case(real_runs, name: str):
    """Evaluate a case of bench/whatif.py on a real pair (`_judged`: once more on a fresh
    pair where it missed under other processes' load)."""
    from bench.whatif import BY_NAME, evaluate

    c = BY_NAME[name]

    def judge(a, b):
        r = evaluate(c, a, b)
        return r["step_ok"] and r["exposed_ok"], r

    r, a, b, load = _judged(real_runs, name, c.a, c.b, judge)
    return {**r, **load}, a, b


def test_a_missed_pair_is_run_again_once_and_the_second_stands(monkeypatch):
    """The re-run rule on a scripted host: /proc/stat samples (wall s, busy CPU s, the runs'
    own CPU s) before A, between, after B, 10 s per run, and a judge that reports each
    pair's result. A miss gets exactly one more pair, whose result stands, quiet or loaded
    (no third pair: a second miss fails); the others' share is stated per pair (the larger
    of A's and B's); a pair that held is not run again."""
    import os

    import bench.whatif as bench

    cores = os.cpu_count() or 1

    def host(*pairs):  # per pair (others' share during A, during B); 10 s per run
        t, busy, own, out = 0.0, 0.0, 0.0, []
        for shares in pairs:
            out.append((t, busy, own))
            for share in shares:  # the runs' own 1.5 s of CPU, and the others'
                t, own, busy = t + 10, own + 1.5, busy + 1.5 + share * 10 * cores
                out.append((t, busy, own))
            t += 5  # the judging between pairs
        return iter(out)

    def scripted(case, samples, results):
        calls = []
        monkeypatch.setattr(bench, "cpu_sample", lambda: next(samples, None) or pytest.fail(
            f"{case}: a run beyond the pairs the rule allows"))

        def run(flags, side):
            calls.append(side)
            return f"{case}-{len(calls)}"

        def judge(a, b):
            r = next(results)
            return r["held"], r

        try:
            return _judged(run, case, ("--a",), ("--b",), judge), calls
        finally:
            for k in [k for k in _PAIRS if k[0] == case]:
                del _PAIRS[k]

    missed = [{"held": False, "n": 1}, {"held": False, "n": 2}, {"held": True, "n": 3}]
    (r, a, b, load), calls = scripted("quiet", host((0.0, 0.0), (0.0, 0.0)), iter(missed))
    assert calls == ["a", "b", "a", "b"] and r["n"] == 2 and (a, b) == ("quiet-3", "quiet-4")
    assert load == {"pair": 2, "others_cpu_share": [0.0, 0.0]}  # the second miss stands
    missed = [{"held": False, "n": 1}, {"held": True, "n": 2}]
    (r, a, b, load), calls = scripted("loaded", host((0.0, 0.3), (0.4, 0.1)), iter(missed))
    assert calls == ["a", "b", "a", "b"] and r["n"] == 2 and (a, b) == ("loaded-3", "loaded-4")
    assert load["pair"] == 2 and load["others_cpu_share"] == pytest.approx([0.3, 0.4])
    (r, _, _, load), calls = scripted("held", host((0.5, 0.5)), iter([{"held": True}]))
    assert calls == ["a", "b"] and load["pair"] == 1


def _brief(r: dict) -> str:
    return (f"{r['case']}: step error {r['step_error']:+.1%} (bound {r['step_bound']:.0%}), "
            f"exposed error {r['exposed_error_s'] * 1e3:+.1f} ms (bound "
            f"{r['exposed_bound_s'] * 1e3:.1f} ms), A {r['a']}, predicted "
            f"{r['predicted']['step_s']:.4f} / {r['predicted']['exposed_comm_s']:.4f}, "
            f"B {r['b']}, compute A {r['compute_a_s']:.4f} B {r['compute_b_s']:.4f}, "
            f"pair {r.get('pair', 1)}, other processes' share of the cores per pair "
            f"{r.get('others_cpu_share')}")


def _compare(a, b) -> dict:
    out = subprocess.run([sys.executable, "-m", "zerodoc", "compare", str(a), str(b),
                          "--json", "--no-history", "--window", "9"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _timed(fix: dict) -> dict:
    """The model's effects of a judged fix: exposed comm and step, each with its range, and
    compare's verdict as the range allows (issue 31: a verdict that can fail): inside a
    range that excludes the value before, confirmed; inside one that holds it, confirmed
    only beyond the runs' noise the predicted way, else inconclusive (it cannot tell a win
    from no change); outside, missed, or inconclusive within the noise."""
    by = {e["metric"]: e for e in fix["effects"]}
    for metric in ("exposed_comm_seconds_per_step", "step_seconds"):
        e = by[metric]
        assert e["lo"] is not None and e["lo"] < e["value"] < e["hi"], e
        inside = e["lo"] <= e["observed_after"] <= e["hi"]
        holds_before = e["lo"] <= e["observed_before"] <= e["hi"]
        allowed = ({"confirmed"} if inside and not holds_before else
                   {"confirmed", "inconclusive"} if inside else {"missed", "inconclusive"})
        assert e["verdict"] in allowed, e
        if e["verdict"] == "inconclusive":
            assert e["reason"], e
    return by


@pytest.mark.slow
def test_real_run_replay_of_a_within_5_percent(real_runs):
    r, a, _ = _case(real_runs, "replay")
    assert abs(r["step_error"]) <= 0.05 and r["exposed_ok"], _brief(r)
    # the shim recorded each unit's parameter tensors: a block's own, the rest in the root
    from zerodoc.demo.transformer import DemoConfig, TinyTransformer
    from zerodoc.sources import open_source

    model = TinyTransformer(DemoConfig())
    per_block = [len(list(b.parameters())) for b in model.blocks]
    units = {u.name: u.tensors for u in open_source(str(a)).snapshot().any_rank.facts.units}
    assert [units[f"blocks.{i}"] for i in range(len(per_block))] == per_block
    assert sum(units.values()) == len(list(model.parameters())), units


@pytest.mark.slow
def test_real_run_slow_link_removed(real_runs):
    """A: the demo with +30 ms per all-gather (the slow link); B: without. From A alone,
    told the delay is gone, the model predicts B's step within 15 % and its exposed
    communication within max(25 %, 5 ms). (ZD005's own prediction prices the fixed link at
    the link class's healthy latency per call (at its class bandwidth where the fit shows a
    slower one), not at the delay removed: bench/whatif.py prints how compare judged
    it, docs/whatif.md the outcomes; whether ZD005 fires at all depends on the host's load.)"""
    r, _, _ = _case(real_runs, "slowlink")
    assert r["step_ok"] and r["exposed_ok"], _brief(r)


@pytest.mark.slow
def test_real_run_zd003_prediction_holds_and_compare_judges_it(real_runs):
    """ZD003 on the demo (ZeRO-3, block wrap): its fix, reshard after forward off, run for
    real; `zerodoc compare` finds the fix applied, B's step time and exposed communication
    lie inside the model's ranges, and compare's verdicts are what those ranges allow
    (`_timed`: "confirmed" only where the range excludes A's value or the change is beyond
    the noise; before issue 31 inside was always "confirmed"). A pair that misses under
    other processes' load is run again once, as above (`_judged`)."""
    timed = ("exposed_comm_seconds_per_step", "step_seconds")

    def judge(a, b):
        doc = _compare(a, b)
        f = next(x for x in doc["fixes"] if x["code"] == "ZD003")
        assert f["applied"], f
        by = _timed(f)
        return all(by[m]["lo"] <= by[m]["observed_after"] <= by[m]["hi"] for m in timed), by

    by, _, _, load = _judged(real_runs, "zd003", (), ("--no-reshard-after-forward",), judge)
    assert by["backward_all_gather_bytes_per_step"]["observed_after"] == 0
    for m in timed:
        assert by[m]["lo"] <= by[m]["observed_after"] <= by[m]["hi"], (load, by[m])


def test_unit_stats_carry_the_framework_time_per_unit():
    """Per unit and step across ranks; unknown (not 0) where the run did not record it."""
    from zerodoc.unitstats import unit_stats

    snap, _ = synthetic(extra=_fw_per_unit)
    st = unit_stats(snap, sorted(snap.ranks))
    want = 3 * (FW_CALL + FW_BYTE * 1_000_000 * 4)  # l2: 3 calls of 4 MB
    got = st.units["l2"]["framework_seconds"]
    assert got.n == 2 and got.mean == pytest.approx(want, rel=1e-9)
    old, _ = synthetic()
    assert unit_stats(old, sorted(old.ranks)).units["l2"]["framework_seconds"].n == 0


def test_framework_fit_pools_the_ranks_each_keeps_its_own_level():
    """Rank 1's framework is 1.2x rank 0's, with noise on its units: the per-call / per-byte
    ratio is fitted over both ranks' units, each rank's level is its own (its units' sum as
    measured: the replay stays exact), and the noise-free rank's parts stay near the truth."""
    import copy

    def two(d):
        _fw_per_unit(d)
        r0 = d["ranks"][0]
        r1 = copy.deepcopy(r0)
        noise = (0.0002, -0.0002, 0.0002, -0.0002, 0.0)
        for i, row in enumerate(r1["unit_framework"]):
            row[2] = row[2] * 1.2 + noise[i]
        fw1 = sum(row[2] for row in r1["unit_framework"])
        r1["step"] += fw1 - r1["framework"]
        r1["framework"] = fw1
        d["ranks"], d["copies"] = [r0, r1], 1
    snap, _ = synthetic(extra=two)
    m = fit(snap)
    f0, f1 = (rm.framework_fit for rm in m.ranks)
    assert f1.per_call_s / f0.per_call_s == pytest.approx(f1.per_byte_s / f0.per_byte_s)
    for rm in m.ranks:  # each rank's units sum to what they measured
        got = sum(rm.framework_fit.unit_seconds(u.calls(), sum(
            v[0] * v[1] for p in u.comm.values() for v in p.values())) for u in rm.units)
        assert got == pytest.approx(rm.framework_s, rel=1e-9)
    assert f0.per_call_s == pytest.approx(FW_CALL, rel=0.15)
    assert f0.per_byte_s == pytest.approx(FW_BYTE, rel=0.15)
    a = answer(m, Changes())
    assert a["baseline"]["step_s"] == pytest.approx(a["measured"]["step_s"], rel=1e-9)


def test_per_tensor_fit_standard_errors_match_the_scatter_of_noisy_fits():
    """`_wls2`'s standard errors against the scatter of its own fits over noisy draws with a
    known truth (per call 0.4 ms, 1.5 ms per MB, 20 us per tensor), weights of 3 calls per
    point as in a run (review of 2026-11-27: they came out 3x too small, the mean weight
    divided where it multiplies)."""
    import random
    import statistics

    from zerodoc.whatif.stepmodel import _wls2

    rng = random.Random(1)
    x1 = [0.1e6, 0.25e6, 0.5e6, 1e6, 2e6, 0.4e6, 0.8e6, 1.5e6]
    x2 = [19, 2, 2, 4, 2, 3, 6, 2]
    ws = [3.0] * len(x1)
    bs, cs, se_b, se_c = [], [], [], []
    for _ in range(600):
        ys = [4e-4 + 1.5e-9 * a + 2e-5 * t + rng.gauss(0, 1e-4) for a, t in zip(x1, x2)]
        r = _wls2(x1, x2, ys, ws)
        bs.append(r[1])
        cs.append(r[2])
        se_b.append(r[5])
        se_c.append(r[6])
    assert statistics.mean(cs) == pytest.approx(2e-5, rel=0.1)
    for fits, ses in ((bs, se_b), (cs, se_c)):
        assert statistics.mean(ses) == pytest.approx(statistics.stdev(fits), rel=0.2)


def test_per_tensor_part_needs_four_units_per_rank():
    """Three parts through three units is an exact fit with nothing left to judge it by:
    per call + per byte then, saying why (review of 2026-11-27: it fitted a cost per tensor
    the truth did not have, with a standard error of 0)."""
    import random

    from zerodoc.whatif.stepmodel import UnitModel, fit_framework

    rng = random.Random(0)
    noise = {k: rng.gauss(0, 0.1) for k in "abc"}

    def rank():
        us, fw = [], {}
        for name, nbytes, t in (("a", 0.3e6, 19), ("b", 1e6, 2), ("c", 2e6, 4)):
            u = UnitModel(name, 0, tensors=t)
            u.comm = {"forward": {"all_gather": [3.0, nbytes, 0.0]}}
            us.append(u)
            fw[name] = 3 * (4e-4 + 1.5e-9 * nbytes) * (1 + noise[name])  # no part per tensor
        return us, fw, sum(fw.values())

    f = fit_framework([rank(), rank()])[0]
    assert f is not None and not f.per_tensor and f.per_tensor_s == 0.0
    assert "fewer than 4 units per rank" in f.tensor_note
    assert f.se_call_s > 0


@pytest.mark.parametrize("scenario", ["straggler-noisy-neighbour", "healthy-block",
                                      "wrap-linear", "wrap-root"])
def test_replay_of_recorded_runs_within_one_percent(scenario):
    """The replay's step against the recorded 2-rank runs' measured step. A straggler slow
    outside the units (framework, other) makes its peer wait in the collectives by that
    much: the replay's step has it once, from the rank with the most such time, and the
    arrival spread leaves it out (review of 2026-11-27: counted twice there, +2.5 %)."""
    from pathlib import Path

    from zerodoc.sources import open_source

    snap = open_source(str(Path(__file__).parent / "data" / "scenarios" / scenario)).snapshot()
    a = answer(fit(snap), Changes())
    assert a["baseline"]["step_s"] == pytest.approx(a["measured"]["step_s"], rel=0.01)


# --- the link beyond the run's sizes: a measured link profile -----------------------------

BEND = 1_000_000  # wire bytes where the injected link's cost per byte triples


def convex_s(nbytes: float, n: int = 2) -> float:
    """A link like gloo's on a CPU host: LAT + 1/BW per wire byte up to BEND, 3/BW past it."""
    x = nbytes * (n - 1) / n
    return LAT + x / BW + 2 * max(0.0, x - BEND) / BW


def _profile(time_of, sizes=(400_000, 1_200_000, 2_000_000, 4_000_000, 8_000_000)):
    """A profile document measured on a link `time_of(nbytes)`: no noise, the sizes the
    algorithm bytes per call (all-gather output; wire = half on 2 ranks)."""
    from zerodoc.whatif.linkprofile import profile_from_dict

    rows = [{"bytes": b, "median_s": time_of(b), "se_s": 0.0} for b in sizes]
    return profile_from_dict({"kind": "zerodoc-link-profile", "schema": 1, "backend": "gloo",
                              "group_size": 2, "host": "synthetic",
                              "collectives": {"all_gather": rows, "reduce_scatter": rows}})


CONVEX_A = (("(root)", 100_000), ("l0", 200_000), ("l1", 250_000), ("l2", 300_000),
            ("l3", 500_000))  # A: calls of 0.4-2 MB (wire 0.2-1 MB): all below the bend


def test_link_profile_recovers_a_convex_link_beyond_the_runs_sizes():
    """Merging (l0..l3) makes 5 MB calls, past the bend A's calls never reach: the fitted line
    (the old model) under-predicts B; with a profile of the link's shape (measured with 1 ms
    more latency than the run's calls see: its level is not the run's) the model recovers
    B's exposed time exactly (its step by as much), and the replay of A does not move."""
    snap, _ = synthetic(CONVEX_A, link=convex_s)
    # B measured on the same link (its compute and framework time do not matter here)
    b, _ = synthetic((("(root)", 100_000), ("l0..l3", 1_250_000)), link=convex_s)
    exposed_b = b.ranks[0].exposed_seconds / 10
    ch = Changes(merge=4)
    old = answer(fit(snap), ch)
    # the line misses by the convex part: 3 calls of 5 MB, 1.5 MB wire past the bend at 2/BW
    miss = 3 * 2 * (2_500_000 - BEND) / BW
    assert old["predicted"]["exposed_comm_s"] == pytest.approx(exposed_b - miss, rel=1e-6)
    assert old["link_model"]["model"] == "fitted line"
    beyond = {r["collective"]: r for r in old["link_model"]["beyond_run_sizes"]}
    assert beyond["all_gather"]["ratio"] == pytest.approx(2.5) and \
        beyond["all_gather"]["priced_by"] == "line"
    new = answer(fit(snap, _profile(lambda b: convex_s(b) + 0.001)), ch)
    assert new["predicted"]["exposed_comm_s"] == pytest.approx(exposed_b, rel=1e-6)
    # the step: the line's by the same miss (every call exposed)
    assert new["predicted"]["step_s"] - old["predicted"]["step_s"] == pytest.approx(miss)
    lo, hi = new["predicted"]["exposed_comm_s_range"]
    assert lo <= exposed_b <= hi
    assert new["baseline"] == old["baseline"]  # within A's sizes the profile moves nothing
    assert new["link_model"]["beyond_run_sizes"][0]["priced_by"] == "profile"
    assert new["link_model"]["beyond_run_sizes"][0]["profile_scale"] == pytest.approx(1.0)
    # a change within A's sizes: the same answer with or without the profile
    same = [answer(fit(snap, p), Changes(reshard_after_forward=False))["predicted"]
            for p in (None, _profile(convex_s))]
    assert same[0] == same[1]


def test_link_profile_of_a_slower_host_class_is_scaled_to_the_runs_link():
    """A profile measured on a host class twice as slow per byte: the run's own calls (a
    slope half the profile's over their sizes, no noise) reject its scale, and the model
    takes the profile's shape at the run's scale: B recovered again."""
    snap, _ = synthetic(CONVEX_A, link=convex_s)
    b, _ = synthetic((("(root)", 100_000), ("l0..l3", 1_250_000)), link=convex_s)
    exposed_b = b.ranks[0].exposed_seconds / 10
    slow = _profile(lambda nb: 2 * convex_s(nb))
    new = answer(fit(snap, slow), Changes(merge=4))
    assert new["predicted"]["exposed_comm_s"] == pytest.approx(exposed_b, rel=1e-6)
    assert new["link_model"]["beyond_run_sizes"][0]["profile_scale"] == pytest.approx(0.5)


def test_link_profile_noisy_sweep_is_made_monotone():
    from zerodoc.whatif.linkprofile import monotone

    assert monotone([1.0, 3.0, 2.0, 4.0]) == [1.0, 2.5, 2.5, 4.0]
    assert monotone([2.0, 1.0, 0.0]) == [1.0, 1.0, 1.0]
    prof = _profile(lambda b: {400_000: 1e-3, 1_200_000: 3e-3, 2_000_000: 2e-3}.get(b, 5e-3))
    assert prof.curves["all_gather"].median_s[:3] == pytest.approx((1e-3, 2.5e-3, 2.5e-3))


def test_pooled_medians_carry_the_error_of_their_mean():
    """A pooled value is the mean of k medians: its standard error is that of their mean,
    sqrt(sum se^2) / k, and never below a size's own (review rev4 leftover, rev5); unpooled
    sizes keep theirs."""
    from zerodoc.whatif.linkprofile import monotone, profile_from_dict

    vals, ses = monotone([1.0, 3.0, 2.0, 4.0], [0.1, 0.3, 0.1, 0.2])
    assert vals == [1.0, 2.5, 2.5, 4.0]
    # sqrt(0.09 + 0.01) / 2 = 0.158: the precise size takes it, the noisy one keeps 0.3
    assert ses == pytest.approx([0.1, 0.3, math.sqrt(0.1) / 2, 0.2])
    rows = [{"bytes": b, "median_s": t, "se_s": e} for b, t, e in
            ((1e6, 1e-3, 1e-5), (2e6, 3e-3, 1e-5), (3e6, 2e-3, 4e-5), (4e6, 5e-3, 2e-5))]
    prof = profile_from_dict({"kind": "zerodoc-link-profile", "schema": 1, "backend": "gloo",
                              "group_size": 2, "host": "h", "collectives": {"all_gather": rows}})
    # pooled (1e-5, 4e-5): sqrt(1e-10 + 16e-10) / 2 = 2.06e-5 for the first, 4e-5 its own
    assert prof.curves["all_gather"].se_s == pytest.approx(
        (1e-5, math.sqrt(17e-10) / 2, 4e-5, 2e-5))


def test_whatif_says_how_far_beyond_the_runs_sizes_it_extrapolates(tmp_path, capsys):
    run = "tests/data/scenarios/wrap-linear"
    assert cli.main(["whatif", run, "--merge", "blocks"]) == 0
    out = capsys.readouterr().out
    assert "all_gather calls up to 3.0x the run's largest (3.15 MB per call against 1.07 MB):" \
        " extrapolated along the fitted line (no --link-profile" in out
    prof = tmp_path / "p.json"
    rows = [{"bytes": b, "median_s": t, "se_s": 1e-5}
            for b, t in ((262_144, 6e-4), (1_048_576, 1.2e-3), (3_145_728, 4e-3))]
    prof.write_text(json.dumps({"kind": "zerodoc-link-profile", "schema": 1, "backend": "gloo",
                                "group_size": 2, "host": "h",
                                "collectives": {"all_gather": rows}}))
    assert cli.main(["whatif", run, "--merge", "blocks", "--link-profile", str(prof),
                     "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    lm = doc["link_model"]
    assert lm["profile"]["collectives"] == ["all_gather"]
    by = {r["collective"]: r["priced_by"] for r in lm["beyond_run_sizes"]}
    assert by == {"all_gather": "profile", "reduce_scatter": "line"}
    assert cli.main(["whatif", run, "--link-profile", str(prof)]) == 0  # the replay only
    assert "calls up to" not in capsys.readouterr().out


@pytest.mark.parametrize("content,msg", [
    (None, "no such file"),
    ("{", "not JSON"),
    ('{"kind": "other"}', "not a link profile"),
    ('{"kind": "zerodoc-link-profile", "schema": 1, "group_size": 1, "collectives": {}}',
     "group_size must be an integer from 2"),
    ('{"kind": "zerodoc-link-profile", "schema": 1, "group_size": 2, "collectives": '
     '{"all_gather": [{"bytes": 1, "median_s": 1}]}}', "needs 2 or more sizes"),
    ('{"kind": "zerodoc-link-profile", "schema": 1, "group_size": 2, "collectives": '
     '{"broadcast": [{"bytes": 1, "median_s": 1}, {"bytes": 2, "median_s": 1}]}}',
     "unknown collective"),
    ('{"kind": "zerodoc-link-profile", "schema": 1, "group_size": 2, "collectives": '
     '{"all_gather": [{"bytes": 1, "median_s": -1}, {"bytes": 2, "median_s": 1}]}}',
     "median_s must be a finite number"),
    ('{"kind": "zerodoc-link-profile", "schema": 1, "group_size": 2, "collectives": '
     '{"all_gather": [{"bytes": 2, "median_s": 1}, {"bytes": 2, "median_s": 1}]}}',
     "distinct"),
])
def test_whatif_bad_link_profile_one_line_exit_2(tmp_path, capsys, content, msg):
    prof = tmp_path / "p.json"
    if content is not None:
        prof.write_text(content)
    run = "tests/data/scenarios/wrap-linear"
    assert cli.main(["whatif", run, "--merge", "blocks", "--link-profile", str(prof)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and msg in err[0] and "--link-profile" in err[0], err


def test_link_profile_flat_over_the_runs_sizes_keeps_its_scale_and_a_finite_range():
    """A noisy sweep flat over the run's sizes (its slope there within its errors of 0):
    the ratio of the run's slope to it would divide by noise, so the scale stays 1 and the
    range stays finite (a loaded bench pair gave a 4.7 s high end before)."""
    from zerodoc.whatif.linkprofile import profile_from_dict

    snap, _ = synthetic(CONVEX_A, link=convex_s)
    rows = [{"bytes": b, "median_s": t, "se_s": 3e-4} for b, t in
            ((400_000, 1e-3), (2_000_000, 1.0001e-3), (5_000_000, 9e-3), (8_000_000, 2e-2))]
    flat = profile_from_dict({"kind": "zerodoc-link-profile", "schema": 1, "group_size": 2,
                              "collectives": {"all_gather": rows}})
    a = answer(fit(snap, flat), Changes(merge=4))
    ag = next(r for r in a["link_model"]["beyond_run_sizes"] if r["collective"] == "all_gather")
    # s stays 1; its range is the resolved one's at the edge of resolution (never [1, 1]:
    # a noisier profile gave a narrower range, review rev4 S4), finite
    s_lo, s_hi = ag["profile_scale_range"]
    assert ag["profile_scale"] == 1.0 and s_lo < 1.0 < s_hi < 100
    lo, hi = a["predicted"]["exposed_comm_s_range"]
    assert math.isfinite(hi) and hi < 10 * a["predicted"]["exposed_comm_s"]


def test_link_profile_with_two_group_sizes_leaves_the_replay_alone():
    """Units sharded over 4 ranks beside units over 2: each call is priced by its own group's
    fit and anchored to that fit's largest call, so the replay does not move with a profile
    (review rev4 M1: anchored to the group-2 fit, the replay moved from 376 to 436 ms)."""
    units = CONVEX_A + (("l4", 520_000),)

    def mixed(d):
        d["run"]["world_size"] = 4
        for u in d["units"]:
            u["group_size"] = 4 if u["name"] in ("l3", "l4") else 2

    snap, _ = synthetic(units, extra=mixed)
    a0 = answer(fit(snap), Changes())
    a1 = answer(fit(snap, _profile(lambda b: 3 * convex_s(b))), Changes())
    assert a1["baseline"]["step_s"] == pytest.approx(a0["baseline"]["step_s"], rel=1e-9)
    assert a1["link_model"]["beyond_run_sizes"] == []


def test_world_size_change_of_a_one_rank_run_is_answered():
    """A 1-rank run has no link to extrapolate from (group 1): a world-size change is
    answered, not a ZeroDivisionError (review rev4 M2)."""
    snap, _ = synthetic(extra=lambda d: d["run"].update(world_size=1))
    a = answer(fit(snap), Changes(world_size=2))
    assert a["link_model"]["beyond_run_sizes"] == []
    assert math.isfinite(a["predicted"]["step_s"])


def test_link_profile_noisy_flat_tail_is_no_flatter_than_the_runs_line():
    """A sweep whose last size's median dips under the one before (pooled flat): calls past
    the sweep go on along the last sizes' slope, never flatter than the run's line, so the
    profile cannot price them under the line (review rev4 M3: 50.7 ms against the line's
    64.5 and B's 109.5)."""
    from zerodoc.whatif.linkprofile import profile_from_dict

    snap, _ = synthetic(CONVEX_A, link=convex_s)
    rows = [{"bytes": b, "median_s": t, "se_s": 1e-5} for b, t in
            [(b, convex_s(b)) for b in (400_000, 1_200_000, 2_000_000, 2_400_000)]
            + [(2_600_000, convex_s(2_400_000) - 2e-4)]]
    noisy = profile_from_dict({"kind": "zerodoc-link-profile", "schema": 1, "group_size": 2,
                               "collectives": {"all_gather": rows, "reduce_scatter": rows}})
    b, _ = synthetic((("(root)", 100_000), ("l0..l3", 1_250_000)), link=convex_s)
    exposed_b = b.ranks[0].exposed_seconds / 10
    line = answer(fit(snap), Changes(merge=4))["predicted"]["exposed_comm_s"]
    new = answer(fit(snap, noisy), Changes(merge=4))
    assert line < new["predicted"]["exposed_comm_s"] < exposed_b
    assert all(r["beyond_profile"] for r in new["link_model"]["beyond_run_sizes"])


@pytest.mark.parametrize("doc,msg", [
    ('{"kind": "zerodoc-link-profile", "schema": 1, "group_size": 2, "collectives": '
     '{"all_gather": [{"bytes": 1%s, "median_s": 0.1}, {"bytes": 2, "median_s": 0.2}]}}'
     % ("0" * 400), "bytes must be a finite number >= 0 and <= 1e+13"),
    ('{"kind": "zerodoc-link-profile", "schema": 1, "group_size": 1%s}' % ("0" * 400),
     "group_size must be an integer from 2"),
    ('{"kind": "zerodoc-link-profile", "schema": 1, "group_size": 2, "collectives": '
     '{"all_gather": [{"bytes": 1, "median_s": 0.1, "se_s": 1e300}, '
     '{"bytes": 2, "median_s": 0.2}]}}', "se_s must be a finite number >= 0 and <= 3600"),
    ("[" * 200_000, "nested too deeply"),
])
def test_hostile_link_profiles_one_line_error(tmp_path, doc, msg):
    """Hostile profiles (review rev4 S1): a 400-digit integer, an absurd error, a deep
    nesting; each is a one-line error, never a traceback or an infinite range."""
    from zerodoc.errors import UserError
    from zerodoc.whatif.linkprofile import load_profile

    p = tmp_path / "p.json"
    p.write_text(doc)
    with pytest.raises(UserError, match=re.escape(msg)):
        load_profile(str(p))


@pytest.mark.parametrize("se,rejected", [(1e-6, True), (2e-3, False)])
def test_link_profile_scale_is_taken_only_where_the_runs_calls_reject_the_profile(se, rejected):
    """A profile 1.3x flatter per byte than the run's link over the run's sizes: with small
    errors the run's calls reject its scale (s = r = 1.3); with errors that leave 1.3 within
    two standard errors of 1 the scale stays 1 and its range reaches 1.3 (review rev4 S5:
    the scale's test was untested)."""
    from zerodoc.whatif.linkprofile import profile_from_dict

    snap, _ = synthetic(CONVEX_A, link=convex_s)
    rows = [{"bytes": b, "median_s": LAT + (convex_s(b) - LAT) / 1.3, "se_s": se}
            for b in (400_000, 1_200_000, 2_000_000, 4_000_000, 8_000_000)]
    prof = profile_from_dict({"kind": "zerodoc-link-profile", "schema": 1, "group_size": 2,
                              "collectives": {"all_gather": rows}})
    a = answer(fit(snap, prof), Changes(merge=4))
    ag = next(r for r in a["link_model"]["beyond_run_sizes"] if r["collective"] == "all_gather")
    lo, hi = ag["profile_scale_range"]
    if rejected:
        assert ag["profile_scale"] == pytest.approx(1.3, rel=1e-3)
    else:
        assert ag["profile_scale"] == 1.0 and lo <= 1.0 and hi >= 1.3
    assert ag["beyond_profile"] is False


def test_link_profile_of_another_backend_and_group_size_is_said(tmp_path, capsys):
    """A profile measured on another backend and group size is used (carried over in wire
    bytes) and the answer says what differs (review rev4 nit: it did not)."""
    import json as _json
    from pathlib import Path

    from zerodoc.cli.main import main

    rows = [{"bytes": b, "median_s": 1e-3 + b * 1e-9, "se_s": 1e-5}
            for b in (250_000, 1_000_000, 4_000_000)]
    p = tmp_path / "nccl4.json"
    p.write_text(_json.dumps({"kind": "zerodoc-link-profile", "schema": 1, "backend": "nccl",
                              "group_size": 4, "collectives": {"all_gather": rows}}))
    run = str(Path(__file__).parent / "data" / "scenarios" / "wrap-linear")
    assert main(["whatif", run, "--merge", "blocks", "--link-profile", str(p), "--json"]) == 0
    differs = _json.loads(capsys.readouterr().out)["link_model"]["profile"]["differs"]
    assert differs == ["measured on nccl, the run uses gloo",
                       "measured on 4 ranks, the run's groups are 2 (carried over in wire "
                       "bytes)"]
    assert main(["whatif", run, "--merge", "blocks", "--link-profile", str(p)]) == 0
    assert "measured on nccl, the run uses gloo" in capsys.readouterr().out


# --- the range holds the noise of the run that checks it ----------------------------------

SIGMA = 0.005  # injected: each step's exposed time moves by N(0, 5 ms)
STEPS = 9
CALLS = 15  # per step: 5 units x (2 all-gathers + 1 reduce-scatter)


def _noisy_run(errs: list[float], calls: list[list[float]] | None = None):
    """The synthetic run measured over `len(errs)` steps whose exposed time (and step) moved
    by `errs`: every call of step i took its share of errs[i], or, with `calls`, each call
    j of step i moved by calls[i][j] apart from the others (errs[i] their sum). The run's
    aggregate calls carry the mean over the steps, each rank's per-step figures the errors
    themselves. Returns the snapshot and the noise-free exposed time per step."""
    truth, _ = synthetic()
    clean = answer(fit(truth), Changes(), memory=False)["measured"]["exposed_comm_s"]
    shift = sum(errs) / len(errs)
    if calls is None:
        snap, step = synthetic(link=lambda nb: call_s(nb) + shift / CALLS)
    else:
        means = [sum(c) / len(calls) for c in zip(*calls)]

        def moved(d):
            for row, m in zip(d["ranks"][0]["comm"], means):
                row[5] += m
                row[6] += m
            d["ranks"][0]["step"] += sum(means)
        snap, step = synthetic(extra=moved)
    for w in snap.ranks.values():
        w.step_times = [step - shift + e for e in errs]
        w.exposed_times = [clean + e for e in errs]
    return snap, clean


def _coverage(draw, seeds: int = 200):
    """B's mean exposed time inside the replay's exposed range, over `seeds` draws of A's and
    B's noise (`draw(rng)`: the per-step errors and the per-call ones, or None); with the
    per-step figures and without them; the range's median half-width."""
    import random

    inside = inside_blind = 0
    widths = []
    for seed in range(seeds):
        rng = random.Random(seed)
        (ea, ca), (eb, _) = draw(rng), draw(rng)
        snap, clean = _noisy_run(ea, ca)
        b_exposed = clean + sum(eb) / STEPS
        a = answer(fit(snap), Changes(), memory=False)
        lo, hi = a["predicted"]["exposed_comm_s_range"]
        inside += lo <= b_exposed <= hi
        widths.append(hi - lo)
        assert a["noise"]["exposed_steps"] == STEPS and a["noise"]["exposed_t"] == 2.31
        assert a["noise"]["exposed_s"] == pytest.approx(
            math.sqrt(2) * statistics.stdev(ea) / math.sqrt(STEPS), rel=1e-9)
        for w in snap.ranks.values():
            w.exposed_times = []
        blind = answer(fit(snap), Changes(), memory=False)
        assert blind["noise"]["exposed_s"] is None and blind["noise"]["exposed_t"] == 0
        lo, hi = blind["predicted"]["exposed_comm_s_range"]
        inside_blind += lo <= b_exposed <= hi
    return inside / seeds, inside_blind / seeds, statistics.median(widths) / 2


def test_exposed_range_holds_a_check_runs_own_noise():
    """Ground truth beneath: A and B the same configuration, each measured over 9 steps
    whose exposed time moves by N(0, 5 ms) per step, shared by the step's calls. B's mean
    differs from A's by noise alone (5 ms x sqrt(2 / 9) = 2.4 ms). The replay's exposed
    range (t(8) = 2.31 standard errors of the difference, estimated from A's 9 steps) must
    hold B's mean about 95 % of the time; the link fit alone cannot see noise that moves
    every call of a step together (its residual is 0), so without the per-step figures (a
    source without them) the range does not hold it."""
    def shared(rng):
        return [rng.gauss(0, SIGMA) for _ in range(STEPS)], None

    held, blind, half = _coverage(shared)
    assert 0.92 <= held <= 0.975, held
    assert blind < 0.05, blind
    # the half-width: t(8) x the standard error of a difference of two means, about
    # 2.31 x 5 ms x sqrt(2 / 9) = 5.4 ms (the standard deviation estimated from 9 steps)
    assert half == pytest.approx(2.31 * SIGMA * math.sqrt(2 / STEPS), rel=0.15)


def test_exposed_range_holds_noise_that_moves_the_calls_apart():
    """The same with each call moving apart from the others (N(0, 5 ms / sqrt(15)) each, so
    that a step's exposed time again moves by N(0, 5 ms)): now the link fit's error sees part
    of A's noise as well, and the range, which adds the two, is conservative but holds B."""
    sd = SIGMA / math.sqrt(CALLS)

    def apart(rng):
        calls = [[rng.gauss(0, sd) for _ in range(CALLS)] for _ in range(STEPS)]
        return [sum(c) for c in calls], calls

    held, blind, half = _coverage(apart, seeds=100)
    assert held >= 0.95, held
    assert blind < held
    assert half < 3 * 2.31 * SIGMA * math.sqrt(2 / STEPS), half  # conservative, not unbounded


def test_whatif_text_says_what_noise_the_range_holds():
    errs = [0.004, -0.004, 0.002, -0.002, 0.0]
    snap, _ = _noisy_run(errs)
    text = render_text(answer(fit(snap), Changes(), memory=False))
    se = statistics.stdev(errs) / math.sqrt(5)
    assert "noise in the range (this run's mean and a check run's, about 95 %): step +/-" in text
    assert f"exposed +/-{2.78 * math.sqrt(2) * se * 1e3:.1f} ms (over 5 sampled steps)" in text
    for w in snap.ranks.values():
        w.exposed_times = [0.1]
    text = render_text(answer(fit(snap), Changes(), memory=False))
    assert "none on the exposed time (one sampled step: no spread to measure)" in text
    for w in snap.ranks.values():
        w.exposed_times = []
    text = render_text(answer(fit(snap), Changes(), memory=False))
    assert "none on the exposed time (the source has no per-step exposed figures)" in text


def test_noise_comes_from_the_worst_ranks_own_figures():
    """The rank whose mean exposed time the answer reports gives the noise, not the noisiest
    rank (at 1,024 ranks the largest of 1,024 estimates is biased up)."""
    calm = [0.004, -0.004, 0.002, -0.002, 0.0]
    snap, clean = _noisy_run(calm)
    w0, w1 = snap.ranks[0], snap.ranks[1]
    w1.exposed_total = w1.exposed_seconds * 1.01  # rank 1's mean is the worst
    w0.exposed_times = [0.1, 0.3, 0.1, 0.3, 0.2]  # the noisiest rank
    a = answer(fit(snap), Changes(), memory=False)
    assert a["measured"]["exposed_comm_s"] == pytest.approx(w1.exposed_seconds / w1.steps)
    assert a["noise"]["exposed_s"] == pytest.approx(
        math.sqrt(2) * statistics.stdev(w1.exposed_times) / math.sqrt(5), rel=1e-9)


def test_t_quantiles_never_narrower_than_the_truth():
    """Against the published 97.5 % points of Student's t (4 decimals): never below them,
    under 0.02 above them on the tabulated degrees of freedom (rounded up; from 100 on, 2),
    and between them (the entry below: t falls with the degrees of freedom) under 0.05."""
    from zerodoc.whatif.stepmodel import T975, t975

    published = {1: 12.7062, 2: 4.3027, 3: 3.1824, 4: 2.7764, 5: 2.5706, 6: 2.4469,
                 7: 2.3646, 8: 2.3060, 9: 2.2622, 10: 2.2281, 11: 2.2010, 12: 2.1788,
                 15: 2.1314, 20: 2.0860, 25: 2.0595, 30: 2.0423, 40: 2.0211, 50: 2.0086,
                 60: 2.0003, 80: 1.9901, 100: 1.9840, 1000: 1.9623}
    tabulated = {d for d, _t in T975}
    for df, t in published.items():
        assert t <= t975(df) < t + (0.02 if df in tabulated else 0.05), df


@pytest.mark.parametrize("how", ["sliding", "running", "whole"])
def test_run_log_windows_carry_each_sampled_steps_exposed_time(how):
    """Every way a run directory is read gives the window's per-step exposed figures: those
    of the step lines themselves (read here from the JSON, not through zerodoc's reader)."""
    from pathlib import Path

    from zerodoc.sources.rundir import RunDirSource

    run = Path(__file__).parent / "data" / "scenarios" / "healthy-block"
    window = None if how == "whole" else 6
    src = RunDirSource(run, window, detail=how != "running")
    snap = src.snapshot()
    for rank, w in snap.ranks.items():
        lines = [json.loads(s) for s in
                 (run / f"rank-{rank:05d}.jsonl").read_text().splitlines()]
        steps = [ln for ln in lines if ln.get("type") == "step"
                 and w.first_step <= ln["step"] <= w.last_step]
        want = [ln["exposed_s"] for ln in steps if ln.get("exposed_s") is not None]
        assert len(want) == w.steps >= 5
        assert w.exposed_times == pytest.approx(want, rel=1e-9, abs=1e-12), how


@pytest.mark.parametrize("window", [30, 20, 9])
@pytest.mark.parametrize("how", ["load_run", "sliding", "running"])
def test_sampled_runs_noise_comes_from_the_steps_the_mean_is_from(tmp_path, window, how):
    """1 step in 10 sampled: a window with 3 samples of its own takes its exposed figures
    from them; one with fewer (window 20: 2, window 9: 1) read in full detail takes its
    per-unit numbers, the mean exposed time among them, from the newest 3 samples, those
    before it too: its figures are those 3. Read from the step lines alone (a large run:
    "running" sums), the mean is the window's own samples': so are its figures. Either way
    the noise and the mean describe the same steps."""
    from zerodoc.runlog import load_run
    from zerodoc.sources.rundir import RunDirSource
    from zerodoc.testing.synthetic import write_run

    run = write_run(tmp_path / "run", ranks=2, units=4, steps=60, sample_every=10)
    if how == "load_run":
        snap = load_run(run, window, float("inf"))
    else:
        snap = RunDirSource(run, window, detail=how == "sliding").snapshot()
    n = 3 if how != "running" else {30: 3, 20: 2, 9: 1}[window]  # samples 40, 50, 60
    for rank, w in snap.ranks.items():
        figs = w.exposed_times
        assert len(figs) == n, (how, window, rank, figs)
        assert sum(figs) / len(figs) == pytest.approx(w.exposed_seconds / w.steps, rel=1e-9)
    a = answer(fit(snap), Changes(), memory=False)
    assert a["noise"]["exposed_steps"] == n
    assert a["noise"]["exposed_t"] == {3: 4.31, 2: 12.71, 1: 0.0}[n]
    assert (a["noise"]["exposed_s"] is None) == (n == 1)


def test_step_range_never_below_zero():
    """Two step times (t(1) = 12.71 standard errors): the noise dwarfs the step, and the
    range's low end stops at 0 s (review rev7: -287 ms)."""
    snap, step = synthetic()
    for w in snap.ranks.values():
        w.step_times = [step * 0.9, step * 1.1]
    a = answer(fit(snap), Changes(merge=2), memory=False)
    lo, hi = a["predicted"]["step_s_range"]
    assert lo == 0.0 and hi > 2 * a["predicted"]["step_s"]
    assert a["noise"]["step_t"] == 12.71


def _uneven_run():
    """Four ranks, none like another: rank 1 a straggler (each unit's forward 5 ms slower,
    its peers wait in the next all-gather; rank 0 10 ms more at one call), rank 2 without unit l2 (no compute or calls of
    it) and over 12 steps, rank 3 on a slow link for l3 (its reduce-scatter 30 % slower,
    part hidden), with calls of a unit its facts do not name and a collective it never
    called (count 0); the framework time per unit recorded, unequal by rank."""
    import copy

    def uneven(d):
        _fw_per_unit(d, noise=[0.0002, -0.0001, 0.0003])
        r0 = d["ranks"][0]
        r1, r2, r3 = (copy.deepcopy(r0) for _ in range(3))
        for row in r1["compute"]:
            if row[1] == "forward":
                row[2] += 0.005
        for row in r0["comm"] + r2["comm"] + r3["comm"]:
            if (row[1], row[2]) == ("forward", "all_gather") and row[0] != "(root)":
                row[5] += 0.005
                row[6] += 0.005
        for row in r0["comm"]:  # rank 0 late beyond the straggler's compute: 10 ms at l1
            if row[:3] == ["l1", "backward", "reduce_scatter"]:
                row[5] += 0.01
                row[6] += 0.01
        r2["steps"] = 12
        r2["compute"] = [row for row in r2["compute"] if row[0] != "l2"]
        r2["comm"] = [row for row in r2["comm"] if row[0] != "l2"]
        r2["unit_framework"] = [row for row in r2["unit_framework"] if row[0] != "l2"]
        for row in r3["comm"]:
            if row[:3] == ["l3", "backward", "reduce_scatter"]:
                row[5] *= 1.3
                row[6] = row[5] * 0.6
                row[7] = row[5] * 0.4
        r3["comm"] += [["head", "forward", "all_gather", 1, 400_000, 0.006, 0.006, 0.0],
                       ["l0", "forward", "all_reduce", 0, 0, 0.0, 0.0, 0.0]]
        r3["compute"] += [["head", "forward", 0.003], ["l0", "step", 0.001]]
        d["ranks"], d["copies"] = [r0, r1, r2, r3], 1
        d["run"]["world_size"] = 4
    snap, _ = synthetic(SIX, extra=uneven)
    return snap


def _as_arrays(snap):
    """The snapshot with every rank's per-unit numbers as the arrays a run log read at scale
    holds (`LazyRankWindow.unit_arrays`), its dicts not read, and its step totals as its
    step lines give them (`compute_total`, `exposed_total`)."""
    import dataclasses

    import numpy as np

    from zerodoc.runmodel import LazyRankWindow

    ranks = {}
    for r, w in snap.ranks.items():
        fields = {f.name: getattr(w, f.name) for f in dataclasses.fields(w)
                  if f.name not in ("compute", "comm")}
        fields.update(compute_total=w.compute_seconds, exposed_total=w.exposed_seconds)
        arrays = (tuple(w.compute), np.array(list(w.compute.values())), tuple(w.comm),
                  np.array([(c.count, c.bytes, c.seconds, c.exposed_seconds,
                             c.hidden_seconds) for c in w.comm.values()]))
        ranks[r] = LazyRankWindow(unit_arrays=arrays, **fields)
    return dataclasses.replace(snap, ranks=ranks)


def test_unit_part_from_the_arrays_equals_the_dicts_row_by_row():
    """The step model's per-unit part read from every rank's arrays at once (`unittable`,
    `stepmodel.FAST`) is, float for float, what reading each rank's dicts row by row gives
    (the witness: FAST off), on an uneven run (a straggler, a rank short of a unit and over
    more steps, a slow link, a unit the facts do not name, a call never made): the units,
    the framework fits, the arrival excess, the link fits, and every answer's JSON; from
    the arrays without turning them into dicts."""
    from zerodoc.whatif import stepmodel

    snap = _uneven_run()
    stepmodel.MEMO = False
    try:
        stepmodel.FAST = False
        want = stepmodel.fit(snap)
        stepmodel.FAST = True
        got = {"dicts": stepmodel.fit(snap), "arrays": stepmodel.fit(_as_arrays(snap))}
        ans = {name: [json.dumps(answer(m, ch, memory=False), sort_keys=True, default=repr)
                      for ch in (Changes(), Changes(merge=2), Changes(merge=3),
                                 Changes(reshard_after_forward=False), Changes(prefetch=1),
                                 Changes(latency_set_s=0.001), Changes(world_size=8))]
               for name, m in (("want", want), *got.items())}
    finally:
        stepmodel.MEMO, stepmodel.FAST = True, True
    assert want.ranks[1].arrival_wait_per_call_s == 0  # the straggler waits for none
    assert want.ranks[0].arrival_wait_per_call_s > 0
    l2 = want.ranks[2].units[3]
    assert (l2.name, l2.forward_s, l2.comm) == ("l2", 0.0, {})  # the facts name it, no numbers
    assert want.ranks[3].units[-1].name == "head"
    for m in got.values():
        for a, b in zip(m.ranks, want.ranks):
            assert a.units == b.units
            assert (a.framework_fit, a.other_s, a.arrival_wait_per_call_s, a.arrival_calls) \
                == (b.framework_fit, b.other_s, b.arrival_wait_per_call_s, b.arrival_calls)
        assert m.links == want.links and m.semantics == want.semantics
    assert not want.semantics.sync_reduce  # rank 3's hidden reduce-scatter
    assert ans["dicts"] == ans["want"] and ans["arrays"] == ans["want"]
    arrays = _as_arrays(snap)
    stepmodel.fit(arrays)
    assert all(w.unit_arrays is not None for w in arrays.ranks.values())  # no dicts read


def _shared_layout_run():
    """Eight ranks of 12 units, five of one layout (the same keys, unit names, group sizes and calls:
    they share the grid's `Layout`) and three each their own: rank 1 a straggler (each
    unit's forward 5 ms slower), rank 3 on a slow link for l3 (its reduce-scatter 30 %
    slower, part hidden), rank 4 over 12 steps; rank 5 without unit l2's numbers (its facts
    name it), rank 6 with a collective it never called (count 0) and compute outside the
    named phases and no framework time of l3 (its largest unit), rank 7 with calls of a
    unit its facts do not name and its l3 backward all-gathers larger than the link's
    calls (beyond them with resharding on); the framework time per unit recorded, unequal
    by rank."""
    import copy

    def shared(d):
        _fw_per_unit(d, noise=[0.0002, -0.0001, 0.0003])
        r0 = d["ranks"][0]
        rs = [r0] + [copy.deepcopy(r0) for _ in range(7)]
        for row in rs[1]["compute"]:
            if row[1] == "forward":
                row[2] += 0.005
        for row in rs[3]["comm"]:
            if row[:3] == ["l3", "backward", "reduce_scatter"]:
                row[5] *= 1.3
                row[6] = row[5] * 0.6
                row[7] = row[5] * 0.4
        rs[4]["steps"] = 12
        rs[4]["unit_framework"] = [[u, p, s * 1.1] for u, p, s in rs[4]["unit_framework"]]
        for key in ("compute", "comm", "unit_framework"):
            rs[5][key] = [row for row in rs[5][key] if row[0] != "l2"]
        rs[6]["comm"] += [["l0", "forward", "all_reduce", 0, 0, 0.0, 0.0, 0.0]]
        rs[6]["compute"] += [["l0", "step", 0.001]]
        rs[6]["unit_framework"] = [row for row in rs[6]["unit_framework"] if row[0] != "l3"]
        for row in rs[7]["comm"]:  # larger than the link's calls, and slower per call
            if row[:3] == ["l3", "backward", "all_gather"]:
                row[4], row[5], row[6] = row[4] * 1.5, row[5] * 2, row[6] * 2
        rs[7]["comm"] += [["head", "forward", "all_gather", 1, 400_000, 0.006, 0.006, 0.0]]
        rs[7]["compute"] += [["head", "forward", 0.003]]
        d["ranks"], d["copies"] = rs, 1
        d["run"]["world_size"] = 8
    snap, _ = synthetic(TWELVE, extra=shared)
    return snap


# more than 8 units: numpy's own sums (pairwise past 8 terms) would part from Python's
TWELVE = SIX + (("l5", 300_000), ("l6", 700_000), ("l7", 1_500_000), ("l8", 200_000),
                ("l9", 900_000), ("l10", 600_000))


def test_unit_grid_equals_the_unit_objects_on_ranks_that_share_a_layout():
    """The replays' per-rank figures from every rank's arrays at once (`unitgrid`: ranks of
    one layout in one block) are, float for float, what each rank's unit objects give (the
    witness: `stepmodel.FAST` off, the dicts read row by row): every answer's JSON, each
    rank's units, fits and arrival spread; an answer that merges no units builds the unit
    objects of two ranks only (the replay's and the first); and by hand: each rank's
    compute deficit against the straggler, 12 units x 5 ms (rank 5: 11 x 5 ms and all of
    l2's 35 ms)."""
    from zerodoc.whatif import stepmodel

    changes = (Changes(), Changes(merge=2), Changes(merge=3),
               Changes(reshard_after_forward=False), Changes(prefetch=1),
               Changes(latency_set_s=0.001), Changes(world_size=16), Changes(world_size=1),
               Changes(bandwidth_scale=2.0, micro_batch_scale=2.0))
    stepmodel.MEMO = False
    try:
        stepmodel.FAST = False
        want = stepmodel.fit(_shared_layout_run())
        assert want.grid is None
        stepmodel.FAST = True
        got = stepmodel.fit(_as_arrays(_shared_layout_run()))
        first = json.dumps(answer(got, Changes(), memory=False), sort_keys=True, default=repr)
        built = got.grid.built()
        ans = {name: [json.dumps(answer(m, ch, memory=False), sort_keys=True, default=repr)
                      for ch in changes] for name, m in (("want", want), ("got", got))}
    finally:
        stepmodel.MEMO, stepmodel.FAST = True, True
    sizes = sorted(len(b.idx) for b in got.grid.blocks)
    assert sizes == [1, 1, 1, 5], sizes  # ranks 0-4 share a layout
    assert built == 2 and first == ans["want"][0]
    assert ans["got"] == ans["want"]
    for a, b in zip(got.ranks, want.ranks):
        assert a.units == b.units
        assert (a.framework_fit, a.other_s, a.arrival_wait_per_call_s, a.arrival_calls) == \
            (b.framework_fit, b.other_s, b.arrival_wait_per_call_s, b.arrival_calls)
    assert got.links == want.links and got.semantics == want.semantics
    for r, d in enumerate(got.grid.deficits()):  # the straggler's own: 0
        want_d = 0.0 if r == 1 else 11 * 0.005 + 0.035 if r == 5 else 12 * 0.005
        assert d == pytest.approx(want_d, abs=1e-12), r
