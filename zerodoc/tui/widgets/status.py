"""The title bar (what run) and the status line (how fresh, what went wrong)."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from ... import humanize as fmt
from .. import views
from ..feed import Frame


class TitleBar(Static):
    DEFAULT_CSS = """
    TitleBar { height: auto; max-height: 3; background: $primary 40%; color: $text;
               padding: 0 1; }
    """

    def show(self, description: str, frame: Frame | None) -> None:
        t = Text()
        t.append("zerodoc", style="bold")
        live = views.live_banner(frame)
        if live:  # numbers that may still move: said first, on every view (issue 31)
            t.append(f"  {live}", style="bold green")
        t.append(f"  {description}")
        w = frame.snapshot.any_rank if frame else None
        if w is not None:
            f = w.facts
            stage = f" ZeRO-{f.zero_stage}" if f.zero_stage is not None else ""
            t.append(f" · {f.framework}{stage} · {f.world_size} ranks · "
                     f"{f.device_type}/{f.backend}", style="dim")
        banner = views.stopped_banner(frame)
        if banner:  # a rank died or hangs: said on every view, above everything else
            t.append("\n")
            t.append(f"■ {banner}", style="bold white on red")
        self.update(t)


class StatusLine(Static):
    DEFAULT_CSS = """
    StatusLine { height: 1; padding: 0 1; background: $panel; }
    """

    def show(self, frame: Frame | None, now: float, *, paused: bool, every: float | None,
             scope: views.Scope, job: str | None = None,
             fetching_s: float | None = None) -> None:
        """`fetching_s`: how long the refresh in flight has run (None: none). The snapshot
        and the rules run off the UI thread: while a slow one runs (a refit of the step
        model at scale), the views keep the previous refresh's figures, and past one
        refresh interval this line says so."""
        t = Text()
        ended = frame is not None and frame.run_ended
        if frame is None:
            t.append("● loading…", style="bold yellow")
        elif ended:
            # Every rank recorded a clean end: finished, not live, and not an error when the
            # source (a finished job's endpoints) no longer answers.
            t.append("■ ended", style="bold blue")
            if frame.source_error:
                t.append(f" · source: {frame.source_error[:70]}", style="dim")
        elif frame.source_error and not frame.snapshot.ranks:
            t.append("● waiting: ", style="bold yellow")
            t.append(frame.source_error[:90], style="yellow")
        elif frame.source_error:
            t.append("⚠ source error: ", style="bold red")
            t.append(frame.source_error[:90], style="red")
            if frame.good_unix is not None:
                t.append(f" · last good data {fmt.ago(now - frame.good_unix)}", style="dim")
        elif paused:
            t.append("⏸ paused", style="bold yellow")
        elif views.recorded_trace(frame):  # a profiler trace is a recording, never live
            t.append("■ recorded trace", style="bold blue")
        else:
            t.append("● live", style="bold green")
        if job:
            t.append(f" · {job}", style="cyan")
        if frame is not None:
            if paused and (frame.source_error or ended):
                t.append(" · paused", style="bold yellow")
            t.append(f" · refreshed {fmt.ago(max(0.0, now - frame.fetched_unix))}")
            if every:
                t.append(f" (every {every:g} s)", style="dim")
            if fetching_s is not None and fetching_s > (every or 1.0):
                t.append(f" · updating ({fetching_s:.0f} s): figures of the previous refresh",
                         style="yellow")
            # per-unit numbers a source reused across refreshes (costly at scale): their age
            made = getattr(frame.snapshot.unit_stats, "fetched_unix", None)
            if made is not None and now - made > max(5.0, 2 * (every or 1.0)):
                t.append(f" · per-unit numbers {fmt.ago(now - made)}", style="yellow")
            ws = frame.snapshot.ranks.values()
            newest = max(ws, key=lambda w: w.updated_unix, default=None)
            if newest is not None and newest.steps:
                t.append(f" · step {newest.last_step}")
                if newest.updated_unix:
                    t.append(f" ({fmt.ago(max(0.0, now - newest.updated_unix))})", style="dim")
            n, s = len(frame.snapshot.ranks), len(frame.stale)
            t.append(f" · {n} rank{'s' if n != 1 else ''}")
            if s:
                t.append(f", {s} stale", style="bold red")
            missing = len(getattr(frame, "missing", ()) or ())
            if missing:  # the world size has them, the source shows none
                t.append(f", {missing} missing", style="bold red")
            t.append(f" · {views.scope_label(scope, frame)}", style="dim")
        self.update(t)
