"""A DataTable fed whole `views.Table`s, rebuilding only what changed."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import DataTable

from ..views import Table

STATE_STYLES = {"STALE": "bold red", "ended": "dim", "live": "green"}
SEVERITY_STYLES = {"CRITICAL": "bold white on red", "ERROR": "bold red", "WARNING": "yellow",
                   "INFO": "cyan"}


def styled(column_key: str, numeric: bool, text: str) -> Text:
    if column_key == "state":
        return Text(text, style=STATE_STYLES.get(text.split(" ", 1)[0], ""))
    if column_key == "severity":
        return Text(text, style=SEVERITY_STYLES.get(text, ""))
    return Text(text, justify="right" if numeric else "left")


class ZTable(DataTable):
    """Shows a `views.Table`; same rows in the same order → only changed cells are touched."""

    DEFAULT_CSS = """
    ZTable { height: 1fr; }
    ZTable > .datatable--header { text-style: bold; }
    """

    def __init__(self, **kw):
        super().__init__(cursor_type="row", zebra_stripes=True, **kw)
        self._shown: Table | None = None
        self.updates = 0  # how many times the table content actually changed (tests, bench)

    @property
    def shown(self) -> Table | None:
        return self._shown

    def show(self, table: Table) -> bool:
        """Display `table`; returns False when it was already on screen."""
        old = self._shown
        if old == table:
            return False
        self._shown = table
        self.updates += 1
        cols = [(c.key, c.label) for c in table.columns]
        if old is None or cols != [(c.key, c.label) for c in old.columns]:
            self._rebuild(table, columns=True)
            return True
        if [k for k, _ in old.rows] != [k for k, _ in table.rows]:
            self._rebuild(table, columns=False)
            return True
        numeric = [c.numeric for c in table.columns]
        keys = [c.key for c in table.columns]
        for (rk, new), (_, prev) in zip(table.rows, old.rows):
            if new == prev:
                continue
            for i, (a, b) in enumerate(zip(new, prev)):
                if a != b:
                    self.update_cell(rk, keys[i], styled(keys[i], numeric[i], a))
        return True

    def _rebuild(self, table: Table, columns: bool) -> None:
        cursor_key = None
        if self.row_count and self.cursor_row < self.row_count:
            try:
                cursor_key = self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value
            except Exception:  # noqa: BLE001 - a stale coordinate only loses the cursor
                cursor_key = None
        scroll_y = self.scroll_y
        self.clear(columns=columns)
        if columns:
            for c in table.columns:
                self.add_column(Text(c.label, justify="right" if c.numeric else "left"),
                                key=c.key)
        numeric = [c.numeric for c in table.columns]
        keys = [c.key for c in table.columns]
        for rk, cells in table.rows:
            self.add_row(*(styled(keys[i], numeric[i], v) for i, v in enumerate(cells)), key=rk)
        if cursor_key is not None:
            try:
                self.move_cursor(row=self.get_row_index(cursor_key), animate=False,
                                 scroll=False)
            except Exception:  # noqa: BLE001 - the row is gone: cursor stays at the top
                pass
        self.scroll_to(y=scroll_y, animate=False, immediate=True)

    def cursor_key(self) -> str | None:
        if not self.row_count:
            return None
        try:
            return self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value
        except Exception:  # noqa: BLE001
            return None
