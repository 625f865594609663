"""Bad command lines (issue 20 item 16): every one ends with exit code 2 and exactly one line
on stderr naming what is wrong, never a traceback, never accepted.

Run in-process through `zerodoc.cli.main.main` (the console script's own entry point), so an
exception that escapes a command fails the test with its traceback; a few run as real
`python -m zerodoc` processes to check the whole path to the shell.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.support.helpers import ROOT
from zerodoc.cli import main as cli

RUN = str(ROOT / "tests" / "data" / "scenarios" / "slow-link-50ms")

# (command line, a piece of the one error line)
BAD = [
    ("report http://[::1", "not a valid URL"),
    ("report http://[::1]:99999", "not a valid URL"),
    ("report http://host:notaport", "not a valid URL"),
    ("report https://", "not a valid URL"),
    ("report 127.0.0.1:9801-9800", "ports must be"),
    ("report /nonexistent/zerodoc-run", "no run directory"),
    ("report RUN --window -5", "--window"),
    ("report RUN --threshold exposed_fraction_warn=nan", "finite number >= 0"),
    ("report RUN --threshold exposed_fraction_warn=-1", "finite number >= 0"),
    ("report RUN --threshold exposed_fraction_warn=inf", "finite number >= 0"),
    ("report RUN --threshold slow_link_min_bytes=-1", "finite number >= 0"),
    ("report RUN --threshold slow_link_min_bytes=1.5", "needs a int"),
    ("report RUN --threshold alert_for=forever", "duration"),
    ("report RUN --threshold nosuch=1", "unknown threshold"),
    ("report RUN --device-memory -5GB", "expected one argument"),
    ("report RUN --device-memory nanGB", "size"),
    ("report RUN --device-memory 1e400GB", "more than"),
    ("report RUN --fail-on bogus", "unknown severity"),
    ("report RUN --link bogus", "unknown link class"),
    ("report RUN --segment 99", "no segment 99"),
    ("report RUN --json --markdown", "not allowed with"),
    ("report --nosuchflag", "unrecognized arguments"),
    ("nosuchcommand", "invalid choice"),
    ("plan --params 1e400 -N 8", "more than"),
    ("plan --params nan -N 8", "parameter count"),
    ("plan --params -5 -N 8", "parameter count"),
    ("plan --params 7B -N 0", "world_size"),
    ("plan --params 7B -N 8 --device-memory -80GB", "expected one argument"),
    ("plan --params 7B -N 8 --headroom nan", "size"),
    ("plan --params 7B -N 8 --optimizer-bytes nan", "finite"),
    ("plan --params 7B -N 8 --largest-unit 1e400", "more than"),
    ("plan --params 7B -N x", "invalid int value"),
    ("compare RUN /nonexistent/zerodoc-run --no-history", "no run directory"),
    ("compare RUN RUN --noise nan --no-history", "--noise"),
    ("compare RUN RUN --threshold exposed_fraction_warn=nan --no-history", "finite"),
    ("tui RUN --refresh nan", "--refresh"),
    ("tui RUN --refresh 1e400", "--refresh"),
    ("tui RUN --window -1", "--window"),
    ("targets /nonexistent/zerodoc-run", "no run directory"),
    ("targets RUN --write /nonexistent-zerodoc-dir/t.json", "does not exist"),
    ("targets RUN --write /", "is a directory"),
    ("targets RUN --mkdir", "--mkdir goes with --write"),
    ("export {tmp}/exp --threshold exposed_fraction_warn=nan", "finite"),
    ("export {tmp}/exp --for=-1m", "--for"),
    ("stack --port 99999", "not a port number"),
    ("demo --ranks 0", "--ranks"),
    ("demo --slow-link-ms nan", "--slow-link-ms"),
    ("demo --steps -5", "--steps"),
]


def _argv(line: str, tmp: Path) -> list[str]:
    return [a.replace("RUN", RUN).replace("{tmp}", str(tmp)) for a in line.split()]


@pytest.mark.parametrize("line,why", BAD, ids=[b[0][:60] for b in BAD])
def test_bad_argument_one_line_exit_2(line, why, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing written next to the checkout
    try:
        rc = cli.main(_argv(line, tmp_path))
    except SystemExit as e:  # argparse's usage errors
        rc = e.code
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2, (line, rc, err)
    assert len(err) == 1, (line, err)
    assert why in err[0], (line, err)
    assert err[0].startswith(("zerodoc", "usage")) and "Traceback" not in err[0]


@pytest.mark.slow
@pytest.mark.parametrize("line", ["report http://[::1", "plan --params 1e400 -N 8",
                                  "report RUN --threshold exposed_fraction_warn=nan"])
def test_bad_argument_as_a_process(line, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, "-m", "zerodoc", *_argv(line, tmp_path)],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60,
                       stdin=subprocess.DEVNULL)
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_targets_write_mkdir_creates_only_when_asked(tmp_path, capsys):
    """--write refuses a missing directory (nothing created); --mkdir creates it."""
    import json
    import shutil

    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    p = run / "rank-00000.jsonl"  # a rank that serves /metrics and did not end
    head = json.loads(p.read_text().splitlines()[0])
    head["metrics_endpoint"] = "127.0.0.1:9731"
    p.write_text(json.dumps(head) + "\n")
    out = tmp_path / "new" / "deeper" / "t.json"
    assert cli.main(["targets", str(run), "--write", str(out)]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()
    assert cli.main(["targets", str(run), "--write", str(out), "--mkdir"]) == 0
    assert json.loads(out.read_text())[0]["targets"] == ["127.0.0.1:9731"]


def test_startup_line_says_https_when_tls_is_on(tmp_path, pki, running):
    """The start-up line names the scheme the exporter really serves."""
    from tests.test_exporter_security import write_config
    from zerodoc.exporter import webconfig
    from zerodoc.shim.guards import startup_line

    srv, url = running(webconfig.load(write_config(tmp_path / "web.yml", pki)))
    endpoint = f"127.0.0.1:{srv.server_address[1]}"
    mon = SimpleNamespace(
        facts=SimpleNamespace(zero_stage=3, framework="fsdp2", framework_version="2"),
        rank=0, world_size=1, unit_names=["a"], run_dir=str(tmp_path), _writer=object(),
        endpoint=endpoint, _server=srv, local_world_size=1, cfg=SimpleNamespace(port=0))
    line = startup_line(mon, [])
    assert url.startswith("https://") and f"https://{endpoint}/metrics" in line, line
    mon._server = SimpleNamespace(scheme="http")
    assert f"http://{endpoint}/metrics" in startup_line(mon, [])


from tests.test_exporter_security import pki, running  # noqa: E402,F401 - fixtures
