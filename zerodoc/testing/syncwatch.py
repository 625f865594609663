"""Counts explicit host-device synchronisations, and who made them.

`torch.cuda.set_sync_debug_mode("error")` catches `.item()`, blocking device-to-host copies
and `Stream.synchronize()`, but not `torch.cuda.synchronize()`, `Event.synchronize()`,
`Work.wait(timeout)` or anything in torch.distributed (see docs/gpus.md). `SyncWatch`
patches the Python entry points for the explicit ones (and `.item()` / `.tolist()` /
`.cpu()` for CPU tests, where the debug mode does not exist) and classifies every call by
the code that made it: zerodoc (a frame in the `zerodoc` package), a framework (FSDP1's
rate limiter, FSDP2's offload, DeepSpeed, DDP), the check / test itself, or other. C++
callers (DDP's runtime-stats logger) are invisible here; the profiler's
`enable_cuda_sync_events` sees them.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections import Counter

import torch

_ZERODOC = os.sep + "zerodoc" + os.sep
_HERE = os.path.abspath(__file__)

FRAMEWORKS = (
    (os.sep + "fsdp" + os.sep + "_limiter_utils", "FSDP1 limit_all_gathers rate limiter"),
    (os.sep + "fsdp" + os.sep + "_runtime_utils", "FSDP1 runtime"),
    (os.sep + "_fully_shard" + os.sep, "FSDP2"),
    (os.sep + "deepspeed" + os.sep, "DeepSpeed (fetch back-pressure, timers)"),
    (os.sep + "nn" + os.sep + "parallel" + os.sep, "DDP"),
    (os.sep + "optim" + os.sep, "torch optimizer"),
)


def classify(stack: list) -> str:
    """Who made the call: the innermost frame that is zerodoc's, a framework's, or the
    caller's own code decides."""
    for fr in reversed(stack):
        fn = fr.filename
        if os.path.abspath(fn) == _HERE:
            continue
        if _ZERODOC in fn:
            return "zerodoc"
        for key, name in FRAMEWORKS:
            if key in fn:
                return name
    return "caller"


class SyncWatch:
    """Context manager: `watch.counts` (origin -> n), `watch.calls` (entry, origin, where)."""

    ENTRY_POINTS = [
        ("torch.cuda.synchronize", torch.cuda, "synchronize"),
        ("torch.cuda.Event.synchronize", torch.cuda.Event, "synchronize"),
        ("torch.cuda.Stream.synchronize", torch.cuda.Stream, "synchronize"),
        ("Tensor.item", torch.Tensor, "item"),
        ("Tensor.tolist", torch.Tensor, "tolist"),
        ("Tensor.cpu", torch.Tensor, "cpu"),
    ]

    def __init__(self, extra: list | None = None):
        self.counts: Counter = Counter()
        self.calls: list[tuple[str, str, str]] = []
        self._saved: list = []
        self._entries = self.ENTRY_POINTS + list(extra or [])
        self._busy = False

    def _wrap(self, label: str, orig):
        watch = self

        def counted(*args, **kwargs):
            if not watch._busy:
                watch._busy = True
                try:
                    stack = traceback.extract_stack()[:-1]
                    origin = classify(stack)
                    watch.counts[origin] += 1
                    where = next((f"{f.filename}:{f.lineno}" for f in reversed(stack)
                                  if os.path.abspath(f.filename) != _HERE), "?")
                    watch.calls.append((label, origin, where))
                finally:
                    watch._busy = False
            return orig(*args, **kwargs)
        return counted

    def __enter__(self) -> "SyncWatch":
        for label, owner, name in self._entries:
            orig = getattr(owner, name, None)
            if orig is None:
                continue
            self._saved.append((owner, name, orig))
            setattr(owner, name, self._wrap(label, orig))
        return self

    def __exit__(self, *exc) -> None:
        for owner, name, orig in reversed(self._saved):
            setattr(owner, name, orig)
        self._saved.clear()

    def by(self, origin: str) -> list[tuple[str, str, str]]:
        return [c for c in self.calls if c[1] == origin]


if __name__ == "__main__":  # pragma: no cover - a quick self-check
    with SyncWatch() as w:
        torch.zeros(1).item()
    print(dict(w.counts), file=sys.stderr)


def python_calls(fn, prefix: str = "zerodoc", exclude: str = "zerodoc.testing") -> int:
    """Python function calls into modules named `prefix...` (not `exclude...`) while `fn`
    runs on this thread, counted with sys.setprofile: an independent witness of which code
    was entered (the tiers' "unsampled steps enter no zerodoc code")."""
    n = 0

    def prof(frame, event, arg):
        nonlocal n
        if event == "call":
            mod = str(frame.f_globals.get("__name__", ""))
            if mod.startswith(prefix) and not (exclude and mod.startswith(exclude)):
                n += 1
    prev = sys.getprofile()
    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(prev)
    return n
