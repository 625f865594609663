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
  missed (`vmalert_iteration_missed_total`; `missed_at_s`: when, polled every 5 s), its
  costliest rules in the last iteration and its rules in error (with the errors);
- vmalert's remote-write counters (rows sent, dropped, errors) and the store's own slowest
  queries by total time (`/api/v1/status/top_queries`);
- the store's series (`/api/v1/status/tsdb` totalSeries), samples ingested per second
  (`vm_rows_inserted_total` over the run), and the resident memory (now and peak) of
  VictoriaMetrics, vmagent and vmalert from /proc;
- the wall time of every dashboard panel query (dashboards/*.json, variables as the bench
  for Prometheus substitutes them), of `zerodoc report` (a snapshot of the Prometheus source,
  cumulative and 20-step window) and of a TUI's first and next refreshes, each with where its
  per-unit numbers came from (the rules' series or every rank's raw ones), its query count
  and its slowest queries.

Each figure says what it covers; a query that failed is listed with its error, never timed.
`--unit-interval 1m` evaluates the per-unit groups more often (their 4m window unchanged: more
evaluations in a short run). Stopped by `timeout`, it prints what it has read
(`"interrupted"`) after stopping its servers.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.rankfarm import RankFarm, shipped_pages  # noqa: E402
from bench.scale_prom import _peak, _queries, _rss, _subst  # noqa: E402
from zerodoc.ops.stack import (  # noqa: E402
    VM_LATENCY_OFFSET, VM_SERVE_FLAGS, VMALERT_WRITE_FLAGS, vmalert_rules,
)


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
            "slowest_rules": _rule_costs(rules)[:4],
        }
        errs = sorted({r["lastError"][:160] for r in rules if r.get("lastError")})
        if errs:
            out[name]["errors"] = errs[:3]
        worst = max(x for x in (out[name]["duration_p99_s"], out[name]["last_duration_s"])
                    if x is not None)
        out[name]["within_half_interval"] = bool(g.get("interval")) and \
            worst <= g["interval"] / 2
    return out


def _note_missed(rules_url: str, start: float, missed: dict) -> None:
    """Per group, the seconds into the run at which vmalert's missed iterations grew (polled):
    a miss while the store registers the farm's first 1-2 M series is not a steady one."""
    try:
        now = _metrics(rules_url)
    except OSError:
        return
    for n, lab, v in now:
        if n == "vmalert_iteration_missed_total":
            seen = missed.setdefault(lab.get("group", "?"), [])
            while len(seen) < v:
                seen.append(round(time.time() - start))


def _remote_write(metrics: list) -> dict:
    """vmalert's remote-write counters (rows sent, dropped, errors: a recorded series that
    did not fit its queue, -remoteWrite.maxQueueSize, never reaches the store)."""
    out: dict = {}
    for n, _lab, v in metrics:
        if "remotewrite" in n and not n.endswith(("_bucket", "_sum", "_count")):
            out[n] = out.get(n, 0) + v
    return out


def _top_queries(url: str) -> list:
    """The store's own slowest queries by total time (/api/v1/status/top_queries)."""
    try:
        data = json.loads(_get(f"{url}/api/v1/status/top_queries?topN=6&maxLifetime=1h"))
    except (OSError, ValueError) as e:
        return [f"unavailable: {e}"]
    return [{"query": q.get("query", "")[:160], "count": q.get("count"),
             "avg_s": q.get("avgDurationSeconds"), "sum_s": q.get("sumDurationSeconds")}
            for q in data.get("topBySumDuration", [])]


def _rule_costs(rules: list) -> list:
    """The group's costliest rules in its last iteration: vmalert 1.79's evaluationTime of a
    rule is the time from the iteration's start to the rule's end (they grow in file order),
    so a rule's own cost is its step over the rule before it."""
    ends = [float(r.get("evaluationTime") or 0) for r in rules]
    own = [(round(e - b, 3), r["name"]) for r, b, e in zip(rules, [0.0, *ends], ends)]
    return [{"rule": n, "s": t} for t, n in sorted(own, reverse=True)]


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


def _timed_source(url: str, window):
    """A PrometheusSource that notes each query's wall time (`.timed`: [(s, expr, thread)]:
    the source's query threads are named after their caller, so a refresh's own queries
    tell apart from the background per-unit stats')."""
    from zerodoc.sources import PrometheusSource

    class Timed(PrometheusSource):
        def _get(self, path, **kw):  # every request: the queries and the build info
            t = time.perf_counter()
            try:
                return super()._get(path, **kw)
            finally:
                self.timed.append((time.perf_counter() - t, kw.get("query", path),
                                   threading.current_thread().name))

    Timed.timed = []
    src = Timed(url, window=window)
    src.timed = []
    return src


def _snapshot(src, out: dict, label: str) -> None:
    """One snapshot timed into out[label], with what it rests on: whether the per-unit
    stats came from the recording rules (their window) or from every rank's raw series, its
    query count and its slowest queries."""
    src.timed.clear()
    t = time.perf_counter()
    snap = src.snapshot()
    out[label] = round(time.perf_counter() - t, 2)
    w = snap.unit_stats.window_s if snap.unit_stats else None
    slow = sorted(src.timed, reverse=True)[:3]
    out[f"{label}_detail"] = {
        "unit_stats_from": f"recording rules ({w:g} s window)" if w else "raw per-unit series",
        "queries": len(src.timed), "ranks": len(snap.ranks), "notes": list(snap.log_notes),
        "slowest": [{"s": round(s, 2), "query": q[:140]} for s, q, _thread in slow]}


def _source_times(url: str, out: dict) -> None:
    for label, window in (("report_cumulative_s", None), ("report_20_steps_s", 20)):
        try:
            _snapshot(_timed_source(url, window), out, label)
        except Exception as e:  # noqa: BLE001
            out[label] = f"failed: {str(e)[:200]}"
    src = _timed_source(url, 20)
    try:
        _snapshot(src, out, "tui_first_refresh_s")
        later = []
        for _ in range(3):
            t = time.perf_counter()
            src.snapshot()
            later.append(time.perf_counter() - t)
        out["tui_next_refresh_s_median_of_3"] = round(statistics.median(later), 2)
    except Exception as e:  # noqa: BLE001
        out["tui"] = f"failed: {str(e)[:200]}"


def _rule_files(tmp: Path, unit_interval: str | None) -> list[Path]:
    """rules/*.yml as shipped, or generated with the per-unit groups evaluated every
    `unit_interval` (their window unchanged: the same work an evaluation, more of them)."""
    if not unit_interval:
        return sorted((ROOT / "rules").glob("*.yml"))
    from zerodoc.ops.alerts import RuleOptions, write_rules

    return write_rules(tmp / "rules", opts=RuleOptions(unit_interval=unit_interval))


def run(ranks: int, minutes: float, interval_s: int, unit_interval: str | None = None,
        result: dict | None = None) -> dict:
    vm_bin = {b: shutil.which(b) for b in ("victoria-metrics", "vmagent", "vmalert")}
    if not all(vm_bin.values()):
        raise SystemExit("victoria-metrics, vmagent, vmalert not installed (make prometheus)")
    tmp = Path(tempfile.mkdtemp(prefix="zerodoc-scale-vm-"))
    procs: dict[str, subprocess.Popen] = {}
    result = {} if result is None else result  # filled as measured (main prints a part)
    result.update({"engine": "VictoriaMetrics 1.79.5 (Debian) + vmagent + vmalert",
                    "ranks": ranks, "units": 81, "scrape_interval_s": interval_s,
                    "minutes": minutes, "rule_files": (
                        "rules/*.yml as shipped" if not unit_interval else
                        f"rules/*.yml with the per-unit groups every {unit_interval}") +
                    ", through zerodoc.ops.stack.vmalert_rules"})
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
                "-search.maxUniqueTimeseries=10000000", *VM_SERVE_FLAGS])
            _wait_ready(vm)
            procs["vmagent"] = _spawn(tmp, "vmagent", [
                vm_bin["vmagent"], f"-promscrape.config={tmp / 'vmagent.yml'}",
                f"-remoteWrite.url={vm}/api/v1/write", f"-httpListenAddr=127.0.0.1:{ag_port}",
                f"-remoteWrite.tmpDataPath={tmp / 'vmagent-queue'}"])
            # as zerodoc stack gives them to vmalert (zerodoc.ops.stack.vmalert_rules says why)
            rules = vmalert_rules(_rule_files(tmp, unit_interval), tmp / "vmalert-rules")
            procs["vmalert"] = _spawn(tmp, "vmalert", [
                vm_bin["vmalert"], *[f"-rule={r}" for r in rules], f"-datasource.url={vm}",
                f"-remoteWrite.url={vm}", f"-evaluationInterval={interval_s}s",
                "-notifier.url=http://127.0.0.1:9", f"-httpListenAddr=127.0.0.1:{al_port}",
                *VMALERT_WRITE_FLAGS])
            start = time.time()
            rows0, missed = None, {}
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
                _note_missed(f"http://127.0.0.1:{al_port}", start, missed)
                time.sleep(5)
            result["missed_at_s"] = missed
            m_vm, m_al = _metrics(vm), _metrics(f"http://127.0.0.1:{al_port}")
            rows1 = (time.time(), sum(v for n, _l, v in m_vm if n == "vm_rows_inserted_total"))
            if rows0:
                result["samples_per_s_ingested"] = round(
                    (rows1[1] - rows0[1]) / (rows1[0] - rows0[0]))
            tsdb = json.loads(_get(f"{vm}/api/v1/status/tsdb"))["data"]
            result["series_total"] = tsdb.get("totalSeries")
            result["farm_scrapes"] = farm.scrapes
            result["rule_groups"] = _groups(f"http://127.0.0.1:{al_port}", m_al)
            result["vmalert_remote_write"] = _remote_write(m_al)
            result["store_top_queries"] = _top_queries(vm)
            result["rss_bytes"] = {n: _rss(p.pid) for n, p in procs.items()}
            result["queries"] = _time_queries(vm, time.time() - 10)
            _source_times(vm, result.setdefault("source", {}))
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
    ap.add_argument("--unit-interval", help="evaluate the per-unit groups this often (e.g. "
                    "1m; their 4m window unchanged) instead of rules/*.yml as shipped")
    a = ap.parse_args()
    result: dict = {}

    def stop(_sig, _frame):  # `timeout` ends the bench: its servers stopped, what it has printed
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    try:
        run(a.ranks, a.minutes, a.scrape_interval, a.unit_interval, result)
    except KeyboardInterrupt:
        result["interrupted"] = "stopped before every figure was read"
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
