"""Hostile and damaged inputs for zerodoc's readers (issue 20 item 15): real files, made in a
folder of the caller's choosing, for the tests (tests/test_hostile_files.py) and the chaos
bench. Standard library only; each maker returns the path to hand to `zerodoc report`.

Every one of them must end with a clear one-line error naming the path (exit code 2), or with
a report that counts what it skipped; never a traceback, never more than a bounded amount of
memory, never time that grows faster than the file.
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

from ..runlog.records import SCHEMA


def header(rank: int = 0, world: int = 2, **over) -> dict:
    """A valid schema-2 run-log header (two units), with fields replaced by `over`."""
    units = [{"name": n, "params": 1000, "param_bytes": 4000, "gather_bytes": 4000,
              "sharded_bytes": 2000, "reshard_after_forward": True, "group_size": world}
             for n in ("", "layers.0")]
    h = {"type": "header", "schema": SCHEMA, "segment": 0, "prev_header_at": None,
         "rank": rank, "local_rank": rank, "world_size": world, "local_world_size": world,
         "node": "n0", "run_id": "hostile", "framework": "fsdp2", "framework_version": "2",
         "torch_version": "2", "device_type": "cpu", "backend": "gloo", "zero_stage": 3,
         "mesh_shape": [world], "mesh_dim_names": ["dp"], "param_dtype": "float32",
         "reduce_dtype": "float32", "units": units, "device_capacity_bytes": None,
         "started_unix": 1_700_000_000.0, "pid": 100 + rank}
    h.update(over)
    return h


def step_line(step: int, **over) -> dict:
    rec = {"type": "step", "step": step, "end_unix": 1_700_000_000.0 + step, "step_s": 1.0,
           "optimizer_s": 0.1, "framework_s": 0.05, "other_s": 0.05, "self_s": 0.001,
           "compute_s": 0.6, "exposed_s": 0.2}
    rec.update(over)
    return rec


def _write_log(run: Path, rank: int, head: dict, lines: list, tail: bytes = b"") -> Path:
    run.mkdir(parents=True, exist_ok=True)
    p = run / f"rank-{rank:05d}.jsonl"
    with open(p, "wb") as f:
        for rec in [head, *lines]:
            f.write((rec if isinstance(rec, str) else json.dumps(rec)).encode() + b"\n")
        f.write(tail)
    return p


def make_run(run: str | os.PathLike, *, ranks: int = 2, steps: int = 6,
             head_over: dict | None = None, bad: dict | None = None) -> Path:
    """A small run directory. `head_over`: fields of rank 0's header replaced (world_size
    1e9, "x", -5 ...); `bad`: {rank: [raw lines]} appended among that rank's steps."""
    run = Path(run)
    for r in range(ranks):
        head = {**header(r, ranks), **((head_over or {}) if r == 0 else {})}
        lines: list = [step_line(s) for s in range(1, steps + 1)]
        lines[steps // 2:steps // 2] = (bad or {}).get(r, [])
        _write_log(run, r, head, lines + [{"type": "end", "end_unix": 1_700_000_100.0,
                                           "steps": steps, "dropped": 0}])
    return run


def bad_duration_lines() -> list[str]:
    """Step lines whose durations are NaN, infinite or negative (Python's json writes and
    reads NaN / Infinity), and one with an out-of-range unit index."""
    return [json.dumps(step_line(100, step_s=float("nan"))),
            json.dumps(step_line(101, step_s=float("inf"))),
            json.dumps(step_line(102, optimizer_s=-5.0))]


def make_long_last_line(run: str | os.PathLike, size: int = 100 << 20) -> Path:
    """A run whose rank 0 log ends with one `size`-byte line (no newline): a reader walking
    the log backwards must stay linear and skip it."""
    run = Path(run)
    make_run(run, ranks=1)
    p = run / "rank-00000.jsonl"
    with open(p, "ab") as f:
        block = b"x" * (1 << 20)
        f.write(b'{"type":"step","junk":"')
        for _ in range(size >> 20):
            f.write(block)
    return run


def make_deep_runlog(run: str | os.PathLike, depth: int = 200_000) -> Path:
    """A run whose logs hold a line of `depth` nested arrays (RecursionError in a naive
    reader)."""
    nested = "[" * depth + "]" * depth
    return make_run(run, bad={0: ['{"type":"step","step":' + nested + "}"],
                              1: [nested]})


def make_deep_trace(path: str | os.PathLike, depth: int = 200_000) -> Path:
    """A profiler trace whose one event nests `depth` levels deep."""
    p = Path(path)
    p.write_text('{"traceEvents":[{"ph":"X","name":"x","args":' + "[" * depth + "]" * depth
                 + "}]}")
    return p


def _event(i: int, dur) -> str:
    return json.dumps({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1,
                       "ts": 1000.0 + 10 * i, "dur": dur})


def make_bad_times_trace(path: str | os.PathLike) -> Path:
    """A small trace (one profiler step, a few operators) in which three events have NaN,
    infinite and negative durations."""
    events = [json.dumps({"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1",
                          "pid": 1, "tid": 1, "ts": 1000.0, "dur": 100.0})]
    events += [_event(i, 5.0) for i in range(8)]
    events += [_event(20, float("nan")), _event(21, float("inf")), _event(22, -50.0)]
    p = Path(path)
    p.write_text('{"traceEvents":[\n' + ",\n".join(events) + "\n]}")
    return p


def make_gzip_bomb(path: str | os.PathLike, expand_to: int = 4 << 30,
                   member: int = 64 << 20) -> Path:
    """A gzipped profiler trace of valid events that is a few MB on disk and expands to
    `expand_to` bytes: one gzip member of `member` bytes of events, compressed once and
    written again and again (concatenated members are one valid gzip stream)."""
    ev = (_event(0, 1.0) + ",\n").encode()
    body = ev * (member // len(ev))
    one = gzip.compress(body, compresslevel=9, mtime=0)
    p = Path(path)
    with open(p, "wb") as f:
        f.write(gzip.compress(b'{"traceEvents":[\n', mtime=0))
        for _ in range(max(1, expand_to // len(body))):
            f.write(one)
        f.write(gzip.compress(_event(1, 1.0).encode() + b"\n]}", mtime=0))
    return p


# One rank writing steps through the real run-log writer in a child process (a limit set
# there binds that process only). "fsize": steps 1-30, and 11-20 while the file-size limit
# (RLIMIT_FSIZE: EFBIG after writing what fits, as a full disk gives ENOSPC) leaves room for
# less than one step line; "nofile": steps 1-60, and 11-50 while no file descriptor can be
# opened (RLIMIT_NOFILE: EMFILE when the writer opens its next detail file).
_FAILING_WRITES_JOB = r"""

import json, os, resource, sys
from zerodoc.runlog import RunLogWriter
from zerodoc.runlog.replay import Replay
from zerodoc.testing.synthetic import rank_facts, step_record

run, mode = sys.argv[1], sys.argv[2]
w = RunLogWriter(run, 0, every_steps=5, detail=True, queue_size=4096)
rep = Replay(w, rank_facts(0, 1, 4, run_id="diskfull"))
t = 1_700_000_000.0
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
nsoft, nhard = resource.getrlimit(resource.RLIMIT_NOFILE)

def steps(a, b):
    global t
    for s in range(a, b + 1):
        rec, step_s = step_record(s, 0, 1, 4, t, None)
        t += step_s
        rec["end_unix"] = t
        rep.step(rec)
    assert w.flush(30)

during = 0
steps(1, 10)
if mode == "fsize":
    size = os.path.getsize(w.path)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size + 150, hard))
    steps(11, 20)
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
elif mode == "nofile":
    # no new descriptor (0-2 are taken; those open above the limit stay usable)
    resource.setrlimit(resource.RLIMIT_NOFILE, (3, nhard))
    steps(11, 50)  # eight intervals: eight detail files the writer cannot open
    during = max(os.stat(os.path.join(run, "detail", n)).st_size
                 for n in ("00000-a.jsonl", "00000-b.jsonl"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (nsoft, nhard))
steps(max(21, 51 if mode == "nofile" else 21), 60 if mode == "nofile" else 30)
rep.close(end=True)
print(json.dumps({"lost": getattr(w, "lost", None),
                  "lost_steps": getattr(w, "lost_steps", None),
                  "errors": w.errors, "detail_bytes_during": during,
                  "write_error": getattr(w, "write_error", None)}))
"""


def failing_writes_run(run: str | os.PathLike, mode: str = "fsize",
                       timeout: float = 120) -> tuple[dict, str]:
    """Write `run` with failing writes (see above); (the writer's counts, its stderr)."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(root), *filter(None, [os.environ.get("PYTHONPATH")])]), "OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, "-c", _FAILING_WRITES_JOB, str(run), mode],
                       capture_output=True, text=True, env=env, timeout=timeout,
                       stdin=subprocess.DEVNULL)
    if p.returncode != 0:
        raise RuntimeError(f"failing-writes job exited {p.returncode}: {p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1]), p.stderr


HEADER_CASES = {
    # name: (header fields replaced, a piece of the one-line error)
    "world_size 1e9": ({"world_size": 10 ** 9}, "world_size must be an integer in [1, 1000000]"),
    "world_size 'x'": ({"world_size": "x"}, "world_size must be an integer"),
    "world_size -5": ({"world_size": -5}, "world_size must be an integer"),
    "world_size 2.5": ({"world_size": 2.5}, "world_size must be an integer"),
    "rank beyond world": ({"rank": 7}, "rank must be an integer in [0, 1]"),
    "started_unix NaN": ({"started_unix": float("nan")}, "started_unix must be a finite"),
    "units not a list": ({"units": "many"}, "units must be a list"),
    "unit params negative": ({"units": [{**header()["units"][0], "params": -1}]},
                             "unit params must be"),
    "unit group_size 0": ({"units": [{**header()["units"][0], "group_size": 0}]},
                          "unit group_size must be"),
    "mesh 1e9": ({"mesh_shape": [10 ** 9]}, "mesh_shape must be"),
}

__all__ = ["HEADER_CASES", "bad_duration_lines", "failing_writes_run", "header",
           "make_bad_times_trace", "make_deep_runlog", "make_deep_trace", "make_gzip_bomb", "make_long_last_line",
           "make_run", "step_line"]
