"""`python -m zerodoc.cli.rules_gen`: write (or --check) zerodoc's Prometheus rule files and
the PrometheusRule manifest (`make dashboards`). The generator is `zerodoc.ops.alerts`."""

from __future__ import annotations

import sys
from pathlib import Path

from ..ops import resources
from ..ops.alerts import (
    PROMETHEUS_RULE_FILE, RuleOptions, rules_dir, stale_files, stale_prometheus_rule,
    write_prometheus_rule, write_rules,
)
from ..thresholds import LINK_BUSBW, Thresholds
from .main import guarded


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m zerodoc.cli.rules_gen",
                                description="Generate zerodoc's Prometheus rule files.")
    p.add_argument("--layout", default="flat", choices=["flat", "two-level"],
                   help="flat: one server scrapes every rank (rules/); two-level: rack "
                        "servers pre-aggregate into a central store (rules/two-level/: the "
                        "centre's rules, a rack's rules and a rack Prometheus' configuration; "
                        "docs/operations.md, \"The two-level layout\")")
    p.add_argument("--out", default=None,
                   help="output directory (default: rules/ of zerodoc's operations files, "
                        "rules/two-level/ with --layout two-level)")
    p.add_argument("--k8s-out", default=None,
                   help="directory of the PrometheusRule manifest ('' to skip it; the flat "
                        "layout's only)")
    p.add_argument("--window", default="1m", help="rate() window")
    p.add_argument("--unit-window", default=None,
                   help="rate window and interval of the per-unit rule groups (default: four "
                        "times --window, 4m; docs/operations.md has what they cost)")
    p.add_argument("--for", dest="alert_for", default=None,
                   help="for: of the engine-mirroring alerts (default Thresholds.alert_for)")
    p.add_argument("--link", default="infiniband", choices=list(LINK_BUSBW),
                   help="link class the bandwidth numbers are judged against")
    p.add_argument("--runbook-base", default="", help="prefix of runbook_url")
    p.add_argument("--threshold", action="append", metavar="NAME=VALUE",
                   help="override a threshold (repeatable)")
    p.add_argument("--check", action="store_true",
                   help="only check that the files in --out are up to date")
    a = p.parse_args(argv)
    try:
        t = Thresholds.with_overrides(a.threshold)
        opts = RuleOptions(window=a.window, unit_window=a.unit_window,
                           alert_for=a.alert_for, link=a.link,
                           runbook_base=a.runbook_base, layout=a.layout)
        a.out = a.out or str(rules_dir(opts))
        if a.layout != "flat":
            a.k8s_out = ""  # the PrometheusRule manifest holds the flat layout's groups
        elif a.k8s_out is None:
            a.k8s_out = str(resources.kubernetes_dir())
    except Exception as e:  # UserError / ValueError / ResourcesMissing: one line, no traceback
        print(f"zerodoc.cli.rules_gen: error: {e}", file=sys.stderr)
        return 2
    if a.check:
        stale = [str(Path(a.out) / n) for n in stale_files(a.out, t, opts)]
        if a.k8s_out and stale_prometheus_rule(a.k8s_out, t, opts):
            stale.append(str(Path(a.k8s_out) / PROMETHEUS_RULE_FILE))
        for name in stale:
            print(f"stale: {name} (run `python -m zerodoc.cli.rules_gen"
                  f"{'' if a.layout == 'flat' else ' --layout ' + a.layout}`)",
                  file=sys.stderr)
        return 1 if stale else 0
    paths = write_rules(a.out, t, opts)
    if a.k8s_out:
        paths.append(write_prometheus_rule(a.k8s_out, t, opts))
    for path in paths:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(guarded(main))  # a closed pipe or Ctrl-C ends it quietly
