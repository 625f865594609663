"""Grafana tooling: dashboards built as code (`zerodoc.ops.grafana.build`, needs the `grafana`
extra) and pushed by `zerodoc dashboards push` (`zerodoc.ops.grafana.push`).

Nothing here is imported by `import zerodoc` or by the training-side shim.
"""
