"""The help formatter of every `zerodoc` command: defaults shown where they say something.

argparse's `ArgumentDefaultsHelpFormatter` appends "(default: X)" to every option, which
prints "(default: True)" for a `--no-…` flag whose default is True (the flag makes it False),
"(default: None)" for options whose default is worked out later, and a second "(default: …)"
after help that already names its default. `DefaultsHelpFormatter` appends the default only
for options that take a value, have a real default and do not already say it.
"""

from __future__ import annotations

import argparse


def shows_default(action: argparse.Action) -> bool:
    """Whether "(default: …)" adds information to this action's help."""
    if action.help in (None, argparse.SUPPRESS) or "default" in action.help.lower():
        return False  # no help, or it already says its default in words
    if action.nargs == 0:  # flags: store_true / store_false / store_const / count-less
        return False
    d = action.default
    return d is not None and d is not argparse.SUPPRESS and not isinstance(d, bool) \
        and d != []


class DefaultsHelpFormatter(argparse.HelpFormatter):
    def _get_help_string(self, action: argparse.Action) -> str | None:
        help_text = action.help
        if shows_default(action):
            help_text = f"{help_text} (default: %(default)s)"
        return help_text


class RawDescriptionDefaultsHelpFormatter(argparse.RawDescriptionHelpFormatter,
                                          DefaultsHelpFormatter):
    """The same, keeping the description's and epilog's own line breaks."""
