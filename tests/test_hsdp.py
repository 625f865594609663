"""FSDP2 on a 2-D mesh (HSDP): shard within a group of 2, replicate across 2 groups (4 ranks).
The all-reduce across replicas is measured per unit and labelled apart from the intra-group
all-gather / reduce-scatter."""

from __future__ import annotations

from tests.support.helpers import detail_steps, run_demo
from tests.test_exposure import UNITS, _expected_gather_bytes


def test_hsdp_all_reduce_is_measured_per_unit(tmp_path):
    logs = run_demo(tmp_path, "hsdp", nprocs=4, steps=4,
                    extra={"framework": "fsdp2", "hsdp_replicas": 2})
    expected = _expected_gather_bytes(2)  # gathered within a shard group of 2
    for r, log in logs.items():
        f = log.facts
        assert f.mesh_shape == (2, 2) and f.mesh_dim_names == ("replicate", "shard")
        assert f.hooks["_fsdp_collectives.dist (HSDP all-reduce)"] == "ok"
        units = {u.name: u for u in f.units}
        for s in detail_steps(log):
            for unit in UNITS:
                assert units[unit].group_size == 2 and units[unit].replicate_size == 2
                ag = s.comm[(unit, "forward", "all_gather")]
                assert ag.count == 1 and ag.bytes == expected[unit]
                rs = s.comm[(unit, "backward", "reduce_scatter")]
                assert rs.count == 1 and rs.bytes == expected[unit]
                ar = s.comm[(unit, "backward", "all_reduce")]
                # The all-reduce moves this rank's gradient shard: 1/2 of the unit.
                assert ar.count == 1 and ar.bytes == expected[unit] // 2, (unit, ar)
                assert ar.seconds > 0 and ar.exposed_seconds == ar.seconds  # sync on CPU


def test_plain_fsdp_has_no_all_reduce(tmp_path):
    logs = run_demo(tmp_path, "flat", nprocs=2, steps=2)
    assert "_fsdp_collectives.dist (HSDP all-reduce)" not in logs[0].facts.hooks
    assert not any(coll == "all_reduce" for s in detail_steps(logs[0]) for (_, _, coll) in s.comm)
