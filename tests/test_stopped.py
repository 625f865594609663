"""When a rank dies or hangs: real 3-rank gloo jobs, one rank SIGKILLed mid-run, one rank
blocked forever in a chosen unit's forward. The ground truth is what the test did (which
rank it killed, which rank and unit it blocked); `zerodoc report` must name that rank (and
unit), and the ranks left waiting for it, at the top. Thresholds are short (2 s); every
process is killed at the end."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.support.helpers import SMALL_MODEL, pids_gone, until, wait_until
from tests.support.jobs import stops
from tests.test_deepspeed import ds_ready  # noqa: F401  (a fixture: DeepSpeed's op built)
from zerodoc.demo.launch import Job
from zerodoc.runlog import read_rank_log
from zerodoc.exporter.targets import read_header

RANKS = 3


def spec(run_dir: Path, **extra) -> dict:
    return {"model": dict(SMALL_MODEL), "steps": 400,
            "attach": {"run_dir": str(run_dir), "port": 0, "stall_after_s": 2.0}, **extra}


def report(run_dir: Path | str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "zerodoc", "report", str(run_dir), *args],
                          capture_output=True, text=True, timeout=120)


def lines_of(run_dir: Path, rank: int) -> list[dict]:
    p = run_dir / f"rank-{rank:05d}.jsonl"
    if not p.exists():
        return []
    out = []
    for line in p.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            pass  # a line being written
    return out


def wait_for(cond, timeout: float, what: str, job: Job) -> None:
    """wait_until, stopping the job if it times out."""
    try:
        wait_until(cond, timeout, what, interval=0.2)
    except AssertionError:
        job.stop(grace=1)
        raise


# "off": every step is one without per-unit detail (the default mode's usual step: no zerodoc
# wrapper on the stack), where the survivors' failure is placed from the traceback's frames
# alone (Watchdog.failed; it named no collective there before, issue 31)
@pytest.mark.parametrize("detail", [None, "off"], ids=["default", "no-detail-step"])
def test_killed_rank_is_named_and_the_waiting_ranks_with_it(tmp_path, detail):
    run = tmp_path / "killed"
    sp = spec(run)
    if detail is not None:
        sp["attach"]["detail"] = detail
    job = Job(RANKS, sp, log_dir=str(run / "logs")).start()
    try:
        wait_for(lambda: sum(r.get("type") == "step" for r in lines_of(run, 1)) >= 4, 180,
                 "rank 1's 4th step", job)
        os.kill(job.procs[1].pid, signal.SIGKILL)
        codes = job.wait(60)  # gloo: the survivors' next collective fails at once
    finally:
        job.stop(grace=1)
    assert codes[1] == -signal.SIGKILL and codes[0] != 0 and codes[2] != 0, codes
    pids = [p.pid for p in job.procs]
    # what the ranks wrote: the survivors' failure records (before their end record, which
    # then is not a clean close), nothing at all from the killed rank
    for r in (0, 2):
        recs = lines_of(run, r)
        failed = [x for x in recs if x["type"] == "stall"]
        assert failed and failed[-1]["state"] == "failed" and failed[-1]["collective"], failed
    assert not any(x["type"] in ("end", "stall") for x in lines_of(run, 1))
    # A failed close is not a clean one: the survivors' end records say so, `zerodoc
    # targets` / `zerodoc stack` keep them as targets, and so did the ranks (their file_sd
    # files stay, like the killed rank's): Prometheus sees all three down (ZerodocRunDown).
    for r in (0, 2):
        ends = [x for x in lines_of(run, r) if x["type"] == "end"]
        assert ends and ends[-1].get("failed") is True, ends
        assert read_header(run / f"rank-{r:05d}.jsonl")[1] is False
    assert sorted(p.name for p in (run / "file_sd").glob("*.json")) == \
        [f"rank-{r:05d}.json" for r in range(RANKS)]

    out = report(run, "--json")
    assert out.returncode == 0, out.stderr
    rep = json.loads(out.stdout)
    top = rep["findings"][0]
    assert top["code"] == "ZD013" and top["severity"] == "critical", top
    ev = top["evidence"]
    assert ev["rank"] == 1 and ev["state"] in ("gone", "stale"), ev
    assert ev["waiting_ranks"] == [0, 2], ev
    assert {w["collective"] for w in ev["waiting"]} <= {"all_gather", "reduce_scatter"}
    assert rep["stopped"]["rank"] == 1 and rep["stopped"]["waiting_ranks"] == [0, 2]
    text = report(run).stdout
    assert "RUN STOPPED: rank 1 stopped first" in text
    assert "ranks 0, 2 failed waiting for it in" in text
    assert pids_gone(pids)


def _endpoint(run: Path, rank: int) -> str:
    return read_rank_log(run / f"rank-{rank:05d}.jsonl").facts.metrics_endpoint


def test_hung_rank_is_named_with_its_unit_while_the_job_hangs(tmp_path):
    run = tmp_path / "hung"
    hang = {"rank_to_hang": 1, "unit": "blocks.2", "after_steps": 3}
    job = Job(RANKS, spec(run, hang=hang), log_dir=str(run / "logs")).start()
    pids = []
    try:
        # a stall record of the hang's step on every rank (a slow warm-up step under load is
        # a stall of its own, resumed)
        wait_for(lambda: all(any(x.get("type") == "stall" and x["state"] == "stuck"
                                 and x["step"] > hang["after_steps"] for x in lines_of(run, r))
                             for r in range(RANKS)), 180, "a stall record on every rank", job)
        pids = [p.pid for p in job.procs]
        assert job.running()  # still hung, nobody crashed
        # the stuck rank's own exporter says where it is (the alert's input)
        page = urllib.request.urlopen(f"http://{_endpoint(run, 1)}/metrics", timeout=10).read()
        gauge = [line for line in page.decode().splitlines()
                 if line.startswith("zerodoc_stall_since_timestamp_seconds{")]
        assert len(gauge) == 1 and 'unit="blocks.2"' in gauge[0] and 'collective=""' in \
            gauge[0] and 'phase="forward"' in gauge[0], gauge
        out = report(run, "--json")  # on the live, hung run
        eps = ",".join(_endpoint(run, r) for r in range(RANKS))
        live = report(eps, "--json")  # the same from the ranks' /metrics (stall gauges)
    finally:
        job.stop(grace=1)
    assert out.returncode == 0, out.stderr
    rep = json.loads(out.stdout)
    top = rep["findings"][0]
    assert top["code"] == "ZD013" and top["severity"] == "critical", top
    ev = top["evidence"]
    assert (ev["rank"], ev["unit"], ev["phase"], ev["state"]) == (1, "blocks.2", "forward",
                                                                   "stuck"), ev
    assert ev["collective"] is None and ev["in"] == "compute", ev
    assert ev["frame"].endswith(" block"), ev["frame"]  # the injected hook's frame
    assert ev["step"] == hang["after_steps"] + 1
    assert ev["waiting_ranks"] == [0, 2]
    assert {(w["unit"], w["collective"]) for w in ev["waiting"]} == {("blocks.3", "all_gather")}
    assert top["units"] == ["blocks.2"]
    assert live.returncode == 0, live.stderr
    ltop = json.loads(live.stdout)["findings"][0]
    assert ltop["code"] == "ZD013" and (ltop["evidence"]["rank"], ltop["evidence"]["unit"]) == \
        (1, "blocks.2") and ltop["evidence"]["waiting_ranks"] == [0, 2], ltop
    wait_until(lambda: pids_gone(pids), 5, f"the ranks {pids} to exit")


async def test_tui_shows_the_stopped_rank_above_every_view():
    """The recorded hung-rank run (tests/data/scenarios/hung-rank) in the TUI: a banner on
    the title bar names the rank and unit on every view, and ZD013 is the first finding."""
    from zerodoc.sources import open_source
    from zerodoc.tui.app import ZerodocApp
    from zerodoc.testing.textshot import screen_text

    run = Path(__file__).parent / "data" / "scenarios" / "hung-rank"
    app = ZerodocApp(open_source(str(run)), refresh=None)
    async with app.run_test(size=(160, 40)) as pilot:
        await until(pilot, lambda: app.frame is not None, 30, "the first frame")
        await pilot.pause()
        assert app.frame is not None and app.frame.findings[0].code == "ZD013"
        for key in ("1", "2", "3", "4"):
            await pilot.press(key)
            await pilot.pause()
            text = screen_text(app)
            assert "STOPPED: rank 1 stopped first: stuck in blocks.2" in text, (key, text[:600])
            if key == "3":  # the findings view: ZD013 first, in detail
                assert "CRITICAL  ZD013" in text and "evidence    unit = blocks.2" in text, text


def test_an_integration_exception_record_is_a_failure():
    """A trainer integration records `{"type": "exception"}` when training raised (and may
    still close cleanly): the rank counts as failed, named with the error."""
    from zerodoc.diagnosis import diagnose
    from zerodoc.testing.rulecases import snapshot_from_dict
    from zerodoc.stalls import last_stall

    rec = last_stall([{"type": "stall", "state": "resumed", "since_unix": 1.0},
                      {"type": "exception", "end_unix": 50.0, "step": 7, "integration": "hf",
                       "error": "OutOfMemoryError", "message": "CUDA out of memory"}])
    snap = snapshot_from_dict({"units": [{"name": "(root)", "params": 1000}],
                               "ranks": [{"steps": 7, "updated_unix": 40.0}] * 2,
                               "ended_ranks": [0, 1], "stalls": {"1": rec}})
    f = diagnose(snap)[0]
    assert f.code == "ZD013" and f.evidence["rank"] == 1 and f.evidence["state"] == "failed"
    assert "OutOfMemoryError: CUDA out of memory" in f.title


# --- placement on the default's steps without per-unit detail; a SIGTERM (issue 32) -----------

def _no_zerodoc_frame(rec: dict) -> bool:
    """The record was placed without a zerodoc wrapper on the stack (a step without
    per-unit detail): what the test means to exercise."""
    return not any("/zerodoc/shim/" in line for line in rec.get("stack", ()))


# prefetch: FSDP2's async unshard (explicit prefetch), whose all-gather wait is a C++
# `Work.wait()` inside `FSDPParamGroup.wait_for_unshard`: no torch.distributed frame on the
# stack; the waiting rank read as "compute", so it was named as stopped first
@pytest.mark.parametrize("prefetch", [False, True], ids=["sync", "prefetch"])
def test_a_preempted_rank_is_named_terminated_and_the_peer_waiting(tmp_path, prefetch):
    """SIGTERM to rank 1 (a preemption) on default detail: rank 1 records where it was and
    ends its log "terminated", then dies by the signal; rank 0 fails in its next collective.
    ZD013 names rank 1, terminated, and rank 0 waiting in a collective; it never calls rank
    1 killed or crashed (before: no record, "(killed, crashed, or hung ...)")."""
    run = tmp_path / "preempted"
    job = stops.launch(run, model={"prefetch": prefetch})
    try:
        wait_for(lambda: sum(r.get("type") == "step" for r in lines_of(run, 1)) >= 5, 180,
                 "rank 1's 5th step", job)
        os.kill(job.procs[1].pid, signal.SIGTERM)
        codes = job.wait(60)
    finally:
        job.stop(grace=1)
    assert codes[1] == -signal.SIGTERM and codes[0] != 0, codes
    ends = [x for x in lines_of(run, 1) if x["type"] == "end"]
    assert len(ends) == 1 and ends[0].get("terminated") is True, ends
    term = [x for x in lines_of(run, 1) if x["type"] == "stall"]  # (a slow warm-up: a stall)
    assert [x["state"] for x in term].count("terminated") == 1, term
    assert term[-1]["state"] == "terminated" and term[-1]["signal"] == "SIGTERM", term
    waited = [x for x in lines_of(run, 0) if x["type"] == "stall"][-1]
    assert waited["state"] == "failed" and waited["collective"] in ("all_gather",
                                                                     "reduce_scatter"), waited
    out = report(run, "--json")
    assert out.returncode == 0, out.stderr
    top = json.loads(out.stdout)["findings"][0]
    assert top["code"] == "ZD013" and top["severity"] == "critical", top
    ev = top["evidence"]
    assert (ev["rank"], ev["state"], ev["signal"]) == (1, "terminated", "SIGTERM"), ev
    assert ev["waiting_ranks"] == [0], ev
    assert "rank 1 stopped first: terminated by SIGTERM" in top["title"], top["title"]
    assert "killed" not in top["title"] and "crashed" not in top["title"], top["title"]


# framework, model, the unit rank 0 waits in: FSDP2 with prefetch waits for the unit its
# prefetch asked for (blocks.3: blocks.2's pre-forward issued it on rank 0 only), inside
# `wait_for_unshard` (before: rank 0 read "compute" and was listed as stopped on its own);
# FSDP1 (no prefetch) in the next unit's all-gather (its handle as the frame's unit; the
# FSDP wrapper's own forward frame must not make rank 1's raise "the framework's hooks");
# DeepSpeed ZeRO-3 in the next unit's fetch, waiting in `AllGatherCoalescedHandle.wait`
# (before: rank 1 read "(outside the sharded units) (optimizer...)", rank 0 not waiting)
@pytest.mark.parametrize("framework,model,waits_in", [
    ("fsdp2", {"prefetch": True}, "blocks.3"), ("fsdp1-full", {}, "blocks.2"),
    ("deepspeed-3", {}, "blocks.2")], ids=["fsdp2-prefetch", "fsdp1", "deepspeed-3"])
def test_a_raise_in_a_units_forward_is_placed_there_on_a_step_without_detail(
        tmp_path, request, framework, model, waits_in):
    """A layer of `blocks.1` raises in forward on rank 1, on a step without per-unit detail
    (the job waits for one): rank 1 failed in blocks.1, forward, in compute; rank 0 waits
    for it in an all-gather, placed from the frames alone."""
    if framework.startswith("deepspeed"):
        request.getfixturevalue("ds_ready")  # its comm op built once, not by both ranks
    run = tmp_path / "raised"
    job = stops.launch(run, model=model, framework=framework,
                       **{"raise": {"rank": 1, "module": "blocks.1.fc1", "at_step": 5}})
    try:
        codes = job.wait(180)
    finally:
        job.stop(grace=1)
    assert codes[0] != 0 and codes[1] != 0, codes
    own = [x for x in lines_of(run, 1) if x["type"] == "stall"][-1]
    peer = [x for x in lines_of(run, 0) if x["type"] == "stall"][-1]
    assert "injected failure in blocks.1.fc1" in own["error"], own
    assert _no_zerodoc_frame(own) and _no_zerodoc_frame(peer), (own["stack"], peer["stack"])
    assert (own["unit"], own["phase"], own["in"], own["collective"]) == \
        ("blocks.1", "forward", "compute", ""), own
    assert (peer["unit"], peer["phase"], peer["in"], peer["collective"]) == \
        (waits_in, "forward", "collective", "all_gather"), peer
    out = report(run, "--json")
    assert out.returncode == 0, out.stderr
    top = json.loads(out.stdout)["findings"][0]
    ev = top["evidence"]
    assert top["code"] == "ZD013" and (ev["rank"], ev["unit"], ev["phase"]) == \
        (1, "blocks.1", "forward"), ev
    assert ev["waiting_ranks"] == [0] and ev["waiting"][0]["collective"] == "all_gather", ev


def test_a_peer_waiting_on_an_async_unshard_is_placed_in_its_all_gather(tmp_path):
    """Rank 1 of 2 blocks forever in `blocks.2`'s forward from step 6 on a step without
    per-unit detail (after FSDP's pre-forward, which prefetched `blocks.3`), FSDP2 with
    prefetch (async unshard), default detail: rank 0 finishes its forward (`blocks.3`'s
    all-gather was issued by both ranks) and waits in the root's backward all-gather (the
    demo's root reshards after forward; nothing prefetches it), inside `wait_for_unshard`: a
    C++ `Work.wait()`, no torch.distributed frame. Its stall record names that collective, so
    ZD013 lists rank 0 as waiting (before: it read "compute" and was named a stopped rank of
    its own)."""
    run = tmp_path / "hung-async"
    job = stops.launch(run, model={"prefetch": True},
                       hang={"rank": 1, "module": "blocks.2", "at_step": 6})

    def stuck(rank: int) -> list[dict]:  # stalls of the hang's step (a slow warm-up is one)
        return [x for x in lines_of(run, rank) if x.get("type") == "stall"
                and x["state"] == "stuck" and x["step"] >= 6]
    try:
        wait_for(lambda: stuck(0) and stuck(1), 180, "both ranks stuck at the hang", job)
        out = report(run, "--json")
    finally:
        job.stop(grace=1)
    peer = stuck(0)[-1]
    assert _no_zerodoc_frame(peer), peer["stack"]
    assert (peer["in"], peer["collective"], peer["unit"], peer["phase"]) == \
        ("collective", "all_gather", "(root)", "backward"), peer
    assert out.returncode == 0, out.stderr
    ev = json.loads(out.stdout)["findings"][0]["evidence"]
    assert (ev["rank"], ev["unit"], ev["phase"]) == (1, "blocks.2", "forward"), ev
    assert ev["waiting_ranks"] == [0] and ev["also_stopped_ranks"] == [], ev
