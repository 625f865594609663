"""Grafana dashboards: schema-valid (Grafana 11.6 dashboard + panel kinds), up to date with
the generator, catalogued names only, units and thresholds from zerodoc.thresholds,
provisioning files, and `zerodoc dashboards push` (token never printed)."""

from __future__ import annotations

import copy
import http.server
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import jsonschema
import pytest
import yaml

from tests.test_alert_rules import known_names, metric_names
from tests.support.helpers import ROOT
from zerodoc.cli.main import main
from zerodoc.thresholds import DEFAULT

DASHBOARDS = ROOT / "dashboards"
SCHEMAS = ROOT.parent / "shared" / "grafana-schema"
FILES = sorted(DASHBOARDS.glob("*.json"))
VARIABLES = {"datasource", "job", "rank", "unit"}


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def panels(d: dict) -> list[dict]:
    return [p for p in d["panels"] if p["type"] != "row"]


def by_title(d: dict, title: str) -> dict:
    return next(p for p in panels(d) if p["title"] == title)


def test_the_four_dashboards_exist():
    assert [f.name for f in FILES] == ["zerodoc-layers.json", "zerodoc-memory.json",
                                       "zerodoc-overview.json", "zerodoc-ranks.json"]


# --------------------------------------------------------------------------------------
# schema


def _schema(name: str) -> dict:
    path = SCHEMAS / f"{name}.jsonschema.json"
    if not path.exists():
        if os.environ.get("CI"):  # CI has shared/ beside the clone: missing is a failure
            pytest.fail(f"{path} not found (shared/grafana-schema)")
        pytest.skip(f"{path} not found (shared/grafana-schema)")
    return json.loads(path.read_text())


def _dashboard_validator() -> jsonschema.Draft7Validator:
    s = copy.deepcopy(_schema("dashboard"))
    # Known quirk (shared/grafana-schema/README.md): Grafana writes "value": null on the base
    # threshold step; the schema says number. Allow exactly that.
    s["definitions"]["Threshold"]["properties"]["value"] = {"type": ["number", "null"]}
    return jsonschema.Draft7Validator(s)


def _kind_validator(kind: str, definition: str) -> jsonschema.Draft7Validator:
    k = _schema(kind)
    return jsonschema.Draft7Validator({"$schema": k["$schema"], "definitions": k["definitions"],
                                       "$ref": f"#/definitions/{definition}"})


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_dashboard_is_schema_valid(path):
    d = load(path)
    errors = [f"{'/'.join(map(str, e.path))}: {e.message[:200]}"
              for e in _dashboard_validator().iter_errors(d)]
    assert d["schemaVersion"] == 41
    target = _kind_validator("prometheus", "dataquery")
    for p in panels(d):
        where = f"panel {p['id']} {p['title']!r}"
        kind = p["type"]
        assert (SCHEMAS / f"{kind}.jsonschema.json").exists(), f"{where}: no schema for {kind}"
        assert "options" in p, f"{where}: no options"
        errors += [f"{where} options: {e.message[:200]}"
                   for e in _kind_validator(kind, "Options").iter_errors(p["options"])]
        if "FieldConfig" in _schema(kind)["definitions"]:
            custom = p.get("fieldConfig", {}).get("defaults", {}).get("custom", {})
            errors += [f"{where} fieldConfig.custom: {e.message[:200]}"
                       for e in _kind_validator(kind, "FieldConfig").iter_errors(custom)]
        for t in p["targets"]:
            errors += [f"{where} target {t.get('refId')}: {e.message[:200]}"
                       for e in target.iter_errors(t)]
    assert not errors, "\n".join(errors)


def test_schema_check_catches_a_broken_panel():
    d = load(DASHBOARDS / "zerodoc-overview.json")
    p = panels(d)[0]
    assert list(_dashboard_validator().iter_errors({**d, "schemaVersion": "41"}))
    assert list(_kind_validator(p["type"], "Options").iter_errors({**p["options"],
                                                                   "graphMode": "sparkle"}))


# --------------------------------------------------------------------------------------
# generated and up to date


def test_committed_json_is_up_to_date():
    from zerodoc.ops.grafana import build

    stale = build.stale_files()
    assert not stale, (f"{stale} are stale: run `python -m zerodoc.cli.dashboards_gen` "
                       "(make dashboards)")


@pytest.mark.slow
def test_build_check_mode(tmp_path):
    r = subprocess.run([sys.executable, "-m", "zerodoc.cli.dashboards_gen", "--check", "--out",
                        str(tmp_path)], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 1 and "stale" in r.stderr
    r = subprocess.run([sys.executable, "-m", "zerodoc.cli.dashboards_gen", "--out", str(tmp_path)],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0 and len(list(tmp_path.glob("*.json"))) == 4


# --------------------------------------------------------------------------------------
# content


def all_queries(d: dict) -> list[tuple[str, str]]:
    out = [(f"{p['title']} {t['refId']}", t["expr"]) for p in panels(d) for t in p["targets"]]
    for v in d["templating"]["list"]:
        if v["type"] == "query":
            out.append((f"variable {v['name']}", v["query"]))
    return out


def label_values_metric(query: str) -> str:
    inner = query[len("label_values("):query.rindex(",")]
    return inner


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_every_metric_name_is_catalogued(path):
    known = known_names()
    for where, expr in all_queries(load(path)):
        if expr.startswith("label_values("):
            expr = label_values_metric(expr)
        names = metric_names(expr)
        assert names, where
        assert not (names - known), f"{path.name} {where}: {names - known}"


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_variables_units_ids(path):
    d = load(path)
    assert {v["name"] for v in d["templating"]["list"]} == VARIABLES
    assert "zerodoc" in d["tags"] and d["uid"].startswith("zerodoc-")
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids)) and 0 not in ids
    for p in panels(d):
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["fieldConfig"]["defaults"].get("unit"), f"{p['title']}: no unit"
        assert p.get("description"), f"{p['title']}: no description"
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs))
        for t in p["targets"]:
            assert "$job" in t["expr"] or "ALERTS" in t["expr"], f"{p['title']}: not scoped"
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24


def _steps(p: dict) -> list:
    return [s["value"] for s in p["fieldConfig"]["defaults"]["thresholds"]["steps"]]


def test_required_panels_and_thresholds_from_thresholds():
    t = DEFAULT
    ov = load(DASHBOARDS / "zerodoc-overview.json")
    assert _steps(by_title(ov, "All-gather wait beyond the link")) == \
        [None, t.exposed_fraction_warn, t.exposed_fraction_crit]
    assert _steps(by_title(ov, "Comm / compute (job)")) == \
        [None, t.comm_compute_ratio_warn, t.comm_compute_ratio_crit]
    assert _steps(by_title(ov, "Memory headroom per rank")) == \
        [None, t.headroom_fraction_crit, t.headroom_fraction_warn]
    assert by_title(ov, "Memory headroom per rank")["type"] == "bargauge"
    assert "ALERTS" in by_title(ov, "Active alerts")["targets"][0]["expr"]
    assert "step_seconds" in by_title(ov, "Step time")["targets"][0]["expr"]
    layers = load(DASHBOARDS / "zerodoc-layers.json")
    kinds = {p["type"] for p in panels(layers)}
    assert "heatmap" in kinds
    hm = next(p for p in panels(layers) if p["type"] == "heatmap")
    # the per-unit panels read the rules' per-unit series over ranks, not every rank's
    # (issue 33: 8-23 s a query at 1,024 ranks)
    assert "unit_job:zerodoc_all_gather_exposed:fraction_max" in hm["targets"][0]["expr"]
    assert _steps(by_title(layers, "Bytes per all-gather call")) == [None, t.wrap_fine_median_bytes]
    exprs = " ".join(e for _, e in all_queries(layers))
    assert "busbw" in exprs and "unit_job:zerodoc_collective_bytes:per_step_mean" in exprs
    assert "unit_collective_rank:" not in exprs and "_total" not in exprs
    mem = load(DASHBOARDS / "zerodoc-memory.json")
    reserved = by_title(mem, "Reserved vs allocated (GPU) / resident (CPU)")
    assert 'population=~"reserved|allocated|' in reserved["targets"][0]["expr"]
    assert "process_resident" in reserved["targets"][0]["expr"]  # CPU runs have data too
    ranks = load(DASHBOARDS / "zerodoc-ranks.json")
    assert _steps(by_title(ranks, "Compute per step vs the median rank")) == \
        [None, t.straggler_ratio_warn]


def test_zerodoc_dashboards_list(capsys):
    assert main(["dashboards", "list"]) == 0
    out = capsys.readouterr().out
    assert "zerodoc-overview: zerodoc / Overview" in out and "heatmap" in out


def test_provisioning_files():
    prov = DASHBOARDS / "provisioning"
    d = yaml.safe_load((prov / "dashboards" / "zerodoc.yaml").read_text())
    assert d["apiVersion"] == 1 and d["providers"][0]["type"] == "file"
    assert d["providers"][0]["options"]["path"]
    ds = yaml.safe_load((prov / "datasources" / "zerodoc-prometheus.yaml").read_text())
    assert ds["datasources"][0]["type"] == "prometheus"


# --------------------------------------------------------------------------------------
# push


class FakeGrafana(http.server.ThreadingHTTPServer):
    """Answers POST /api/dashboards/db like Grafana; remembers what it got."""

    def __init__(self, token: str):
        self.token = token
        self.received: list[tuple[dict, dict]] = []
        super().__init__(("127.0.0.1", 0), self._Handler)

    class _Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):  # noqa: N802
            srv = self.server
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path != "/api/dashboards/db":
                return self._reply(404, {"message": "not found"})
            if self.headers.get("Authorization") != f"Bearer {srv.token}":
                return self._reply(401, {"message": "invalid API key"})
            srv.received.append((dict(self.headers), body))
            uid = body["dashboard"]["uid"]
            self._reply(200, {"status": "success", "uid": uid, "url": f"/d/{uid}/x",
                              "version": 1})

        def _reply(self, code, obj):
            data = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)


@pytest.fixture
def grafana():
    srv = FakeGrafana("glsa_s3cr3t_t0ken")
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def test_push_with_token_from_env(grafana, monkeypatch, capsys):
    monkeypatch.setenv("GRAFANA_TOKEN", grafana.token)
    url = f"http://127.0.0.1:{grafana.server_address[1]}"
    assert main(["dashboards", "push", "--url", url, "--client", "stdlib",
                 "--folder-uid", "ops"]) == 0
    out, err = capsys.readouterr()
    assert [b["dashboard"]["uid"] for _, b in grafana.received] == \
        ["zerodoc-layers", "zerodoc-memory", "zerodoc-overview", "zerodoc-ranks"]
    _, body = grafana.received[0]
    assert body["overwrite"] is True and body["folderUid"] == "ops"
    assert "id" not in body["dashboard"] and body["dashboard"]["schemaVersion"] == 41
    assert "pushed zerodoc-overview: success /d/zerodoc-overview/x" in out
    assert grafana.token not in out + err


def test_push_token_from_file_and_refusals_never_print_it(grafana, tmp_path, monkeypatch,
                                                          capsys):
    monkeypatch.delenv("GRAFANA_TOKEN", raising=False)
    url = f"http://127.0.0.1:{grafana.server_address[1]}"
    tf = tmp_path / "token"
    tf.write_text(grafana.token + "\n")
    assert main(["dashboards", "push", "--url", url, "--token-file", str(tf),
                 "--client", "stdlib"]) == 0
    assert len(grafana.received) == 4
    # a wrong token: one line, exit 2, and neither token appears anywhere
    tf.write_text("glsa_wrong_t0ken")
    assert main(["dashboards", "push", "--url", url, "--token-file", str(tf),
                 "--client", "stdlib"]) == 2
    out, err = capsys.readouterr()
    assert "401" in err and "refused" in err
    assert "glsa_wrong_t0ken" not in out + err and grafana.token not in out + err
    # no token at all
    assert main(["dashboards", "push", "--url", url, "--client", "stdlib"]) == 2
    assert "$GRAFANA_TOKEN" in capsys.readouterr().err
    # credentials in the URL are refused (they would be printed in messages)
    monkeypatch.setenv("GRAFANA_TOKEN", grafana.token)
    assert main(["dashboards", "push", "--url", "http://admin:pw@127.0.0.1:1",
                 "--client", "stdlib"]) == 2
    assert "must not carry credentials" in capsys.readouterr().err


def test_push_has_no_token_flag():
    from zerodoc.cli.main import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["dashboards", "push", "--url", "http://x", "--token", "t"])


def test_push_unreachable_server(monkeypatch, capsys):
    from zerodoc.demo.launch import free_port

    monkeypatch.setenv("GRAFANA_TOKEN", "glsa_abc")
    assert main(["dashboards", "push", "--url", f"http://127.0.0.1:{free_port()}",
                 "--client", "stdlib"]) == 2
    err = capsys.readouterr().err
    assert "connection failed" in err and "glsa_abc" not in err


@pytest.fixture(scope="session")
def grafana_client_dir():
    """grafana-client (`zerodoc[grafana]`) installed into a folder of its own, so its
    urllib3 replacement never enters the dev environment; reused across runs."""
    target = ROOT / ".venv" / "grafana-extra"
    if not (target / "grafana_client").is_dir():
        res = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--target",
                              str(target), "grafana-client==5.1.4"],
                             capture_output=True, text=True, timeout=600)
        if res.returncode != 0:
            if os.environ.get("CI"):
                pytest.fail(f"cannot install grafana-client: {res.stderr[-1000:]}")
            pytest.skip(f"cannot install grafana-client: {res.stderr[-300:]}")
    return target


def test_push_through_grafana_client(grafana, grafana_client_dir):
    """The grafana-client path, in a subprocess that has the extra on its path."""
    url = f"http://127.0.0.1:{grafana.server_address[1]}"
    env = dict(os.environ, PYTHONPATH=f"{grafana_client_dir}:{ROOT}", GRAFANA_TOKEN=grafana.token)
    cmd = [sys.executable, "-m", "zerodoc", "dashboards", "push", "--url", url,
           "--client", "grafana-client"]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    assert len(grafana.received) == 4
    env["GRAFANA_TOKEN"] = "glsa_wrong"
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 2 and "glsa_wrong" not in res.stderr + res.stdout
    assert "Traceback" not in res.stderr


def test_grafana_client_missing_is_a_clear_error(monkeypatch, capsys):
    try:
        import grafana_client  # noqa: F401
        pytest.skip("grafana-client is installed here")
    except ImportError:
        pass
    monkeypatch.setenv("GRAFANA_TOKEN", "glsa_abc")
    assert main(["dashboards", "push", "--url", "http://127.0.0.1:1",
                 "--client", "grafana-client"]) == 2
    assert "pip install 'zerodoc[grafana]'" in capsys.readouterr().err
