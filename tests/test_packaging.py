"""zerodoc as a user gets it: `python -m build` (sdist, then the wheel from the sdist), `twine
check`, then the wheel installed into a fresh virtual environment, outside the source tree,
running the commands that need the operations files: the demo, the report, `dashboards push`
to a stand-in Grafana, `stack` (rules and the Alertmanager configuration from the package)
and `export`.

The witnesses are the built archives themselves (their file lists and bytes against the
source tree), a fresh interpreter that cannot see the source tree, a stand-in HTTP server that
records what was pushed, and Prometheus' own API.

The fresh environment installs torch like a user does: `$TORCH_SPEC` (the Makefile passes
its own, default `torch==2.13.0`), resolved by pip's configuration (here a local CPU wheel);
`--no-compile` saves the byte-compilation of torch's sources.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import zipfile
from types import SimpleNamespace

import pytest

from tests.support.helpers import ROOT, wait_until
import zerodoc
from tests.support.promserver import require_binary
from tests.test_dashboards import FakeGrafana
from zerodoc.ops import resources
from zerodoc.demo.launch import free_port

pytestmark = pytest.mark.slow
VERSION = zerodoc.__version__


def _run(argv, *, env=None, cwd=None, timeout=300, check=True):
    p = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"{argv} exited {p.returncode}:\n{p.stdout[-3000:]}\n"
                             f"{p.stderr[-3000:]}")
    return p


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    """The sdist and wheel as `python -m build` makes them."""
    out = tmp_path_factory.mktemp("dist")
    src = tmp_path_factory.mktemp("src") / "zerodoc"
    # build from a copy of the tracked tree: the build never writes into the checkout
    files = _run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT).stdout.split()
    for rel in files:
        if (ROOT / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, src / rel)
    p = _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(src)])
    wheel = out / f"zerodoc-{VERSION}-py3-none-any.whl"
    sdist = out / f"zerodoc-{VERSION}.tar.gz"
    assert wheel.exists() and sdist.exists(), p.stdout[-2000:]
    return SimpleNamespace(wheel=wheel, sdist=sdist, log=p.stdout + p.stderr)


def test_build_is_clean_and_twine_check_passes(dist):
    bad = [ln for ln in dist.log.splitlines()
           if ("warning" in ln.lower() or "deprecat" in ln.lower())
           and "byte-compiling is disabled" not in ln]  # PYTHONDONTWRITEBYTECODE in tests
    assert not bad, bad
    p = _run([sys.executable, "-m", "twine", "check", "--strict", str(dist.wheel),
              str(dist.sdist)])
    assert p.stdout.count("PASSED") == 2, p.stdout


def test_wheel_carries_every_operations_file(dist):
    with zipfile.ZipFile(dist.wheel) as z:
        names = set(z.namelist())
        bundle = {rel: p for rel, p in resources.files()}
        assert len(bundle) >= 15
        for rel, path in bundle.items():
            member = f"zerodoc/{resources.PACKAGED}/{rel}"
            assert member in names, f"{rel} missing from the wheel"
            assert z.read(member) == path.read_bytes(), f"{rel} differs in the wheel"
        meta = z.read(f"zerodoc-{VERSION}.dist-info/METADATA").decode()
    assert f"Version: {VERSION}" in meta  # the one version, from zerodoc.__version__
    assert "Provides-Extra: web" in meta and "Requires-Dist: prometheus-client" in meta


def test_resources_found_in_the_source_tree():
    assert resources.kind() == "source" and resources.root() == ROOT
    assert resources.alertmanager_config() == ROOT / "exporters" / "alertmanager.yml"


@pytest.fixture(scope="module")
def venv(dist, tmp_path_factory):
    """A fresh virtual environment with the wheel installed (no extras)."""
    d = tmp_path_factory.mktemp("venv")
    _run([sys.executable, "-m", "venv", "--without-pip", str(d / "v")])
    py = d / "v" / "bin" / "python"
    spec = shlex.split(os.environ.get("TORCH_SPEC", "torch==2.13.0"))
    # Nothing of the checkout in sight (a PYTHONPATH to it would show pip a zerodoc already
    # installed); PYTHONDONTWRITEBYTECODE off: with --no-compile, torch's modules are then
    # compiled once, when first imported, instead of on every import.
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONDONTWRITEBYTECODE")}
    env.update(PATH=f"{d / 'v' / 'bin'}:{env['PATH']}", OMP_NUM_THREADS="1")
    t0 = time.monotonic()
    # this interpreter's pip installs into the new environment (saves bootstrapping a pip)
    _run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-compile", "-q",
          *spec, str(dist.wheel)], env=env, cwd=d, timeout=900)
    print(f"fresh venv install: {time.monotonic() - t0:.0f} s")
    work = d / "work"  # a folder with no zerodoc source in sight
    work.mkdir()
    return SimpleNamespace(bin=d / "v" / "bin", py=py, env=env, cwd=work)


def zerodoc_cmd(venv, *args, **kw):
    return _run([str(venv.bin / "zerodoc"), *args], env=venv.env, cwd=venv.cwd, **kw)


def test_installed_zerodoc_uses_its_packaged_files(venv):
    p = _run([str(venv.py), "-c", "import zerodoc, zerodoc.ops.resources as r; "
              "print(zerodoc.__file__); print(r.kind()); print(r.root())"],
             env=venv.env, cwd=venv.cwd)
    path, kind, root = p.stdout.split()
    assert str(ROOT) not in path and kind == "package", p.stdout
    assert root.startswith(str(venv.bin.parent)) and root.endswith("zerodoc/_ops")
    assert zerodoc_cmd(venv, "--version").stdout.strip() == f"zerodoc {VERSION}"


def test_demo_then_report(venv):
    run = venv.cwd / "demo-run"
    p = zerodoc_cmd(venv, "demo", "--headless", "--steps", "3", "--port", "0",
                    "--run-dir", str(run))
    assert "zerodoc demo: done" in p.stdout and p.stdout.count("top exposed") == 3, p.stdout
    rep = zerodoc_cmd(venv, "report", str(run), "--json")
    report = json.loads(rep.stdout)
    assert report["ranks"] == [0, 1] and len(report["units"]) == 5, report
    assert zerodoc_cmd(venv, "report", str(run)).stdout.strip()


def test_dashboards_push_to_a_stand_in_grafana(venv):
    import threading

    srv = FakeGrafana("glsa_wheel_token")
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        env = dict(venv.env, GRAFANA_TOKEN=srv.token)
        url = f"http://127.0.0.1:{srv.server_address[1]}"
        p = _run([str(venv.bin / "zerodoc"), "dashboards", "push", "--url", url],
                 env=env, cwd=venv.cwd)
    finally:
        srv.shutdown()
        srv.server_close()
    pushed = {b["dashboard"]["uid"]: b["dashboard"] for _, b in srv.received}
    shipped = {json.loads(p.read_text())["uid"]: json.loads(p.read_text())
               for p in sorted((ROOT / "dashboards").glob("*.json"))}
    assert set(pushed) == set(shipped) and len(pushed) == 4, p.stdout
    for uid, d in pushed.items():
        assert d["title"] == shipped[uid]["title"]
        assert len(d["panels"]) == len(shipped[uid]["panels"])
    assert srv.token not in p.stdout + p.stderr


def test_stack_loads_the_packaged_rules_and_alertmanager_config(venv):
    require_binary("prometheus")
    runs = venv.cwd / "runs"
    runs.mkdir(exist_ok=True)
    port = free_port()
    out = open(venv.cwd / "stack.out", "w")
    proc = subprocess.Popen([str(venv.bin / "zerodoc"), "stack", str(runs), "--port",
                             str(port), "--data-dir", str(venv.cwd / "stack")],
                            stdout=out, stderr=subprocess.STDOUT, env=venv.env, cwd=venv.cwd)
    groups: set = set()
    try:
        def loaded() -> bool:  # the rules served and the stack says it is up (or it exited)
            nonlocal groups
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/rules",
                                            timeout=2) as r:
                    groups = {g["name"] for g in json.load(r)["data"]["groups"]}
            except OSError:
                pass
            return proc.poll() is not None or bool(
                groups and "Ctrl-C stops it" in (venv.cwd / "stack.out").read_text())

        try:
            wait_until(loaded, 60, "the stack's Prometheus to load the rules", interval=0.5)
        except AssertionError:
            pass  # what it served, and its output, are checked below
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        out.close()
    text = (venv.cwd / "stack.out").read_text()
    # every group of the repository's generated rule files (issue 33 added the per-unit ones)
    import yaml

    want = {g["name"] for f in sorted((ROOT / "rules").glob("*.yml"))
            for g in yaml.safe_load(f.read_text())["groups"]}
    assert {"zerodoc.recording", "zerodoc.unit_rates", "zerodoc.units", "zerodoc.alerts"} <= want
    assert groups == want, text
    assert code == 0 and "zerodoc stack: stopped" in text and "Traceback" not in text, text
    if shutil.which("prometheus-alertmanager") or shutil.which("alertmanager"):
        assert "zerodoc/_ops/exporters/alertmanager.yml" in text, text


def test_export_writes_the_packaged_tree(venv):
    dest = venv.cwd / "gitops"
    zerodoc_cmd(venv, "export", str(dest), "--runbook-base", "https://git.example/ops/")
    written = {p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()}
    assert written == {rel for rel, _ in resources.files()}
    assert (dest / "dashboards" / "zerodoc-overview.json").read_bytes() == \
        (ROOT / "dashboards" / "zerodoc-overview.json").read_bytes()
    assert "https://git.example/ops/docs/runbooks.md#zerodocslowlink" in \
        (dest / "rules" / "zerodoc-alerts.yml").read_text()
    assert zerodoc_cmd(venv, "export", str(dest), "--runbook-base", "https://git.example/ops/",
                       "--check").returncode == 0
    if shutil.which("promtool"):  # the exported tree is consistent as committed
        _run(["promtool", "check", "config", "prometheus.yml"], cwd=dest / "exporters")
        _run(["promtool", "test", "rules", "rules/tests/zerodoc-alerts.test.yml"], cwd=dest)
    if shutil.which("amtool"):
        _run(["amtool", "check-config", str(dest / "exporters" / "alertmanager.yml")])
