"""`zerodoc tui`: the live terminal UI (Textual).

Imported only by the `tui` command and `zerodoc demo`; nothing in the shim imports it. The
modules without Textual (`feed`, `views`, `windows`, `history`, `fmt`, `synthetic`) hold the
numbers; `app`, `widgets` and `screens` only lay them out.
"""
