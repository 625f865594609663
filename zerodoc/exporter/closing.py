"""The exporter's "closed" signal: a clean `close()` is visible to the scrapers.

A rank that closes cleanly serves `zerodoc_run_closed_timestamp_seconds` from then on, and
its /metrics server stays up until every client that has been scraping it regularly (a
Prometheus, a TUI polling the endpoints: told apart by address and User-Agent) has fetched
one page after the close: sources then report the rank as ended instead of gone (stale).
The wait is bounded: three of that client's scrape intervals (at least a second), never more
than `CLOSE_LINGER_S`; with no regular scraper, none at all. Standard library only.
"""

from __future__ import annotations

import threading
import time

CLOSE_LINGER_S = 10.0
RECENT_S = 120.0  # a client that scraped within this long, twice, counts as regular


class CloseSignal:
    def __init__(self, clock=time.time):
        self.clock = clock
        self.closed_unix: float | None = None
        self._seen: dict[tuple, list[float]] = {}  # client -> its last scrape times
        self._cond = threading.Condition()
        self._awaited: dict[tuple, float] = {}  # client -> how long the close waits for it
        self.on_close: list = []  # called at the close (the sidecar's publisher: closed page)

    def scraped(self, client: tuple = ("", "")) -> None:
        """Called by the HTTP handler once a page went out to `client`."""
        with self._cond:
            times = self._seen.setdefault(client, [])
            times.append(self.clock())
            del times[:-3]
            if len(self._seen) > 64:  # many one-off clients: keep the recent ones, and
                # those the close waits for (any number of them may scrape during its wait)
                old = sorted(self._seen, key=lambda c: self._seen[c][-1])[:-32]
                for c in old:
                    if c not in self._awaited:
                        del self._seen[c]
            self._cond.notify_all()

    def close(self, linger_s: float = CLOSE_LINGER_S) -> float:
        """Mark closed; wait (bounded, see the module docstring) until the regular scrapers
        have seen it. Returns the seconds waited. Never raises: it runs in the training
        script's `monitor.close()` (a waker that fails is skipped)."""
        with self._cond:
            now = self.closed_unix = self.clock()
            for wake in self.on_close:
                try:
                    wake()
                except Exception:  # noqa: BLE001, S110 - the close goes on: scrapers wait
                    pass
            waits = self._awaited
            for client, times in self._seen.items():
                if len(times) >= 2 and now - times[-1] < RECENT_S:
                    interval = times[-1] - times[-2]
                    waits[client] = min(linger_s, max(1.0, 3 * interval))
            if not waits:
                return 0.0
            t0 = time.monotonic()

            def pending() -> list:
                return [c for c, w in waits.items() if self._seen.get(c, [now])[-1] <= now
                        and time.monotonic() - t0 < w]

            while pending():
                left = max(waits[c] for c in pending()) - (time.monotonic() - t0)
                self._cond.wait(max(0.01, min(left, 0.5)))
            waits.clear()
            return time.monotonic() - t0
