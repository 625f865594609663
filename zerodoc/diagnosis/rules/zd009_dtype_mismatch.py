"""Dtype mismatch: gather, compute and reduce dtypes disagree, or a collective moves a wider
dtype than configured.

Why: the all-gather dtype (FSDP2 `MixedPrecisionPolicy.param_dtype`), the compute dtype
(autocast) and the gradient reduce dtype should be chosen together. Units with different
policies, gradients reduced in a narrower dtype than they were computed in, or parameters
gathered in fp32 only to be cast to bf16 for compute are silent precision or traffic bugs.

Evidence: per-unit param / reduce dtypes, the compute dtype when the adapter reports it
(`config["compute_dtype"]`), and the measured bytes per element of the all-gathers and
reduce-scatters against the configured dtypes.
Fix: one `MixedPrecisionPolicy(param_dtype=..., reduce_dtype=...)` for every unit, aligned
with autocast.
"""

from __future__ import annotations

from ..findings import Severity
from ..observables import observe
from .base import effect, finding, r6

CODE = "ZD009"
NAME = "dtype-mismatch"
SEVERITY = Severity.WARNING
TIER = 0
EXPLAINS = ()


def _size(name: str) -> int | None:
    from ...planner import DTYPE_BYTES

    return DTYPE_BYTES.get(str(name).strip().lower().removeprefix("torch.")) if name else None


def evaluate(ctx) -> list:
    t = ctx.t
    units = [u for u in ctx.units if u.params > 0]
    if not units or ctx.facts is None:
        return []
    by_name = {u.name: u for u in units}
    problems, severity, evidence = [], Severity.INFO, {}
    pdts = sorted({u.param_dtype for u in units if u.param_dtype})
    rdts = sorted({u.reduce_dtype for u in units if u.reduce_dtype})
    evidence["param_dtypes"], evidence["reduce_dtypes"] = pdts, rdts
    if len(pdts) > 1 or len(rdts) > 1:
        problems.append(f"units disagree: param dtypes {pdts}, reduce dtypes {rdts}")
        severity = Severity.WARNING
    sized = [(u, _size(u.param_dtype), _size(u.reduce_dtype)) for u in units]
    narrow = [u for u, p, r in sized if p and r and r < p]
    wide = [u for u, p, r in sized if p and r and r > p]
    if narrow:
        problems.append(f"gradients reduced in a narrower dtype than the parameters on "
                        f"{len(narrow)} unit(s) ({narrow[0].reduce_dtype} < "
                        f"{narrow[0].param_dtype})")
        severity = Severity.WARNING
    if wide:
        u = wide[0]
        problems.append(f"reduce dtype wider than the parameters on {len(wide)} unit(s) "
                        f"({u.reduce_dtype} > {u.param_dtype}): reduce-scatter traffic "
                        f"x{_size(u.reduce_dtype) / _size(u.param_dtype):g}")
    cfg = ctx.facts.config if isinstance(ctx.facts.config, dict) else {}
    cdt = cfg.get("compute_dtype") or cfg.get("autocast_dtype")
    if cdt and _size(cdt):
        evidence["compute_dtype"] = cdt
        wider = [u for u, p, _r in sized if p and p > _size(cdt)]
        if wider:
            u = wider[0]
            problems.append(f"parameters gathered in {u.param_dtype} to compute in {cdt} on "
                            f"{len(wider)} unit(s): all-gather traffic "
                            f"x{_size(u.param_dtype) / _size(cdt):g}")
            severity = Severity.WARNING
    # What the wire shows: bytes per element against the configured dtypes.
    measured = {}
    for coll, attr in (("all_gather", "param_dtype"), ("reduce_scatter", "reduce_dtype")):
        want = got = 0.0
        for v in ctx.views(coll):
            u = by_name.get(v.unit)
            if not v.count or u is None or not _size(u.param_dtype) or not _size(getattr(u, attr)):
                continue
            elems = u.gather_bytes / _size(u.param_dtype)  # padded elements per collective
            want += elems * _size(getattr(u, attr)) * v.count
            got += v.bytes
        if want > 0:
            measured[coll] = r6(got / want)
            if got / want >= t.dtype_traffic_ratio_warn:
                problems.append(f"{coll.replace('_', '-')} moves {got / want:.2f}x the bytes "
                                f"its configured dtype implies")
                severity = Severity.WARNING
    evidence["measured_to_configured_bytes_ratio"] = measured
    if not problems:
        return []
    effects = ()
    ag_ratio = measured.get("all_gather")
    if ag_ratio and ag_ratio >= t.dtype_traffic_ratio_warn:
        now = effect(ctx, "all_gather_bytes_per_step", "down")
        effects = (now and effect(ctx, "all_gather_bytes_per_step", "down",
                                  now.now / ag_ratio),)
    elif cdt and _size(cdt) and wider:
        u = wider[0]
        effects = (effect(ctx, "all_gather_bytes_per_step", "down",
                          (observe(ctx, "all_gather_bytes_per_step") or 0.0)
                          * _size(cdt) / _size(u.param_dtype)),)
    return [finding(
        CODE, NAME, severity, "dtype mismatch: " + "; ".join(problems),
        evidence=evidence,
        threshold={"dtype_traffic_ratio_warn": t.dtype_traffic_ratio_warn},
        fix=("Apply one `MixedPrecisionPolicy(param_dtype=torch.bfloat16, "
             "reduce_dtype=torch.float32)` (or your chosen pair) to every `fully_shard` call, "
             "with param_dtype equal to the autocast dtype; reduce in fp32 only where its "
             "traffic is affordable."),
        units=tuple(u.name for u in (narrow or wide)[:8]), effects=effects)]


DTYPE_FACTS = ("param_dtype", "reduce_dtype", "compute_dtype")


def applied(before: dict, after: dict) -> str | None:
    """The fix shows as different parameter / reduce / compute dtypes."""
    changed = [f"{k} {before.get(k)} -> {after.get(k)}" for k in DTYPE_FACTS
               if before.get(k) != after.get(k)]
    return "; ".join(changed) or None
