"""The shim: exporter (real scrape + promtool), run log, ports, fail-soft, import hygiene."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import urllib.request
import warnings

import pytest
import torch
import torch.nn as nn

import zerodoc
from zerodoc import catalog
from zerodoc.runlog import RunLogError, load_run, read_rank_log
from tests.support.helpers import LiveDemo, detail_steps, run_demo, wait_until
from tests.support.promserver import require_binary


def scrape(endpoint: str) -> str:
    with urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=10) as r:
        return r.read().decode()


# --- a live 2-rank job: real scrape --------------------------------------------------------

@pytest.fixture(scope="module")
def live(tmp_path_factory):
    # one run-log interval for the whole job: the detail files keep every step (the
    # counters test sums them from step 1; the default 100-step interval drops older ones)
    with LiveDemo(tmp_path_factory.mktemp("live"), nprocs=2,
                  attach={"run_log_every": 10**6, "run_log_every_seconds": 1e6}) as demo:
        demo.wait_steps(3)
        yield demo


def test_each_rank_serves_its_own_metrics_on_loopback(live):
    assert len(set(live.endpoints)) == 2
    for rank, ep in enumerate(live.endpoints):
        assert ep.startswith("127.0.0.1:")
        text = scrape(ep)
        assert f'zerodoc_last_step{{local_rank="{rank}",node=' in text
        assert f'rank="{rank}"' in text


def test_scrape_passes_promtool_check_metrics(live):
    promtool = require_binary("promtool")
    text = scrape(live.endpoints[0])
    res = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                         text=True, timeout=30)
    assert res.returncode == 0, res.stdout + res.stderr


def test_scrape_uses_only_catalogued_names_with_bounded_labels(live):
    from prometheus_client.parser import text_string_to_metric_families

    names = catalog.all_series_names()
    allowed_labels = set(catalog.RANK_LABELS) | {l for m in catalog.CATALOG for l in m.labels} \
        | {"le"}
    seen = set()
    for fam in text_string_to_metric_families(scrape(live.endpoints[1])):
        for s in fam.samples:
            assert s.name in names, s.name
            assert set(s.labels) <= allowed_labels, (s.name, s.labels)
            seen.add(s.name)
    # The core per-unit series are there; the run's per-unit facts come from rank 0 only.
    for must in ("zerodoc_collective_exposed_seconds_total", "zerodoc_compute_seconds_total",
                 "zerodoc_step_duration_seconds_bucket", "zerodoc_memory_bytes",
                 "zerodoc_run_info"):
        assert must in seen, must
    assert "zerodoc_unit_parameter_bytes" not in seen
    assert "zerodoc_unit_parameter_bytes" in scrape(live.endpoints[0])


def test_counters_grow_and_match_the_run_log(live):
    from prometheus_client.parser import text_string_to_metric_families

    def exposed_total(text):
        tot = {}
        for fam in text_string_to_metric_families(text):
            if fam.name == "zerodoc_collective_exposed_seconds":
                for s in fam.samples:
                    tot[(s.labels["unit"], s.labels["phase"], s.labels["collective"])] = s.value
            if fam.name == "zerodoc_last_step":
                tot["step"] = fam.samples[0].value
        return tot

    a = exposed_total(scrape(live.endpoints[0]))
    # the per-unit counters grow on sampled steps only (the default's detail steps): wait
    # for one after the scraped step, then for a step past it (the page is rendered anew at
    # every step end)
    sampled: list = []

    def sampled_after() -> bool:
        log = read_rank_log(live.run_dir / "rank-00000.jsonl")
        sampled[:] = [s.step for s in log.steps if s.detail and s.step > a["step"]]
        return bool(sampled)

    wait_until(sampled_after, 120, "a sampled step after the first scrape", interval=0.3)
    live.wait_steps(sampled[0] + 1)
    b = exposed_total(scrape(live.endpoints[0]))
    assert b["step"] > a["step"]
    assert all(b[k] >= a[k] for k in a)
    assert sum(v for k, v in b.items() if k != "step") > sum(v for k, v in a.items() if k != "step")
    # The counters equal the sum over the run log's steps up to the scraped step. One scrape
    # is not atomic with the training thread (a step can end between its samples: the
    # counter then holds one step more than `zerodoc_last_step` says), and the run log
    # trails the scrape: wait for a scrape whose step the log holds and whose counter
    # equals the log's sum (a counter that never matches the log fails on the deadline).
    key = ("blocks.1", "forward", "all_gather")
    last: dict = {}

    def agrees():
        c = exposed_total(scrape(live.endpoints[0]))
        live.wait_steps(int(c["step"]) + 1)
        log = read_rank_log(live.run_dir / "rank-00000.jsonl")
        assert log.steps and log.steps[0].step == 1, \
            "the run log's detail no longer holds step 1: the sum cannot cover the counter"
        # the counter adds the sampled steps' (the default's detail steps) exposed time
        want = sum(s.comm[key].exposed_seconds for s in log.steps
                   if s.step <= c["step"] and s.detail)
        last["pair"] = (c["step"], c[key], want)
        return c[key] == pytest.approx(want, rel=1e-9)

    try:
        wait_until(agrees, 60, "a scrape whose counter equals the run log's sum", interval=0.2)
    except AssertionError as e:
        raise AssertionError(f"{e}; last (step, served, run log): {last.get('pair')}") from None


# --- run log ---------------------------------------------------------------------------------

@pytest.mark.slow
def test_run_log_round_trips(tmp_path):
    """In the default (adaptive) detail: a step without per-unit detail reads back with its
    per-unit-derived totals unknown (None), a detail step with the numbers written."""
    logs = run_demo(tmp_path, "rt", nprocs=2, steps=4)
    raw = (tmp_path / "rt" / "rank-00001.jsonl").read_text().splitlines()
    header = json.loads(raw[0])
    assert header["type"] == "header" and header["rank"] == 1 and header["world_size"] == 2
    assert header["schema"] == 3 and header["segment"] == 0  # compact columns (issue 33)
    steps = [json.loads(line) for line in raw[1:] if json.loads(line)["type"] == "step"]
    assert [s["step"] for s in steps] == [1, 2, 3, 4]
    assert not any("comm" in s for s in steps)  # step lines: totals only
    detail = (tmp_path / "rt" / "detail" / "00001-a.jsonl").read_text().splitlines()
    full = [json.loads(line) for line in detail[1:]]
    assert [s["step"] for s in full] == [1, 2, 3, 4]
    log = logs[1]
    assert log.ended and log.bad_lines == 0
    # Parsed numbers equal the raw JSON numbers, row by row.
    names = [u["name"] for u in header["units"]]
    assert any(s["detail"] for s in steps), steps  # steps 2-3 at least (docs/gpus.md)
    for light, rec, parsed in zip(steps, full, log.steps):
        assert parsed.step_seconds == rec["step_s"] == light["step_s"]
        assert bool(rec["comm"]) == light["detail"], (light, rec)
        for u, phase, coll, n, b, s, ex, hid in rec["comm"]:
            t = parsed.comm[(names[u], phase, coll)]
            assert (t.count, t.bytes, t.seconds, t.exposed_seconds) == (n, b, s, ex)
        if not light["detail"]:  # not measured: unknown, never 0
            assert light["exposed_s"] is None and parsed.exposed_seconds is None
            continue
        assert light["exposed_s"] == pytest.approx(parsed.exposed_seconds, rel=1e-12)
    # Totals over the window are the sums of the steps.
    snap = load_run(tmp_path / "rt", window=None)
    w = snap.ranks[1]
    assert w.steps == 4 and w.step_seconds == pytest.approx(sum(s["step_s"] for s in steps))


@pytest.mark.slow
def test_crashed_job_keeps_completed_steps_and_torn_line_is_skipped(tmp_path):
    logs = run_demo(tmp_path, "crash", nprocs=2, steps=3)
    path = tmp_path / "crash" / "rank-00000.jsonl"
    lines = path.read_text().splitlines()
    # Simulate a crash mid-write of step 3: no per-unit lines and no end (a clean close
    # writes them), step 3 torn in half in the log and in the detail file.
    keep = [x for x in lines if json.loads(x)["type"] in ("header", "step")]
    path.write_text("\n".join(keep[:-1]) + "\n" + keep[-1][: len(keep[-1]) // 2])
    det = tmp_path / "crash" / "detail" / "00000-a.jsonl"
    dl = det.read_text().splitlines()
    det.write_text("\n".join(dl[:-1]) + "\n" + dl[-1][: len(dl[-1]) // 2])
    log = read_rank_log(path)
    assert [s.step for s in log.totals] == [1, 2] and [s.step for s in log.steps] == [1, 2]
    assert log.bad_lines == 2 and not log.ended
    snap = load_run(tmp_path / "crash", window=None, stale_after_s=0)
    assert snap.ranks[0].steps == 2 and snap.stale_ranks == {0} and snap.ended_ranks == {1}
    assert logs[0].ended


def test_malformed_run_logs_give_clear_errors(tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "rank-00000.jsonl").write_text("this is not json\n")
    with pytest.raises(RunLogError, match="not JSON"):
        load_run(bad)
    (bad / "rank-00000.jsonl").write_text('{"type": "header", "schema": 99}\n')
    with pytest.raises(RunLogError, match="schema 99"):
        load_run(bad)
    with pytest.raises(RunLogError, match="no run directory"):
        load_run(tmp_path / "missing")


# --- ports ---------------------------------------------------------------------------------

def test_port_in_use_falls_back_with_a_warning(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        model = nn.Linear(4, 4)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            mon = zerodoc.attach(model, None, port=busy, run_dir=str(tmp_path / "p"))
        try:
            assert mon.endpoint is not None and mon.endpoint != f"127.0.0.1:{busy}"
            assert any("in use" in str(x.message) for x in w)
            assert "zerodoc_last_step" in scrape(mon.endpoint)
        finally:
            mon.close()


# --- single process, no process group, no FSDP ---------------------------------------------

def test_single_process_without_process_group(tmp_path):
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        mon = zerodoc.attach(model, port=False, run_dir=str(tmp_path / "single"))
    assert any("no sharded units" in str(x.message) for x in w)
    with mon:
        for _ in range(3):
            model(torch.randn(4, 8)).sum().backward()
            mon.step()
    log = read_rank_log(tmp_path / "single" / "rank-00000.jsonl")
    assert log.facts.framework == "none" and log.facts.world_size == 1
    assert [s.step for s in log.steps] == [1, 2, 3] and log.ended
    assert all(s.step_seconds > 0 for s in log.steps)
    assert log.steps[-1].memory["sharded_parameters"] == sum(
        p.numel() * 4 for p in model.parameters())


def test_unknown_option_is_a_clear_error():
    with pytest.raises(TypeError, match="unknown option"):
        zerodoc.attach(nn.Linear(2, 2), prot=9000)


def test_disabled_is_a_noop(monkeypatch, tmp_path):
    monkeypatch.setenv("ZERODOC_DISABLE", "1")
    mon = zerodoc.attach(nn.Linear(2, 2), run_dir=str(tmp_path / "off"))
    mon.step()
    mon.close()
    assert not (tmp_path / "off").exists()


# --- never change training; fail soft ------------------------------------------------------

@pytest.mark.slow
def test_losses_identical_with_and_without_instrumentation(tmp_path):
    losses = {}
    for name, attach in (("on", {"run_dir": str(tmp_path / "on")}),
                         ("off", {"enabled": False})):
        run_demo(tmp_path, name, nprocs=2, steps=4, attach=attach, read_logs=name == "on",
                 extra={"losses_file": str(tmp_path / f"losses-{name}")})
        losses[name] = [json.loads((tmp_path / f"losses-{name}.{r}").read_text())
                        for r in range(2)]
    assert losses["on"] == losses["off"]  # bitwise: same floats


@pytest.mark.slow
def test_missing_hook_points_fail_soft(tmp_path):
    """Break a private hook point on purpose: the job still trains, the header says which
    hook is missing, and what still works is still measured."""
    logs = run_demo(tmp_path, "broken", nprocs=2, steps=3,
                    extra={"break_hooks": ["zerodoc.shim.fsdp2._wrap_backward"]})
    log = logs[0]
    assert log.facts.hooks["FSDPParamGroup.pre_backward/post_backward"] != "ok"
    assert len(log.steps) == 3
    s = detail_steps(log)[-1]
    assert s.comm[("blocks.0", "forward", "all_gather")].count == 1
    assert ("blocks.0", "backward") not in s.compute  # not measurable without the hook


@pytest.mark.slow
def test_close_restores_fsdp(tmp_path):
    logs = run_demo(tmp_path, "restore", nprocs=2, steps=2,
                    extra={"check_restore": True})
    assert logs[0].ended


# --- import hygiene ------------------------------------------------------------------------

@pytest.mark.slow
def test_follower_keeps_a_bounded_number_of_steps(tmp_path):
    from zerodoc.runlog import RunFollower

    run_demo(tmp_path, "keep", nprocs=2, steps=6)
    f = RunFollower(tmp_path / "keep", keep=2)
    new = f.poll()
    assert len(new) == 12  # every new record is still handed out once ...
    assert [s.step for s in f.logs[0].steps] == [5, 6]  # ... but only the last 2 are kept
    assert f.poll() == []


def test_ctrl_c_through_close_is_a_clean_user_stop(tmp_path, monkeypatch):
    """A KeyboardInterrupt ending the training (Ctrl-C; torchrun forwards SIGINT) is the user
    stopping the run, not a failure: the end record says "interrupted", no failed stall is
    recorded, the file_sd target goes, and the run reads as ended cleanly. The trainer
    integrations' close does the same (no `exception` record for it)."""
    from zerodoc.integrations.common import close as integration_close
    from zerodoc.runlog import load_run

    monkeypatch.delenv("ZERODOC_FILE_SD_DIR", raising=False)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    for name in ("with", "integration"):
        run = tmp_path / name
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mon = zerodoc.attach(model, port=0, run_dir=str(run))
        target = list((run / "file_sd").glob("*.json"))
        assert len(target) == 1
        try:
            with mon if name == "with" else contextlib.nullcontext():
                for _ in range(2):
                    model(torch.randn(4, 8)).sum().backward()
                    mon.step()
                raise KeyboardInterrupt
        except KeyboardInterrupt as e:
            if name == "integration":
                integration_close(mon, "lightning", e)
        last = json.loads((run / "rank-00000.jsonl").read_text().splitlines()[-1])
        assert last["type"] == "end" and last.get("interrupted") is True, (name, last)
        assert "failed" not in last and not target[0].exists(), name
        text = (run / "rank-00000.jsonl").read_text()
        assert '"state":"failed"' not in text and '"type":"exception"' not in text, name
        snap = load_run(run, window=None)
        assert snap.ended_ranks == snap.interrupted_ranks == {0}, name
