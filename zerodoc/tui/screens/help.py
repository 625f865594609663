"""`?`: what each view shows and every key."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Markdown

HELP = """\
# zerodoc tui

**Overview** (`1`) — step time, exposed communication as a share of the step, exposed comm ÷
compute (above 0.5 the step is communication-bound), the unit whose all-gather the compute
waits for most, the slowest (or stale) rank, and the lowest memory headroom. Sparklines show
step time, exposed comm and compute, a cell per step (exposed comm and compute are measured
on sampled steps: a bar per sample, gaps between); the grid shows each rank's headroom.

**Units** (`2`) — one row per sharded unit, per step over the window: all-gather bytes and
time, the exposed part (the compute waited for it) and its share, bus bandwidth (nccl-tests
convention), compute, reduce-scatter time, and whether the unit reshards after forward.

**Findings** (`3`) — what the rules engine found, most severe first; the highlighted one's
severity with the figure it was graded on, evidence (the numbers that triggered it),
threshold, fix and predicted effect; rules that could not run say "not evaluated" and why.

**Ranks** (`4`) — every rank side by side: state (live, ended, STALE), step, compute,
exposed, comm/compute, compute ÷ median (a straggler stands out) and headroom.
`enter` on a rank shows that rank in the other views.

Keys:

- `1` `2` `3` `4` (or `o` `u` `f` `r`): overview, units, findings, ranks
- `s` / `S`: next sort column / reverse the sort (units, ranks; header click sorts too)
- `a`: mean over ranks ↔ worst rank per column
- `[` / `]`: previous / next single rank (`a` returns to all ranks)
- `p`: pause / resume live refresh · `n`: refresh now
- `?`: this help (`escape` closes) · `q`: quit

Numbers are per step over the last N steps (`--window`; "no warm-up": step 1 left out,
`--include-warmup` keeps it); exposed = the time the compute waited on a collective (all
collectives; ZD006 grades the link-attributable part). Per-unit numbers come from the sampled
steps the captions name. "LIVE" in the title: the run is still being written. Ranks with no new step for a while, or that stop reporting, are
marked STALE and kept with their last numbers.
"""


class HelpScreen(ModalScreen):
    BINDINGS = [("escape", "dismiss", "Close"), ("question_mark", "dismiss", "Close"),
                ("q", "dismiss", "Close")]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll { width: 100; max-width: 95%; height: 90%;
                                  border: round $primary; background: $surface; padding: 0 1; }
    """

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Markdown(HELP)
