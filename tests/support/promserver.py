"""A real Prometheus server for tests: 127.0.0.1, a free port, a throwaway data directory.

    with PromServer(targets=["127.0.0.1:9730"], rule_files=[...], tmp=tmp_path) as prom:
        prom.wait_for("up", min_results=1)
        prom.query('rate(zerodoc_collective_seconds_total[30s])')

A Prometheus in agent mode (`agent=True`: scrapes and remote-writes, no queries) or a
remote-write receiver (`args=["--web.enable-remote-write-receiver"]`) are the same class with
a whole `config` of their own.

Needs the Debian `prometheus` binary (`make test` installs it). Without it the tests that use
this are skipped locally, but fail in CI (CI=true): a missing server must not turn CI green.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.support.helpers import wait_until
from zerodoc.demo.launch import free_port


def require_binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"{name} is not installed (make test installs it with apt-get)")
        pytest.skip(f"{name} not installed; run `make prometheus`")
    return path


class ServerProcess:
    """A server binary on 127.0.0.1, logging to <tmp>/<name>.log, ready when GET /-/ready
    answers 200; stopped (SIGTERM, then SIGKILL) on exit."""

    name = "server"
    proc: subprocess.Popen | None = None

    def _start(self, argv: list[str], url: str, timeout: float = 30.0,
               env: dict | None = None) -> None:
        self.log = open(self.tmp / f"{self.name}.log", "w")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT,
                                     env=None if env is None else {**os.environ, **env})
        def ready() -> bool:
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as r:
                    return r.status == 200
            except OSError:
                return False

        try:
            wait_until(ready, timeout, f"{self.name} to be ready", interval=0.2)
            return
        except AssertionError:
            pass
        self.__exit__()
        raise RuntimeError(f"{self.name} did not start: "
                           f"{(self.tmp / f'{self.name}.log').read_text()[-2000:]}")

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if getattr(self, "log", None):
            self.log.close()


class PromServer(ServerProcess):
    name = "prometheus"

    def __init__(self, tmp: Path, targets: list[str] | None = None,
                 rule_files: list[str] | None = None, scrape_interval: str = "1s",
                 extra_scrape_configs: list[dict] | None = None, file_sd: list[str] | None = None,
                 config: dict | None = None, agent: bool = False, args: tuple[str, ...] = (),
                 env: dict | None = None):
        self.binary = require_binary("prometheus")
        self.tmp = Path(tmp)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        scrape = []
        if targets:
            scrape.append({"job_name": "zerodoc", "scrape_interval": scrape_interval,
                           "static_configs": [{"targets": targets}]})
        if file_sd:
            scrape.append({"job_name": "zerodoc-sd", "scrape_interval": scrape_interval,
                           "file_sd_configs": [{"files": file_sd, "refresh_interval": "1s"}]})
        scrape += extra_scrape_configs or []
        cfg = {"global": {"scrape_interval": scrape_interval,
                          "evaluation_interval": scrape_interval},
               "scrape_configs": scrape}
        if rule_files:
            cfg["rule_files"] = [str(Path(r).resolve()) for r in rule_files]
        if config is not None:
            cfg = config
        self.agent, self.args, self.env = agent, tuple(args), env
        self.config = self.tmp / "prometheus.yml"
        self.config.write_text(json.dumps(cfg, indent=1))  # JSON is valid YAML

    def __enter__(self) -> "PromServer":
        data = self.tmp / "data"
        data.mkdir(exist_ok=True)
        storage = ["--enable-feature=agent,expand-external-labels",
                   f"--storage.agent.path={data}"] if self.agent else \
            [f"--storage.tsdb.path={data}"]
        self._start([self.binary, f"--config.file={self.config}", *storage,
                     f"--web.listen-address=127.0.0.1:{self.port}", "--web.enable-lifecycle",
                     *self.args], self.url, timeout=20, env=self.env)
        return self

    def api(self, path: str, **params) -> dict:
        return api(self.url, path, **params)

    def query(self, expr: str) -> list[dict]:
        return query(self.url, expr)

    def wait_for(self, expr: str, min_results: int = 1, timeout: float = 30.0) -> list[dict]:
        return wait_for(self.url, expr, min_results, timeout)


# The same for any Prometheus at `url` (e.g. one `zerodoc stack` started).
def api(url: str, path: str, **params) -> dict:
    full = f"{url}/api/v1/{path}"
    if params:
        full += "?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(full, timeout=10) as r:
        body = json.load(r)
    if body.get("status") != "success":
        raise RuntimeError(f"prometheus {path}: {body}")
    return body["data"]


def query(url: str, expr: str) -> list[dict]:
    return api(url, "query", query=expr)["result"]


def rule_last_evaluation(url: str, name: str) -> str:
    """When Prometheus last evaluated the rule `name` (its RFC 3339 timestamp, as the rules API
    gives it): a new value per evaluation, so a test can wait for time to have passed in
    Prometheus' own terms."""
    for group in api(url, "rules")["groups"]:
        for rule in group["rules"]:
            if rule["name"] == name:
                return rule["lastEvaluation"]
    raise AssertionError(f"no rule {name} loaded in {url}")


def wait_for(url: str, expr: str, min_results: int = 1, timeout: float = 30.0) -> list[dict]:
    """Poll a query until it returns at least `min_results` series (first results take ~6 s
    after start with a 1 s scrape interval; a server still starting counts as no result)."""
    res: list[dict] = []

    def enough() -> list[dict]:
        nonlocal res
        try:
            res = query(url, expr)
        except OSError:
            res = []
        return res if len(res) >= min_results else []

    try:
        return wait_until(enough, timeout, f"{min_results} result(s) of {expr!r}", 0.5)
    except AssertionError:
        raise AssertionError(f"{expr!r}: {len(res)} result(s) after {timeout:.0f} s") from None
