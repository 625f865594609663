"""Many synthetic ranks served from one real rank's /metrics page, for scraping at scale.

`RankFarm` serves rank r's page at `http://127.0.0.1:PORT/r/<r>/metrics` (HTTP/1.1, text
format 0.0.4): rank 0's template for rank 0, rank 1's for every other rank (rank 0 alone serves
the run's unit facts, as in a real job), with the `rank`, `local_rank` and `node` labels
rewritten (8 ranks a node) and the run's counters *advancing*: every counter and histogram
series is its template value times k(t) = 1 + floor((t - t0) / `period_s`), i.e. the template's
steps repeated whole every period (step counts stay integers, sampled steps among them), so
every ratio of two counters of a rank (a per-step figure: seconds per sampled step, bytes per
call) is the template's own, whichever engine, window or extrapolation computes it, as long as
the window holds a period's jump. The last step's timestamp is the time of the last jump, the
last step number grows with the step counter (by the template's steps each period).

`file_sd(dir)` writes the targets as zerodoc's ranks write theirs (labels job, rank, local_rank,
node, run_id; `instance` one per rank; `__metrics_path__` the rank's path), so Prometheus,
vmagent or a Prometheus agent scrape the farm with zerodoc's own scrape config.

`capture(tmp, units)` runs a real 2-rank demo job with `units - 1` blocks and returns each
rank's page (text format) once it has logged a few sampled steps: the templates.
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

_TYPE = re.compile(r"# TYPE (\S+) (\S+)")
_LABEL = re.compile(r'(?<![a-z_])(rank|local_rank|node)="[^"]*"')
_RUN = re.compile(r'(?<![a-z_])run_id="[^"]*"')
TIMESTAMP = "zerodoc_last_step_timestamp_seconds"
LAST_STEP = "zerodoc_last_step"
STEP_COUNT = "zerodoc_step_duration_seconds_count"
RANKS_PER_NODE = 8


def node_of(rank: int) -> str:
    return f"node{rank // RANKS_PER_NODE:04d}"


# an OpenMetrics family's TYPE line in the text format 0.0.4: the samples' own name and a type
# that format knows
_TEXT_TYPE = {"counter": ("_total", "counter"), "info": ("_info", "gauge"),
              "stateset": ("", "gauge"), "unknown": ("", "untyped"),
              "gaugehistogram": ("", "histogram")}


_MARK = {"rank": "\x00R", "local_rank": "\x00L", "node": "\x00N"}  # filled in per rank


def _compile(text: str, run_id: str) -> tuple[str, list[tuple[float, str]]]:
    """A page as a %-format string with the rank's labels as marks, and per value its
    template value and how it moves ('grow', 'now', 'step' or ''); an OpenMetrics page comes
    out in the text format 0.0.4 (no HELP, UNIT, EOF, _created)."""
    parts, values, kind = [], [], ""
    for line in text.splitlines():
        if not line or (line.startswith("#") and not line.startswith("# TYPE ")):
            continue
        if line.startswith("#"):
            m = _TYPE.match(line)
            name, typ = m.group(1), m.group(2)
            kind = "grow" if typ in ("counter", "histogram", "summary") else ""
            suffix, typ = _TEXT_TYPE.get(typ, ("", typ))
            if not name.endswith(suffix):
                name += suffix
            parts.append(f"# TYPE {name} {typ}\n")
            continue
        if " # " in line:
            line = line.partition(" # ")[0]  # an exemplar
        if line.partition("{")[0].endswith("_created"):
            continue
        head, _, value = line.rpartition(" ")
        head = _RUN.sub(f'run_id="{run_id}"', _LABEL.sub(
            lambda m: f'{m.group(1)}="{_MARK[m.group(1)]}"', head))
        name = head.partition("{")[0]
        parts.append(head.replace("%", "%%") + " %r\n")
        values.append((float(value), "now" if name == TIMESTAMP else
                       "step" if name == LAST_STEP else kind))
    return "".join(parts), values


def _samples(fmt: str) -> list[str]:
    return [line for line in fmt.splitlines() if not line.startswith("#")]


class RankFarm:
    """`ranks` synthetic ranks of run `run_id` on 127.0.0.1 (see the module docstring)."""

    def __init__(self, templates: dict[int, str], ranks: int, *, run_id: str = "farm",
                 period_s: float = 4.0, job: str = "zerodoc"):
        self.ranks, self.run_id, self.period_s, self.job = ranks, run_id, period_s, job
        self._compiled = {w: _compile(templates.get(w, templates[0]), run_id) for w in (0, 1)}
        self._steps = {w: next((v for (v, _h), line in zip(values, _samples(fmt))
                                if line.startswith(STEP_COUNT)), 0.0)
                       for w, (fmt, values) in self._compiled.items()}
        self._rendered: dict[tuple, str] = {}  # (template, periods) -> page
        self.t0 = time.time()
        self.scrapes = 0
        farm = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):  # noqa: N802 - the stdlib's name
                m = re.fullmatch(r"/r/(\d+)/metrics", self.path.partition("?")[0])
                if not m or int(m.group(1)) >= farm.ranks:
                    self.send_error(404)
                    return
                body = farm.page(int(m.group(1))).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                farm.scrapes += 1

            def log_message(self, *a):
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request, client_address):  # a scraper gone: not ours
                pass

        self.server = Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True,
                                        name="rank-farm")

    def growth(self, t: float) -> int:
        return 1 + int((t - self.t0) // self.period_s)

    def _render(self, which: int, g: int) -> str:
        """Template `which`'s page after g periods (every rank of it the same but labels)."""
        key = (which, g)
        got = self._rendered.get(key)
        if got is None:
            fmt, values = self._compiled[which]
            steps = self._steps[which]
            stamp = self.t0 + (g - 1) * self.period_s
            got = fmt % tuple(v * g if how == "grow" else stamp if how == "now" else
                              v + steps * (g - 1) if how == "step" else v
                              for v, how in values)
            self._rendered = {k: p for k, p in self._rendered.items() if k[1] == g}
            self._rendered[key] = got
        return got

    def page(self, rank: int, t: float | None = None) -> str:
        g = self.growth(time.time() if t is None else t)
        page = self._render(min(rank, 1), g)
        return page.replace(_MARK["rank"], str(rank)).replace(
            _MARK["local_rank"], str(rank % RANKS_PER_NODE)).replace(_MARK["node"], node_of(rank))

    def targets(self) -> list[dict]:
        return [{"targets": [f"127.0.0.1:{self.port}"],
                 "labels": {"job": self.job, "rank": str(r),
                            "local_rank": str(r % RANKS_PER_NODE), "node": node_of(r),
                            "run_id": self.run_id, "instance": f"{node_of(r)}:{9730 + r}",
                            "__metrics_path__": f"/r/{r}/metrics"}}
                for r in range(self.ranks)]

    def file_sd(self, folder: Path) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{self.run_id}.json"
        path.write_text(json.dumps(self.targets(), indent=1))
        return path

    def __enter__(self) -> "RankFarm":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def capture(tmp: Path, units: int = 5, *, steps: int = 12, model: dict | None = None,
            timeout: float = 600.0) -> dict[int, str]:
    """Each rank's /metrics page (text format) of a real 2-rank demo job with `units - 1`
    blocks, once both ranks logged `steps` steps and counted a sampled step."""
    from zerodoc.demo.launch import Job
    from zerodoc.runlog import read_rank_tail

    run = Path(tmp) / "capture"
    spec = {"model": {"blocks": units - 1, "hidden": 64, "heads": 4, "vocab": 256, "seq": 16,
                      "batch": 2, **(model or {})}, "steps": 10**6,
            "attach": {"run_dir": str(run), "port": 0}}
    job = Job(2, spec, log_dir=str(run / "logs")).start()
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not job.running():
                raise RuntimeError("the capture job failed: "
                                   + (run / "logs" / "rank-0.out").read_text()[-800:])
            eps = {}
            for r in (0, 1):
                try:
                    log = read_rank_tail(run / f"rank-{r:05d}.jsonl", 1, detail=False)
                except Exception:  # noqa: BLE001 - not written yet
                    continue
                if log.last_step >= steps and log.facts.metrics_endpoint:
                    eps[r] = log.facts.metrics_endpoint
            if len(eps) == 2:
                pages = {r: urllib.request.urlopen(f"http://{ep}/metrics", timeout=10)
                         .read().decode() for r, ep in eps.items()}
                if all(re.search(r"^zerodoc_detail_steps_total\{.*\} [1-9]", p, re.M)
                       for p in pages.values()):
                    return pages
            time.sleep(0.5)
        raise RuntimeError(f"the capture job did not reach step {steps} in {timeout:.0f} s")
    finally:
        job.stop()


def shipped_pages() -> dict[int, str]:
    """The real 81-unit rank pages kept in tests/data/pages (their README says how they were
    made): rank 0's and rank 1's."""
    import gzip

    folder = Path(__file__).resolve().parent.parent / "tests" / "data" / "pages"
    return {r: gzip.decompress((folder / f"rank{r}-81units.om.gz").read_bytes()).decode()
            for r in (0, 1)}
