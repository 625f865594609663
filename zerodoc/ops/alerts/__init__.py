"""Prometheus recording and alerting rules for zerodoc, generated from `zerodoc.thresholds`.

    python -m zerodoc.cli.rules_gen          # rewrite rules/*.yml and the PrometheusRule manifest
    python -m zerodoc.cli.rules_gen --check  # exit 1 if the committed files are stale

The alert thresholds are read from `Thresholds`, the rules engine's numbers, and the alerts
fire on recording rules that compute the engine's own quantities (`recording.py`), so an
alert and the matching `ZD…` rule agree on the same data. `RuleOptions` sets what PromQL
cannot know: the rate window (`1m` in production; the integration test generates a variant
with a short window and `for:`), the link class the bandwidth numbers are judged against,
and the prefix of `runbook_url`.

Standard library only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from .. import resources
from ...thresholds import DEFAULT, LINK_BUSBW, Thresholds
from . import twolevel
from .alerting import alerting_rules, runbook_url
from .recording import recording_groups, recording_rules, unit_window
from .yamltext import dump

RECORDING_FILE = "zerodoc-recording.yml"
ALERTS_FILE = "zerodoc-alerts.yml"
PROMETHEUS_RULE_FILE = "zerodoc-prometheusrule.yaml"
LAYOUTS = ("flat", "two-level")
TWO_LEVEL_DIR = "two-level"
"""rules/two-level/: the two-level layout's files (`rule_files` with layout="two-level")."""
_DURATION = re.compile(r"^(\d+(ms|s|m|h|d|w|y))+$")

__all__ = ["RuleOptions", "recording_rules", "alerting_rules", "recording_names",
           "rule_files", "rules_dir", "write_rules", "stale_files", "prometheus_rule",
           "write_prometheus_rule", "stale_prometheus_rule", "runbook_url"]


@dataclass(frozen=True, kw_only=True)
class RuleOptions:
    window: str = "1m"
    """Range of every rate() in the rules: at least 4 scrape intervals."""
    alert_for: str | None = None
    """`for:` of the engine-mirroring alerts (None: Thresholds.alert_for)."""
    link: str = "infiniband"
    """Link class (thresholds.LINK_BUSBW) whose expected bus bandwidth explains synchronous
    collective time and judges the slow-link alert."""
    runbook_base: str = ""
    """Prefix of runbook_url (e.g. your repository's blob URL); "" keeps repo-relative
    paths such as docs/runbooks.md#zerodocslowlink."""
    extra_labels: dict[str, str] = field(default_factory=dict)
    """Labels added to every alert (e.g. team routing)."""
    unit_window: str | None = None
    """Rate window and interval of the per-unit groups `zerodoc.unit_rates` and
    `zerodoc.units` (None: four times `window`, so 4m in production: at 1,024 ranks x 81
    units they take ~45 s and ~60 s an evaluation on 2 cores; issue 33,
    docs/operations.md)."""
    unit_interval: str | None = None
    """Evaluation interval of the per-unit groups (None: their rate window, one evaluation
    per window; tests that read many evaluations set it shorter)."""
    layout: str = "flat"
    """"flat": one server scrapes every rank and evaluates every rule (rules/*.yml).
    "two-level": per-rack Prometheus servers pre-aggregate per unit and remote-write to a
    central store that combines the racks into the flat names (`twolevel`,
    rules/two-level/; docs/operations.md, "The two-level layout")."""

    def __post_init__(self) -> None:
        for name in ("window", "alert_for", "unit_window", "unit_interval"):
            v = getattr(self, name)
            if v is not None and not _DURATION.match(v):
                raise ValueError(f"RuleOptions.{name}: {v!r} is not a Prometheus duration")
        if self.layout not in LAYOUTS:
            raise ValueError(f"RuleOptions.layout: {self.layout!r}; known: {', '.join(LAYOUTS)}")
        if self.link not in LINK_BUSBW:
            raise ValueError(f"RuleOptions.link: unknown link class {self.link!r}; "
                             f"known: {', '.join(LINK_BUSBW)}")


def _records(t: Thresholds, o: RuleOptions) -> list[dict]:
    return recording_rules(t, window=o.window, link=o.link)


def _recording_groups(t: Thresholds, o: RuleOptions) -> list[dict]:
    """The recording groups as rule-file groups: a group with an interval of its own says it."""
    return [{"name": name, **({"interval": iv} if iv else {}), "rules": rules}
            for name, iv, rules in recording_groups(t, window=o.window, link=o.link,
                                                    unit_interval=o.unit_interval,
                                                    unit_win=o.unit_window)]


def _alerts(t: Thresholds, o: RuleOptions) -> list[dict]:
    return alerting_rules(t, window=o.window, alert_for=o.alert_for, link=o.link,
                          runbook_base=o.runbook_base, extra_labels=o.extra_labels,
                          unit_window=o.unit_window or unit_window(o.window))


def recording_names(t: Thresholds = DEFAULT) -> set[str]:
    """Names of the recorded series (the metric-name check accepts them)."""
    return {r["record"] for r in _records(t, RuleOptions())}


def _header(t: Thresholds, o: RuleOptions, what: str,
            how: str = "`python -m zerodoc.cli.rules_gen`",
            regen: str = "`make dashboards` regenerates it; ") -> str:
    return (f"# zerodoc {what}. Generated by {how} from "
            f"zerodoc/thresholds.py;\n# do not edit by hand ({regen}"
            "a test fails when it is stale).\n"
            f"# window={o.window} unit_window={o.unit_window or unit_window(o.window)} "
            f"for={o.alert_for or t.alert_for} link={o.link}\n")


def rule_files(t: Thresholds = DEFAULT, opts: RuleOptions | None = None) -> dict[str, str]:
    """{file name: YAML text} of the two rule files (the flat layout), or the two-level
    layout's files by their paths under rules/two-level/: the centre's rules (with the flat
    alerts file beside them), a rack's rules and a rack Prometheus' configuration."""
    o = opts or RuleOptions()
    if o.layout == "two-level":
        return _two_level_files(t, o)
    rec = {"groups": _recording_groups(t, o)}
    alerts = {"groups": [{"name": "zerodoc.alerts", "rules": _alerts(t, o)}]}
    return {RECORDING_FILE: _header(t, o, "recording rules") + dump(rec),
            ALERTS_FILE: _header(t, o, "alerting rules") + dump(alerts)}


def _two_level_files(t: Thresholds, o: RuleOptions) -> dict[str, str]:
    kw = {"window": o.window, "unit_win": o.unit_window, "unit_interval": o.unit_interval}
    uw = o.unit_window or unit_window(o.window)
    rack = {"groups": twolevel.rack_groups(t, **kw)}
    central = {"groups": twolevel.central_groups(t, link=o.link, **kw)}
    config = twolevel.rack_prometheus_config(
        "rack0", "http://central.example:8428/api/v1/write",
        ranks_sd=["/var/lib/zerodoc/targets/rack0/*.json"],
        facts_sd=["/var/lib/zerodoc/targets/rack0/*-rank-00000.json"], t=t, unit_win=uw)
    how = "python -m zerodoc.cli.rules_gen --layout two-level"
    example = ("# An example: one rack's Prometheus (rack0). Set external_labels."
               f"{twolevel.RACK_LABEL} per rack,\n# the file_sd paths of its ranks and of rank 0, "
               "and the central store's write URL.\n")
    return {f"{twolevel.CENTRAL_FILE}": _header(t, o, "two-level: central recording rules", how, "")
            + dump(central),
            f"rack/{twolevel.RACK_FILE}": _header(t, o, "two-level: rack recording rules", how, "")
            + dump(rack),
            f"rack/{twolevel.RACK_CONFIG_FILE}": _header(t, o, "two-level: rack Prometheus", how, "")
            + example + dump(config)}


def prometheus_rule(t: Thresholds = DEFAULT, opts: RuleOptions | None = None) -> str:
    """The same rule groups as a Prometheus-operator `PrometheusRule` manifest."""
    o = opts or RuleOptions()
    doc = {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
           "metadata": {"name": "zerodoc", "labels": {"app.kubernetes.io/name": "zerodoc"}},
           "spec": {"groups": [*_recording_groups(t, o),
                               {"name": "zerodoc.alerts", "rules": _alerts(t, o)}]}}
    return _header(t, o, "rules for the Prometheus operator") + dump(doc)


def write_prometheus_rule(out_dir: str | Path | None = None, t: Thresholds = DEFAULT,
                          opts: RuleOptions | None = None) -> Path:
    path = Path(out_dir or resources.kubernetes_dir()) / PROMETHEUS_RULE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(prometheus_rule(t, opts), encoding="utf-8")
    return path


def rules_dir(opts: RuleOptions | None) -> Path:
    """rules/, or rules/two-level/ for that layout's files."""
    top = Path(resources.rules_dir())
    return top / TWO_LEVEL_DIR if opts and opts.layout == "two-level" else top


def write_rules(out_dir: str | Path | None = None, t: Thresholds = DEFAULT,
                opts: RuleOptions | None = None) -> list[Path]:
    out_dir = Path(out_dir or rules_dir(opts))
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, text in rule_files(t, opts).items():
        (out_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (out_dir / name).write_text(text, encoding="utf-8")
        paths.append(out_dir / name)
    return paths


def stale_files(out_dir: str | Path | None = None, t: Thresholds = DEFAULT,
                opts: RuleOptions | None = None) -> list[str]:
    """Rule files whose committed text differs from what the generator writes now."""
    out_dir = Path(out_dir or rules_dir(opts))
    return [name for name, text in rule_files(t, opts).items()
            if not (out_dir / name).exists()
            or (out_dir / name).read_text(encoding="utf-8") != text]


def stale_prometheus_rule(out_dir: str | Path | None = None, t: Thresholds = DEFAULT,
                          opts: RuleOptions | None = None) -> bool:
    path = Path(out_dir or resources.kubernetes_dir()) / PROMETHEUS_RULE_FILE
    return not path.exists() or path.read_text(encoding="utf-8") != prometheus_rule(t, opts)
