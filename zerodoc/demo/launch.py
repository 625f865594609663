"""Start N local ranks of the demo worker (gloo) and stop them cleanly.

Used by `zerodoc demo`, the tests and the benchmarks. Every rank is a child process with the
torchrun-style environment; `stop()` first asks the ranks to stop together at their next step
(when the spec names an "interrupt_file": the demo's Ctrl-C, a clean close recorded as stopped
by the user), then terminates whatever is still running, so no process or port outlives the
launcher.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time


def _die_with_parent() -> None:
    """Child side: get SIGTERM if the launcher dies (Linux), so no rank is orphaned."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free now, below the kernel's ephemeral range (ports 10000 up to its low
    end, at random): the ports bind(0) and connect() hand out are where a flooded server's
    TIME_WAIT sockets stay for a minute after it closed (the server closes first), and
    bind(0) hands such a port out again, on which c10d's TCPStore then fails to listen
    (EADDRINUSE: the rank dies and its peer waits for good; seen three times in a row after
    the exporter's 40-address guessing flood, ~80,000 TIME_WAIT). Checked by binding it on
    every address, as the store does; bind(0) where the range leaves no room."""
    import random

    low = _ephemeral_low()
    for _ in range(100 if low > 10100 else 0):
        port = random.randrange(10000, low)
        try:
            with socket.socket() as s:
                s.bind(("", port))
            return port
        except OSError:
            continue
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class Job:
    def __init__(self, nprocs: int, spec: dict, *, env: dict | None = None,
                 module: str = "zerodoc.demo.worker", capture: bool = True,
                 log_dir: str | None = None):
        self.nprocs = nprocs
        self.spec = spec
        self.module = module
        self.extra_env = dict(env or {})
        self.capture = capture and log_dir is None
        self.log_dir = log_dir  # each rank's stdout+stderr to <log_dir>/rank-N.out
        self.procs: list[subprocess.Popen] = []
        self._captured: list[tuple] = []  # each rank's (stdout, stderr) files when captured
        self.master_port = free_port()

    def start(self) -> "Job":
        base = dict(os.environ)
        base.update({
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(self.master_port),
            "WORLD_SIZE": str(self.nprocs), "LOCAL_WORLD_SIZE": str(self.nprocs),
            "OMP_NUM_THREADS": base.get("OMP_NUM_THREADS", "1"),
            "PYTHONUNBUFFERED": "1",
        })
        base.update(self.extra_env)
        arg = json.dumps(self.spec)
        for r in range(self.nprocs):
            env = dict(base, RANK=str(r), LOCAL_RANK=str(r))
            # captured into files, never pipes: a rank that writes more than a pipe holds
            # (64 KiB of warnings) before wait() would block on it for good
            out = tempfile.TemporaryFile("w+", errors="replace") if self.capture else None
            err = tempfile.TemporaryFile("w+", errors="replace") if self.capture else None
            self._captured.append((out, err))
            if self.log_dir is not None:
                os.makedirs(self.log_dir, exist_ok=True)
                out = open(os.path.join(self.log_dir, f"rank-{r}.out"), "w")
                err = subprocess.STDOUT
            self.procs.append(subprocess.Popen(
                [sys.executable, "-m", self.module, arg], env=env, stdout=out, stderr=err,
                text=True, start_new_session=True, preexec_fn=_die_with_parent))
            if self.log_dir is not None:
                out.close()  # the child holds its own copy
        return self

    def running(self) -> bool:
        return any(p.poll() is None for p in self.procs)

    def wait(self, timeout: float) -> list[int]:
        """Wait for all ranks; on timeout stop them and raise TimeoutError."""
        deadline = time.monotonic() + timeout
        for p in self.procs:
            left = deadline - time.monotonic()
            try:
                p.wait(timeout=max(0.1, left))
            except subprocess.TimeoutExpired:
                self.stop()
                raise TimeoutError(f"demo ranks still running after {timeout:.0f} s") from None
        return [p.returncode for p in self.procs]

    def outputs(self) -> list[tuple[str, str]]:
        """Each ended rank's (stdout, stderr) so far; ("", "") for one still running or not
        captured."""
        res = []
        for p, files in zip(self.procs, self._captured or [None] * len(self.procs)):
            if self.capture and files is not None and p.poll() is not None:
                got = []
                for f in files:
                    f.seek(0)
                    got.append(f.read())
                res.append((got[0], got[1]))
            else:
                res.append(("", ""))
        return res

    def interrupt(self, timeout: float = 30.0) -> bool:
        """Ask the ranks to stop at their next step (the spec's "interrupt_file": every rank
        closes its monitor cleanly, the run log ends "interrupted", the targets go) and wait
        up to `timeout` s for them to exit. False when there is no such file, a rank had
        already exited (the others cannot finish a step without it), or they did not stop in
        time; a second Ctrl-C ends the wait."""
        path = self.spec.get("interrupt_file")
        if not path or not self.procs or not all(p.poll() is None for p in self.procs):
            return False
        try:
            with open(path, "w") as f:
                f.write("stop requested\n")
            deadline = time.monotonic() + timeout
            while self.running() and time.monotonic() < deadline:
                time.sleep(0.05)
        except (OSError, KeyboardInterrupt):
            return False
        finally:
            try:
                os.unlink(path)
            except OSError:
                pass
        return not self.running()

    def stop(self, grace: float = 3.0) -> None:
        self.interrupt()
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def __enter__(self) -> "Job":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
