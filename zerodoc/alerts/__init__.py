"""The old name of `python -m zerodoc.ops.alerts` (the Prometheus rules generator), kept as a
thin alias: `python -m zerodoc.alerts` runs it. Nothing here is imported by the package."""
