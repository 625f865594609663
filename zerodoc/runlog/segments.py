"""Segments: one run directory, several incarnations of the job.

A restart that reuses the run directory (torchelastic restarting its workers under the same
run id, or a reused ZERODOC_RUN_DIR) starts a new *segment* in every rank's log instead of
continuing the old step numbers: a new header with `segment` one higher than the newest
one in that file. A restart of the whole job gives every rank the same number, so a
segment of the run is "the ranks whose log has segment k". Readers show the newest segment
by default and can name an older one.
"""

from __future__ import annotations

from .records import RankLog


def pick_segment(logs: list[RankLog], segment: int | None = None) -> list[RankLog]:
    """The rank logs of one segment: `segment`, or the newest one any rank has (ranks
    whose newest segment is older belong to an earlier incarnation and are left out)."""
    if not logs:
        return []
    # a negative `segment` (-2: the one before the newest) was resolved per rank file
    want = max(log.segment for log in logs) if segment is None or segment < 0 else segment
    return [log for log in logs if log.segment == want]


def _ranks(ranks) -> str:
    rs = sorted(ranks)
    return f"rank{'s' if len(rs) != 1 else ''} {', '.join(map(str, rs[:8]))}" + \
        (f" and {len(rs) - 8} more" if len(rs) > 8 else "")


def one_job(logs: list[RankLog], where: str = "in this run directory"
            ) -> tuple[list[RankLog], dict | None]:
    """The rank logs of one job (by the header's `job_id`), never ranks of two merged: the
    job with the most recent activity (a rank's newest step or start), and an account
    {"shown": {"job_id", "ranks"}, "left_out": [{"job_id", "ranks", "last_unix"}]} when
    the directory holds the logs of more than one (None: one job). Logs from before
    `job_id` (null) go with the job shown; `where` names the source in `jobs_note`."""
    jobs: dict[str, list[RankLog]] = {}
    for log in logs:
        jobs.setdefault(log.facts.job_id or "", []).append(log)
    named = [j for j in jobs if j]
    if len(named) < 2:
        return logs, None
    latest = {j: max(x.last_unix for x in jobs[j]) for j in named}
    shown = max(named, key=lambda j: latest[j])
    keep = jobs[shown] + jobs.get("", [])
    left = [{"job_id": j, "ranks": sorted(x.facts.rank for x in jobs[j]), "last_unix": latest[j]}
            for j in sorted(named, key=lambda j: -latest[j]) if j != shown]
    return keep, {"shown": {"job_id": shown, "ranks": sorted(x.facts.rank for x in keep)},
                  "left_out": left, "where": where}


def jobs_note(jobs: dict) -> list[str]:
    """`one_job`'s account in words (one line)."""
    def one(j: dict) -> str:
        what = f"another job of run {j['job_id']}" if j.get("same_run") else f"job {j['job_id']}"
        eps = f", endpoint{'s' if len(j['endpoints']) != 1 else ''} " \
            f"{', '.join(j['endpoints'])}" if j.get("endpoints") else ""
        return f"{what} ({_ranks(j['ranks'])}{eps})"
    n = 1 + len(jobs["left_out"])
    return [f"{n} jobs {jobs.get('where', 'in this source')}, their ranks never merged: "
            f"showing job {jobs['shown']['job_id']} ({_ranks(jobs['shown']['ranks'])}, the "
            f"most recent activity); left out {'; '.join(map(one, jobs['left_out']))}. Give "
            "each job its own run directory and ports"]
