"""`zerodoc plan`: which ZeRO stage fits, and what each stage costs in communication.

Takes the model from flags (--params, --world-size, ...) or from a live run's log (--run DIR:
parameter count, sharding degree, dtypes, device memory and measured activations); flags
given explicitly override what the run says. Prints a table (default) or JSON (--json).
Stdlib only; the arithmetic is in `zerodoc.planner`.
"""

from __future__ import annotations

import dataclasses
import json
from fractions import Fraction

from .. import planner
from .helpformat import RawDescriptionDefaultsHelpFormatter
from ..errors import UserError

EPILOG = """\
examples:
  zerodoc plan --params 13B -N 8 --device-memory 80GB
  zerodoc plan --params 70B -N 64 --device-memory 80GB --headroom 30GB
  zerodoc plan --params 6.7B -N 8 --micro-batch 8 --seq-len 2048 --hidden 4096 \\
      --layers 32 --checkpointing --device-memory 40GiB --units gib
  zerodoc plan --run zerodoc-runs/<job id> --json

sizes need a unit: GB/MB (decimal, 10^9/10^6 bytes) or GiB/MiB (binary, 2^30/2^20 bytes).
optimizer presets (bytes per parameter: params / grads / optimizer K):
""" + "\n".join(f"  {p.name:<18} {p.param_bytes} / {p.grad_bytes} / {p.optimizer_bytes_per_param:g}"
                f"  {p.description}" for p in planner.PRESETS.values())


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "plan", help="per-GPU memory and communication of DP / ZeRO-1/2/3; lowest stage that fits",
        description="Per-GPU memory (params, grads, optimizer state, activations, transient "
                    "buffers) and per-step communication (2Ψ vs 3Ψ) for DP, ZeRO-1, ZeRO-2 "
                    "and ZeRO-3, and the lowest stage that fits the device with headroom.",
        epilog=EPILOG, formatter_class=RawDescriptionDefaultsHelpFormatter)
    m = p.add_argument_group("model")
    m.add_argument("--params", help="parameter count: 70B, 1.3M, 13e9")
    m.add_argument("--world-size", "-N", type=int, dest="world_size",
                   help="sharding degree (data-parallel ranks)")
    o = m.add_mutually_exclusive_group()
    o.add_argument("--optimizer", metavar="PRESET",
                   help=f"recipe preset (default adam-mixed): {', '.join(planner.PRESETS)}")
    o.add_argument("--optimizer-bytes", metavar="K", type=float,
                   help="optimizer bytes per parameter (12 = mixed-precision Adam)")
    m.add_argument("--param-dtype", help="stored parameter dtype: bf16, fp16, fp32")
    m.add_argument("--grad-dtype", help="gradient dtype: bf16, fp16, fp32")
    m.add_argument("--largest-unit", metavar="PARAMS",
                   help="parameters of the largest sharded unit (ZeRO-3 gathered buffer)")
    m.add_argument("--prefetch", type=int, default=None, metavar="DEPTH",
                   help="units prefetched beside the one computing (default 1)")
    m.add_argument("--no-reshard-after-forward", action="store_true",
                   help="ZeRO-3 keeps gathered params from forward to backward (2Ψ comm)")
    a = p.add_argument_group("activations (all four shape flags, or --activation-memory)")
    a.add_argument("--micro-batch", type=int)
    a.add_argument("--seq-len", type=int)
    a.add_argument("--hidden", type=int)
    a.add_argument("--layers", type=int)
    a.add_argument("--checkpointing", action="store_true", default=None,
                   help="activation checkpointing: keep one tensor per block boundary")
    a.add_argument("--activation-coeff", type=float, default=None, metavar="C",
                   help="bytes per B·S·H·L element without recomputation (default 34)")
    a.add_argument("--activation-memory", metavar="SIZE",
                   help="activation bytes per rank, given directly (e.g. 12GB)")
    d = p.add_argument_group("device")
    d.add_argument("--device-memory", metavar="SIZE", help="per-GPU memory: 80GB, 80GiB")
    d.add_argument("--headroom", metavar="FRACTION|SIZE",
                   help="memory that must stay free: a fraction of the device (0.2, 20%%) "
                        "or a size (30GB); default 0.2")
    out = p.add_argument_group("output")
    out.add_argument("--units", choices=planner.UNIT_CHOICES, default="auto",
                     help="table sizes: gb / mb decimal (10^9 / 10^6 bytes), gib / mib binary "
                          "(2^30 / 2^20 bytes); default auto: decimal, each size in the unit "
                          "that fits it (kB, MB, GB, TB), labelled")
    out.add_argument("--json", action="store_true", help="machine-readable output (bytes)")
    p.add_argument("--run", metavar="DIR", help="take the facts of a live run from its run log")
    p.set_defaults(func=run)


def _headroom(text: str) -> tuple[float, int | None]:
    """(fraction, absolute bytes) from "0.2", "20%" or "30GB"."""
    t = text.strip()
    try:
        if t.endswith("%"):
            frac = Fraction(t[:-1]) / 100
        else:
            frac = Fraction(t)
    except (ValueError, ZeroDivisionError):
        return 0.0, planner.parse_size(t)
    if not 0 <= frac < 1:
        raise UserError(f"--headroom {text!r}: a fraction must be in [0, 1); for an amount "
                        "give a unit, e.g. 30GB")
    return float(frac), None


def run_plan_input(run_dir: str) -> dict:
    """The run's planner input, as the rules plan from it (`Context.plan_input`), and how
    to name the run: {"kw": PlanInput keywords, "stage", "desc", "measured_optimizer"}."""
    from ..diagnosis.context import Context
    from ..runlog import load_run

    snap = load_run(run_dir)
    r = snap.any_rank
    if r is None:
        raise UserError(f"{run_dir}: no rank logs")
    f = r.facts
    ctx = Context(snap)
    inp = ctx.plan_input()
    kw = dataclasses.asdict(inp) if inp is not None else {"world_size": f.world_size}
    w = next(iter(ctx.active.values()), None) or r
    measured = ctx.optimizer_bytes_measured(w) if inp is not None else None
    if kw.get("activation_bytes") is None:
        kw.pop("activation_bytes", None)
    stage = ctx.stage if f.zero_stage is not None or ctx.zero3 else None
    desc = (f"run {f.run_id or run_dir} ({f.framework}, world size {f.world_size}"
            + (f", running {planner.STAGE_LABELS[stage]}" if stage else "") + ")")
    return {"kw": kw, "stage": stage, "desc": desc, "measured_optimizer": measured}


def build_input(args) -> tuple[planner.PlanInput, str | None, dict | None]:
    """PlanInput from flags, over the run's facts when --run is given; the preset name."""
    run = run_plan_input(args.run) if args.run else None
    kw = dict(run["kw"]) if run else {}
    from_run_bytes = "param_bytes" in kw
    preset_name = None
    if args.optimizer_bytes is not None:
        kw["optimizer_bytes_per_param"] = args.optimizer_bytes
    elif run and run["measured_optimizer"] is not None and args.optimizer is None:
        pass  # the run's measured optimizer state, as the rules use it
    else:
        if args.optimizer is not None or not from_run_bytes:
            preset = planner.optimizer_preset(args.optimizer or "adam-mixed")
        else:  # fp32 stored params are their own master copy: Adam adds m + v only
            preset = planner.PRESETS["adam-fp32" if kw["param_bytes"] >= 4 else "adam-mixed"]
        preset_name = preset.name
        kw["optimizer_bytes_per_param"] = preset.optimizer_bytes_per_param
        if not from_run_bytes or args.optimizer is not None:
            kw["param_bytes"], kw["grad_bytes"] = preset.param_bytes, preset.grad_bytes
    if from_run_bytes and "grad_bytes" not in kw:
        kw["grad_bytes"] = kw["param_bytes"]  # FSDP keeps sharded grads in the param dtype
    if args.params is not None:
        kw["params"] = planner.parse_count(args.params)
        kw.pop("largest_unit_params", None)
    if args.world_size is not None:
        kw["world_size"] = args.world_size
    if args.param_dtype:
        kw["param_bytes"] = planner.dtype_bytes(args.param_dtype)
    if args.grad_dtype:
        kw["grad_bytes"] = planner.dtype_bytes(args.grad_dtype)
    if args.largest_unit:
        kw["largest_unit_params"] = planner.parse_count(args.largest_unit)
    if args.prefetch is not None:
        kw["prefetch_depth"] = args.prefetch
    if args.no_reshard_after_forward:
        kw["reshard_after_forward"] = False
    shape = {k: getattr(args, k) for k in ("micro_batch", "seq_len", "hidden", "layers")}
    if any(v is not None for v in shape.values()):
        kw.pop("activation_bytes", None)
        kw.update(shape)
    if args.checkpointing:
        kw["checkpointing"] = True
    if args.activation_coeff is not None:
        kw["activation_coeff"] = args.activation_coeff
    if args.activation_memory:
        kw["activation_bytes"] = planner.parse_size(args.activation_memory)
    if args.device_memory:
        kw["device_memory_bytes"] = planner.parse_size(args.device_memory)
    if args.headroom is not None:
        kw["headroom_fraction"], kw["headroom_bytes"] = _headroom(args.headroom)
    if "params" not in kw:
        raise UserError("--params is required (or --run DIR with sharded units)")
    if "world_size" not in kw:
        raise UserError("--world-size/-N is required (or --run DIR)")
    return planner.PlanInput(**kw), preset_name, run


def run(args) -> int:
    inp, preset, run_facts = build_input(args)
    p = planner.plan(inp)
    if args.json:
        d = planner.plan_to_dict(p)
        d["optimizer_preset"] = preset
        if run_facts:
            d["run"] = {"dir": args.run, "current_stage": run_facts["stage"]}
        print(json.dumps(d, indent=2))
        return 0
    if run_facts:
        print(f"from {run_facts['desc']}")
    if preset:
        how = "" if args.optimizer else "; assumed, change with --optimizer/--optimizer-bytes"
        print(f"optimizer preset: {preset} ({planner.PRESETS[preset].description}{how})")
    elif run_facts and run_facts["measured_optimizer"] is not None and \
            args.optimizer_bytes is None:
        print(f"optimizer state: {inp.optimizer_bytes_per_param:g} bytes per parameter, "
              "measured in the run (change with --optimizer/--optimizer-bytes)")
    print(planner.format_table(p, units=args.units))
    stage = run_facts["stage"] if run_facts else None
    print_over_staging(p, stage)
    return 0


def print_over_staging(p: planner.Plan, stage: str | None) -> None:
    """The step down from the run's stage that fits (what ZD003 recommends: ZeRO-3 -> ZeRO-2
    is one setting, `reshard_after_forward=False`), and the lowest stage that fits."""
    if stage not in planner.STAGES:
        return
    below = [s for s in planner.STAGES[:planner.STAGES.index(stage)] if p.stage(s).fits]
    if not below:
        return
    step, low = below[-1], below[0]
    line = f"this run uses {planner.STAGE_LABELS[stage]}; {planner.STAGE_LABELS[step]} " \
           f"would fit (over-staging)"
    if low != step:
        line += (f"; the lowest stage that fits is {planner.STAGE_LABELS[low]} "
                 f"({planner.PYTORCH_NAMES[low]})")
    print(line)
