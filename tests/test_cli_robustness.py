"""Every command line that prints ends quietly when its reader goes away (`... | head`) or on
Ctrl-C: no traceback, the exit status a shell expects (141 / 130), and no process left behind.

The closed pipe is real: the command's stdout is a pipe whose read end is already closed, so
its first write fails with EPIPE exactly as after `head` exits. Ctrl-C is a real SIGINT for a
command blocked on a server that never answers; for the others a KeyboardInterrupt is raised
from inside their output, which is where Ctrl-C lands in a command that only prints.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import pytest

from tests.support.promserver import require_binary
from tests.support.helpers import ROOT, wait_until
from zerodoc.cli import main as cli
from zerodoc.demo.launch import free_port

RUN = str(ROOT / "tests" / "data" / "scenarios" / "slow-link-50ms")
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}

# Every `zerodoc` subcommand that prints, and the generators run with `python -m`.
PRINTING = {
    "plan --json": ["-m", "zerodoc", "plan", "--params", "13B", "-N", "8",
                    "--device-memory", "80GB", "--json"],
    "plan": ["-m", "zerodoc", "plan", "--params", "70B", "-N", "64"],
    "report": ["-m", "zerodoc", "report", RUN],
    "report --json": ["-m", "zerodoc", "report", RUN, "--json"],
    "compare": ["-m", "zerodoc", "compare", RUN,
                str(ROOT / "tests" / "data" / "scenarios" / "healthy-block"), "--no-history"],
    "targets": ["-m", "zerodoc", "targets", RUN, "--include-ended"],
    "dashboards list": ["-m", "zerodoc", "dashboards", "list"],
    "export --list": ["-m", "zerodoc", "export", "--list"],
    "export DIR": ["-m", "zerodoc", "export", "{tmp}/export"],
    "python -m zerodoc.cli.rules_gen": ["-m", "zerodoc.cli.rules_gen", "--out", "{tmp}/rules",
                                 "--k8s-out", ""],
    "python -m zerodoc.cli.metrics_doc": ["-m", "zerodoc.cli.metrics_doc"],
}


def run_into_closed_pipe(argv: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    r, w = os.pipe()
    os.close(r)  # the reader is gone before the first byte is written
    try:
        return subprocess.run([sys.executable, *argv], stdout=w, stderr=subprocess.PIPE,
                              stdin=subprocess.DEVNULL, text=True, env=ENV, cwd=ROOT,
                              timeout=timeout)
    finally:
        os.close(w)


def assert_quiet_broken_pipe(p: subprocess.CompletedProcess) -> None:
    assert p.returncode == cli.EXIT_BROKEN_PIPE, (p.returncode, p.stderr)
    assert "Traceback" not in p.stderr and "BrokenPipe" not in p.stderr, p.stderr
    assert "Exception ignored" not in p.stderr, p.stderr


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PRINTING))
def test_closed_pipe_is_quiet(name, tmp_path):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in PRINTING[name]]
    assert_quiet_broken_pipe(run_into_closed_pipe(argv))


@pytest.mark.slow
def test_an_unguarded_print_would_fail_this_check():
    """The witness can fail: a plain print into a closed pipe tracebacks."""
    p = run_into_closed_pipe(["-c", "print('x' * 100000)"])
    assert p.returncode != 0 and "BrokenPipeError" in p.stderr


def _processes_mentioning(text: str) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                cmd = open(f"/proc/{d}/cmdline", "rb").read().decode(errors="replace")
                stat = open(f"/proc/{d}/stat").read().split()[2]
            except OSError:
                continue
            if text in cmd and stat != "Z":
                out.append(int(d))
    return out


@pytest.mark.slow
def test_dashboards_push_into_closed_pipe(monkeypatch):
    import threading

    from tests.test_dashboards import FakeGrafana

    srv = FakeGrafana("glsa_pipe_token")
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    monkeypatch.setitem(ENV, "GRAFANA_TOKEN", srv.token)
    try:
        p = run_into_closed_pipe(["-m", "zerodoc", "dashboards", "push", "--client", "stdlib",
                                  "--url", f"http://127.0.0.1:{srv.server_address[1]}"])
    finally:
        srv.shutdown()
        srv.server_close()
    assert_quiet_broken_pipe(p)
    assert srv.received  # it was pushing when its reader went away


@pytest.mark.slow
def test_demo_into_closed_pipe_stops_its_ranks(tmp_path):
    run_dir = tmp_path / "demo-pipe"
    p = run_into_closed_pipe(["-m", "zerodoc", "demo", "--headless", "--ranks", "2",
                              "--steps", "3", "--port", "0", "--run-dir", str(run_dir)])
    assert_quiet_broken_pipe(p)
    wait_until(lambda: not _processes_mentioning(str(run_dir)), 5,
               "the demo's ranks to exit with it (a demo rank outlived the demo)")


@pytest.mark.slow
def test_stack_into_closed_pipe_stops_prometheus(tmp_path):
    require_binary("prometheus")
    (tmp_path / "runs").mkdir()
    data = tmp_path / "stack"
    p = run_into_closed_pipe(["-m", "zerodoc", "stack", str(tmp_path / "runs"), "--port",
                              str(free_port()), "--data-dir", str(data), "--no-alertmanager"])
    assert_quiet_broken_pipe(p)
    assert (data / "prometheus.log").exists()  # it had started
    wait_until(lambda: not _processes_mentioning(str(data)), 5,
               "Prometheus to exit with zerodoc stack (prometheus outlived zerodoc stack)")


class _CtrlCWhilePrinting:
    """A stdout on which the first write is interrupted by Ctrl-C."""

    def write(self, s):
        raise KeyboardInterrupt

    def flush(self):
        pass

    def fileno(self):
        return 1


@pytest.mark.parametrize("name", sorted(n for n in PRINTING if not n.startswith("python")))
def test_ctrl_c_while_printing_is_quiet(name, tmp_path, monkeypatch, capsys):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in PRINTING[name]][2:]
    monkeypatch.setattr(sys, "stdout", _CtrlCWhilePrinting())
    assert cli.main(argv) == cli.EXIT_INTERRUPTED
    err = capsys.readouterr().err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err


@pytest.mark.slow
def test_ctrl_c_on_a_report_waiting_for_a_server(tmp_path):
    """A real SIGINT while `zerodoc report` waits on a Prometheus that never answers."""
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        url = f"http://127.0.0.1:{srv.getsockname()[1]}"
        proc = subprocess.Popen([sys.executable, "-m", "zerodoc", "report", url],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=ENV, cwd=ROOT)
        try:
            srv.settimeout(60)
            conn, _ = srv.accept()
            conn.settimeout(60)
            request = b""
            while b"\r\n\r\n" not in request:  # the whole request: it now waits on the answer
                chunk = conn.recv(4096)
                assert chunk, "the report closed its connection before asking"
                request += chunk
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=30)
            conn.close()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == cli.EXIT_INTERRUPTED, err
    assert err == "" and out == "", err
