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
