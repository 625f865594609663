"""The `zerodoc` command line: one module per command, argument parsing and printing only.

`main.py` holds the entry point (`zerodoc = zerodoc.cli.main:main`) and the list of
commands; each command module defines ``add_parser(subparsers)``. Shared options are in
`options.py`, the help formatter in `helpformat.py`. The `python -m` tools live here too,
each reached through a thin alias where it always was: `rules_gen` (`python -m
zerodoc.ops.alerts`), `dashboards_gen` (`python -m zerodoc.ops.grafana.build`), `metrics_doc`
(`python -m zerodoc.catalog`), `webconfig` (`python -m zerodoc.exporter.webconfig`),
`convert` (`python -m zerodoc.runlog.convert`) and `rulecase` (`python -m
zerodoc.testing.rulecases`). What a command computes lives in the library, never here.
"""
