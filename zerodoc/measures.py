"""One run, one window, one number per quantity: the definitions the front ends share.

`zerodoc report`, the TUI, `compare` and `whatif` show the same quantities of one window;
each reads it here, or names the definition it uses instead (issue 31: exposed
communication per step read 452 / 528 / 399 / 548.7 / 489.9 ms in five places for one run,
and one unit's busbw 107.4 MB/s in the TUI and 76.8 MB/s in the report). Two definitions of
exposed communication exist, both on purpose:

- **all of it** (`EXPOSED_ALL`): a rank's exposed time in every collective, per step — the
  step breakdown's column, the TUI's headline (mean over ranks; the worst rank under "worst"
  and in `whatif`'s measured line);
- **link-attributable** (`EXPOSED_LINK`): per unit, phase and collective the rank that waited
  least (`diagnosis.context`, docs/rules.md), summed — what ZD006 grades and `compare`
  observes: peer wait (a straggler) taken out.

Both come from the window's sampled steps when only some steps carry per-unit detail
(`windowsamples`); `covers()` says which. Bus bandwidth per unit (`unit_busbw`) is the ranks' mean
all-gather bytes over their mean all-gather seconds (per step, over the sampled steps),
times the busbw factor — the Prometheus source's PromQL computes the same — and the worst
rank's own under "worst". Plain Python.
"""

from __future__ import annotations

from .runmodel import RankWindow, RunSnapshot

EXPOSED_ALL = "all collectives"
EXPOSED_LINK = "link-attributable"  # per unit, phase, collective: the rank that waited least
HOW = {"mean": "mean over ranks", "max": "worst rank", "median": "median rank"}


def exposed_per_step(w: RankWindow) -> float | None:
    """A rank's exposed communication per step (`EXPOSED_ALL`): the sampled steps' mean when
    only some steps carry per-unit detail; None before its first sample, never 0."""
    if not w.steps or not w.unit_detail:
        return None
    return w.exposed_seconds / w.steps


def exposed_over_ranks(snap: RunSnapshot, ranks, how: str = "mean") -> float | None:
    """`exposed_per_step` aggregated over `ranks` ("mean", "max" or "median"), over the
    ranks that measured it; None when none has."""
    import statistics

    vals = [v for v in (exposed_per_step(snap.ranks[r]) for r in ranks if r in snap.ranks)
            if v is not None]
    if not vals:
        return None
    return {"mean": statistics.fmean, "max": max, "median": statistics.median}[how](vals)


def exposed_link_attributable(ctx) -> float | None:
    """Exposed communication per step, `EXPOSED_LINK` (a `diagnosis.Context`): the figure
    ZD006 grades and `compare` observes (`observables` "exposed_comm_seconds_per_step")."""
    from .diagnosis.observables import observe

    return observe(ctx, "exposed_comm_seconds_per_step")


def unit_busbw(stats, unit: str, group_size: int, how: str = "mean") -> float | None:
    """A unit's all-gather bus bandwidth (bytes/s) from `zerodoc.unitstats` stats. "mean":
    the ranks' mean bytes per step over their mean seconds per step (what PromQL's sums give
    the Prometheus source, and the report always showed); "min": the worst rank's own. None
    when no rank timed one."""
    from .runmodel import busbw

    st = stats.units.get(unit, {})
    if how == "min":
        bw = st.get("ag_busbw")
        return None if bw is None or bw.n == 0 else bw.min
    b, sec = st.get("ag_bytes"), st.get("ag_seconds")
    if b is None or sec is None or not b.n or not sec.n or sec.mean <= 0:
        return None
    return busbw(b.mean / sec.mean, "all_gather", group_size)


def covers(snap: RunSnapshot, ranks=None) -> str:
    """What the per-unit-derived figures (exposed communication, compute, busbw) cover:
    'every step of 20' or the sampled steps (`windowsamples.run_coverage`)."""
    from .windowsamples import run_coverage

    ws = [snap.ranks[r] for r in (snap.ranks if ranks is None else ranks)
          if r in snap.ranks and snap.ranks[r].steps]
    text = run_coverage(snap, ranks)
    if text is None:
        n = min((w.steps for w in ws), default=0)
        return f"every step of {n}"
    return text.removeprefix("per-unit: ")


def exposed_summary(snap: RunSnapshot, ranks, ctx=None) -> dict:
    """The run's exposed communication per step under each definition, for the report's
    JSON and text and the tests that hold the front ends to one number: {"mean_over_ranks",
    "worst_rank", "link_attributable", "covers", "definitions"}."""
    return {"mean_over_ranks": exposed_over_ranks(snap, ranks, "mean"),
            "worst_rank": exposed_over_ranks(snap, ranks, "max"),
            "link_attributable": exposed_link_attributable(ctx) if ctx is not None else None,
            "covers": covers(snap, ranks),
            "definitions": {"mean_over_ranks": f"{EXPOSED_ALL}, {HOW['mean']}",
                            "worst_rank": f"{EXPOSED_ALL}, {HOW['max']}",
                            "link_attributable": EXPOSED_LINK}}


def live_text(snap: RunSnapshot, now: float | None = None) -> str | None:
    """'LIVE: still being written (step 37, last write 2 s ago)' for a run some rank of
    which neither ended nor went stale (`compare.noise.live`, the one test of it), so its
    numbers may still move; None for a finished (or dead) run. Every front end prints it
    (report, TUI header, whatif, compare)."""
    import time

    from .compare.noise import live
    from .humanize import duration

    got = live(snap)
    if not got["live"]:
        return None
    newest = max((w.updated_unix for w in snap.ranks.values()), default=0.0)
    now = time.time() if now is None else now
    age = f", last write {duration(max(0.0, now - newest))} ago" if newest else ""
    return f"LIVE: still being written (step {got['steps_so_far']}{age})"
