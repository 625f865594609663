"""The shipped rules on a real Prometheus scraping N synthetic ranks (issue 33 item 2).

    python bench/server_scale.py --ranks 32                 # the shipped rule files
    python bench/server_scale.py --ranks 32 --rules before  # the rules before issue 33
    python bench/server_scale.py --ranks 1024 --minutes 9   # ~13 GB; the as-shipped row of docs/operations.md

A `RankFarm` (bench/rankfarm.py, one process, one port, one path a rank) serves N ranks' pages
made from a real 81-unit rank's page (tests/data/pages: rank 0's for rank 0, rank 1's for the
others, the framework's time per unit folded over units on ranks other than 0 as zerodoc
serves it; rank labels rewritten, counters advancing). Debian's Prometheus scrapes them every
15 s through zerodoc's file_sd targets, evaluates the rule files every 15 s (the per-unit
group at its own interval) and scrapes itself (the rule-group alerts read its series).

After `--minutes` it prints one JSON object, the server's own figures: per rule group its
last and largest evaluation time against its interval and the iterations it missed
(`prometheus_rule_group_iterations_missed_total`), its three costliest rules; head series,
resident memory (now and peak); the wall time of every query `zerodoc report` / the TUI
make (zerodoc.sources.PrometheusSource, a first snapshot and a second one) and of every
dashboard panel's query (dashboards/*.json, variables as bench/scale_prom.py substitutes
them); the farm's CPU share (it must not be what limits the server) and the monitoring
alerts that are pending or firing. The targets: each group's time <= half its interval, no
iteration missed, each query <= 5 s.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import resource
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.rankfarm import RankFarm  # noqa: E402
from bench.scale_prom import _get, _peak, _queries, _rss, _subst  # noqa: E402

PAGES = ROOT / "tests" / "data" / "pages"
BEFORE = ROOT / "tests" / "data" / "rules_before" / "zerodoc-recording.yml"
FRAMEWORK = "zerodoc_framework_unit_seconds_total"
SLOW_QUERY_S = 5.0


def templates() -> dict[int, str]:
    """Rank 0's and rank 1's pages in the text format (no OpenMetrics `info` type or EOF),
    rank 1's framework time per unit summed over units per phase."""
    out = {}
    for r in (0, 1):
        text = gzip.decompress((PAGES / f"rank{r}-81units.om.gz").read_bytes()).decode()
        lines, fw = [], {}
        for line in text.splitlines():
            if line == "# EOF" or re.match(r"# TYPE \S+ info$", line):
                continue
            if r and line.startswith(FRAMEWORK + "{"):
                head, _, v = line.rpartition(" ")
                key = re.sub(r',?unit="[^"]*"', "", head).replace("{,", "{")
                fw[key] = fw.get(key, 0.0) + float(v)
                continue
            lines.append(line)
        lines += [f"{k} {v!r}" for k, v in fw.items()]
        out[r] = "\n".join(lines) + "\n"
    return out


def _metrics(url: str) -> dict[str, list[tuple[dict, float]]]:
    """The server's own /metrics, parsed: name -> [(labels, value)]."""
    out: dict[str, list] = {}
    for line in _get(f"{url}/metrics").decode().splitlines():
        m = re.match(r"^([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)$", line)
        if m:
            labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
            out.setdefault(m.group(1), []).append((labels, float(m.group(3))))
    return out


def _cpu(pid: int) -> float:
    """CPU seconds (user + system) of process `pid`."""
    f = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(f[11]) + int(f[12])) / 100  # utime, stime in clock ticks (USER_HZ = 100)


def _query(url: str, expr: str, timeout: float = 120) -> tuple[float, int | str]:
    t = time.perf_counter()
    try:
        body = json.loads(_get(f"{url}/api/v1/query?" + urllib.parse.urlencode(
            {"query": expr, "timeout": f"{timeout:g}s"}), timeout + 5))
        n: int | str = len(body["data"]["result"]) if body.get("status") == "success" \
            else body.get("error", "?")
    except OSError as e:
        n = f"error: {e}"
    return time.perf_counter() - t, n


def groups(url: str) -> dict[str, dict]:
    data = json.loads(_get(f"{url}/api/v1/rules"))["data"]["groups"]
    return {g["name"]: {"interval_s": g["interval"], "last_s": g["evaluationTime"],
                        "rules": sorted(((r["evaluationTime"], r.get("name", "?"))
                                         for r in g["rules"]), reverse=True)}
            for g in data}


def source_queries(url: str) -> dict:
    """Every query a `zerodoc report` / TUI snapshot makes, timed: a first snapshot, then a
    second (the TUI's next refresh, per-unit numbers reused)."""
    from zerodoc.sources import PrometheusSource

    src = PrometheusSource(url)
    timed: list[tuple[float, str]] = []
    real = src._query

    def query(expr, at=None, timeout_s=None):
        t = time.perf_counter()
        try:
            return real(expr, at, timeout_s)
        finally:
            timed.append((time.perf_counter() - t, " ".join(expr.split())[:160]))
    src._query = query
    out = {}
    for what in ("first", "second"):
        timed.clear()
        t = time.perf_counter()
        window = None
        try:
            snap = src.snapshot()
            err = None
            # the per-unit stats' rate window when read from the recording rules (None: the
            # source aggregated every rank's raw per-unit series itself)
            window = getattr(snap.unit_stats, "window_s", None)
        except Exception as e:  # noqa: BLE001 - a figure, not a crash
            err = f"{type(e).__name__}: {e}"
        out[what] = {"wall_s": round(time.perf_counter() - t, 2), "queries": len(timed),
                     "unit_stats_rules_window_s": window,
                     "slowest": [(round(s, 3), e) for s, e in sorted(timed, reverse=True)[:5]],
                     "over_5s": sum(s > SLOW_QUERY_S for s, _ in timed), "error": err}
    return out


def run(ranks: int, minutes: float, rules: str, tmp: Path,
        max_rss_gb: float | None = None) -> dict:
    from zerodoc.demo.launch import free_port
    from zerodoc.ops import alerts

    rule_dir = tmp / "rules"
    alerts.write_rules(rule_dir)
    if rules != "shipped":  # "before", or a candidate recording-rule file to A/B
        (rule_dir / alerts.RECORDING_FILE).write_text(
            (BEFORE if rules == "before" else Path(rules)).read_text())
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # the ranks step once a scrape interval (as bench/scale_vm.py's): every rate window holds
    # steps, and the run's last step is recent, so the report evaluates now (with a 600 s
    # period it evaluated at the farm's start, before any rule had run, and read raw series)
    farm = RankFarm(templates(), ranks, run_id="bench", period_s=15.0)
    with farm:
        sd = farm.file_sd(tmp / "sd")
        cfg = {"global": {"scrape_interval": "15s", "evaluation_interval": "15s"},
               "rule_files": [str(rule_dir / "*.yml")],
               "scrape_configs": [
                   {"job_name": "zerodoc", "file_sd_configs": [{"files": [str(sd)]}]},
                   {"job_name": "prometheus",
                    "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}]}
        (tmp / "prometheus.yml").write_text(json.dumps(cfg))
        log = open(tmp / "prometheus.log", "w")
        proc = subprocess.Popen(["/usr/bin/prometheus", f"--config.file={tmp / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={tmp / 'data'}",
                                 f"--web.listen-address=127.0.0.1:{port}",
                                 "--enable-feature=extra-scrape-metrics"],
                                stdout=log, stderr=subprocess.STDOUT)
        try:
            return _measure(url, proc, farm, ranks, minutes, rules, max_rss_gb)
        finally:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
            log.close()


def _measure(url, proc, farm, ranks, minutes, rules, max_rss_gb=None) -> dict:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            _get(f"{url}/-/ready", 2)
            break
        except OSError:
            time.sleep(0.5)
    cpu0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
    server0 = _cpu(proc.pid)
    worst: dict[str, float] = {}
    end = time.monotonic() + minutes * 60
    stopped = None
    while time.monotonic() < end:  # the groups' largest evaluation time over the run
        time.sleep(min(15.0, max(0.0, end - time.monotonic())))
        if max_rss_gb and _rss(proc.pid) > max_rss_gb * 2**30:  # the box is shared
            stopped = f"resident memory past {max_rss_gb:g} GB after {time.monotonic() - t0:.0f} s"
            break
        try:
            for name, g in groups(url).items():
                worst[name] = max(worst.get(name, 0.0), g["last_s"])
        except OSError:
            pass
    cpu1, wall = resource.getrusage(resource.RUSAGE_SELF), time.monotonic() - t0
    farm_cpu = (cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime) / wall
    server_cpu = (_cpu(proc.pid) - server0) / wall
    m = _metrics(url)
    missed = {lab["rule_group"].rpartition(";")[2]: v
              for lab, v in m.get("prometheus_rule_group_iterations_missed_total", [])}
    out = {"ranks": ranks, "rules": rules, "minutes": minutes, "stopped_early": stopped,
           "groups": {},
           "head_series": int(m["prometheus_tsdb_head_series"][0][1]),
           "rss_gb": round(_rss(proc.pid) / 2**30, 2),
           "peak_rss_gb": round(_peak(proc.pid) / 2**30, 2),
           # the server's CPU over the run, in cores (scraping, ingesting, the rules): less
           # sensitive than the groups' wall times to other load on a shared box
           "server_cpu_cores": round(server_cpu, 3),
           "load_average": Path("/proc/loadavg").read_text().split()[:3],
           "farm": {"cpu_cores": round(farm_cpu, 3), "scrapes": farm.scrapes,
                    "scrapes_per_s": round(farm.scrapes / wall, 1)}}
    for name, g in groups(url).items():
        out["groups"][name] = {
            "interval_s": g["interval_s"], "last_s": round(g["last_s"], 2),
            "max_s": round(max(worst.get(name, 0.0), g["last_s"]), 2),
            "missed": missed.get(name, 0.0),
            "within_half": max(worst.get(name, 0.0), g["last_s"]) <= g["interval_s"] / 2,
            "costliest": [(round(s, 2), n) for s, n in g["rules"][:3]],
            # every rule's last evaluation time (a group's cost is their sum: they run in turn)
            "rules": [(round(s, 3), n) for s, n in g["rules"]]}
    # the server's figures first, on stderr: a run cut short by its timeout still says them
    print(json.dumps(out), file=sys.stderr, flush=True)
    out["report_tui"] = source_queries(url)
    dash = []
    for what, expr in _queries():
        s, n = _query(url, _subst(expr))
        dash.append((round(s, 3), what, n))
    dash.sort(reverse=True)
    out["dashboards"] = {"queries": len(dash), "over_5s": sum(s > SLOW_QUERY_S for s, *_ in dash),
                         "slowest": dash[:8]}
    body = json.loads(_get(f"{url}/api/v1/query?query=" + urllib.parse.quote(
        'ALERTS{alertname=~"ZerodocRuleGroup.*|ZerodocScrapeSlow|ZerodocSeriesOverBudget"}')))
    out["monitoring_alerts"] = sorted({(r["metric"]["alertname"], r["metric"]["alertstate"])
                                       for r in body["data"]["result"]})
    out["met"] = (all(g["within_half"] and not g["missed"] for g in out["groups"].values())
                  and not out["dashboards"]["over_5s"]
                  and not any(v["over_5s"] for v in out["report_tui"].values()))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=32)
    p.add_argument("--minutes", type=float, default=5.0,
                   help="scrape and evaluate this long before reading the figures")
    p.add_argument("--rules", default="shipped",
                   help="'shipped' (the generator's files), 'before' (issue 33's old "
                        "recording rules) or the path of a recording-rule file to try")
    p.add_argument("--max-rss-gb", type=float, default=None,
                   help="stop early (and say so) when the server's resident memory passes this")
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="server-scale-") as tmp:
        print(json.dumps(run(a.ranks, a.minutes, a.rules, Path(tmp), a.max_rss_gb)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
