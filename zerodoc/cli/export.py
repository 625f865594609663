"""`zerodoc export`: write the dashboards, rules and configurations out for GitOps."""

from __future__ import annotations

import sys


def add_parser(sub) -> None:
    p = sub.add_parser(
        "export", help="write dashboards, rules, Prometheus/Alertmanager/Kubernetes files to DIR",
        description="Write zerodoc's operations files — Grafana dashboards and provisioning, "
        "Prometheus recording and alerting rules with their promtool tests, prometheus.yml, "
        "alertmanager.yml, the Kubernetes PodMonitor / ServiceMonitor / PrometheusRule and "
        "the runbooks — into DIR, with the layout they have in zerodoc's source tree, to "
        "commit to the repository your Prometheus and Grafana are deployed from. The rule "
        "files are generated with the options below. Files that are already up to date are "
        "not touched, other files in DIR are left alone; --check only reports drift.")
    p.add_argument("dir", nargs="?", metavar="DIR", help="destination folder")
    p.add_argument("--runbook-base", default="",
                   help="prefix of every alert's runbook_url, e.g. the URL under which DIR is "
                        "browsable (https://git.example.com/ops/monitoring/-/blob/main/)")
    p.add_argument("--link", default="infiniband",
                   help="link class the bandwidth alerts are judged against (nvlink, pcie, "
                        "infiniband, ethernet, gloo-cpu; default infiniband)")
    p.add_argument("--window", default="1m", help="rate() window of the rules (default 1m)")
    p.add_argument("--unit-window", default=None,
                   help="rate window and interval of the per-unit rule groups (default: four "
                        "times --window, 4m; docs/operations.md has what they cost)")
    p.add_argument("--for", dest="alert_for", default=None,
                   help="for: of the engine-mirroring alerts (default: the thresholds' 5m)")
    p.add_argument("--threshold", action="append", default=[], metavar="NAME=VALUE",
                   help="override a threshold (repeatable), as for `zerodoc report`")
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 if DIR differs from what would be written")
    p.add_argument("--list", action="store_true",
                   help="list the files and where this installation keeps them, write nothing")
    p.set_defaults(func=run, _parser=p)


def run(args, out=None) -> int:
    from ..ops import export, resources
    from ..ops.alerts import RuleOptions
    from ..errors import UserError
    from ..thresholds import Thresholds

    out = out or sys.stdout
    if args.list:
        print(f"# zerodoc operations files ({resources.kind()} copy in {resources.root()})",
              file=out)
        for rel, _p in resources.files():
            print(rel, file=out)
        return 0
    if not args.dir:
        args._parser.error("DIR is required (or --list)")
    t = Thresholds.with_overrides(args.threshold)
    try:
        opts = RuleOptions(window=args.window, unit_window=args.unit_window,
                           alert_for=args.alert_for, link=args.link,
                           runbook_base=args.runbook_base)
    except ValueError as e:
        raise UserError(str(e).replace("RuleOptions.", "--").replace("alert_for", "for")
                        .replace("unit_window", "unit-window")) \
            from None
    tree = export.build(t, opts)
    if args.check:
        drift = export.differences(tree, args.dir)
        for rel in drift:
            print(f"differs: {rel}", file=out)
        if drift:
            print(f"zerodoc export: {len(drift)} of {len(tree.files)} file(s) in {args.dir} "
                  "differ (run `zerodoc export` with the same options)", file=sys.stderr)
            return 1
        print(f"zerodoc export: {args.dir} is up to date ({len(tree.files)} files)", file=out)
        return 0
    try:
        changed = export.write(tree, args.dir)
    except OSError as e:
        raise UserError(f"cannot write to {args.dir}: {e.strerror or e}") from None
    for rel in changed:
        print(f"wrote {rel}", file=out)
    for note in tree.notes:
        print(f"note: {note}", file=out)
    print(f"zerodoc export: {len(tree.files)} files in {args.dir} ({len(changed)} written, "
          f"{len(tree.files) - len(changed)} already up to date)", file=out)
    return 0
