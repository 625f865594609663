"""Interval and total lines read straight into arrays (`zerodoc.runlog.fastblock`, issue 33
item 4) give what the plain reading gives (`json.loads` + `block_from_dict`, the witness:
`fastblock.FAST = False`), float for float, bad line for bad line: on number tokens of every
JSON shape and on tokens JSON refuses, and on a run whose ranks differ (units, steps), with a
rank short of a unit, a torn last line, a rank that restarted, and bad lines of the layout
the fast reading has learnt. The window's per-unit part read alone (`unit_part`) equals
`log_window`'s."""

from __future__ import annotations

import json
import random
import time

import numpy as np
import pytest

from zerodoc.runlog import fastblock
from zerodoc.runlog.reader import log_window, read_rank_log, unit_part
from zerodoc.sources import RunDirSource
from zerodoc.testing.synthetic import write_run


def _tokens(rng: random.Random, n: int) -> list[str]:
    """JSON numbers as writers spell them: reprs and roundings of floats over many
    magnitudes (exponents, 17 digits, subnormals), integers up to 2**64, signs, zeros."""
    out = []
    for _ in range(n):
        k = rng.randrange(9)
        x = rng.random() * 10 ** rng.randint(-30, 30)
        if k == 0:
            out.append(repr(round(x, rng.randint(0, 15))))
        elif k == 1:
            out.append(str(rng.randrange(0, 2 ** rng.choice((8, 31, 53, 54, 63, 64)))))
        elif k == 2:
            out.append(repr(-x))
        elif k == 3:
            out.append(rng.choice(["0", "-0", "0.0", "-0.0", "0e5", "-0e-3", "1E+05", "1e400",
                                   "5e-324", "2.2250738585072014e-308", "9007199254740993",
                                   "0.1", "123456789012345678901234567890", "-1e-17"]))
        elif k == 4:
            out.append(f"{x:.{rng.randint(0, 20)}e}")
        else:
            out.append(repr(x))
    return out


def test_numbers_are_the_floats_json_gives():
    rng = random.Random(33)
    for _ in range(300):
        toks = _tokens(rng, rng.randint(1, 60))
        text = ",".join(toks).encode()
        want = np.array(json.loads("[" + text.decode() + "]"), np.float64)
        got = fastblock.numbers(text, len(toks))
        assert got is not None, text
        assert got.tobytes() == want.tobytes(), [
            (t, a, b) for t, a, b in zip(toks, got.tolist(), want.tolist())
            if np.float64(a).tobytes() != np.float64(b).tobytes()]


@pytest.mark.parametrize("bad", [
    "01", "-01", "00.5", ".5", "5.", "-.5", "1.e5", "+1", "1e5.5", "1.2.3", "--1", "1-2",
    "e5", "1e", "1e+", "", "0x1A", "1,", "1.5e5e5", "-", "1_000",
    "12345678901234567890.", "0.1.", "1e5e"])
def test_a_token_json_refuses_is_refused(bad):
    text = f"1.5,{bad},2".encode()
    with pytest.raises(ValueError):
        json.loads(b"[" + text + b"]")
    assert fastblock.numbers(text, 3) is None


def test_spaces_and_other_spellings_are_left_to_the_plain_reading():
    """Python's JSON takes spaces between numbers, NaN and Infinity; the fast reading
    leaves them to `json.loads` (whose reader then refuses what is not finite)."""
    for text in (b"1.5, 1,2", b"1.5,NaN,2", b"1.5,-Infinity,2"):
        assert len(json.loads(b"[" + text + b"]")) == 3
        assert fastblock.numbers(text, 3) is None


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
    """An interval line of the same layout with one bad number (or a bad unit index)."""
    d = json.loads(line)
    col = d["units"]["compute"][0]["seconds"]
    if how == "unit":
        d["units"]["compute"][0]["unit"] = [0, 1, 99]
        return _dump(d)
    text = _dump(d)
    good = json.dumps(col[1]).encode()
    at = text.index(good)
    return text[:at] + {"nan": b"NaN", "negative": b"-5.0", "zero": b"01",
                        "dot": b".5"}[how] + text[at + len(good):]


def _uneven_run(tmp_path):
    """4 ranks, 12 steps, an interval line every 3: rank 1 short of unit 2 from step 4 on
    (a unit index list: its own layout, read fast from its third line),
    rank 2 with 3 steps more (its last line torn), rank 3 restarted (a second segment),
    rank 0 with bad lines among good ones of its layout."""
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
                                                            "unit")]
                out += [b'{"type":"interval","first":', b"not json at all"]
        return out
    _rewrite(run / "rank-00000.jsonl", bad)
    return run


def _blocks(log) -> list:
    return [(b.kind, b.first_step, b.last_step, b.steps, b.detail_steps, b.step_seconds,
             b.max_step_seconds, b.host_compute_seconds, tuple(b.unit_framework.items()),
             b.unit_arrays[0], b.unit_arrays[2], b.unit_arrays[1].tobytes(),
             b.unit_arrays[3].tobytes()) for b in log.blocks]


def _snapshot_numbers(snap) -> dict:
    out = {}
    for r, w in snap.ranks.items():
        ck, cv, mk, mv = w.unit_arrays
        out[r] = (ck, cv.tobytes(), mk, mv.tobytes(), w.detail_steps, w.steps, w.last_step,
                  w.warmup_left_out, w.warmup_kept, w.step_seconds, w.unit_key())
    return out, sorted(snap.log_notes)


@pytest.fixture
def fast():
    """fast(False): the plain reading (the witness); the fast one again after the test."""
    yield lambda on: setattr(fastblock, "FAST", on)
    fastblock.FAST = True


def test_fast_reading_equals_the_plain_one_on_an_uneven_run(tmp_path, fast):
    run = _uneven_run(tmp_path)
    fastblock._TEMPLATES.clear()
    read = {}
    for on in (True, False):
        fast(on)
        before = fastblock.READ_FAST[0]
        read[on] = {}
        for p in sorted(run.glob("rank-*")):
            at = fastblock.READ_FAST[0]
            read[on][p.name] = read_rank_log(p, detail=False)
            read[on, p.name] = fastblock.READ_FAST[0] - at
        read[on, "fast"] = fastblock.READ_FAST[0] - before
    assert read[False, "fast"] == 0 and read[True, "fast"] >= 20  # the fast reading read most
    for name, log in read[False].items():
        got = read[True][name]
        assert _blocks(got) == _blocks(log), name
        assert (got.bad_lines, got.torn, got.segment) == \
            (log.bad_lines, log.torn, log.segment), name
    # each layout: its first line read plain, its second plain and checked fast, then fast;
    # rank 1's full layout (steps 1, 2-3, the total) and its short one (4-6, 7-9, 10-12)
    assert read[True, "rank-00001.jsonl"] >= 4
    assert read[True]["rank-00000.jsonl"].bad_lines == 7  # each bad line counted
    assert len(read[True]["rank-00001.jsonl"].blocks[2].unit_arrays[0]) < \
        len(read[True]["rank-00001.jsonl"].blocks[0].unit_arrays[0])  # short of a unit
    snaps = {}
    for on in (True, False):
        fast(on)
        fastblock._TEMPLATES.clear()
        src = RunDirSource(run, window=6, detail=False)
        src.snapshot()  # the tails: each skeleton seen, learnt on its second line
        snaps[on] = _snapshot_numbers(RunDirSource(run, window=6, detail=False).snapshot())
        src.close()
    assert snaps[True] == snaps[False]


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
