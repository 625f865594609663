"""Rule test cases as small JSON snapshot files (tests/data/rules/<code>/{pass,fail}-*.json).

One file is one snapshot and what one rule must (not) find in it. All times, counts and
bytes of a rank are *per step*; the loader multiplies them by the rank's `steps`::

    {
      "description": "root holds 95% of the parameters",
      "expect": {"code": "ZD001", "fires": true, "severity": "warning",
                 "evidence": {"param_fraction": [0.9, 1.0], "unit": "(root)"}},
      "diagnose": {"link": "nvlink", "device_memory_bytes": 80e9,
                   "thresholds": {"wrap_coarse_param_fraction": 0.5}},
      "run": {"backend": "nccl", "device_type": "cuda", "zero_stage": 3},
      "units": [{"name": "(root)", "params": 9500000}, {"name": "layers.0", "params": 500000}],
      "ranks": [{"steps": 10, "step": 1.0, "optimizer": 0.05, "host_compute": 0.3,
                 "launch": [20, 2],
                 "compute": [["(root)", "forward", 0.2], ["(root)", "backward", 0.4]],
                 "comm": [["(root)", "forward", "all_gather", 1, 19000000, 0.01, 0.01, 0]],
                 "memory": {"capacity": 80e9, "headroom": 60e9}}],
      "copies": 2,
      "stale_ranks": [],
      "ended_ranks": [0, 1],
      "stalls": {"1": {"type": "stall", "state": "stuck", "step": 11, "unit": "layers.0", ...}}
    }

`expect.fires` false: the rule gives no finding at all; true: it does, with `severity` if
given (a pass case may also say `"fires": true, "severity": "info"`). Evidence values are
compared exactly, or within [lo, hi]. `copies` repeats the rank list that many times (ranks
0..N-1). `host_compute` (GPU: the host's launch time of the compute; default: equal to
the compute) and `launch` ([unit compute segments checked, caught up by the device]) are
per step too. A rank's `detail_steps` (fewer than its `steps`) makes a run that samples: the
per-unit rows, `host_compute`, `launch`, `framework` and `unit_framework` (the framework's
time per unit: `[unit, phase, seconds]` rows, part of `framework`) are then per sampled
step and multiplied by `detail_steps` (zerodoc.windowsamples). Unit defaults: stored and gathered
dtype bf16 (2 bytes), group size = world size, reshard after forward. Run defaults: NCCL on
CUDA, FSDP2, ZeRO-3, one node, 80 GB devices.

`python -m zerodoc.cli.rulecase RUN_DIR` prints a case skeleton from a real run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ..runmodel import CommTotals, RankFacts, RankWindow, RunSnapshot, UnitFacts
from ..thresholds import DEFAULT, Thresholds
from ..diagnosis.findings import Finding, Severity

RUN_DEFAULTS = {"local_rank": 0, "node": "node0", "run_id": "case", "framework": "fsdp2",
                "framework_version": "2.13.0", "torch_version": "2.13.0", "device_type": "cuda",
                "backend": "nccl", "zero_stage": 3, "mesh_shape": (), "mesh_dim_names": None,
                "param_dtype": "bfloat16", "reduce_dtype": "bfloat16",
                "device_capacity_bytes": 80 * 10**9, "started_unix": 0.0, "pid": 0}


@dataclass
class Case:
    path: Path | None
    description: str
    code: str
    fires: bool
    severity: Severity | None
    evidence: dict
    snapshot: RunSnapshot
    thresholds: Thresholds = DEFAULT
    link: str | None = None
    device_memory_bytes: int | None = None
    raw: dict = field(default_factory=dict)

    def check(self, findings: list[Finding]) -> list[str]:
        """What is wrong with `findings` for this case ([] = the case passes)."""
        errs = [f"rule error: {f.title}" for f in findings if f.code == "ZD000"]
        mine = [f for f in findings if f.code == self.code]
        if not self.fires:
            return errs + [f"{self.code} fired: {f.severity.name} {f.title}" for f in mine]
        if not mine:
            return errs + [f"{self.code} did not fire (found: "
                           f"{[(f.code, f.severity.name) for f in findings]})"]
        f = mine[0]
        if self.severity is not None and f.severity != self.severity:
            errs.append(f"{self.code} severity {f.severity.name}, expected {self.severity.name}")
        for key, want in self.evidence.items():
            if key not in f.evidence:
                errs.append(f"evidence {key!r} missing (have {sorted(f.evidence)})")
                continue
            got = f.evidence[key]
            if isinstance(want, list) and len(want) == 2 and all(
                    isinstance(x, (int, float)) for x in want) and not isinstance(got, list):
                if not (isinstance(got, (int, float)) and want[0] <= got <= want[1]):
                    errs.append(f"evidence {key}={got!r}, expected within {want}")
            elif got != want:
                errs.append(f"evidence {key}={got!r}, expected {want!r}")
        return errs


def _units(spec: list[dict], world: int) -> tuple[UnitFacts, ...]:
    out = []
    for u in spec:
        params = int(u["params"])
        stored = int(u.get("dtype_bytes", 2))
        gathered = int(u.get("gather_dtype_bytes", stored))
        group = int(u.get("group_size", world))
        out.append(UnitFacts(
            name=u["name"], params=params, param_bytes=int(u.get("param_bytes", params * stored)),
            gather_bytes=int(u.get("gather_bytes", params * gathered)),
            sharded_bytes=int(u.get("sharded_bytes", -(-params // max(1, group)) * stored)),
            reshard_after_forward=u.get("reshard_after_forward", True), group_size=group,
            param_dtype=u.get("param_dtype", "bfloat16"),
            reduce_dtype=u.get("reduce_dtype", "bfloat16"),
            tensors=None if u.get("tensors") is None else int(u["tensors"])))
    return tuple(out)


def _window(facts: RankFacts, r: dict) -> RankWindow:
    steps = int(r.get("steps", 10))
    w = RankWindow(facts=facts, steps=steps, first_step=1, last_step=steps)
    w.step_seconds = float(r.get("step", 0.0)) * steps
    w.last_step_seconds = w.max_step_seconds = float(r.get("step", 0.0))
    w.optimizer_seconds = float(r.get("optimizer", 0.0)) * steps
    w.other_seconds = float(r.get("other", 0.0)) * steps
    # `detail_steps`: per-unit detail on that many sampled steps only (zerodoc.windowsamples); the
    # per-unit rows, host launch time, launch probe and framework time are per sampled step
    n = int(r["detail_steps"]) if "detail_steps" in r else steps
    if "detail_steps" in r:
        w.detail_steps = n
    w.framework_seconds = float(r.get("framework", 0.0)) * n
    w.updated_unix = float(r.get("updated_unix", 0.0))
    for unit, phase, s in r.get("compute", ()):
        w.compute[(unit, phase)] = w.compute.get((unit, phase), 0.0) + float(s) * n
    for unit, phase, s in r.get("unit_framework", ()):  # part of `framework`, per unit
        w.unit_framework[(unit, phase)] = w.unit_framework.get((unit, phase), 0.0) + \
            float(s) * n
    w.host_compute_seconds = float(r.get("host_compute",
                                         sum(w.compute.values()) / n if n else 0)) * n
    checks, caught = r.get("launch", (0, 0))
    w.launch_checks, w.launch_caught_up = int(checks) * n, int(caught) * n
    for row in r.get("comm", ()):
        unit, phase, coll, count, nbytes, secs, exposed = row[:7]
        hidden = row[7] if len(row) > 7 else max(0.0, secs - exposed)
        w.comm.setdefault((unit, phase, coll), CommTotals()).add(CommTotals(
            int(round(count * n)), int(round(nbytes * n)), secs * n, exposed * n, hidden * n))
    w.memory = {k: int(v) for k, v in r.get("memory", {}).items()}
    return w


def snapshot_from_dict(d: dict) -> RunSnapshot:
    ranks = list(d.get("ranks", [])) * int(d.get("copies", 1))
    world = int(d.get("run", {}).get("world_size", len(ranks)))
    units = _units(d.get("units", []), world)
    snap = RunSnapshot(source=d.get("description", "case"))
    for i, r in enumerate(ranks):
        run = {**RUN_DEFAULTS, "world_size": world, "local_world_size": world,
               **d.get("run", {}), **r.get("run", {})}
        run["mesh_shape"] = tuple(run.get("mesh_shape") or ())
        facts = RankFacts(rank=i, units=units, **{k: v for k, v in run.items() if k != "rank"})
        snap.ranks[i] = _window(facts, r)
    snap.stale_ranks = set(d.get("stale_ranks", ()))
    snap.ended_ranks = set(d.get("ended_ranks", ()))
    snap.stalls = {int(k): dict(v) for k, v in d.get("stalls", {}).items()}
    return snap


def load_case(path: str | Path) -> Case:
    path = Path(path)
    d = json.loads(path.read_text())
    exp = d["expect"]
    diag = d.get("diagnose", {})
    thr = Thresholds.with_overrides([f"{k}={v}" for k, v in diag.get("thresholds", {}).items()])
    sev = exp.get("severity")
    return Case(path=path, description=d.get("description", ""), code=exp["code"],
                fires=bool(exp.get("fires", True)),
                severity=Severity.parse(sev) if sev else None,
                evidence=exp.get("evidence", {}), snapshot=snapshot_from_dict(d),
                thresholds=thr, link=diag.get("link"),
                device_memory_bytes=diag.get("device_memory_bytes"), raw=d)


def case_from_snapshot(snap: RunSnapshot, code: str = "ZD000") -> dict:
    """A case skeleton (per-step numbers) from a real snapshot: for recording demo runs."""
    first = snap.any_rank
    f = first.facts
    run = {k: getattr(f, k) for k in ("backend", "device_type", "zero_stage", "world_size",
                                       "local_world_size", "param_dtype", "reduce_dtype",
                                       "device_capacity_bytes")}
    units = [{"name": u.name, "params": u.params, "param_bytes": u.param_bytes,
              "gather_bytes": u.gather_bytes, "sharded_bytes": u.sharded_bytes,
              "reshard_after_forward": u.reshard_after_forward, "group_size": u.group_size,
              "param_dtype": u.param_dtype, "reduce_dtype": u.reduce_dtype,
              **({} if u.tensors is None else {"tensors": u.tensors})} for u in f.units]

    def g(x: float, n: int) -> float:
        return float(f"{x / n:.6g}")

    ranks = []
    for _r, w in sorted(snap.ranks.items()):
        n = w.steps or 1
        ranks.append({
            "steps": w.steps, "step": g(w.step_seconds, n), "optimizer": g(w.optimizer_seconds, n),
            "framework": g(w.framework_seconds, n), "other": g(w.other_seconds, n),
            "host_compute": g(w.host_compute_seconds, n),
            "launch": [g(w.launch_checks, n), g(w.launch_caught_up, n)],
            "compute": [[u, p, g(s, n)] for (u, p), s in w.compute.items()],
            "unit_framework": [[u, p, g(s, n)] for (u, p), s in w.unit_framework.items()],
            "comm": [[u, p, c, g(t.count, n), g(t.bytes, n), g(t.seconds, n),
                      g(t.exposed_seconds, n), g(t.hidden_seconds, n)]
                     for (u, p, c), t in w.comm.items()],
            "memory": dict(w.memory), "updated_unix": w.updated_unix})
    out = {"description": f"recorded from {snap.source}",
           "expect": {"code": code, "fires": True}, "run": run, "units": units,
           "ranks": ranks}
    if snap.ended_ranks:
        out["ended_ranks"] = sorted(snap.ended_ranks)
    if snap.stalls:
        out["stalls"] = {str(r): s for r, s in sorted(snap.stalls.items())}
    return out
