"""`python -m zerodoc.cli.webconfig hash-password | check FILE`: a password hash for
`basic_auth_users`, or a web configuration checked. The configuration itself is
`zerodoc.exporter.webconfig`'s."""

from __future__ import annotations

import sys

from ..exporter.webconfig import ENV, WebConfigError, hash_password, load
from .main import guarded


def main(argv: list[str] | None = None) -> int:
    import argparse
    import getpass

    p = argparse.ArgumentParser(
        prog="python -m zerodoc.cli.webconfig",
        description="Print a password hash for basic_auth_users of the web configuration "
        f"(${ENV}), or check a configuration file.")
    sub = p.add_subparsers(dest="cmd", required=True)
    hp = sub.add_parser("hash-password", help="read a password (prompt or stdin), print its hash")
    hp.add_argument("--scheme", choices=("bcrypt", "pbkdf2-sha256"), default=None,
                    help="default: bcrypt when the bcrypt package is installed, else "
                         "pbkdf2-sha256")
    ck = sub.add_parser("check", help="check a web configuration file")
    ck.add_argument("file")
    a = p.parse_args(argv)
    if a.cmd == "check":
        try:
            cfg = load(a.file)
        except WebConfigError as e:
            print(f"zerodoc web config: error: {e}", file=sys.stderr)
            return 2
        print(f"{a.file}: OK (TLS {'on' if cfg.tls else 'off'}, client certificates "
              f"{cfg.client_auth_type}, basic auth users: {len(cfg.users)})")
        return 0
    scheme = a.scheme
    if scheme is None:
        try:
            import bcrypt  # noqa: F401
            scheme = "bcrypt"
        except ImportError:
            scheme = "pbkdf2-sha256"
    pw = getpass.getpass("password: ") if sys.stdin.isatty() else sys.stdin.readline()
    pw = pw.rstrip("\n")
    if not pw:
        print("zerodoc web config: error: empty password", file=sys.stderr)
        return 2
    try:
        print(hash_password(pw, scheme))
    except ImportError:
        print("zerodoc web config: error: the bcrypt package is not installed "
              "(pip install 'zerodoc[web]', or --scheme pbkdf2-sha256)", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(guarded(main))  # a closed pipe or Ctrl-C ends it quietly
