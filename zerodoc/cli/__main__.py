"""`python -m zerodoc.cli`: the old name of `python -m zerodoc` (the `zerodoc` command)."""

from .alias import run_alias
from .main import main

run_alias("zerodoc.cli", "zerodoc", main)
