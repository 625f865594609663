"""Nsight Systems SQLite exports as a source (zerodoc/trace/nsys.py), checked against the exports.

The witness is the SQLite file itself: every expected number is computed here, from SQL queries
written in this file and plain-Python interval unions, never by zerodoc's functions (no
`zerodoc.trace.timeline`, no `events` regexes). The exports are nsys-ai's public test
exports (tests/data/nsys/README.md): 2 x H100 with FSDP2 NVTX ranges (a T5-like encoder), a
2 x H100 pair with NCCL send/recv, and a one-GPU capture of an older export schema.
"""

from __future__ import annotations

import gzip
import json
import shutil
import sqlite3
from collections import defaultdict

import pytest

from tests.support.helpers import ROOT
from zerodoc.cli.main import main
from zerodoc.errors import UserError
from zerodoc.sources import open_source
from zerodoc.trace.scope import device_rows

DATA = ROOT / "tests" / "data" / "nsys"
EXPORTS = ("h100_2gpu_1s", "mfu_2gpu_before", "mock")
NVTX_KEPT = ("FSDP::", "ProfilerStep#", "Optimizer.step#", "FullyShardedDataParallel.",
             "DistributedDataParallel.", "DeepSpeed", "## ")


@pytest.fixture(scope="module")
def exports(tmp_path_factory) -> dict:
    """The committed exports, decompressed once: name -> path."""
    d = tmp_path_factory.mktemp("nsys")
    out = {}
    for name in EXPORTS:
        p = d / f"{name}.sqlite"
        with gzip.open(DATA / f"{name}.sqlite.gz") as src, open(p, "wb") as dst:
            shutil.copyfileobj(src, dst)
        out[name] = p
    return out


# --- the witness: SQL and plain Python ----------------------------------------------------------
def union(ivs) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for a, b in sorted(ivs):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def total(ivs) -> int:
    return sum(b - a for a, b in ivs)


def minus(xs, ys) -> int:
    """Length of union xs minus union ys (both sorted, disjoint)."""
    left, j = 0, 0
    for a, b in xs:
        cut = 0
        while j < len(ys) and ys[j][1] <= a:
            j += 1
        k = j
        while k < len(ys) and ys[k][0] < b:
            cut += min(b, ys[k][1]) - max(a, ys[k][0])
            k += 1
        left += (b - a) - cut
    return left


# A device row the process's host runtime calls launched in the capture (the same correlation
# id in the same process), or one that cannot be checked (no id; a process with no runtime call)
LAUNCHED = """(t.correlationId IS NULL OR NOT EXISTS (SELECT 1 FROM CUPTI_ACTIVITY_KIND_RUNTIME r
    WHERE r.globalTid / 16777216 = t.globalPid / 16777216 AND r.correlationId IS NOT NULL)
    OR EXISTS (SELECT 1 FROM CUPTI_ACTIVITY_KIND_RUNTIME r WHERE r.correlationId =
    t.correlationId AND r.globalTid / 16777216 = t.globalPid / 16777216))"""


def sql_devices(path) -> dict:
    """Per (process, device), straight from the tables: kernel intervals by class (NCCL: the
    name starts with `nccl` and holds `Kernel`; memory: a `Memcpy` / `Memset` kernel; compute:
    the rest), memory copies and sets, and NCCL kernels counted by name; only the rows whose
    launch the capture holds (`LAUNCHED`; `unlaunched` counts the others). The span is the
    capture's: every row."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    rows = con.execute(f"""
        SELECT t.globalPid / 16777216 % 16777216, t.deviceId, t.start, t."end", s.value,
        {LAUNCHED} FROM CUPTI_ACTIVITY_KIND_KERNEL t JOIN StringIds s ON s.id = t.demangledName""")
    out = defaultdict(lambda: {"compute": [], "comm": [], "mem": [], "nccl": defaultdict(int),
                               "unlaunched": 0})
    ends = []
    for pid, dev, a, b, name, launched in rows:
        d = out[(pid, dev)]
        ends += [a, b]
        if not launched:
            d["unlaunched"] += 1
        elif name.startswith("nccl") and "Kernel" in name:
            d["comm"].append((a, b))
            d["nccl"][name.split("(")[0]] += 1
        elif "Memcpy" in name or name.startswith("Memset"):
            d["mem"].append((a, b))
        else:
            d["compute"].append((a, b))
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master")}
    for table in ("CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"):
        if table in tables:
            for pid, dev, a, b, launched in con.execute(
                    f'SELECT globalPid / 16777216 % 16777216, deviceId, start, "end", '
                    f"{LAUNCHED} FROM {table} t"):
                if (pid, dev) in out:
                    ends += [a, b]
                    if launched:
                        out[(pid, dev)]["mem"].append((a, b))
                    else:
                        out[(pid, dev)]["unlaunched"] += 1
    lo, hi = min(ends), max(ends)
    if "NVTX_EVENTS" in tables:
        for a, b, text in con.execute('SELECT n.start, n."end", coalesce(n.text, s.value) FROM '
                                      'NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId '
                                      'WHERE n."end" IS NOT NULL'):
            if text and text.startswith(NVTX_KEPT):
                lo, hi = min(lo, a), max(hi, b)
    con.close()
    return {"devices": dict(sorted(out.items(), key=lambda kv: (kv[0][1], kv[0][0]))),
            "span_ns": hi - lo}


def report_json(capsys, *args) -> tuple[int, dict | None, str]:
    """`zerodoc report --json ARGS` in this process: exit status, the JSON, stderr."""
    capsys.readouterr()
    rc = main(["report", "--json", *map(str, args)])
    out, err = capsys.readouterr()
    return rc, json.loads(out) if out.strip() else None, err


# --- the device breakdown ---------------------------------------------------------------------
@pytest.mark.parametrize("name", EXPORTS)
def test_device_breakdown_equals_sql(exports, name):
    """Per (process, device): busy, compute, NCCL and exposed NCCL time, NCCL kernels by
    kind and the one window's span equal what the SQL and the unions here say (to 1 ns)."""
    want = sql_devices(exports[name])
    snap = open_source(str(exports[name]), None, trace_facts={"progress": False}).snapshot()
    rows = device_rows(snap)
    assert [r["rank"] for r in rows] == list(range(len(want["devices"])))
    for row, ((pid, dev), d) in zip(rows, want["devices"].items()):
        cfg = snap.ranks[row["rank"]].facts.config
        assert (cfg["nsys_process"], cfg["nsys_device"]) == (pid, dev)
        compute, comm = union(d["compute"]), union(d["comm"])
        busy = union(d["compute"] + d["comm"] + d["mem"])
        assert row["steps"] == 1
        for key, ns in (("step_seconds", want["span_ns"]), ("busy_seconds", total(busy)),
                        ("compute_seconds", total(compute)), ("comm_seconds", total(comm)),
                        ("exposed_comm_seconds", minus(comm, compute))):
            assert row[key] == pytest.approx(ns * 1e-9, abs=1e-9), (name, dev, key)
        kinds = {"ncclDevKernel_SendRecv": "send_recv"}
        assert row["comm_kernels"] == {kinds[k]: n for k, n in d["nccl"].items()}
    if name == "mfu_2gpu_before":  # the capture's 66 NCCL kernels, one per device launched
        assert sum(sum(r["comm_kernels"].values()) for r in rows) == 64  # before it began
    for (pid, dev), d in want["devices"].items():  # rows launched before the capture began
        if d["unlaunched"]:
            assert f"{d['unlaunched']:,} device operations in {name}.sqlite not counted" in \
                "\n".join(snap.log_notes), (pid, dev)
    if name == "h100_2gpu_1s":  # the export has them: 905 kernels of 1,721 per device
        assert all(d["unlaunched"] > 900 for d in want["devices"].values())
    assert any("one window (steps: 1) over the capture's span" in n for n in snap.log_notes)
    assert any(f"rank 0 = {name}.sqlite process" in n for n in snap.log_notes)


def test_units_from_fsdp_nvtx_ranges(exports):
    """The FSDP2 T5 capture: each leaf unit's forward compute is the union of the kernels
    launched (runtime call, same correlation id and process) on the NVTX thread between the
    end of its `FSDP::pre_forward (u)` and the start of its `FSDP::post_forward (u)`, outside
    every FSDP range; and units + FSDP + (model) add up to the compute union."""
    path = exports["h100_2gpu_1s"]
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    snap = open_source(str(path), None, trace_facts={"progress": False}).snapshot()
    checked = 0
    for rank, w in sorted(snap.ranks.items()):
        pid, dev = w.facts.config["nsys_process"], w.facts.config["nsys_device"]
        ranges = con.execute(
            "SELECT start, \"end\", text, globalTid FROM NVTX_EVENTS WHERE text LIKE 'FSDP::%' "
            "AND globalTid / 16777216 % 16777216 = ?", (pid,)).fetchall()
        fsdp = [(a, b) for a, b, _t, _g in ranges]
        pre = defaultdict(list)
        post = defaultdict(list)
        for a, b, text, gtid in ranges:
            head = text.split(", op_id")[0]
            if head.startswith("FSDP::pre_forward ("):
                pre[head[len("FSDP::pre_forward ("):-1]].append((a, b, gtid))
            elif head.startswith("FSDP::post_forward ("):
                post[head[len("FSDP::post_forward ("):-1]].append((a, b, gtid))
        launched = con.execute(
            "SELECT r.start, r.globalTid, k.start, k.\"end\" FROM CUPTI_ACTIVITY_KIND_KERNEL k "
            "JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId AND "
            "r.globalTid / 16777216 = k.globalPid / 16777216 WHERE k.deviceId = ? AND "
            "k.globalPid / 16777216 % 16777216 = ?", (dev, pid)).fetchall()
        leaves = [u for u in pre if u.endswith((".layer.0", ".layer.1"))]
        assert len(leaves) >= 40
        for u in leaves:
            segs = [(p[1], q[0], p[2]) for p, q in zip(sorted(pre[u]), sorted(post[u]))]
            ks = [(ka, kb) for host, gtid, ka, kb in launched
                  if any(g == gtid and a < host < b for a, b, g in segs)
                  and not any(fa <= host < fb for fa, fb in fsdp)]
            got = w.compute.get((u, "forward"), 0.0)
            # (the device runs far behind the host: the window holds the kernels of the
            # first units only; a unit whose kernels it does not hold has none, not a guess)
            assert got == pytest.approx(total(union(ks)) * 1e-9, rel=1e-6, abs=2e-9), (rank, u)
            checked += bool(ks)
        row = next(r for r in device_rows(snap) if r["rank"] == rank)
        assert sum(w.compute.values()) + w.framework_seconds + w.optimizer_seconds == \
            pytest.approx(row["compute_seconds"], rel=1e-9)
        assert w.facts.framework == "fsdp2"
    con.close()
    assert checked >= 10


# --- the command line -------------------------------------------------------------------------
def test_report_json_on_a_folder_of_exports(exports, tmp_path, capsys):
    """`zerodoc report DIR --json` on a folder of two exports: four ranks in file, device
    order, each a row of `device`, the ranks' origin said in `log_notes`."""
    d = tmp_path / "nodes"
    d.mkdir()
    for name in ("h100_2gpu_1s", "mfu_2gpu_before"):
        shutil.copy(exports[name], d / f"{name}.sqlite")
    rc, rep, err = report_json(capsys, d)
    assert rep is not None, err
    assert rep["source"].startswith("Nsight Systems export")
    assert [r["rank"] for r in rep["device"]] == [0, 1, 2, 3]
    assert [r["comm_kernels"] for r in rep["device"]] == [{}, {}, {"send_recv": 32},
                                                          {"send_recv": 32}]
    note = rep["log_notes"][0]
    assert "rank 0 = h100_2gpu_1s.sqlite" in note and "rank 3 = mfu_2gpu_before.sqlite" in note
    assert rep["window"]["steps"] == 1
    assert rc in (0, 1), err


def _broken_exports(tmp_path, exports) -> dict:
    """Exports this reader must refuse with one line, and what the line must say."""
    out = {}
    p = tmp_path / "notsqlite.sqlite"
    p.write_text('{"traceEvents": []}')
    out[p] = "not an SQLite database"
    p = tmp_path / "otherdb.sqlite"
    con = sqlite3.connect(p)
    con.execute("CREATE TABLE t (x)")
    con.commit()
    con.close()
    out[p] = "not an Nsight Systems export"
    # an export whose kernel table lost a column it is read by: an unknown schema
    p = tmp_path / "newschema.sqlite"
    shutil.copy(exports["mock"], p)
    con = sqlite3.connect(p)
    con.execute("ALTER TABLE CUPTI_ACTIVITY_KIND_KERNEL RENAME COLUMN demangledName TO nameV2")
    con.commit()
    con.close()
    out[p] = "export schema 3.24.14 unknown: CUPTI_ACTIVITY_KIND_KERNEL has no demangledName"
    p = tmp_path / "truncated.sqlite"
    p.write_bytes(exports["h100_2gpu_1s"].read_bytes()[:300_000])
    out[p] = "truncated.sqlite"
    return out


def test_bad_exports_one_line_error(exports, tmp_path, capsys):
    for path, says in _broken_exports(tmp_path, exports).items():
        with pytest.raises(UserError, match=None) as e:
            open_source(str(path), None, trace_facts={"progress": False}).snapshot()
        assert says in str(e.value) and "\n" not in str(e.value), (path, str(e.value))
    rc, rep, err = report_json(capsys, tmp_path / "newschema.sqlite")
    assert rc == 2 and rep is None
    lines = err.strip().splitlines()
    assert lines[-1].startswith("zerodoc report: error:") and "Traceback" not in err, err
    assert "unknown" in lines[-1]


def test_export_is_never_written(exports, tmp_path):
    """Opened read-only: the file's bytes and the folder's listing are unchanged (no journal,
    no WAL, no index built)."""
    p = tmp_path / "ro.sqlite"
    shutil.copy(exports["mfu_2gpu_before"], p)
    before = p.read_bytes()
    open_source(str(p), None, trace_facts={"progress": False}).snapshot()
    assert p.read_bytes() == before
    assert sorted(x.name for x in tmp_path.iterdir()) == ["ro.sqlite"]


def clip(ivs, lo: int, hi: int) -> list[tuple[int, int]]:
    return [(max(a, lo), min(b, hi)) for a, b in ivs if b > lo and a < hi]


def test_profiler_step_ranges_are_the_steps(exports, tmp_path):
    """A capture with `ProfilerStep#N` NVTX ranges (two written here into a copy of the
    send/recv pair, inside the device work's span) has those steps, and the device time is
    clipped to them; an FSDP range before the first kernel widens a one-window capture."""
    p = tmp_path / "steps.sqlite"
    shutil.copy(exports["mfu_2gpu_before"], p)
    want = sql_devices(p)
    con = sqlite3.connect(p)
    lo, hi = con.execute('SELECT min(start), max("end") FROM CUPTI_ACTIVITY_KIND_KERNEL').fetchone()
    a, m, b = lo + (hi - lo) // 10, (lo + hi) // 2, hi - (hi - lo) // 10
    for (pid, _dev) in want["devices"]:
        tid = con.execute("SELECT globalTid FROM NVTX_EVENTS WHERE globalTid / 16777216 % "
                          "16777216 = ? LIMIT 1", (pid,)).fetchone()[0]
        for name, s, e in (("ProfilerStep#7", a, m), ("ProfilerStep#8", m, b)):
            con.execute('INSERT INTO NVTX_EVENTS (start, "end", eventType, text, globalTid) '
                        "VALUES (?, ?, 59, ?, ?)", (s, e, name, tid))
    con.commit()
    con.close()
    snap = open_source(str(p), None, trace_facts={"progress": False}).snapshot()
    assert not any("one window" in n for n in snap.log_notes)
    for row, d in zip(device_rows(snap), want["devices"].values()):
        w = snap.ranks[row["rank"]]
        assert (w.steps, w.first_step, w.last_step) == (2, 7, 8)
        compute, comm = clip(union(d["compute"]), a, b), clip(union(d["comm"]), a, b)
        assert row["step_seconds"] * 2 == pytest.approx((b - a) * 1e-9, abs=1e-9)
        assert row["compute_seconds"] * 2 == pytest.approx(total(compute) * 1e-9, abs=1e-9)
        assert row["comm_seconds"] * 2 == pytest.approx(total(comm) * 1e-9, abs=1e-9)
        assert row["exposed_comm_seconds"] * 2 == pytest.approx(minus(comm, compute) * 1e-9,
                                                                abs=1e-9)
    # one window: an FSDP range 5 ms before the first kernel or NVTX range widens the span
    q = tmp_path / "early.sqlite"
    shutil.copy(exports["mfu_2gpu_before"], q)
    con = sqlite3.connect(q)
    first = min(lo, con.execute("SELECT min(start) FROM NVTX_EVENTS").fetchone()[0])
    con.execute('INSERT INTO NVTX_EVENTS (start, "end", eventType, text, globalTid) SELECT '
                "?, ?, 59, 'FSDP::pre_forward (early)', globalTid FROM NVTX_EVENTS LIMIT 1",
                (first - 5_000_000, first - 4_000_000))
    con.commit()
    con.close()
    row = device_rows(open_source(str(q), None, trace_facts={"progress": False}).snapshot())[0]
    assert row["step_seconds"] == pytest.approx(sql_devices(q)["span_ns"] * 1e-9, abs=1e-9)
    assert sql_devices(q)["span_ns"] >= want["span_ns"] + 5_000_000 - 1


def test_rows_with_bad_times_are_skipped_and_counted(exports, tmp_path):
    """Kernel rows ending before they start, or with a negative start, change no figure and
    are counted in the report's run-log notes."""
    p = tmp_path / "bad.sqlite"
    shutil.copy(exports["mfu_2gpu_before"], p)
    before = device_rows(open_source(str(p), None, trace_facts={"progress": False}).snapshot())
    con = sqlite3.connect(p)
    cols = [r[1] for r in con.execute("PRAGMA table_info(CUPTI_ACTIVITY_KIND_KERNEL)")]
    sel = ", ".join({"end": 'start - 5000 AS "end"'}.get(c, f'"{c}"') for c in cols)
    con.execute(f"INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL SELECT {sel} FROM "
                "CUPTI_ACTIVITY_KIND_KERNEL WHERE deviceId = 0 LIMIT 2")
    sel = ", ".join({"start": "-1 AS start"}.get(c, f'"{c}"') for c in cols)
    con.execute(f"INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL SELECT {sel} FROM "
                "CUPTI_ACTIVITY_KIND_KERNEL WHERE deviceId = 0 LIMIT 1")
    con.commit()
    con.close()
    snap = open_source(str(p), None, trace_facts={"progress": False}).snapshot()
    assert device_rows(snap) == before
    assert "3 events skipped in bad.sqlite: NaN, infinite or negative times" in snap.log_notes


@pytest.mark.parametrize("name", ("h100_2gpu_1s", "mfu_2gpu_before", "overlapped"))
def test_sliced_attribution_equals_one_pass(exports, name, monkeypatch, tmp_path):
    """Large ranks are attributed in slices cut where the device is idle (bounded memory),
    read in small chunks of rows (each table's rows streamed side by side, the launches of a
    slice looked up by correlation id): the same steps, unit compute, collectives and exposure
    as one pass over every kernel.
    "overlapped": the send/recv pair with a copy of every kernel on another stream, starting
    half-way through it (work overlaps on the device: a cut inside it would count it twice)."""
    from zerodoc.trace import nsys

    if name == "overlapped":
        path = tmp_path / "overlapped.sqlite"
        shutil.copy(exports["mfu_2gpu_before"], path)
        con = sqlite3.connect(path)
        cols = [r[1] for r in con.execute("PRAGMA table_info(CUPTI_ACTIVITY_KIND_KERNEL)")]
        moved = {"start": '(start + "end") / 2', "end": '"end" + ("end" - start) / 2',
                 "streamId": "999"}
        sel = ", ".join(moved.get(c, f'"{c}"') for c in cols)
        con.execute(f"INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL SELECT {sel} FROM "
                    "CUPTI_ACTIVITY_KIND_KERNEL")
        con.commit()
        con.close()
        exports = {**exports, name: path}

    def read(limit: int):
        calls = []
        real = nsys.attribute
        monkeypatch.setattr(nsys, "SLICE_KERNELS", limit)
        monkeypatch.setattr(nsys, "CHUNK_ROWS", 512 if limit < 10**9 else 1 << 18)
        monkeypatch.setattr(nsys, "ZONE_ROWS", 128 if limit < 10**9 else 1 << 16)
        monkeypatch.setattr(nsys, "attribute", lambda *a: calls.append(1) or real(*a))
        snap = open_source(str(exports[name]), None, trace_facts={"progress": False}).snapshot()
        monkeypatch.setattr(nsys, "attribute", real)
        return snap, len(calls)

    whole, n1 = read(10**9)
    sliced, n2 = read(200)
    assert n1 == 2 and n2 >= 10  # two ranks: one pass each, then several slices each
    assert device_rows(sliced) == device_rows(whole)
    for r, w in whole.ranks.items():
        s = sliced.ranks[r]
        assert s.compute.keys() == w.compute.keys()
        for k, v in w.compute.items():
            assert s.compute[k] == pytest.approx(v, rel=1e-9, abs=1e-12), k
        assert s.comm.keys() == w.comm.keys()
        for k, c in w.comm.items():
            assert (s.comm[k].count, s.comm[k].seconds) == (c.count, pytest.approx(c.seconds))
            assert s.comm[k].exposed_seconds == pytest.approx(c.exposed_seconds)
        assert (s.framework_seconds, s.optimizer_seconds) == pytest.approx(
            (w.framework_seconds, w.optimizer_seconds))


def _rows_close(got: list[dict], want: list[dict]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.keys() == w.keys()
        for k, v in w.items():
            assert g[k] == (pytest.approx(v, rel=1e-12, abs=1e-12) if isinstance(v, float)
                            else v), k


def test_rows_out_of_start_order_are_read_sorted(exports, tmp_path, monkeypatch):
    """nsys writes each table's rows in start order and the reader streams them so; an export
    whose kernel and memory rows are stored in reverse gives the same breakdown, unit compute
    and left-out count (read through SQLite's ORDER BY), in one pass and in slices."""
    from zerodoc.trace import nsys

    p = tmp_path / "reversed.sqlite"
    shutil.copy(exports["h100_2gpu_1s"], p)
    con = sqlite3.connect(p)
    for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY"):
        con.execute(f'CREATE TABLE tmp AS SELECT * FROM {t} ORDER BY start DESC, "end"')
        con.execute(f"DELETE FROM {t}")
        con.execute(f"INSERT INTO {t} SELECT * FROM tmp")
        con.execute("DROP TABLE tmp")
    con.commit()
    con.close()
    ordered = []
    real = nsys._Rows.__init__
    monkeypatch.setattr(nsys._Rows, "__init__",
                        lambda self, *a: ordered.append(a[-1]) or real(self, *a))

    def read(path):
        return open_source(str(path), None, trace_facts={"progress": False}).snapshot()

    want = read(exports["h100_2gpu_1s"])
    assert not any(ordered)
    for limit in (10**9, 300):
        monkeypatch.setattr(nsys, "SLICE_KERNELS", limit)
        monkeypatch.setattr(nsys, "CHUNK_ROWS", 1 << 18 if limit == 10**9 else 256)
        monkeypatch.setattr(nsys, "ZONE_ROWS", 1 << 16 if limit == 10**9 else 100)
        ordered.clear()
        got = read(p)
        assert any(ordered)  # read again sorted by SQLite
        _rows_close(device_rows(got), device_rows(want))
        assert [n for n in got.log_notes if "not counted" in n] == \
            [n.replace("h100_2gpu_1s", "reversed") for n in want.log_notes if "not counted" in n]
        for r, w in want.ranks.items():
            assert got.ranks[r].compute == pytest.approx(w.compute, rel=1e-9, abs=1e-12)
