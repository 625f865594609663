"""Layer too big for ZeRO-3: one unit's gathered parameters plus activations exceed the device.

Why: ZeRO-3 shards model states across ranks, but each unit is gathered whole to compute it
(and the next one is prefetched), and activations are not sharded at all. If the largest unit
gathered twice plus the activations do not fit one device, no stage and no number of ranks
helps: the layer itself must be split (tensor parallelism) or its activations reduced.

Evidence: the largest unit's gathered bytes, the activations (reported, or on a GPU estimated
as peak allocated - model states - transient), their sum against capacity.
Fix: tensor (or pipeline) parallelism for the big layer, activation checkpointing, a smaller
micro-batch; not a higher ZeRO stage.
"""

from __future__ import annotations

from ..findings import Severity
from ...humanize import nbytes, pct
from .base import effect, finding, r6

CODE = "ZD008"
NAME = "layer-too-big"
SEVERITY = Severity.ERROR
TIER = 0
EXPLAINS = ("ZD001", "ZD007")  # a single huge layer cannot be wrapped finer


def evaluate(ctx) -> list:
    t = ctx.t
    big = ctx.largest_unit
    if big is None or not ctx.ranks:
        return []
    worst = None
    for r, w in ctx.ranks.items():
        cap = ctx.capacity(w)
        if not cap:
            continue
        act = ctx.activation_bytes(w)
        floor = 2 * big.gather_bytes + (act or 0)
        if worst is None or floor / cap > worst[1]:
            worst = (r, floor / cap, cap, act, floor)
    if worst is None:
        return []
    r, share, cap, act, floor = worst
    if share >= 1.0:
        severity = Severity.ERROR
    elif share >= 1.0 - t.headroom_fraction_warn:
        severity = Severity.WARNING
    else:
        return []
    name = big.name or "(root)"
    act_txt = nbytes(act) if act is not None else "unknown (not counted)"
    return [finding(
        CODE, NAME, severity,
        f"{name} gathered (x2 with prefetch, {nbytes(2 * big.gather_bytes)}) plus activations "
        f"({act_txt}) need {pct(share)} of the device: no ZeRO stage can fit it",
        evidence={"unit": name, "unit_gather_bytes": big.gather_bytes,
                  "activation_bytes": act, "floor_bytes": int(floor), "capacity_bytes": cap,
                  "capacity_fraction": r6(share), "rank": r},
        threshold={"headroom_fraction_warn": t.headroom_fraction_warn},
        fix=("Split the layer, not the states: tensor parallelism for the big unit "
             "(`parallelize_module` with ColwiseParallel / RowwiseParallel on a 2-D mesh, "
             "FSDP on the other dimension), activation checkpointing, a smaller micro-batch "
             "or sequence; a higher ZeRO stage or more ranks cannot shrink a gathered unit."),
        predicted=(f"tensor parallelism of degree 2 halves the gathered unit to "
                   f"{nbytes(big.gather_bytes)} (x2 with prefetch); even infinitely many "
                   f"ZeRO-3 ranks leave {nbytes(floor)} per rank"),
        ranks=(r,), units=(name,),
        effects=(effect(ctx, "largest_unit_gather_bytes", "down", big.gather_bytes / 2),))]


def applied(before: dict, after: dict) -> str | None:
    """Tensor parallelism shows as a new mesh dimension or a smaller largest unit."""
    if before.get("mesh_shape") != after.get("mesh_shape"):
        return f"mesh {before.get('mesh_shape')} -> {after.get('mesh_shape')}"
    return None
