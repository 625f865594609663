"""Issue 33 item 2: the rewritten recording rules give the same numbers as the rules they replace.

`tests/data/rules_before/zerodoc-recording.yml` is the generator's output before the rewrite
(one group; each per-unit rule rate()s the raw per-unit counters itself, 41 rate() calls).
The shipped `rules/zerodoc-recording.yml` records each rank's per-step rate of each per-unit
counter once (group `zerodoc.unit_rates`) and aggregates those (group `zerodoc.units`); four
per-rank, per-unit series it no longer records at all (`unit_rank_views`: the layers
dashboard computes them at query time from the recorded rates). The shipped file's per-unit
groups use a 2m window; the new rules are generated here with the old 1m window
(`unit_window="1m"`, the one difference the generator's option makes) so both read the same
samples. `promtool test rules` evaluates both files at the same instants over the same input,
old names renamed `old_<name>`:

- 8 ranks made from a real 81-unit rank's page (tests/data/pages), its first 9 units (the root
  and 8 blocks; promtool's evaluation is single-threaded): rank 0 from rank 0's page
  (with the run's unit facts), ranks 1-7 from rank 1's with their labels rewritten; rank 7 is
  a coarse rank (its per-unit collective and compute counters folded over units, no `unit`
  label), ranks 1-7 serve the framework's time folded over units as zerodoc does from
  issue 33 on; world and group sizes 8. Units blocks.0-3 move 64x the bytes (a wider model
  there) so that some collectives are "large" (>= slow_link_min_bytes a call) and the
  slow-link rules have series.
- A second run of 4 such ranks whose all-gathers are all exposed (exposed == seconds): the
  synchronous rules have series too.
- Counters advance by seeded pseudo-random steps (not linearly: a rate over another window
  or at another instant would differ) and one per-unit counter resets midway.

For every name the old file records, one expression must be empty at each instant (for the
four no longer recorded, the query-time expression against the old recorded series): values
differing beyond 1e-9 relative, a label set on one side only, NaN or an infinity on one side
only, or no series at all (the names this data leaves empty are listed with why). promtool
evaluates every group at every tick whatever its `interval`, in `group_eval_order`: the new
per-unit group after the rank group, so it reads the rank group's series of the same instant,
as the old single group did (on a server it reads the rank group's last evaluation).
"""

from __future__ import annotations

import gzip
import random
import re
import subprocess
import zlib
from pathlib import Path

import pytest
import yaml

from tests.support.helpers import ROOT
from zerodoc.ops import alerts
from zerodoc.ops.alerts import RuleOptions
from zerodoc.ops.alerts.recording import unit_rank_views
from tests.support.promserver import require_binary

pytestmark = pytest.mark.slow

PAGES = ROOT / "tests" / "data" / "pages"
BEFORE = ROOT / "tests" / "data" / "rules_before" / "zerodoc-recording.yml"
SHIPPED = ROOT / "rules" / "zerodoc-recording.yml"
RUNS = {"rewrite": 8, "sync": 4}  # run_id: ranks
COARSE, STEPS, EVERY = 7, 24, 15  # samples per series, seconds apart
LARGE = {f"blocks.{i}" for i in range(4)}
UNITS = {"(root)", *(f"blocks.{i}" for i in range(8))}
PER_UNIT = ("zerodoc_collective_calls_total", "zerodoc_collective_bytes_total",
            "zerodoc_collective_seconds_total", "zerodoc_collective_exposed_seconds_total",
            "zerodoc_compute_seconds_total")
FRAMEWORK = "zerodoc_framework_unit_seconds_total"
# Recorded names with no series on this data, and why (the test fails if one gets series:
# the list must stay true).
EMPTY = {
    # a CPU run: no caching-allocator populations
    "rank:zerodoc_device_memory_reserved:bytes",
    "rank:zerodoc_device_memory_allocated:bytes",
    "rank:zerodoc_device_memory_fragmentation:ratio",
    "rank:zerodoc_device_memory_reserved:fraction",
}
_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def _page(r: int, ranks: int) -> list[tuple[str, str, dict, float]]:
    """(type, name, labels, value) of each sample of rank r's template page."""
    text = gzip.decompress((PAGES / f"rank{min(r, 1)}-81units.om.gz").read_bytes()).decode()
    kinds, out = {}, []
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _h, _t, fam, kind = line.split(" ")
            kinds[fam] = kind
        if not line or line.startswith("#"):
            continue
        name, labels, value = _LINE.match(line).groups()
        lab = dict(_LABEL.findall(labels or ""))
        if lab.get("unit", "(root)") not in UNITS:
            continue
        lab.update(rank=str(r), local_rank=str(r % 4), node=f"node{r // 4}")
        lab.pop("run_id", None)
        fam = re.sub(r"_(bucket|sum|count|total|info)$", "", name)
        v = float(value)
        if name in ("zerodoc_world_size", "zerodoc_unit_group_size"):
            v = float(ranks)
        elif name == "zerodoc_collective_bytes_total" and lab.get("unit") in LARGE:
            v *= 64
        out.append((kinds.get(fam, kinds.get(name, "gauge")), name, lab, v))
    return out


def _fold(samples, names) -> list:
    """The samples of `names` summed over units (a coarse rank's shape), the rest as they are."""
    keep, folded = [], {}
    for kind, name, lab, v in samples:
        if name in names and "unit" in lab:
            key = (kind, name, tuple(sorted((k, x) for k, x in lab.items() if k != "unit")))
            folded[key] = folded.get(key, 0.0) + v
        else:
            keep.append((kind, name, lab, v))
    return keep + [(k, n, dict(lab), v) for (k, n, lab), v in folded.items()]


def _values(kind: str, name: str, lab: dict, v0: float) -> list[float]:
    """STEPS samples: a gauge as it is, a counter or histogram growing by seeded
    pseudo-random steps (one series resets midway)."""
    if kind not in ("counter", "histogram"):
        return [v0] * STEPS
    # a histogram's buckets, sum and count grow together (cumulative buckets stay ordered)
    key = name if kind != "histogram" else re.sub(r"_(bucket|sum|count)$", "", name)
    rnd = random.Random(zlib.crc32(repr((key, sorted((k, x) for k, x in lab.items()
                                                      if k != "le"))).encode()))
    g, out, level = rnd.uniform(0.5, 1.5), [], 1.0
    for _ in range(STEPS):
        out.append(v0 * level)
        level += g * rnd.uniform(0.2, 1.8) / 20
    if name == "zerodoc_collective_seconds_total" and lab.get("rank") == "3" and \
            lab.get("unit") == "blocks.7" and lab.get("phase") == "backward":
        out = out[:STEPS // 2] + [x - out[STEPS // 2 - 1] for x in out[STEPS // 2:]]
    return out


def input_series() -> list[dict]:
    series = []
    for run, ranks in RUNS.items():
        for r in range(ranks):
            samples = _page(r, ranks)
            if r:
                samples = _fold(samples, {FRAMEWORK, *(PER_UNIT if r == COARSE else ())})
            seconds = {tuple(sorted(lab.items())): v0 for _k, name, lab, v0 in samples
                       if name == "zerodoc_collective_seconds_total"}
            for kind, name, lab, v0 in samples:
                like = name  # whose values it takes: every all-gather exposed in run "sync"
                if run == "sync" and name == "zerodoc_collective_exposed_seconds_total" and \
                        lab.get("collective") == "all_gather":
                    like, v0 = "zerodoc_collective_seconds_total", seconds[tuple(sorted(lab.items()))]
                lab = {**lab, "job": "zerodoc", "run_id": run, "instance": f"r{r}:9730"}
                vals = _values(kind, like, lab, v0)
                sel = ",".join(f'{k}="{x}"' for k, x in sorted(lab.items()))
                series.append({"series": f"{name}{{{sel}}}",
                               "values": " ".join(repr(x) for x in vals)})
    return series


def _renamed(text: str, names: set[str]) -> str:
    """The rule file with each recorded name `n` written `old_n` (whole names only)."""
    for n in sorted(names, key=len, reverse=True):
        text = re.sub(rf"(?<![\w:]){re.escape(n)}(?![\w:])", f"old_{n}", text)
    return text


def _recorded(path: Path) -> list[str]:
    doc = yaml.safe_load(path.read_text())
    return [r["record"] for g in doc["groups"] for r in g["rules"] if "record" in r]


def differs(n: str, new: str | None = None) -> str:
    """Empty where the new rules' `n` (or the expression `new`) equals the old rules' `n`
    (module docstring)."""
    o = f"old_{n}"
    n = f"({new})" if new else n
    return (f"(abs({n} - {o}) > 1e-9 * abs({o}) + 1e-12)"
            f" or ({n} unless {o}) or ({o} unless {n})"
            f" or (({n} != {n}) unless ({o} != {o})) or (({o} != {o}) unless ({n} != {n}))"
            f" or ((abs({n}) == Inf) unless (abs({o}) == Inf))"
            f" or ((abs({o}) == Inf) unless (abs({n}) == Inf))"
            + ("" if n in EMPTY else f" or absent({n})"))


def new_rules_text() -> str:
    """The shipped generator's recording rules with the old 1m per-unit window (docstring)."""
    return alerts.rule_files(opts=RuleOptions(unit_window="1m"))[alerts.RECORDING_FILE]


def write_suite(tmp: Path, new_text: str | None = None) -> tuple[Path, list[str]]:
    old = _recorded(BEFORE)
    new_text = new_rules_text() if new_text is None else new_text
    (tmp / "old.yml").write_text(_renamed(BEFORE.read_text(), set(old))
                                 .replace("name: zerodoc.recording", "name: old.recording"))
    (tmp / "new.yml").write_text(new_text)
    times = [f"{s}s" for s in range(5 * EVERY, STEPS * EVERY, 4 * EVERY)]
    views = unit_rank_views()
    tests = [{"expr": differs(n, views.get(n)), "eval_time": t, "exp_samples": []}
             for n in old for t in times]
    tests += [{"expr": f"count({n}) > 0", "eval_time": times[-1], "exp_samples": []}
              for n in EMPTY]
    suite = {"rule_files": ["new.yml", "old.yml"], "evaluation_interval": f"{EVERY}s",
             "group_eval_order": [*(g["name"] for g in yaml.safe_load(new_text)["groups"]),
                                  "old.recording"],
             "tests": [{"interval": f"{EVERY}s", "input_series": input_series(),
                        "promql_expr_test": tests}]}
    path = tmp / "suite.yml"
    path.write_text(yaml.safe_dump(suite, width=10**6, sort_keys=False))
    return path, old


def run_suite(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([require_binary("promtool"), "test", "rules", path.name],
                          cwd=path.parent, capture_output=True, text=True, timeout=600)


def test_rewritten_rules_equal_the_ones_they_replace(tmp_path):
    path, old = write_suite(tmp_path)
    new = set(_recorded(SHIPPED))
    # every name the old file recorded is still recorded (readers: the Prometheus source,
    # dashboards, alerts) but the four the dashboard now computes, and the shipped file is
    # the per-unit-rates-once one
    views = set(unit_rank_views())
    assert set(old) - views <= new and len(old) == 69 and views <= set(old) and not views & new
    assert {"unit_collective_rank:zerodoc_collective_seconds:per_step",
            "unit_collective_rank:zerodoc_collective_exposed_seconds:per_step"} <= new
    shipped = SHIPPED.read_text()
    assert shipped.count("rate(zerodoc_collective_") == 4, "each per-unit counter rated once"
    r = run_suite(path)
    assert r.returncode == 0, (r.stdout + r.stderr)[-6000:]
    assert "SUCCESS" in r.stdout
