"""Offline diagnosis from PyTorch profiler traces (Kineto Chrome-trace JSON, one file per rank).

`TraceSource(spec)` turns a directory of traces (or one file, or a comma-separated list) into
the same `RunSnapshot` the live shim builds, so `zerodoc report`, `zerodoc tui` and the rules
work on traces unchanged. Modules by role:

- `stream`: streaming reader of one trace file (gzip too), bounded memory, progress;
- `events`: what is kept of the events (the event model);
- `timeline`: interval arithmetic;
- `attribution`: steps, phases, units, collectives (time, bytes, exposure), compute;
- `snapshot`: facts, windows, the source.

Importing this package imports nothing heavy; numpy is imported by the modules that need it.
"""

from __future__ import annotations


def is_trace_spec(spec: str) -> bool:
    """Whether a command-line SOURCE names profiler traces: a trace file, a comma-separated
    list of them, or a directory of traces that holds no zerodoc run logs."""
    from pathlib import Path

    from .snapshot import TRACE_SUFFIXES, looks_like_trace_dir

    parts = [p.strip() for p in spec.split(",")]
    if all(p.endswith(TRACE_SUFFIXES) for p in parts):
        return True
    return len(parts) == 1 and looks_like_trace_dir(Path(parts[0]))


def open_traces(spec, window: int | None = 20, **facts):
    """A `TraceSource` for `spec`; `facts` are `TraceFacts` fields (world_size=, stage=, ...)."""
    from .snapshot import TraceFacts, TraceSource

    return TraceSource(spec, window, facts=TraceFacts(**facts))


def add_arguments(parser) -> None:
    """The flags that add facts a trace lacks (shared by `report` and `tui`). Their default
    is SUPPRESS (absent from the namespace): the help says what is inferred instead."""
    import argparse

    none = argparse.SUPPRESS
    g = parser.add_argument_group(
        "profiler traces", "when SOURCE is PyTorch profiler traces (a directory of .json / "
        ".json.gz files, one per rank, or files separated by commas): facts the traces lack")
    g.add_argument("--world-size", type=int, default=none, metavar="N",
                   help="ranks in the job (default: the traces' distributedInfo, else the "
                        "number of files)")
    g.add_argument("--stage", type=int, default=none, metavar="0-3",
                   help="equivalent ZeRO stage (default: inferred from when units are gathered)")
    g.add_argument("--framework", default=none, metavar="NAME",
                   help="fsdp2, fsdp1, deepspeed, zero1, ddp or none (default: from the "
                        "traces' annotations)")
    g.add_argument("--param-dtype", default=none, metavar="DTYPE",
                   help="dtype the parameters are stored in, e.g. float32 (default: the "
                        "all-gather dtype)")


def facts_from_args(args) -> dict:
    """TraceFacts keyword arguments from parsed `add_arguments` flags (and --link)."""
    out = {k: getattr(args, k, None) for k in ("world_size", "stage", "framework",
                                                "param_dtype", "link")}
    return {k: v for k, v in out.items() if v is not None}


def refuse_facts(facts: dict | None) -> None:
    """Trace-only flags given for another kind of source: say so instead of ignoring them."""
    extra = sorted(k for k in (facts or {}) if k != "link")
    if extra:
        from ..errors import UserError

        flags = ", ".join("--" + k.replace("_", "-") for k in extra)
        raise UserError(f"{flags}: only for profiler traces (SOURCE is not a trace file or "
                        "a directory of traces)")
