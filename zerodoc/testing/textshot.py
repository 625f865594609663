"""A text screenshot of a running app: what a terminal would show, without colours.

Used by the snapshot tests and the docs. Built the way `App.export_screenshot()` builds its
SVG (the compositor's full render of the current screen), exported as plain text instead.
"""

from __future__ import annotations

import io

from rich.console import Console


def screen_text(app) -> str:
    width, height = app.size
    console = Console(width=width, height=height, file=io.StringIO(), record=True,
                      color_system=None, force_terminal=False, legacy_windows=False,
                      safe_box=False, soft_wrap=False)
    # Same private entry points as App.export_screenshot (checked on Textual 8.2).
    update = app.screen._compositor.render_update(full=True,
                                                 screen_stack=app._background_screens)
    console.print(update)
    lines = console.export_text(styles=False).splitlines()
    return "\n".join(line.rstrip() for line in lines) + "\n"
