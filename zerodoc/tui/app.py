"""The Textual app: four views over one live `Feed`, plus `zerodoc demo`'s live front end.

The app only composes widgets and routes keys. Numbers come from `feed` (source snapshot,
rules engine, history) and `views` (aggregation, sorting, formatting); the fetch runs on a
worker thread so a slow source never freezes the keys. Refreshes are coalesced: a timer tick
while a fetch is in flight is dropped, a frame whose numbers did not change only updates the
status line, and only the visible view is re-rendered (the others when shown).
"""

from __future__ import annotations

import asyncio
import gc
import time
from concurrent.futures import ThreadPoolExecutor

from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.css.query import NoMatches
from textual.widgets import Footer, TabbedContent, TabPane

from . import views
from .feed import Feed, Frame
from .screens.help import HelpScreen
from .widgets.findings import FindingsView
from .widgets.overview import Overview
from .widgets.ranks import RanksView
from .widgets.status import StatusLine, TitleBar
from .widgets.table import ZTable
from .widgets.units import UnitsView

VIEWS = ("overview", "units", "findings", "ranks")


class ZerodocApp(App):
    """Live diagnosis of one run. `source` is anything with `.snapshot()` (zerodoc.sources)."""

    TITLE = "zerodoc"
    ENABLE_COMMAND_PALETTE = False
    CSS = """
    Screen { layout: vertical; }
    #tabs { height: 1fr; }
    #tabs > ContentSwitcher { height: 1fr; }
    TabPane { padding: 0; height: 1fr; }
    """
    BINDINGS = [
        Binding("1", "view('overview')", "Overview"),
        Binding("2", "view('units')", "Units"),
        Binding("3", "view('findings')", "Findings"),
        Binding("4", "view('ranks')", "Ranks"),
        Binding("o", "view('overview')", show=False),
        Binding("u", "view('units')", show=False),
        Binding("f", "view('findings')", show=False),
        Binding("r", "view('ranks')", show=False),
        Binding("s", "sort", "Sort"),
        Binding("S", "reverse", "Reverse"),
        Binding("a", "scope", "Mean/Worst"),
        Binding("left_square_bracket", "rank(-1)", "Rank", key_display="["),
        Binding("right_square_bracket", "rank(1)", "Rank", key_display="]"),
        Binding("p", "pause", "Pause"),
        Binding("n", "refresh_now", "Refresh", show=False),
        Binding("question_mark", "help", "Help", key_display="?"),
        Binding("q", "quit", "Quit"),
        Binding("ctrl+c", "quit", "Quit", show=False, priority=True),
    ]

    def __init__(self, source, *, refresh: float | None = 1.0, diagnose=None,
                 clock=time.time, job=None, history: int = 120, freeze_heap: bool = False):
        super().__init__()
        self.freeze_heap = freeze_heap  # see tune_gc()
        self.feed = Feed(source, diagnose=diagnose, clock=clock, history=history)
        self.every = refresh if refresh and refresh > 0 else None
        self.clock = clock
        self.job = job
        self.frame: Frame | None = None
        self.scope: views.Scope = views.MEAN
        self.unit_sort, self.unit_reverse = "exposed_ms", False
        self.rank_sort, self.rank_reverse = "rank", False
        self.paused = False
        self.display_error: str | None = None
        self.frames_applied = 0  # frames whose numbers changed (coalescing is visible here)
        self._dirty: set[str] = set(VIEWS)
        self._fetching = False
        self._fetch_started: float | None = None  # clock() when the fetch in flight began
        self._timer = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="zerodoc-feed")

    # -- layout ------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield TitleBar(id="title")
        with TabbedContent(initial="overview", id="tabs"):
            with TabPane("1 Overview", id="overview"):
                yield Overview()
            with TabPane("2 Units", id="units"):
                yield UnitsView()
            with TabPane("3 Findings", id="findings"):
                yield FindingsView()
            with TabPane("4 Ranks", id="ranks"):
                yield RanksView()
        yield StatusLine(id="status")
        yield Footer()

    def on_mount(self) -> None:
        self._render_chrome()
        self.run_worker(self.refresh_now(), group="fetch")
        if self.every:
            self._timer = self.set_interval(self.every, self._tick)

    def on_unmount(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    # -- refresh -----------------------------------------------------------------------
    def _tick(self) -> None:
        if self.paused or self._fetching:  # coalesce: never queue fetches behind a slow one
            self._render_chrome()
            return
        self.run_worker(self.refresh_now(), group="fetch")

    async def refresh_now(self) -> Frame | None:
        """Fetch a frame on the worker thread and show it; None if a fetch is in flight."""
        if self._fetching:
            return None
        self._fetching, self._fetch_started = True, self.clock()
        try:
            loop = asyncio.get_running_loop()
            frame = await loop.run_in_executor(self._executor, self.feed.fetch)
        finally:
            self._fetching, self._fetch_started = False, None
        try:
            self.apply_frame(frame)
        except NoMatches:  # the app quit while this fetch ran: its widgets are gone
            return None
        return frame

    def apply_frame(self, frame: Frame, force: bool = False) -> None:
        first = self.frame is None
        changed = force or first or frame.signature != self.frame.signature
        self.frame = frame
        if changed:
            self.frames_applied += 1
            self._dirty = set(VIEWS)
            self._render_active()
        self._render_chrome()
        if first and self.freeze_heap:
            gc.collect()
            gc.freeze()  # the app, its widgets and modules: never scanned by the collector

    # -- rendering ---------------------------------------------------------------------
    @property
    def active_view(self) -> str:
        return self.query_one("#tabs", TabbedContent).active or "overview"

    def _render_active(self) -> None:
        view = self.active_view
        if self.frame is None or view not in self._dirty:
            return
        self._dirty.discard(view)
        try:
            if view == "overview":
                self.query_one(Overview).show(self.frame, self.scope)
            elif view == "units":
                self.query_one(UnitsView).show(self.frame, self.scope, self.unit_sort,
                                               self.unit_reverse)
            elif view == "findings":
                self.query_one(FindingsView).show(self.frame)
            elif view == "ranks":
                self.query_one(RanksView).show(self.frame, self.rank_sort, self.rank_reverse)
            self.display_error = None
        except Exception as e:  # noqa: BLE001 - odd data must not take the UI down
            self.display_error = f"display error in {view}: {type(e).__name__}: {e}"
            self.log.error(self.display_error)

    def _render_chrome(self) -> None:
        try:
            title = self.query_one(TitleBar)
        except NoMatches:  # a timer tick while the app quits: its widgets are gone
            return
        title.show(self.feed.description, self.frame)
        job = self._job_text()
        if self.display_error:
            job = f"{job} · {self.display_error}" if job else self.display_error
        now = self.clock()
        self.query_one(StatusLine).show(
            self.frame, now, paused=self.paused, every=self.every, scope=self.scope, job=job,
            fetching_s=None if self._fetch_started is None else now - self._fetch_started)

    def _job_text(self) -> str | None:
        if self.job is None:
            return None
        if self.job.running():
            return "demo running, q stops it"
        codes = [p.returncode for p in self.job.procs]
        bad = [r for r, c in enumerate(codes) if c]
        return f"demo: rank(s) {bad} failed, see logs/" if bad else "demo finished"

    def _invalidate(self, *names: str) -> None:
        self._dirty.update(names)
        self._render_active()
        self._render_chrome()

    # -- actions -----------------------------------------------------------------------
    def action_view(self, name: str) -> None:
        self.query_one("#tabs", TabbedContent).active = name

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        """Show the view and focus its table; a view without one (Overview) takes the focus
        off the pane left behind: a focused widget in a hidden pane makes TabbedContent
        switch back to it (`1` / `o` from Findings stayed on Findings, issue 31)."""
        self._render_active()
        pane = event.pane
        for table in pane.query(ZTable):
            table.focus()
            break
        else:
            if self.focused is not None and pane not in self.focused.ancestors:
                self.set_focus(None)

    def action_sort(self) -> None:
        view = self.active_view
        if view == "units":
            self.unit_sort = _next(views.UNIT_SORTS, self.unit_sort)
            self.unit_reverse = False
            self._invalidate("units")
        elif view == "ranks":
            self.rank_sort = _next(views.RANK_SORTS, self.rank_sort)
            self.rank_reverse = False
            self._invalidate("ranks")
        else:
            self.notify("Sorting applies to the Units (2) and Ranks (4) views.", timeout=3)

    def on_data_table_header_selected(self, event) -> None:
        """A click on a column header sorts by it; a second click reverses."""
        table_id = event.data_table.id
        key = event.column_key.value
        if table_id == "units-table" and key in views.UNIT_SORTS:
            self.unit_reverse = not self.unit_reverse if key == self.unit_sort else False
            self.unit_sort = key
            self._invalidate("units")
        elif table_id == "ranks-table" and key in views.RANK_SORTS:
            self.rank_reverse = not self.rank_reverse if key == self.rank_sort else False
            self.rank_sort = key
            self._invalidate("ranks")

    def action_reverse(self) -> None:
        view = self.active_view
        if view == "units":
            self.unit_reverse = not self.unit_reverse
            self._invalidate("units")
        elif view == "ranks":
            self.rank_reverse = not self.rank_reverse
            self._invalidate("ranks")

    def action_scope(self) -> None:
        self.scope = views.WORST if self.scope == views.MEAN else views.MEAN
        self._invalidate("overview", "units")

    def action_rank(self, delta: int) -> None:
        ranks = sorted(self.frame.snapshot.ranks) if self.frame else []
        if not ranks:
            return
        if isinstance(self.scope, int) and self.scope in ranks:
            self.scope = ranks[(ranks.index(self.scope) + delta) % len(ranks)]
        else:
            self.scope = ranks[0] if delta > 0 else ranks[-1]
        self._invalidate("overview", "units")

    def on_ranks_view_rank_chosen(self, message: RanksView.RankChosen) -> None:
        self.scope = message.rank
        self._dirty.update(("overview", "units"))
        self.action_view("units")

    def action_pause(self) -> None:
        self.paused = not self.paused
        self._render_chrome()

    async def action_refresh_now(self) -> None:
        self.run_worker(self.refresh_now(), group="fetch")

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())


def _next(options: tuple[str, ...], current: str) -> str:
    return options[(options.index(current) + 1) % len(options)] if current in options \
        else options[0]


def tune_gc() -> None:
    """Run the cyclic garbage collector less often in this (TUI) process.

    A refresh of a 64-rank x 128-unit run allocates ~10^5 short-lived objects; with the
    default thresholds (700, 10, 10) the collector ran dozens of times per refresh and took
    ~40% of it (bench/tui_render.py). Reference counting frees nearly all of it anyway.
    With `ZerodocApp(freeze_heap=True)` the long-lived heap is also frozen after the first
    frame, so full collections skip it.
    """
    gc.set_threshold(20_000, 20, 20)


def run_tui(source, *, refresh: float = 1.0, link_profile=None) -> int:
    """Run the app in this terminal until the user quits; `link_profile`: the findings'
    what-if prices calls beyond the run's sizes with it (`zerodoc tui --link-profile`)."""
    tune_gc()
    ZerodocApp(source, refresh=refresh, freeze_heap=True,
               diagnose=diagnose_with(link_profile)).run()
    return 0


def diagnose_with(link_profile):
    """The diagnosis the TUI runs, with a measured link profile (None: the default one)."""
    if link_profile is None:
        return None
    from ..diagnosis import diagnose

    return lambda snap: diagnose(snap, link_profile=link_profile)
