"""Faults, load and hostile input against a live 2-rank job: what zerodoc said, what it cost.

    python bench/chaos.py [--quick] [--json] [--seconds S] [--rate R] [--only NAME ...]

Load rows run against a live 2-rank demo job (gloo, CPU; `tests/helpers.LiveDemo`) serving
/metrics on 127.0.0.1 only, one job without and one with basic auth (a bcrypt hash of cost
10, what `htpasswd -nB` writes; PBKDF2 without the bcrypt package). Each fault runs for a few
seconds between control stretches of the same job; the load generator is a separate process
pinned to one core (os.sched_setaffinity) that reports its own CPU. Columns:

- fault, and what zerodoc said: the exporter's own count of how it answered
  (`zerodoc_exporter_requests_total` by outcome, the difference over the stretch), or for a
  hostile file the exit code and first line of `zerodoc report`;
- slowdown: the mean step time of rank 0's steps that ended in the stretch (from the run
  log) against the mean of the control stretches just before and after it (the job runs
  control, fault, control, fault, ..., control), beside half the spread (max - min over
  mean) of all its control stretches: a slowdown inside that is noise;
- records lost: `zerodoc_runlog_dropped_records_total` (and `..._records_lost_total` where
  the build has it) over the stretch, both ranks;
- exporter CPU per request: `zerodoc_exporter_cpu_seconds_total` (the server threads' own
  per-thread CPU clocks) over the requests it answered, both ranks; in brackets the witness
  read from outside the rank: the kernel's CPU time (/proc/PID/task/TID/stat, 10 ms ticks)
  of the rank's threads named `zd-metrics*`, per request;
  With a /metrics sidecar (`--sidecar`, default `auto`: the basic-auth job has one,
  zerodoc/exporter/sidecar.py) the rank's exporter thread is the page publisher, and its
  CPU over the requests is what serving costs the rank; the sidecar process's own CPU
  (kernel's count, /proc/PID/stat of the rank's child named `zd-sidecar`) per request is
  printed beside it. The floods' request counts are the generator's answers;
- reader peak memory (hostile files: the `zerodoc report` process's peak RSS);
- load generator CPU (its own getrusage).

A "floor" row measures, in the same run, what a bare Python accept / answer / close loop
costs per connection on this machine (no zerodoc): the exporter's per-request CPU cannot go
below the kernel's and the interpreter's share of that. Both depend on the request rate
(`--rate`, default 200/s over the two ranks): the load generator sends one request at a time,
so at 100 requests/s per rank every request wakes the server from idle, and that wake-up
(scheduler, cold caches) is a large part of what a request costs.

Fault rows (`--only faults`, issue 32) come from the modules `bench/chaos_<area>.py`
(sidecar, auth, runlog, stops, ddp), each a function `rows(tmp)` that injects its faults into
real processes and says, per fault, what zerodoc said or did, the training slowdown where a
job ran, the records lost, and a note (how long /metrics took to come back, who was named).
A module that fails is a row that says so, never a missing row.

Hostile-file and disk-full rows use `zerodoc.testing.hostile` (the hostile-input makers of
issue 20 item 15) when this build has it; without it they are listed as not run.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

HOST = "127.0.0.1"
USER, RIGHT, WRONG = "prometheus", "right-horse-battery", "wrong-password"
SCRAPE_RATE = 200.0  # requests per second, all load kinds (--rate)
SLOW_CLIENTS = 20  # per rank
MANY_CONNECTIONS = 1300  # against rank 0
# The floods come from 20 loopback addresses ("20 clients"); the bench reads the exporter's
# counters from another one (Prometheus' address is not the attacker's).
CLIENTS = [f"127.0.0.{10 + i}" for i in range(20)]
RANKS = 2
OBSERVER = "127.0.0.2"
SIDECAR_LAG_S = 2.0  # a sidecar's counts are on the rank's page within this long
DEMO_MODEL = {"blocks": 2, "hidden": 128, "heads": 2, "vocab": 512, "seq": 64, "batch": 4}
_SAMPLE = re.compile(r'^(zerodoc_[a-z_]+)(?:\{([^}]*)\})? (\S+)$')


# ------------------------------------------------------------------------------ load side
def _request(auth: str | None, path: str = "/metrics", gz: bool = True) -> bytes:
    head = f"GET {path} HTTP/1.0\r\nHost: {HOST}\r\n"
    if gz:
        head += "Accept-Encoding: gzip\r\n"
    if auth:
        head += "Authorization: Basic " + base64.b64encode(auth.encode()).decode() + "\r\n"
    return (head + "\r\n").encode()


def _one(port: int, req: bytes, timeout: float = 5.0, src: str | None = None) -> str:
    """One request on a new connection (from source address `src`); its status code, or the
    error's name."""
    try:
        with socket.create_connection((HOST, port), timeout=timeout,
                                      source_address=(src, 0) if src else None) as s:
            s.sendall(req)
            chunks = []
            while True:
                b = s.recv(65536)
                if not b:
                    break
                chunks.append(b)
        head = b"".join(chunks)[:16]
        return head.split(b" ")[1].decode() if head.startswith(b"HTTP/") else "empty"
    except OSError as e:
        return type(e).__name__


def load_main(a) -> int:
    """The load generator (a child process): pinned to one core, prints a JSON summary."""
    os.sched_setaffinity(0, {a.cpu})
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    ports = [int(p) for p in a.ports.split(",")]
    codes: dict[str, int] = {}
    t0 = time.monotonic()
    end = t0 + a.seconds
    extra = {}
    kind = a.load
    if kind in ("scrape", "wrong", "right"):
        auth = {"scrape": a.auth, "wrong": f"{USER}:{WRONG}", "right": a.auth}[kind]
        req = _request(auth)
        i = 0
        while True:
            due = t0 + i / a.rate
            if due >= end:
                break
            now = time.monotonic()
            if due > now:
                time.sleep(due - now)
            c = _one(ports[i % len(ports)], req, src=CLIENTS[i % len(CLIENTS)])
            codes[c] = codes.get(c, 0) + 1
            i += 1
        extra["late_s"] = round(max(0.0, time.monotonic() - end), 2)
    elif kind == "slow":  # each client sends one byte every 2 s and never finishes
        socks = []
        for p in ports:
            for _ in range(SLOW_CLIENTS):
                try:
                    s = socket.create_connection((HOST, p), timeout=5,
                                                 source_address=(CLIENTS[0], 0))
                    s.sendall(b"GET /metrics HTTP/1.1\r\n")
                    s.setblocking(False)
                    socks.append(s)
                except OSError as e:
                    codes[type(e).__name__] = codes.get(type(e).__name__, 0) + 1
        cut = 0
        while time.monotonic() < end and socks:
            time.sleep(min(2.0, max(0.0, end - time.monotonic())))
            for s in list(socks):
                try:
                    if s.recv(4096) == b"":
                        raise ConnectionError
                except BlockingIOError:
                    try:
                        s.send(b"X")
                        continue
                    except OSError:
                        pass
                except OSError:
                    pass
                cut += 1
                socks.remove(s)
                s.close()
        extra.update(slow_clients=SLOW_CLIENTS * len(ports), cut_off=cut,
                     still_open=len(socks))
        codes["probe"] = _one(ports[0], _request(a.auth))  # /metrics still answers?
        for s in socks:
            s.close()
    elif kind == "conns":  # many connections held open against rank 0
        socks = []
        for _ in range(MANY_CONNECTIONS):
            try:
                s = socket.create_connection((HOST, ports[0]), timeout=5,
                                             source_address=(CLIENTS[len(socks) % 20], 0))
                socks.append(s)
            except OSError as e:
                codes[type(e).__name__] = codes.get(type(e).__name__, 0) + 1
        answered = 0
        for s in socks:
            s.setblocking(False)
        time.sleep(min(1.0, max(0.0, end - time.monotonic())))
        for s in socks:
            try:
                if s.recv(64).startswith(b"HTTP/1.0 503"):
                    answered += 1
            except OSError:
                pass
        extra.update(opened=len(socks), answered_503=answered)
        codes["probe"] = _one(ports[0], _request(a.auth))
        while time.monotonic() < end:
            time.sleep(0.1)
        for s in socks:
            s.close()
    ru = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"codes": codes, "cpu_s": ru.ru_utime + ru.ru_stime,
                      "wall_s": time.monotonic() - t0, **extra}))
    return 0


def floor_main(a) -> int:
    """A bare accept / read / answer / close loop's CPU per connection (no zerodoc)."""
    os.sched_setaffinity(0, {0})
    ls = socket.socket()
    ls.bind((HOST, 0))
    ls.listen(64)
    port = ls.getsockname()[1]
    n = 400 if a.quick else 2000
    client = subprocess.Popen([sys.executable, __file__, "--load", "scrape", "--ports",
                               str(port), "--seconds", str(n / a.rate), "--cpu", "1",
                               "--rate", str(a.rate)],
                              stdout=subprocess.PIPE, text=True)
    t0, k = time.thread_time(), 0
    ls.settimeout(2.0)
    while True:
        try:
            c, _ = ls.accept()
        except socket.timeout:
            break
        c.recv(65536)
        c.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n")
        c.shutdown(socket.SHUT_WR)
        c.close()
        k += 1
    cpu = time.thread_time() - t0
    client.wait()
    print(json.dumps({"connections": k, "cpu_per_connection_us": cpu / max(k, 1) * 1e6}))
    return 0


def credential_costs(tmp: Path, n: int = 20000) -> dict:
    """CPU of one basic-auth verdict (this process, per-thread clock): the first check of a
    credential (the hash), and a repeated right and wrong one (the remembered verdict)."""
    from zerodoc.exporter import webconfig

    users = json.loads(web_config(tmp).read_text())["basic_auth_users"]
    auth = webconfig.Authenticator(users)
    out = {"hash": users[USER].split("$")[1]}
    t = time.thread_time()
    auth.verdict(USER, RIGHT, "10.0.0.1")
    out["first_check_ms"] = (time.thread_time() - t) * 1e3
    auth.verdict(USER, WRONG, "10.0.0.2")
    for name, pw in (("repeated_right_us", RIGHT), ("repeated_wrong_us", WRONG)):
        t = time.thread_time()
        for _ in range(n):
            auth.verdict(USER, pw, "10.0.0.3")
        out[name] = (time.thread_time() - t) / n * 1e6
    out["hash_checks"] = auth.hash_checks
    out["calls"] = 2 * n + 2
    return out


# ------------------------------------------------------------------------------ job side
def _ticks(stat_path: str) -> float:
    f = open(stat_path).read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def proc_cpu(pid: int) -> float:
    return _ticks(f"/proc/{pid}/stat")


def server_threads_cpu(pid: int) -> float:
    """The witness: the kernel's CPU time of the rank's threads named zd-metrics* (the
    /metrics server's, `zerodoc.exporter.limits.name_thread`), read from outside."""
    total = 0.0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            if open(f"/proc/{pid}/task/{tid}/comm").read().startswith("zd-metrics"):
                total += _ticks(f"/proc/{pid}/task/{tid}/stat")
        except OSError:  # the thread ended
            pass
    return total


def sidecar_cpu(pid: int) -> float:
    """The CPU time of the rank's /metrics sidecar process (its child named zd-sidecar), 0
    where it has none (the server runs in the rank)."""
    total = 0.0
    try:
        kids = open(f"/proc/{pid}/task/{pid}/children").read().split()
    except OSError:
        return 0.0
    for kid in kids:
        try:
            if open(f"/proc/{kid}/comm").read().startswith("zd-sidecar"):
                total += proc_cpu(int(kid))
        except OSError:
            pass
    return total


def _get(endpoint: str, auth: str | None, path: str) -> str:
    host, port = endpoint.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10,
                                  source_address=(OBSERVER, 0)) as s:
        s.sendall(_request(auth, path, gz=False))
        data = b""
        while True:
            b = s.recv(1 << 20)
            if not b:
                break
            data += b
    return data.decode("utf-8", "replace").split("\r\n\r\n", 1)[-1]


def scrape_counters(endpoint: str, auth: str | None) -> dict:
    """The server's own counters (/metrics/exporter) and the run log's lost records."""
    out: dict = {}
    text = _get(endpoint, auth, "/metrics/exporter") + _get(endpoint, auth, "/metrics")
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if not m:
            continue
        name, labels, value = m.groups()
        if name == "zerodoc_exporter_requests_total":
            key = "req:" + re.search(r'outcome="([^"]*)"', labels).group(1)
        elif name in ("zerodoc_exporter_cpu_seconds_total",
                      "zerodoc_runlog_dropped_records_total",
                      "zerodoc_runlog_records_lost_total"):
            key = name
        else:
            continue
        out[key] = out.get(key, 0.0) + float(value)
    return out


class Stretch:
    """Counters, process CPU and time at the start of a stretch; `end()` gives the deltas."""

    def __init__(self, demo, auth):
        self.demo, self.auth = demo, auth
        self.settle()  # the reads that ended the stretch before are counted by now
        self.t0 = time.time()
        self.cpu0 = [server_threads_cpu(p.pid) for p in demo.job.procs]
        self.side0 = [sidecar_cpu(p.pid) for p in demo.job.procs]
        self.c0 = [scrape_counters(ep, auth) for ep in demo.endpoints]

    def settle(self) -> None:
        """A sidecar's counts reach the rank's /metrics/exporter page up to ~1.3 s late (its
        stats file at most every 0.25 s, read by the rank at once; the page rendered anew
        when the one served is over a second old): with sidecars, wait 2 s before the
        counts are read, at both ends."""
        if any(sidecar_cpu(p.pid) > 0 for p in self.demo.job.procs):
            time.sleep(SIDECAR_LAG_S)

    def end(self) -> dict:
        from zerodoc.runlog import read_rank_tail

        c1 = [scrape_counters(ep, self.auth) for ep in self.demo.endpoints]
        cpu1 = [server_threads_cpu(p.pid) for p in self.demo.job.procs]
        side1 = [sidecar_cpu(p.pid) for p in self.demo.job.procs]
        t1 = time.time()
        delta: dict = {}
        for a, b in zip(self.c0, c1):
            for k in b:
                delta[k] = delta.get(k, 0.0) + b[k] - a.get(k, 0.0)
        delta["req:ok"] = delta.get("req:ok", 0) - 2 * len(c1)  # our own 2 at the start, a rank
        log = read_rank_tail(self.demo.run_dir / "rank-00000.jsonl", 400, detail=True)
        steps = [s.step_seconds for s in log.steps if self.t0 <= s.end_unix <= t1]
        return {"seconds": t1 - self.t0, "steps": len(steps),
                "step_s": statistics.mean(steps) if steps else float("nan"),
                "server_threads_cpu_s": sum(cpu1) - sum(self.cpu0),
                "sidecar_cpu_s": sum(side1) - sum(self.side0), "counters": delta}


def run_load(kind: str, demo, auth, seconds: float, rate: float = SCRAPE_RATE) -> dict:
    st = Stretch(demo, auth)
    ports = ",".join(ep.rsplit(":", 1)[1] for ep in demo.endpoints)
    cmd = [sys.executable, __file__, "--load", kind, "--ports", ports, "--seconds",
           str(seconds), "--cpu", "1", "--rate", str(rate)]
    if auth:
        cmd += ["--auth", auth]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 120)
    st.settle()
    res = st.end()
    try:
        res["load"] = json.loads(out.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        res["load"] = {"error": (out.stderr or out.stdout)[-300:]}
    return res


def control(demo, auth, seconds: float) -> dict:
    st = Stretch(demo, auth)
    time.sleep(seconds)
    return st.end()


def said(counters: dict, load: dict) -> str:
    parts = [f"{k[4:]} {int(v)}" for k, v in sorted(counters.items())
             if k.startswith("req:") and int(v) > 0]
    if "cut_off" in load:
        parts.append(f"slow clients cut off {load['cut_off']}/{load['slow_clients']}")
    if "answered_503" in load:
        parts.append(f"{load['answered_503']}/{load['opened']} held connections answered 503")
    if "probe" in load.get("codes", {}):
        parts.append(f"/metrics during it: {load['codes']['probe']}")
    return "; ".join(parts) or "nothing"


def load_rows(a, tmp: Path) -> tuple[list, dict]:
    from tests.support.helpers import LiveDemo

    faults = {"plain": [(f"scrape flood {a.rate:g}/s", "scrape"), ("slow clients", "slow"),
                        ("many connections", "conns")],
              "auth": [(f"right-password flood {a.rate:g}/s", "right"),
                       (f"wrong-password flood {a.rate:g}/s", "wrong")]}
    rows, spreads = [], {}
    for job, todo in faults.items():
        todo = [t for t in todo if not a.only or t[1] in a.only]
        if not todo:
            continue
        env, auth = {}, None
        if a.sidecar != "auto":
            env["ZERODOC_EXPORTER_SIDECAR"] = "1" if a.sidecar == "on" else "0"
        if job == "auth":
            env["ZERODOC_WEB_CONFIG_FILE"] = str(web_config(tmp))
            auth = f"{USER}:{RIGHT}"
        with LiveDemo(tmp, name=f"chaos-{job}", env=env, model=DEMO_MODEL) as demo:
            demo.wait_steps(5)
            # control, fault, control, fault, ..., control: each fault against the mean of
            # the control stretches on either side of it (the machine drifts)
            ctl = [control(demo, auth, a.seconds)]
            done = []
            for name, kind in todo:
                secs = max(a.seconds, 12.0) if kind == "slow" else a.seconds
                done.append((name, kind, run_load(kind, demo, auth, secs, a.rate)))
                ctl.append(control(demo, auth, a.seconds))
            steps = [c["step_s"] for c in ctl]
            base = statistics.mean(steps)
            spread = (max(steps) - min(steps)) / base
            spreads[job] = {"step_s": base, "spread": spread, "stretches": len(ctl),
                            "steps": sum(c["steps"] for c in ctl)}
            for i, (name, _kind, r) in enumerate(done):
                near = statistics.mean([ctl[i]["step_s"], ctl[i + 1]["step_s"]])
                c = r["counters"]
                answered = sum(v for k, v in c.items() if k.startswith("req:"))
                load = r["load"]
                if kind_is_flood(_kind) and load.get("codes"):
                    # the floods' answers as the generator got them: exact, where a sidecar's
                    # counts reach the rank's page up to ~1.5 s late (and our reads with them)
                    answered = sum(v for k, v in load["codes"].items() if k.isdigit())
                rows.append({
                    "fault": name, "job": job, "said": said(c, load),
                    "slowdown": r["step_s"] / near - 1, "control_spread": spread,
                    "steps": r["steps"],
                    "records_lost": int(c.get("zerodoc_runlog_dropped_records_total", 0)
                                        + c.get("zerodoc_runlog_records_lost_total", 0)),
                    "requests": int(answered),
                    "exporter_cpu_per_request_us":
                        c.get("zerodoc_exporter_cpu_seconds_total", 0) / answered * 1e6
                        if answered else None,
                    "witness_cpu_per_request_us":
                        r["server_threads_cpu_s"] / answered * 1e6 if answered else None,
                    "exporter_cpu_s": c.get("zerodoc_exporter_cpu_seconds_total", 0),
                    "sidecar_cpu_s": r["sidecar_cpu_s"],
                    "sidecar_cpu_per_request_us":
                        r["sidecar_cpu_s"] / answered * 1e6 if answered else None,
                    "witness_cpu_s": r["server_threads_cpu_s"],
                    "reader_peak_mb": None, "loadgen_cpu_s": load.get("cpu_s"),
                    "rate_per_s": sum(v for k, v in load.get("codes", {}).items()
                                      if k != "probe") / load["wall_s"]
                    if load.get("wall_s") and kind_is_flood(_kind) else None,
                    "seconds": r["seconds"], "load": load})
    return rows, spreads


def kind_is_flood(kind: str) -> bool:
    return kind in ("scrape", "wrong", "right")


def web_config(tmp: Path) -> Path:
    try:
        import bcrypt

        h = bcrypt.hashpw(RIGHT.encode(), bcrypt.gensalt(rounds=10)).decode()
    except ImportError:
        from zerodoc.exporter import webconfig

        h = webconfig.hash_password(RIGHT, "pbkdf2-sha256")
    p = tmp / "web.yml"
    p.write_text(json.dumps({"basic_auth_users": {USER: h}}))
    return p


# ------------------------------------------------------------------------------ files side
def hostile_rows(a, tmp: Path) -> list:
    try:
        from zerodoc.testing import hostile
    except ImportError:
        return [{"fault": "hostile files, disk full", "said": "not run: zerodoc.testing.hostile "
                 "is not in this build", "slowdown": None}]
    cases = []
    for name, (over, _msg) in getattr(hostile, "HEADER_CASES", {}).items():
        cases.append((f"header {name}", lambda d, o=over: hostile.make_run(d, head_over=o)))
    size = (8 if a.quick else 200) << 20
    cases += [
        ("bad durations (NaN, inf, <0)",
         lambda d: hostile.make_run(d, bad={0: hostile.bad_duration_lines()})),
        (f"last line of {size >> 20} MB", lambda d: hostile.make_long_last_line(d, size)),
        ("deeply nested run-log line", lambda d: hostile.make_deep_runlog(d)),
        ("deeply nested trace", lambda d: hostile.make_deep_trace(d / "deep.json")),
        ("trace with NaN/negative times", lambda d: hostile.make_bad_times_trace(d / "t.json")),
        (f"gzip bomb ({1 if a.quick else 4} GB of valid events)",
         lambda d: hostile.make_gzip_bomb(d / "bomb.json.gz",
                                          (1 if a.quick else 4) << 30)),
    ]
    rows = []
    for name, make in cases:
        d = tmp / "hostile" / re.sub(r"\W+", "-", name)
        d.mkdir(parents=True, exist_ok=True)
        try:
            target = make(d)
        except Exception as e:  # noqa: BLE001 - a maker that no longer fits: say so
            rows.append({"fault": name, "said": f"not run: {type(e).__name__}: {e}"[:160],
                         "slowdown": None})
            continue
        t0 = time.monotonic()
        code, out, err, peak = run_measured([sys.executable, "-m", "zerodoc", "report",
                                             str(target)], timeout=120)
        errs = [ln for ln in err.strip().splitlines() if "error" in ln]  # not a progress line
        first = (errs or err.strip().splitlines() or out.strip().splitlines() or [""])[0]
        skipped = [ln.strip() for ln in out.splitlines() if "skipped" in ln][:1]
        rows.append({"fault": name, "said": f"exit {code}: "
                     f"{(skipped[0] if skipped and code == 0 else first)[:140]}",
                     "traceback": "Traceback" in err, "slowdown": None,
                     "records_lost": None, "reader_peak_mb": peak,
                     "seconds": time.monotonic() - t0})
    rows += disk_full_rows(tmp)
    return rows


def disk_full_rows(tmp: Path) -> list:
    """A run log written while its file-size limit (the disk full, EFBIG) or its descriptor
    limit (EMFILE) makes writes fail (zerodoc.testing.hostile.failing_writes_run), then
    `zerodoc report` on it: what was counted lost, and what the report says."""
    from zerodoc.testing import hostile

    rows = []
    for mode, name in (("fsize", "disk full mid-run (file-size limit)"),
                       ("nofile", "no file descriptors mid-run (EMFILE)")):
        run = tmp / "diskfull" / mode
        t0 = time.monotonic()
        try:
            counts, _err = hostile.failing_writes_run(run, mode)
        except Exception as e:  # noqa: BLE001 - say so in the table
            rows.append({"fault": name, "said": f"not run: {type(e).__name__}: {e}"[:160],
                         "slowdown": None})
            continue
        code, out, err, peak = run_measured([sys.executable, "-m", "zerodoc", "report",
                                             str(run)], timeout=120)
        notes = [ln.strip("- ").strip() for ln in out.splitlines()
                 if "not recorded" in ln or "lost" in ln][:1]
        stopped = "RUN STOPPED" in out or "ZD013" in out
        said = (f"exit {code}: "
                f"{(notes or ['nothing lost (the main log kept its records)'])[0][:110]}"
                + ("; ZD013 (run stopped)" if stopped else "; no crash invented"))
        rows.append({"fault": name, "said": said, "traceback": "Traceback" in err,
                     "slowdown": None, "records_lost": counts.get("lost"),
                     "reader_peak_mb": peak, "seconds": time.monotonic() - t0})
    return rows


def run_measured(cmd: list[str], timeout: float) -> tuple[int, str, str, float]:
    """Run `cmd`; (exit code, stdout, stderr, its own peak RSS in MB from wait4)."""
    import threading

    with tempfile.TemporaryFile("w+") as fo, tempfile.TemporaryFile("w+") as fe:
        p = subprocess.Popen(cmd, stdout=fo, stderr=fe, text=True, cwd=str(ROOT),
                             env=dict(os.environ, PYTHONPATH=str(ROOT)))
        killer = threading.Timer(timeout, p.kill)
        killer.start()
        try:
            _pid, status, ru = os.wait4(p.pid, 0)
        finally:
            killer.cancel()
        p.returncode = os.waitstatus_to_exitcode(status)
        fo.seek(0)
        fe.seek(0)
        return p.returncode, fo.read(), fe.read(), ru.ru_maxrss / 1024


# ------------------------------------------------------------------------------ faults side
FAULT_AREAS = ("sidecar", "auth", "runlog", "stops", "ddp")


def fault_rows(tmp: Path) -> list:
    """The rows of each `bench/chaos_<area>.py` module (issue 32's faults), in area order,
    each area in a process of its own (what one area's faults leave in a process, servers,
    threads, handlers, is not the next one's ground); a module that is missing or fails
    gives one row saying so."""
    rows = []
    for area in FAULT_AREAS:
        t0 = time.monotonic()
        d = tmp / f"faults-{area}"
        d.mkdir(parents=True, exist_ok=True)
        prog = ("import json, pathlib, sys; from bench.chaos_%s import rows; "
                "print(json.dumps(rows(pathlib.Path(sys.argv[1])), default=str))" % area)
        try:
            out = subprocess.run([sys.executable, "-c", prog, str(d)], capture_output=True,
                                 text=True, timeout=900, cwd=str(ROOT),
                                 env=dict(os.environ, PYTHONPATH=str(ROOT)))
            last = (out.stdout.strip().splitlines() or [""])[-1]
            if out.returncode != 0 or not last.startswith("["):
                tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
                raise RuntimeError(f"exit {out.returncode}: {tail}")
            got = json.loads(last)
        except Exception as e:  # noqa: BLE001 - a row that says so, not a lost table
            got = [{"fault": f"{area}: all rows", "said": f"not run: {type(e).__name__}: "
                    f"{e}"[:160], "slowdown": None, "lost": None, "note": ""}]
        for r in got:
            r.setdefault("area", area)
            r.setdefault("seconds", (time.monotonic() - t0) / max(1, len(got)))
        rows += got
    return rows


def fault_table(rows: list) -> str:
    lines = ["| area | fault | what zerodoc said or did | training slowdown | records lost | "
             "note |", "|---|---|---|---|---|---|"]
    for r in rows:
        slow = (f"{(r['slowdown'] - 1) * 100:+.1f} %" if r.get("slowdown") is not None
                else "n/a")
        lines.append(f"| {r['area']} | {r['fault']} | {r['said']} | {slow} | "
                     f"{fmt(r.get('lost'), 'd')} | {r.get('note') or ''} |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------ table
def fmt(v, spec: str, none: str = "n/a") -> str:
    if v is None or (isinstance(v, float) and v != v):
        return none
    return format(v, spec)


def table(rows: list, spreads: dict, floor: dict | None, cred: dict | None = None) -> str:
    lines = ["| fault | what zerodoc said | slowdown (control spread) | records lost | "
             "exporter CPU / request (witness) | exporter CPU, share of a core per rank | "
             "reader peak | load generator |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        slow = (f"{r['slowdown'] * 100:+.1f} % (±{r['control_spread'] * 100 / 2:.1f} %)"
                if r.get("slowdown") is not None else "n/a")
        cpu = share = "n/a"
        if r.get("exporter_cpu_per_request_us") is not None:
            # the witness counts 10 ms ticks: below 50 ms in all it cannot say much
            witness = (f"{r['witness_cpu_per_request_us']:.0f} µs"
                       if r.get("witness_cpu_s", 0) >= 0.05 else "below its 10 ms ticks")
            cpu = f"{r['exporter_cpu_per_request_us']:.0f} µs × {r['requests']} ({witness})"
            if r.get("sidecar_cpu_s"):
                cpu += f"; sidecar {r['sidecar_cpu_per_request_us']:.0f} µs"
            share = (f"{r['exporter_cpu_s']:.2f} s in {r['seconds']:.0f} s, "
                     f"{r['exporter_cpu_s'] / r['seconds'] / RANKS * 100:.1f} %")
        gen = (f"{r['loadgen_cpu_s']:.1f} s CPU in {r['seconds']:.0f} s"
               if r.get("loadgen_cpu_s") is not None else "n/a")
        if r.get("rate_per_s"):
            gen += f", {r['rate_per_s']:.0f} req/s"
        peak = fmt(r.get("reader_peak_mb"), ".0f", "n/a")
        peak = peak + " MB" if peak != "n/a" else peak
        lost = fmt(r.get("records_lost"), "d")
        tb = " (TRACEBACK)" if r.get("traceback") else ""
        lines.append(f"| {r['fault']} | {r['said']}{tb} | {slow} | {lost} | {cpu} | {share} | "
                     f"{peak} | {gen} |")
    for job, s in spreads.items():
        lines.append("")
        lines.append(f"Control ({job} job): mean step {s['step_s'] * 1e3:.1f} ms over "
                     f"{s['stretches']} stretches, one before and after each fault "
                     f"({s['steps']} steps of rank 0), spread {s['spread'] * 100:.1f} %.")
    if floor:
        lines.append("")
        lines.append(f"Floor: a bare Python accept/read/answer/close loop costs "
                     f"{floor['cpu_per_connection_us']:.0f} µs of CPU per connection on this "
                     f"machine ({floor['connections']} connections).")
    if cred:
        lines.append("")
        lines.append(f"Credential check (bcrypt ${cred['hash']}$ cost 10 or PBKDF2): the first "
                     f"check of a credential {cred['first_check_ms']:.1f} ms of CPU; a repeated "
                     f"right one {cred['repeated_right_us']:.1f} µs, a repeated wrong one "
                     f"{cred['repeated_wrong_us']:.1f} µs ({cred['hash_checks']} hash checks "
                     f"in {cred['calls']} verdicts).")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="short stretches, small files")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.add_argument("--seconds", type=float, default=None, help="seconds per stretch")
    p.add_argument("--rate", type=float, default=SCRAPE_RATE,
                   help="requests per second of the floods (and the floor's), from 20 "
                        "addresses, one at a time (default %(default)g)")
    p.add_argument("--sidecar", choices=("auto", "on", "off"), default="auto",
                   help="serve /metrics from a sidecar process: auto (the default: with "
                        "basic auth), on, off ($ZERODOC_EXPORTER_SIDECAR in the jobs)")
    p.add_argument("--only", nargs="*", default=None,
                   help="kinds to run: scrape slow conns wrong right files floor faults")
    # the load generator's own arguments (bench/chaos.py runs itself)
    p.add_argument("--load", help=argparse.SUPPRESS)
    p.add_argument("--ports", help=argparse.SUPPRESS)
    p.add_argument("--auth", help=argparse.SUPPRESS)
    p.add_argument("--cpu", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--floor", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.seconds is None:
        a.seconds = 4.0 if a.quick else 8.0
    if a.load:
        return load_main(a)
    if a.floor:
        return floor_main(a)
    tmp = Path(tempfile.mkdtemp(prefix="zerodoc-chaos-"))
    rows, spreads, floor = [], {}, None
    if a.only is None or "floor" in a.only:
        out = subprocess.run([sys.executable, __file__, "--floor", "--rate", str(a.rate)]
                             + (["--quick"] if a.quick else []),
                             capture_output=True, text=True, timeout=300)
        floor = json.loads(out.stdout.strip().splitlines()[-1])
    cred = credential_costs(tmp) if a.only is None or "floor" in a.only else None
    r, spreads = load_rows(a, tmp)
    rows += r
    if a.only is None or "files" in a.only:
        rows += hostile_rows(a, tmp)
    faults = fault_rows(tmp) if a.only is None or "faults" in a.only else []
    if a.json:
        print(json.dumps({"rows": rows, "faults": faults, "controls": spreads, "floor": floor,
                          "credential": cred, "cpus": os.cpu_count()}, indent=1, default=str))
    else:
        if rows:
            print(table(rows, spreads, floor, cred))
        if faults:
            print("\n" + fault_table(faults))
    return 0


if __name__ == "__main__":
    sys.exit(main())
