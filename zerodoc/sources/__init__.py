"""Where a RunSnapshot comes from: a run directory, rank endpoints, or a Prometheus server.

Every front end (report, TUI, demo) asks `open_source(spec)` for a `Source` and calls
`snapshot()` whenever it wants fresh numbers. The same run gives the same findings from each
source (tests/test_sources.py), because all three build the same `RankWindow`s:

- `RunDirSource` (`rundir.py`): the run logs, read from their end; the window is each
  rank's last `window` steps.
- `EndpointsSource` (`endpoints.py`): each rank's `/metrics`; a window is the difference
  between two scrapes of the cumulative counters.
- `PrometheusSource` (`prometheus.py`): the same series through the HTTP API, the run
  selected and the ranks aggregated on the server.

Which series are read and where each goes is the metric catalog's `into` column
(`samples.py`). Every snapshot says which ranks stopped reporting (`stale_ranks`), which
closed cleanly (`ended_ranks`) and which the world size promises but no source shows
(`missing_ranks`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from ..errors import UserError
from ..runmodel import RunSnapshot
from ..runlog import latest_run
from .endpoints import EndpointsSource, is_endpoint_spec, parse_endpoints, parse_exposition
from .prometheus import PrometheusSource
from .rundir import STALE_AFTER_S, RunDirSource
from .samples import (
    LEVELS, WINDOWED, Cumulative, add_sample, facts_of, share_unit_facts, window_of,
)


class Source(Protocol):
    description: str

    def snapshot(self) -> RunSnapshot:
        """Current numbers: each rank's totals over the recent window."""


def open_source(spec: str | None, window: int | None = 20, *,
                stale_after_s: float = STALE_AFTER_S, trace_facts: dict | None = None,
                run_id: str | None = None, segment: int | None = None,
                skip_warmup: bool = True, wait: bool = False) -> Source:
    """A source from a command-line SOURCE: a run directory; `http(s)://...` a Prometheus
    server; `host:port[,host:port...]` or `host:first-last` rank endpoints; PyTorch profiler
    traces (a directory of them, a file, files separated by commas; `trace_facts`: see
    `zerodoc.trace.TraceFacts`); PyTorch flight-recorder dumps (a directory of them, one per
    rank: `flightrec.py`); Nsight Systems SQLite exports (`.sqlite` files, a folder of
    them: `zerodoc.trace.nsys`, the same facts); None the latest local run (under
    ./zerodoc-runs). `run_id`:
    which run of a Prometheus server holding several (also `http://host:9090#run=ID`);
    `segment`: an older segment of a run directory; `skip_warmup`: a run directory's short
    window leaves the warm-up step (step 1) out (`RankWindow.warmup_left_out`); `wait`: a
    path that does not exist yet, in a directory that does, is a run directory to wait for
    (the TUI opened before the job starts)."""
    from .. import trace  # profiler traces: zerodoc/trace (no heavy import until opened)
    from . import flightrec

    if spec is not None and flightrec.looks_like_dumps(Path(spec.strip())):
        if run_id is not None or segment is not None:
            raise UserError("--run-id and --segment are not for flight-recorder dumps")
        facts = dict(trace_facts or {})
        world = facts.pop("world_size", None)  # gloo's dumps do not say the world
        trace.refuse_facts(facts)
        return flightrec.FlightRecorderSource(spec.strip(), world_size=world)
    if spec is not None and _is_nsys(spec.strip()):  # Nsight Systems SQLite exports
        from ..trace.nsys import open_nsys

        if run_id is not None or segment is not None:
            raise UserError("--run-id and --segment are not for Nsight Systems exports")
        return open_nsys(spec.strip(), window, **(trace_facts or {}))
    if spec is not None and trace.is_trace_spec(spec.strip()):
        if run_id is not None or segment is not None:
            raise UserError("--run-id and --segment are not for profiler traces")
        return trace.open_traces(spec.strip(), window, **(trace_facts or {}))
    trace.refuse_facts(trace_facts)
    is_dir = spec is None or Path(spec.strip()).is_dir()
    if run_id is not None and is_dir:
        raise UserError("--run-id chooses a run of a Prometheus server; a run directory is "
                        "one run (use --segment for an older segment of it)")
    if segment is not None and not is_dir:
        raise UserError("--segment is for a run directory (a Prometheus server or rank "
                        "endpoints show the live run)")
    if spec is None:
        return RunDirSource(latest_run(), window, stale_after_s=stale_after_s,
                            segment=segment, skip_warmup=skip_warmup)
    spec = spec.strip()
    if Path(spec).is_dir():
        return RunDirSource(spec, window, stale_after_s=stale_after_s, segment=segment,
                            skip_warmup=skip_warmup)
    if spec.startswith(("http://", "https://")):
        url, _, frag = spec.partition("#")
        if frag:
            key, _, val = frag.partition("=")
            if key != "run" or not val:
                raise UserError(f"{spec!r}: the part after # must be run=RUN_ID")
            if run_id is not None and run_id != val:
                raise UserError(f"two runs asked for: #run={val} and --run-id {run_id}")
            run_id = val
        check_url(url)
        return PrometheusSource(url, window, stale_after_s=stale_after_s, run_id=run_id)
    if is_endpoint_spec(spec):
        if run_id is not None:
            raise UserError("--run-id chooses a run of a Prometheus server; rank endpoints "
                            "serve one run")
        return EndpointsSource(spec, window, stale_after_s=stale_after_s)
    if "/" in spec or spec.startswith("."):
        if wait and not Path(spec).exists() and Path(spec).parent.is_dir():
            return RunDirSource(spec, window, stale_after_s=stale_after_s, segment=segment,
                                wait=True)
        raise UserError(f"no run directory at {spec}")
    raise UserError(f"{spec!r} is neither a run directory, a Prometheus URL (http://...) "
                    "nor rank endpoints (host:port, host:port,host:port or host:9730-9737)")


def _is_nsys(spec: str) -> bool:
    """Whether SOURCE names Nsight Systems exports (`.sqlite` files or a folder of them);
    the reader itself is imported only then."""
    from ..trace.nsysfiles import is_nsys_spec

    return is_nsys_spec(spec)


def check_url(url: str) -> None:
    """A UserError for an http(s) URL that cannot name a server (`http://[::1`, a port that
    is not a number or out of range), before anything tries to open it."""
    import urllib.parse

    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port  # ValueError: not a number, or outside 0-65535
        host = parts.hostname
    except ValueError as e:
        raise UserError(f"{url!r} is not a valid URL: {e}") from None
    if not host or port == 0:
        raise UserError(f"{url!r} is not a valid URL: no host" if not host
                        else f"{url!r} is not a valid URL: port 0")


__all__ = ["Cumulative", "EndpointsSource", "LEVELS", "PrometheusSource", "RunDirSource",
           "STALE_AFTER_S", "Source", "WINDOWED", "add_sample", "facts_of",
           "is_endpoint_spec", "open_source", "parse_endpoints", "parse_exposition",
           "share_unit_facts", "window_of"]
