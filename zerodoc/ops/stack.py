"""A local Prometheus (and Alertmanager, if installed) wired to running zerodoc jobs.

`Stack` writes a throwaway configuration — zerodoc's recording and alerting rules (generated
with a short window and `for:` so a newcomer sees alerts fire within minutes, runbook links
pointing at the installed runbooks), a file_sd target file rebuilt every few seconds from the
run log headers of the live runs — starts the servers on 127.0.0.1 (Alertmanager with
zerodoc's `exporters/alertmanager.yml`, or the configuration given), and stops them by pid.
`zerodoc stack` (`zerodoc.cli.stack`) drives it.

`engine="victoria"`: Debian's `victoria-metrics` package instead of Prometheus, as the central
store a big fleet runs (docs/operations.md, "VictoriaMetrics"): VictoriaMetrics single node
on `port` stores and answers queries, vmagent scrapes the same file_sd targets and
remote-writes to it, vmalert evaluates the same rule files against it and writes the
recorded series back (and sends alerts to the Alertmanager, if one runs). Its
`-search.latencyOffset` is `VM_LATENCY_OFFSET`: the data vmalert and the report read is
at most that old, and complete (zerodoc.sources.prometheus says why).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from . import resources
from ..errors import UserError
from ..exporter.targets import read_header, run_targets, write_atomic
from ..thresholds import DEFAULT, Thresholds


def find_runs(source: Path) -> list[Path]:
    """Run directories under `source` (itself, if it holds rank logs)."""
    if any(source.glob("rank-*.jsonl")):
        return [source]
    return sorted(d for d in source.glob("*") if d.is_dir() and any(d.glob("rank-*.jsonl")))


def infer_link(runs: list[Path]) -> str:
    """The link class for the rules: what the rules engine would infer for the newest run."""
    for run in reversed(runs):
        for log in sorted(run.glob("rank-*.jsonl"))[:1]:
            try:
                head, _ended = read_header(log)
                from ..diagnosis import infer_link as engine_infer
                from ..runlog import facts_from_dict

                link = engine_infer(facts_from_dict(head))
            except Exception:  # a torn header or an engine without infer_link
                link = None
            if link:
                return link
    return "gloo-cpu"


# VictoriaMetrics' ingestion lag guard (its default, 30 s, would show a live run 30 s late)
VM_LATENCY_OFFSET = "5s"
VM_MAX_SERIES_PER_QUERY = 5_000_000
# vmalert's remote write sized for the largest result one rule writes back: a rank's per-step
# rate of a per-unit counter is 243 series a rank at 81 units, ~249,000 at 1,024 ranks, and past
# -remoteWrite.maxQueueSize (100,000 by default) vmalert drops the rest of the evaluation (an
# error on the rule; the aggregations then read a part of the ranks). 10,000 a request (default
# 1,000): 25 requests for such a rule, not 250.
VMALERT_WRITE_FLAGS = ("-remoteWrite.maxQueueSize=1000000", "-remoteWrite.maxBatchSize=10000")
# The store answers loopback clients (vmalert, the report): no gzip of ~100 MB of JSON a rule.
# A per-unit rule over every rank's series takes 5-30 s on a busy 2-core store (bench/scale_vm.py
# at 1,024 ranks): past the default 30 s limit the whole evaluation is lost, so 2 minutes (half
# the per-unit groups' interval).
VM_SERVE_FLAGS = ("-http.disableResponseCompression", "-search.maxQueryDuration=2m")


def vmalert_rules(paths: list[Path], out_dir: Path) -> list[Path]:
    """The rule files as vmalert must read them to record Prometheus' numbers: each
    per-second rate a group records (a `...:rate` record) written out in full where a later
    rule of the same group reads it. The one place that says why (zerodoc stack,
    bench/scale_vm.py and the tests use it).

    Prometheus evaluates a group's rules one after another at one instant, and a rule reads
    what the rules before it recorded at that instant. vmalert writes what a rule records
    through remote write: a later rule of the same evaluation reads the value recorded one
    evaluation (or more) before. A ratio of two counters per step (a rank's compute seconds
    over its sampled steps' rate, `rank:zerodoc_detail_steps:rate`) then divides this window's
    rate by an earlier window's: measured in tests/test_victoria.py on pages that advance a
    step every 4 s, scraped every 2 s over a 10 s window, it came out 3/2 of Prometheus'
    (3 steps in one window, 2 in the other), whatever `-datasource.lookback` (35 s past a
    30 s `-search.latencyOffset` did not help). A recorded per-step ratio, gauge or quantile
    read from an earlier evaluation is the same number, and a rule that reads only recorded
    series (the step-time quantiles over the bucket rates) reads them all from one
    evaluation: the rates are written out only where a rule reads them beside a window of
    its own (a range selector).

    The series per rank and unit (`unit_collective_rank:...:per_step`, ~249,000 a rule at
    1,024 ranks x 81 units) stay recorded, though vmalert gets each back from the store as
    JSON and writes it back (VMALERT_WRITE_FLAGS sizes its queue for them): written out in
    each rule that reads them instead, the `zerodoc.units` group took 255 s of its 240 s at
    1,024 ranks on 2 cores (4-31 s a rule over the raw counters; docs/operations.md)."""
    import yaml

    from .alerts.yamltext import dump

    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for path in paths:
        doc = yaml.safe_load(path.read_text())
        for group in doc.get("groups", []):
            rates: dict[str, str] = {}
            for rule in group.get("rules", []):
                expr = str(rule["expr"])
                for name, body in rates.items() if "[" in expr else ():
                    expr = re.sub(rf"(?<![\w:]){re.escape(name)}(?![\w:{{\[])",
                                  f"({body})", expr)
                rule["expr"] = expr
                if rule.get("record", "").endswith(":rate"):
                    rates[rule["record"]] = expr
        written.append(out_dir / path.name)
        written[-1].write_text(dump(doc))
    return written


ENGINES = ("prometheus", "victoria")
_VM_BINARIES = ("victoria-metrics", "vmagent", "vmalert")


@dataclass
class Stack:
    source: Path
    port: int = 9090
    scrape_interval: str = "2s"
    window: str = "30s"
    alert_for: str = "1m"
    link: str | None = None
    work_dir: Path | None = None
    unit_window: str | None = None
    """The per-unit rule groups' window (None: `window`: a local stack watches a small run,
    and its per-unit alerts should fire within its first minutes; production rules use 4x)."""
    prometheus: str | None = None
    alertmanager: str | None = None
    """Alertmanager binary; None: look for it on PATH; "": do not start one."""
    alertmanager_config: Path | None = None
    """Alertmanager configuration; None: zerodoc's exporters/alertmanager.yml."""
    thresholds: Thresholds = DEFAULT
    engine: str = "prometheus"
    """"prometheus", or "victoria": VictoriaMetrics + vmagent + vmalert (module docstring)."""
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    _tmp: bool = False
    _targets: str = ""
    _reported: set = field(default_factory=set)

    def __post_init__(self) -> None:
        self.source = Path(self.source)
        if not self.source.is_dir():
            raise UserError(f"no run directory or run root at {self.source} (start "
                            "`zerodoc demo --port 0` first, or pass its --run-dir)")
        if self.engine not in ENGINES:
            raise UserError(f"engine {self.engine!r}: expected one of {', '.join(ENGINES)}")
        if self.engine == "victoria":
            self.binaries = {b: shutil.which(b) for b in _VM_BINARIES}
            lacking = [b for b, path in self.binaries.items() if not path]
            if lacking:
                raise UserError(f"{', '.join(lacking)} not installed (Debian: apt-get install "
                                "victoria-metrics; or `make prometheus`)")
        else:
            self.prometheus = self.prometheus or shutil.which("prometheus")
            if not self.prometheus:
                raise UserError("the prometheus binary is not installed (Debian: apt-get "
                                "install prometheus; or `make prometheus`)")
        if self.work_dir is None:
            self.work_dir = Path(tempfile.mkdtemp(prefix="zerodoc-stack-"))
            self._tmp = True
        self.work_dir = Path(self.work_dir)
        self.url = f"http://127.0.0.1:{self.port}"
        self.am_port: int | None = None
        self.agent_url: str | None = None  # vmagent, vmalert (engine "victoria")
        self.rules_url: str | None = None

    # --- configuration ----------------------------------------------------------------
    def targets(self) -> list[dict]:
        entries = []
        for run in find_runs(self.source):
            try:
                found, _warn = run_targets(run)
            except UserError:
                continue  # a run whose ranks all finished, or a header still being written
            entries += found
        return entries

    def refresh_targets(self) -> tuple[list[str], list[str]]:
        """Rewrite the file_sd file if the live targets changed; returns the targets added
        and removed since the last call."""
        entries = self.targets()
        text = json.dumps(entries, indent=1) + "\n"
        if text != self._targets:
            write_atomic(self.work_dir / "file_sd" / "zerodoc.json", text)
            self._targets = text
        now = {t for e in entries for t in e["targets"]}
        added, removed = sorted(now - self._reported), sorted(self._reported - now)
        self._reported = now
        return added, removed

    def write_config(self) -> Path:
        from .alerts import RuleOptions, write_rules

        runs = find_runs(self.source)
        self.link = self.link or infer_link(runs)
        write_rules(self.work_dir / "rules", self.thresholds, RuleOptions(
            window=self.window, unit_window=self.unit_window or self.window,
            alert_for=self.alert_for, link=self.link,
            runbook_base=resources.root().as_uri() + "/"))
        cfg: dict = {
            "global": {"scrape_interval": self.scrape_interval,
                       "evaluation_interval": self.scrape_interval},
            "rule_files": [str(self.work_dir / "rules" / "*.yml")],
            "scrape_configs": [{
                "job_name": "zerodoc", "honor_labels": True,
                "file_sd_configs": [{"files": [str(self.work_dir / "file_sd" / "*.json")],
                                     "refresh_interval": "2s"}],
            }, {  # itself: the monitoring alerts read its prometheus_rule_group_* series
                "job_name": "prometheus",
                "static_configs": [{"targets": [f"127.0.0.1:{self.port}"]}],
            }],
        }
        if self.am_port:
            cfg["alerting"] = {"alertmanagers": [
                {"static_configs": [{"targets": [f"127.0.0.1:{self.am_port}"]}]}]}
        if self.engine == "victoria":  # vmagent: scraping only, no refresh_interval field
            cfg = {"global": {"scrape_interval": self.scrape_interval},
                   "scrape_configs": [{**cfg["scrape_configs"][0], "file_sd_configs": [
                       {"files": [str(self.work_dir / "file_sd" / "*.json")]}]}]}
        path = self.work_dir / ("vmagent.yml" if self.engine == "victoria" else "prometheus.yml")
        path.write_text(json.dumps(cfg, indent=1))  # JSON is YAML
        entries = self.targets()
        self._targets = json.dumps(entries, indent=1) + "\n"
        write_atomic(self.work_dir / "file_sd" / "zerodoc.json", self._targets)
        return path

    # --- processes --------------------------------------------------------------------
    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        log = open(self.work_dir / f"{name}.log", "w")
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        self.procs[name] = p
        (self.work_dir / f"{name}.pid").write_text(f"{p.pid}\n")
        return p

    def start(self) -> "Stack":
        self.work_dir.mkdir(parents=True, exist_ok=True)
        am = self.alertmanager
        if am is None:
            am = shutil.which("alertmanager") or shutil.which("prometheus-alertmanager")
        if am:
            from ..demo.launch import free_port

            self.alertmanager_config = Path(self.alertmanager_config
                                            or resources.alertmanager_config())
            if not self.alertmanager_config.is_file():
                raise UserError(f"no Alertmanager configuration at {self.alertmanager_config}")
            self.am_port = free_port()
            (self.work_dir / "alertmanager").mkdir(exist_ok=True)
            self._spawn("alertmanager", [
                am, f"--config.file={self.alertmanager_config}",
                f"--storage.path={self.work_dir / 'alertmanager'}",
                f"--web.listen-address=127.0.0.1:{self.am_port}",
                "--cluster.listen-address="])
        config = self.write_config()
        (self.work_dir / "data").mkdir(exist_ok=True)
        if self.engine == "victoria":
            servers = self._start_victoria(config)
        else:
            self._spawn("prometheus", [
                self.prometheus, f"--config.file={config}",
                f"--storage.tsdb.path={self.work_dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}", "--web.enable-lifecycle"])
            servers = [("prometheus", self.url)]
        if self.am_port:
            servers.append(("alertmanager", f"http://127.0.0.1:{self.am_port}"))
        deadline = time.monotonic() + 30
        for name, url in servers:
            if not self._wait_ready(name, url, deadline):
                tail = self.log_tail(name)
                self.stop()
                raise UserError(f"{name} did not start on {url.removeprefix('http://')}: "
                                f"{tail}")
        return self

    def _start_victoria(self, scrape_config: Path) -> list[tuple[str, str]]:
        """VictoriaMetrics on `port`, then vmagent and vmalert on free ports (loopback)."""
        from ..demo.launch import free_port

        b, wd = self.binaries, self.work_dir
        self._spawn("victoria-metrics", [
            b["victoria-metrics"], f"-storageDataPath={wd / 'data'}",
            f"-httpListenAddr=127.0.0.1:{self.port}", "-retentionPeriod=1d",
            f"-search.latencyOffset={VM_LATENCY_OFFSET}",
            # a query over every rank's per-unit series: 1,296 a rank (81 units), past the
            # default limit of 300,000 series per query from ~230 ranks
            f"-search.maxUniqueTimeseries={VM_MAX_SERIES_PER_QUERY}", *VM_SERVE_FLAGS])
        self.agent_url = f"http://127.0.0.1:{free_port()}"
        self._spawn("vmagent", [
            b["vmagent"], f"-promscrape.config={scrape_config}",
            f"-remoteWrite.url={self.url}/api/v1/write",
            f"-remoteWrite.tmpDataPath={wd / 'vmagent-queue'}",
            f"-httpListenAddr={self.agent_url.removeprefix('http://')}",
            "-promscrape.fileSDCheckInterval=2s", "-remoteWrite.flushInterval=1s"])
        self.rules_url = f"http://127.0.0.1:{free_port()}"
        # vmalert will not run alerting rules without a notifier: with no Alertmanager the
        # alerts are on its own /api/v1/alerts and each send fails (logged) to a closed port
        notifier = f"http://127.0.0.1:{self.am_port}" if self.am_port else "http://127.0.0.1:9"
        vmalert_rules(sorted((wd / "rules").glob("*.yml")), wd / "vmalert-rules")
        self._spawn("vmalert", [
            b["vmalert"], f"-rule={wd / 'vmalert-rules' / '*.yml'}", f"-datasource.url={self.url}",
            f"-remoteWrite.url={self.url}", f"-remoteRead.url={self.url}",
            f"-notifier.url={notifier}", f"-evaluationInterval={self.scrape_interval}",
            f"-external.url={self.url}", f"-httpListenAddr={self.rules_url.removeprefix('http://')}",
            *VMALERT_WRITE_FLAGS])
        return [("victoria-metrics", self.url), ("vmagent", self.agent_url),
                ("vmalert", self.rules_url)]

    def _wait_ready(self, name: str, url: str, deadline: float) -> bool:
        while time.monotonic() < deadline:
            if self.procs[name].poll() is not None:
                return False
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as r:
                    if r.status == 200:
                        return True
            except OSError:
                time.sleep(0.2)
        return False

    def log_tail(self, name: str, n: int = 600) -> str:
        try:
            return (self.work_dir / f"{name}.log").read_text()[-n:].strip().replace("\n", " | ")
        except OSError:
            return ""

    def dead(self) -> list[str]:
        return [name for name, p in self.procs.items() if p.poll() is not None]

    def stop(self, grace: float = 10.0) -> None:
        """Stop the servers (SIGTERM, then SIGKILL), then drop a temporary work dir."""
        for p in self.procs.values():
            if p.poll() is None:
                p.terminate()
        deadline = time.monotonic() + grace
        for p in self.procs.values():
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for name in self.procs:
            try:
                os.unlink(self.work_dir / f"{name}.pid")
            except OSError:
                pass
        if self._tmp:
            shutil.rmtree(self.work_dir, ignore_errors=True)
