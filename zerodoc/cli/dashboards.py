"""`zerodoc dashboards`: list, regenerate-check and push the Grafana dashboards."""

from __future__ import annotations

import sys

from .helpformat import DefaultsHelpFormatter
from ..errors import UserError

DIR_HELP = "dashboards directory (default: the dashboards installed with zerodoc)"


def add_parser(sub) -> None:
    p = sub.add_parser(
        "dashboards", help="push zerodoc's Grafana dashboards to a Grafana server",
        description="zerodoc's Grafana dashboards are installed with it as JSON "
        "(`zerodoc export DIR` writes them out, with provisioning files). `push` uploads "
        "them through "
        "Grafana's HTTP API; the API token is read from an environment variable or a file, "
        "never from the command line.")
    s = p.add_subparsers(dest="action", metavar="ACTION")
    ls = s.add_parser("list", help="list the dashboards and their panels")
    ls.add_argument("--dir", default=None, help=DIR_HELP)
    push = s.add_parser(
        "push", help="create or update the dashboards on a Grafana server",
        formatter_class=DefaultsHelpFormatter)
    push.add_argument("--url", required=True, help="Grafana base URL, e.g. http://grafana:3000")
    push.add_argument("--token-env", default="GRAFANA_TOKEN",
                      help="environment variable holding a service account token")
    push.add_argument("--token-file", default=None,
                      help="file holding the token (instead of the environment variable)")
    push.add_argument("--folder-uid", default=None, help="Grafana folder to put them in")
    push.add_argument("--dir", default=None, help=DIR_HELP)
    push.add_argument("--client", choices=("auto", "grafana-client", "stdlib"), default="auto",
                      help="HTTP client: grafana-client (zerodoc[grafana]) when installed, "
                           "else the standard library")
    p.set_defaults(func=run, _parser=p)


def run(args) -> int:
    from ..ops.grafana.push import load_dashboards
    from ..ops import resources

    if args.action is None:
        args._parser.print_help()
        return 2
    dashboards = load_dashboards(args.dir or resources.dashboards_dir())
    if args.action == "list":
        for d in dashboards:
            panels = [p for p in d.get("panels", []) if p.get("type") != "row"]
            print(f"{d.get('uid')}: {d.get('title')} ({len(panels)} panels)")
            for p in panels:
                print(f"    {p.get('type'):<10} {p.get('title')}")
        return 0
    from ..ops.grafana.push import push, read_token

    token = read_token(args.token_env, args.token_file)
    if not args.url:
        raise UserError("--url is required")
    for line in push(args.url, token, dashboards, args.folder_uid, args.client):
        print(f"pushed {line}")
    print(f"zerodoc dashboards: {len(dashboards)} dashboard(s) pushed to {args.url}",
          file=sys.stderr)
    return 0
