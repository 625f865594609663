"""A step model fitted to a measured run, and what it predicts for a changed configuration.

Per rank: the measured compute of every unit and phase (per step), the measured time outside
the units (optimizer, framework, other, zerodoc's own), and for every unit its collectives
(calls and bytes per call, per phase). Per collective kind and group size one link model
fitted to the run's own calls (`linkfit`). The framework's ordering semantics decide where
the compute waits (docs/whatif.md, docs/gpus.md):

- forward: units in order, each all-gathers its parameters before its compute; synchronous
  unshard (FSDP2's default on gloo) issues the all-gather when the unit starts, so all of it
  is exposed; asynchronous unshard with prefetch depth d issues unit i's all-gather when unit
  i-d starts computing. Collectives of one process group run one after the other.
- backward: units in reverse order; with reshard after forward each unit all-gathers again
  (prefetched like forward); after its compute the unit reduce-scatters its gradients:
  synchronously (gloo: the compute waits) or asynchronously (waited for at the next unit's
  post-backward and at the end of backward).
- the step: forward + backward + optimizer + framework + other + zerodoc's own time. The
  framework's time (FSDP's copy-in / copy-out and bookkeeping) is priced per unit: a part
  per collective call and a part per byte the unit's collectives move, fitted over the run's
  units (`FrameworkFit`: the run log records the framework's time per unit); a run log
  without it (older zerodoc) gives one total per step, priced per byte, its range reaching
  a cost per call.

`replay()` of the unchanged configuration must reproduce the measured step (its own check,
shown with every answer).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import partial

import numpy as np

from ..catalog import RANK_TOTAL_UNIT
from ..errors import UserError
from ..runmodel import RunSnapshot
from .linkfit import LinkFit, _wls, fit_links, links_from_points, seq_sum, wire_factor
from .linkprofile import LinkProfile, ProfileLink
from . import unitgrid
from .unitgrid import UnitGrid
from .unittable import Tables, rank_rows

GATHER = ("all_gather",)
# The ranges are about 95 % intervals: two standard errors (of the link fit at each call's
# size, and of the measured mean step) either side.
Z = 2.0
REDUCE = ("reduce_scatter", "all_reduce")
# A model keeps what every replay asks of every rank's units (`StepModel._per_rank`), and a
# fit keeps the last fit's part read from the per-unit numbers while they are unchanged
# (`UnitPart`); False rebuilds both on each ask, as before (bench/tui_render.py --no-cache;
# the tests compare both)
MEMO = True
# The per-unit part read from every rank's arrays at once (`unittable`); False: from each
# rank's dicts, one row at a time (the witness the tests compare it with)
FAST = True


@dataclass
class UnitModel:
    """One unit of one rank, per step."""

    name: str
    params: int
    forward_s: float = 0.0
    backward_s: float = 0.0
    # phase -> collective -> [calls per step, bytes per call, measured seconds per step]
    comm: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    group: dict[str, int] = field(default_factory=dict)  # collective -> group size
    parts: tuple[str, ...] = ()  # a merged unit: the measured units it is made of
    tensors: int | None = None  # parameter tensors (None: the run did not record them)
    # `_calls` / `_bytes_moved` / `_largest_call` by (what, reshard): a unit's collectives are
    # not changed once it is built (`_rank_units`, `_merge`); a fit asks each ~4 times per
    # rank and unit, and the units are kept from fit to fit (`UnitPart`)
    sums: dict = field(default_factory=dict, repr=False, compare=False)

    def calls(self) -> float:
        return sum(v[0] for p in self.comm.values() for v in p.values())


@dataclass(frozen=True)
class FrameworkFit:
    """The framework's time of a unit per step = calls x (per_call_s + bytes per call x
    per_byte_s + the unit's parameter tensors x per_tensor_s), fitted by weighted least
    squares over the units (`fit_framework`): one point per unit with collectives, (bytes
    per call, tensors, framework seconds per call), weighted by its calls. `se_call_s` is
    the standard error of the fit at the mean size and tensor count (`mean_bytes` per
    call, `mean_tensors`), `se_per_byte_s` / `se_per_tensor_s` the slopes', `cov_byte_tensor`
    their covariance; `rest_s` the framework time per step that belongs to no unit with
    collectives (carried as it is). `per_tensor_s` 0 with `tensor_note` saying why: the run
    did not record the units' tensor counts, or they do not vary apart from the bytes
    enough to part a cost per tensor (`linkfit._wls`, per call + per byte, then)."""

    per_call_s: float
    per_byte_s: float
    se_call_s: float
    se_per_byte_s: float
    mean_bytes: float
    units: int
    rest_s: float
    ranks: int = 1
    per_tensor_s: float = 0.0
    se_per_tensor_s: float = 0.0
    mean_tensors: float = 0.0
    cov_byte_tensor: float = 0.0
    tensor_note: str = ""
    max_bytes: float = 0.0  # the fit's largest unit (its bytes per call, as the fit's x)
    max_call_bytes: float = 0.0  # the run's largest single call among the fit's units
    per_byte_avg_s: float = 0.0  # the run's framework time per byte over its units
    # the framework time per step its units measured (`rest_s`: the rank's total beyond it)
    units_s: float = 0.0

    @property
    def per_tensor(self) -> bool:
        """Fitted with a part per tensor."""
        return not self.tensor_note

    def unit_seconds(self, calls: float, nbytes: float, bound: float = 0,
                     tensors: float | None = None, largest_call: float | None = None) -> float:
        """A unit's framework time per step (`calls` per step moving `nbytes` in all, of
        `tensors` parameter tensors: None, not recorded, prices the fit's mean); `bound`
        -Z / +Z: the low / high end (Z standard errors of the fit at its size).
        `largest_call`: the unit's largest single call, bytes; beyond the run's largest
        (`beyond`) the line is an extrapolation, and the framework's cost per byte can grow
        there (FSDP2's copies into fresh 3.16 MB buffers cost 2-3x per byte what 2.1 MB ones
        did inside a training step, docs/whatif.md): the high end then prices the bytes past
        the fit's largest unit at the run's average framework time per byte (per call, per
        tensor and per byte together), from the line's point at that unit on (continuous
        where the unit stops being beyond)."""
        if calls <= 0:
            return 0.0
        x = nbytes / calls
        dx = x - self.mean_bytes
        t = self.mean_tensors if tensors is None or not self.per_tensor else tensors
        dt = t - self.mean_tensors
        var = self.se_call_s ** 2 + (dx * self.se_per_byte_s) ** 2 + \
            (dt * self.se_per_tensor_s) ** 2 + 2 * dx * dt * self.cov_byte_tensor
        se = math.sqrt(max(0.0, var))
        line = calls * max(0.0, self.per_call_s + x * self.per_byte_s +
                           t * self.per_tensor_s + bound * se)
        if bound > 0 and largest_call is not None and self.beyond(largest_call):
            at_max = self.per_call_s + self.max_bytes * self.per_byte_s + t * self.per_tensor_s
            return max(line, calls * (at_max + (x - self.max_bytes) * self.per_byte_avg_s))
        return line

    def beyond(self, largest_call: float) -> bool:
        """Whether a call of this many bytes is larger than any of the run's units made (as
        `StepModel.beyond_sizes` judges the link's calls)."""
        return self.max_call_bytes > 0 and largest_call > self.max_call_bytes * (1 + 1e-9)


def _framework_points(units: list[UnitModel], per_unit: dict[str, float]) -> list:
    """(bytes per call, framework seconds per call, calls, parameter tensors or None) of
    each unit with collectives whose framework time was recorded."""
    pts = []
    for u in units:
        s = per_unit.get(u.name)
        calls, nbytes = _kept(u, "all_calls", None, u.calls), _bytes_moved(u)
        if s is not None and calls > 0 and nbytes > 0:
            pts.append((nbytes / calls, s / calls, calls, u.tensors))
    return pts


def _wls2(x1, x2, ys, ws):
    """Weighted least squares y = a + b (x1 - m1) + c (x2 - m2) (m: the weighted means);
    (a, b, c, residual sd, se_a, se_b, se_c, cov_bc, m1, m2), or None where the two do not
    part (x2 within ~5 % of a line in x1, or fewer than 4 points)."""
    k = len(ys)
    x1, x2, ys, ws = (np.asarray(v, np.float64) for v in (x1, x2, ys, ws))
    sw = seq_sum(ws)
    if k < 4 or sw <= 0:
        return None
    m1 = seq_sum(ws * x1) / sw
    m2 = seq_sum(ws * x2) / sw
    my = seq_sum(ws * ys) / sw
    d1 = x1 - m1
    d2 = x2 - m2
    s11 = seq_sum(ws * d1 * d1)
    s22 = seq_sum(ws * d2 * d2)
    s12 = seq_sum(ws * d1 * d2)
    det = s11 * s22 - s12 * s12
    # x2's spread left once x1's line is taken out of it: s22 (1 - r^2)
    if s11 <= 0 or det <= (0.05 * m2) ** 2 * sw * s11:
        return None
    s1y = seq_sum(ws * d1 * (ys - my))
    s2y = seq_sum(ws * d2 * (ys - my))
    b = (s22 * s1y - s12 * s2y) / det
    c = (s11 * s2y - s12 * s1y) / det
    res = ys - (my + b * d1 + c * d2)
    resid = math.sqrt(seq_sum(ws * res * res) / sw * k / (k - 3))
    # resid is the sd of a point of mean weight (the weights scaled to mean 1, w / scale):
    # cov = resid^2 (X'(W / scale)X)^-1 = resid^2 scale (X'WX)^-1, as `linkfit._wls`
    scale = sw / k
    var = resid * resid * scale
    return (my, b, c, resid, resid / math.sqrt(k), math.sqrt(var * s22 / det),
            math.sqrt(var * s11 / det), -var * s12 / det, m1, m2)


def fit_framework(ranks: list[tuple[list[UnitModel], dict[str, float], float]]
                  ) -> list[FrameworkFit | None]:
    """The per-call + per-tensor + per-byte fit of the framework time per unit, one per rank
    (`ranks`: each rank's units, framework seconds per step by unit name, and its framework
    total per step). The parts' ratios are fitted over every rank's units together (the
    same framework code on every rank: more points part them better, a rank's noisy units
    weigh less); each rank's level is its own (the fitted line scaled so that its units sum
    to what they measured: the replay of the run stays exact). The part per tensor only
    where every unit's tensor count was recorded and the counts vary apart from the bytes
    (`_wls2`) with every part fitted >= 0; else per call + per byte (`linkfit._wls`), the
    fit saying why. None for a rank without framework time per unit, when fewer than 3 units
    per rank had any, or when the units are of one size (within ~5 %): too few sizes to part
    the two."""
    return fit_framework_points([
        (tuple(zip(*_framework_points(units, per_unit))) or ((), (), (), ()),
         max((_largest_call(u) for u in units if u.name in per_unit), default=None), t)
        for units, per_unit, t in ranks])


def fit_framework_points(ranks: list[tuple[tuple, float | None, float]]
                         ) -> list[FrameworkFit | None]:
    """`fit_framework` from each rank's points (`_framework_points` as columns: bytes per
    call, framework seconds per call, calls, parameter tensors or None), the largest call
    among its units with framework time (None: none) and its framework total per step.
    Over every rank's units with numpy, each sum left to right as the Python sums took it
    (`seq_sum`: the same floats)."""
    per_rank = [pts for pts, _top, _t in ranks]
    sizes = [len(p[0]) for p in per_rank]
    if not any(sizes) or min(n for n in sizes if n) < 3:
        return [None] * len(ranks)
    xs, ys, ws = (np.concatenate([np.asarray(p[i], np.float64) for p in per_rank])
                  for i in range(3))
    ts = [t for p in per_rank for t in p[3]]
    sw = seq_sum(ws)
    mean_x = seq_sum(xs * ws) / sw
    if seq_sum(ws * (xs - mean_x) ** 2) <= (0.05 * mean_x) ** 2 * sw:
        # units of one size (within ~5 %) cannot part a cost per call from one per byte: a
        # fit would price it per call only, with no range; the per-step pricing (per byte,
        # the range to per call) says what is known
        return [None] * len(ranks)
    a, b, _resid, se_a, se_b, mx = _wls(xs, ys, ws)
    c = se_c = cov = mt = 0.0
    note = ("the units' parameter tensor counts are not known; run logs of FSDP2 and FSDP1 "
            "runs record them, Prometheus, the endpoints and traces do not")
    known = None not in ts
    if known and min(n for n in sizes if n) < 4:
        # three parts through three units: an exact fit, no degree of freedom left
        note = "fewer than 4 units per rank: too few to part a cost per tensor"
    elif known:
        note = "the units' tensor counts do not vary apart from their bytes"
        two = _wls2(xs, np.array(ts, np.float64), ys, ws)
        if two is not None:
            a2, b2, c2, _r, se_a2, se_b2, se_c2, cov2, m1, m2 = two
            if b2 >= 0 and c2 >= 0 and a2 - b2 * m1 - c2 * m2 >= 0:
                # the fit at the means -> its parts: per call (at 0 bytes, 0 tensors)
                a, b, c = a2 - b2 * m1 - c2 * m2, b2, c2
                se_a, se_b, se_c, cov, mx, mt, note = se_a2, se_b2, se_c2, cov2, m1, m2, ""
            else:
                note = "a part fitted negative with a part per tensor"
    # The ranks have the same units at the same sizes: their points are not independent
    # measurements of the line. The standard errors are those of one rank's units (U points,
    # U - 2 degrees of freedom), not of the P pooled points, whose shrink as
    # 1 / sqrt(P - 2): scaled back by sqrt((P - 2) / (U - 2)) (exact for identical ranks; for
    # ranks whose noise is independent, on the safe side).
    ranks_pooled = sum(1 for n in sizes if n)
    n_units = max(sizes)
    dof = 2 if note else 3
    widen = math.sqrt(max(1, len(xs) - dof) / max(1, n_units - dof))
    se_a, se_b, se_c, cov = se_a * widen, se_b * widen, se_c * widen, cov * widen ** 2
    tz = np.array([t or 0 for t in ts], np.float64)
    out: list[FrameworkFit | None] = []
    start = 0
    for n_pts, (_pts, top, total) in zip(sizes, ranks):
        x, y, n, t = (v[start:start + n_pts] for v in (xs, ys, ws, tz))
        start += n_pts
        measured = seq_sum(y * n)
        line = seq_sum(n * (a + b * x + c * t))
        if n_pts < 3 or measured <= 0 or line <= 0:
            out.append(None)
            continue
        k = measured / line
        out.append(FrameworkFit(k * a, k * b, k * se_a, k * se_b, mx, n_pts,
                                max(0.0, total - measured), ranks_pooled,
                                per_tensor_s=k * c, se_per_tensor_s=k * se_c,
                                mean_tensors=mt, cov_byte_tensor=k * k * cov,
                                tensor_note=note, max_bytes=float(x.max()),
                                max_call_bytes=top,
                                per_byte_avg_s=measured / seq_sum(x * n),
                                units_s=measured))
    return out


@dataclass
class RankModel:
    rank: int
    # its units (`units`), or what builds them when first read (`UnitGrid.units`: the
    # replays read every rank's figures from the grid, the objects of a few ranks only)
    units_src: object
    optimizer_s: float
    framework_s: float
    other_s: float
    self_s: float
    measured_step_s: float
    measured_exposed_s: float
    step_times: list[float]
    # the exposed communication of each step that measured it (empty: the source has no
    # per-step figures)
    exposed_times: list[float] = field(default_factory=list)
    # the framework's time per unit, fitted per call + per byte (None: the run log has it
    # per step only, an older zerodoc: priced per byte of the step's total)
    framework_fit: FrameworkFit | None = None
    framework_per_unit: bool = False  # the run recorded it per unit (fit or not)
    # the ranks' arrival spread at the collectives: this rank's wait inside its (exposed)
    # collectives for a later peer beyond its mean compute deficit, per collective call
    # (`arrival_wait`), and the calls per step it was measured over
    arrival_wait_per_call_s: float = 0.0
    arrival_calls: float = 0.0

    @property
    def units(self) -> list[UnitModel]:
        if callable(self.units_src):
            self.units_src = self.units_src()
        return self.units_src

    @property
    def framework_per_call_s(self) -> float:
        n = sum(u.calls() for u in self.units)
        return self.framework_s / n if n else 0.0

    @property
    def framework_per_byte_s(self) -> float:
        n = sum(_bytes_moved(u) for u in self.units)
        return self.framework_s / n if n else 0.0


@dataclass(frozen=True)
class Changes:
    """A changed configuration; None / 1.0: as measured."""

    reshard_after_forward: bool | None = None
    prefetch: int | None = None  # 0: synchronous unshard; d >= 1: async, prefetch depth d
    merge: int | str | None = None  # K: every K consecutive units; "blocks": per block
    world_size: int | None = None
    latency_scale: float = 1.0
    latency_add_s: float = 0.0
    latency_set_s: float | None = None
    latency_set_low_s: float | None = None  # a set latency's range reaches down to this
    bandwidth_scale: float = 1.0
    bandwidth_set: float | None = None  # bytes/s (bus bandwidth)
    latency_kind: str | None = None  # the collective the latency change is for (None: all)
    bandwidth_kind: str | None = None
    micro_batch_scale: float = 1.0

    def describe(self) -> list[str]:
        out = []
        if self.reshard_after_forward is not None:
            out.append(f"reshard after forward {'on' if self.reshard_after_forward else 'off'}")
        if self.prefetch is not None:
            out.append("synchronous unshard, no prefetch" if self.prefetch == 0
                       else f"asynchronous unshard, prefetch depth {self.prefetch}")
        if self.merge is not None:
            out.append("units merged per block" if self.merge == "blocks"
                       else f"every {self.merge} consecutive units merged")
        if self.world_size is not None:
            out.append(f"world size {self.world_size}")
        kind = lambda k: f" ({k})" if k else ""  # noqa: E731
        if self.latency_set_s is not None:
            low = ("" if self.latency_set_low_s is None else
                   f", range from {self.latency_set_low_s * 1e3:g} ms")
            out.append(f"latency set to {self.latency_set_s * 1e3:g} ms{low}"
                       f"{kind(self.latency_kind)}")
        if self.latency_scale != 1.0:
            out.append(f"latency x{self.latency_scale:g}{kind(self.latency_kind)}")
        if self.latency_add_s:
            out.append(f"latency {self.latency_add_s * 1e3:+g} ms{kind(self.latency_kind)}")
        if self.bandwidth_set is not None:
            out.append(f"bandwidth set to {self.bandwidth_set / 1e9:g} GB/s"
                       f"{kind(self.bandwidth_kind)}")
        if self.bandwidth_scale != 1.0:
            out.append(f"bandwidth x{self.bandwidth_scale:g}{kind(self.bandwidth_kind)}")
        if self.micro_batch_scale != 1.0:
            out.append(f"micro-batch x{self.micro_batch_scale:g}")
        return out or ["none (the measured configuration)"]


@dataclass
class Replay:
    """One replayed step of one rank: seconds per step."""

    step_s: float
    exposed_s: float
    compute_s: float
    comm_s: float
    overhead_s: float
    exposed_by_unit: dict[str, float]
    peer_wait_s: float = 0.0  # of the worst rank, in its exposed time
    framework_s: float = 0.0  # the framework's time, in `overhead_s`
    # of the worst rank, in `peer_wait_s`: the arrival spread's part (`arrival_wait`)
    arrival_wait_s: float = 0.0


@dataclass
class Semantics:
    framework: str
    sync_unshard: bool
    sync_reduce: bool
    prefetch: int  # depth (0 with synchronous unshard)
    reshard_after_forward: bool


class StepModel:
    """The model of one run. Build with `fit(snapshot)`."""

    def __init__(self, snapshot: RunSnapshot, ranks: list[RankModel], links, sem: Semantics,
                 world_size: int, block_container: str | None, steps: int):
        self.snapshot = snapshot
        self.ranks = ranks
        self.links: dict[tuple[str, int], LinkFit] = links
        self.semantics = sem
        self.world_size = world_size
        self.block_container = block_container
        self.steps = steps  # steps with per-unit detail the model was fitted to (min rank)
        # a measured link profile (`linkprofile`, `--link-profile`): its shape prices the
        # calls beyond the run's largest; None: the fitted line is extended
        self.profile: LinkProfile | None = None
        self._profile_links: dict = {}  # (collective, fit) -> ProfileLink, built once
        # What every replay of a change asks of every rank's units, built once per model
        # (a fitted model's units are never changed; a diagnosis replays ~10 times): (what,
        # merge, reshard) -> per rank, in `ranks` order (`_per_rank`)
        self._memo: dict = {}
        # every rank's per-unit figures over ranks x units (`unitgrid`, the fit's part):
        # what the replays ask of every rank's units as measured; None: from the units
        self.grid: UnitGrid | None = None

    # --- the link -----------------------------------------------------------------------
    def link(self, coll: str, n: int) -> LinkFit | None:
        if (coll, n) in self.links:
            return self.links[(coll, n)]
        same = [f for (c, _), f in self.links.items() if c == coll]
        return same[0] if same else None

    def call_seconds(self, coll: str, nbytes: float, n: int, ch: Changes, bound: float,
                     measured: float | None) -> float:
        f = self.link(coll, n)
        if f is None:
            return measured or 0.0
        kw = {}
        if ch.latency_kind in (None, coll):
            kw.update(latency_scale=ch.latency_scale, latency_add=ch.latency_add_s,
                      latency_set=ch.latency_set_s, latency_set_low=ch.latency_set_low_s)
        if ch.bandwidth_kind in (None, coll):
            kw.update(bandwidth_scale=ch.bandwidth_scale, bandwidth_set=ch.bandwidth_set)
        n = ch.world_size or n
        pl = self.profile_link(coll, ch, f)
        if pl is not None and n > 1 and pl.beyond_bytes(nbytes):
            # beyond the run's largest call (in bytes per call: a world size changed alone
            # keeps the calls' sizes, and the line prices its wire bytes): the line at the
            # run's largest call, plus the profile's increase from there, both in the fit's
            # group's wire bytes (a changed bandwidth scales the increase as it scales the
            # line's part per byte)
            at_max = f.seconds(f.max_bytes, n, bound=bound, **kw)
            x = nbytes * (wire_factor(coll, f.group_size) or 1.0)
            return at_max + pl.increment(x, bound) / kw.get("bandwidth_scale", 1.0)
        return f.seconds(nbytes, n, bound=bound, **kw)

    def profile_link(self, coll: str, ch: Changes = Changes(),
                     f: LinkFit | None = None) -> ProfileLink | None:
        """The profile's shape for `coll` beyond the run's sizes, anchored to the fit `f`
        that prices the call (default: the fit at the profile's group size), or None: no
        profile, no curve of that collective in it, or a bandwidth set by the change (a link
        with no measured shape: the line)."""
        if self.profile is None or coll not in self.profile.curves:
            return None
        if ch.bandwidth_set is not None and ch.bandwidth_kind in (None, coll):
            return None
        if f is None:
            f = self.link(coll, self.profile.group_size)
        if f is None or f.group_size <= 1:
            return None
        key = (coll, f)
        if key not in self._profile_links:  # every priced call asks: one per fit
            self._profile_links[key] = ProfileLink(f, self.profile.curves[coll], Z)
        return self._profile_links[key]

    def beyond_sizes(self, ch: Changes) -> list[dict]:
        """Per collective whose calls after the change are larger (in wire bytes) than the
        run's largest: how much larger, and how they are priced (`link_model`)."""
        reshard = self._reshard(ch)
        # (collective, the run's group size) -> the largest bytes per call after the change:
        # "beyond" is in bytes per call (a world size changed alone keeps the calls' sizes)
        key = ("beyond", ch.merge, reshard, ch.world_size)  # every rank's rows: once
        top: dict[tuple[str, int], float] | None = self._memo.get(key) if MEMO else None
        if top is None:
            top = {}
            if MEMO:
                self._memo[key] = top
            if ch.merge is None and self.grid is not None:
                top.update(self.grid.top_bytes(reshard, ch.world_size))
            else:
                self._top_bytes(ch, reshard, top)
        out = []
        for (c, g), nbytes in sorted(top.items()):
            f = self.link(c, g)
            if f is None or f.max_bytes <= 0 or f.group_size <= 1:
                continue
            wf = wire_factor(c, f.group_size)
            x, x_max = nbytes * wf, f.max_bytes * wf
            if nbytes <= f.max_bytes * (1 + 1e-9):
                continue
            pl = self.profile_link(c, ch, f)
            row = {"collective": c, "group_size": f.group_size,
                   "largest_measured_bytes": f.max_bytes, "largest_predicted_bytes": nbytes,
                   "largest_measured_wire_bytes": x_max, "largest_predicted_wire_bytes": x,
                   "ratio": x / x_max, "priced_by": "line" if pl is None else "profile"}
            if pl is not None:
                s, lo, hi = pl.scale
                row.update(profile_scale=s, profile_scale_range=[lo, hi],
                           beyond_profile=x > pl.curve.max_wire * (1 + 1e-9))
            out.append(row)
        return out

    def _top_bytes(self, ch: Changes, reshard: bool, top: dict) -> None:
        """`beyond_sizes`' largest bytes per call by (collective, group size), from every
        rank's units after the change (`UnitGrid.top_bytes`: the same as measured)."""
        for us in self._per_rank("units", ch):
            for u in us:
                # `_rows`: the row it adds with resharding on is the forward all-gather's
                # (its size counted there), the rows it drops the backward all-gathers
                for phase, colls in u.comm.items():
                    drop = phase == "backward" and not reshard
                    for c, (calls, nbytes, _s) in colls.items():
                        if calls <= 0 or drop and c in GATHER:
                            continue
                        g = u.group.get(c, self.world_size)
                        if (ch.world_size or g) > 1 and nbytes > top.get((c, g), 0.0):
                            top[c, g] = nbytes

    # --- the units after a change ---------------------------------------------------------
    def _per_rank(self, what: str, ch: Changes, reshard: bool | None = None):
        """Once per model and change of the units (`ch.merge`, `reshard`): "units" each rank's
        units after the change, "slowest" their `_slowest`, "calls" each rank's calls per step,
        "deficit" each rank's `_deficit` against the slowest. At 1,024 ranks x 81 units each
        was rebuilt by every replay (4-6 per answer, an answer per rule)."""
        key = (what, ch.merge, reshard)
        got = self._memo.get(key) if MEMO else None
        grid = self.grid if ch.merge is None else None  # the units as measured: the grid's
        if got is None:
            if grid is not None and what != "units":
                got = self._from_grid(grid, what, reshard)
            elif what == "units":
                got = [self._merged(rm, ch) for rm in self.ranks]
            elif what == "slowest":
                got = _slowest(self._per_rank("units", ch))
            elif what == "calls":
                got = [sum(_calls(u, reshard) for u in us) for us in self._per_rank("units", ch)]
            else:  # "deficit"
                slowest = self._per_rank("slowest", ch)
                got = [_deficit(slowest, us) for us in self._per_rank("units", ch)]
            if MEMO:
                self._memo[key] = got
        return got

    def _from_grid(self, grid: UnitGrid, what: str, reshard: bool | None):
        """`_per_rank` of the units as measured from every rank's figures (`unitgrid`):
        the same floats, without every rank's unit objects."""
        if what == "slowest":
            f, b = grid.slowest()
            return [replace(u, forward_s=fs, backward_s=bs)
                    for u, fs, bs in zip(self.ranks[0].units, f.tolist(), b.tolist())]
        if what == "calls":
            return grid.rank_calls(reshard)
        return grid.deficits()

    def _units(self, rm: RankModel, ch: Changes) -> list[UnitModel]:
        if ch.merge is None:
            return rm.units
        for i, r in enumerate(self.ranks):
            if r is rm:
                return self._per_rank("units", ch)[i]
        return self._merged(rm, ch)

    def _merged(self, rm: RankModel, ch: Changes) -> list[UnitModel]:
        units = rm.units
        if ch.merge is None:
            return units
        root, rest = units[0], units[1:]
        if ch.merge == "blocks":
            c = self.block_container
            if c is None:
                raise UserError("--merge blocks: the run does not say where its blocks are "
                                "(no block container); give --merge K")
            groups: list[list[UnitModel]] = [[root]]
            keys: list[str | None] = [None]
            for u in rest:
                key = _block_key(u.name, c)
                if key is None:
                    groups[0].append(u)  # outside the blocks: into the root
                elif keys[-1] == key:
                    groups[-1].append(u)
                else:
                    groups.append([u])
                    keys.append(key)
        else:
            k = int(ch.merge)
            groups = [[root]] + [rest[i:i + k] for i in range(0, len(rest), k)]
        return [_merge(g) for g in groups if g]

    def _reshard(self, ch: Changes) -> bool:
        return self.semantics.reshard_after_forward if ch.reshard_after_forward is None \
            else ch.reshard_after_forward

    # --- the replay -----------------------------------------------------------------------
    def replay(self, ch: Changes = Changes(), bound: float = 0) -> Replay:
        """The step of the (changed) configuration, the worst rank's. Every collective is a
        meeting point of the ranks: between two of them the step advances by the slowest
        rank's compute (per unit and phase, the largest over the ranks), then by the link's
        time; a faster rank waits for the slower one inside the collective (peer wait: its
        exposed time includes it). So the replay runs once with the largest compute, and
        the worst rank's exposed time adds its peer wait."""
        scale = ch.micro_batch_scale
        units = self._per_rank("slowest", ch)
        reshard = self._reshard(ch)
        # per rank: the mean compute differences (its deficit against the slowest rank, unit
        # by unit) and the arrival spread (its wait per call at every call left; the range:
        # the ratio of the calls after to before once more either way, `arrival_wait`)
        # ... and its time outside the units below the rank with the most (measured: the
        # replay's step has that rank's; its peers wait for it in the collectives)
        top = max((outside_units_s(rm) for rm in self.ranks), default=0.0)
        deficits = [d * scale + top - outside_units_s(rm)
                    for rm, d in zip(self.ranks, self._per_rank("deficit", ch))]
        spread = []
        for rm, calls in zip(self.ranks, self._per_rank("calls", ch, reshard)):
            ratio = calls / rm.arrival_calls if rm.arrival_calls > 0 and calls > 0 else 1.0
            if bound:
                calls *= min(ratio, 1 / ratio) if bound < 0 else max(ratio, 1 / ratio)
            spread.append(rm.arrival_wait_per_call_s * calls)
        worst = max(range(len(self.ranks)), key=lambda i: deficits[i] + spread[i],
                    default=None)
        r = self._replay_rank(self.overhead_rank(), ch, bound, units)
        if worst is not None:
            r.exposed_s += deficits[worst] + spread[worst]
            r.peer_wait_s = deficits[worst] + spread[worst]
            r.arrival_wait_s = spread[worst]
            # every meeting point starts at the later arrival: beyond the slowest rank's
            # mean compute the step gains the mean over the ranks of their spread waits
            # (two ranks: E max(a, b) - max(E a, E b) = (E|a - b| - |E(a - b)|) / 2)
            r.step_s += sum(spread) / len(spread)
        return r

    def overhead_rank(self) -> RankModel:
        """The rank whose time outside the units is largest (the replay's)."""
        return max(self.ranks, key=outside_units_s)

    def framework_beyond(self, ch: Changes) -> dict | None:
        """Where the change's units move more bytes per call than the run's largest unit
        (the replay's rank): the fitted line prices them, the range's high end the run's
        framework time per byte (`FrameworkFit.unit_seconds`); None within the run's sizes
        or without a per-unit fit."""
        rm = self.overhead_rank()
        f = rm.framework_fit
        if f is None or f.max_call_bytes <= 0:
            return None
        reshard = self._reshard(ch)
        top = max((_largest_call(u, reshard) for u in self._units(rm, ch)), default=0.0)
        if not f.beyond(top):
            return None
        return {"largest_measured_bytes": f.max_call_bytes, "largest_predicted_bytes": top,
                "ratio": top / f.max_call_bytes, "high_end_per_byte_s": f.per_byte_avg_s}

    def framework_pricing(self) -> dict:
        """How the framework's time is priced (the replay's rank), for the answer."""
        rm = self.overhead_rank()
        f = rm.framework_fit
        if f is None:
            why = ("its units (fewer than 3, or of one size) cannot part a cost per call "
                   "from one per byte" if rm.framework_per_unit else
                   "the source has the framework's time per step only (Prometheus "
                   "serves it per unit from rank 0 alone)")
            return {"pricing": "per step", "measured_s": rm.framework_s,
                    "note": f"per byte, range to per call: {why}"}
        parts = "per call + per tensor + per byte" if f.per_tensor else \
            f"per call + per byte ({f.tensor_note})"
        return {"pricing": "per unit", "measured_s": rm.framework_s,
                "per_call_s": f.per_call_s, "per_byte_s": f.per_byte_s,
                "se_call_s": f.se_call_s, "se_per_byte_s": f.se_per_byte_s,
                "per_tensor_s": f.per_tensor_s if f.per_tensor else None,
                "se_per_tensor_s": f.se_per_tensor_s if f.per_tensor else None,
                "units": f.units, "ranks": f.ranks, "rest_s": f.rest_s,
                "note": f"{parts}, fitted over {f.units} units per rank "
                        f"({f.ranks} ranks pooled)"}

    def _replay_rank(self, rm: RankModel, ch: Changes, bound: float,
                     units: list[UnitModel]) -> Replay:
        sem = self.semantics
        depth = sem.prefetch if ch.prefetch is None else ch.prefetch
        sync_unshard = sem.sync_unshard if ch.prefetch is None else depth == 0
        reshard = self._reshard(ch)
        scale = ch.micro_batch_scale

        def coll_s(u: UnitModel, phase: str, coll: str) -> float:
            calls, nbytes, measured = u.comm[phase][coll]
            return calls * self.call_seconds(coll, nbytes, u.group.get(coll, self.world_size),
                                             ch, bound, measured / calls if calls else None)

        def gather_s(u: UnitModel, phase: str) -> float:
            src = phase
            if phase == "backward" and reshard and not u.comm.get("backward", {}).get(
                    "all_gather"):
                src = "forward"  # resharding now where the run kept parameters
            if phase == "backward" and not reshard:
                return 0.0
            return coll_s(u, src, "all_gather") if u.comm.get(src, {}).get("all_gather") \
                else 0.0

        state = {"t": 0.0, "ch": 0.0}
        exposed: dict[str, float] = {u.name: 0.0 for u in units}
        comm_total = 0.0

        def gathers(seq: list[UnitModel], phase: str) -> None:
            """One phase: unit i's all-gather goes on the channel when unit i starts
            (synchronous unshard) or when unit i-depth starts computing (prefetch; the
            first unit issues its own); the compute waits for it."""
            nonlocal comm_total
            done: dict[int, float] = {}

            def issue(j: int) -> None:
                if j < len(seq) and j not in done:
                    g = gather_s(seq[j], phase)
                    if not g:  # nothing to gather (resharding off): nothing to wait for
                        done[j] = starts_at[j] = state["t"]
                        return
                    b = max(state["t"], state["ch"])  # behind the channel's earlier calls
                    done[j] = b + g
                    starts_at[j] = b
                    state["ch"] = done[j]
            starts_at: dict[int, float] = {}
            for i, u in enumerate(seq):
                issue(i)
                if done[i] > state["t"]:
                    # the compute waits from now until the gather is done: behind the
                    # channel's earlier calls (an asynchronous reduction) too, which the
                    # run measures as this all-gather's wait
                    exposed[u.name] += done[i] - state["t"]
                    state["t"] = done[i]
                comm_total += done[i] - starts_at[i]
                if not sync_unshard:
                    for j in range(i + 1, i + 1 + depth):
                        issue(j)
                state["t"] += (u.forward_s if phase == "forward" else u.backward_s) * scale
                after(u, phase)

        pending: list[tuple[str, float, float]] = []  # async reductions (unit, begin, done)

        def after(u: UnitModel, phase: str) -> None:
            """Collectives after a unit's compute: forward ones (rare) synchronously;
            backward reductions synchronously (gloo) or waited for at the next unit's
            post-backward."""
            nonlocal comm_total
            if phase == "backward" and not sem.sync_reduce:
                while pending:  # FSDP waits for the previous reduction here
                    name, b, d = pending.pop(0)
                    if d > state["t"]:
                        exposed[name] += d - max(state["t"], b)
                        state["t"] = d
            for coll in u.comm.get(phase, {}):
                if coll in GATHER:
                    continue
                s = coll_s(u, phase, coll)
                comm_total += s
                b = max(state["t"], state["ch"])
                d = b + s
                state["ch"] = d
                if phase == "backward" and not sem.sync_reduce:
                    pending.append((u.name, b, d))
                else:
                    exposed[u.name] += d - state["t"]
                    state["t"] = d

        gathers(units, "forward")
        gathers(list(reversed(units[1:])) + units[:1], "backward")
        for name, b, d in pending:  # the end of backward waits for every reduction
            if d > state["t"]:
                exposed[name] += d - max(state["t"], b)
                state["t"] = d
        t = state["t"]
        # collectives outside forward / backward (optimizer-phase gathers, broadcasts)
        for u in units:
            for phase, colls in u.comm.items():
                if phase in ("forward", "backward"):
                    continue
                for coll in colls:
                    s = coll_s(u, phase, coll)
                    exposed[u.name] = exposed.get(u.name, 0.0) + s
                    t += s
                    comm_total += s
        opt = rm.optimizer_s
        if ch.world_size:
            opt *= self.world_size / ch.world_size  # sharded optimizer states
        framework = self._framework_s(rm, units, reshard, bound)
        overhead = opt + framework + rm.other_s + rm.self_s
        compute = sum(u.forward_s + u.backward_s for u in units) * scale
        return Replay(t + overhead, sum(exposed.values()), compute, comm_total, overhead,
                      exposed, framework_s=framework)

    @staticmethod
    def _framework_s(rm: RankModel, units: list[UnitModel], reshard: bool,
                     bound: float) -> float:
        """FSDP's own time (copy-in / copy-out of the gathered parameters, the gradients'
        copies into the reduce-scatter buffer, the hooks) after the change.

        With the framework's time recorded per unit (`rm.framework_fit`): every unit after
        the change priced by the fit, a part per call and a part per byte, `bound` Z standard
        errors of the fitted line at each unit's size, plus the time of no unit as
        measured. Without it (an older run log: one total per step, and every unit moves its
        bytes in one call, so a cost per byte cannot be told from a cost per call): the point
        prices it per byte (in paired real runs, per linear -> per block, the framework time
        stayed at 26-41 ms while the calls fell 54 -> 15, docs/whatif.md); the range (`bound`
        < 0 / > 0) reaches the cheaper / dearer of per byte and per call."""
        f = rm.framework_fit
        if f is not None:
            return f.rest_s + sum(f.unit_seconds(_calls(u, reshard), _bytes_moved(u, reshard),
                                                 bound, u.tensors, _largest_call(u, reshard))
                                  for u in units)
        by_byte = rm.framework_per_byte_s * sum(_bytes_moved(u, reshard) for u in units)
        by_call = rm.framework_per_call_s * sum(_calls(u, reshard) for u in units)
        if bound < 0:
            return min(by_byte, by_call)
        if bound > 0:
            return max(by_byte, by_call)
        return by_byte

    # --- traffic ------------------------------------------------------------------------------
    def traffic(self, ch: Changes = Changes()) -> tuple[float, float]:
        """(nominal bytes, wire bytes) per step of the first rank after the change: bytes per
        call x calls (the planner's convention), and what a ring moves ((n-1)/n, 2(n-1)/n)."""
        if not self.ranks:
            return 0.0, 0.0
        reshard = self._reshard(ch)
        nominal = wire = 0.0
        for u in self._units(self.ranks[0], ch):
            for _p, c, (calls, nbytes, _s) in _rows(u, reshard):
                n = ch.world_size or u.group.get(c, self.world_size)
                nominal += calls * nbytes
                wire += calls * nbytes * wire_factor(c, n)
        return nominal, wire

    # --- memory ---------------------------------------------------------------------------
    def peak_bytes(self, ch: Changes = Changes()) -> tuple[int | None, str]:
        """Peak bytes per rank from the planner, with the rules' inputs (`Context.plan_input`)
        changed as `ch` says; and a note on what it covers."""
        from ..diagnosis.context import Context
        from ..planner import plan

        ctx = Context(self.snapshot)
        over: dict = {}
        if ch.world_size:
            over["world_size"] = ch.world_size
        over["reshard_after_forward"] = self._reshard(ch)
        depth = self.semantics.prefetch if ch.prefetch is None else ch.prefetch
        over["prefetch_depth"] = depth
        if ch.merge is not None and self.ranks:
            over["largest_unit_params"] = max(u.params for u in self._units(self.ranks[0], ch))
        try:
            inp = ctx.plan_input(**over)
        except UserError:
            return None, "the planner cannot take this change"
        if inp is None:
            return None, "the run's facts are too thin for the planner"
        note = "planner: model states + ZeRO-3 transient"
        if inp.activation_bytes is not None:
            inp = replace(inp, activation_bytes=int(inp.activation_bytes * ch.micro_batch_scale))
            note += " + measured activations"
        else:
            note += "; activations not measured on this device (not counted)"
        stage = ctx.stage
        return plan(inp).stage(stage).total_bytes, note


def _rows(u: UnitModel, reshard: bool):
    """(phase, collective, [calls, bytes per call, seconds]) of a unit with resharding after
    forward on or off: backward all-gathers dropped, or added at the forward one's size."""
    for phase, colls in u.comm.items():
        for coll, v in colls.items():
            if not (phase == "backward" and coll in GATHER and not reshard):
                yield phase, coll, v
    if reshard and not u.comm.get("backward", {}).get("all_gather") and \
            u.comm.get("forward", {}).get("all_gather"):
        yield "backward", "all_gather", u.comm["forward"]["all_gather"]


def _kept(u: UnitModel, what: str, reshard: bool | None, make) -> float:
    """`make()` once per unit, `what` and `reshard` (`UnitModel.sums`)."""
    got = u.sums.get((what, reshard))
    if got is None:
        got = u.sums[what, reshard] = make()
    return got


def _calls(u: UnitModel, reshard: bool) -> float:
    return _kept(u, "calls", reshard, lambda: sum(v[0] for _p, _c, v in _rows(u, reshard)))


def _rows_as(u: UnitModel, reshard: bool | None):
    """`_rows`, or with `reshard` None the unit's rows as measured."""
    if reshard is not None:
        return _rows(u, reshard)
    return ((p, c, v) for p, cs in u.comm.items() for c, v in cs.items())


def _largest_call(u: UnitModel, reshard: bool | None = None) -> float:
    """The unit's largest single call, bytes (`reshard` None: as measured)."""
    return _kept(u, "largest", reshard, lambda: max(
        (v[1] for _p, _c, v in _rows_as(u, reshard) if v[0] > 0), default=0.0))


def _bytes_moved(u: UnitModel, reshard: bool | None = None) -> float:
    """Bytes per step of a unit's collectives (calls x bytes per call); `reshard` None: as
    measured."""
    return _kept(u, "bytes", reshard, lambda: sum(v[0] * v[1] for _p, _c, v in
                                                 _rows_as(u, reshard)))


def _slowest(per_rank: list[list[UnitModel]]) -> list[UnitModel]:
    """The first rank's units with each unit's forward and backward compute the largest
    over the ranks (the units matched by position and name)."""
    out = []
    for i, u in enumerate(per_rank[0] if per_rank else []):
        parts = [us[i] for us in per_rank if i < len(us) and us[i].name == u.name]
        out.append(replace(u, forward_s=max(p.forward_s for p in parts),
                           backward_s=max(p.backward_s for p in parts)))
    return out


def _deficit(slowest: list[UnitModel], units: list[UnitModel]) -> float:
    """A rank's compute per step below the slowest rank's, unit by unit and phase by phase:
    what it waits for its peers in the collectives if every step were the mean step."""
    return sum(c.forward_s + c.backward_s - o.forward_s - o.backward_s
               for c, o in zip(slowest, units))


def outside_units_s(rm: "RankModel") -> float:
    """A rank's time per step outside the units (optimizer, framework, other, zerodoc's)."""
    return rm.optimizer_s + rm.framework_s + rm.other_s + rm.self_s


def arrival_wait(ranks: dict, units: list[list[UnitModel]], reshard: bool,
                 outside: list[float] | None = None) -> list[tuple[float, float]]:
    """Per rank (`ranks`: rank -> RankWindow, in rank order; `units`: each rank's units as
    fitted; `reshard`: the run's reshard after forward, as the replay counts the calls) the
    seconds per collective call it waited for a later peer beyond its mean compute deficit
    (`_deficit`) and beyond its time outside the units below the slowest rank's there
    (`outside`: each rank's, `outside_units_s`; a straggler slow outside the units makes its
    peers wait by that much, which the replay's step has already, from the rank with the most
    such time): the ranks' arrival spread; and its calls per step.

    Inside a collective a rank waits for the last rank to arrive, then for the link. The
    link-attributable time of a unit, phase and collective is the smallest over the ranks
    (`linkfit.fit_links`); the rest of each rank's time there is its peer wait (counted
    as exposed in the proportion its collective was). The replay explains a wait by the
    ranks' mean compute per unit and phase (the slowest rank's); what the ranks do between
    the units (FSDP's and the hooks' time, other) and how their arrivals spread from step to
    step (one step one rank is late, the next the other) it does not see. In 2-rank gloo
    runs of the demo the worst rank waited 9-13 ms per step over 54 calls, its mean compute
    deficit explained 2-3 ms, and the replay's step was 2-4 % short (docs/whatif.md). The
    rest is priced per collective call (each call a meeting point). How it carries to a
    change of the calls is not settled: in four quiet pairs of the demo the block runs'
    spread (15 calls) was 0.15-0.41 of the per-linear runs' (54 calls; per call: 0.28), in
    a recorded pair under load 1.85. The replay's range takes the ratio of the calls once
    more either way: for 54 -> 15 calls from 0.08 of the run's spread per step to all of
    it."""
    return arrival_spread(arrival_excess(ranks, units, reshard), outside or [0.0] * len(units))


def arrival_spread(excess: list[tuple[float, float] | None], outside: list[float]
                   ) -> list[tuple[float, float]]:
    """`arrival_wait` from each rank's `arrival_excess` and its time outside the units."""
    top = max(outside, default=0.0)
    return [(0.0, 0.0) if part is None else
            (max(0.0, part[0] - (top - o)) / part[1] if part[1] else 0.0, part[1])
            for part, o in zip(excess, outside)]


def arrival_excess(ranks: dict, units: list[list[UnitModel]], reshard: bool
                   ) -> list[tuple[float, float] | None]:
    """`arrival_wait`'s part read from the per-unit numbers only: per rank its wait in the
    collectives beyond the link minus its mean compute deficit, and its calls per step (None:
    a single rank, or no per-unit steps); the time outside the units (per-step numbers, new
    every step) is taken off in `arrival_wait`."""
    keys: dict[tuple, float] = {}
    for w in ranks.values():
        for k, c in w.comm.items():
            if c.count > 0 and c.seconds > 0:
                per_call = c.seconds / c.count
                keys[k] = min(keys.get(k, per_call), per_call)
    waits = []
    for w in ranks.values():
        n = w.per_unit_steps
        wait = 0.0
        for k, c in (w.comm.items() if len(ranks) > 1 and n else ()):
            if c.count <= 0 or c.seconds <= 0:
                continue
            extra = c.seconds - keys[k] * c.count
            wait += max(0.0, extra) * min(1.0, c.exposed_seconds / c.seconds) / n
        waits.append(wait)
    return _excess(ranks, units, reshard, waits)


def _excess(ranks: dict, units: list[list[UnitModel]], reshard: bool, waits: list[float]
            ) -> list[tuple[float, float] | None]:
    """`arrival_excess` from each rank's wait beyond the link per step (`waits`)."""
    slowest = _slowest(units)
    out: list[tuple[float, float] | None] = []
    for w, us, wait in zip(ranks.values(), units, waits):
        if len(ranks) < 2 or not w.per_unit_steps:
            out.append(None)
            continue
        out.append((wait - _deficit(slowest, us), sum(_calls(u, reshard) for u in us)))
    return out


def _block_key(name: str, container: str) -> str | None:
    prefix = f"{container}." if container else ""
    if not name.startswith(prefix):
        return None
    idx = name[len(prefix):].split(".")[0]
    return idx if idx.isdigit() else None


def _merge(group: list[UnitModel]) -> UnitModel:
    if len(group) == 1:
        return group[0]
    tensors = [u.tensors for u in group]
    out = UnitModel(f"{group[0].name or '(root)'}..{group[-1].name}",
                    sum(u.params for u in group), parts=tuple(u.name for u in group),
                    tensors=None if None in tensors else sum(tensors))
    for u in group:
        out.forward_s += u.forward_s
        out.backward_s += u.backward_s
        out.group.update(u.group)
        for phase, colls in u.comm.items():
            for coll, (calls, nbytes, secs) in colls.items():
                cur = out.comm.setdefault(phase, {}).setdefault(coll, [0.0, 0.0, 0.0])
                # one call per merged unit and step: the bytes of all its parts
                cur[1] += nbytes * calls
                cur[2] += secs
                cur[0] = 1.0
    return out


@dataclass
class UnitPart:
    """What a fit reads from the per-unit numbers alone (`RankWindow.unit_key`), kept from
    one fit to the next while they are equal: a live run brings per-unit numbers 1 step in K
    (`detail_every`), its step times every step, and the TUI refits on every refresh (at
    1,024 ranks x 81 units this part was ~90 % of a refresh). Per rank, in rank order: its
    units, whether it recorded framework time per unit, its framework fit (`rest_s` 0:
    the rank's total is a per-step number, added in `fit`), its compute outside the named
    phases per step, and `arrival_excess`; then the ordering semantics, the link fits and
    the models' shared memo of what replays ask of the units (`StepModel._memo`)."""

    key: tuple
    units: list[list[UnitModel]]
    framework_per_unit: list[bool]
    framework: list[FrameworkFit | None]
    other_compute: list[float]
    arrival: list[tuple[float, float] | None]
    sem: Semantics
    links: dict
    memo: dict = field(default_factory=dict)
    grid: UnitGrid | None = None  # every rank's figures (`unitgrid`); its units built when read


# The last fit's `UnitPart` (one: a TUI follows one run), and how many were built (the
# tests count refits). With `MEMO` off every fit builds its own.
_LAST_PART: list[UnitPart] = []
PARTS_BUILT = [0]


def _unit_part(ranks: dict, ctx) -> UnitPart:
    """The fit's `UnitPart` for `ranks` (rank -> RankWindow, in rank order): the last one
    when its key is equal, else built (and kept)."""
    facts = next(iter(ranks.values())).facts
    key = (ctx.group_size, ctx.block_container, facts,
           tuple((r, w.facts, w.unit_key()) for r, w in ranks.items()))
    if MEMO and _LAST_PART and _LAST_PART[0].key == key:
        return _LAST_PART[0]
    PARTS_BUILT[0] += 1
    cfg = facts.config if isinstance(facts.config, dict) else {}
    pf = cfg.get("prefetch") if isinstance(cfg.get("prefetch"), dict) else {}
    tables = Tables([rank_rows(w) for w in ranks.values()]) if FAST else None
    if tables is not None:
        hidden, rs_hidden = tables.hidden(GATHER), tables.hidden(REDUCE)
    else:
        hidden = rs_hidden = 0.0
        for w in ranks.values():
            for (_, _, coll), c in w.comm.items():
                if coll in GATHER:
                    hidden += c.hidden_seconds
                elif coll in REDUCE:
                    rs_hidden += c.hidden_seconds
    sync_unshard = not pf.get("unshard_async", hidden > 0) and hidden == 0
    depth = 0 if sync_unshard else max(1, int(pf.get("forward") or 1))
    reshard = any(u.reshard_after_forward for u in facts.units) or facts.zero_stage == 3
    sem = Semantics(facts.framework, sync_unshard, rs_hidden == 0, depth, reshard)
    fw = []  # per rank: its framework time per step by unit
    for w in ranks.values():
        per_unit_fw: dict[str, float] = {}
        for (unit, _phase), s in w.unit_framework.items():
            if unit != RANK_TOTAL_UNIT:  # a sum over units (Prometheus: every rank but 0)
                per_unit_fw[unit] = per_unit_fw.get(unit, 0.0) + s / w.per_unit_steps
        fw.append(per_unit_fw)
    windows = list(ranks.values())
    g = None
    if tables is not None:
        def build(i: int) -> list[UnitModel]:
            units = _rank_units(windows[i], tables.rows[i])[0]
            for u in units:
                _prime(u, reshard)
            return units
        g = unitgrid.grid(windows, tables.rows, build)
    if g is not None:
        all_units = [None] * len(windows)  # built when read (`UnitGrid.units`)
        other_compute = g.per_rank(lambda b: b.other)
        framework = fit_framework_points([(pts, top, 0.0) for pts, top in
                                          g.framework_points(fw)])
        calls, deficits = g.rank_calls(reshard), g.deficits()
        waits = tables.waits([w.per_unit_steps for w in windows])
        arrival = [None if len(windows) < 2 else (wait - d, c)
                   for wait, d, c in zip(waits, deficits, calls)]
    else:
        all_units, other_compute = [], []
        for i, w in enumerate(windows):
            units, other = _rank_units(w, tables.rows[i] if tables else None)
            if tables is not None:
                for u in units:
                    _prime(u, reshard)
            all_units.append(units)
            other_compute.append(other)
        framework = fit_framework([(us, f, 0.0) for us, f in zip(all_units, fw)])
        arrival = arrival_excess(ranks, all_units, reshard) if tables is None else \
            _excess(ranks, all_units, reshard,
                    tables.waits([w.per_unit_steps for w in windows]))
    part = UnitPart(key, all_units, [bool(f) for f in fw], framework, other_compute,
                    arrival, sem,
                    fit_links(ctx.snapshot, ranks=set(ranks)) if tables is None else
                    links_from_points(tables.link_points([w.facts for w in windows])),
                    grid=g)
    if MEMO:
        _LAST_PART[:] = [part]
    return part


def _rank_units(w, rows=None) -> tuple[list[UnitModel], float]:
    """One rank's units per step from its per-unit totals, in the facts' order (units the
    facts do not name after them), and its compute outside the named phases per step (e.g.
    a "step" phase: overhead). `rows`: its `unittable.RankRows` (the arrays), else its
    dicts are read."""
    if rows is not None:
        return _units_from(w, zip(rows.ck, rows.cv), zip(rows.mk, rows.rows))
    return _units_from(w, w.compute.items(),
                       ((k, (c.count, c.bytes, c.seconds)) for k, c in w.comm.items()))


def _units_from(w, compute, comm) -> tuple[list[UnitModel], float]:
    """`_rank_units` from ((unit, phase), seconds) and ((unit, phase, collective), (count,
    bytes, seconds, ...)) pairs."""
    n = w.per_unit_steps
    units = {u.name: UnitModel(u.name, u.params, tensors=u.tensors) for u in w.facts.units}
    order = [u.name for u in w.facts.units]
    other = []
    # (unit, collective) -> group size, kept on the facts (frozen: set beside the fields, as
    # `RankFacts.unit`'s index): every fit asks it of each row of every rank
    groups = w.facts.__dict__.get("_group_sizes")
    if groups is None:
        groups = {}
        object.__setattr__(w.facts, "_group_sizes", groups)
    for (unit, phase), s in compute:
        if unit not in units:
            units[unit] = UnitModel(unit, 0)
            order.append(unit)
        if phase == "forward":
            units[unit].forward_s += s / n
        elif phase == "backward":
            units[unit].backward_s += s / n
        else:
            other.append(s)
    for (unit, phase, coll), c in comm:
        if unit not in units:
            units[unit] = UnitModel(unit, 0)
            order.append(unit)
        count = c[0]
        if count <= 0:
            continue
        um = units[unit]
        g = groups.get((unit, coll))
        if g is None:
            facts_u = w.facts.unit(unit)
            g = groups[unit, coll] = facts_u.collective_group_size(coll) if facts_u else \
                w.facts.world_size
        um.group[coll] = g
        um.comm.setdefault(phase, {})[coll] = [count / n, c[1] / count, c[2] / n]
    return [units[name] for name in order], sum(other) / n


def _prime(u: UnitModel, reshard: bool) -> None:
    """Fill a unit's kept sums (`UnitModel.sums`) that a fit and its replays ask in one
    pass over its rows: its calls with the run's resharding (`_calls`), and as measured its
    calls, bytes moved and largest call; each the same sum, in the same order, as asked
    one by one."""
    calls, moved, sizes, kept = [], [], [], []
    for phase, colls in u.comm.items():
        for coll, v in colls.items():
            calls.append(v[0])
            moved.append(v[0] * v[1])
            if v[0] > 0:
                sizes.append(v[1])
            if not (phase == "backward" and coll in GATHER and not reshard):
                kept.append(v[0])
    if reshard and not u.comm.get("backward", {}).get("all_gather") and \
            u.comm.get("forward", {}).get("all_gather"):
        kept.append(u.comm["forward"]["all_gather"][0])
    u.sums["calls", reshard] = sum(kept)
    u.sums["all_calls", None] = sum(calls)
    u.sums["bytes", None] = sum(moved)
    u.sums["largest", None] = max(sizes, default=0.0)


def fit(snapshot: RunSnapshot, profile: LinkProfile | None = None) -> StepModel:
    """The model of a measured run (every active rank with per-unit detail); `profile`: a
    measured link profile pricing the calls beyond the run's sizes (`linkprofile`). The
    part read from the per-unit numbers alone is the last fit's while they are unchanged
    (`UnitPart`); the per-step numbers are read on every fit."""
    from ..diagnosis.context import Context

    ranks = {r: w for r, w in sorted(snapshot.ranks.items())
             if w.steps and w.unit_detail and r not in snapshot.stale_ranks}
    if not ranks:
        raise UserError(f"{snapshot.source}: no rank with per-unit detail to fit a step model "
                        "to (a run with detail steps is needed)")
    ctx = Context(snapshot)
    part = _unit_part(ranks, ctx)
    rank_models = []
    for i, (r, w) in enumerate(ranks.items()):
        steps = w.steps
        times = list(w.step_times) or [w.mean_step_seconds]
        framework_s = w.per_sampled_step(w.framework_seconds) or 0.0
        fw = part.framework[i]
        rank_models.append(RankModel(
            r, part.units[i] if part.grid is None else partial(part.grid.units, i),
            w.optimizer_seconds / steps, framework_s,
            (w.per_sampled_step(w.other_seconds) or 0.0) + part.other_compute[i],
            w.self_seconds / steps, w.mean_step_seconds, w.exposed_seconds / steps, times,
            list(w.exposed_times),
            framework_fit=None if fw is None else replace(
                fw, rest_s=max(0.0, framework_s - fw.units_s)),
            framework_per_unit=part.framework_per_unit[i]))
    spread = arrival_spread(part.arrival, [outside_units_s(rm) for rm in rank_models])
    for rm, (s, calls) in zip(rank_models, spread):
        rm.arrival_wait_per_call_s, rm.arrival_calls = s, calls
    model = StepModel(snapshot, rank_models, part.links, part.sem, max(1, ctx.group_size),
                      ctx.block_container, min(w.per_unit_steps for w in ranks.values()))
    model.profile = profile
    model.grid = part.grid
    if MEMO:
        model._memo = part.memo  # the units are the part's: what replays ask of them too
    return model


# --- answers ------------------------------------------------------------------------------


def answer(model: StepModel, ch: Changes, *, memory: bool = True) -> dict:
    """The what-if of `ch` on `model`: baseline (the replay) beside the measurement, the
    prediction with its range, peak memory per rank (`memory=False`: not asked, None), the
    units whose exposure changes most. Seconds per step, per rank: the worst rank's."""
    base = model.replay()
    pred = model.replay(ch)
    lo = model.replay(ch, bound=-Z)
    hi = model.replay(ch, bound=+Z)
    measured_step = max(rm.measured_step_s for rm in model.ranks)
    measured_exposed = max(rm.measured_exposed_s for rm in model.ranks)
    b, p = base, pred
    misfit = abs(b.step_s - measured_step) / measured_step if measured_step else 0.0
    # The noise of the measured means (`measurement_noise`): this run's mean and that of a
    # run that checks it each carry it. Added to the rest of the range, not combined with
    # it: the range's ends also hold what a change sets as a range (`--latency 0ms..2ms`),
    # which is no random error; where the link fit's error holds part of this run's noise
    # (calls that move apart), the range is conservative.
    nz = measurement_noise(model)
    rel = misfit + nz["step_t"] * nz["step_rel"]
    exp_noise = nz["exposed_t"] * (nz["exposed_s"] or 0.0)
    # The replay's exposed time holds the ranks' arrival spread measured from the run itself
    # (`arrival_wait`): its match is partly by construction. So the range is widened by that
    # part too, as by the misfit it replaced (what the mean compute left unexplained).
    b_exp = base.exposed_s
    exp_misfit = abs(b_exp - measured_exposed) + base.arrival_wait_s
    # On a CPU backend the collectives are CPU work on the cores the compute runs on: the
    # communication a change newly hides behind the compute can slow that compute by as
    # much, and what it no longer hides can speed it up by as much (contention; the point
    # keeps the measured compute). The step's high / low end takes it.
    added = removed = 0.0
    if cpu_collectives(model):
        added = max(0.0, hidden_s(hi) - hidden_s(model.replay(bound=+Z)))
        removed = max(0.0, hidden_s(model.replay(bound=-Z)) - hidden_s(lo))
    step_lo = max(0.0, lo.step_s * (1 - rel) - removed)
    step_hi = hi.step_s * (1 + rel) + added
    p_exp = pred.exposed_s
    exp_lo = max(0.0, lo.exposed_s - exp_noise - exp_misfit)
    exp_hi = hi.exposed_s + exp_noise + exp_misfit
    base_peak, base_note = model.peak_bytes() if memory else (None, "not asked")
    peak, peak_note = model.peak_bytes(ch) if memory else (None, "not asked")
    nominal, wire = model.traffic(ch)
    # per unit of the change: a merged unit against the sum of its parts
    parts = {u.name: u.parts for u in model._units(model.ranks[0], ch) if u.parts}
    before = dict(b.exposed_by_unit)
    for name, names in parts.items():
        before[name] = sum(before.pop(n, 0.0) for n in names)
    changes = {name: p.exposed_by_unit.get(name, 0.0) - before.get(name, 0.0)
               for name in set(before) | set(p.exposed_by_unit)}
    top = sorted(changes.items(), key=lambda kv: -abs(kv[1]))[:5]
    sem = model.semantics
    return {
        "schema": 1,
        "source": model.snapshot.source,
        "steps": model.steps,
        "ranks": len(model.ranks),
        "semantics": {"framework": sem.framework, "sync_unshard": sem.sync_unshard,
                      "sync_reduce": sem.sync_reduce, "prefetch": sem.prefetch,
                      "reshard_after_forward": sem.reshard_after_forward},
        "changes": ch.describe(),
        "measured": {"step_s": measured_step, "exposed_comm_s": measured_exposed},
        "baseline": {"step_s": b.step_s, "exposed_comm_s": b_exp, "peak_bytes": base_peak,
                     "compute_s": b.compute_s, "framework_s": b.framework_s,
                     "arrival_wait_s": b.arrival_wait_s,
                     "step_error": (b.step_s - measured_step) / measured_step
                     if measured_step else None},
        "predicted": {"step_s": p.step_s, "exposed_comm_s": p_exp, "peak_bytes": peak,
                      "step_s_range": [step_lo, step_hi],
                      "exposed_comm_s_range": [exp_lo, exp_hi],
                      "compute_s": p.compute_s, "comm_s": p.comm_s,
                      "overhead_s": p.overhead_s, "framework_s": p.framework_s,
                      "framework_s_range": [lo.framework_s, hi.framework_s],
                      "peer_wait_s": p.peer_wait_s,
                      "arrival_wait_s": p.arrival_wait_s,
                      "comm_bytes": nominal,
                      "comm_wire_bytes": wire},
        # on a CPU backend: the communication the change newly hides, in the step's high
        # end; the communication it no longer hides, in its low end
        "contention_s": added,
        "contention_removed_s": removed,
        # `measurement_noise`: the standard error of the difference between this run's mean
        # and a check run's (the step's relative, the exposed time's in seconds; None: fewer
        # than 2 figures), the figures it is from and the quantile the range holds of it
        "noise": nz,
        "peak_note": peak_note,
        "framework": {**model.framework_pricing(), "beyond_run_sizes":
                      model.framework_beyond(ch)},
        "units": [{"unit": n or "(root)", "exposed_change_s": d} for n, d in top if d],
        "links": [{"collective": f.collective, "group_size": f.group_size,
                   "latency_s": f.latency_s, "bandwidth_bytes_per_s": f.bandwidth,
                   "resid_s": f.resid_s, "points": f.points,
                   "bytes_range": [f.min_bytes, f.max_bytes]}
                  for f in model.links.values()],
        "link_model": link_model(model, ch),
    }


def hidden_s(r: Replay) -> float:
    """The communication a replayed step hides behind the compute (its link time less its
    exposed time, the peer waits left out of the latter)."""
    return max(0.0, r.comm_s - (r.exposed_s - r.peer_wait_s))


def cpu_collectives(model: StepModel) -> bool:
    """The run's collectives are CPU work on the compute's cores: gloo on a CPU device. (Not
    an NCCL run whose parameters sit on the CPU, offloaded: its device type reads "cpu" too,
    but its collectives run on the GPU's engines.)"""
    w = model.snapshot.any_rank
    return w is not None and getattr(w.facts, "device_type", None) == "cpu" and \
        getattr(w.facts, "backend", None) == "gloo"


# Student's t, 97.5 % point, by degrees of freedom, rounded up: a standard error estimated
# from n figures is held n - 1 degrees of freedom's quantile either side (about a 95 %
# interval, as the ranges' Z = 2 elsewhere: from 100 on, 2)
T975 = ((1, 12.71), (2, 4.31), (3, 3.19), (4, 2.78), (5, 2.58), (6, 2.45), (7, 2.37),
        (8, 2.31), (9, 2.27), (10, 2.23), (12, 2.18), (15, 2.14), (20, 2.09), (30, 2.05),
        (40, 2.03), (60, 2.01), (100, Z))


def t975(df: int) -> float:
    """The 97.5 % point of Student's t with `df` degrees of freedom (the table's entry at or
    below it: never narrower than the truth)."""
    return next((t for d, t in reversed(T975) if d <= df), T975[0][1])


def _spread(xs: list[float]) -> tuple[float | None, float]:
    """The standard error of the mean of `xs` x sqrt(2) (this run's mean and a check run's
    over as many figures each carry it) and the t quantile a range holds of it; (None, 0)
    below 2 figures."""
    n = len(xs)
    if n < 2:
        return None, 0.0
    m = math.fsum(xs) / n
    se = math.sqrt(math.fsum((x - m) ** 2 for x in xs) / (n - 1) / n)
    return math.sqrt(2) * se, t975(n - 1)


def measurement_noise(model: StepModel) -> dict:
    """The noise of the measured means the prediction is checked against, from the worst
    rank's own figures (the rank whose mean step, and the one whose mean exposed time, the
    answer reports): per step its step time (relative to its mean), per sampled step its
    exposed time (`_spread`). None / 0 steps: the source has no per-step figures."""
    by_step = max(model.ranks, key=lambda rm: rm.measured_step_s)
    by_exposed = max(model.ranks, key=lambda rm: rm.measured_exposed_s)
    step, step_t = _spread(by_step.step_times)
    exposed, exposed_t = _spread(by_exposed.exposed_times)
    mean = by_step.measured_step_s
    return {"step_rel": step / mean if step is not None and mean else 0.0,
            "step_steps": len(by_step.step_times), "step_t": step_t,
            "exposed_s": exposed, "exposed_steps": len(by_exposed.exposed_times),
            "exposed_t": exposed_t}


def link_model(model: StepModel, ch: Changes) -> dict:
    """Which link model priced the change's calls: the run's fitted line everywhere, or
    with a profile's shape beyond the run's largest call; and per collective, how far
    beyond it the change's calls reach (`StepModel.beyond_sizes`)."""
    prof = model.profile
    return {"model": "fitted line" if prof is None else "fitted line + profile beyond the "
            "run's sizes",
            "profile": None if prof is None else {
                "path": prof.path, "backend": prof.backend, "group_size": prof.group_size,
                "host": prof.host, "collectives": sorted(prof.curves),
                "differs": profile_differs(model)},
            "beyond_run_sizes": model.beyond_sizes(ch)}


def profile_differs(model: StepModel) -> list[str]:
    """What of the profile's link is not the run's (an approximation the answer says): its
    backend, its group size against the run's groups."""
    prof, out = model.profile, []
    w = model.snapshot.any_rank
    backend = getattr(w.facts, "backend", None) if w is not None else None
    if prof is None:
        return out
    if backend and prof.backend not in ("?", backend):
        out.append(f"measured on {prof.backend}, the run uses {backend}")
    groups = sorted({n for (_c, n) in model.links})
    if groups and prof.group_size not in groups:
        out.append(f"measured on {prof.group_size} ranks, the run's groups are "
                   f"{', '.join(map(str, groups))} (carried over in wire bytes)")
    return out


def summary(ans: dict) -> str:
    """One line of an answer for a finding or the TUI: "step 721 ms -> 659 ms (620-700 ms),
    exposed comm 208 ms -> 163 ms (150-176 ms); each from the model's replay of the run (its step
    within 0.5 % of the measured)": the left-hand figures are the replay's, not the measured
    ones (issue 31: one number per quantity, or its definition named beside it)."""
    from ..humanize import secs

    def rng(lo: float, hi: float) -> str:
        return f"{secs(lo)}-{secs(hi)}"

    b, p = ans["baseline"], ans["predicted"]
    err = b.get("step_error")
    replay = "; each from the model's replay of the run" if err is None else \
        f"; each from the model's replay of the run (its step within {abs(err) * 100:.1f} % of " \
        "the measured)"
    return (f"step {secs(b['step_s'])} -> {secs(p['step_s'])} ({rng(*p['step_s_range'])}), "
            f"exposed comm {secs(b['exposed_comm_s'])} -> {secs(p['exposed_comm_s'])} "
            f"({rng(*p['exposed_comm_s_range'])}){replay}")
