"""Every rank's per-unit numbers read at once, for the step model's per-unit part (`stepmodel.
UnitPart`): from the arrays a run log read at scale already holds (`RankWindow.unit_arrays`),
without the dicts of `CommTotals` (turning them into dicts was ~11 % of a refit at 256 ranks x
81 units), and the figures taken over the ranks (each collective call's smallest time: the
link's, `linkfit.link_points`; each rank's wait beyond it, `stepmodel.arrival_excess`) with
numpy over ranks x keys, where the dict form walked every rank's rows in Python twice.

Each figure is the same float the dict form gives: the same operations per element, and the
sums a rank's answers depend on taken in the rank's own key order, one after the other
(`numpy.cumsum` is sequential; a plain `numpy.sum` is pairwise and can differ in the last
bit). The dict form stays as the witness (`stepmodel.FAST` off; tests/test_whatif.py).
"""

from __future__ import annotations

import numpy as np


class RankRows:
    """One rank's per-unit numbers: compute keys and seconds; comm keys, their rows
    (count, bytes, seconds, exposed, hidden) as an array (count and bytes truncated as
    `CommTotals` holds them) and as lists."""

    __slots__ = ("ck", "cv", "mk", "mv", "_rows")

    def __init__(self, ck, cv, mk, mv):
        self.ck, self.cv, self.mk, self.mv = ck, cv, mk, mv
        self._rows = None

    @property
    def rows(self) -> list:
        """The rows as lists, made when first read (a rank's unit objects, a link point)."""
        if self._rows is None:
            self._rows = self.mv.tolist()
        return self._rows


def rank_rows(w) -> RankRows:
    """A window's per-unit numbers as `RankRows`: its arrays while its dicts were not read
    from them (`LazyRankWindow`), else from its dicts."""
    arr = getattr(w, "unit_arrays", None)
    if arr is not None and getattr(w, "_loader", None) is None:
        ck, cv, mk, mv = arr
        mv = np.array(mv, np.float64).reshape(len(mk), 5)
        mv[:, :2] = np.trunc(mv[:, :2])  # CommTotals(int(count), int(bytes), ...)
        return RankRows(ck, cv.tolist(), mk, mv)
    comm = w.comm
    mv = np.array([(c.count, c.bytes, c.seconds, c.exposed_seconds, c.hidden_seconds)
                   for c in comm.values()], np.float64).reshape(len(comm), 5)
    return RankRows(tuple(w.compute), list(w.compute.values()), tuple(comm), mv)


class Tables:
    """`RankRows` of every rank (rank order) and, per comm key of any rank, the smallest
    time per call over the ranks whose row there has calls and seconds (`best`: which rank,
    -1 none): the link-attributable time per call."""

    def __init__(self, rows: list[RankRows]):
        self.rows = rows
        keys: dict = {}
        self.index = []  # per rank: its keys' columns in the union
        seen: dict[int, np.ndarray] = {}
        for r in rows:
            idx = seen.get(id(r.mk))
            if idx is None:
                for k in r.mk:
                    keys.setdefault(k, len(keys))
                idx = seen[id(r.mk)] = np.fromiter((keys[k] for k in r.mk), np.intp, len(r.mk))
            self.index.append(idx)
        self.keys = list(keys)
        per_call = np.full((len(rows), len(keys)), np.inf)
        for i, (r, idx) in enumerate(zip(rows, self.index)):
            if len(idx):
                per_call[i, idx] = self._per_call(r)
        self.best = np.argmin(per_call, axis=0) if len(rows) else np.zeros(0, np.intp)
        self.least = per_call[self.best, np.arange(len(keys))] if len(rows) else per_call[0]
        self.best[~np.isfinite(self.least)] = -1

    @staticmethod
    def _per_call(r: RankRows) -> np.ndarray:
        """Seconds per call of a rank's rows with calls and seconds (inf elsewhere)."""
        count, secs = r.mv[:, 0], r.mv[:, 2]
        ok = (count > 0) & (secs > 0)
        return np.where(ok, secs / np.where(ok, count, 1.0), np.inf)

    def hidden(self, colls: tuple[str, ...]) -> float:
        """The hidden seconds of these collectives over every rank."""
        total = 0.0
        masks: dict[int, list] = {}  # by keys: every rank of a run log shares one tuple
        for r in self.rows:
            mask = masks.get(id(r.mk))
            if mask is None:
                mask = masks[id(r.mk)] = [k[2] in colls for k in r.mk]
            if any(mask):
                total += float(r.mv[mask, 4].sum())
        return total

    def link_points(self, facts_of: list) -> dict:
        """`linkfit.link_points` of these ranks (`facts_of`: each rank's facts)."""
        out = {}
        groups: dict[int, dict] = {}
        for j, i in enumerate(self.best.tolist()):
            if i < 0:
                continue
            key = self.keys[j]
            r, facts = self.rows[i], facts_of[i]
            count, nbytes, secs = r.rows[self._col(i, j)][:3]
            g = groups.get(id(facts))
            if g is None:
                g = groups[id(facts)] = {u.name: u for u in facts.units}
            u = g.get(key[0])
            n = u.collective_group_size(key[2]) if u else facts.world_size
            out[key] = (n, nbytes / count, secs / count, float(count))
        return out

    def _col(self, i: int, j: int) -> int:
        """Where rank i's rows hold the union's key j."""
        cols = self.__dict__.setdefault("_cols", {})
        pos = cols.get(id(self.rows[i].mk))
        if pos is None:
            pos = cols[id(self.rows[i].mk)] = {c: p for p, c in
                                               enumerate(self.index[i].tolist())}
        return pos[j]

    def waits(self, steps: list[int]) -> list[float]:
        """Per rank its wait in the collectives beyond the link per step (`steps`: each
        rank's per-unit steps): per row with calls and seconds, the seconds beyond the
        smallest per call over the ranks, in the proportion its collective was exposed,
        summed in the rank's key order (`stepmodel.arrival_excess`)."""
        out = []
        for r, idx, n in zip(self.rows, self.index, steps):
            if not len(idx):
                out.append(0.0)
                continue
            count, secs, exp = r.mv[:, 0], r.mv[:, 2], r.mv[:, 3]
            ok = (count > 0) & (secs > 0)
            least = np.where(ok, self.least[idx], 0.0)
            extra = secs - least * count
            term = np.maximum(0.0, extra) * np.minimum(1.0, exp / np.where(ok, secs, 1.0)) / n
            out.append(float(np.cumsum(np.where(ok, term, 0.0))[-1]))
        return out
