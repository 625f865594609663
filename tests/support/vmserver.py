"""A real VictoriaMetrics store for tests (Debian's `victoria-metrics` package, 1.79): the
single-node server, vmagent scraping into it and vmalert evaluating rule files against it,
each on 127.0.0.1, a free port and a throwaway folder. vmalert reads the rule files as
`zerodoc stack --engine victoria` gives them (zerodoc.ops.stack.vmalert_rules).

    with VictoriaStack(tmp, scrape_jobs=[job], rule_files=[...]) as vm:
        vm.wait_for('up == 1', min_results=8)   # the Prometheus query API, at vm.url

The scrape jobs are Prometheus' (file_sd without `refresh_interval`, which vmagent lacks: it
re-reads the files every -promscrape.fileSDCheckInterval, 1 s here). The server runs with
zerodoc stack's -search.latencyOffset (zerodoc.ops.stack.VM_LATENCY_OFFSET) unless told. Without the
binaries the tests are skipped locally and fail in CI, as for Prometheus (`require_binary`).
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.support import promserver
from tests.support.promserver import ServerProcess, require_binary
from zerodoc.demo.launch import free_port
from zerodoc.ops.stack import (
    VM_LATENCY_OFFSET, VM_SERVE_FLAGS, VMALERT_WRITE_FLAGS, vmalert_rules,
)


class _Server(ServerProcess):
    def __init__(self, tmp: Path, name: str, argv: list[str]):
        self.tmp, self.name = tmp, name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.argv = [require_binary(name), *argv, f"-httpListenAddr=127.0.0.1:{self.port}"]

    def __enter__(self):
        self._start(self.argv, self.url, timeout=30)
        return self


class VictoriaStack:
    """victoria-metrics + vmagent (+ vmalert when rule files are given)."""

    def __init__(self, tmp: Path, scrape_jobs: list[dict], rule_files: list | None = None,
                 scrape_interval: str = "1s", eval_interval: str = "1s",
                 latency_offset: str = VM_LATENCY_OFFSET):
        self.tmp = Path(tmp)
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.vm = _Server(self.tmp, "victoria-metrics", [
            f"-storageDataPath={self.tmp / 'vmdata'}", f"-search.latencyOffset={latency_offset}",
            *VM_SERVE_FLAGS])
        self.url = self.vm.url
        cfg = {"global": {"scrape_interval": scrape_interval}, "scrape_configs": scrape_jobs}
        (self.tmp / "vmagent.yml").write_text(json.dumps(cfg, indent=1))
        self.agent = _Server(self.tmp, "vmagent", [
            f"-promscrape.config={self.tmp / 'vmagent.yml'}",
            f"-remoteWrite.url={self.url}/api/v1/write",
            f"-remoteWrite.tmpDataPath={self.tmp / 'vmagent-queue'}",
            "-promscrape.fileSDCheckInterval=1s", "-remoteWrite.flushInterval=1s"])
        # the rule files as zerodoc stack gives them to vmalert (vmalert_rules says why)
        self.alert = _Server(self.tmp, "vmalert", [
            *[f"-rule={r}" for r in vmalert_rules([Path(f) for f in rule_files],
                                                   self.tmp / "vmalert-rules")],
            f"-datasource.url={self.url}",
            f"-remoteWrite.url={self.url}", f"-remoteRead.url={self.url}",
            f"-evaluationInterval={eval_interval}", "-notifier.url=http://127.0.0.1:9",
            *VMALERT_WRITE_FLAGS]) if rule_files else None
        self._up: list = []

    def __enter__(self) -> "VictoriaStack":
        try:
            for s in (self.vm, self.agent, self.alert):
                if s is not None:
                    s.__enter__()
                    self._up.append(s)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        for s in reversed(self._up):
            s.__exit__()
        self._up.clear()

    def query(self, expr: str) -> list[dict]:
        return promserver.query(self.url, expr)

    def wait_for(self, expr: str, min_results: int = 1, timeout: float = 30.0) -> list[dict]:
        return promserver.wait_for(self.url, expr, min_results, timeout)
