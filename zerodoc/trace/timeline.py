"""Interval arithmetic on timelines (numpy arrays of starts and ends, microseconds).

A *set* is a pair (starts, ends) of sorted, non-overlapping intervals. Everything here is
vectorised: a trace's million operators or kernels cost a sort and a few passes.
"""

from __future__ import annotations

import numpy as np

EMPTY = (np.zeros(0), np.zeros(0))


def merge(starts, ends) -> tuple[np.ndarray, np.ndarray]:
    """Union of arbitrary intervals as a set."""
    s = np.asarray(starts, dtype=float)
    e = np.asarray(ends, dtype=float)
    if not len(s):
        return EMPTY
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    reach = np.maximum.accumulate(e)
    new = np.ones(len(s), dtype=bool)
    new[1:] = s[1:] > reach[:-1]
    idx = np.flatnonzero(new)
    out_s = s[idx]
    out_e = reach[np.append(idx[1:] - 1, len(s) - 1)]
    return out_s, out_e


def length(a) -> float:
    return float(np.sum(a[1] - a[0])) if len(a[0]) else 0.0


def cumulative(a):
    """F(t) = measure of (set ∩ (-inf, t]), as a function over arrays of t."""
    s, e = a
    before = np.concatenate(([0.0], np.cumsum(e - s)))

    def f(t):
        t = np.asarray(t, dtype=float)
        if not len(s):
            return np.zeros(t.shape)
        k = np.searchsorted(s, t, side="right") - 1
        kk = np.clip(k, 0, None)
        inside = np.clip(np.minimum(t, e[kk]) - s[kk], 0.0, None)
        return np.where(k < 0, 0.0, before[kk] + inside)
    return f


def contains(a, t) -> np.ndarray:
    """For each time in `t`, whether it lies inside set `a`."""
    t = np.asarray(t, dtype=float)
    if not len(a[0]):
        return np.zeros(t.shape, dtype=bool)
    k = np.searchsorted(a[0], t, side="right") - 1
    return (k >= 0) & (t < a[1][np.clip(k, 0, None)])


def overlap_each(starts, ends, a) -> np.ndarray:
    """For each query interval, the length of its intersection with set `a`."""
    f = cumulative(a)
    return f(ends) - f(starts)


def intersect_length(a, b) -> float:
    """Measure of a ∩ b."""
    return float(np.sum(overlap_each(a[0], a[1], b))) if len(a[0]) else 0.0


def subtract(a, b) -> tuple[np.ndarray, np.ndarray]:
    """a minus b (both sets)."""
    if not len(a[0]) or not len(b[0]):
        return a
    # Boundaries of a and b together; keep the pieces inside a and outside b.
    pts = np.unique(np.concatenate([a[0], a[1], b[0], b[1]]))
    lo, hi = pts[:-1], pts[1:]
    mid = (lo + hi) / 2
    ka = np.searchsorted(a[0], mid, side="right") - 1
    in_a = (ka >= 0) & (mid < a[1][np.clip(ka, 0, None)])
    kb = np.searchsorted(b[0], mid, side="right") - 1
    in_b = (kb >= 0) & (mid < b[1][np.clip(kb, 0, None)])
    keep = in_a & ~in_b
    return merge(lo[keep], hi[keep])


def segments(intervals: list[tuple[float, float, object]]):
    """Nested labelled intervals -> disjoint segments, each with its innermost label.

    Intervals that overlap without nesting are clipped to their parent. Returns parallel
    lists (starts, ends, labels) in time order; time outside every interval is left out.
    """
    out_s: list[float] = []
    out_e: list[float] = []
    out_l: list[object] = []

    def emit(a: float, b: float, lab) -> None:
        if b > a:
            out_s.append(a)
            out_e.append(b)
            out_l.append(lab)

    stack: list[tuple[float, object]] = []  # (end, label)
    cur = 0.0
    for s, e, lab in sorted(intervals, key=lambda x: (x[0], -x[1])):
        while stack and stack[-1][0] <= s:
            end, top = stack.pop()
            emit(cur, end, top)
            cur = end
        if stack:
            emit(cur, s, stack[-1][1])
            e = min(e, stack[-1][0])
        cur = s
        stack.append((e, lab))
    while stack:
        end, top = stack.pop()
        emit(cur, end, top)
        cur = end
    return out_s, out_e, out_l


def credit(starts, ends) -> tuple[np.ndarray, np.ndarray]:
    """Each interval's share of the union: taken in start order, an interval is credited the
    part [a, b] that no earlier-starting interval covered (a == b: nothing). The credited
    parts are disjoint and their lengths add up to the union's (returned in input order)."""
    s = np.asarray(starts, dtype=float)
    e = np.asarray(ends, dtype=float)
    if not len(s):
        return s.copy(), e.copy()
    order = np.argsort(s, kind="stable")
    so, eo = s[order], e[order]
    prev = np.concatenate(([-np.inf], np.maximum.accumulate(eo)[:-1]))
    a = np.maximum(so, prev)
    b = np.maximum(eo, a)
    out_a = np.empty_like(a)
    out_b = np.empty_like(b)
    out_a[order] = a
    out_b[order] = b
    return out_a, out_b


def split(a, b, ws, we) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Intervals [a, b] cut at the edges of sorted, disjoint windows [ws, we]: parallel arrays
    (interval index, window index, length > 0). Time outside every window is left out."""
    a = np.asarray(a, dtype=float)
    b = np.asarray(b, dtype=float)
    ws = np.asarray(ws, dtype=float)
    we = np.asarray(we, dtype=float)
    lo = np.searchsorted(we, a, side="right")  # the first window ending after a
    hi = np.searchsorted(ws, b, side="left")  # windows [0, hi) start before b
    n = hi - lo
    pi = [np.flatnonzero(n == 1)]
    wi = [lo[pi[0]]]
    for i in np.flatnonzero(n > 1):  # rare: an interval across a window's edge
        pi.append(np.full(n[i], i))
        wi.append(np.arange(lo[i], hi[i]))
    p = np.concatenate(pi).astype(np.int64)
    w = np.concatenate(wi).astype(np.int64)
    ln = np.minimum(b[p], we[w]) - np.maximum(a[p], ws[w])
    keep = ln > 0
    return p[keep], w[keep], ln[keep]
