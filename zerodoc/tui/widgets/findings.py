"""Findings: the rules engine's list, and the highlighted one's evidence, threshold and fix."""

from __future__ import annotations

from rich.table import Table as RichTable
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.widgets import DataTable, Static

from .. import views
from ..feed import Frame
from .table import SEVERITY_STYLES, ZTable

LABEL_STYLES = {"evidence": "cyan", "threshold": "magenta", "fix": "bold green",
                "predicted": "green", "history": "yellow", "where": "", "docs": "dim"}


class FindingsView(Vertical):
    DEFAULT_CSS = """
    FindingsView { height: 1fr; }
    FindingsView > .caption { height: 1; padding: 0 1; color: $text-muted; }
    FindingsView > ZTable { height: 2fr; }
    FindingsView > #finding-scroll { height: 3fr; border-top: hkey $primary 30%; padding: 0 1; }
    """

    def compose(self) -> ComposeResult:
        yield Static(classes="caption", id="findings-caption")
        yield ZTable(id="findings-table")
        with VerticalScroll(id="finding-scroll"):
            yield Static(id="finding-detail")

    def show(self, frame: Frame) -> None:
        self._frame = frame
        table = views.finding_table(frame)
        cap = table.caption
        if frame.data_problems:
            cap += f" · NO DATA, not an all-clear: {frame.data_problems[0].message}"
        if frame.diagnose_error:
            cap += f" · {frame.diagnose_error}"
        if frame.waiting:
            cap += f" · {views.not_evaluated_text(frame.waiting)}"
        self.query_one("#findings-caption", Static).update(Text(cap))
        t = self.query_one(ZTable)
        t.show(table)
        self._detail(t.cursor_key())

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        event.stop()
        self._detail(event.row_key.value if event.row_key is not None else None)

    def _detail(self, key: str | None) -> None:
        frame = getattr(self, "_frame", None)
        detail = self.query_one("#finding-detail", Static)
        if frame is None:
            return
        found = None
        for i, f in enumerate(frame.findings):
            if views.finding_key(i, f) == key:
                found = f
        if found is None and frame.findings:
            found = frame.findings[0]
        if found is None and frame.data_problems:
            t = Text("No data: the rules had nothing to read, so no findings is not an "
                     "all-clear.\n", style="bold yellow")
            for p in frame.data_problems:
                t.append(f"\n{p.message}\n", style="yellow")
                if p.fix:
                    t.append(f"fix: {p.fix}\n", style="green")
            detail.update(t)
            return
        if found is None:
            msg = ("No findings: nothing crossed a threshold in this window."
                   if frame.snapshot.ranks else "Waiting for ranks to report…")
            old = views.samples_before_only(frame) if frame.snapshot.ranks else None
            if old:  # no sample inside the window: not an all-clear for it (issue 31)
                msg = (f"No findings; the per-unit rules read {old}, none inside the "
                       "window: not an all-clear for it.")
            if frame.snapshot.ranks and frame.waiting:
                msg = (f"No finding from the rules that ran; not an all-clear: "
                       f"{views.not_evaluated_text(frame.waiting)}.")
            detail.update(Text(msg, style="dim"))
            return
        grid = RichTable.grid(padding=(0, 2))
        grid.add_column(width=10, no_wrap=True)
        grid.add_column()
        lines = views.finding_detail(found)
        head = Text()
        head.append(f" {found.severity.name} ", style=SEVERITY_STYLES.get(found.severity.name, ""))
        head.append(f" {found.code} ", style="bold")
        head.append(found.name, style="dim")
        graded = views.graded_on(found)
        if graded:  # the severity with the figure it was graded on
            head.append(f"  ({graded})", style="bold")
        grid.add_row("", head)
        grid.add_row("", Text(found.title, style="bold"))
        for label, text in lines[2:]:
            # Text, never a str: a str cell is parsed as Rich markup and loses "[...]"
            # (e.g. `set_modules_to_forward_prefetch([next_block])` in a fix).
            grid.add_row(Text(label, style=LABEL_STYLES.get(label, "")), Text(text))
        detail.update(grid)

