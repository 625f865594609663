"""The `zerodoc` command line: one module per command, argument parsing and printing only.

`main.py` holds the entry point (`zerodoc = zerodoc.cli.main:main`) and the list of
commands; each command module defines ``add_parser(subparsers)``. Shared options are in
`options.py`, the help formatter in `helpformat.py`. The `python -m` tools live here too and
run from here, each with its own `if __name__ == "__main__":` (the old names below the
commands were dropped at 0.x: no module below imports this package): `python -m
zerodoc.cli.rules_gen` (the Prometheus rules), `dashboards_gen` (the Grafana dashboards),
`metrics_doc` (docs/metrics.md), `webconfig` (a password hash, a web configuration checked),
`convert` (a schema-1 run directory as the current schema, 3) and `rulecase` (a rule case from a real run).
What a command computes lives in the library, never here.
"""
