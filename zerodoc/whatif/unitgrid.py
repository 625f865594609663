"""Every rank's per-unit figures the step model's fit and its replays read, over ranks x units
with numpy, without a Python object per unit and rank (`stepmodel.UnitModel`): at 1,024 ranks
x 81 units building those objects was most of a refit, and the replays only ever read sums of
them over the ranks (the slowest rank's compute per unit, each rank's calls and compute
deficit, the largest call per collective, the framework fit's points). The objects are built
for a rank only when a reader asks for its units (`UnitGrid.units`: the replay's rank, the
first rank, a merge of units).

Ranks whose per-unit keys (`unittable.RankRows`: interned, so one tuple for every rank of a
run log read at scale), unit names, group sizes and rows with calls are the same share a
`Layout`: where each unit's numbers sit and in which order its sums are taken. Each figure is
the same float the objects give: the same operations per element, and every sum taken in the
order the objects' Python sums take it (`numpy.cumsum` is sequential). `stepmodel.FAST` off
reads the objects (the witness; tests/test_whatif.py).
"""

from __future__ import annotations

import numpy as np

GATHER = ("all_gather",)


def seq_sums(a: np.ndarray) -> np.ndarray:
    """The sum over the last axis, left to right as Python's `sum` takes it (0 where empty):
    numpy's own `sum` is pairwise past 8 terms and can differ in the last bit."""
    if a.shape[-1] == 0:
        return np.zeros(a.shape[:-1])
    return np.cumsum(a, axis=-1)[..., -1]


class Layout:
    """What ranks of one layout share: the units in the step model's order (the facts', then
    the units they do not name as the keys bring them), where each unit's forward / backward
    compute sits (-1: none), the compute of no named phase, and each unit's comm rows with
    calls in the order its `comm` dict holds them (by phase as first seen, then as seen),
    padded with the zero column K; per row its collective, phase and group size. `ok` False:
    a key seen twice (the objects keep one of them): the grid is not used."""

    def __init__(self, names: tuple, ck: tuple, mk: tuple, live: np.ndarray, groups: tuple):
        pos = {n: i for i, n in enumerate(names)}
        names = list(names)
        self.ok = len(pos) == len(names)  # two units of one name: the objects keep one

        def at(unit) -> int:
            if unit not in pos:
                pos[unit] = len(names)
                names.append(unit)
            return pos[unit]

        fwd: dict[int, int] = {}
        bwd: dict[int, int] = {}
        other = []
        for j, (unit, phase) in enumerate(ck):
            p = at(unit)
            d = fwd if phase == "forward" else bwd if phase == "backward" else None
            if d is None:
                other.append(j)
            elif p in d:
                self.ok = False
            else:
                d[p] = j
        rows: dict[int, dict] = {}  # unit -> phase -> coll -> row
        for j, (unit, phase, coll) in enumerate(mk):
            p = at(unit)
            if live[j]:
                colls = rows.setdefault(p, {}).setdefault(phase, {})
                if coll in colls:
                    self.ok = False
                colls[coll] = j
        self.names = names
        self.pos = pos
        n_units, k = len(names), len(mk)
        self.fwd = np.array([fwd.get(p, len(ck)) for p in range(n_units)], np.intp)
        self.bwd = np.array([bwd.get(p, len(ck)) for p in range(n_units)], np.intp)
        self.other = np.array(other, np.intp)
        order = [[j for cs in rows.get(p, {}).values() for j in cs.values()]
                 for p in range(n_units)]
        self.rows = self._pad(order, k)
        self.kept = {}
        for reshard in (False, True):
            kept = []
            for p in range(n_units):
                phases = rows.get(p, {})
                ks = [j for ph, cs in phases.items() for c, j in cs.items()
                      if not (ph == "backward" and c in GATHER and not reshard)]
                if reshard and "all_gather" not in phases.get("backward", {}) and \
                        "all_gather" in phases.get("forward", {}):
                    ks.append(phases["forward"]["all_gather"])
                kept.append(ks)
            self.kept[reshard] = self._pad(kept, k)
        self.live = [j for j in range(k) if live[j]]
        self.coll = [mk[j][2] for j in range(k)]
        self.phase = [mk[j][1] for j in range(k)]
        self.group = groups

    @staticmethod
    def _pad(lists: list[list[int]], k: int) -> np.ndarray:
        width = max((len(x) for x in lists), default=0)
        out = np.full((len(lists), width), k, np.intp)
        for i, x in enumerate(lists):
            out[i, :len(x)] = x
        return out


class Block:
    """The ranks of one layout (`idx`: their places in the fit's rank order) and their
    figures per unit, rows (ranks) x units: forward / backward compute per step, calls
    (`all_calls`; with the run's or a change's resharding, `calls(reshard)`), bytes moved and
    largest call per step as measured, each as `stepmodel._rank_units` and `_prime` make
    them; `other` each rank's compute outside the named phases per step; `bpc` each row's
    bytes per call (rows with calls)."""

    def __init__(self, layout: Layout, idx: list[int], rows: list, steps: np.ndarray):
        self.layout, self.idx = layout, idx
        n = steps[:, None]
        cv = np.stack([r.cv for r in rows]) if rows[0].cv else np.zeros((len(rows), 0))
        cv = np.concatenate((cv, np.zeros((len(rows), 1))), axis=1)
        self.fwd = 0.0 + cv[:, layout.fwd] / n
        self.bwd = 0.0 + cv[:, layout.bwd] / n
        self.other = seq_sums(cv[:, layout.other]) / steps
        mv = np.stack([r.mv for r in rows]) if len(layout.coll) else np.zeros((len(rows), 0, 5))
        count = mv[:, :, 0]
        has = count > 0
        calls = count / n
        bpc = np.divide(mv[:, :, 1], count, out=np.zeros_like(count), where=has)
        pad = np.zeros((len(rows), 1))
        self._calls = np.concatenate((calls, pad), axis=1)
        self.bpc = bpc
        self.all_calls = seq_sums(self._calls[:, layout.rows])
        self.moved = seq_sums(np.concatenate((calls * bpc, pad), axis=1)[:, layout.rows])
        big = np.concatenate((bpc, pad), axis=1)[:, layout.rows]
        self.largest = big.max(axis=2) if big.shape[2] else np.zeros(big.shape[:2])
        self._kept: dict[bool, np.ndarray] = {}

    def calls(self, reshard: bool) -> np.ndarray:
        """Each unit's calls per step with resharding after forward on or off (`_calls`)."""
        got = self._kept.get(reshard)
        if got is None:
            got = self._kept[reshard] = seq_sums(self._calls[:, self.layout.kept[reshard]])
        return got


class UnitGrid:
    """Every rank's per-unit figures (`Block`s, one per layout) and what the fit and its
    replays ask of them over the ranks, each asked once (they do not change: a `UnitPart`'s).
    `units(i)` builds rank i's unit objects when a reader needs them (`build(i)`)."""

    def __init__(self, blocks: list[Block], ranks: int, build):
        self.blocks = blocks
        self.n = ranks
        self._build = build
        self._units: dict[int, list] = {}
        self._asked: dict = {}
        first = next(b for b in blocks if 0 in b.idx)
        self.first = first

    def units(self, i: int) -> list:
        got = self._units.get(i)
        if got is None:
            got = self._units[i] = self._build(i)
        return got

    def built(self) -> int:
        """How many ranks' unit objects were built (the tests: only those a reader asked)."""
        return len(self._units)

    def per_rank(self, per_block) -> list[float]:
        """`per_block(block)` (one figure per rank of the block) in the fit's rank order."""
        out = [0.0] * self.n
        for b in self.blocks:
            for i, v in zip(b.idx, per_block(b).tolist()):
                out[i] = v
        return out

    def _once(self, key, make):
        got = self._asked.get(key)
        if got is None:
            got = self._asked[key] = make()
        return got

    def rank_calls(self, reshard: bool) -> list[float]:
        """Each rank's calls per step, its units summed in order (`_per_rank("calls")`)."""
        return self._once(("calls", reshard),
                          lambda: self.per_rank(lambda b: seq_sums(b.calls(reshard))))

    def slowest(self) -> tuple[np.ndarray, np.ndarray]:
        """Per unit of the first rank the largest forward and backward compute over the
        ranks whose unit at that place has its name (`stepmodel._slowest`)."""
        def make():
            names = self.first.layout.names
            row = self.first.idx.index(0)
            f, b = self.first.fwd[row].copy(), self.first.bwd[row].copy()
            for blk in self.blocks:
                other = blk.layout.names
                m = min(len(names), len(other))
                same = np.array([names[j] == other[j] for j in range(m)], bool)
                if not same.any():
                    continue
                cols = np.flatnonzero(same)
                f[cols] = np.maximum(f[cols], blk.fwd[:, cols].max(axis=0))
                b[cols] = np.maximum(b[cols], blk.bwd[:, cols].max(axis=0))
            return f, b
        return self._once("slowest", make)

    def deficits(self) -> list[float]:
        """Each rank's compute per step below the slowest rank's, unit by unit in place
        order (`stepmodel._deficit`)."""
        def make():
            sf, sb = self.slowest()

            def per(b):
                m = min(len(sf), b.fwd.shape[1])
                return seq_sums(((sf[:m] + sb[:m]) - b.fwd[:, :m]) - b.bwd[:, :m])
            return self.per_rank(per)
        return self._once("deficit", make)

    def top_bytes(self, reshard: bool, world_size: int | None) -> dict:
        """(collective, group size) -> the largest bytes per call of any rank's rows with
        calls, the backward all-gathers left out with resharding off, groups of one left
        out unless the change sets a world size (`StepModel.beyond_sizes` on the units as
        measured)."""
        def make():
            top: dict = {}
            for b in self.blocks:
                lay = b.layout
                if not lay.live:
                    continue
                col_max = b.bpc[:, lay.live].max(axis=0).tolist()
                for j, v in zip(lay.live, col_max):
                    c = lay.coll[j]
                    if lay.phase[j] == "backward" and not reshard and c in GATHER:
                        continue
                    g = lay.group[j]
                    if (world_size or g) > 1 and v > top.get((c, g), 0.0):
                        top[c, g] = v
            return top
        return self._once(("top", reshard, world_size), make)

    def framework_points(self, fw: list[dict]) -> list[tuple]:
        """Per rank `stepmodel._framework_points` as columns (`fw`: each rank's framework
        seconds per step by unit name) and the largest call among its units with framework
        time (None: none)."""
        out: list = [None] * self.n
        for b in self.blocks:
            t, names = b.layout.tensors, b.layout.names
            for row, i in enumerate(b.idx):
                get = fw[i].get
                s = np.array([get(n, np.nan) for n in names], np.float64)
                calls, moved = b.all_calls[row], b.moved[row]
                ok = ~np.isnan(s) & (calls > 0) & (moved > 0)
                cols = np.flatnonzero(ok)
                has = np.flatnonzero(~np.isnan(s))
                pts = (moved[cols] / calls[cols], s[cols] / calls[cols], calls[cols],
                       [t[c] for c in cols.tolist()])
                top = float(b.largest[row, has].max()) if len(has) else None
                out[i] = (pts, top)
        return out


def _signature(facts, mk: tuple) -> tuple:
    """What a rank's facts give its layout: the units' names and parameter tensor counts in
    order, and each comm row's group size (`stepmodel._units_from`'s), kept on the facts per
    comm keys (frozen: set beside the fields, as `RankFacts.unit`'s index)."""
    kept = facts.__dict__.get("_grid_signature")
    if kept is not None and kept[0] is mk:
        return kept[1]
    groups = []
    for unit, _phase, coll in mk:
        u = facts.unit(unit)
        groups.append(u.collective_group_size(coll) if u else facts.world_size)
    sig = (tuple(u.name for u in facts.units), tuple(u.tensors for u in facts.units),
           tuple(groups))
    object.__setattr__(facts, "_grid_signature", (mk, sig))
    return sig


def grid(windows: list, rows: list, build) -> UnitGrid | None:
    """The `UnitGrid` of these ranks (`windows`: in the fit's order; `rows`: their
    `unittable.RankRows`; `build(i)`: rank i's unit objects), or None where a layout cannot
    say what the objects would (a key seen twice, two units of one name)."""
    same: dict = {}  # equal keys, names, groups: one object each
    members: dict = {}
    for i, (w, r) in enumerate(zip(windows, rows)):
        sig = _signature(w.facts, r.mk)
        ck, mk, sig = (same.setdefault(x, x) for x in (r.ck, r.mk, sig))
        key = (id(ck), id(mk), id(sig), (r.mv[:, 0] > 0).tobytes())
        members.setdefault(key, (ck, mk, sig, []))[3].append(i)
    blocks = []
    for ck, mk, (names, tensors, groups), idx in members.values():
        live = rows[idx[0]].mv[:, 0] > 0
        lay = Layout(names, ck, mk, live, groups)
        if not lay.ok:
            return None
        lay.tensors = list(tensors) + [None] * (len(lay.names) - len(tensors))
        steps = np.array([windows[i].per_unit_steps for i in idx])
        blocks.append(Block(lay, idx, [rows[i] for i in idx], steps))
    return UnitGrid(blocks, len(windows), build)
