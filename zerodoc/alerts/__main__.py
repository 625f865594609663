"""`python -m zerodoc.alerts`: the old name of `python -m zerodoc.ops.alerts`."""

from ..cli.alias import run_alias
from ..cli.rules_gen import main

run_alias("zerodoc.alerts", "python -m zerodoc.ops.alerts", main)
