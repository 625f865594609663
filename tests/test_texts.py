"""What a user reads: rule titles and fixes that agree with their evidence, the planner and
the report agreeing with each other, `--help` and units that say what they mean.

Every case here is one a new user met (issue "The first hour"): each test failed before
its fix.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from zerodoc.cli.main import build_parser, main as zerodoc_main
from zerodoc.cli.helpformat import DefaultsHelpFormatter, shows_default
from zerodoc.diagnosis import diagnose
from zerodoc.humanize import nbytes
from zerodoc.testing.rulecases import load_case
from zerodoc.errors import UserError
from zerodoc.runmodel import RankFacts, UnitFacts
from zerodoc.runlog import RunLogWriter, load_run

DATA = Path(__file__).parent / "data" / "rules"
GB = 10**9


def findings_of(case_path: Path, code: str):
    case = load_case(case_path)
    return [f for f in diagnose(case.snapshot, case.thresholds, link=case.link,
                                device_memory_bytes=case.device_memory_bytes)
            if f.code == code]


# --- rule texts ---------------------------------------------------------------------------

def test_zd002_title_agrees_with_its_evidence():
    """"latency-bound (150 MB/s)" while the evidence showed the small all-gathers above the
    reference busbw (120 MB/s): now the title says latency-bound only when they are slower."""
    (f,) = findings_of(DATA / "ZD002" / "fail-small-gathers-at-link-speed.json", "ZD002")
    assert f.evidence["small_all_gather_busbw_bytes_per_second"] > \
        f.evidence["reference_busbw_bytes_per_second"]
    assert "latency-bound" not in f.title
    assert "36 all-gathers per step" in f.title
    (slow,) = findings_of(DATA / "ZD002" / "fail-per-linear.json", "ZD002")  # 4.4 vs 150 GB/s
    assert slow.evidence["small_to_reference_busbw_ratio"] < 0.5
    assert "latency-bound (4.37 GB/s bus bandwidth vs 150 GB/s)" in slow.title


def test_wrap_fixes_name_the_models_own_block_list():
    """ZD001's fix said `model.layers` whatever the model called its blocks."""
    (f,) = findings_of(DATA / "ZD002" / "fail-small-gathers-at-link-speed.json", "ZD002")
    assert "for block in model.blocks: fully_shard(block)" in f.fix  # from the unit names
    case = load_case(DATA / "ZD001" / "fail-root-holds-most.json")  # units "layers.N"
    (z1,) = [x for x in diagnose(case.snapshot) if x.code == "ZD001"]
    assert "for block in model.layers:" in z1.fix
    # a root-only wrap has no unit names to read: the shim records the container
    for rank in case.snapshot.ranks.values():
        rank.facts = _replace_config(rank.facts, block_container="trunk.stages")
        rank.facts = _replace_units(rank.facts, rank.facts.units[:1])
    (z1,) = [x for x in diagnose(case.snapshot) if x.code == "ZD001"]
    assert "for block in model.trunk.stages: fully_shard(block)" in z1.fix
    assert "model.layers" not in z1.fix


def _replace_config(facts: RankFacts, **cfg) -> RankFacts:
    from dataclasses import replace

    return replace(facts, config={**facts.config, **cfg})


def _replace_units(facts: RankFacts, units) -> RankFacts:
    from dataclasses import replace

    return replace(facts, units=tuple(units))


def test_zd003_is_silent_on_a_root_only_wrap():
    """ZD003 recommended reshard_after_forward=False with its own evidence saying
    backward_all_gather_bytes_per_step = 0 B."""
    assert findings_of(DATA / "ZD003" / "pass-root-only-never-regathers.json", "ZD003") == []


# --- the planner and ZD003 agree ----------------------------------------------------------

def _run_with_headroom(tmp_path: Path) -> Path:
    """A ZeRO-3 run (FSDP2, 8 ranks) of a 1.3B model on 80 GB devices: every stage fits."""
    units = tuple(UnitFacts(name=f"blocks.{i}" if i else "(root)", params=130_000_000,
                            param_bytes=260_000_000, gather_bytes=260_000_000,
                            sharded_bytes=32_500_000, reshard_after_forward=bool(i),
                            group_size=8, param_dtype="bfloat16", reduce_dtype="bfloat16")
                  for i in range(10))
    for rank in range(8):
        facts = RankFacts(rank=rank, local_rank=rank, world_size=8, local_world_size=8,
                          node="n0", run_id="agree", framework="fsdp2",
                          framework_version="2.13", torch_version="2.13.0",
                          device_type="cuda", backend="nccl", zero_stage=3, mesh_shape=(8,),
                          mesh_dim_names=None, param_dtype="bfloat16",
                          reduce_dtype="bfloat16", units=units,
                          device_capacity_bytes=80 * GB, started_unix=time.time(), pid=1)
        w = RunLogWriter(tmp_path, rank)
        w.write_header(facts)
        comm = [[i, phase, "all_gather", 1, 260_000_000, 0.05, 0.04, 0.01]
                for i in range(1, 10) for phase in ("forward", "backward")]
        for step in range(1, 6):
            w.write({"type": "step", "step": step, "end_unix": time.time(), "step_s": 1.0,
                     "compute": [[i, "forward", 0.03] for i in range(10)],
                     "comm": comm,
                     "mem": {"capacity": 80 * GB, "headroom": 60 * GB,
                             "peak_reserved": 20 * GB, "activations": 5 * GB}})
        w.close(5)
    return tmp_path


def test_plan_and_zd003_name_the_same_stages(tmp_path, capsys):
    """`zerodoc plan --run` said "DP would fit" where ZD003 said "ZeRO-2 fits": both now name
    the step down (ZeRO-2) and the lowest stage that fits (DP)."""
    run = _run_with_headroom(tmp_path)
    (z3,) = [f for f in diagnose(load_run(run)) if f.code == "ZD003"]
    assert z3.title.startswith("ZeRO-3 while ZeRO-2 fits")
    assert "the lowest stage that fits is DP" in z3.predicted
    assert zerodoc_main(["plan", "--run", str(run)]) == 0
    out = capsys.readouterr().out
    assert "this run uses ZeRO-3; ZeRO-2 would fit (over-staging); the lowest stage that " \
           "fits is DP (DDP / FSDP1 NO_SHARD)" in out


def test_plan_table_unit_shows_the_numbers_of_a_small_model(capsys):
    """plan printed 0.0 in every cell for a small model (GB only), then, in MB, the device's
    12 GB as "11987.2" free: every size is now in the unit that fits it."""
    assert zerodoc_main(["plan", "--params", "800K", "-N", "2", "--device-memory",
                         "12GB"]) == 0
    out = capsys.readouterr().out
    assert "per GPU, in decimal units, each number in the one that fits it" in out
    dp = next(x.split() for x in out.splitlines() if x.startswith("DP "))
    assert dp[1:9] == ["1.60", "MB", "1.60", "MB", "9.60", "MB", "12.8", "MB"]  # 800K x 2/2/12 B
    assert "12.0 GB free" in out and "device memory 12.0 GB" in out
    for n, unit in re.findall(r"(\d+\.\d+) ([kMGT]B)", out):
        assert 1 <= float(n) < 1000, (n, unit)
    assert zerodoc_main(["plan", "--params", "70B", "-N", "64"]) == 0
    big = capsys.readouterr().out
    dp = next(x.split() for x in big.splitlines() if x.startswith("DP "))
    assert dp[2] == "GB" and all(1 <= float(n) < 1000 for n, _ in
                                 re.findall(r"(\d+\.\d+) ([kMGT]B)", big))  # big models: GB
    assert zerodoc_main(["plan", "--params", "800K", "-N", "2", "--units", "gib"]) == 0
    assert "0.0" in capsys.readouterr().out  # an explicit unit is obeyed


def test_report_and_tui_show_the_same_headroom_in_the_same_unit():
    """GB in the report and GiB in the TUI for the same headroom."""
    from zerodoc import humanize as fmt

    for n in (25_800_000_000, 3_145_728, 999_000, 123_456_789_012):
        assert fmt.size(n).split()[1] == nbytes(n).split()[1], n
        assert float(fmt.size(n).split()[0]) == pytest.approx(float(nbytes(n).split()[0]),
                                                              rel=0.05)


# --- --help and messages ------------------------------------------------------------------

def _all_actions():
    parser = build_parser()
    stack = [("zerodoc", parser)]
    while stack:
        name, p = stack.pop()
        for a in p._actions:
            if a.choices and isinstance(a.choices, dict):  # subcommands
                stack += [(f"{name} {k}", sp) for k, sp in a.choices.items()]
            else:
                yield name, p, a


def test_help_shows_defaults_only_where_they_say_something():
    """`--no-reshard-after-forward ... (default: True)`, "(default: inferred from the run)
    (default: None)" and "(default: None)" on options with no default."""
    seen = 0
    for name, parser, action in _all_actions():
        if action.help is None or not action.option_strings:
            continue
        text = parser.format_help()
        seen += 1
        assert "(default: True)" not in text and "(default: False)" not in text, name
        assert "(default: None)" not in text and "(default: [])" not in text, name
        assert "None:" not in text, name  # `stack --help`: "None: zerodoc's ..."
        flat = " ".join(text.split())
        assert not re.search(r"default[^()]*\)\s*\(default:", flat), name
        if shows_default(action) and issubclass(parser.formatter_class, DefaultsHelpFormatter):
            assert f"(default: {action.default})" in flat, (name, action.option_strings)
    assert seen > 50
    demo = " ".join(build_parser()._subparsers._group_actions[0].choices["demo"]
                    .format_help().split())
    assert "keep gathered parameters from forward to backward (ZeRO-2-like) --prefetch" in demo


def test_tui_refresh_zero_says_what_is_allowed():
    from zerodoc.cli.tui import validate

    class Args:
        refresh, window = 0.0, 20

    with pytest.raises(UserError, match=r"more than 0 and at most 3600 seconds, not 0"):
        validate(Args)


# --- a report with no data ----------------------------------------------------------------

def test_report_with_no_steps_is_no_data_and_fails_fail_on(tmp_path, capsys):
    """0 steps printed "no findings" and exited 0 under --fail-on."""
    units = tuple(UnitFacts(name=name, params=10, param_bytes=40, gather_bytes=40,
                            sharded_bytes=20, reshard_after_forward=False, group_size=2)
                  for name in ("(root)", "blocks.0", "blocks.1"))
    for rank in range(2):
        facts = RankFacts(rank=rank, local_rank=rank, world_size=2, local_world_size=2,
                          node="n0", run_id="empty", framework="fsdp2",
                          framework_version="2.13", torch_version="2.13.0", device_type="cpu",
                          backend="gloo", zero_stage=2, mesh_shape=(2,), mesh_dim_names=None,
                          param_dtype="float32", reduce_dtype="float32", units=units,
                          device_capacity_bytes=GB, started_unix=time.time(), pid=1)
        w = RunLogWriter(tmp_path, rank)
        w.write_header(facts)
        w.close(0)
    capsys.readouterr()
    assert zerodoc_main(["report", str(tmp_path), "--fail-on", "critical"]) == 1
    out = capsys.readouterr().out
    assert "NO DATA" in out and "the run ended without a completed step" in out
    assert "not an all-clear" in out and "nothing the rules know of is wrong" not in out
    assert zerodoc_main(["report", str(tmp_path), "--json"]) == 0  # no --fail-on: 0
    assert [p["kind"] for p in json.loads(capsys.readouterr().out)["data_problems"]] == \
        ["no-steps"]


def test_bandwidth_unit_is_chosen_by_size():
    """The TUI's Units table showed "0.01" under "busbw GB/s" for every CPU unit."""
    from zerodoc.humanize import rate
    from zerodoc import humanize as fmt

    for f in (rate, fmt.bandwidth):
        assert f(50.2e9).endswith(" GB/s") and f(25.1e6) in ("25.1 MB/s",)
        assert f(12_000) in ("12 kB/s", "12.0 kB/s") and f(850).endswith(" B/s")
    from zerodoc.tui.views import UNIT_COLUMNS

    assert next(c.label for c in UNIT_COLUMNS if c.key == "busbw") == "busbw"
