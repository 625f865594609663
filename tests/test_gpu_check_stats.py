"""bench/gpu_check.py's overhead statistics (issue 19: the check must resolve 0.3 %), on
simulated block times with a known overhead injected beneath them: the plain twin's steps
with jitter and drift, the zerodoc twin's the same plus a known cost per step and a known
dearer step 1 in K. No GPU needed: the statistics are what is tested; the section that feeds
them real blocks runs on a GPU only."""

from __future__ import annotations

import random

import pytest

from bench.gpu_check import block_ratio, overhead_verdict


def simulate(blocks: int, per: int, step_ms: float, per_step_ms: float, sample_ms: float,
             k: int, jitter: float, seed: int) -> tuple[list[float], list[float], float]:
    """(A's block means, B's block means, the true ratio of A's mean step to B's)."""
    rng = random.Random(seed)
    a, b, step = [], [], 0
    for i in range(blocks):
        drift = 1.0 + 0.02 * i / blocks  # the machine slows 2 % over the run
        for name in (("A", "B") if i % 2 == 0 else ("B", "A")):
            ts = []
            for _ in range(per):
                t = step_ms * drift * (1 + rng.gauss(0, jitter))
                if name == "A":
                    step += 1
                    t += per_step_ms + (sample_ms if step % k == 0 else 0.0)
                ts.append(t)
            (a if name == "A" else b).append(sum(ts) / per)
    true = 1.0 + (per_step_ms + sample_ms / k) / step_ms  # drift cancels in the pairs
    return a, b, true


@pytest.mark.parametrize("seed", range(5))
def test_interval_holds_the_injected_overhead_and_resolves_it(seed):
    # 90 ms steps, 27 us per step always on, a 6 ms sample 1 in 64: 0.13 % in all
    a, b, true = simulate(40, 16, 90.0, 0.027, 6.0, 64, 0.003, seed)
    st = block_ratio(a, b, seed=seed)
    assert st["lo"] <= true <= st["hi"], (st, true)
    assert st["hi"] - st["lo"] <= 0.003, st
    assert overhead_verdict(st) == ("PASS", "")


def test_a_cost_just_over_the_target_never_passes():
    # 0.34 %: 27 us per step and a 9 ms sample 1 in 32 (review S3: a verdict on the point
    # estimate passed it in 6 of 40 runs); PASS needs the whole interval <= 1.003
    for seed in range(40):
        a, b, true = simulate(40, 16, 90.0, 0.027, 9.0, 32, 0.003, seed)
        assert true > 1.003
        st = block_ratio(a, b, seed=seed)
        assert overhead_verdict(st)[0] == "FAIL", (seed, st)


def test_a_cost_near_the_target_is_passed_or_not_resolved_never_called_over():
    # 0.24 %: the interval straddles 1.003 in some runs of 40 blocks: "not resolved"
    verdicts = set()
    for seed in range(20):
        a, b, true = simulate(40, 16, 90.0, 0.027, 6.0, 32, 0.003, seed)
        st = block_ratio(a, b, seed=seed)
        assert st["lo"] <= true <= st["hi"], (seed, st, true)
        status, why = overhead_verdict(st)
        assert status == "PASS" or "not resolved" in why, (seed, st, why)
        verdicts.add(status)
    assert verdicts == {"PASS", "FAIL"}  # both occur: the blocks' count decides


def test_a_cost_over_the_target_fails():
    a, b, true = simulate(40, 16, 90.0, 0.2, 12.0, 16, 0.003, 7)  # ~1.05 %
    st = block_ratio(a, b)
    assert true > 1.003 and st["lo"] > 1.003, (st, true)
    status, why = overhead_verdict(st)
    assert status == "FAIL" and "over the target" in why


def test_too_few_blocks_do_not_resolve_the_target():
    # 3 pairs: too few resamples for an interval, whatever it says
    a, b, _ = simulate(3, 4, 90.0, 0.0, 0.0, 32, 0.03, 3)
    status, why = overhead_verdict(block_ratio(a, b))
    assert status == "FAIL" and "not resolved: 3 block pairs" in why
    # 12 pairs of noisy steps (3 % jitter): an interval that straddles the target
    a, b, _ = simulate(12, 4, 90.0, 0.0, 0.0, 32, 0.03, 0)
    st = block_ratio(a, b)
    assert st["lo"] < 1.003 < st["hi"], st
    status, why = overhead_verdict(st)
    assert status == "FAIL" and "not resolved" in why and "straddles" in why


def test_the_mean_keeps_rare_dear_steps_a_median_would_drop():
    # a sample 1 in 64 that costs 30 ms: 0.52 % of a 90 ms step, invisible to a median
    a, b, true = simulate(40, 16, 90.0, 0.0, 30.0, 64, 0.001, 11)
    st = block_ratio(a, b)
    assert abs(st["ratio"] - true) < 0.001, (st, true)
    assert overhead_verdict(st)[0] == "FAIL"
    per_block = sorted(x / y for x, y in zip(a, b))
    assert per_block[len(per_block) // 2] < 1.001  # what a median of blocks would have said


def test_bad_input_is_a_clear_error():
    with pytest.raises(ValueError, match="need >= 2 pairs"):
        block_ratio([1.0], [1.0])
    with pytest.raises(ValueError):
        block_ratio([1.0, 1.0], [1.0])
