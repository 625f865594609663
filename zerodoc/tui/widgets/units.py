"""Per-unit table: all-gather time, exposed, bytes, busbw, compute, sortable."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

from .. import views
from ..feed import Frame
from .table import ZTable


class UnitsView(Vertical):
    DEFAULT_CSS = """
    UnitsView { height: 1fr; }
    UnitsView > .caption { height: 1; padding: 0 1; color: $text-muted; }
    """

    def compose(self) -> ComposeResult:
        yield Static(classes="caption", id="units-caption")
        yield ZTable(id="units-table")

    def show(self, frame: Frame, scope: views.Scope, sort: str, reverse: bool) -> None:
        table = views.unit_table(frame, scope, sort, reverse)
        self.query_one("#units-caption", Static).update(Text(table.caption))
        self.query_one(ZTable).show(table)
