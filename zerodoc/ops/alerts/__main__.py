"""`python -m zerodoc.ops.alerts`: a thin alias of the command in `zerodoc.cli.rules_gen`."""

import sys

from ...cli.main import guarded
from ...cli.rules_gen import main

sys.exit(guarded(main))
