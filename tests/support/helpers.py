"""Shared helpers for tests: run real multi-process demo jobs and read their run logs."""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

from zerodoc.demo.launch import Job
from zerodoc.runlog import RankLog, read_rank_log, read_rank_tail

# The repository root (README.md, docs/, exporters/, rules/, dashboards/, bench/ live here).
ROOT = Path(__file__).resolve().parents[2]
# Test programs as files (tests/support/jobs/*.py), each run in a fresh interpreter.
JOBS = ROOT / "tests" / "support" / "jobs"


def job_command(name: str, *args) -> list[str]:
    """The command line running the job script tests/support/jobs/<name>.py by path (with
    `job_env()`'s environment, so that it finds zerodoc and tests.support)."""
    path = JOBS / f"{name}.py"
    if not path.is_file():
        raise FileNotFoundError(f"no job script {path}")
    return [sys.executable, str(path), *map(str, args)]


def job_env(env: dict | None = None, path=()) -> dict:
    """`env` (this process's environment when None) with the repository root, after the
    folders in `path`, on PYTHONPATH: a script run by path has its own folder as sys.path[0],
    not the working directory."""
    env = dict(os.environ if env is None else env)
    parts = [str(p) for p in path] + [str(ROOT)]
    if env.get("PYTHONPATH"):
        parts.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(parts)
    return env


def wait_until(condition, timeout: float = 30.0, what: str = "condition",
               interval: float = 0.05):
    """Poll `condition()` until it returns something true and return that value; after
    `timeout` seconds fail saying `what` was awaited. The one deadline loop of the suite: tests
    wait on a condition, never on a fixed sleep."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


def pids_gone(pids) -> bool:
    """Every process in `pids` has exited (gone from /proc, or a zombie not yet reaped)."""
    def gone(pid: int) -> bool:
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] == "Z"
        except FileNotFoundError:
            return True
    return all(gone(p) for p in pids)


async def wait_until_async(attempt, timeout: float = 30.0, what: str = "condition",
                           interval: float = 0.05):
    """wait_until for a coroutine function: await `attempt()` until it returns something true
    and return that value; after `timeout` seconds fail saying `what` was awaited."""
    deadline = time.monotonic() + timeout
    while True:
        value = await attempt()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(interval)


async def until(pilot, cond, timeout: float = 30.0, what: str = "condition"):
    """Wait on a Textual Pilot until `cond()` is true (its value), or fail saying what."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        await pilot.pause(0.05)
    raise AssertionError(f"timed out waiting for {what}")


# Small but real: 4 transformer blocks, steps of ~0.1-0.3 s on 2 CPU cores.
SMALL_MODEL = {"blocks": 4, "hidden": 256, "heads": 4, "vocab": 1024, "seq": 128, "batch": 4}


def run_demo(tmp: Path, name: str, *, nprocs: int = 2, steps: int = 8, model: dict | None = None,
             attach: dict | None = None, timeout: float = 240.0, env: dict | None = None,
             extra: dict | None = None, read_logs: bool = True) -> dict[int, RankLog]:
    """Run the demo worker on `nprocs` gloo ranks; return each rank's parsed run log."""
    run_dir = tmp / name
    spec = {"model": {**SMALL_MODEL, **(model or {})}, "steps": steps,
            "attach": {"run_dir": str(run_dir), "port": False, **(attach or {})},
            **(extra or {})}
    job = Job(nprocs, spec, env=env).start()
    try:
        codes = job.wait(timeout)
    finally:
        job.stop()
    outs = job.outputs()
    assert codes == [0] * nprocs, f"ranks exited {codes}: {outs}"
    if not read_logs:
        return {}
    return {r: read_rank_log(run_dir / f"rank-{r:05d}.jsonl") for r in range(nprocs)}


def detail_steps(log: RankLog, skip: int = 0) -> list:
    """The steps after `skip` warm-up steps that have per-unit detail. In the default
    (adaptive) detail only sampled steps do: the others carry no per-unit rows, which is
    "not measured", never zeros. Fails where none does (a check over no step checks nothing)."""
    out = [s for s in log.steps if s.step > skip and s.detail]
    assert out, f"rank {log.facts.rank}: no step after step {skip} has per-unit detail"
    return out


def per_step(log: RankLog, unit: str, phase: str, coll: str, field: str,
             skip: int = 2) -> list[float]:
    """One number per detail step (after `skip` warm-up steps) for a unit/phase/collective:
    0 where a detail step has no such call."""
    out = []
    for s in detail_steps(log, skip):
        t = s.comm.get((unit, phase, coll))
        out.append(getattr(t, field) if t is not None else 0.0)
    return out


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else 0.0


class LiveDemo:
    """A demo job left running (port 0: each rank picks a free port) for scrape tests.

        with LiveDemo(tmp, steps=400) as demo:
            demo.endpoints  # ["127.0.0.1:PORT", ...] read from the run log headers
    """

    def __init__(self, tmp: Path, *, nprocs: int = 2, steps: int = 10**6,
                 model: dict | None = None, attach: dict | None = None, name: str = "live",
                 env: dict | None = None, spec: dict | None = None):
        self.run_dir = Path(tmp) / name
        spec = {"model": {**SMALL_MODEL, **(model or {})}, "steps": steps,
                "attach": {"run_dir": str(self.run_dir), "port": 0, **(attach or {})},
                **(spec or {})}  # more of the worker's spec (zerodoc/demo/worker.py)
        self.nprocs = nprocs
        self.job = Job(nprocs, spec, env=env, log_dir=str(self.run_dir / "logs"))
        self.endpoints: list[str] = []

    def __enter__(self) -> "LiveDemo":
        self.job.start()

        def endpoints() -> list[str] | None:
            eps = {}
            for r in range(self.nprocs):
                p = self.run_dir / f"rank-{r:05d}.jsonl"
                if p.exists() and p.stat().st_size:
                    try:
                        eps[r] = read_rank_tail(p, 1, detail=False).facts.metrics_endpoint
                    except Exception:
                        pass
            if len(eps) == self.nprocs and all(eps.values()):
                return [eps[r] for r in range(self.nprocs)]
            if not self.job.running():
                raise RuntimeError("a rank exited")
            return None

        try:
            self.endpoints = wait_until(endpoints, 90, "every rank's /metrics endpoint",
                                        interval=0.3)
            return self
        except (RuntimeError, AssertionError):
            self.job.stop()
            logs = "".join((self.run_dir / "logs" / f"rank-{r}.out").read_text()[-1500:]
                           for r in range(self.nprocs)
                           if (self.run_dir / "logs" / f"rank-{r}.out").exists())
            raise RuntimeError(f"demo did not come up: {logs}") from None

    def wait_steps(self, n: int, timeout: float = 120.0) -> None:
        """Block until every rank has logged at least `n` steps."""
        wait_until(lambda: min(read_rank_tail(self.run_dir / f"rank-{r:05d}.jsonl", 1,
                                              detail=False).last_step
                               for r in range(self.nprocs)) >= n,
                   timeout, f"every rank to log {n} steps", interval=0.3)

    def __exit__(self, *exc) -> None:
        self.job.stop()


def synthetic_facts(rank: int, world: int, units: tuple, *, run_id: str,
                    device_type: str = "cuda", backend: str = "nccl"):
    """The RankFacts of one rank of a synthetic FSDP2 ZeRO-3 run (float32, one node)."""
    from zerodoc.runmodel import RankFacts

    return RankFacts(rank=rank, local_rank=rank, world_size=world, local_world_size=world,
                     node="n1", run_id=run_id, framework="fsdp2", framework_version="x",
                     torch_version="x", device_type=device_type, backend=backend,
                     zero_stage=3, mesh_shape=(world,), mesh_dim_names=None,
                     param_dtype="float32", reduce_dtype="float32", units=units,
                     device_capacity_bytes=None, started_unix=0.0, pid=1)


_PROFILED: dict[str, tuple] = {}


def profiled_demo(tmp_factory, name: str, *, model: dict, attach: dict | None = None,
                  nprocs: int = 2, steps: int = 8, gzip: bool = False) -> tuple:
    """A demo run with the shim attached and the PyTorch profiler recording steps 4-7
    (ProfilerStep#3-#6), one trace per rank. Returns (run logs, trace dir). Runs once per
    test session and name, so several test modules can check the same run.

    Per-unit detail on every step: the profiler witnesses each call of steps 4-7, and the
    live numbers it is held against exist only on detail steps (the default samples few of
    8 steps, maybe none of 4-7; a sampled step is measured by the same code)."""
    if name not in _PROFILED:
        tmp = tmp_factory.mktemp(name)
        traces = tmp / "traces"
        attach = {"detail": "every", **(attach or {})}
        logs = run_demo(tmp, "run", nprocs=nprocs, steps=steps, model=model, attach=attach,
                        extra={"profile": {"dir": str(traces), "wait": 2, "warmup": 1,
                                           "active": 4, "gzip": gzip}})
        _PROFILED[name] = (logs, traces)
    return _PROFILED[name]


# The profiled runs the trace tests share (tests/test_trace_source.py, test_profiler_witness.py).
PROFILED_MODEL = {"batch": 8}
PROFILED_DELAY_S = 0.050  # the slow link of the "delay" run (async prefetch)


def profiled(tmp_factory, kind: str) -> tuple:
    if kind == "sync":
        return profiled_demo(tmp_factory, "sync", model=PROFILED_MODEL)
    if kind == "async":
        return profiled_demo(tmp_factory, "async", model={**PROFILED_MODEL, "prefetch": True},
                             gzip=True)
    if kind == "delay":
        return profiled_demo(tmp_factory, "delay", model={**PROFILED_MODEL, "prefetch": True},
                             attach={"inject_latency_s": PROFILED_DELAY_S})
    raise ValueError(kind)


def gauge_registry(series: int = 10):
    """A prometheus_client registry holding one gauge with `series` labelled series (the
    exporter tests' page content)."""
    from prometheus_client import CollectorRegistry, Gauge

    reg = CollectorRegistry()
    g = Gauge("zerodoc_test_value", "A test gauge.", ["i"], registry=reg)
    for i in range(series):
        g.labels(str(i)).set(i)
    return reg
