"""The demo job: a small transformer, its launcher and the ways it can be sharded."""

WRAPS = ("block", "linear", "root")  # demo wrap granularities (DemoConfig.wrap)
