"""`python -m zerodoc.grafana.build`: the old name of `python -m zerodoc.ops.grafana.build`."""

if __name__ == "__main__":
    from ..cli.alias import run_alias
    from ..cli.dashboards_gen import main

    run_alias("zerodoc.grafana.build", "python -m zerodoc.ops.grafana.build", main)
