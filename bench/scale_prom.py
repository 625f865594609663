"""bench/scale.py's series and Prometheus sections (see its docstring)."""

from __future__ import annotations

import json
import re
import shutil
import statistics
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SAMPLES, EVERY = 10, 15.0  # backfilled samples per series, seconds apart


def _get(url: str, timeout: float = 60, accept: str | None = None) -> bytes:
    req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.read()


def series_section(tmp: Path, units: int, budget) -> dict[int, str] | None:
    """A real 2-rank job with `units - 1` blocks: each rank's scrape (OpenMetrics text)."""
    from zerodoc.demo.launch import Job
    from zerodoc.runlog import read_rank_tail

    print(f"\n== series per rank (a real 2-rank job, {units} units)")
    run = tmp / "series"
    spec = {"model": {"blocks": units - 1, "hidden": 64, "heads": 4, "vocab": 256, "seq": 16,
                      "batch": 2}, "steps": 10**6, "attach": {"run_dir": str(run), "port": 0}}
    job = Job(2, spec, log_dir=str(run / "logs")).start()
    try:
        deadline = time.monotonic() + 300
        eps: dict[int, str] = {}
        while time.monotonic() < deadline:
            if not job.running():
                print("  the job failed:", (run / "logs" / "rank-0.out").read_text()[-800:])
                return None
            for r in (0, 1):
                p = run / f"rank-{r:05d}.jsonl"
                try:
                    log = read_rank_tail(p, 1, detail=False)
                except Exception:  # noqa: BLE001 - not written yet
                    continue
                if log.last_step >= 3 and log.facts.metrics_endpoint:
                    eps[r] = log.facts.metrics_endpoint
            if len(eps) == 2:
                break
            time.sleep(0.5)
        else:
            print("  the job did not reach step 3 in time")
            return None
        texts = {r: _get(f"http://{ep}/metrics",
                         accept="application/openmetrics-text; version=1.0.0").decode()
                 for r, ep in eps.items()}
    finally:
        job.stop()
    for r, text in sorted(texts.items()):
        n = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
        names = {re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line).group(0)
                 for line in text.splitlines() if line and not line.startswith("#")}
        also = " (rank 0 also serves the run's per-unit facts, once per run)" if r == 0 else ""
        print(f"  rank {r}: {n:,} series ({len(names)} names){also}")
        if r == 0:
            budget(f"Prometheus series, rank 0 ({units} units, + the run's unit facts)",
                   f"{n:,}", None)
        else:
            budget(f"Prometheus series per rank (rank {r}, {units} units)", f"{n:,} <= 1,200",
                   n <= 1200)
    return texts


def _families(text: str) -> list[tuple[str, list[str], list[str]]]:
    """(type, header lines, sample lines) per metric family of an OpenMetrics page."""
    out: list[tuple[str, list[str], list[str]]] = []
    for line in text.splitlines():
        if not line or line == "# EOF":
            continue
        if line.startswith("# TYPE "):
            out.append((line.split()[3], [line], []))
        elif line.startswith("#"):
            if out and not out[-1][2]:
                out[-1][1].append(line)
            else:
                out.append(("unknown", [line], []))
        elif out:
            out[-1][2].append(line)
    return out


_LABEL = re.compile(r'(rank|local_rank|node)="[^"]*"')


def _relabel(line: str, r: int) -> tuple[str, str, float]:
    head, _, value = line.rpartition(" ")
    name, brace, rest = head.partition("{")
    sub = {"rank": str(r), "local_rank": str(r % 8), "node": f"node{r // 8:03d}"}
    labels = _LABEL.sub(lambda m: f'{m.group(1)}="{sub[m.group(1)]}"', rest[:-1]) if brace \
        else ""
    extra = f'job="zerodoc",instance="node{r // 8:03d}:{9730 + r % 8}"'
    if 'run_id="' in labels:
        labels = re.sub(r'run_id="[^"]*"', 'run_id="bench"', labels)
    else:
        extra += ',run_id="bench"'
    labels = f"{extra},{labels}" if labels else extra
    return name, labels, float(value)


def write_openmetrics(path: Path, scrapes: dict[int, str], ranks: int, end: float) -> int:
    """The series of `ranks` ranks (rank 0's page for rank 0, rank 1's for the others),
    SAMPLES samples each ending at `end`; counters grow linearly. Returns the series."""
    fams = {r: _families(t) for r, t in scrapes.items()}
    series = 0
    with open(path, "w") as f:
        for i, (ftype, header, _s) in enumerate(fams[0]):
            f.write("\n".join(header) + "\n")
            for r in range(ranks):
                src = fams[0] if r == 0 else fams[1]
                if i >= len(src) or src[i][1][0] != header[0]:
                    match = [x for x in src if x[1][0] == header[0]]
                    if not match:
                        continue
                    samples = match[0][2]
                else:
                    samples = src[i][2]
                for line in samples:
                    name, labels, v = _relabel(line, r)
                    series += 1
                    grows = ftype in ("counter", "histogram")
                    for k in range(SAMPLES):
                        ts = end - (SAMPLES - 1 - k) * EVERY
                        val = v * (k + 1) / SAMPLES if grows else v
                        if name == "zerodoc_last_step_timestamp_seconds":
                            val = ts
                        f.write(f"{name}{{{labels}}} {val!r} {ts:.3f}\n")
        f.write("# EOF\n")
    return series


def _queries() -> list[tuple[str, str]]:
    out = []
    for p in sorted((ROOT / "dashboards").glob("*.json")):
        d = json.loads(p.read_text())
        stack = list(d.get("panels", []))
        while stack:
            pan = stack.pop(0)
            stack += pan.get("panels", [])
            for t in pan.get("targets", []):
                if t.get("expr"):
                    out.append((f"{p.stem}: {pan.get('title', '?')} {t.get('refId', '')}",
                                t["expr"]))
    return out


def _rules() -> list[tuple[str, str]]:
    import yaml

    doc = yaml.safe_load((ROOT / "rules" / "zerodoc-recording.yml").read_text())
    return [(f"rule {r['record']}", r["expr"]) for g in doc["groups"] for r in g["rules"]
            if "record" in r]


def _subst(expr: str) -> str:
    for var, val in (("$__rate_interval", "1m"), ("$__interval", "15s"), ("$__range", "2m"),
                     ("${datasource}", "")):
        expr = expr.replace(var, val)
    return re.sub(r"\$\{?[a-z_]+\}?", ".*", expr)


def prometheus_section(tmp: Path, scrapes: dict[int, str], ranks: int, budget,
                       report_time) -> None:
    print(f"\n== Prometheus ({ranks} ranks' series, backfilled)")
    promtool, prometheus = shutil.which("promtool"), shutil.which("prometheus")
    if not (promtool and prometheus):
        print("  promtool / prometheus not installed (make prometheus): skipped")
        return
    end = time.time() - 5
    om = tmp / "series.om"
    t = time.perf_counter()
    n = write_openmetrics(om, scrapes, ranks, end)
    print(f"  {n:,} series x {SAMPLES} samples ({om.stat().st_size / 2**20:,.0f} MiB of "
          f"OpenMetrics) in {time.perf_counter() - t:.0f} s", flush=True)
    data = tmp / "tsdb"
    t = time.perf_counter()
    r = subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(om),
                        str(data)], capture_output=True, text=True)
    om.unlink()
    if r.returncode:
        print("  promtool failed:", (r.stderr or r.stdout)[-800:])
        return
    print(f"  backfilled with promtool in {time.perf_counter() - t:.0f} s", flush=True)
    proc, url, log = _start(prometheus, tmp, data)
    try:
        # The per-unit recording rules the Prometheus source reads (issue 20 item 17),
        # backfilled by promtool as a server evaluating them would have recorded them; then
        # the reports and TUIs first (the data must stay within their 15 min lookback), with
        # the rules and, A/B in the same run, without them (raw per-unit series)
        t = time.perf_counter()
        levels = _unit_rule_levels()
        for i, rules in enumerate(levels):
            if i:  # the server must see the level below (promtool queries it)
                proc.terminate()
                proc.wait(30)
                proc, url, log = _start(prometheus, tmp, data, log)
            if not _backfill_unit_rules(promtool, url, tmp, data, end, rules):
                return
        print(f"  the per-unit recording rules backfilled by promtool in "
              f"{time.perf_counter() - t:.0f} s (one evaluation: what the server pays per "
              f"evaluation interval; {sum(map(len, levels))} rules in {len(levels)} levels, a "
              "rule that reads another recorded series after it)", flush=True)
        proc.terminate()
        proc.wait(30)
        proc, url, log = _start(prometheus, tmp, data, log)
        # per-unit stats from the rules and per-rank figures from the rank-level series (the
        # default); the same with the per-rank sums over every per-unit series (before them);
        # everything from the raw per-unit series
        for what, recorded, rank_series in (
                ("recording rules + rank-level series", True, True),
                ("recording rules + per-rank sums of per-unit series", True, False),
                ("raw per-unit series", False, False)):
            limit = 5.0 if recorded and rank_series else None
            _reset_peak(proc.pid)
            report_time(url, f"from Prometheus, {ranks} ranks, {what}", limit_s=limit,
                        recorded=recorded, rank_series=rank_series)
            peak = _peak(proc.pid)
            print(f"  Prometheus peak resident memory during the report: "
                  f"{peak / 2**20:,.0f} MiB")
            budget(f"Prometheus peak memory, report ({ranks} ranks, {what})",
                   f"{peak / 2**20:,.0f} MiB", None)
            tui_refreshes(url, ranks, budget, what, limit_s=limit, recorded=recorded,
                          rank_series=rank_series)
        lat = []
        panels = [(w, e, "query_range") for w, e in _queries()]
        rules = [(w, e, "query") for w, e in _rules()]  # a rule is evaluated at an instant
        for where, expr, api in panels + rules:
            args = {"query": _subst(expr)}
            if api == "query_range":
                args.update(start=f"{end - 120:.3f}", end=f"{end:.3f}", step="15")
            else:
                args.update(time=f"{end:.3f}")
            q = urllib.parse.urlencode(args)
            times = []
            for _ in range(3):
                t = time.perf_counter()
                body = json.loads(_get(f"{url}/api/v1/{api}?{q}", 120))
                times.append(time.perf_counter() - t)
            ok = body.get("status") == "success"
            got = len(body.get("data", {}).get("result", [])) if ok else 0
            lat.append((statistics.median(times), where, got, ok))
        per_rank = _per_rank_rule_ab(url, end)
        rss = _rss(proc.pid)
        lat.sort(reverse=True)
        print(f"  {len(lat)} queries (every dashboard panel: 2 min range, 15 s step; every "
              f"recording rule: one instant; median of 3): median "
              f"{statistics.median(x[0] for x in lat) * 1e3:.0f} ms; slowest:")
        for secs, where, got, ok in lat[:5]:
            print(f"    {secs * 1e3:7.0f} ms  {where} ({got} series{'' if ok else ', ERROR'})")
        print(f"  Prometheus resident memory after the queries: {rss / 2**20:,.0f} MiB")
        budget(f"Prometheus panel query, slowest ({ranks} ranks)", f"{lat[0][0]:.2f} s", None)
        if per_rank:
            print("  per-rank recording rules (one instant, median of 3): from the rank-level "
                  "series vs summing the per-unit series")
            for name, a, b in per_rank:
                print(f"    {a * 1e3:7.0f} ms vs {b * 1e3:7.0f} ms  {name}")
            rules_only = [x for x in per_rank if x[0].startswith("rule ")]
            a, b = sum(x[1] for x in rules_only), sum(x[2] for x in rules_only)
            budget(f"per-rank recording rules, all {len(rules_only)} ({ranks} ranks): "
                   "rank-level vs per-unit sums", f"{a:.2f} s vs {b:.2f} s", None)
            # the whole recording group, one rule after another as the server evaluates it
            # (an estimate: recorded series the bench did not backfill read as empty)
            group = sum(x[0] for x in lat if x[1].startswith("rule "))
            print(f"  every recording rule once, in sequence: {group:.1f} s; with the per-rank "
                  f"rules summing per-unit series: {group - a + b:.1f} s")
            budget(f"recording rule group, one evaluation ({ranks} ranks): now vs per-rank "
                   "rules on per-unit sums", f"{group:.1f} s vs {group - a + b:.1f} s", None)
        budget(f"Prometheus resident memory ({ranks} ranks, {n:,} series)",
               f"{rss / 2**20:,.0f} MiB", None)
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


def _per_unit_form(expr: str) -> str:
    """A per-rank rule as it was before the rank-level series (issue 20 item 17): the same
    sums over the rank's per-unit series."""
    from zerodoc.catalog import RANK_COMPUTE, RANK_EXPOSED

    expr = re.sub(r"sum without \(phase, collective\) \(rate\(" + RANK_EXPOSED,
                  "sum without (unit, phase, collective) (rate("
                  "zerodoc_collective_exposed_seconds_total", expr)
    return re.sub(r"sum without \(phase\) \(rate\(" + RANK_COMPUTE,
                  "sum without (unit, phase) (rate(zerodoc_compute_seconds_total", expr)


def _per_rank_rule_ab(url: str, end: float) -> list[tuple[str, float, float]]:
    """(rule, seconds from the rank-level series, seconds summing the per-unit series) for
    every shipped rule that reads the rank-level series; each the median of 3, interleaved,
    and both forms checked to give the same numbers."""
    from zerodoc.catalog import RANK_COMPUTE, RANK_EXPOSED

    out = []
    # the sums alone (a rule's denominators may be recorded series not backfilled here)
    parts = [(f"sum of {n}", f"sum without ({by}) (rate({n}[1m]))")
             for n, by in ((RANK_EXPOSED, "phase, collective"), (RANK_COMPUTE, "phase"))]
    for where, expr in parts + _rules():
        old = _per_unit_form(expr)
        if old == expr:
            continue
        times: dict[str, list[float]] = {expr: [], old: []}
        got = {}
        for _ in range(3):
            for e in (expr, old):
                q = urllib.parse.urlencode({"query": e, "time": f"{end:.3f}"})
                t = time.perf_counter()
                body = json.loads(_get(f"{url}/api/v1/query?{q}", 120))
                times[e].append(time.perf_counter() - t)
                got[e] = sorted((tuple(sorted(r["metric"].items())), float(r["value"][1]))
                                for r in body["data"]["result"])
        same = len(got[expr]) == len(got[old]) and all(
            a[0] == b[0] and abs(a[1] - b[1]) <= 1e-9 * max(1.0, abs(b[1]))
            for a, b in zip(got[expr], got[old]))
        out.append((f"{where} ({len(got[expr])} series{'' if same else ', DIFFERENT'})",
                    statistics.median(times[expr]), statistics.median(times[old])))
    return out


def _start(prometheus: str, tmp: Path, data: Path, log=None):
    """A Prometheus on the TSDB at `data`, ready: (process, URL, log file)."""
    from zerodoc.demo.launch import free_port

    if log is not None:
        log.close()
    port = free_port()
    cfg = tmp / "prometheus.yml"
    cfg.write_text("global: {scrape_interval: 15s}\n")
    log = open(tmp / "prometheus.log", "a")
    proc = subprocess.Popen([prometheus, f"--config.file={cfg}", f"--storage.tsdb.path={data}",
                             f"--web.listen-address=127.0.0.1:{port}"], stdout=log,
                            stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if _get(f"{url}/-/ready", 2):
                break
        except OSError:
            time.sleep(0.3)
    return proc, url, log


def _unit_rule_levels() -> list[list[dict]]:
    """The per-unit recording rules the Prometheus source reads
    (zerodoc.ops.alerts.recording.unit_stat_names) and the recorded series they read, in levels:
    a rule comes after the rules whose series it reads. promtool evaluates a backfill
    against the server's data, so a level is backfilled only once the one below is in it
    (without them, the rules that divide by `rank:zerodoc_detail_steps:rate` came out empty
    and the report from the rules lost ZD004 and ZD006)."""
    from zerodoc.ops.alerts.recording import recording_rules, unit_stat_names

    rules = recording_rules()
    names = {r["record"] for r in rules}
    token = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
    reads = {}
    for r in rules:
        reads.setdefault(r["record"], set()).update(
            x for x in token.findall(r["expr"]) if x in names and x != r["record"])
    need, todo = set(), list(unit_stat_names())
    while todo:
        n = todo.pop()
        if n in names and n not in need:
            need.add(n)
            todo += reads[n]
    level: dict[str, int] = {}

    def lv(n: str) -> int:
        if n not in level:
            level[n] = 0  # a cycle (none expected) counts as level 0
            level[n] = 1 + max((lv(d) for d in reads[n] if d in need), default=-1)
        return level[n]

    out: list[list[dict]] = [[] for _ in range(1 + max(map(lv, need), default=0))]
    for r in rules:
        if r["record"] in need:
            out[lv(r["record"])].append(r)
    return [x for x in out if x]


def _backfill_unit_rules(promtool: str, url: str, tmp: Path, data: Path, end: float,
                         rules: list[dict]) -> bool:
    """Evaluate `rules` over the last two samples with promtool and move the blocks into
    the TSDB."""
    from zerodoc.ops.alerts.yamltext import dump

    path = tmp / "unit-rules.yml"
    path.write_text(dump({"groups": [{"name": "zerodoc.unit", "interval": f"{EVERY:g}s",
                                      "rules": rules}]}))
    out = tmp / "rule-blocks"
    shutil.rmtree(out, ignore_errors=True)
    r = subprocess.run([promtool, "tsdb", "create-blocks-from", "rules",
                        f"--start={end - EVERY:.0f}", f"--end={end + 1:.0f}", f"--url={url}",
                        f"--eval-interval={EVERY:g}s", f"--output-dir={out}", str(path)],
                       capture_output=True, text=True)
    if r.returncode:
        print("  promtool (rules) failed:", (r.stderr or r.stdout)[-800:])
        return False
    for block in out.iterdir():
        if block.is_dir():
            shutil.move(str(block), str(data / block.name))
    return True


def tui_refreshes(url: str, ranks: int, budget, what: str, n: int = 3,
                  limit_s: float | None = None, recorded: bool = True,
                  rank_series: bool = True) -> None:
    """What a TUI on this Prometheus waits per refresh: the first snapshot (per-unit stats
    computed or read from the recording rules), then `n` more with the same source (reused;
    recomputed in the background)."""
    from zerodoc.sources import PrometheusSource

    src = PrometheusSource(url, window=20, recorded=recorded, rank_series=rank_series)
    t = time.perf_counter()
    src.snapshot()
    first = time.perf_counter() - t
    later = []
    for _ in range(n):
        t = time.perf_counter()
        src.snapshot()
        later.append(time.perf_counter() - t)
    print(f"  a TUI on it ({ranks} ranks, {what}): first refresh {first:.1f} s, then "
          f"{statistics.median(later):.1f} s median of {n} (per-unit numbers reused)")
    budget(f"TUI refresh from Prometheus ({ranks} ranks, {what}), first / then",
           f"{first:.1f} s / {statistics.median(later):.1f} s"
           + (f" (first <= {limit_s:g} s)" if limit_s else ""),
           None if limit_s is None else first <= limit_s)


def _reset_peak(pid: int) -> None:
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS
    except OSError:
        pass


def _peak(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0
