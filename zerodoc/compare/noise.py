"""How much two runs' numbers move without any change: the noise `zerodoc compare` judges by.

From the runs themselves (docs/compare.md, "Noise"): each run's per-step spread, the standard
error of its mean (`zerodoc.whatif.stepmodel._spread`, as `measurement_noise` reads it for
the what-if ranges), of the rank whose spread is widest. Two runs' means differ by noise
within t x sqrt(se_before^2 + se_after^2) (t: Student's 97.5 % point for the smaller run's
degrees of freedom, `t975`), about a 95 % interval.

- step time: the step times of every step in the window;
- exposed communication: the exposed time of each step that measured it (sampled steps);
- the other times (compute, optimizer, the collectives' times), which no source keeps per
  step: the relative noise of the step (compute, optimizer) or of the exposed time (the
  collectives), or of both (their ratio), applied to their own value before;
- counts, bytes and memory, which move with the configuration and not from step to step,
  and any time when a run has fewer than 2 per-step figures (Prometheus and rank endpoints
  keep none): not measured, a stated floor (`floor`: `--noise`, default 5 %; `TIME_FLOOR`,
  15 %, for times, conservative: a loaded host moves a step by more than 5 % from one run
  to the next).

Also the live flag: a run still being written (a rank neither ended nor stale). Plain
Python.
"""

from __future__ import annotations

import math

from ..runmodel import RunSnapshot
from ..whatif.stepmodel import _spread, t975

TIME_FLOOR = 0.15  # times not measured per step: a relative change within it is noise
# observable -> whose relative noise it takes (no per-step figures of its own)
STEP_REL = ("compute_seconds_per_step", "optimizer_and_host_seconds_per_step")
EXPOSED_REL = ("all_gather_seconds_per_step", "all_gather_exposed_seconds_per_step",
               "backward_all_gather_exposed_seconds_per_step",
               "reduce_scatter_seconds_per_step", "peer_wait_seconds_per_step",
               "large_collective_busbw_bytes_per_second")
BOTH_REL = ("comm_compute_ratio",)
TIMES = ("step_seconds", "exposed_comm_seconds_per_step", *STEP_REL, *EXPOSED_REL, *BOTH_REL)


def _se(xs: list[float]) -> float | None:
    """The standard error of the mean of `xs` (None below 2 figures)."""
    s, _t = _spread(xs)
    return None if s is None else s / math.sqrt(2)


def spread(snap: RunSnapshot, kind: str) -> tuple[float | None, int]:
    """(standard error of the mean, figures) of one run's per-step `kind` ("step_times" or
    "exposed_times"): of the rank whose standard error is largest (None: no rank has 2)."""
    best: tuple[float | None, int] = (None, 0)
    for w in snap.ranks.values():
        xs = list(getattr(w, kind, None) or ())
        se = _se(xs)
        if se is not None and (best[0] is None or se > best[0]):
            best = (se, len(xs))
    return best


def _pair(before: RunSnapshot, after: RunSnapshot, kind: str) -> dict | None:
    """The half-width (seconds) within which the two runs' means of `kind` differ by noise,
    and what it is from; None when either run has fewer than 2 figures."""
    (sb, nb), (sa, na) = spread(before, kind), spread(after, kind)
    if sb is None or sa is None:
        return None
    t = t975(min(nb, na) - 1)
    what = "step times" if kind == "step_times" else "exposed times"
    return {"half_width": t * math.sqrt(sb * sb + sa * sa), "t": t, "figures": [nb, na],
            "from": f"per-step {what} ({nb} + {na} steps)"}


def measured(before: RunSnapshot, after: RunSnapshot) -> dict:
    """Both kinds of per-step noise of a pair of runs (`_pair`), by kind."""
    return {"step": _pair(before, after, "step_times"),
            "exposed": _pair(before, after, "exposed_times")}


def half_width(metric: str, before: float | None, noise: dict, floor: float,
               step_before: float | None, exposed_before: float | None) -> dict:
    """The noise of one measurement: {"half_width" (its unit), "from" (what it is from),
    "measured" (False: a floor)}. `noise`: `measured()`; `step_before`, `exposed_before`:
    the run's step and exposed time before, for the relative noise of the other times."""
    base = abs(before or 0.0)

    def rel(kind: str, value: float | None) -> float | None:
        n = noise.get(kind)
        return n["half_width"] / value if n and value else None

    def floor_of(f: float, why: str) -> dict:
        return {"half_width": f * base, "from": f"not measured ({why}): a floor of "
                f"+/-{f * 100:g} %", "measured": False}

    if metric not in TIMES:
        return floor_of(floor, "no per-step figures of it: it moves with the configuration")
    if metric == "step_seconds" and noise.get("step"):
        return {**_keep(noise["step"]), "measured": True}
    if metric == "exposed_comm_seconds_per_step" and noise.get("exposed"):
        return {**_keep(noise["exposed"]), "measured": True}
    parts = {"step": rel("step", step_before), "exposed": rel("exposed", exposed_before)}
    want = ("step",) if metric in STEP_REL else ("exposed",) if metric in EXPOSED_REL \
        else ("step", "exposed") if metric in BOTH_REL else ()
    if want and all(parts[k] is not None for k in want):
        r = math.sqrt(sum(parts[k] ** 2 for k in want))
        src = " and ".join(noise[k]["from"] for k in want)
        return {"half_width": r * base, "measured": True,
                "from": f"{src}: +/-{r * 100:.1f} % relative (no per-step figures of its own)"}
    return floor_of(max(floor, TIME_FLOOR), "a run has fewer than 2 per-step figures")


def _keep(n: dict) -> dict:
    return {"half_width": n["half_width"], "from": n["from"]}


def _finished_files(snap: RunSnapshot) -> bool:
    """Profiler traces and flight-recorder dumps: files a run left, never still written."""
    from ..trace.scope import FILE_SOURCES, source_of

    return source_of(snap) in FILE_SOURCES


def live(snap: RunSnapshot) -> dict:
    """Whether a run is still being written: a rank that neither recorded its end (the run
    log's end record, the exporter's close) nor went stale (no write for the stale time:
    a run that died). Profiler traces and flight-recorder dumps are finished files. `steps_so_far`: the newest step
    any rank recorded."""
    open_ranks = sorted(r for r in snap.ranks
                        if r not in snap.ended_ranks and r not in snap.stale_ranks)
    is_live = bool(open_ranks) and not _finished_files(snap)
    return {"live": is_live, "ranks": open_ranks if is_live else [],
            "steps_so_far": max((w.last_step for w in snap.ranks.values()), default=0)}


__all__ = ["TIME_FLOOR", "TIMES", "spread", "measured", "half_width", "live"]
