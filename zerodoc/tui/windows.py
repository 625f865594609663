"""Moved to `zerodoc.runlog.sliding` (the run-directory source uses it); kept for imports."""

from ..runlog.sliding import SlidingWindows, new_records

__all__ = ["SlidingWindows", "new_records"]
