"""What `zerodoc compare` learned, fed back into the findings.

Every judged fix appends one JSON line to a small history file beside the run directories
(`<runs root>/.zerodoc-history.jsonl`: the parent of BEFORE when it is a run directory, else
`./zerodoc-runs/`; `$ZERODOC_HISTORY` names another file, `off` disables it). The newest
`MAX_ENTRIES` lines are kept.

`annotate()` reads it for `zerodoc report` and the TUI: when a rule's fix, on runs of the same
model (framework and parameter count), did less (or more) than predicted in each of the last
conclusive compares (at least `MIN_AGREE` of them; an inconclusive or not judged outcome is
recorded, with its reason, but makes no pattern), the finding says so, with the last
prediction and outcome: "last time on this run: predicted X, got Y". Plain Python; a history file that
cannot be read is ignored, never an error.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path

from ..humanize import value
from ..runmodel import RunSnapshot
from ..runlog import DEFAULT_ROOT

HISTORY_NAME = ".zerodoc-history.jsonl"
MAX_ENTRIES = 500
RECENT = 5  # outcomes looked at per rule and model
MIN_AGREE = 2  # ... all of them (at least this many) on the same side: say so
LESS, MORE = 0.75, 1.33  # observed / predicted change outside [LESS, MORE]: differs


def history_path(source: str | os.PathLike | None) -> Path | None:
    """Where compare outcomes for runs like `source` live (None: disabled)."""
    env = os.environ.get("ZERODOC_HISTORY", "")
    if env.lower() in ("off", "0", "none", "false"):
        return None
    if env:
        return Path(env)
    if source is not None and Path(str(source)).is_dir():
        return Path(str(source)).resolve().parent / HISTORY_NAME
    return Path(DEFAULT_ROOT) / HISTORY_NAME


def model_key(snap: RunSnapshot) -> str | None:
    """Runs of the same model: framework and total parameters (independent of the wrap,
    the stage and the number of ranks, which fixes change)."""
    w = snap.any_rank
    if w is None:
        return None
    return f"{w.facts.framework}:{sum(u.params for u in w.facts.units)}"


# verdicts that say nothing of the prediction's size: recorded, never part of a pattern
OPEN = ("inconclusive", "not judged")


def _side(ratio: float | None, verdict: str | None) -> str | None:
    if verdict in OPEN:
        return None
    if ratio is None:
        return "as" if verdict == "confirmed" else "less"
    if ratio < LESS:
        return "less"
    if ratio > MORE:
        return "more"
    return "as"


def entries_of(doc: dict, model: str | None) -> list[dict]:
    """History lines for a compare document: each applied fix's main effect, with its
    verdict, why (`reason`: an inconclusive or not judged one says why) and the runs' noise
    it was judged against; `side` None for an inconclusive or not judged outcome."""
    out = []
    now = round(time.time(), 3)
    for f in doc.get("fixes", ()):
        gains = [e for e in f.get("effects", ()) if not e.get("cost")
                 and e.get("verdict") != "not measurable"]
        if not f.get("applied") or not gains:
            continue
        e = gains[0]
        out.append({"unix": now, "model": model, "code": f["code"], "metric": e["metric"],
                    "direction": e["direction"], "now": e["now"], "value": e["value"],
                    "observed_before": e["observed_before"],
                    "observed_after": e["observed_after"], "ratio": e["ratio"],
                    "verdict": f["verdict"], "effect_verdict": e["verdict"],
                    "reason": e.get("reason"), "noise": e.get("noise"),
                    "side": _side(e["ratio"], e["verdict"]),
                    "before": doc["before"]["source"], "after": doc["after"]["source"]})
    return out


def load(path: Path | None) -> list[dict]:
    if path is None:
        return []
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict) and "code" in rec:
            out.append(rec)
    return out


def record(path: Path | None, doc: dict, before: RunSnapshot) -> int:
    """Append the compare's outcomes; keep the newest MAX_ENTRIES. Returns lines written
    (0 when disabled or the file cannot be written: the compare itself never fails on it)."""
    if path is None:
        return 0
    new = entries_of(doc, model_key(before))
    if not new:
        return 0
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as fh:
            for e in new:
                fh.write(json.dumps(e, separators=(",", ":")) + "\n")
        kept = load(path)
        if len(kept) > MAX_ENTRIES:
            tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
            tmp.write_text("".join(json.dumps(e, separators=(",", ":")) + "\n"
                                   for e in kept[-MAX_ENTRIES:]), encoding="utf-8")
            os.replace(tmp, path)
    except OSError:
        return 0
    return len(new)


def note(entries: list[dict], code: str, model: str | None) -> dict | None:
    """The history note for one finding, or None when the recent outcomes do not all
    differ from the prediction the same way."""
    mine = [e for e in entries if e.get("code") == code and e.get("model") == model
            and e.get("side") is not None]  # inconclusive outcomes make no pattern
    recent = mine[-RECENT:]
    if len(recent) < MIN_AGREE:
        return None
    sides = {e.get("side") for e in recent}
    if len(sides) != 1 or sides == {"as"}:
        return None
    side = sides.pop()
    last = recent[-1]
    m = last["metric"]

    def v(x):
        return value(m, x) if x is not None else "-"
    pred = (f"{v(last['now'])} -> {v(last['value'])}" if last.get("value") is not None
            else f"{v(last['now'])}, {last.get('direction', '?')}")
    from .render import label

    text = (f"last time on this run: predicted {label(m)} {pred}, got "
            f"{v(last['observed_before'])} -> {v(last['observed_after'])}; the fix did "
            f"{'less' if side == 'less' else 'more'} than predicted in the last "
            f"{len(recent)} compares")
    ratios = [e["ratio"] for e in recent if e.get("ratio") is not None]
    return {"text": text, "side": side, "compares": len(recent), "metric": m,
            "ratios": ratios, "last": {k: last.get(k) for k in
                                       ("now", "value", "observed_before", "observed_after",
                                        "verdict", "before", "after", "unix")}}


def annotate(findings: list, snap: RunSnapshot, path: Path | None) -> list:
    """Findings with `extra["history"]` where the history has something to say."""
    entries = load(path)
    if not entries:
        return findings
    model = model_key(snap)
    out = []
    for f in findings:
        n = note(entries, f.code, model)
        out.append(dataclasses.replace(f, extra={**f.extra, "history": n}) if n else f)
    return out


__all__ = ["HISTORY_NAME", "MAX_ENTRIES", "history_path", "model_key", "entries_of", "load",
           "record", "note", "annotate"]
