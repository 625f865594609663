"""A real Alertmanager and a webhook receiver for tests, on 127.0.0.1 with free ports.

    with WebhookReceiver() as hook, Alertmanager(tmp, config) as am:
        am.post([{"labels": {...}, "annotations": {...}}])
        hook.wait(lambda n: ..., timeout=30)

`alertmanager_config(url)` is zerodoc's exporters/alertmanager.yml with its receiver pointed
at the webhook and the timers shortened; routing, grouping and inhibition stay as shipped.
Needs Debian's `prometheus-alertmanager` (`make prometheus` installs it); without it the tests
skip locally and fail in CI.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from tests.support.helpers import ROOT, wait_until
from tests.support.promserver import ServerProcess
from zerodoc.demo.launch import free_port


def alertmanager_binary() -> str:
    path = shutil.which("alertmanager") or shutil.which("prometheus-alertmanager")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("alertmanager is not installed (make test installs "
                        "prometheus-alertmanager with apt-get)")
        pytest.skip("alertmanager not installed; run `make prometheus`")
    return path


def need_amtool() -> None:
    if shutil.which("amtool") is None:
        if os.environ.get("CI"):
            pytest.fail("amtool is not installed (it comes with prometheus-alertmanager)")
        pytest.skip("amtool not installed; run `make prometheus`")


def alertmanager_config(webhook_url: str, dest: Path, group_wait: str = "1s",
                        group_interval: str = "2s") -> Path:
    cfg = yaml.safe_load((ROOT / "exporters" / "alertmanager.yml").read_text())
    cfg["receivers"] = [{"name": cfg["route"]["receiver"], "webhook_configs": [
        {"url": webhook_url, "send_resolved": True, "max_alerts": 0}]}]
    cfg["route"].update(group_wait=group_wait, group_interval=group_interval)
    dest.write_text(json.dumps(cfg, indent=1))  # JSON is YAML
    return dest


class WebhookReceiver(ThreadingHTTPServer):
    """Records every notification Alertmanager posts (Alertmanager webhook payload v4)."""

    daemon_threads = True

    def __init__(self):
        self.notifications: list[dict] = []
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _Hook)
        self.url = f"http://127.0.0.1:{self.server_address[1]}/hook"

    def __enter__(self) -> "WebhookReceiver":
        threading.Thread(target=self.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
        self.server_close()

    def received(self) -> list[dict]:
        with self.lock:
            return list(self.notifications)

    def wait(self, pred, timeout: float = 60.0, what: str = "a notification") -> dict:
        """The first notification for which pred(notification) is true."""
        try:
            return wait_until(lambda: next((n for n in self.received() if pred(n)), None),
                              timeout, what, interval=0.3)
        except AssertionError:
            summary = [(n["status"], n["groupLabels"], len(n["alerts"]))
                       for n in self.received()]
            raise AssertionError(f"no {what} within {timeout:.0f} s; received: {summary}") \
                from None


class _Hook(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        body["_received_at"] = time.time()
        with self.server.lock:
            self.server.notifications.append(body)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()


class Alertmanager(ServerProcess):
    name = "alertmanager"

    def __init__(self, tmp: Path, config: Path):
        self.binary = alertmanager_binary()
        self.tmp, self.config = Path(tmp), config
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> "Alertmanager":
        (self.tmp / "am-data").mkdir(exist_ok=True)
        self._start([self.binary, f"--config.file={self.config}",
                     f"--storage.path={self.tmp / 'am-data'}",
                     f"--web.listen-address=127.0.0.1:{self.port}", "--cluster.listen-address="],
                    self.url)
        return self

    def post(self, alerts: list[dict]) -> None:
        req = urllib.request.Request(f"{self.url}/api/v2/alerts", method="POST",
                                     data=json.dumps(alerts).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            assert r.status == 200
