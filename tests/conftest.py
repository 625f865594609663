"""Suite-wide settings. Per-unit detail on every step (attach option `detail`, issue 19's
tiers): the tests and recorded scenarios check per-unit truth step by step, and a short run
that exists to be diagnosed forces detail on every step. Tests about sampling pass `detail=`
to attach() (an explicit option wins over $ZERODOC_DETAIL) or set the variable themselves;
subprocess ranks inherit the environment."""

import os

os.environ.setdefault("ZERODOC_DETAIL", "every")
