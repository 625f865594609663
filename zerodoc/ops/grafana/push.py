"""Upload the committed dashboards to a Grafana server (`zerodoc dashboards push`).

Two clients with one behaviour: grafana-client (the maintained fork of grafana-api, from
the `zerodoc[grafana]` extra) when it is installed, else a small standard-library client
speaking the same endpoint (`POST /api/dashboards/db`). grafana-client replaces `urllib3`
with urllib3-future, which is why it is an optional extra and never a dependency of the
training-side install.

The API token comes from an environment variable or a file, never from a flag, and is
never printed: every error message passes through `_redact`.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from pathlib import Path

from ...errors import UserError

DEFAULT_TOKEN_ENV = "GRAFANA_TOKEN"
CLIENTS = ("auto", "grafana-client", "stdlib")


def read_token(env: str = DEFAULT_TOKEN_ENV, token_file: str | None = None) -> str:
    """The API token: from `token_file` if given, else from the environment variable."""
    if token_file:
        try:
            token = Path(token_file).read_text(encoding="utf-8").strip()
        except OSError as e:
            raise UserError(f"cannot read the token file {token_file}: "
                            f"{e.strerror or e}") from None
        if not token:
            raise UserError(f"the token file {token_file} is empty")
        return token
    token = os.environ.get(env, "").strip()
    if not token:
        raise UserError(f"no Grafana API token: set ${env} (a service account token) or "
                        "pass --token-file FILE")
    return token


def load_dashboards(directory: str | Path) -> list[dict]:
    paths = sorted(Path(directory).glob("*.json"))
    if not paths:
        raise UserError(f"no dashboards (*.json) in {directory}")
    out = []
    for p in paths:
        try:
            out.append(json.loads(p.read_text(encoding="utf-8")))
        except (OSError, json.JSONDecodeError) as e:
            raise UserError(f"cannot read dashboard {p}: {e}") from None
    return out


def payload(dashboard: dict, folder_uid: str | None, message: str) -> dict:
    d = dict(dashboard)
    d.pop("id", None)  # Grafana matches on uid; a stale numeric id would conflict
    body = {"dashboard": d, "overwrite": True, "message": message}
    if folder_uid:
        body["folderUid"] = folder_uid
    return body


def _redact(text: str, token: str) -> str:
    return text.replace(token, "***") if token else text


class StdlibClient:
    """POST /api/dashboards/db with a bearer token, urllib only."""

    name = "stdlib"

    def __init__(self, url: str, token: str, timeout: float = 15.0):
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout

    def update_dashboard(self, body: dict) -> dict:
        req = urllib.request.Request(
            f"{self.url}/api/dashboards/db", data=json.dumps(body).encode(), method="POST",
            headers={"Authorization": f"Bearer {self.token}",
                     "Content-Type": "application/json", "Accept": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                return json.loads(r.read() or b"{}")
        except urllib.error.HTTPError as e:
            detail = e.read(500).decode("utf-8", "replace")
            raise PushError(e.code, detail) from None
        except (urllib.error.URLError, OSError) as e:
            raise PushError(None, str(getattr(e, "reason", e))) from None


class GrafanaClientAdapter:
    """The same call through grafana-client (`zerodoc[grafana]`)."""

    name = "grafana-client"

    def __init__(self, url: str, token: str, timeout: float = 15.0):
        from grafana_client import GrafanaApi

        self.api = GrafanaApi.from_url(url, credential=token, timeout=timeout)

    def update_dashboard(self, body: dict) -> dict:
        from grafana_client.client import GrafanaClientError, GrafanaException

        try:
            return self.api.dashboard.update_dashboard(body)
        except GrafanaClientError as e:
            raise PushError(getattr(e, "status_code", None), str(e)) from None
        except GrafanaException as e:
            raise PushError(getattr(e, "status_code", None), str(e)) from None
        except Exception as e:  # connection errors come from niquests
            raise PushError(None, f"{type(e).__name__}: {e}") from None


class PushError(Exception):
    def __init__(self, status: int | None, detail: str):
        super().__init__(detail)
        self.status = status
        self.detail = detail


def make_client(kind: str, url: str, token: str):
    if kind not in CLIENTS:
        raise UserError(f"unknown client {kind!r}; use one of {', '.join(CLIENTS)}")
    if kind in ("auto", "grafana-client"):
        try:
            return GrafanaClientAdapter(url, token)
        except ImportError:
            if kind == "grafana-client":
                raise UserError("grafana-client is not installed: pip install "
                                "'zerodoc[grafana]' (keep it out of training images: it "
                                "replaces urllib3)") from None
    return StdlibClient(url, token)


def push(url: str, token: str, dashboards: list[dict], folder_uid: str | None = None,
         client: str = "auto", message: str = "zerodoc dashboards push") -> list[str]:
    """Create or update each dashboard; returns one line per dashboard (uid -> url)."""
    if not url.startswith(("http://", "https://")):
        raise UserError(f"--url must start with http:// or https://, not {url!r}")
    from urllib.parse import urlsplit

    if urlsplit(url).username or urlsplit(url).password:
        raise UserError("--url must not carry credentials; put the token in "
                        f"${DEFAULT_TOKEN_ENV} or a --token-file")
    c = make_client(client, url, token)
    lines = []
    for d in dashboards:
        try:
            res = c.update_dashboard(payload(d, folder_uid, message))
        except PushError as e:
            why = {401: "the token was refused (401 Unauthorized)",
                   403: "the token may not write dashboards (403 Forbidden)",
                   404: "no such folder or API (404)",
                   412: "a different dashboard with this uid or title exists (412)"}.get(
                e.status or 0, "")
            detail = _redact(e.detail, token).strip().splitlines()[0][:200] if e.detail else ""
            msg = why or (f"HTTP {e.status}" if e.status else "connection failed")
            raise UserError(f"pushing {d.get('uid')!r} to {url} failed: {msg}"
                            + (f" ({detail})" if detail and not why else "")) from None
        lines.append(f"{d.get('uid')}: {res.get('status', 'success')} {res.get('url', '')}".strip())
    return lines
