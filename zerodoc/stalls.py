"""The watchdog's stall records as a source sees them (`RunSnapshot.stalls`).

A rank's watchdog (zerodoc/shim/watchdog.py) writes `{"type": "stall", "state": "stuck" |
"resumed" | "failed" | "terminated", ...}` records to its run log ("terminated": a SIGTERM
stopped the rank, recorded before its clean end; ZD013 names it so) and, while it is stuck, serves the gauge
`zerodoc_stall_since_timestamp_seconds{unit, phase, collective}`. Sources turn either into
one record per rank: `last_stall()` for run logs, `stall_from_gauge()` for a scrape or a
Prometheus query (the gauge says less: no stack, no error). Plain Python.
"""

from __future__ import annotations

STALL_GAUGE = "zerodoc_stall_since_timestamp_seconds"


def last_stall(events: list[dict]) -> dict | None:
    """The watchdog's newest record among a rank's run-log events (None: it recorded none).
    A trainer integration's `{"type": "exception"}` record (training raised) counts as a
    failure where it is the newest (it says what, not where)."""
    for rec in reversed(events):
        kind = rec.get("type")
        if kind == "stall":
            return rec
        if kind == "exception":
            step = rec.get("step")
            return {"type": "stall", "state": "failed", "rank": rec.get("rank"),
                    "step": step + 1 if isinstance(step, int) else None,
                    "since_unix": rec.get("end_unix"), "in": "exception", "unit": None,
                    "phase": None, "collective": "",
                    "error": f"{rec.get('error', '')}: {rec.get('message', '')}".strip(": "),
                    "integration": rec.get("integration"), "stack": []}
    return None


def stall_from_gauge(rank: int, labels: dict, since_unix: float, last_step: int) -> dict:
    """A "stuck" record from one sample of the stall gauge (present only while stuck)."""
    coll = labels.get("collective") or ""
    return {"type": "stall", "state": "stuck", "rank": rank, "step": int(last_step) + 1,
            "since_unix": float(since_unix), "unit": labels.get("unit") or None,
            "phase": labels.get("phase") or None, "collective": coll,
            "in": "collective" if coll else "compute", "stack": []}
