"""Grafana tooling: dashboards built as code (`zerodoc.grafana.build`, needs the `grafana`
extra) and pushed by `zerodoc dashboards push` (`zerodoc.grafana.push`).

Nothing here is imported by `import zerodoc` or by the training-side shim.
"""
