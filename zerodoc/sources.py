"""Where a RunSnapshot comes from: a run directory, rank endpoints, or a Prometheus server.

Every front end (report, TUI, demo) asks `open_source(spec)` for a `Source` and calls
`snapshot()` whenever it wants fresh numbers. The same run must give the same findings from
each source.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from .errors import UserError
from .model import RunSnapshot
from .runlog import RunFollower, latest_run


class Source(Protocol):
    description: str

    def snapshot(self) -> RunSnapshot:
        """Current numbers: each rank's totals over the recent window."""


class RunDirSource:
    """A run directory (live or finished), followed incrementally."""

    def __init__(self, run_dir: str | Path, window: int = 20):
        self.run_dir = Path(run_dir)
        if not self.run_dir.is_dir():
            raise UserError(f"no run directory at {self.run_dir}")
        self.window = window
        self.follower = RunFollower(self.run_dir)
        self.description = f"run log {self.run_dir}"

    def snapshot(self) -> RunSnapshot:
        self.follower.poll()
        return self.follower.snapshot(self.window)


def open_source(spec: str | None, window: int = 20) -> Source:
    """A source from a command-line SOURCE: a run directory; None = the latest local run."""
    if spec is None:
        return RunDirSource(latest_run(), window)
    return RunDirSource(spec, window)
