"""The endpoints source: each rank's own `/metrics`, scraped directly.

The exporter serves cumulative counters, so a window is the difference between this scrape
and an earlier one: the newest at least `window` steps older, else the oldest one kept.
The first snapshot of a live run has no earlier scrape: it scrapes again once the ranks have
moved on, so a window never counts the steps before it (the slow warm-up step) the way
"everything since the start" would. It waits for `window` new steps only while that is
quick: after `settle_s` seconds (2 s) it takes what every live rank has done since (at least
one step, waited for up to two step times, never more than `SETTLE_MAX_S`), and the window
says how many steps it covers. A one-shot `zerodoc report` on the endpoints of a job with
1.4 s steps so answers in ~3 s over 2 steps, not 15 s over 12 (issue 20, item 7); a TUI's
later refreshes widen the window to `window` steps as scrapes accumulate. The history kept per
rank is bounded: one scrape per distinct step count (a stalled job adds none), at most
`window` + 2 of them.

A rank that served the exporter's closed signal (`zerodoc_run_closed_timestamp_seconds`)
is ended: when its endpoint goes away it keeps its last numbers and is not stale, and a
run whose every rank closed cleanly is not a source error.
"""

from __future__ import annotations

import re
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from ..errors import UserError
from ..runmodel import RankWindow, RunSnapshot
from ..runlog import missing
from .samples import Cumulative, add_sample, facts_of, share_unit_facts, window_of
from .rundir import STALE_AFTER_S

SETTLE_S = 2.0  # the first snapshot's wait for `window` new steps (module docstring)
SETTLE_MAX_S = 15.0  # ... and at most this long for one new step of a slow job

_ENDPOINT = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})(?:-(\d{1,5}))?")


def is_endpoint_spec(spec: str) -> bool:
    return all(_ENDPOINT.fullmatch(p.strip()) for p in spec.split(",")) if spec else False


def parse_endpoints(spec: str) -> list[str]:
    """"h:9730,h2:9731" or "h:9730-9737" -> ["h:9730", ...]."""
    out: list[str] = []
    for part in spec.split(","):
        m = _ENDPOINT.fullmatch(part.strip())
        if not m:
            raise UserError(f"endpoint {part.strip()!r}: expected host:port or host:first-last")
        host, a = m.group(1), int(m.group(2))
        b = int(m.group(3) or a)
        if not 0 < a <= b <= 65535 or b - a >= 1024:
            raise UserError(f"endpoint {part.strip()!r}: ports must be 1-65535, first <= last, "
                            "at most 1024 of them")
        out += [f"{host}:{p}" for p in range(a, b + 1)]
    return list(dict.fromkeys(out))


def fetch(url: str, timeout: float, data: bytes | None = None) -> bytes:
    with urllib.request.urlopen(url, data=data, timeout=timeout) as r:
        return r.read()


def why(e: BaseException) -> str:
    if isinstance(e, urllib.error.HTTPError):
        return f"HTTP {e.code}"
    if isinstance(e, urllib.error.URLError):
        return str(getattr(e.reason, "strerror", None) or e.reason)
    return str(getattr(e, "strerror", None) or e) or type(e).__name__


def parse_exposition(text: str, endpoint: str | None = None) -> dict[int, Cumulative]:
    """The zerodoc samples of one /metrics page, per rank."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[int, Cumulative] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.startswith("zerodoc_"):
                add_sample(out, s.name, s.labels, s.value)
    for c in out.values():
        c.endpoint = endpoint
    return {r: c for r, c in out.items() if c.units or "run_id" in c.labels}


def job_of(c: Cumulative) -> str:
    """The job a rank's endpoint serves: its `job_id` label where the exporter gives one,
    else its run (`run_id`: the run directory's name, the job id by default)."""
    return c.labels.get("job_id") or c.labels.get("run_id") or ""


def one_job_of(results: list[tuple[str, dict[int, Cumulative]]]
               ) -> tuple[dict[int, Cumulative], dict | None]:
    """The ranks of one job from what each endpoint served (endpoint, {rank: Cumulative}):
    never ranks of two jobs merged (`report 127.0.0.1:9740-9741` over two jobs whose port
    ranges meet), nor two endpoints serving the same rank of one run (two jobs given one
    run directory) taken for one. The job with the most recent activity is kept, with
    `zerodoc.runlog.segments.one_job`'s account of the others (None: one job)."""
    seen: dict[str, dict[int, list[tuple[Cumulative, str]]]] = {}
    for ep, ranks in results:
        for r, c in ranks.items():
            seen.setdefault(job_of(c), {}).setdefault(r, []).append((c, ep))
    jobs: dict[str, dict[int, Cumulative]] = {}
    eps: dict[str, set[str]] = {}
    clash = []  # another endpoint serving a rank its run already has: another job
    for j, ranks in seen.items():
        for r, cands in ranks.items():
            cands.sort(key=lambda x: -_updated(x[0]))
            jobs.setdefault(j, {})[r] = cands[0][0]
            eps.setdefault(j, set()).add(cands[0][1])
            clash += [{"job_id": j or "?", "ranks": [r], "last_unix": _updated(c),
                       "endpoints": [ep], "same_run": True} for c, ep in cands[1:]]
    if len(jobs) < 2 and not clash:
        return next(iter(jobs.values()), {}), None
    latest = {j: max(map(_updated, rs.values())) for j, rs in jobs.items()}
    shown = max(jobs, key=lambda j: latest[j])
    left = [{"job_id": j or "?", "ranks": sorted(jobs[j]), "last_unix": latest[j],
             "endpoints": sorted(eps[j])}
            for j in sorted(jobs, key=lambda j: -latest[j]) if j != shown]
    return jobs[shown], {"shown": {"job_id": shown or "?", "ranks": sorted(jobs[shown])},
                         "left_out": left + clash, "where": "at these endpoints"}


def _updated(c: Cumulative) -> float:
    return c.scalars.get("updated_unix", 0.0)


class EndpointsSource:
    """Each rank's `/metrics`, scraped directly (see the module docstring for windows)."""

    def __init__(self, spec: str | list[str], window: int | None = 20, *,
                 timeout_s: float = 3.0, stale_after_s: float = STALE_AFTER_S,
                 settle_s: float = SETTLE_S):
        self.endpoints = parse_endpoints(spec if isinstance(spec, str) else ",".join(spec))
        self.window = window
        self.timeout_s = timeout_s
        self.stale_after_s = stale_after_s
        self.settle_s = settle_s
        self.description = f"endpoints {spec if isinstance(spec, str) else ','.join(spec)}"
        self.unreachable: dict[str, str] = {}  # endpoint -> why, after the last snapshot
        self._history: dict[int, list[Cumulative]] = {}
        self._last: dict[int, RankWindow] = {}
        self._ended: set[int] = set()
        self.jobs: dict | None = None  # one_job_of's account: other jobs' ranks left out

    def _scrape(self, ep: str):
        try:
            text = fetch(f"http://{ep}/metrics", self.timeout_s).decode("utf-8", "replace")
        except (OSError, ValueError) as e:
            return ep, None, why(e)
        try:
            ranks = parse_exposition(text, ep)
        except (ValueError, KeyError, IndexError) as e:
            return ep, None, f"not a Prometheus exposition ({e})"
        return ep, ranks, None if ranks else "no zerodoc metrics there"

    def _scrape_all(self) -> dict[int, Cumulative]:
        with ThreadPoolExecutor(max_workers=min(16, len(self.endpoints))) as pool:
            results = list(pool.map(self._scrape, self.endpoints))
        self.unreachable = {ep: w for ep, ranks, w in results if ranks is None}
        got, self.jobs = one_job_of([(ep, ranks) for ep, ranks, _w in results if ranks])
        return share_unit_facts(got)

    def _settle(self, got: dict[int, Cumulative]) -> dict[int, Cumulative]:
        """First snapshot of a live run: scrape again until every live rank has done
        `window` more steps, or, after settle_s, at least one (module docstring), keeping
        the first scrape as the window's start."""
        live = {r: c for r, c in got.items() if c.closed_unix is None and c.steps}
        if not live or not self.window or self.settle_s <= 0:
            return got
        for r, c in got.items():
            self._remember(r, c)
        step_s = max((c.scalars.get("last_step_seconds", 0.0) for c in live.values()),
                     default=0.0)
        start = time.monotonic()
        enough = start + self.settle_s  # then one new step per rank will do
        deadline = start + min(SETTLE_MAX_S, max(self.settle_s, 2 * step_s + 0.5))
        pause = min(0.5, max(0.05, step_s / 2))
        while time.monotonic() < deadline:
            time.sleep(pause)
            again = self._scrape_all()
            if not again:
                return got
            got = again
            moved = [again[r].steps - c.steps if r in again else 0 for r, c in live.items()]
            if min(moved) >= self.window or (min(moved) >= 1 and time.monotonic() >= enough):
                return again
        return got

    def _remember(self, rank: int, cur: Cumulative) -> list[Cumulative]:
        hist = self._history.setdefault(rank, [])
        if hist and (cur.steps < hist[-1].steps or cur.key != hist[-1].key):
            hist.clear()  # the rank restarted: its counters did too
        if hist and hist[-1].steps == cur.steps:
            hist[-1] = cur  # no new step (a stalled job): replace, never grow
        else:
            hist.append(cur)
        limit = (self.window or 0) + 2
        if len(hist) > limit:
            del hist[:-limit]
        return hist

    def snapshot(self) -> RunSnapshot:
        first = not self._history
        got = self._scrape_all()
        if first and got:
            got = self._settle(got)
        if not got and not self._last:
            detail = "; ".join(f"{ep} ({w})" for ep, w in list(self.unreachable.items())[:4])
            more = len(self.unreachable) - 4
            raise UserError(f"no zerodoc rank answered at {len(self.endpoints)} endpoint(s): "
                            f"{detail}{f'; and {more} more' if more > 0 else ''}")
        snap = RunSnapshot(source=self.description)
        for rank, cur in sorted(got.items()):
            hist = self._history.get(rank, [])
            if hist and (cur.steps < hist[-1].steps or cur.key != hist[-1].key):
                hist = []
            base = None
            if self.window:
                older = [h for h in hist if h.steps < cur.steps]
                enough = [h for h in older if h.steps <= cur.steps - self.window]
                base = enough[-1] if enough else (older[0] if older else None)
            self._remember(rank, cur)
            if cur.closed_unix is not None:
                self._ended.add(rank)
            else:
                self._ended.discard(rank)
            snap.ranks[rank] = self._last[rank] = window_of(facts_of(cur), cur, base)
            if cur.stall_record():
                snap.stalls[rank] = cur.stall_record()
        now = time.time()
        for rank, w in self._last.items():
            if rank not in got:
                snap.ranks[rank] = w
                if rank not in self._ended:
                    snap.stale_ranks.add(rank)
        snap.ranks = dict(sorted(snap.ranks.items()))
        snap.jobs = self.jobs  # the report says it (report.notes)
        snap.ended_ranks = {r for r in self._ended if r in snap.ranks}
        snap.missing_ranks = missing(snap)
        for rank, w in snap.ranks.items():
            if rank not in snap.ended_ranks and w.updated_unix and \
                    now - w.updated_unix > self.stale_after_s:
                snap.stale_ranks.add(rank)
        return snap
