"""Past one Prometheus, for real: the shipped per-node agent config
(exporters/remote-write/prometheus-agent.yml) in a Prometheus running in agent mode scrapes a
live 2-rank demo through the file_sd targets the ranks write themselves, and remote-writes
into a second Prometheus started with its remote-write receiver, which evaluates zerodoc's
rules. `zerodoc report` and the TUI read that central server and must find what they find
in the run directory.

Only the paths, the URL and the intervals of the shipped config are changed for the test
(a 1 s scrape, a 1 s send deadline); its relabelling, queue settings and external labels are
used as shipped.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from tests.support.helpers import ROOT, LiveDemo, wait_until, wait_until_async
from tests.support.promserver import PromServer, require_binary
from zerodoc.ops import alerts, cardinality
from zerodoc.ops.alerts import RuleOptions
from zerodoc.cli.main import main

pytestmark = pytest.mark.slow

AGENT_CONFIG = ROOT / "exporters" / "remote-write" / "prometheus-agent.yml"
CENTRAL_CONFIG = ROOT / "exporters" / "remote-write" / "central-prometheus.yml"
RUN = "fleetrun"
EXTERNAL = {"CLUSTER": "train-eu1", "NODE_NAME": "agent-node-a"}


def agent_config(sd_dir: Path, central_url: str) -> dict:
    cfg = yaml.safe_load(AGENT_CONFIG.read_text())
    cfg["global"].update(scrape_interval="1s", scrape_timeout="1s")
    job = cfg["scrape_configs"][0]
    job.update(scrape_interval="1s", scrape_timeout="1s")
    job["file_sd_configs"] = [{"files": [str(sd_dir / "*.json")], "refresh_interval": "1s"}]
    rw = cfg["remote_write"][0]
    rw["url"] = f"{central_url}/api/v1/write"
    rw["queue_config"]["batch_send_deadline"] = "1s"
    return cfg


def central_config(rule_files: list[Path]) -> dict:
    cfg = yaml.safe_load(CENTRAL_CONFIG.read_text())
    cfg["global"]["evaluation_interval"] = "1s"
    cfg["rule_files"] = [str(p) for p in rule_files]
    cfg.pop("alerting", None)
    return cfg


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    require_binary("prometheus")
    tmp = tmp_path_factory.mktemp("remote_write")
    sd = tmp / "node-local-file_sd"
    # per-unit groups at the rank-level window (production: 4x it): this test's subject is
    # the pipeline, and a 40 s per-unit window would only add waiting
    rules = alerts.write_rules(tmp / "rules", opts=RuleOptions(window="10s", alert_for="5s",
                                                                 unit_window="10s",
                                                                 link="gloo-cpu"))
    (tmp / "central").mkdir()
    (tmp / "agent").mkdir()
    with PromServer(tmp / "central", config=central_config(rules),
                    args=("--web.enable-remote-write-receiver",)) as central, \
            LiveDemo(tmp, attach={"inject_latency_s": 0.1}, name=RUN,
                     env={"ZERODOC_FILE_SD_DIR": str(sd)}) as demo, \
            PromServer(tmp / "agent", config=agent_config(sd, central.url), agent=True,
                       env=EXTERNAL) as agent:
        assert sorted(p.name for p in sd.glob("*.json")) == \
            [f"{RUN}-rank-00000.json", f"{RUN}-rank-00001.json"]
        central.wait_for(f'zerodoc_run_info{{run_id="{RUN}"}}', min_results=2, timeout=60)
        yield SimpleNamespace(demo=demo, central=central, agent=agent, tmp=tmp)


def test_the_shipped_configs_are_valid():
    promtool = require_binary("promtool")
    import subprocess

    r = subprocess.run([promtool, "check", "config", "--agent", str(AGENT_CONFIG)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run([promtool, "check", "config", str(CENTRAL_CONFIG)], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_agent_is_an_agent(fleet):
    """It stores nothing to query: the data is only in the central server."""
    import urllib.error
    import urllib.request

    with pytest.raises(urllib.error.HTTPError):
        urllib.request.urlopen(f"{fleet.agent.url}/api/v1/query?query=up", timeout=5)
    assert not fleet.central.api("targets")["activeTargets"]  # the central scrapes nothing


def test_series_arrive_with_target_and_external_labels(fleet):
    up = fleet.central.wait_for(f'up{{run_id="{RUN}"}} == 1', min_results=2)
    assert sorted(s["metric"]["rank"] for s in up) == ["0", "1"]
    assert {s["metric"]["cluster"] for s in up} == {"train-eu1"}
    info = fleet.central.query(f'zerodoc_run_info{{run_id="{RUN}"}}')
    # the ranks' own node label wins over the agent's external one
    assert {s["metric"]["node"] for s in info} == {s["metric"]["node"] for s in up} != \
        {"agent-node-a"}
    assert {s["metric"]["cluster"] for s in info} == {"train-eu1"}
    # the write relabelling keeps zerodoc's series and up, nothing else
    assert not fleet.central.query("scrape_duration_seconds")


def test_the_central_server_holds_what_the_ranks_serve(fleet):
    """Series for series per rank, the central count equals a direct scrape's."""
    import urllib.request

    want = {}
    for r, ep in enumerate(fleet.demo.endpoints):
        with urllib.request.urlopen(f"http://{ep}/metrics", timeout=10) as resp:
            want[str(r)] = sum(cardinality.count_exposition(resp.read().decode()).values())
    got: dict = {}

    def same_count() -> bool:
        res = fleet.central.query(
            f'count by (rank) ({{__name__=~"zerodoc_.+", run_id="{RUN}"}})')
        got.clear()
        got.update({s["metric"]["rank"]: int(s["value"][1]) for s in res})
        return got == want

    try:
        wait_until(same_count, 30, "the central server's series count per rank", interval=0.5)
    except AssertionError:
        pass
    assert got == want
    assert int(want["1"]) <= cardinality.BUDGET_FULL


def test_rules_evaluate_on_the_central_server(fleet):
    for name in ("job:zerodoc_all_gather_avoidable:fraction",
                 "collective_rank:zerodoc_collective_busbw:bytes_per_second",
                 "unit_job:zerodoc_unit_group_size:max"):
        fleet.central.wait_for(f'{name}{{run_id="{RUN}"}}', timeout=60)


def _report(source: str, capsys) -> dict:
    assert main(["report", source, "--json", "--window", "0"]) == 0
    return json.loads(capsys.readouterr().out)


def test_report_reads_the_central_server(fleet, capsys):
    fleet.demo.wait_steps(6)
    last: dict = {}

    def agree():
        # Remote write and the central rules lag the run log by an evaluation or two (more
        # on a loaded machine): wait until both sides have seen the same steps' story.
        last["local"] = local = _report(str(fleet.demo.run_dir), capsys)
        last["remote"] = remote = _report(fleet.central.url, capsys)
        key = ("top", "worst_severity")
        return [local["summary"][k] for k in key] == [remote["summary"][k] for k in key]

    try:
        wait_until(agree, timeout=90, what="the central server's findings", interval=2.0)
    except AssertionError:
        raise AssertionError(f"local {last['local']['summary']} != "
                             f"remote {last['remote']['summary']}") from None
    local, remote = last["local"], last["remote"]
    # the slow link (100 ms per all-gather): ZD004 / ZD005 / ZD006 at warning or error
    assert local["summary"]["worst_severity"] in ("warning", "error"), local["summary"]
    assert remote["ranks"] == [0, 1] and remote["run"]["world_size"] == 2
    # the unit facts (served by rank 0 only) reach every rank's view through the store
    assert [u["unit"] for u in remote["units"]] == [u["unit"] for u in local["units"]]


async def test_the_tui_reads_the_central_server(fleet):
    from tests.test_tui import SIZE, app_text, first_frame
    from zerodoc.diagnosis import diagnose
    from zerodoc.sources import open_source
    from zerodoc.tui.app import ZerodocApp

    miss: list = []

    async def attempt() -> bool:
        want = diagnose(open_source(str(fleet.demo.run_dir)).snapshot())[0]
        app = ZerodocApp(open_source(fleet.central.url), refresh=None)
        async with app.run_test(size=SIZE) as pilot:
            frame = await first_frame(app, pilot)
            assert frame.source_error is None and sorted(frame.snapshot.ranks) == [0, 1]
            assert frame.findings, "no finding from the central server"
            got = (frame.findings[0].code, frame.findings[0].severity)
            if got != (want.code, want.severity):
                miss[:] = [got, want]  # remote write lags: the central rules behind
                return False
            assert want.code in app_text(app) and "Prometheus" in app_text(app)
            return True

    # The same lag as the report's: a few attempts, each a fresh app on fresh data.
    try:
        await wait_until_async(attempt, 90, "the TUI's first finding to match the run log's",
                               interval=2.0)
    except AssertionError:
        raise AssertionError(f"TUI {miss[0]} != run log {miss[1].code}") from None
