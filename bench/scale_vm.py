"""The shipped rules and queries on VictoriaMetrics at N ranks: prints one JSON object.

    python bench/scale_vm.py --ranks 1024 --minutes 6     # under flock, see docs/operations.md

N synthetic ranks (bench/rankfarm.py: the real 81-unit pages of tests/data/pages, labels
rewritten, counters advancing by whole copies of the template every scrape interval) are
scraped every `--scrape-interval` by vmagent, which remote-writes them into a VictoriaMetrics
single node; vmalert evaluates the shipped rule files (rules/*.yml, as zerodoc stack gives
them: zerodoc.ops.stack.vmalert_rules) against it,
every group at its own interval (the global one `--scrape-interval`), and writes the recorded
series back. After `--minutes` the bench reads:

- per rule group, from vmalert itself: the last iteration's duration (the longest of its
  rules' evaluationTime in /api/v1/rules) and the mean / p50 / p99 of all iterations
  (`vmalert_iteration_duration_seconds`) against the group's interval, iterations run and
  missed (`vmalert_iteration_missed_total`) and its rules in error;
- the store's series (`/api/v1/status/tsdb` totalSeries), samples ingested per second
  (`vm_rows_inserted_total` over the run), and the resident memory (now and peak) of
  VictoriaMetrics, vmagent and vmalert from /proc;
- the wall time of every dashboard panel query (dashboards/*.json, variables as the bench
  for Prometheus substitutes them), of `zerodoc report` (a snapshot of the Prometheus source,
  cumulative and 20-step window) and of a TUI's first and next refreshes.

Each figure says what it covers; a query that failed is listed with its error, never timed.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.rankfarm import RankFarm, shipped_pages  # noqa: E402
from bench.scale_prom import _peak, _queries, _rss, _subst  # noqa: E402
from zerodoc.ops.stack import VM_LATENCY_OFFSET, vmalert_rules  # noqa: E402


def _get(url: str, timeout: float = 120) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read()


def _free_port() -> int:
    from zerodoc.demo.launch import free_port

    return free_port()


def _spawn(tmp: Path, name: str, argv: list[str]) -> subprocess.Popen:
    return subprocess.Popen(argv, stdout=open(tmp / f"{name}.log", "w"),
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def _wait_ready(url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if _get(f"{url}/-/ready", 2):
                return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"{url} not ready in {timeout:.0f} s")


def _metrics(url: str) -> list[tuple[str, dict, float]]:
    out = []
    for line in _get(f"{url}/metrics").decode().splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, v = line.rpartition(" ")
        name, _, rest = head.partition("{")
        labels = dict(re.findall(r'(\w+)="([^"]*)"', rest))
        try:
            out.append((name, labels, float(v)))
        except ValueError:
            pass
    return out


def _groups(rules_url: str, metrics: list) -> dict:
    """Per rule group: interval, last / mean duration, iterations, missed (vmalert's own)."""
    info = json.loads(_get(f"{rules_url}/api/v1/rules"))["data"]["groups"]
    out = {}
    for g in info:
        name = g["name"]
        sel = [(n, lab, v) for n, lab, v in metrics if lab.get("group") == name]

        def one(metric: str, **want) -> float | None:
            vals = [v for n, lab, v in sel if n == metric and
                    all(lab.get(k) == x for k, x in want.items())]
            return sum(vals) if vals else None

        runs, total = one("vmalert_iteration_duration_seconds_count"), \
            one("vmalert_iteration_duration_seconds_sum")
        rules = g.get("rules", [])
        slow = sorted(((float(r.get("evaluationTime") or 0), r["name"]) for r in rules),
                      reverse=True)
        out[name] = {
            "interval_s": g.get("interval"),
            "rules": len(rules),
            # vmalert 1.79's per-rule evaluationTime add up to more than an iteration (not
            # each rule's own): the longest is taken as the last iteration's duration
            "last_duration_s": round(slow[0][0], 3) if slow else None,
            "iterations": runs,
            "missed": one("vmalert_iteration_missed_total"),
            "duration_mean_s": round(total / runs, 3) if runs else None,
            "duration_p50_s": one("vmalert_iteration_duration_seconds", quantile="0.5"),
            "duration_p99_s": one("vmalert_iteration_duration_seconds", quantile="0.99"),
            "rule_errors": sum(1 for r in rules if r.get("lastError")),
        }
        worst = max(x for x in (out[name]["duration_p99_s"], out[name]["last_duration_s"])
                    if x is not None)
        out[name]["within_half_interval"] = bool(g.get("interval")) and \
            worst <= g["interval"] / 2
    return out


def _time_queries(url: str, at: float) -> dict:
    rows, failed = [], []
    for title, expr in _queries():
        q = urllib.parse.urlencode({"query": _subst(expr), "time": f"{at:.3f}"})
        t = time.perf_counter()
        try:
            _get(f"{url}/api/v1/query?{q}", 300)
        except Exception as e:  # noqa: BLE001 - reported, not timed
            failed.append({"query": title, "error": str(e)[:200]})
            continue
        rows.append((time.perf_counter() - t, title))
    rows.sort(reverse=True)
    walls = [w for w, _ in rows]
    return {"count": len(rows), "slowest": [{"query": t, "s": round(w, 3)} for w, t in rows[:5]],
            "median_s": round(statistics.median(walls), 4) if walls else None,
            "over_5s": sum(1 for w in walls if w > 5), "failed": failed}


def _source_times(url: str) -> dict:
    from zerodoc.sources import PrometheusSource

    out = {}
    for label, window in (("report_cumulative_s", None), ("report_20_steps_s", 20)):
        t = time.perf_counter()
        try:
            PrometheusSource(url, window=window).snapshot()
            out[label] = round(time.perf_counter() - t, 2)
        except Exception as e:  # noqa: BLE001
            out[label] = f"failed: {str(e)[:200]}"
    src = PrometheusSource(url, window=20)
    t = time.perf_counter()
    try:
        src.snapshot()
        out["tui_first_refresh_s"] = round(time.perf_counter() - t, 2)
        later = []
        for _ in range(3):
            t = time.perf_counter()
            src.snapshot()
            later.append(time.perf_counter() - t)
        out["tui_next_refresh_s_median_of_3"] = round(statistics.median(later), 2)
    except Exception as e:  # noqa: BLE001
        out["tui"] = f"failed: {str(e)[:200]}"
    return out


def run(ranks: int, minutes: float, interval_s: int) -> dict:
    vm_bin = {b: shutil.which(b) for b in ("victoria-metrics", "vmagent", "vmalert")}
    if not all(vm_bin.values()):
        raise SystemExit("victoria-metrics, vmagent, vmalert not installed (make prometheus)")
    tmp = Path(tempfile.mkdtemp(prefix="zerodoc-scale-vm-"))
    procs: dict[str, subprocess.Popen] = {}
    result: dict = {"engine": "VictoriaMetrics 1.79.5 (Debian) + vmagent + vmalert",
                    "ranks": ranks, "units": 81, "scrape_interval_s": interval_s,
                    "minutes": minutes, "rule_files": "rules/*.yml as shipped, through "
                                                  "zerodoc.ops.stack.vmalert_rules"}
    try:
        with RankFarm(shipped_pages(), ranks, run_id="bench", period_s=interval_s) as farm:
            sd = farm.file_sd(tmp / "file_sd")
            vm_port, ag_port, al_port = _free_port(), _free_port(), _free_port()
            vm = f"http://127.0.0.1:{vm_port}"
            (tmp / "vmagent.yml").write_text(json.dumps({
                "global": {"scrape_interval": f"{interval_s}s"},
                "scrape_configs": [{"job_name": "zerodoc", "honor_labels": True,
                                    "file_sd_configs": [{"files": [str(sd)]}]}]}))
            procs["victoria-metrics"] = _spawn(tmp, "vm", [
                vm_bin["victoria-metrics"], f"-storageDataPath={tmp / 'vmdata'}",
                f"-httpListenAddr=127.0.0.1:{vm_port}", f"-search.latencyOffset={VM_LATENCY_OFFSET}",
                "-search.maxUniqueTimeseries=10000000"])
            _wait_ready(vm)
            procs["vmagent"] = _spawn(tmp, "vmagent", [
                vm_bin["vmagent"], f"-promscrape.config={tmp / 'vmagent.yml'}",
                f"-remoteWrite.url={vm}/api/v1/write", f"-httpListenAddr=127.0.0.1:{ag_port}",
                f"-remoteWrite.tmpDataPath={tmp / 'vmagent-queue'}"])
            # as zerodoc stack gives them to vmalert (zerodoc.ops.stack.vmalert_rules says why)
            rules = vmalert_rules(sorted((ROOT / "rules").glob("*.yml")), tmp / "vmalert-rules")
            procs["vmalert"] = _spawn(tmp, "vmalert", [
                vm_bin["vmalert"], *[f"-rule={r}" for r in rules], f"-datasource.url={vm}",
                f"-remoteWrite.url={vm}", f"-evaluationInterval={interval_s}s",
                "-notifier.url=http://127.0.0.1:9", f"-httpListenAddr=127.0.0.1:{al_port}"])
            start = time.time()
            rows0 = None
            deadline = time.monotonic() + minutes * 60
            while time.monotonic() < deadline:
                dead = [n for n, p in procs.items() if p.poll() is not None]
                if dead:
                    raise RuntimeError(f"{dead} exited: " + (tmp / "vm.log").read_text()[-800:])
                if rows0 is None:
                    try:
                        rows0 = (time.time(), sum(v for n, _l, v in _metrics(vm)
                                                  if n == "vm_rows_inserted_total"))
                    except OSError:
                        pass
                time.sleep(5)
            m_vm, m_al = _metrics(vm), _metrics(f"http://127.0.0.1:{al_port}")
            rows1 = (time.time(), sum(v for n, _l, v in m_vm if n == "vm_rows_inserted_total"))
            if rows0:
                result["samples_per_s_ingested"] = round(
                    (rows1[1] - rows0[1]) / (rows1[0] - rows0[0]))
            tsdb = json.loads(_get(f"{vm}/api/v1/status/tsdb"))["data"]
            result["series_total"] = tsdb.get("totalSeries")
            result["farm_scrapes"] = farm.scrapes
            result["rule_groups"] = _groups(f"http://127.0.0.1:{al_port}", m_al)
            result["rss_bytes"] = {n: _rss(p.pid) for n, p in procs.items()}
            result["queries"] = _time_queries(vm, time.time() - 10)
            result["source"] = _source_times(vm)
            result["peak_rss_bytes"] = {n: _peak(p.pid) for n, p in procs.items()}
            result["wall_s"] = round(time.time() - start, 1)
    finally:
        _stop(procs, 30)
        shutil.rmtree(tmp, ignore_errors=True)
    return result


def _stop(procs: dict, timeout_s: float) -> None:
    """Terminate every server started, then wait for each (killed past `timeout_s`)."""
    for p in procs.values():
        if p.poll() is None:
            p.terminate()
    for p in procs.values():
        try:
            p.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            p.kill()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=32)
    ap.add_argument("--minutes", type=float, default=4.0,
                    help="how long the rules run before the figures are read")
    ap.add_argument("--scrape-interval", type=int, default=15, help="seconds")
    a = ap.parse_args()
    print(json.dumps(run(a.ranks, a.minutes, a.scrape_interval), indent=1))


if __name__ == "__main__":
    main()
