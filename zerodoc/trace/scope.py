"""What a report on profiler traces can say, and the device time it read (plain Python).

`scope(snap)`: for traces without sharded units (no FSDP / ZeRO annotations: DDP, pipeline
send/recv, a single GPU), what zerodoc still says from them and what it cannot, in place of
the live job's advice to call `zerodoc.attach()` (`diagnosis.coverage` leaves traces to this).
`device_rows(snap)`: per rank, per step, the device time of GPU traces (`DeviceTotals`:
unions of kernel intervals within the steps, as HolisticTraceAnalysis's temporal breakdown)
and the communication kernels counted by kind.
"""

from __future__ import annotations

from ..runmodel import RunSnapshot

TRACE_SOURCE = "profiler trace"
DUMPS_SOURCE = "flightrec"  # zerodoc.sources.flightrec: PyTorch flight-recorder dumps
# Sources that are finished files (never "live"): traces and dumps.
FILE_SOURCES = (TRACE_SOURCE, DUMPS_SOURCE)
CAN = ("the step breakdown per rank (compute, exposed communication, optimizer, other)",
       "every collective by kind with its time and exposed part (GPU: every NCCL kernel)",
       "stragglers and waiting across the ranks' traces")
CANNOT = ("per-unit detail: all-gathers and reduce-scatters per sharded unit, unit sizes, "
          "and the rules that read them (prefetch, reshard, unit size, ZeRO stage)")
HOW = ("per-unit detail needs traces of a job sharded with FSDP2 or FSDP1 (their annotations "
       "name the units) or a live run with zerodoc.attach(); --framework / --stage add facts "
       "a trace lacks")


def source_of(snap: RunSnapshot) -> str | None:
    """The kind of file a snapshot was read from (`TRACE_SOURCE`, `DUMPS_SOURCE`), None for a
    run's own data (run log, endpoints, Prometheus)."""
    first = snap.any_rank
    cfg = first.facts.config if first is not None else None
    return cfg.get("source") if isinstance(cfg, dict) else None


def is_trace(snap: RunSnapshot) -> bool:
    return source_of(snap) == TRACE_SOURCE


def is_dumps(snap: RunSnapshot) -> bool:
    """Flight-recorder dumps: each rank's last collectives, no timings, no steps."""
    return source_of(snap) == DUMPS_SOURCE


def scope(snap: RunSnapshot) -> dict | None:
    """For traces without sharded units: {"message", "can", "cannot", "how"}; else None."""
    if not is_trace(snap):
        return None
    first = snap.any_rank
    if any(u.gather_bytes for u in first.facts.units):
        return None
    fw = first.facts.framework
    what = "no FSDP / ZeRO annotations" + (f", {fw}" if fw not in ("", "none") else "")
    colls = sorted({c for w in snap.ranks.values() for (_u, _p, c) in w.comm})
    seen = f"collectives: {', '.join(colls)}" if colls else "no collective"
    return {"message": f"the traces show no sharded units ({what}; {seen})",
            "can": list(CAN), "cannot": CANNOT, "how": HOW}


def device_rows(snap: RunSnapshot) -> list[dict]:
    """Per rank with device data: per-step means of `DeviceTotals` (seconds)."""
    rows = []
    for r, w in sorted(snap.ranks.items()):
        d = w.device
        if d is None or not w.steps:
            continue
        n = w.steps
        rows.append({
            "rank": r, "steps": n, "step_seconds": w.step_seconds / n,
            "busy_seconds": d.busy_seconds / n, "compute_seconds": d.compute_seconds / n,
            "comm_seconds": d.comm_seconds / n,
            "exposed_comm_seconds": d.exposed_comm_seconds / n,
            "comm_kernels": dict(sorted(d.comm_kernels.items())),
            "comm_kernels_outside_steps": d.kernels_outside_steps,
        })
    return rows


def text(scope_: dict | None, rows: list[dict], secs, table) -> list[str]:
    """Report lines for the two (`secs` formats seconds, `table(head, rows)` lays out)."""
    out: list[str] = []
    if scope_:
        out += ["", f"Profiler traces: {scope_['message']}",
                "  zerodoc still says: " + "; ".join(scope_["can"]),
                "  it cannot say: " + scope_["cannot"],
                "  " + scope_["how"]]
    if rows:
        out += ["", "Device time (per step: union of kernel intervals on all streams within the "
                    "step, as HTA's temporal breakdown)"]
        head = ("rank", "steps", "step", "busy", "compute", "comm", "exposed comm",
                "NCCL kernels per step")
        cells = []
        for r in rows:
            n = r["steps"]
            kinds = ", ".join(f"{k} {v / n:.3g}" for k, v in r["comm_kernels"].items()) or "none"
            if r["comm_kernels_outside_steps"]:
                kinds += f" ({r['comm_kernels_outside_steps']} outside the steps, not counted)"
            cells.append((str(r["rank"]), str(n), secs(r["step_seconds"]),
                          secs(r["busy_seconds"]), secs(r["compute_seconds"]),
                          secs(r["comm_seconds"]), secs(r["exposed_comm_seconds"]), kinds))
        out += ["  " + x for x in table(head, cells)]
        out.append("  compute includes the optimizer's and FSDP's kernels (the step breakdown "
                   "shows them apart); busy - compute - exposed comm = memory copies alone")
    return out
