"""The exporter's "closed" signal: a clean `close()` is visible to the scrapers.

A rank that closes cleanly serves `zerodoc_run_closed_timestamp_seconds` from then on, and
its /metrics server stays up until one more scrape has seen it, if someone scrapes it:
sources then report the rank as ended instead of gone (stale). The wait is bounded: at most
three times the interval the scraper has been keeping (at least a second: a TUI refreshing
every second waits about a second) and never more than `CLOSE_LINGER_S`; with no scraper,
none at all. Standard library only.
"""

from __future__ import annotations

import threading
import time

CLOSE_LINGER_S = 5.0
SEND_GRACE_S = 0.25  # after the page was built: time for it to reach the scraper


class CloseSignal:
    def __init__(self, clock=time.time):
        self.clock = clock
        self.closed_unix: float | None = None
        self._scrapes: list[float] = []  # the last few scrape times
        self._cond = threading.Condition()

    def scraped(self) -> None:
        """Called by the collector when it has built a scrape's page."""
        with self._cond:
            self._scrapes = (self._scrapes + [self.clock()])[-3:]
            self._cond.notify_all()

    def close(self, linger_s: float = CLOSE_LINGER_S) -> float:
        """Mark closed; wait (bounded, see the module docstring) for one scrape to see it.
        Returns the seconds waited."""
        with self._cond:
            self.closed_unix = self.clock()
            if len(self._scrapes) < 2:
                return 0.0  # nobody is scraping regularly
            interval = self._scrapes[-1] - self._scrapes[-2]
            if self.closed_unix - self._scrapes[-1] > max(linger_s, 3 * interval):
                return 0.0  # the scraper went away
            wait = min(linger_s, max(1.0, 3 * interval))
            seen = len(self._scrapes), self._scrapes[-1]
            t0 = time.monotonic()
            if self._cond.wait_for(lambda: (len(self._scrapes), self._scrapes[-1]) != seen,
                                   wait):
                time.sleep(SEND_GRACE_S)  # the page is built; let it go out before shutdown
            return time.monotonic() - t0
