"""The follower's per-unit part of a rank's window read alone (`reader.unit_part`, issue 33
item 4: a refresh that brings every rank's new interval line no longer builds the whole
`log_window` to keep its per-unit arrays) equals `log_window`'s, array for array (bytes),
with its `detail_steps` and `warmup_kept`: on a run whose ranks differ (units, steps), with
a rank short of a unit, a torn last line, a rank that restarted and bad lines, each log cut
to fewer blocks and fewer step lines, windows of 2 to 20 steps, with and without the warm-up
step left out."""

from __future__ import annotations

import json
import time

import pytest

from zerodoc.runlog.reader import log_window, read_rank_log, unit_part
from zerodoc.testing.synthetic import write_run


def _rewrite(path, fn) -> None:
    lines = path.read_bytes().split(b"\n")
    path.write_bytes(b"\n".join(fn(lines)))


def _dump(d: dict) -> bytes:
    return json.dumps(d, separators=(",", ":")).encode()


def _short_of_unit(line: bytes, unit: int) -> bytes:
    """An interval line without one unit (its rows gone from every group)."""
    d = json.loads(line)
    for groups in d["units"].values():
        for g in groups:
            idx = list(range(g["unit"])) if isinstance(g["unit"], int) else g["unit"]
            keep = [i for i, u in enumerate(idx) if u != unit]
            for k, v in g.items():
                if isinstance(v, list) and len(v) == len(idx):
                    g[k] = [v[i] for i in keep]
            g["unit"] = [idx[i] for i in keep]
    return _dump(d)


def _corrupt(line: bytes, how: str) -> bytes:
    """An interval line with one bad number (or a bad unit index)."""
    d = json.loads(line)
    col = d["units"]["compute"][0]["seconds"]
    if how == "unit":
        d["units"]["compute"][0]["unit"] = [0, 1, 99]
        return _dump(d)
    text = _dump(d)
    good = json.dumps(col[1]).encode()
    at = text.index(good)
    return text[:at] + {"nan": b"NaN", "negative": b"-5.0", "zero": b"01", "dot": b".5",
                        "huge": b"1" + b"0" * 400}[how] + text[at + len(good):]


def _uneven_run(tmp_path):
    """4 ranks, 12 steps, an interval line every 3: rank 1 short of unit 2 from step 4 on,
    rank 2 with 3 steps more (its last line torn), rank 3 restarted (a second segment),
    rank 0 with 8 bad lines among its good ones (one an integer too big for a float: it
    crashed the reader with an OverflowError before)."""
    run = write_run(tmp_path / "run", ranks=4, units=5, steps=12, every_steps=3,
                    started_unix=time.time() - 60)
    run2 = write_run(tmp_path / "more", ranks=4, units=5, steps=15, every_steps=3,
                     started_unix=time.time() - 60)

    def short(lines):
        return [_short_of_unit(x, 2) if x.startswith(b'{"type":"interval"') and
                json.loads(x)["first"] >= 4 else x for x in lines]
    _rewrite(run / "rank-00001.jsonl", short)
    longer = (run2 / "rank-00002.jsonl").read_bytes().rstrip(b"\n")
    (run / "rank-00002.jsonl").write_bytes(longer[:-200])  # torn: no end, cut mid-line

    def restarted(lines):
        head = json.loads(lines[0])
        head["segment"] = 1
        body = [x for x in lines[1:] if x.strip()]
        return lines[:-1] + [_dump(head)] + body[:8] + [b""]
    _rewrite(run / "rank-00003.jsonl", restarted)

    def bad(lines):
        out = []
        intervals = [x for x in lines if x.startswith(b'{"type":"interval"')]
        for x in lines:
            out.append(x)
            if x == intervals[2]:
                out += [_corrupt(intervals[1], h) for h in ("nan", "negative", "zero", "dot",
                                                            "unit", "huge")]
                out += [b'{"type":"interval","first":', b"not json at all"]
        return out
    _rewrite(run / "rank-00000.jsonl", bad)
    return run


@pytest.mark.parametrize("window", [2, 3, 6, 20])
@pytest.mark.parametrize("skip", [False, True])
def test_the_per_unit_part_alone_equals_log_window(tmp_path, window, skip):
    run = _uneven_run(tmp_path)
    for p in sorted(run.glob("rank-*")):
        log = read_rank_log(p, detail=False)
        blocks, totals = list(log.blocks), list(log.totals)
        # fewer blocks and fewer step lines (none: blocks alone, as `unit_part` sums them)
        for cut in ((None, None), (3, 9), (1, None), (2, 0), (1, 0), (0, 0), (0, None)):
            log.blocks, log.totals = blocks[:cut[0]], totals[:cut[1]]
            w = log_window(log, window, detail=False, skip_warmup=skip)
            arrays, detail, kept = unit_part(log, window, skip)
            want = getattr(w, "unit_arrays", None)
            assert (arrays is None) == (want is None), (p.name, cut)
            if arrays is not None:
                assert arrays[0] == want[0] and arrays[2] == want[2]
                assert arrays[1].tobytes() == want[1].tobytes()
                assert arrays[3].tobytes() == want[3].tobytes()
            assert (detail, kept) == (w.detail_steps, w.warmup_kept), (p.name, cut)
        if p.name == "rank-00000.jsonl":
            assert log.bad_lines == 8  # each bad line counted, none raised
