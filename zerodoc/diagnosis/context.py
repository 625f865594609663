"""What every rule reads: the snapshot plus the numbers several rules share.

Two ideas carry the whole engine (docs/rules.md, "How the rules read a run"):

- **Link-attributable time.** A collective finishes at about the same moment on every rank,
  so a rank that arrived early also waited for its peers. Per unit, phase and collective the
  rules use the *smallest* per-step time and exposed time over the ranks (the rank that
  arrived last): what the link and the schedule cost, not a straggler. The straggler rule
  (ZD010) reports the rest as peer wait.
- **Avoidable exposure.** With asynchronous collectives (NCCL; gloo with async unshard) all
  exposed time is avoidable in principle: prefetch could have hidden it. With synchronous
  ones (FSDP2's default on CPU/gloo: `hidden == 0` everywhere) every byte is exposed by
  construction and there is nothing for prefetch to do; only the part beyond what the link
  explains counts as avoidable, where "explains" means: the time the collective would take at
  the slowest bus bandwidth the slow-link rule still accepts (`slow_link_busbw_fraction` of
  the link's expected `thresholds.LINK_BUSBW`). So a healthy gloo run, even on a loaded host,
  has no avoidable exposure, and when a synchronous run has some, the slow-link rule (ZD005)
  or latency-bound tiny collectives (ZD002) name the cause. `expected_seconds` (the time at the
  full expected bandwidth) is what a slow link costs.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from functools import cached_property

from ..catalog import RANK_TOTAL_UNIT
from ..runmodel import RankWindow, RunSnapshot, UnitFacts, busbw
from ..thresholds import DEFAULT, LINK_BUSBW, Thresholds

OFFLOAD_CONFIG_KEYS = ("offload", "cpu_offload", "offload_optimizer", "offload_param",
                       "offload_policy")
HOST_TRANSFERS = ("host_to_device", "device_to_host", "h2d", "d2h")


def infer_link(facts) -> str | None:
    """Link class of a run: configured (`facts.config["link"]`), else a conservative guess
    from the backend (the slowest class that setup could plausibly have)."""
    cfg = facts.config.get("link") if isinstance(facts.config, dict) else None
    if isinstance(cfg, str) and cfg in LINK_BUSBW:
        return cfg
    if facts.backend == "gloo" and facts.device_type == "cpu":
        return "gloo-cpu"
    if facts.backend == "nccl":
        return "pcie" if facts.world_size <= max(1, facts.local_world_size) else "ethernet"
    return None


@dataclass(frozen=True)
class CommView:
    """One (unit, phase, collective), per step, link-attributable (see module docstring)."""

    unit: str
    phase: str
    collective: str
    group_size: int
    count: float
    bytes: float
    seconds: float  # smallest over ranks
    exposed_seconds: float  # smallest over ranks
    hidden_seconds: float
    expected_seconds: float | None  # at the link's expected bus bandwidth
    avoidable_seconds: float  # exposed time the link does not explain (module docstring)

    @property
    def bytes_per_call(self) -> float:
        return self.bytes / self.count if self.count else 0.0

    @property
    def busbw(self) -> float:
        return busbw(self.bytes / self.seconds, self.collective, self.group_size) \
            if self.seconds > 0 else 0.0

    @property
    def exposed_ratio(self) -> float:
        return self.exposed_seconds / self.seconds if self.seconds > 0 else 0.0


def busbw_factor(collective: str, n: int) -> float:
    """busbw / algbw for a collective on n ranks (nccl-tests)."""
    return busbw(1.0, collective, n)


class Context:
    """A snapshot prepared for the rules. Build one per `diagnose()` call."""

    def __init__(self, snapshot: RunSnapshot, thresholds: Thresholds = DEFAULT, *,
                 link: str | None = None, device_memory_bytes: int | None = None,
                 link_profile=None):
        self.snapshot = snapshot
        # a measured link profile (`zerodoc.whatif.linkprofile`, `zerodoc linkprobe`): the
        # step model prices calls beyond the run's sizes with it, as `zerodoc whatif` does
        self.link_profile = link_profile
        self.t = thresholds
        fresh = {r: w for r, w in snapshot.ranks.items() if r not in snapshot.stale_ranks}
        self.ranks: dict[int, RankWindow] = dict(sorted((fresh or snapshot.ranks).items()))
        self.active: dict[int, RankWindow] = {r: w for r, w in self.ranks.items() if w.steps}
        first = next(iter(self.ranks.values()), None)
        self.facts = first.facts if first else None
        self.units: tuple[UnitFacts, ...] = first.facts.units if first else ()
        self.link = link or (infer_link(self.facts) if self.facts else None)
        if self.link is not None and self.link not in LINK_BUSBW:
            from ..errors import UserError

            raise UserError(f"unknown link class {self.link!r}; known: {', '.join(LINK_BUSBW)}")
        self.link_busbw: float | None = LINK_BUSBW.get(self.link) if self.link else None
        self.device_memory_bytes = device_memory_bytes

    # --- static facts (cached: a context is built per diagnosis, its snapshot fixed; the
    # memory rules ask for them once per rank, 81 units x 1,024 ranks otherwise) -----------
    @cached_property
    def total_params(self) -> int:
        return sum(u.params for u in self.units)

    @property
    def group_size(self) -> int:
        sizes = [u.group_size for u in self.units if u.group_size]
        return max(sizes) if sizes else (self.facts.world_size if self.facts else 1)

    @cached_property
    def largest_unit(self) -> UnitFacts | None:
        return max(self.units, key=lambda u: u.params) if self.units else None

    @property
    def gathers_per_unit(self) -> bool:
        """Parameters are all-gathered unit by unit (FSDP, DeepSpeed ZeRO-3), so wrap
        granularity matters. False for DDP / ZeRO-1 (stage < 2) and for DeepSpeed ZeRO-1/2,
        whose only all-gather is one post-step gather of the whole model."""
        if self.facts is None:
            return True
        if self.facts.zero_stage is not None and self.facts.zero_stage < 2:
            return False
        if self.facts.framework == "deepspeed":
            return bool(self.views("all_gather", "forward"))
        return True

    @property
    def block_container(self) -> str | None:
        """Where the model keeps its repeated blocks, as a wrap fix names it ("blocks" for
        `model.blocks`; "" for the model itself): recorded by the shim at attach time, else
        read off the unit names ("layers.3", "layers.3.mlp.fc1" -> "layers"); None when
        unknown."""
        cfg = self.facts.config if self.facts is not None and \
            isinstance(self.facts.config, dict) else {}
        if isinstance(cfg.get("block_container"), str):
            return cfg["block_container"]
        seen: dict[str, int] = {}
        for u in self.units:
            parts = u.name.split(".")
            for i, part in enumerate(parts):
                if part.isdigit():
                    key = ".".join(parts[:i])
                    seen[key] = seen.get(key, 0) + 1
                    break
        return max(seen, key=seen.get) if seen else None

    def blocks_expr(self) -> str:
        """`model.blocks` (or a placeholder naming what to fill in) for fix texts."""
        c = self.block_container
        if c is None:
            return "<your model's list of blocks>"
        return f"model.{c}" if c else "model"

    @cached_property
    def zero3(self) -> bool:
        """Parameters are resharded after forward (ZeRO-3-like) on some unit."""
        if self.facts is None:
            return False
        return self.facts.zero_stage == 3 or any(u.reshard_after_forward for u in self.units)

    # --- per-step numbers -----------------------------------------------------------
    def median(self, values) -> float:
        values = list(values)
        return statistics.median(values) if values else 0.0

    @cached_property
    def step_seconds(self) -> float:
        """Median over ranks of the mean step time."""
        return self.median(w.mean_step_seconds for w in self.active.values())

    @cached_property
    def compute_seconds(self) -> float:
        """Median over ranks of compute per step."""
        return self.median(w.compute_seconds / w.steps for w in self.active.values())

    def per_step(self, w: RankWindow, x: float) -> float:
        return x / w.steps if w.steps else 0.0

    @cached_property
    def unit_stats(self):
        """Per-unit numbers across the active ranks (zerodoc.unitstats), computed once."""
        from ..unitstats import unit_stats

        return unit_stats(self.snapshot, list(self.active))

    @cached_property
    def sync(self) -> bool:
        """All-gathers are synchronous: not one second of them was ever hidden."""
        return self.unit_stats.sync

    @cached_property
    def _views(self) -> list[CommView]:
        groups = {u.name: u.group_size for u in self.units}
        stats = self.unit_stats.comm
        out = []
        for key in sorted(stats):
            unit, phase, coll = key
            if unit == RANK_TOTAL_UNIT:  # a coarse rank's totals: no unit to attribute
                continue
            s = stats[key]
            if s["count"].n == 0:
                continue
            n = groups.get(unit) or (self.facts.world_size if self.facts else 1)
            count, nbytes = s["count"].median, s["bytes"].median
            seconds, exposed, hidden = s["seconds"].min, s["exposed"].min, s["hidden"].min
            expected = None
            if self.link_busbw and n > 1:
                expected = nbytes * busbw_factor(coll, n) / self.link_busbw
            avoidable = exposed
            if self.sync and expected is not None:
                explained = expected / max(self.t.slow_link_busbw_fraction, 1e-9)
                avoidable = max(0.0, exposed - explained)
            out.append(CommView(unit, phase, coll, n, count, nbytes, seconds, exposed, hidden,
                                expected, avoidable))
        return out

    def views(self, collective: str | None = None, phase: str | None = None) -> list[CommView]:
        return [v for v in self._views
                if (collective is None or v.collective == collective)
                and (phase is None or v.phase == phase)]

    # --- memory ---------------------------------------------------------------------
    def capacity(self, w: RankWindow) -> int | None:
        if self.device_memory_bytes:
            return int(self.device_memory_bytes)
        cap = w.memory.get("capacity") or w.facts.device_capacity_bytes
        return int(cap) if cap else None

    def peak(self, w: RankWindow) -> int | None:
        """Peak memory this rank used against its capacity: the allocator's peak reserved on
        a GPU, else what the shim's headroom implies (capacity - headroom), else peak RSS."""
        m = w.memory
        if m.get("peak_reserved"):
            return int(m["peak_reserved"])
        if "headroom" in m and m.get("capacity"):
            return int(m["capacity"] - m["headroom"])
        if m.get("process_peak_resident"):
            return int(m["process_peak_resident"])
        return None

    def headroom_fraction(self, w: RankWindow) -> float | None:
        cap, peak = self.capacity(w), self.peak(w)
        return (cap - peak) / cap if cap and peak is not None else None

    def model_state_bytes(self, w: RankWindow) -> int:
        m = w.memory
        return int(m.get("sharded_parameters", 0) + m.get("gradients", 0)
                   + m.get("optimizer_state", 0))

    def activation_bytes(self, w: RankWindow) -> int | None:
        """Measured activations if the shim reports them; on a GPU estimated as peak
        allocated - model states (`activations_and_buffers`) - the ZeRO-3 transient (largest
        unit gathered, x2 with prefetch); unknown (None) otherwise (CPU)."""
        m = w.memory
        if m.get("activations"):
            return int(m["activations"])
        big = self.largest_unit
        transient = 2 * big.gather_bytes if big is not None and self.zero3 else 0
        if m.get("activations_and_buffers"):  # the GPU shim: peak allocated - model states
            return max(0, int(m["activations_and_buffers"]) - transient)
        if m.get("peak_allocated"):
            return max(0, int(m["peak_allocated"]) - self.model_state_bytes(w) - transient)
        return None

    # --- the planner's inputs, from the run -----------------------------------------
    def optimizer_bytes_measured(self, w: RankWindow) -> float | None:
        """Optimizer state bytes per parameter as the run measured it (the shim's
        `optimizer_state` over its sharded parameters), or None when it reports neither."""
        sharded, opt = w.memory.get("sharded_parameters"), w.memory.get("optimizer_state")
        if not (sharded and opt) or not self.units or self.total_params <= 0:
            return None
        p_bytes = max(1, round(sum(u.param_bytes for u in self.units) / self.total_params))
        return min(max(round(opt / (sharded / p_bytes), 2), 0.0), 1024.0)

    def plan_input(self, **overrides):
        """A `planner.PlanInput` describing this run — the one planner input of the rules,
        of `zerodoc whatif` and of `zerodoc plan --run` — with measured activations and
        optimizer state when the shim reports them (None when the facts are too thin).
        Without a measured optimizer state K is Adam's: 8 bytes per parameter when the
        stored parameters are fp32 (their own master copy: m + v), else 12
        (`planner.PRESETS` adam-fp32 / adam-mixed)."""
        from ..planner import PlanInput, dtype_bytes

        if not self.units or self.total_params <= 0 or self.facts is None:
            return None
        psi = self.total_params
        p_bytes = max(1, round(sum(u.param_bytes for u in self.units) / psi))
        g_bytes = max(1, round(sum(u.gather_bytes for u in self.units) / psi))
        try:
            r_bytes = dtype_bytes(self.facts.reduce_dtype) if self.facts.reduce_dtype \
                else g_bytes
        except Exception:  # noqa: BLE001 - an exotic dtype name: assume the gather dtype
            r_bytes = g_bytes
        w = next(iter(self.active.values()), None) or next(iter(self.ranks.values()))
        k = self.optimizer_bytes_measured(w)
        if k is None:
            k = 8.0 if p_bytes >= 4 else 12.0
        act = self.activation_bytes(w)
        known = [u.reshard_after_forward for u in self.units
                 if u.params > 0 and u.reshard_after_forward is not None]
        kw = dict(params=psi, world_size=max(1, self.group_size), activation_bytes=act,
                  reshard_after_forward=not known or any(known),
                  optimizer_bytes_per_param=k, param_bytes=p_bytes,
                  grad_bytes=p_bytes, gather_bytes=g_bytes, reduce_bytes=r_bytes,
                  device_memory_bytes=self.capacity(w),
                  largest_unit_params=self.largest_unit.params if self.largest_unit else None)
        known = [u.reshard_after_forward for u in self.units if u.reshard_after_forward is not None]
        if known and not any(known):  # ZeRO-2-like FSDP: gathered parameters kept to backward
            kw["reshard_after_forward"] = False
        kw.update(overrides)
        return PlanInput(**kw)

    @property
    def stage(self) -> str:
        """The planner's name for the run's stage: zero3 when parameters are resharded."""
        if self.zero3:
            return "zero3"
        z = self.facts.zero_stage if self.facts else None
        return {1: "zero1", 2: "zero2"}.get(z, "dp")

    @property
    def offload(self) -> bool:
        """CPU offload is on (the adapter says so, or host-resident state is reported)."""
        for w in self.ranks.values():
            cfg = w.facts.config if isinstance(w.facts.config, dict) else {}
            for key in OFFLOAD_CONFIG_KEYS:
                v = cfg.get(key)
                if v and str(v).lower() not in ("false", "none", "0", "off"):
                    return True
            if w.memory.get("offloaded_bytes", 0) > 0 or \
                    w.memory.get("host_optimizer_state", 0) > 0:
                return True
        return False
