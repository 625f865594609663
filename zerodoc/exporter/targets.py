"""Prometheus scrape targets for a zerodoc run: `file_sd` entries, one per rank.

Standard library only: the shim calls `write_rank_target()` from inside a training rank
once its /metrics server is up, so a Prometheus with a `file_sd_configs` glob over
`<run_dir>/file_sd/*.json` finds every rank of a multi-node job without a hand-written list.
`zerodoc targets` and `zerodoc stack` build the same list afterwards from the run log
headers (`run_targets`).

Each entry carries the labels `job`, `rank`, `local_rank`, `node`, `run_id`. The rank labels
repeat what every zerodoc series already carries; on the target they also label `up`, which
is how the exporter-down alert names the rank that vanished. Scrape with
`honor_labels: true` (see `exporters/prometheus.yml`) so the two copies do not turn into
`exported_rank` labels.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from ..errors import UserError

DEFAULT_JOB = "zerodoc"
FILE_SD_DIR = "file_sd"
# One directory for the targets of every run (a Prometheus file_sd glob accepts `*` in the
# last path segment only, so per-run directories need one glob each).
FILE_SD_DIR_ENV = "ZERODOC_FILE_SD_DIR"
# Addresses that mean "every interface": the target must then name the node instead.
_WILDCARD_HOSTS = {"", "0.0.0.0", "::", "[::]", "*"}


def target_name(rank: int) -> str:
    return f"rank-{rank:05d}.json"


def _get(facts, name: str):
    """A field of a RankFacts or of a run log header dict."""
    return facts[name] if isinstance(facts, dict) else getattr(facts, name)


def split_endpoint(endpoint: str) -> tuple[str, int]:
    """("host", port) from "host:port", "[v6]:port" or a bare v6 "::1:port"."""
    host, sep, port = endpoint.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"metrics endpoint {endpoint!r} is not host:port")
    return host.strip("[]") if host.startswith("[") else host, int(port)


def scrape_address(endpoint: str, node: str) -> str:
    """The address Prometheus should scrape for a rank serving on `endpoint`.

    A rank bound to a wildcard address (0.0.0.0, ::) is reached through its node's hostname;
    one bound to a specific address (127.0.0.1 included) is reached there.
    """
    host, port = split_endpoint(endpoint)
    if host in _WILDCARD_HOSTS:
        host = node
    if ":" in host:  # an IPv6 literal needs brackets in host:port
        host = f"[{host}]"
    return f"{host}:{port}"


def file_sd_entry(facts, job: str | None = None) -> dict:
    """One file_sd target group for a rank (`facts`: RankFacts or a header dict).

    `job` defaults to $ZERODOC_JOB, else "zerodoc". Raises ValueError when the rank serves
    no /metrics endpoint.
    """
    endpoint = _get(facts, "metrics_endpoint")
    if not endpoint:
        raise ValueError(f"rank {_get(facts, 'rank')} serves no /metrics endpoint")
    node = str(_get(facts, "node"))
    return {
        "targets": [scrape_address(str(endpoint), node)],
        "labels": {
            "job": job or os.environ.get("ZERODOC_JOB") or DEFAULT_JOB,
            "rank": str(_get(facts, "rank")),
            "local_rank": str(_get(facts, "local_rank")),
            "node": node,
            "run_id": str(_get(facts, "run_id")),
        },
    }


def write_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write `text` to `path` through a temporary file and a rename, so a Prometheus
    re-reading the file never sees half of it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def target_path(run_dir: str | os.PathLike, facts) -> Path:
    """Where a rank's target file goes: `$ZERODOC_FILE_SD_DIR/<run_id>-rank-NNNNN.json` when
    that is set, else `<run_dir>/file_sd/rank-NNNNN.json`."""
    name = target_name(int(_get(facts, "rank")))
    shared = os.environ.get(FILE_SD_DIR_ENV)
    if shared:
        return Path(shared) / f"{_get(facts, 'run_id')}-{name}"
    return Path(run_dir) / FILE_SD_DIR / name


def write_rank_target(run_dir: str | os.PathLike, facts, job: str | None = None) -> Path:
    """Atomically write this rank's file_sd target file (see `target_path`); returns the path.

    Raises ValueError (no endpoint) or OSError (cannot write): the caller inside a
    training rank catches and counts them.
    """
    entry = file_sd_entry(facts, job)
    return write_atomic(target_path(run_dir, facts), json.dumps([entry], indent=1) + "\n")


def remove_rank_target(run_dir: str | os.PathLike, facts) -> None:
    """Remove this rank's target file (on a clean close), so Prometheus stops scraping a
    rank that is gone instead of reporting it down forever. No file: nothing to do."""
    try:
        os.unlink(target_path(run_dir, facts))
    except FileNotFoundError:
        pass


# --- a run's targets afterwards, from its run log headers (`zerodoc targets`, `zerodoc stack`)

def read_header(path: Path) -> tuple[dict, bool]:
    """The header dict of a rank log, and whether the log ends with a clean end record."""
    from ..runlog.scan import MAX_LINE, newest_head

    try:
        with open(path, "rb") as f:
            first = f.readline(MAX_LINE)
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - 4096))
            tail = f.read().decode("utf-8", "replace")
            newest = newest_head(f, size)  # a reused run directory: the newest segment's
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror or e}") from None
    try:
        head = newest[1] if newest is not None else json.loads(first)
    except (ValueError, RecursionError):  # not JSON, or nested beyond reason
        raise UserError(f"{path}: first line is not a zerodoc header") from None
    if not isinstance(head, dict) or head.get("type") != "header":
        raise UserError(f"{path}: first line is not a zerodoc header")
    last = [ln for ln in tail.splitlines() if ln.strip()][-1:]
    rec = last[0].replace(" ", "") if last else ""
    # an end written while an exception ended the training is not a clean end: the rank
    # stays a target (it shows as down)
    ended = '"type":"end"' in rec and '"failed":true' not in rec
    return head, ended


def run_targets(run_dir: str | Path, job: str | None = None,
                include_ended: bool = False) -> tuple[list[dict], list[str]]:
    """(file_sd entries sorted by rank, warnings) for a run directory."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UserError(f"no run directory at {run_dir}")
    logs = sorted(run_dir.glob("rank-*.jsonl"))
    if not logs:
        raise UserError(f"{run_dir} holds no rank-*.jsonl run logs")
    entries, warnings, ended_ranks = [], [], []
    for p in logs:
        head, ended = read_header(p)
        if ended and not include_ended:
            ended_ranks.append(head.get("rank"))
            continue
        try:
            entries.append(file_sd_entry(head, job))
        except (ValueError, KeyError) as e:
            warnings.append(f"{p.name}: {e}; skipped")
    if ended_ranks:
        warnings.append(f"rank(s) {', '.join(map(str, ended_ranks))} finished; "
                        "skipped (--include-ended lists them)")
    entries.sort(key=lambda e: int(e["labels"]["rank"]))
    loopback = [e for e in entries if e["targets"][0].startswith(("127.", "localhost", "[::1]"))]
    nodes = {e["labels"]["node"] for e in entries}
    if loopback and len(nodes) > 1:
        warnings.append(f"ranks on {len(nodes)} nodes serve /metrics on a loopback address; "
                        "only a Prometheus on the same node can scrape them "
                        "(attach(..., host='0.0.0.0') serves on every interface)")
    return entries, warnings
