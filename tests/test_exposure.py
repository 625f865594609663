"""Proof that the per-unit numbers are true: inject a known slow link and find it again.

Real FSDP2 jobs (gloo, 2 and 4 ranks) run twice, without and with every all-gather completing
DELAY later (`zerodoc/shim/slowlink.py`, a layer beneath the measurement). Per unit and phase
we compare the *floor* of the exposed time over ranks and steps (its minimum: a rank that
arrived last at the collective, free of rank-skew noise, which with 4 ranks on 2 shared cores
is several ms per sample) between the two runs; per rank we check the bounds that hold for
every sample.

- sync all-gather (FSDP2's CPU default): exposed rises by DELAY on every unit;
- async unshard + explicit prefetch: exposed rises by DELAY where nothing prefetches (the
  root, forward and backward) and by clearly less on units prefetched behind real compute,
  while their all-gather time still rises by DELAY (the delay was hidden, not missed);
- always: total = exposed + hidden per all-gather, bytes = the unit's unsharded bytes,
  counts follow FSDP's schedule.
Tolerance: 5 % of DELAY or 2 ms, whichever is larger (the issue's). DELAY is 100 ms, and
200 ms where ranks outnumber cores: there a collective's own time when a rank arrives last
(the floors' reference in the run without the delay) varies by 0.7-5 ms from run to run with
4 ranks on 2 cores, a few of which the delayed run's floor does not share (its ranks leave
each delay together); that variation does not scale with the delay, the tolerance does.
"""

from __future__ import annotations

import os

import pytest

from tests.support.helpers import detail_steps, per_step, run_demo


def oversubscribed(nprocs: int) -> bool:
    return nprocs > (os.cpu_count() or 1)


def delay_for(nprocs: int) -> float:
    return 0.200 if oversubscribed(nprocs) else 0.100


def tol_for(nprocs: int) -> float:
    return max(0.05 * delay_for(nprocs), 0.002)


# Completion of a collective that finished while compute ran is timed by a future callback on
# gloo's thread, which needs the GIL: it can run up to one switch interval (5 ms) late, and
# when ranks outnumber cores (4 ranks, each with its gloo thread, on 2 cores) it can also wait
# for a scheduler slice. Only the *hidden* part of a collective depends on it; exposed time is
# timed on the compute thread itself and keeps the tolerance everywhere.
def callback_tol(nprocs: int) -> float:
    return tol_for(nprocs) + (0.020 if oversubscribed(nprocs) else 0.005)
STEPS = 12
# Batch 8: ~20 ms of block compute (more with ranks outnumbering cores) to hide a prefetched
# all-gather behind (margin over the tolerance).
MODEL = {"batch": 8}
UNITS = ["(root)", "blocks.0", "blocks.1", "blocks.2", "blocks.3"]

# Prefetched behind at least one block's compute: the delay must be (partly) hidden.
HIDDEN_BEHIND_COMPUTE = [("blocks.1", "forward"), ("blocks.2", "forward"),
                         ("blocks.3", "forward"), ("blocks.0", "backward"),
                         ("blocks.1", "backward"), ("blocks.2", "backward")]
# Nothing prefetches these: the whole delay is exposed.
NOT_PREFETCHED = [("(root)", "forward"), ("(root)", "backward")]


def floor(logs, unit, phase, field):
    """Minimum over ranks and (post-warm-up) steps."""
    return min(min(per_step(log, unit, phase, "all_gather", field)) for log in logs.values())


def delta(runs, mode, unit, phase, field):
    return (floor(runs[mode, "slow"], unit, phase, field)
            - floor(runs[mode, "base"], unit, phase, field))


@pytest.fixture(scope="module", params=[2, 4], ids=["2ranks", "4ranks"])
def runs(request, tmp_path_factory):
    n = request.param
    tmp = tmp_path_factory.mktemp(f"exposure{n}")
    out = {"n": n, "delay": delay_for(n)}
    # Per-unit detail on every step in both runs: the floors are minima over every step's
    # sample (a few sampled steps leave them at the rank skew's noise), and the slow run has
    # it anyway (fault injection forces it): both runs measured alike.
    every = {"detail": "every"}
    for mode in ("sync", "async"):
        model = {"prefetch": mode == "async", **MODEL}
        # Oversubscribed (4 ranks on 2 cores): more samples for the floors to settle.
        steps = STEPS + 4 if oversubscribed(n) else STEPS
        out[mode, "base"] = run_demo(tmp, f"{mode}-base", nprocs=n, steps=steps, model=model,
                                     attach=every)
        out[mode, "slow"] = run_demo(tmp, f"{mode}-slow", nprocs=n, steps=steps, model=model,
                                     attach={"inject_latency_s": out["delay"], **every})
    return out


def test_sync_exposed_rises_by_delay_on_every_unit(runs):
    DELAY, TOL = runs["delay"], tol_for(runs["n"])
    for phase in ("forward", "backward"):
        for unit in UNITS:
            d = delta(runs, "sync", unit, phase, "exposed_seconds")
            assert abs(d - DELAY) <= TOL, (unit, phase, d)
            for r, log in runs["sync", "slow"].items():
                # Every rank waited at least the delay on every all-gather ...
                assert min(per_step(log, unit, phase, "all_gather", "exposed_seconds")) \
                    >= DELAY - TOL, (r, unit, phase)
                # ... and synchronous on CPU means nothing was hidden.
                assert max(per_step(log, unit, phase, "all_gather", "hidden_seconds")) == 0.0


def test_async_prefetch_hides_part_of_the_delay(runs):
    DELAY, TOL = runs["delay"], tol_for(runs["n"])
    for unit, phase in NOT_PREFETCHED:
        d = delta(runs, "async", unit, phase, "exposed_seconds")
        assert abs(d - DELAY) <= TOL, (unit, phase, d)
    for unit, phase in HIDDEN_BEHIND_COMPUTE:
        d = delta(runs, "async", unit, phase, "exposed_seconds")
        assert d < DELAY - TOL, (unit, phase, d)
        # ... yet the collective itself did take DELAY longer: the delay was hidden.
        dt = delta(runs, "async", unit, phase, "seconds")
        assert abs(dt - DELAY) <= callback_tol(runs["n"]), (unit, phase, dt)
    for unit in UNITS:
        for phase in ("forward", "backward"):
            d = delta(runs, "async", unit, phase, "exposed_seconds")
            assert d <= DELAY + TOL, (unit, phase, d)


def test_total_is_exposed_plus_hidden(runs):
    for key in (("sync", "slow"), ("async", "slow"), ("async", "base")):
        for r, log in runs[key].items():
            for s in log.steps:
                for (unit, phase, coll), t in s.comm.items():
                    assert t.exposed_seconds >= 0 and t.hidden_seconds >= 0
                    assert abs(t.seconds - (t.exposed_seconds + t.hidden_seconds)) \
                        <= max(0.05 * t.seconds, 0.002 * t.count), (key, r, unit, phase, coll)


def _expected_gather_bytes(n: int) -> dict[str, int]:
    """Unsharded fp32 bytes per unit, computed from the model independently of zerodoc."""
    import torch

    from zerodoc.demo.transformer import DemoConfig, TinyTransformer
    from tests.support.helpers import SMALL_MODEL

    m = TinyTransformer(DemoConfig(**SMALL_MODEL))
    block = sum(p.numel() for p in m.blocks[0].parameters())
    root = sum(p.numel() for name, p in m.named_parameters() if not name.startswith("blocks."))
    for p in m.parameters():  # dims divisible by the world size: no padding
        assert p.shape[0] % n == 0
    size = torch.finfo(torch.float32).bits // 8
    return {"(root)": root * size, **{f"blocks.{i}": block * size for i in range(4)}}


def test_bytes_and_counts_follow_fsdp_schedule(runs):
    n = runs["n"]
    expected = _expected_gather_bytes(n)
    for r, log in runs["sync", "base"].items():
        facts = {u.name: u for u in log.facts.units}
        assert log.facts.world_size == n and log.facts.zero_stage == 3
        for s in log.steps:
            for unit in UNITS:
                assert facts[unit].gather_bytes == expected[unit]
                assert facts[unit].reshard_after_forward is True
                for phase in ("forward", "backward"):
                    ag = s.comm[(unit, phase, "all_gather")]
                    assert ag.count == 1, (unit, phase, ag)
                    assert ag.bytes == expected[unit]
                rs = s.comm[(unit, "backward", "reduce_scatter")]
                assert rs.count == 1 and rs.bytes == expected[unit]  # fp32 grads


def test_reshard_false_gathers_in_forward_only(tmp_path):
    """In the default detail: every sampled step holds the schedule."""
    logs = run_demo(tmp_path, "zero2", nprocs=2, steps=4,
                    model={"reshard_after_forward": False})
    log = logs[0]
    assert log.facts.zero_stage == 2
    assert all(u.reshard_after_forward is False for u in log.facts.units)
    for s in detail_steps(log):
        for unit in UNITS:
            assert s.comm[(unit, "forward", "all_gather")].count == 1
            assert (unit, "backward", "all_gather") not in s.comm
            assert s.comm[(unit, "backward", "reduce_scatter")].count == 1
