"""The two-level layout at N ranks: per-rack Prometheus servers + a central VictoriaMetrics
with vmalert; prints one JSON object.

    python bench/scale_twolevel.py --ranks 1024 --racks 8 --minutes 9

N synthetic ranks (bench/rankfarm.py: the real 81-unit pages of tests/data/pages, counters
advancing by whole copies of the template every scrape interval) are split into `--racks`
racks of consecutive ranks. Each rack is a Debian Prometheus 2.42 with the generated rack
configuration (`zerodoc.ops.alerts.twolevel.rack_prometheus_config`: its ranks, rank 0's run
facts, rules/two-level/rack/zerodoc-rack.yml, the keep-list remote write) writing into one
VictoriaMetrics 1.79.5 single node, whose vmalert evaluates rules/two-level/zerodoc-central.yml
and the flat alerts file, as `zerodoc.ops.stack.vmalert_rules` writes them for vmalert (its
docstring says why). After `--minutes` it reads:

- per rack: each rule group's last duration and the largest seen (polled every 15 s), its
  interval, iterations run and missed (`prometheus_rule_group_iterations_{,missed_}total`),
  rules in error, head series, samples remote-written per second
  (`prometheus_remote_storage_samples_total` over the run), how far its remote write is
  behind its newest sample, and the Prometheus' resident memory, now and peak;
- central: vmalert's groups (as bench/scale_vm.py: last, mean, p99 against the interval,
  missed), the store's series, samples ingested per second, how many queries waited for one
  of its `-search.maxConcurrentRequests` slots over the run (`select_queued`), the resident
  memory of VictoriaMetrics and vmalert, and the wall time of every dashboard panel query
  and of `zerodoc report` against the central store (whether the report read the rules'
  per-unit series: `unit_stats_from` in `report_*_detail`), and a profile of 4 TUI refreshes
  (`tui_profile`: each one's wall time, queries and slowest three; the per-unit stats the
  source recomputes on its background thread counted apart).

`met` is the issue's target: every group, rack and central, within half its interval at its
largest (rack: polled; central: p99 and last), none missed or in error, each run at least
twice, and every dashboard and TUI query <= 5 s. The load average at the end is printed. A
figure that fails to come at the end is printed as `{"failed": ...}`, the others with it.

Every figure says what it covers; the racks' per-rank per-unit drill-down (the layers
dashboard's per-rank panels) is not timed: in this layout it queries a rack, not the centre.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.rankfarm import RankFarm, shipped_pages  # noqa: E402
from bench.scale_prom import _peak, _rss  # noqa: E402
from bench.scale_vm import (  # noqa: E402
    _free_port, _get, _groups, _metrics, _snapshot, _spawn, _stop, _time_queries,
    _timed_source, _wait_ready,
)

LATENCY_OFFSET, LOOKBACK = "5s", "10s"


def _rack_groups(url: str, worst: dict) -> dict:
    """A rack Prometheus' groups: interval, last duration, the largest seen, iterations run
    and missed, rules in error."""
    m = _metrics(url)

    def per_group(metric: str) -> dict:
        return {lab.get("rule_group", ""): v for n, lab, v in m if n == metric}

    missed = per_group("prometheus_rule_group_iterations_missed_total")
    runs = per_group("prometheus_rule_group_iterations_total")
    out = {}
    for g in json.loads(_get(f"{url}/api/v1/rules"))["data"]["groups"]:
        name, last = g["name"], float(g.get("evaluationTime") or 0)
        worst[name] = max(worst.get(name, 0.0), last)

        def of(d: dict, n=name):  # the rule_group label is "file;group"
            return next((v for k, v in d.items() if k.endswith(";" + n)), None)

        out[name] = {"interval_s": g["interval"], "rules": len(g["rules"]),
                     "last_duration_s": round(last, 3), "largest_seen_s": round(worst[name], 3),
                     "iterations": of(runs), "missed": of(missed),
                     "rule_errors": sum(1 for r in g["rules"] if r.get("lastError")),
                     "within_half_interval": worst[name] <= g["interval"] / 2}
    return out


def _remote_lag(url: str) -> float | None:
    """Seconds the rack's remote write is behind its newest sample (Prometheus' own two
    timestamps; 0: caught up), None when it does not say."""
    m = _metrics(url)
    newest = [v for n, _l, v in m if n == "prometheus_remote_storage_highest_timestamp_in_seconds"]
    sent = [v for n, _l, v in m
            if n == "prometheus_remote_storage_queue_highest_sent_timestamp_seconds"]
    return round(max(newest) - max(sent), 1) if newest and sent else None


def _held(groups: dict, min_iterations: int = 1) -> bool:
    """Every group within half its interval, none missed, none with a rule in error, each
    run at least `min_iterations` times."""
    return all(g["within_half_interval"] and not g["missed"] and not g["rule_errors"] and
               (g["iterations"] or 0) >= min_iterations for g in groups.values())


def _remote_samples(url: str) -> float:
    return sum(v for n, _lab, v in _metrics(url) if n == "prometheus_remote_storage_samples_total")


def _report_times(url: str) -> dict:
    """`zerodoc report`'s snapshot (a fresh source), cumulative and over 20 steps: wall time,
    whether it read the rules' per-unit series (their window), its queries, ranks and notes
    (bench/scale_vm.py's `_snapshot`)."""
    out: dict = {}
    for label, window in (("report_cumulative_s", None), ("report_20_steps_s", 20)):
        _snapshot(_timed_source(url, window), out, label)
    return out


def _figure(out: dict, key: str, fn, *args) -> None:
    """out[key] = fn(*args), or what it failed with: one figure lost, never the others."""
    try:
        out[key] = fn(*args)
    except Exception as e:  # noqa: BLE001 - a figure, not a crash
        out[key] = {"failed": f"{type(e).__name__}: {e}"[:200]}


def _tui_queries(url: str, refreshes: int = 4) -> dict:
    """A TUI's refreshes against the store (one source kept across them, as the TUI keeps
    it), each with its wall time, its queries and the slowest three; queries made on the
    source's background thread (the per-unit stats recomputed while reused) are counted
    apart, as they do not hold a refresh up."""
    src = _timed_source(url, 20)
    out = []
    for _ in range(refreshes):
        src.timed.clear()
        t = time.perf_counter()
        try:
            src.snapshot()
        except Exception as e:  # noqa: BLE001 - a figure, not a crash
            out.append({"error": str(e)[:200]})
            continue
        wall = time.perf_counter() - t
        mine = sorted(c for c in src.timed if not c[2].startswith("zerodoc-unit-stats"))[::-1]
        out.append({"wall_s": round(wall, 3), "queries": len(mine),
                    "background_queries": len(src.timed) - len(mine),
                    "slowest": [{"s": round(w, 3), "query": q[:160]} for w, q, _n in mine[:3]]})
    return {"refreshes": out}


def run(ranks: int, racks: int, minutes: float, interval_s: int, unit_window: str | None,
        max_rss_gb: float | None = None) -> dict:
    from zerodoc.ops import alerts
    from zerodoc.ops.alerts import twolevel
    from zerodoc.ops.stack import vmalert_rules

    tmp = Path(tempfile.mkdtemp(prefix="zerodoc-scale-twolevel-"))
    opts = alerts.RuleOptions(layout="two-level", unit_window=unit_window)
    files = alerts.write_rules(tmp / "rules", opts=opts)
    flat = alerts.write_rules(tmp / "flat")
    central_rules = vmalert_rules([p for p in files if p.name == twolevel.CENTRAL_FILE] +
                                  [p for p in flat if p.name == alerts.ALERTS_FILE],
                                  tmp / "vmalert-rules")  # as vmalert must read them
    rack_rules = next(p for p in files if p.name == twolevel.RACK_FILE)
    uw = opts.unit_window or alerts.recording.unit_window(opts.window)
    procs: dict[str, subprocess.Popen] = {}
    per = -(-ranks // racks)
    result: dict = {"layout": "two-level", "ranks": ranks, "racks": racks,
                    "ranks_per_rack": per, "units": 81, "scrape_interval_s": interval_s,
                    "unit_window": uw, "minutes": minutes,
                    "engines": "rack: Prometheus 2.42 (Debian); central: VictoriaMetrics "
                               "1.79.5 + vmalert (Debian)"}
    try:
        with RankFarm(shipped_pages(), ranks, run_id="bench", period_s=interval_s) as farm:
            targets = farm.targets()
            (tmp / "rank0.json").write_text(json.dumps(targets[:1]))
            vm_port, al_port = _free_port(), _free_port()
            vm = f"http://127.0.0.1:{vm_port}"
            procs["victoria-metrics"] = _spawn(tmp, "vm", [
                shutil.which("victoria-metrics"), f"-storageDataPath={tmp / 'vmdata'}",
                f"-httpListenAddr=127.0.0.1:{vm_port}", f"-search.latencyOffset={LATENCY_OFFSET}",
                "-search.maxUniqueTimeseries=10000000"])
            _wait_ready(vm)
            rack_urls = {}
            for k in range(racks):
                name = f"rack{k}"
                d = tmp / name
                d.mkdir()
                (d / "sd.json").write_text(json.dumps(targets[k * per:(k + 1) * per]))
                cfg = twolevel.rack_prometheus_config(
                    name, f"{vm}/api/v1/write", ranks_sd=[str(d / "sd.json")],
                    facts_sd=[str(tmp / "rank0.json")], scrape_interval=f"{interval_s}s",
                    rule_file=str(rack_rules), unit_win=uw)
                cfg["scrape_configs"].append({"job_name": "prometheus", "static_configs": [
                    {"targets": [f"127.0.0.1:{(port := _free_port())}"]}]})
                (d / "prometheus.yml").write_text(json.dumps(cfg))
                procs[name] = _spawn(d, "prometheus", [
                    "/usr/bin/prometheus", f"--config.file={d / 'prometheus.yml'}",
                    f"--storage.tsdb.path={d / 'data'}", "--storage.tsdb.retention.time=1h",
                    f"--web.listen-address=127.0.0.1:{port}"])
                rack_urls[name] = f"http://127.0.0.1:{port}"
            for url in rack_urls.values():
                _wait_ready(url, 120)
            procs["vmalert"] = _spawn(tmp, "vmalert", [
                shutil.which("vmalert"), *[f"-rule={r}" for r in central_rules],
                f"-datasource.url={vm}", f"-remoteWrite.url={vm}",
                f"-evaluationInterval={interval_s}s", f"-datasource.lookback={LOOKBACK}",
                "-notifier.url=http://127.0.0.1:9", f"-httpListenAddr=127.0.0.1:{al_port}"])
            start = time.time()
            worst: dict[str, dict] = {n: {} for n in rack_urls}
            base = None
            peaks: dict[str, int] = {}
            deadline = time.monotonic() + minutes * 60
            while time.monotonic() < deadline:
                dead = [n for n, p in procs.items() if p.poll() is not None]
                if dead:
                    raise RuntimeError(f"{dead} exited")
                try:
                    for n, url in rack_urls.items():
                        _rack_groups(url, worst[n])
                    if base is None:
                        base = (time.time(), {n: _remote_samples(u) for n, u in rack_urls.items()},
                                sum(v for n, _l, v in _metrics(vm) if n == "vm_rows_inserted_total"))
                except OSError:
                    pass
                for n, p in procs.items():
                    peaks[n] = max(peaks.get(n, 0), _rss(p.pid) or 0)
                held = sum(_rss(p.pid) or 0 for p in procs.values())
                if max_rss_gb and held > max_rss_gb * 2**30:
                    result["stopped"] = f"all processes held {held / 2**30:.1f} GB " \
                                        f"> --max-rss-gb {max_rss_gb:g}: figures at that time"
                    break
                time.sleep(15)
            now = time.time()
            rk = {}
            for n, url in rack_urls.items():
                tsdb = json.loads(_get(f"{url}/api/v1/status/tsdb"))["data"]
                rk[n] = {"groups": _rack_groups(url, worst[n]),
                         "head_series": tsdb["headStats"]["numSeries"],
                         "remote_written_samples_per_s": round(
                             (_remote_samples(url) - base[1][n]) / (now - base[0]))
                         if base else None,
                         "remote_write_lag_s": _remote_lag(url),
                         "rss_bytes": _rss(procs[n].pid), "peak_rss_bytes": _peak(procs[n].pid)}
            result["racks_detail"] = rk
            m_vm, m_al = _metrics(vm), _metrics(f"http://127.0.0.1:{al_port}")
            rows = sum(v for n, _l, v in m_vm if n == "vm_rows_inserted_total")
            central = {
                "series_total": json.loads(_get(f"{vm}/api/v1/status/tsdb"))["data"]
                .get("totalSeries"),
                "samples_per_s_ingested": round((rows - base[2]) / (now - base[0]))
                if base else None,
                "rule_groups": _groups(f"http://127.0.0.1:{al_port}", m_al),
                # queries that found the store's -search.maxConcurrentRequests (4 on 2 cores)
                # taken and waited for a slot (timed out: failed after -search.maxQueueDuration)
                "select_queued": {k: sum(v for n, _l, v in m_vm if n == f"vm_concurrent_select_{k}")
                                  for k in ("capacity", "limit_reached_total",
                                            "limit_timeout_total")},
                "rss_bytes": {n: _rss(procs[n].pid) for n in ("victoria-metrics", "vmalert")},
                "peak_rss_bytes": {n: _peak(procs[n].pid) for n in ("victoria-metrics", "vmalert")},
            }
            result["central"] = central
            _figure(central, "queries", _time_queries, vm, time.time() - 15)
            _figure(central, "report", _report_times, vm)
            _figure(central, "tui_profile", _tui_queries, vm)
            result["sum_rack_rss_bytes"] = sum(r["rss_bytes"] or 0 for r in rk.values())
            result["max_rss_seen_bytes"] = peaks
            tui = [q["s"] for r in central["tui_profile"].get("refreshes", ())
                   for q in r.get("slowest", ())]
            central["tui_profile"]["slowest_query_s"] = max(tui, default=None)
            # the targets: every group (rack and central) within half its interval,
            # none missed (and none in error), each query <= 5 s (dashboards and the TUI's);
            # a group that has not run twice is not yet measured
            q = central["queries"]
            result["met"] = all(_held(r["groups"], 2) for r in rk.values()) and \
                _held(central["rule_groups"], 2) and not q.get("over_5s") and \
                not q.get("failed", True) and "count" in q and bool(tui) and max(tui) <= 5 and \
                not any("error" in r for r in central["tui_profile"]["refreshes"])
            result["loadavg_1_5_15_at_end"] = [round(x, 1) for x in os.getloadavg()]
            result["farm_scrapes"] = farm.scrapes
            result["wall_s"] = round(time.time() - start, 1)
    finally:
        _stop(procs, 60)  # 8 rack servers flush their heads
        shutil.rmtree(tmp, ignore_errors=True)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=32)
    ap.add_argument("--racks", type=int, default=2)
    ap.add_argument("--minutes", type=float, default=4.0,
                    help="how long the rules run before the figures are read")
    ap.add_argument("--scrape-interval", type=int, default=15, help="seconds")
    ap.add_argument("--unit-window", default=None,
                    help="per-unit rate window and interval (default: the production 4m)")
    ap.add_argument("--max-rss-gb", type=float, default=None,
                    help="stop early (and say so) when all the processes hold more than this")
    a = ap.parse_args()
    print(json.dumps(run(a.ranks, a.racks, a.minutes, a.scrape_interval, a.unit_window,
                         a.max_rss_gb), indent=1))


if __name__ == "__main__":
    main()
