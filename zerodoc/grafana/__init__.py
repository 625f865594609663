"""The old home of `python -m zerodoc.ops.grafana.build` (the dashboards generator), kept
for its thin alias `python -m zerodoc.grafana.build`. Nothing here is imported by the package."""
