"""`zerodoc stack`: a local Prometheus (+ Alertmanager if installed) for running demos, or
VictoriaMetrics with vmagent and vmalert (`--engine victoria`)."""

from __future__ import annotations

import argparse
import signal
import sys
import time

from .helpformat import DefaultsHelpFormatter


def add_parser(sub) -> None:
    p = sub.add_parser(
        "stack", help="run a local Prometheus scraping the live zerodoc runs, with the rules",
        description="Start Prometheus on 127.0.0.1 scraping every live run under RUNS (a run "
        "directory, or a folder of them, default ./zerodoc-runs), with zerodoc's recording "
        "and alerting rules generated for a short window so alerts fire within minutes, and "
        "Alertmanager (if installed: `alertmanager` or Debian's `prometheus-alertmanager`) "
        "with zerodoc's exporters/alertmanager.yml or --alertmanager-config. Targets follow "
        "the runs as they start and end. --engine victoria runs Debian's victoria-metrics "
        "package instead (the store a big fleet runs): VictoriaMetrics on --port, vmagent "
        "scraping the same targets into it, vmalert evaluating the same rules against it; "
        "point `zerodoc report`/`tui` and Grafana's Prometheus data source at its URL. "
        "Ctrl-C stops everything.",
        formatter_class=DefaultsHelpFormatter)
    p.add_argument("runs", nargs="?", default="zerodoc-runs", metavar="RUNS",
                   help="run directory or folder of run directories")
    p.add_argument("--port", type=int, default=9090,
                   help="Prometheus (or VictoriaMetrics) port on 127.0.0.1")
    p.add_argument("--engine", choices=("prometheus", "victoria"), default="prometheus",
                   help="the store: Prometheus, or VictoriaMetrics + vmagent + vmalert")
    p.add_argument("--scrape-interval", default="2s", help="scrape and rule evaluation interval")
    p.add_argument("--window", default="30s",
                   help="rate() window of the rules (production rules in rules/ use 1m)")
    p.add_argument("--unit-window", default=None,
                   help="window and interval of the per-unit rules (default: --window: a "
                        "local stack watches a small run; production rules use 4x --window)")
    p.add_argument("--for", dest="alert_for", default="1m",
                   help="for: of the alerts (production: 5m)")
    p.add_argument("--link", default=None,
                   help="link class for the bandwidth rules (default: inferred from the run)")
    p.add_argument("--threshold", action="append", default=[], metavar="NAME=VALUE",
                   help="override a threshold of the alerts (repeatable), as for `zerodoc "
                        "report`")
    p.add_argument("--alertmanager-config", default=None, metavar="FILE",
                   help="Alertmanager configuration with your receivers (default: zerodoc's "
                        "exporters/alertmanager.yml, whose receiver notifies nobody)")
    p.add_argument("--no-alertmanager", action="store_true",
                   help="do not start Alertmanager even if it is installed")
    p.add_argument("--data-dir", default=None,
                   help="keep configuration and TSDB here (default: a temporary folder, "
                        "removed on exit)")
    p.add_argument("--duration", type=float, default=None, help=argparse.SUPPRESS)
    p.set_defaults(func=run)


def _validate(args) -> None:
    from ..ops.alerts import RuleOptions
    from ..errors import UserError
    from ..thresholds import Thresholds

    args.thresholds = Thresholds.with_overrides(args.threshold)
    if not 1 <= args.port <= 65535:
        raise UserError(f"--port {args.port} is not a port number")
    try:
        RuleOptions(window=args.window, unit_window=args.unit_window,
                    alert_for=args.alert_for, **({"link": args.link} if args.link else {}))
    except ValueError as e:
        raise UserError(str(e).replace("RuleOptions.", "--").replace("alert_for", "for")
                        .replace("unit_window", "unit-window")) from None


def run(args, out=sys.stdout) -> int:
    from pathlib import Path

    from ..ops import resources
    from ..ops.stack import Stack

    _validate(args)
    stack = Stack(Path(args.runs), port=args.port, scrape_interval=args.scrape_interval,
                  window=args.window, unit_window=args.unit_window,
                  alert_for=args.alert_for, link=args.link,
                  work_dir=Path(args.data_dir) if args.data_dir else None,
                  alertmanager="" if args.no_alertmanager else None,
                  alertmanager_config=args.alertmanager_config, thresholds=args.thresholds,
                  engine=args.engine)

    def on_term(signum, frame):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, on_term)
    code = 0
    try:
        stack.start()
        say = lambda s, end="\n": print(s, file=out, flush=True, end=end)  # noqa: E731
        store = "VictoriaMetrics" if args.engine == "victoria" else "Prometheus"
        say(f"zerodoc stack: {store} {stack.url} (config and data in {stack.work_dir})")
        if stack.rules_url:
            say(f"  vmagent {stack.agent_url} scrapes the runs into it; vmalert "
                f"{stack.rules_url} evaluates the rules against it")
        if stack.am_port:
            say(f"  Alertmanager http://127.0.0.1:{stack.am_port} (configuration "
                f"{stack.alertmanager_config})")
        else:
            alerts_at = f"{stack.rules_url}/vmalert/alerts" if stack.rules_url else \
                f"{stack.url}/alerts"
            say("  Alertmanager not started: " if args.no_alertmanager else
                "  Alertmanager not installed (Debian: prometheus-alertmanager): ", end="")
            say(f"alerts are visible at {alerts_at}")
        say(f"  rules: window {args.window} (per-unit {args.unit_window or args.window}), "
            f"for {args.alert_for}, link {stack.link}; "
            f"runbooks {resources.runbooks()}")
        if stack.rules_url:
            say(f"  targets {stack.agent_url}/targets   alerts {stack.rules_url}/vmalert/alerts"
                f"   rules {stack.rules_url}/vmalert/groups")
        else:
            say(f"  targets {stack.url}/targets   alerts {stack.url}/alerts   "
                f"rules {stack.url}/rules")
        say(f"  report: zerodoc report {stack.url}   Grafana: add a Prometheus data source "
            f"at {stack.url} and import "
            f"{resources.dashboards_dir()}/*.json (or `zerodoc export DIR` for provisioning "
            "files)")
        say("  Ctrl-C stops it.")
        deadline = time.monotonic() + args.duration if args.duration else None
        first = True
        while deadline is None or time.monotonic() < deadline:
            added, removed = stack.refresh_targets()
            for t in added:
                say(f"  + scraping {t}")
            for t in removed:
                say(f"  - {t} finished")
            if first and not added and not stack._reported:
                say(f"  no live run under {args.runs} yet; waiting for one "
                    "(zerodoc demo --port 0 --steps 0)")
            first = False
            dead = stack.dead()
            if dead:
                print(f"zerodoc stack: {', '.join(dead)} exited: "
                      f"{stack.log_tail(dead[0])}", file=sys.stderr)
                code = 1
                break
            time.sleep(2.0)
    except KeyboardInterrupt:
        pass
    finally:
        stack.stop()
        signal.signal(signal.SIGTERM, old)
    if code == 0:
        print("zerodoc stack: stopped", file=out, flush=True)
    return code
