"""Overview: headline numbers, sparklines, memory headroom per rank."""

from __future__ import annotations

from rich.columns import Columns
from rich.table import Table as RichTable
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import Label, Static

from ... import humanize as fmt
from .. import views
from ..feed import Frame

LEVEL_STYLES = {"ok": "green", "warn": "bold yellow", "crit": "bold red", "": ""}
SEVERITY_STYLES = {"CRITICAL": "bold white on red", "ERROR": "bold red", "WARNING": "bold yellow",
                   "INFO": "cyan"}


class SparkRow(Horizontal):
    """A label, a sparkline (`views.spark_cells`: one cell per step, a step without a value
    a gap) and the latest value; a sampled series says how many steps it has."""

    DEFAULT_CSS = """
    SparkRow { height: 1; }
    SparkRow > .spark-label { width: 14; color: $text-muted; }
    SparkRow > .spark-cells { width: 1fr; height: 1; color: $success; }
    SparkRow > .spark-value { width: 48; padding-left: 2; }
    """

    def __init__(self, title: str, **kw):
        super().__init__(**kw)
        self.title = title
        self.data: list[float | None] = []

    def compose(self) -> ComposeResult:
        yield Label(self.title, classes="spark-label")
        yield Static("", classes="spark-cells")
        yield Label("-", classes="spark-value")

    def set(self, data: list[float | None]) -> None:
        self.data = list(data)
        self._draw()
        shown = [x for x in data if x is not None]
        text = f"last {fmt.duration(shown[-1])}" if shown else "-"
        if len(shown) > 1:
            text += f", max {fmt.duration(max(shown))}"
        if shown and len(shown) < len(data):
            text += f" ({len(shown)} sampled of {len(data)})"
        self.query_one(".spark-value", Label).update(Text(text))

    def _draw(self) -> None:
        cells = self.query_one(".spark-cells", Static)
        width = cells.size.width or max(10, self.size.width - 48) or 60
        cells.update(Text(views.spark_cells(self.data, width)))

    def on_resize(self, _event) -> None:
        self._draw()


class Overview(Vertical):
    """Answers at a glance: comm-bound or not, which unit, which rank, how much memory left."""

    DEFAULT_CSS = """
    Overview { height: 1fr; }
    Overview #ov-headlines { height: auto; padding: 0 1; }
    Overview #ov-sparks { height: auto; padding: 1 1 0 1; }
    Overview #ov-sparks-title { color: $text-muted; }
    Overview #ov-finding { height: auto; padding: 1 1 0 1; }
    Overview #ov-trace { height: auto; padding: 1 1 0 1; }
    Overview #ov-headroom-title { padding: 1 1 0 1; color: $text-muted; }
    Overview #ov-headroom-scroll { height: 1fr; padding: 0 1; }
    """

    def compose(self) -> ComposeResult:
        yield Static(id="ov-headlines")
        with Vertical(id="ov-sparks"):
            yield Label("Per step, oldest → newest", id="ov-sparks-title")
            yield SparkRow("step time", id="spark-step")
            yield SparkRow("exposed comm", id="spark-exposed")
            yield SparkRow("compute", id="spark-compute")
        yield Static(id="ov-finding")
        yield Static(id="ov-trace")  # profiler traces: their scope and device time
        yield Label("Memory headroom per rank (capacity − peak; bar = share free)",
                    id="ov-headroom-title")
        with VerticalScroll(id="ov-headroom-scroll"):
            yield Static(id="ov-headroom")

    def show(self, frame: Frame, scope: views.Scope) -> None:
        grid = RichTable.grid(padding=(0, 2))
        # label and value keep their width on a narrow terminal; the detail gives way
        grid.add_column(style="bold", min_width=12, no_wrap=True)
        grid.add_column(min_width=16, no_wrap=True)
        grid.add_column(style="dim")
        for h in views.headlines(frame, scope):
            grid.add_row(Text(h.label), Text(h.value, style="bold " + LEVEL_STYLES[h.level]),
                         Text(h.detail, no_wrap=True, overflow="ellipsis"))
        self.query_one("#ov-headlines", Static).update(grid)

        series = views.sparkline_series(frame, scope)
        self.query_one("#spark-step", SparkRow).set(series["step"])
        self.query_one("#spark-exposed", SparkRow).set(series["exposed"])
        self.query_one("#spark-compute", SparkRow).set(series["compute"])

        self.query_one("#ov-finding", Static).update(_top_finding(frame))
        trace = views.trace_lines(frame)
        box = self.query_one("#ov-trace", Static)
        box.display = bool(trace)
        box.update(Text("\n".join(trace)))
        self.query_one("#ov-headroom", Static).update(_headroom_grid(frame))


def _top_finding(frame: Frame) -> Text:
    if frame.diagnose_error and not frame.findings:
        return Text(f"Diagnosis: {frame.diagnose_error}", style="yellow")
    if frame.data_problems:
        p = frame.data_problems[0]
        t = Text("No data  ", style="bold yellow")
        t.append(p.message, style="yellow")
        t.append(f" · fix: {p.fix}" if p.fix else "", style="dim")
        more = len(frame.data_problems) - 1 + len(frame.findings)
        if more:
            t.append(f"   (+{more} more, press 3)", style="dim")
        return t
    if not frame.findings:
        if not frame.snapshot.ranks:
            return Text("Waiting for ranks to report…", style="dim")
        if frame.waiting:
            return Text(f"No finding from the rules that ran, not an all-clear  "
                        f"{views.not_evaluated_text(frame.waiting)}", style="yellow")
        if views.trace_scope(frame):  # as the report says it
            return Text("No findings in what the traces show (steps, collectives, ranks); "
                        "they show no per-unit detail (Profiler traces below)", style="green")
        old = views.samples_before_only(frame)
        if old:  # no sample inside the window: not an all-clear for it (issue 31)
            return Text(f"No findings; the per-unit rules read {old}, none inside the window: "
                        "not an all-clear for it", style="yellow")
        return Text("No findings: nothing crossed a threshold in this window.", style="green")
    f = frame.findings[0]
    t = Text("Top finding  ")
    t.append(f" {f.severity.name} ", style=SEVERITY_STYLES.get(f.severity.name, ""))
    t.append(f" {f.code} ", style="bold")
    t.append(f.title)
    graded = views.graded_on(f)
    if graded:  # the figure the severity was graded on
        t.append(f"  ({graded})", style="dim")
    more = len(frame.findings) - 1
    t.append(f"   (+{more} more, press 3)" if more else "   (press 3 for evidence and fix)",
             style="dim")
    return t


HEADROOM_CELLS = 64  # beyond this many ranks, the grid shows the lowest ones (and says so)


def _headroom_grid(frame: Frame):
    cells = []
    per = views.headroom_per_rank(frame)
    note = None
    if len(per) > HEADROOM_CELLS:  # a thousand bars are not read at 2 a.m.: the lowest are
        stale = [p for p in per if p[0] in frame.stale]
        known = sorted((p for p in per if p[0] not in frame.stale and p[3] is not None),
                       key=lambda p: p[3])
        keep = (stale + known)[:HEADROOM_CELLS]
        note = Text(f"the {len(keep)} lowest of {len(per)} ranks (stale first)", style="dim")
        per = sorted(keep, key=lambda p: p[0])
    for r, head, cap, frac in per:
        t = Text(f"r{r:<3} ", style="bold")
        if r in frame.stale:
            t.append("STALE".ljust(17), style="bold red")
        elif frac is None:
            t.append((fmt.size(head) if head is not None else "n/a").ljust(17), style="dim")
        else:
            filled = max(0, min(10, round(frac * 10)))
            level = views._level(frac, views.T.headroom_fraction_warn,
                                 views.T.headroom_fraction_crit, low_bad=True)
            t.append("█" * filled, style=LEVEL_STYLES[level] or "green")
            t.append("░" * (10 - filled), style="dim")
            t.append(f" {frac * 100:3.0f}%".ljust(7))
        cells.append(t)
    if not cells:
        return Text("no ranks yet", style="dim")
    grid = Columns(cells, padding=(0, 2), equal=True)
    if note is None:
        return grid
    from rich.console import Group

    return Group(note, grid)
