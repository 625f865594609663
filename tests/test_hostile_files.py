"""Hostile and damaged files (issue 20 item 15), made for real by `zerodoc.testing.hostile`:
every header field checked against its meaning, bad lines skipped, counted and shown, NaN /
infinite / negative durations kept out of the numbers, deep nesting and gzip bombs refused
with a one-line error, a 100 MB last line read in linear time and bounded memory.

The costly ones run `zerodoc report` as a real process and take its peak RSS from the kernel
(`os.wait4`): the issue's bound is 500 MB for a reader on any hostile file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.helpers import ROOT
from zerodoc.cli import main as cli
from zerodoc.testing import hostile

MAX_RSS_MB = 500


def report_process(*args: str, timeout: float = 120) -> tuple[int, str, str, float, float]:
    """`zerodoc report ARGS` as a process: (rc, stdout, stderr, its own peak RSS in MB from
    the kernel's rusage of that one process, wall seconds)."""
    import signal
    import tempfile
    import threading

    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    fd, rss_file = tempfile.mkstemp(prefix="zerodoc-rss-")
    os.close(fd)
    t0 = time.monotonic()
    p = subprocess.Popen([sys.executable, str(ROOT / "tests" / "support" / "jobs" / "own_rss.py"),
                          rss_file,  # its child's own peak, not pytest's (see own_rss.py)
                          sys.executable, "-m", "zerodoc", "report", *args], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         stdin=subprocess.DEVNULL, start_new_session=True)
    got: dict[str, bytes] = {}
    readers = [threading.Thread(target=lambda k=k, f=f: got.__setitem__(k, f.read()))
               for k, f in (("out", p.stdout), ("err", p.stderr))]
    for t in readers:
        t.start()
    killer = threading.Timer(timeout, lambda: os.killpg(p.pid, signal.SIGKILL))
    killer.start()
    try:
        p.wait()
    finally:
        killer.cancel()
    for t in readers:
        t.join()
    wall = time.monotonic() - t0
    assert wall < timeout, f"report took over {timeout} s"
    try:
        rss_kib = int(Path(rss_file).read_text())
    finally:
        os.unlink(rss_file)
    return p.returncode, got["out"].decode(), got["err"].decode(), rss_kib / 1024, wall


def one_line_error(capsys, argv: list[str]) -> str:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


@pytest.mark.parametrize("name", sorted(hostile.HEADER_CASES))
def test_header_fields_checked_against_their_meaning(name, tmp_path, capsys):
    over, why = hostile.HEADER_CASES[name]
    run = hostile.make_run(tmp_path / "run", head_over=over)
    err = one_line_error(capsys, ["report", str(run)])
    assert why in err and str(run / "rank-00000.jsonl") in err, err


def test_bad_durations_and_nested_lines_are_skipped_counted_and_shown(tmp_path, capsys):
    run = hostile.make_run(tmp_path / "run", bad={1: hostile.bad_duration_lines()})
    hostile.make_deep_runlog(tmp_path / "deep")
    assert cli.main(["report", str(run), "--json", "--window", "0", "--include-warmup"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert "3 lines skipped in rank-00001.jsonl (torn or not valid)" in rep["log_notes"]
    for row in rep["steps"]:  # the good steps only: 6 per rank, every number finite
        assert row["steps"] == 6, row
        for k, v in row.items():
            assert not isinstance(v, float) or (v == v and abs(v) != float("inf")), (k, v)
    assert cli.main(["report", str(tmp_path / "deep")]) == 0
    out = capsys.readouterr().out
    assert "1 line skipped in rank-00000.jsonl" in out and \
        "1 line skipped in rank-00001.jsonl" in out, out


def test_deep_trace_is_a_one_line_error(tmp_path, capsys):
    p = hostile.make_deep_trace(tmp_path / "rank-0.json")
    err = one_line_error(capsys, ["report", str(p)])
    assert "nested too deeply" in err and str(p) in err


def test_bad_times_in_a_trace_are_skipped_and_shown(tmp_path, capsys):
    p = hostile.make_bad_times_trace(tmp_path / "rank-0.json")
    assert cli.main(["report", str(p), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert "3 events skipped in rank-0.json: NaN, infinite or negative times" in \
        rep["log_notes"], rep["log_notes"]


@pytest.mark.slow
def test_gzip_bomb_is_refused_in_bounded_memory(tmp_path):
    p = hostile.make_gzip_bomb(tmp_path / "rank-0.json.gz", expand_to=4 << 30)
    assert p.stat().st_size < 16 << 20  # some MB on disk, 4 GiB inside
    rc, out, err, rss, wall = report_process(str(p))
    lines = [x for x in err.splitlines()  # progress: \r-separated on one line of its own
             if x.strip() and not x.lstrip("\r").startswith("zerodoc: reading traces")]
    assert rc == 2 and "Traceback" not in err and len(lines) == 1, err
    assert "decompression bomb" in err and str(p) in err, err
    assert rss < MAX_RSS_MB, rss


@pytest.mark.slow
def test_long_last_line_is_read_linearly_in_bounded_memory(tmp_path):
    """A 100 MB last line (over the 64 MiB line cap): skipped and counted, the steps before
    it reported; the backward reader touches each byte about once (the old one copied the
    growing line at every 64 KiB: minutes), so a generous time bound cannot flake."""
    run = hostile.make_long_last_line(tmp_path / "run", size=100 << 20)
    rc, out, err, rss, wall = report_process(str(run), "--json")
    assert rc == 0, err
    rep = json.loads(out)
    assert "1 line skipped in rank-00000.jsonl (torn or not valid)" in rep["log_notes"]
    assert rep["window"]["steps"] == 5 and rep["window"]["warmup_left_out"] == 1  # 6 good
    assert rss < MAX_RSS_MB, rss
    assert wall < 60, wall


def test_reverse_lines_matches_a_plain_split():
    """The backward line reader against bytes.split on random data, tiny chunks and line
    caps: same lines, same offsets, overlong ones marked."""
    import io
    import random

    from zerodoc.runlog.scan import OVERLONG, reverse_lines

    rnd = random.Random(7)
    for _ in range(2000):
        data = bytes(rnd.choice(b"ab\n\n") for _ in range(rnd.randint(0, 60)))
        start = rnd.randint(0, len(data))
        end = rnd.randint(start, len(data))
        chunk, cap = rnd.randint(1, 8), rnd.randint(0, 12)
        want, off = [], start
        for line in data[start:end].split(b"\n"):
            if line:
                want.append((off, OVERLONG if len(line) > cap else line))
            off += len(line) + 1
        got = list(reverse_lines(io.BytesIO(data), end, start, chunk, cap))
        assert got == want[::-1], (data, start, end, chunk, cap)
