"""ZeRO stage planner: per-GPU memory and per-step communication for DP, ZeRO-1/2/3.

Pure Python (stdlib only, no torch), so the CLI, the rules engine and tests can all use it.
Every quantity is kept in base units (bytes, parameter counts); GB (10^9 bytes) and GiB
(2^30 bytes) exist only in `format_bytes` / `format_table`, always labelled.

The model (the ZeRO paper; docs/planner.md), Ψ = params, N = sharding degree, p/g = bytes per
stored parameter/gradient, K = optimizer bytes per parameter, s = ceil(Ψ/N) (a rank's shard;
FSDP pads to a multiple of N, so the shard is rounded up)::

    dp     Ψ·p + Ψ·g + Ψ·K          comm 2Ψ (all-reduce of gradients)
    zero1  Ψ·p + Ψ·g + s·K          comm 2Ψ (reduce-scatter grads + all-gather params)
    zero2  Ψ·p + s·g + s·K          comm 2Ψ
    zero3  s·p + s·g + s·K          comm 3Ψ (all-gather fwd + all-gather bwd + reduce-scatter);
                                    2Ψ with reshard_after_forward=False

On top: activations (same on every stage), and a transient buffer under ZeRO-3 (the
unsharded parameters of the unit being computed plus those being prefetched).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields
from fractions import Fraction

from .errors import UserError

GB = 10**9  # decimal gigabyte
GIB = 2**30  # binary gibibyte
STAGES = ("dp", "zero1", "zero2", "zero3")
STAGE_LABELS = {"dp": "DP", "zero1": "ZeRO-1", "zero2": "ZeRO-2", "zero3": "ZeRO-3"}
# The PyTorch / DeepSpeed configuration that gives each stage's memory.
PYTORCH_NAMES = {
    "dp": "DDP / FSDP1 NO_SHARD",
    "zero1": "ZeroRedundancyOptimizer / DeepSpeed stage 1",
    "zero2": "FSDP1 SHARD_GRAD_OP / DeepSpeed stage 2",
    "zero3": "FSDP1 FULL_SHARD / FSDP2 fully_shard / DeepSpeed stage 3",
}

DTYPE_BYTES = {"fp32": 4, "float32": 4, "float": 4, "tf32": 4, "bf16": 2, "bfloat16": 2,
               "fp16": 2, "float16": 2, "half": 2, "fp8": 1, "float8_e4m3fn": 1,
               "float8_e5m2": 1, "fp64": 8, "float64": 8}


def dtype_bytes(name: str) -> int:
    """Bytes per element of a dtype name ("bf16", "float32", "torch.bfloat16", ...)."""
    key = str(name).strip().lower().removeprefix("torch.")
    if key not in DTYPE_BYTES:
        raise UserError(f"unknown dtype {name!r} (known: bf16, fp16, fp32, fp8)")
    return DTYPE_BYTES[key]


@dataclass(frozen=True)
class OptimizerPreset:
    """Bytes per parameter of one training recipe: stored params, grads, optimizer state."""

    name: str
    optimizer_bytes_per_param: float  # K
    param_bytes: int
    grad_bytes: int
    description: str


PRESETS: dict[str, OptimizerPreset] = {p.name: p for p in (
    OptimizerPreset("adam-mixed", 12, 2, 2,
                    "Adam/AdamW, mixed precision: bf16/fp16 params and grads; fp32 master 4 "
                    "+ m 4 + v 4 (the ZeRO paper's K=12, 16 bytes/param in all)"),
    OptimizerPreset("adam-fp32", 8, 4, 4,
                    "Adam/AdamW, fp32 training (or FSDP2 with fp32 sharded params): the "
                    "params are the master copy; m 4 + v 4"),
    OptimizerPreset("adam-bf16", 4, 2, 2,
                    "Adam/AdamW, pure bf16 (no master copy): m 2 + v 2"),
    OptimizerPreset("adam-8bit", 6, 2, 2,
                    "8-bit Adam (bitsandbytes), mixed precision: fp32 master 4 + m 1 + v 1 "
                    "(per-block scales, ~0.03 B/param, ignored)"),
    OptimizerPreset("sgd-momentum", 8, 2, 2,
                    "SGD with momentum, mixed precision: fp32 master 4 + momentum 4"),
    OptimizerPreset("sgd-momentum-fp32", 4, 4, 4,
                    "SGD with momentum, fp32 training: momentum 4"),
    OptimizerPreset("sgd-fp32", 0, 4, 4, "plain SGD, fp32 training: no optimizer state"),
)}


def optimizer_preset(name: str) -> OptimizerPreset:
    try:
        return PRESETS[name.strip().lower()]
    except KeyError:
        raise UserError(f"unknown optimizer preset {name!r} "
                        f"(known: {', '.join(PRESETS)})") from None


# --------------------------------------------------------------------------------------
# inputs


def _check_int(name: str, v, lo: int, *, optional: bool = False) -> None:
    if v is None and optional:
        return
    if isinstance(v, bool) or not isinstance(v, int):
        raise UserError(f"{name} must be an integer, got {v!r}")
    if v < lo:
        raise UserError(f"{name} must be >= {lo}, got {v}")


def _check_num(name: str, v, lo: float, hi: float | None = None, *, hi_open=False) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise UserError(f"{name} must be a finite number, got {v!r}")
    if v < lo or (hi is not None and (v >= hi if hi_open else v > hi)):
        raise UserError(f"{name} must be in [{lo}, {hi}{')' if hi_open else ']'}, got {v}")


@dataclass(frozen=True, kw_only=True)
class PlanInput:
    """What the planner needs. Bytes are bytes per element unless the name says otherwise.

    Activations come either from the shape (micro_batch, seq_len, hidden, layers: all four)
    or directly as `activation_bytes` (a measured or hand-given number), or not at all.
    A stage fits when total + reserve <= device_memory_bytes, where reserve =
    max(headroom_fraction * device_memory_bytes, headroom_bytes or 0).
    """

    params: int  # Ψ, total (unsharded) parameter count
    world_size: int  # N, the sharding degree (data-parallel group size)
    optimizer_bytes_per_param: float = 12  # K
    param_bytes: int = 2  # stored parameter copy (bf16 2, fp32 4)
    grad_bytes: int = 2
    gather_bytes: int | None = None  # all-gathered dtype; None: param_bytes
    reduce_bytes: int | None = None  # reduce-scatter / all-reduce dtype; None: grad_bytes
    micro_batch: int | None = None
    seq_len: int | None = None
    hidden: int | None = None
    layers: int | None = None
    checkpointing: bool = False
    activation_coeff: float = 34  # c in c·B·S·H·L bytes (16-bit, no recomputation)
    checkpoint_bytes: int = 2  # bytes per element of the stored block-boundary tensor
    activation_bytes: int | None = None  # given directly (measured); excludes B/S/H/L
    device_memory_bytes: int | None = None
    headroom_fraction: float = 0.2
    headroom_bytes: int | None = None
    largest_unit_params: int | None = None  # ZeRO-3 transient: the largest unit, unsharded
    prefetch_depth: int = 1
    reshard_after_forward: bool = True

    def __post_init__(self) -> None:
        _check_int("params", self.params, 1)
        _check_int("world_size", self.world_size, 1)
        _check_num("optimizer_bytes_per_param", self.optimizer_bytes_per_param, 0, 1024)
        for f in ("param_bytes", "grad_bytes"):
            _check_int(f, getattr(self, f), 1)
        for f in ("gather_bytes", "reduce_bytes"):
            _check_int(f, getattr(self, f), 1, optional=True)
        shape = {f: getattr(self, f) for f in ("micro_batch", "seq_len", "hidden", "layers")}
        for f, v in shape.items():
            _check_int(f, v, 1, optional=True)
        given = [f for f, v in shape.items() if v is not None]
        if given and len(given) < 4:
            missing = [f for f in shape if f not in given]
            raise UserError(f"activation shape needs micro_batch, seq_len, hidden and layers; "
                            f"missing {', '.join(missing)}")
        _check_num("activation_coeff", self.activation_coeff, 0, 1e6)
        _check_int("checkpoint_bytes", self.checkpoint_bytes, 1)
        _check_int("activation_bytes", self.activation_bytes, 0, optional=True)
        if given and self.activation_bytes is not None:
            raise UserError("activation_bytes and an activation shape (micro_batch, seq_len, "
                            "hidden, layers) exclude each other: give one")
        _check_int("device_memory_bytes", self.device_memory_bytes, 1, optional=True)
        _check_num("headroom_fraction", self.headroom_fraction, 0, 1, hi_open=True)
        _check_int("headroom_bytes", self.headroom_bytes, 0, optional=True)
        _check_int("largest_unit_params", self.largest_unit_params, 1, optional=True)
        if self.largest_unit_params is not None and self.largest_unit_params > self.params:
            raise UserError(f"largest_unit_params ({self.largest_unit_params}) exceeds "
                            f"params ({self.params})")
        _check_int("prefetch_depth", self.prefetch_depth, 0)

    @property
    def gather(self) -> int:
        return self.gather_bytes if self.gather_bytes is not None else self.param_bytes

    @property
    def reduce(self) -> int:
        return self.reduce_bytes if self.reduce_bytes is not None else self.grad_bytes


# --------------------------------------------------------------------------------------
# results


@dataclass(frozen=True)
class Activations:
    """Activation bytes per rank. `stored` lives from forward to backward; `recompute` is the
    working set of one block rebuilt during backward under checkpointing."""

    total_bytes: int
    stored_bytes: int
    recompute_bytes: int
    source: str  # "shape" | "given" | "none"


@dataclass(frozen=True)
class Collective:
    collective: str  # all_reduce | reduce_scatter | all_gather
    what: str  # gradients | parameters (forward) | ...
    psi: int  # elements, in units of Ψ
    bytes: int  # nominal bytes per GPU (ZeRO-paper convention: Ψ·dtype per Ψ)


@dataclass(frozen=True)
class StagePlan:
    stage: str  # dp | zero1 | zero2 | zero3
    label: str  # DP | ZeRO-1 | ...
    pytorch: str
    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activations_bytes: int
    transient_bytes: int
    collectives: tuple[Collective, ...]
    comm_wire_bytes_per_step: int  # what a ring actually moves per GPU: nominal·(N-1)/N
    fits: bool | None  # None: no device memory given
    headroom_bytes: int | None  # device memory - total (negative: over)

    @property
    def model_states_bytes(self) -> int:
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes

    @property
    def total_bytes(self) -> int:
        return self.model_states_bytes + self.activations_bytes + self.transient_bytes

    @property
    def comm_psi(self) -> int:
        return sum(c.psi for c in self.collectives)

    @property
    def comm_bytes_per_step(self) -> int:
        return sum(c.bytes for c in self.collectives)


@dataclass(frozen=True)
class Plan:
    inputs: PlanInput
    activations: Activations
    stages: tuple[StagePlan, ...]
    reserve_bytes: int | None  # memory that must stay free for a stage to fit
    lowest_fitting_stage: str | None
    notes: tuple[str, ...] = ()

    def stage(self, name: str) -> StagePlan:
        for s in self.stages:
            if s.stage == name:
                return s
        raise KeyError(name)


# --------------------------------------------------------------------------------------
# the arithmetic


def _exact(x: float) -> Fraction:
    """A float as the decimal it was written as (0.2 -> 1/5, not 0.2000000000000000111)."""
    return Fraction(repr(x)) if isinstance(x, float) else Fraction(x)


def activation_estimate(inp: PlanInput) -> Activations:
    """c·B·S·H·L without checkpointing. With checkpointing: one block-boundary tensor per
    layer is stored (checkpoint_bytes·B·S·H·L) and one block's full activations
    (c·B·S·H) are rebuilt at a time during backward."""
    if inp.activation_bytes is not None:
        return Activations(inp.activation_bytes, inp.activation_bytes, 0, "given")
    if inp.micro_batch is None:
        return Activations(0, 0, 0, "none")
    bsh = inp.micro_batch * inp.seq_len * inp.hidden
    if not inp.checkpointing:
        full = math.ceil(_exact(inp.activation_coeff) * bsh * inp.layers)
        return Activations(full, full, 0, "shape")
    stored = inp.checkpoint_bytes * bsh * inp.layers
    recompute = math.ceil(_exact(inp.activation_coeff) * bsh)
    return Activations(stored + recompute, stored, recompute, "shape")


def _collectives(stage: str, inp: PlanInput) -> tuple[Collective, ...]:
    psi, g, r = inp.params, inp.gather, inp.reduce
    if inp.world_size == 1:
        return ()  # nothing to communicate
    if stage == "dp":
        return (Collective("all_reduce", "gradients", 2, 2 * psi * r),)
    if stage in ("zero1", "zero2"):
        return (Collective("reduce_scatter", "gradients", 1, psi * r),
                Collective("all_gather", "updated parameters", 1, psi * g))
    out = [Collective("all_gather", "parameters (forward)", 1, psi * g)]
    if inp.reshard_after_forward:
        out.append(Collective("all_gather", "parameters (backward)", 1, psi * g))
    out.append(Collective("reduce_scatter", "gradients", 1, psi * r))
    return tuple(out)


def plan(inp: PlanInput) -> Plan:
    """Memory and communication of every stage, and the lowest stage that fits."""
    n, psi = inp.world_size, inp.params
    act = activation_estimate(inp)
    cap = inp.device_memory_bytes
    reserve = None
    if cap is not None:
        reserve = max(math.ceil(_exact(inp.headroom_fraction) * cap), inp.headroom_bytes or 0)
    notes = []
    if inp.largest_unit_params is not None:
        unit = inp.largest_unit_params * inp.gather
        z3_transient = unit * (1 + inp.prefetch_depth)
    else:
        z3_transient = 0
        notes.append("ZeRO-3 transient (gathered unit + prefetch) not counted: largest unit "
                     "unknown")
    if not inp.reshard_after_forward:
        z3_transient = psi * inp.gather  # every unit stays gathered from forward to backward
        notes.append("reshard_after_forward=False: ZeRO-3 holds the gathered parameters from "
                     "forward to backward (memory like ZeRO-2, communication 2Ψ)")
    if n == 1:
        notes.append("N=1: nothing is sharded and nothing is communicated")
    stages = []
    for name in STAGES:
        p, g, o = model_state_bytes(name, psi, n, inp.optimizer_bytes_per_param,
                                    inp.param_bytes, inp.grad_bytes)
        t = z3_transient if name == "zero3" else 0
        colls = _collectives(name, inp)
        nominal = sum(c.bytes for c in colls)
        total = p + g + o + act.total_bytes + t
        fits = None if cap is None else total + reserve <= cap
        stages.append(StagePlan(
            stage=name, label=STAGE_LABELS[name], pytorch=PYTORCH_NAMES[name],
            params_bytes=p, grads_bytes=g, optimizer_bytes=o,
            activations_bytes=act.total_bytes, transient_bytes=t, collectives=colls,
            comm_wire_bytes_per_step=nominal * (n - 1) // n,
            fits=fits, headroom_bytes=None if cap is None else cap - total))
    lowest = next((s.stage for s in stages if s.fits), None)
    return Plan(inputs=inp, activations=act, stages=tuple(stages), reserve_bytes=reserve,
                lowest_fitting_stage=lowest, notes=tuple(notes))


def model_state_bytes(stage: str, params: int, world_size: int, optimizer_bytes_per_param,
                      param_bytes: int, grad_bytes: int) -> tuple[int, int, int]:
    """(params, grads, optimizer) bytes per GPU at `stage`. A shard is ceil(Ψ/N) elements
    (FSDP pads every rank's shard to the same size)."""
    shard = -(-params // world_size)
    k = _exact(optimizer_bytes_per_param)
    full_p, full_g, full_o = params * param_bytes, params * grad_bytes, math.ceil(k * params)
    sh_p, sh_g, sh_o = shard * param_bytes, shard * grad_bytes, math.ceil(k * shard)
    return {"dp": (full_p, full_g, full_o), "zero1": (full_p, full_g, sh_o),
            "zero2": (full_p, sh_g, sh_o), "zero3": (sh_p, sh_g, sh_o)}[stage]


def max_params(stage: str, world_size: int, available_bytes: int, *,
               optimizer_bytes_per_param: float = 12, param_bytes: int = 2,
               grad_bytes: int = 2) -> int:
    """Largest Ψ whose model states fit `available_bytes` per GPU at `stage` (no
    activations): the inverse of the memory formulas, consistent with `plan`."""
    if stage not in STAGES:
        raise UserError(f"unknown stage {stage!r} (known: {', '.join(STAGES)})")
    n, k = Fraction(world_size), _exact(optimizer_bytes_per_param)
    p, g = Fraction(param_bytes), Fraction(grad_bytes)
    per_param = {"dp": p + g + k, "zero1": p + g + k / n, "zero2": p + (g + k) / n,
                 "zero3": (p + g + k) / n}[stage]
    psi = math.floor(Fraction(available_bytes) / per_param)
    args = (world_size, optimizer_bytes_per_param, param_bytes, grad_bytes)
    while psi > 0 and sum(model_state_bytes(stage, psi, *args)) > available_bytes:
        psi -= 1  # shard padding: at most a few world sizes' worth of steps
    return psi


# --------------------------------------------------------------------------------------
# parsing and formatting

_COUNT_SUFFIX = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9, "t": 10**12}
_SIZE_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
               "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def _number(text: str, what: str) -> Fraction:
    try:
        v = Fraction(text.replace("_", "").replace(",", ""))
    except (ValueError, ZeroDivisionError):
        raise UserError(f"{what}: {text!r} is not a number") from None
    return v


MAX_COUNT = 10 ** 16  # parameters: far beyond any model, and still exact in a float
MAX_SIZE = 10 ** 21  # bytes (a zettabyte): far beyond any device or run


def parse_count(text: str) -> int:
    """A parameter count: "70B", "1.3M", "13e9", "7_000_000", "125k"."""
    m = re.fullmatch(r"\s*([0-9][0-9_.,]*(?:e[+-]?\d+)?)\s*([kmbgt]?)\s*", str(text), re.I)
    if not m:
        raise UserError(f"parameter count {text!r}: expected a number like 70B, 1.3M, 13e9")
    v = _number(m.group(1), "parameter count") * _COUNT_SUFFIX[m.group(2).lower()]
    if v < 1:
        raise UserError(f"parameter count {text!r} must be at least 1")
    if v > MAX_COUNT:
        raise UserError(f"parameter count {text!r} is more than {MAX_COUNT:.0e}")
    return round(v)


def parse_size(text: str) -> int:
    """A byte size with an explicit unit: "80GB" (10^9), "80GiB" (2^30), "512MiB", "1e9B".
    A bare "G" is refused: say GB or GiB."""
    m = re.fullmatch(r"\s*([0-9][0-9_.,]*(?:e[+-]?\d+)?)\s*([a-z]*)\s*", str(text), re.I)
    unit = m.group(2).lower() if m else ""
    if not m or unit not in _SIZE_UNITS:
        raise UserError(f"size {text!r}: expected a number and a unit, e.g. 80GB (decimal) "
                        f"or 80GiB (binary)")
    v = _number(m.group(1), "size") * _SIZE_UNITS[unit]
    if v <= 0:
        raise UserError(f"size {text!r} must be positive")
    if v > MAX_SIZE:
        raise UserError(f"size {text!r} is more than {MAX_SIZE:.0e} bytes")
    return round(v)


from .humanize import UNIT_CHOICES, UNITS, format_bytes, format_count, unit_scale  # noqa: E402,F401

UNIT_NOTE = {"auto": "decimal units, each number in the one that fits it (1 MB = 10^6 "
                     "bytes, 1 GB = 10^9 bytes)", "tb": "decimal TB (1 TB = 10^12 bytes)", "gb": "decimal GB (1 GB = 10^9 bytes)",
             "mb": "decimal MB (1 MB = 10^6 bytes)", "kb": "decimal kB (1 kB = 10^3 bytes)",
             "gib": "binary GiB (1 GiB = 2^30 bytes)", "mib": "binary MiB (1 MiB = 2^20 bytes)"}


def format_table(p: Plan, units: str = "gb", digits: int = 1) -> str:
    """The human report: one row per stage, then the verdict. Sizes in `units`, labelled
    once; "auto": every size in the decimal unit that fits it, labelled in each cell (one
    formatter, `format_bytes`: a small model's 16 MB beside a device's 16.0 GB, never
    "16000.0 MB")."""
    inp = p.inputs
    if units != "auto":
        scale, _label = unit_scale(units)

    def num(b: int | None) -> str:
        if b is None:
            return "-"
        return format_bytes(b, "auto", digits) if units == "auto" else f"{b / scale:.{digits}f}"

    lines = [
        f"ZeRO stage plan: {format_count(inp.params)} parameters ({inp.params:,}), "
        f"sharding degree N={inp.world_size}",
        f"bytes per parameter: params {inp.param_bytes}, grads {inp.grad_bytes}, "
        f"optimizer K={inp.optimizer_bytes_per_param:g}; all-gather {inp.gather}, "
        f"reduce {inp.reduce}",
    ]
    a = p.activations
    if a.source == "shape":
        how = ("with activation checkpointing: stored "
               f"{format_bytes(a.stored_bytes, units, digits)} + recompute "
               f"{format_bytes(a.recompute_bytes, units, digits)}" if inp.checkpointing
               else f"{inp.activation_coeff:g}·B·S·H·L")
        lines.append(f"activations: B={inp.micro_batch} S={inp.seq_len} H={inp.hidden} "
                     f"L={inp.layers}, {how}")
    elif a.source == "given":
        lines.append(f"activations: {format_bytes(a.total_bytes, units, digits)} (given)")
    else:
        lines.append("activations: not given (model states only)")
    lines.append(f"per GPU, in {UNIT_NOTE[units]}")
    lines.append("")
    head = ("stage", "params", "grads", "optim", "states", "activ", "transient", "total",
            "free", "fits", "comm/step")
    rows = []
    for s in p.stages:
        fits = "-" if s.fits is None else ("yes" if s.fits else "no")
        comm = f"{s.comm_psi}Ψ {format_bytes(s.comm_bytes_per_step, units, digits)}"
        rows.append((s.label, num(s.params_bytes), num(s.grads_bytes), num(s.optimizer_bytes),
                     num(s.model_states_bytes), num(s.activations_bytes),
                     num(s.transient_bytes), num(s.total_bytes), num(s.headroom_bytes),
                     fits, comm))
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
    for r in [head] + rows:
        cells = [r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:-2], widths[1:-2])]
        cells += [r[-2].ljust(widths[-2]), r[-1]]
        lines.append("  ".join(cells).rstrip())
    lines.append("")
    if inp.device_memory_bytes is None:
        lines.append("no device memory given: pass it to name the lowest stage that fits")
    else:
        pct = f"{inp.headroom_fraction:.0%} headroom"
        if inp.headroom_bytes and p.reserve_bytes == inp.headroom_bytes:
            pct = "requested headroom"
        lines.append(f"device memory {format_bytes(inp.device_memory_bytes, units, digits)}; "
                     f"must stay free: {format_bytes(p.reserve_bytes, units, digits)} ({pct})")
        if p.lowest_fitting_stage is None:
            lines.append("no stage fits: shard over more GPUs, checkpoint activations, "
                         "or split layers (tensor / pipeline parallelism)")
        else:
            s = p.stage(p.lowest_fitting_stage)
            lines.append(f"lowest stage that fits: {s.label} ({s.pytorch}): "
                         f"{format_bytes(s.total_bytes, units, digits)} per GPU, "
                         f"{format_bytes(s.headroom_bytes, units, digits)} free, "
                         f"communication {s.comm_psi}Ψ per step")
            z3 = p.stage("zero3")
            if s.stage != "zero3" and z3.comm_psi > s.comm_psi:
                lines.append(f"ZeRO-3 would move {z3.comm_psi}Ψ per step "
                             f"({z3.comm_psi / s.comm_psi:g}x) for memory this run does "
                             f"not need")
    lines.append("comm/step: nominal bytes each GPU sends per step (ZeRO-paper convention, "
                 "Ψ elements per collective); a ring moves (N-1)/N of it")
    lines += [f"{s.label:<7} = {s.pytorch}" for s in p.stages]
    lines += [f"note: {n}" for n in p.notes]
    return "\n".join(lines)


def plan_to_dict(p: Plan) -> dict:
    """JSON-able plan, all sizes in bytes. Keys (stable, schema "zerodoc.plan/1"):

    schema, units ("bytes"), inputs (every PlanInput field), activations {total_bytes,
    stored_bytes, recompute_bytes, source}, device_memory_bytes, reserve_bytes,
    lowest_fitting_stage (stage name or null), notes, and stages: a list (dp, zero1, zero2,
    zero3) of {stage, label, pytorch, params_bytes, grads_bytes, optimizer_bytes,
    model_states_bytes, activations_bytes, transient_bytes, total_bytes, comm_psi,
    comm_bytes_per_step, comm_wire_bytes_per_step, collectives [{collective, what, psi,
    bytes}], fits (bool or null), headroom_bytes (int or null)}.
    """
    inp = p.inputs
    return {
        "schema": "zerodoc.plan/1",
        "units": "bytes",
        "inputs": {f.name: getattr(inp, f.name) for f in fields(inp)},
        "activations": {"total_bytes": p.activations.total_bytes,
                        "stored_bytes": p.activations.stored_bytes,
                        "recompute_bytes": p.activations.recompute_bytes,
                        "source": p.activations.source},
        "device_memory_bytes": inp.device_memory_bytes,
        "reserve_bytes": p.reserve_bytes,
        "lowest_fitting_stage": p.lowest_fitting_stage,
        "notes": list(p.notes),
        "stages": [{
            "stage": s.stage, "label": s.label, "pytorch": s.pytorch,
            "params_bytes": s.params_bytes, "grads_bytes": s.grads_bytes,
            "optimizer_bytes": s.optimizer_bytes, "model_states_bytes": s.model_states_bytes,
            "activations_bytes": s.activations_bytes, "transient_bytes": s.transient_bytes,
            "total_bytes": s.total_bytes, "comm_psi": s.comm_psi,
            "comm_bytes_per_step": s.comm_bytes_per_step,
            "comm_wire_bytes_per_step": s.comm_wire_bytes_per_step,
            "collectives": [{"collective": c.collective, "what": c.what, "psi": c.psi,
                             "bytes": c.bytes} for c in s.collectives],
            "fits": s.fits, "headroom_bytes": s.headroom_bytes,
        } for s in p.stages],
    }
