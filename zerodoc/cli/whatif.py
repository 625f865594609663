"""`zerodoc whatif SOURCE [changes]`: what a configuration change would do, predicted from the
measured run by a step model fitted to it (zerodoc/whatif, docs/whatif.md)."""

from __future__ import annotations

import json
import math
import re
import sys

from ..catalog import COLLECTIVES as KINDS  # the collective kinds, as the metrics name them
from .helpformat import DefaultsHelpFormatter


def add_parser(sub) -> None:
    p = sub.add_parser(
        "whatif", help="predict what a configuration change would do, from a measured run",
        description="Fit a step model to a measured run (a run directory, rank endpoints "
        "host:port[,...], a Prometheus URL or PyTorch profiler traces: per unit and phase the "
        "measured compute, per collective a latency + bandwidth fitted to the run's own "
        "calls, the ranks' waits for each other, the framework's ordering, its own time "
        "per unit priced per call, per parameter tensor (where the run log recorded them) "
        "and per byte) and predict the step time, the exposed communication and the peak "
        "memory per rank of a changed configuration, each with a range. The model's replay of the measured configuration is printed beside the "
        "measurement as its own check. Numbers are per step and per rank (the worst rank's). "
        "Exit status: 0, 2 on bad input.",
        formatter_class=DefaultsHelpFormatter)
    p.add_argument("source", metavar="SOURCE", help="the measured run")
    p.add_argument("--window", type=int, default=20, metavar="STEPS",
                   help="steps of the run to fit to (the last N; 0: all). The default is "
                   "report's, TUI's and compare's: one run, one window, the same numbers")
    from .options import add_warmup_argument

    add_warmup_argument(p)
    g = p.add_argument_group("changes (none: replay the measured configuration)")
    ra = g.add_mutually_exclusive_group()
    ra.add_argument("--reshard-after-forward", dest="reshard", action="store_const",
                    const=True, default=None, help="reshard after forward on (ZeRO-3)")
    ra.add_argument("--no-reshard-after-forward", dest="reshard", action="store_const",
                    const=False, help="reshard after forward off (ZeRO-2-like: no backward "
                    "all-gathers)")
    g.add_argument("--prefetch", type=int, default=None, metavar="DEPTH",
                   help="0: synchronous unshard; 1 or 2: asynchronous unshard prefetching "
                        "that many units ahead")
    g.add_argument("--merge", default=None, metavar="K|blocks",
                   help="merge every K consecutive units into one, or all units of each "
                        "block ('blocks')")
    g.add_argument("--world-size", type=int, default=None, metavar="N",
                   help="sharding group size (per-rank micro-batch kept)")
    g.add_argument("--latency", default=None, metavar="[KIND=]VALUE",
                   help="latency per call: 2ms (set), 0ms..2ms (set to 2 ms, the range reaching "
                        "down to 0), x0.5 (scale), +5ms / -50ms (add: write --latency=-50ms); "
                        f"KIND one of {', '.join(KINDS)} (default: every kind)")
    g.add_argument("--bandwidth", default=None, metavar="[KIND=]VALUE",
                   help="bus bandwidth: 10GB (bytes per second, set) or x2 (scale)")
    g.add_argument("--micro-batch-scale", type=float, default=None, metavar="F",
                   help="micro-batch scaled by F (compute and activation memory scale)")
    from .options import add_link_profile_argument

    add_link_profile_argument(p)
    p.add_argument("--json", action="store_true", help="machine-readable JSON")
    p.set_defaults(func=run)


def _kind(spec: str, flag: str) -> tuple[str | None, str]:
    kind, sep, value = spec.partition("=")
    if not sep:
        return None, spec.strip()
    kind = kind.strip()
    if kind not in KINDS:
        from ..errors import UserError

        raise UserError(f"{flag} {spec!r}: unknown collective {kind!r} "
                        f"(known: {', '.join(KINDS)})")
    return kind, value.strip()


def _seconds(text: str, flag: str) -> float:
    from ..errors import UserError

    m = re.fullmatch(r"([0-9]*\.?[0-9]+(?:e[+-]?\d+)?)\s*(us|ms|s)", text, re.I)
    if not m:
        raise UserError(f"{flag}: {text!r} is not a time (e.g. 2ms, 150us, 0.01s)")
    v = float(m.group(1)) * {"us": 1e-6, "ms": 1e-3, "s": 1.0}[m.group(2).lower()]
    if not math.isfinite(v):
        raise UserError(f"{flag}: {text!r} is not a finite time")
    return v


def _scale(text: str, flag: str) -> float:
    from ..errors import UserError

    try:
        v = float(text[1:])
    except ValueError:
        v = float("nan")
    if not (math.isfinite(v) and v > 0):
        raise UserError(f"{flag}: {text!r} must be x followed by a number > 0 (e.g. x0.5)")
    return v


def changes_from_args(args):
    """The `Changes` a command line asks for (UserError on a bad value)."""
    from ..errors import UserError
    from ..planner import parse_size
    from ..whatif import Changes

    kw: dict = {"reshard_after_forward": args.reshard}
    if args.prefetch is not None:
        if args.prefetch not in (0, 1, 2):
            raise UserError(f"--prefetch must be 0, 1 or 2, not {args.prefetch}")
        kw["prefetch"] = args.prefetch
    if args.merge is not None:
        m = args.merge.strip().lower()
        if m == "blocks":
            kw["merge"] = "blocks"
        elif m.isdigit() and int(m) >= 2:
            kw["merge"] = int(m)
        else:
            raise UserError(f"--merge must be an integer >= 2 or 'blocks', not {args.merge!r}")
    if args.world_size is not None:
        if not 1 <= args.world_size <= 10**7:
            raise UserError(f"--world-size must be between 1 and 10000000, not "
                            f"{args.world_size}")
        kw["world_size"] = args.world_size
    if args.latency is not None:
        kind, v = _kind(args.latency, "--latency")
        kw["latency_kind"] = kind
        if v.startswith("x"):
            kw["latency_scale"] = _scale(v, "--latency")
        elif v[:1] in "+-" and v:
            kw["latency_add_s"] = (-1 if v[0] == "-" else 1) * _seconds(v[1:], "--latency")
        elif ".." in v:  # LOW..SET: set, the range reaching down to LOW
            low, _, hi = v.partition("..")
            kw["latency_set_s"] = _seconds(hi, "--latency")
            kw["latency_set_low_s"] = _seconds(low, "--latency")
            if kw["latency_set_low_s"] > kw["latency_set_s"]:
                raise UserError(f"--latency: {v!r}: the low end is above the set latency")
        else:
            kw["latency_set_s"] = _seconds(v, "--latency")
    if args.bandwidth is not None:
        kind, v = _kind(args.bandwidth, "--bandwidth")
        kw["bandwidth_kind"] = kind
        if v.startswith("x"):
            kw["bandwidth_scale"] = _scale(v, "--bandwidth")
        else:
            b = parse_size(v)
            if b <= 0:
                raise UserError(f"--bandwidth: {v!r} must be more than 0 bytes per second")
            kw["bandwidth_set"] = float(b)
    if args.micro_batch_scale is not None:
        s = args.micro_batch_scale
        if not (math.isfinite(s) and 0 < s <= 1e4):
            raise UserError(f"--micro-batch-scale must be a number in (0, 10000], not {s}")
        kw["micro_batch_scale"] = s
    return Changes(**kw)


def _ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 1e3:.1f} ms"


def _range(r) -> str:
    return f"[{r[0] * 1e3:.1f}, {r[1] * 1e3:.1f}] ms"


def _mb(x) -> str:
    return "not known" if x is None else f"{x / 1e6:.1f} MB"


def _framework_line(fw: dict) -> str:
    """How the framework's time is priced: fitted per unit, or per step (older logs)."""
    head = f"framework time {fw['measured_s'] * 1e3:.1f} ms per step, priced "
    if fw["pricing"] != "per unit":
        return head + "per byte of the step's total (range to per call): " + \
            fw["note"].split(": ", 1)[-1]
    tensor = "" if fw.get("per_tensor_s") is None else \
        f" + {fw['per_tensor_s'] * 1e6:.1f} us per parameter tensor " \
        f"(± {fw['se_per_tensor_s'] * 1e6:.1f})"
    why = "" if tensor or "(" not in fw["note"] else \
        " (no part per tensor: " + fw["note"].split("(", 1)[1].split(")", 1)[0] + ")"
    return (head + f"per unit: {fw['per_call_s'] * 1e6:.0f} us per call "
            f"(± {fw['se_call_s'] * 1e6:.0f}){tensor} + {fw['per_byte_s'] * 1e9:.2f} ms per MB "
            f"(± {fw['se_per_byte_s'] * 1e9:.2f}), fitted over {fw['units']} units per rank "
            f"({fw.get('ranks', 1)} ranks pooled){why}; "
            f"{fw['rest_s'] * 1e3:.1f} ms of no unit")


def _link_model_lines(lm: dict | None) -> list[str]:
    """How the change's calls beyond the run's largest are priced (`model.link_model`)."""
    if not lm:
        return []
    out = []
    prof = lm.get("profile")
    if prof:
        out.append(f"link profile {prof['path']}: {prof['backend']}, group {prof['group_size']},"
                   f" host {prof['host']} ({', '.join(prof['collectives'])})"
                   + "".join(f"; {d}" for d in prof.get("differs", ())))
    for b in lm["beyond_run_sizes"]:
        head = (f"{b['collective']} calls up to {b['ratio']:.1f}x the run's largest "
                f"({b['largest_predicted_bytes'] / 1e6:.2f} MB per call against "
                f"{b['largest_measured_bytes'] / 1e6:.2f} MB): ")
        if b["priced_by"] == "line":
            out.append(head + "extrapolated along the fitted line" +
                       ("" if prof else " (no --link-profile; a cost per byte that grows past "
                        "the run's sizes is not seen)"))
        else:
            lo, hi = b["profile_scale_range"]
            out.append(head + f"the run's fit at its largest call + the profile's increase "
                       f"x{b['profile_scale']:.2f} (range x{lo:.2f}-x{hi:.2f})" +
                       (", beyond the profile's largest size too" if b["beyond_profile"]
                        else ""))
    return out


def render_text(doc: dict) -> str:
    m, b, p = doc["measured"], doc["baseline"], doc["predicted"]
    sem = doc["semantics"]
    lines = [
        f"what-if for {doc['source']}: {doc['ranks']} ranks, {doc['steps']} steps with "
        f"per-unit detail; per step, per rank (the worst rank's)",
        *([doc["live"] + ": its numbers may still move"] if doc.get("live") else []),
        f"model: {sem['framework']}, {'synchronous' if sem['sync_unshard'] else 'asynchronous'}"
        f" unshard (prefetch {sem['prefetch']}), reshard after forward "
        f"{'on' if sem['reshard_after_forward'] else 'off'}, reductions "
        f"{'synchronous' if sem['sync_reduce'] else 'asynchronous'}",
    ]
    for link in doc["links"]:
        bw = link["bandwidth_bytes_per_s"]
        lines.append(f"link {link['collective']} (group {link['group_size']}): latency "
                     f"{link['latency_s'] * 1e3:.2f} ms, bus bandwidth "
                     f"{'not seen' if bw is None else f'{bw / 1e9:.2f} GB/s'}, residual "
                     f"{link['resid_s'] * 1e3:.2f} ms per call ({link['points']} points)")
    lines += _link_model_lines(doc.get("link_model"))
    fw = doc.get("framework")
    if fw:
        lines.append(_framework_line(fw))
        over = fw.get("beyond_run_sizes")
        if over:
            lines.append(
                f"framework: units up to {over['ratio']:.1f}x the run's largest "
                f"({over['largest_predicted_bytes'] / 1e6:.2f} MB per call against "
                f"{over['largest_measured_bytes'] / 1e6:.2f} MB): priced along the fitted "
                f"line, the range's high end at the run's framework time per byte "
                f"({over['high_end_per_byte_s'] * 1e9:.2f} ms per MB; its cost per byte can "
                f"grow past the run's sizes)")
    err = b["step_error"]
    lines += [
        "",
        f"{'':12}{'step':>12}{'exposed comm':>16}{'peak memory':>14}",
        f"{'measured':12}{_ms(m['step_s']):>12}{_ms(m['exposed_comm_s']):>16}{'':>14}",
        f"{'replayed':12}{_ms(b['step_s']):>12}{_ms(b['exposed_comm_s']):>16}"
        f"{_mb(b['peak_bytes']):>14}",
        f"{'':12}measured: the worst rank's means; exposed comm: all collectives "
        f"({doc['covers']}), not the link-attributable part ZD006 grades"
        if doc.get("covers") else None,
        f"{'':12}replayed: the step model's replay of the measured configuration",
        f"check: the replay of the measured configuration is "
        f"{'n/a' if err is None else f'{err * 100:+.1f} %'} off the measured step",
        "",
        "change: " + "; ".join(doc["changes"]),
        f"{'predicted':12}{_ms(p['step_s']):>12}{_ms(p['exposed_comm_s']):>16}"
        f"{_mb(p['peak_bytes']):>14}",
        f"{'range':12}step {_range(p['step_s_range'])}, exposed "
        f"{_range(p['exposed_comm_s_range'])}",
        _noise_line(doc["noise"]),
        *_contention_lines(doc),
        f"peak memory: {doc['peak_note']}",
    ]
    if doc["units"]:
        lines.append("units whose exposed communication changes most: " + ", ".join(
            f"{u['unit']} {u['exposed_change_s'] * 1e3:+.1f} ms" for u in doc["units"]))
    return "\n".join(x for x in lines if x is not None) + "\n"


def _contention_lines(doc: dict) -> list[str]:
    """On gloo / CPU: what the step's range holds of the collectives' contention."""
    out = []
    if doc.get("contention_s"):
        out.append(f"{'':12}contention: on a CPU backend the communication the change newly "
                   f"hides takes the compute's cores: the step's high end holds "
                   f"{doc['contention_s'] * 1e3:.1f} ms of it")
    if doc.get("contention_removed_s"):
        out.append(f"{'':12}contention: on a CPU backend the communication the change no "
                   f"longer hides gives the compute its cores back: the step's low end "
                   f"holds {doc['contention_removed_s'] * 1e3:.1f} ms of it")
    return out


def _noise_line(n: dict) -> str:
    """What of the measured means' own noise the range holds (`answer`'s "noise")."""
    step = (f"step +/-{n['step_rel'] * n['step_t'] * 100:.1f} % (over {n['step_steps']} "
            "steps)" if n["step_t"] else "none on the step (fewer than 2 step times)")
    if n["exposed_s"] is not None:
        exposed = (f"exposed +/-{n['exposed_s'] * n['exposed_t'] * 1e3:.1f} ms (over "
                   f"{n['exposed_steps']} sampled steps)")
    elif n["exposed_steps"]:
        exposed = "none on the exposed time (one sampled step: no spread to measure)"
    else:
        exposed = "none on the exposed time (the source has no per-step exposed figures)"
    return (f"{'':12}noise in the range (this run's mean and a check run's, about 95 %): "
            f"{step}, {exposed}")


def run(args) -> int:
    from ..errors import UserError
    from ..sources import open_source
    from ..whatif import answer, fit

    if args.window < 0:
        raise UserError(f"--window must be >= 0 (0: all steps), not {args.window}")
    ch = changes_from_args(args)
    source = open_source(args.source, window=args.window or None,
                         skip_warmup=not args.include_warmup)
    snap = source.snapshot()
    if not snap.ranks:
        raise UserError(f"{source.description}: no ranks to fit a model to")
    from .options import link_profile_option

    profile = link_profile_option(args)
    doc = answer(fit(snap, profile), ch)
    doc["source"] = source.description
    from ..measures import covers, live_text

    # what the measured numbers cover, and whether the run is still being written (issue 31)
    doc["covers"] = covers(snap)
    doc["live"] = live_text(snap)
    if args.json:
        sys.stdout.write(json.dumps(doc, indent=1) + "\n")
    else:
        sys.stdout.write(render_text(doc))
    return 0
