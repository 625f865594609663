"""Prometheus targets: file_sd entries per rank (stdlib, written from inside ranks) and
`zerodoc targets` over a run directory's headers."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support.promserver import require_binary
from zerodoc.exporter import targets
from zerodoc.cli.main import main
from zerodoc.runmodel import RankFacts
from zerodoc.runlog import RunLogWriter


def facts(rank=0, endpoint="127.0.0.1:9730", node="node-a", run_id="run-1", local_rank=None,
          **kw) -> RankFacts:
    return RankFacts(rank=rank, local_rank=rank if local_rank is None else local_rank,
                     world_size=4, local_world_size=2, node=node, run_id=run_id,
                     framework="fsdp2", framework_version="2.13", torch_version="2.13",
                     device_type="cpu", backend="gloo", zero_stage=3, mesh_shape=(4,),
                     mesh_dim_names=None, param_dtype="float32", reduce_dtype="float32",
                     units=(), device_capacity_bytes=None, started_unix=0.0, pid=100 + rank,
                     metrics_endpoint=endpoint, **kw)


def write_run(run_dir: Path, ranks: list[RankFacts], ended: tuple[int, ...] = ()) -> Path:
    for f in ranks:
        w = RunLogWriter(run_dir, f.rank)
        w.write_header(f)
        w.write({"type": "step", "step": 1, "end_unix": 1.0, "step_s": 0.1})
        if f.rank in ended:
            w.close(1)
        else:
            w.abandon()  # a rank that never closed: no end record
    return run_dir


# --------------------------------------------------------------------------------------
# file_sd entries


def test_entry_for_a_loopback_rank(monkeypatch):
    monkeypatch.delenv("ZERODOC_JOB", raising=False)
    e = targets.file_sd_entry(facts(rank=3, local_rank=1, endpoint="127.0.0.1:9731"))
    assert e == {"targets": ["127.0.0.1:9731"],
                 "labels": {"job": "zerodoc", "rank": "3", "local_rank": "1", "node": "node-a",
                            "run_id": "run-1"}}


@pytest.mark.parametrize("endpoint, want", [
    ("0.0.0.0:9730", "gpu-node-7:9730"),      # all interfaces: reach it by hostname
    (":::9730", "gpu-node-7:9730"),           # IPv6 wildcard as serve() formats it
    ("[::]:9730", "gpu-node-7:9730"),
    ("10.1.2.3:9730", "10.1.2.3:9730"),       # a specific address stays
    ("::1:9732", "[::1]:9732"),               # an IPv6 literal gets brackets
])
def test_scrape_address(endpoint, want):
    assert targets.scrape_address(endpoint, "gpu-node-7") == want


def test_entry_from_a_header_dict_and_job_label(monkeypatch):
    head = {"type": "header", **dataclasses.asdict(facts(endpoint="0.0.0.0:9730"))}
    assert targets.file_sd_entry(head, job="llama")["labels"]["job"] == "llama"
    monkeypatch.setenv("ZERODOC_JOB", "from-env")
    e = targets.file_sd_entry(head)
    assert e["labels"]["job"] == "from-env" and e["targets"] == ["node-a:9730"]


def test_no_endpoint_or_a_bad_one_raises():
    with pytest.raises(ValueError, match="serves no /metrics"):
        targets.file_sd_entry(facts(endpoint=None))
    with pytest.raises(ValueError, match="not host:port"):
        targets.file_sd_entry(facts(endpoint="localhost"))


def test_write_rank_target_is_atomic_and_removable(tmp_path, monkeypatch):
    monkeypatch.delenv(targets.FILE_SD_DIR_ENV, raising=False)
    p = targets.write_rank_target(tmp_path, facts(rank=12))
    assert p == tmp_path / "file_sd" / "rank-00012.json"
    assert json.loads(p.read_text())[0]["labels"]["rank"] == "12"
    # rewriting replaces, and leaves no temporary file behind
    targets.write_rank_target(tmp_path, facts(rank=12, endpoint="127.0.0.1:9999"))
    assert json.loads(p.read_text())[0]["targets"] == ["127.0.0.1:9999"]
    assert [x.name for x in p.parent.iterdir()] == ["rank-00012.json"]
    targets.remove_rank_target(tmp_path, facts(rank=12))
    targets.remove_rank_target(tmp_path, facts(rank=12))  # already gone: fine
    assert not p.exists()


def test_shared_file_sd_dir(tmp_path, monkeypatch):
    shared = tmp_path / "all-runs"
    monkeypatch.setenv(targets.FILE_SD_DIR_ENV, str(shared))
    p = targets.write_rank_target(tmp_path / "run", facts(rank=1, run_id="job-42"))
    assert p == shared / "job-42-rank-00001.json"


# --------------------------------------------------------------------------------------
# zerodoc targets


def test_cli_prints_file_sd_for_the_live_ranks(tmp_path, capsys):
    run = write_run(tmp_path / "run", [facts(rank=r, local_rank=r % 2,
                                             endpoint=f"127.0.0.1:{9730 + r % 2}")
                                       for r in range(2)] +
                    [facts(rank=2, endpoint="127.0.0.1:9730", local_rank=0)], ended=(2,))
    assert main(["targets", str(run)]) == 0
    out, err = capsys.readouterr()
    got = json.loads(out)
    assert [e["labels"]["rank"] for e in got] == ["0", "1"]
    assert got[1]["targets"] == ["127.0.0.1:9731"]
    assert "rank(s) 2 finished" in err
    assert main(["targets", str(run), "--include-ended"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 3


def test_cli_writes_static_and_file_sd(tmp_path, capsys):
    run = write_run(tmp_path / "run", [facts(rank=r, endpoint=f"0.0.0.0:{9730 + r}",
                                             node=f"node-{r // 2}") for r in range(4)])
    out_file = tmp_path / "sd" / "zerodoc.json"
    assert main(["targets", str(run), "--write", str(out_file), "--job", "llm",
                 "--mkdir"]) == 0
    got = json.loads(out_file.read_text())
    assert [e["targets"][0] for e in got] == ["node-0:9730", "node-0:9731", "node-1:9732",
                                              "node-1:9733"]
    assert {e["labels"]["job"] for e in got} == {"llm"}
    capsys.readouterr()
    assert main(["targets", str(run), "--format", "static"]) == 0
    static = yaml.safe_load(capsys.readouterr().out)["static_configs"]
    assert static[3] == {"targets": ["node-1:9733"],
                         "labels": {"job": "zerodoc", "rank": "3", "local_rank": "3",
                                    "node": "node-1", "run_id": "run-1"}}


@pytest.mark.slow
def test_static_block_is_valid_prometheus_config(tmp_path, capsys):
    promtool = require_binary("promtool")
    run = write_run(tmp_path / "run", [facts(rank=r, endpoint=f"127.0.0.1:{9730 + r}")
                                       for r in range(2)])
    main(["targets", str(run), "--format", "static"])
    block = capsys.readouterr().out
    cfg = "scrape_configs:\n  - job_name: zerodoc\n    honor_labels: true\n" + \
        "".join(f"    {line}\n" for line in block.splitlines())
    (tmp_path / "p.yml").write_text(cfg)
    sd = tmp_path / "sd.json"
    main(["targets", str(run), "--write", str(sd)])
    (tmp_path / "q.yml").write_text(
        "scrape_configs:\n  - job_name: zerodoc\n    honor_labels: true\n"
        f"    file_sd_configs: [{{files: ['{sd}']}}]\n")
    for name in ("p.yml", "q.yml"):
        r = subprocess.run([promtool, "check", "config", str(tmp_path / name)],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr


def test_cli_warns_about_loopback_on_many_nodes(tmp_path, capsys):
    run = write_run(tmp_path / "run", [facts(rank=r, node=f"node-{r}") for r in range(2)])
    assert main(["targets", str(run)]) == 0
    assert "loopback" in capsys.readouterr().err


@pytest.mark.parametrize("setup, message", [
    ("missing", "no run directory"),
    ("empty", "holds no rank-*.jsonl"),
    ("garbage", "not a zerodoc header"),
    ("no-endpoint", "no rank serves /metrics"),
    ("unwritable", "cannot write"),
])
def test_cli_bad_input_is_one_line_exit_2(tmp_path, capsys, setup, message):
    run = tmp_path / "run"
    args = ["targets", str(run)]
    if setup == "empty":
        run.mkdir()
    elif setup == "garbage":
        run.mkdir()
        (run / "rank-00000.jsonl").write_text("not json\n")
    elif setup == "no-endpoint":
        write_run(run, [facts(endpoint=None)])
    elif setup == "unwritable":
        write_run(run, [facts()])
        (tmp_path / "file").write_text("")
        args += ["--write", str(tmp_path / "file" / "sd.json")]
    assert main(args) == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("zerodoc targets: error")]
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in err, err
