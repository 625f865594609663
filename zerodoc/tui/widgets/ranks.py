"""Per-rank comparison: step, compute, exposed, memory headroom and state of every rank."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import DataTable, Static

from .. import views
from ..feed import Frame
from .table import ZTable


class RanksView(Vertical):
    DEFAULT_CSS = """
    RanksView { height: 1fr; }
    RanksView > .caption { height: 1; padding: 0 1; color: $text-muted; }
    """

    class RankChosen(Message):
        """The user pressed enter on a rank: show that rank in the other views."""

        def __init__(self, rank: int):
            super().__init__()
            self.rank = rank

    def compose(self) -> ComposeResult:
        yield Static(classes="caption", id="ranks-caption")
        yield ZTable(id="ranks-table")

    def show(self, frame: Frame, sort: str, reverse: bool) -> None:
        table = views.rank_table(frame, sort, reverse)
        self.query_one("#ranks-caption", Static).update(Text(table.caption))
        self.query_one(ZTable).show(table)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        if event.row_key.value is not None:
            self.post_message(self.RankChosen(int(event.row_key.value)))
