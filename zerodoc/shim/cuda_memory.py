"""The GPU's memory as the CUDA caching allocator and the driver see it: allocator
populations (no device sync), an OOM observer, the device's capacity. Imported only when the
model lives on a CUDA device.
"""

from __future__ import annotations

import os
import warnings
from typing import Any


def allocator_stats(reset_peaks: bool = False) -> dict[str, int]:
    """Per-device allocator populations (bytes) and counters: host-side counters under the
    allocator's lock, no device sync.

    `peak_*` are the allocator's high-water marks since the process started or since the
    last `torch.cuda.reset_peak_memory_stats()` (the job's own, if it resets them). Only with
    `reset_peaks` (attach option `reset_peak_memory`) does zerodoc reset them after reading,
    making them per-step peaks, and then every other reader of `max_memory_allocated()` in
    the job sees per-step values too; the peak since start is kept as `*_since_start`."""
    import torch

    try:
        out = _raw_stats(torch)
    except Exception:  # noqa: BLE001 - the private read changed: the public, slower one
        st = torch.cuda.memory_stats()
        out = {
            "allocated": st.get("allocated_bytes.all.current", 0),
            "reserved": st.get("reserved_bytes.all.current", 0),
            "peak_allocated": st.get("allocated_bytes.all.peak", 0),
            "peak_reserved": st.get("reserved_bytes.all.peak", 0),
            "inactive_split": st.get("inactive_split_bytes.all.current", 0),
            "alloc_retries": st.get("num_alloc_retries", 0),
            "ooms": st.get("num_ooms", 0),
        }
    if reset_peaks:
        torch.cuda.reset_peak_memory_stats()
    return out


def _raw_stats(torch) -> dict[str, int]:
    """The same numbers from the allocator's nested dict (`torch._C._cuda_memoryStats`, what
    `torch.cuda.memory_stats()` flattens in Python, every key of it, at each step end)."""
    st = torch._C._cuda_memoryStats(torch._C._cuda_getDevice())
    a, r, i = st["allocated_bytes"]["all"], st["reserved_bytes"]["all"], \
        st["inactive_split_bytes"]["all"]
    return {"allocated": a["current"], "reserved": r["current"], "peak_allocated": a["peak"],
            "peak_reserved": r["peak"], "inactive_split": i["current"],
            "alloc_retries": st.get("num_alloc_retries", 0), "ooms": st.get("num_ooms", 0)}


class AllocatorReader:
    """Reads `allocator_stats` at step ends; with `reset_peaks` keeps the peak since start
    itself (`peak_allocated_since_start`, `peak_reserved_since_start`), since the allocator's
    own is reset every step."""

    def __init__(self, reset_peaks: bool):
        self.reset_peaks = reset_peaks
        self._max = {"peak_allocated": 0, "peak_reserved": 0}

    def read(self) -> dict[str, int]:
        out = allocator_stats(self.reset_peaks)
        if self.reset_peaks:
            for k, m in self._max.items():
                self._max[k] = max(m, out[k])
                out[k + "_since_start"] = self._max[k]
        return out


class OOMObserver:
    """Counts CUDA OOMs and (if asked) dumps a memory snapshot into the run directory.
    It observes only: the OutOfMemoryError still reaches the training code."""

    def __init__(self, run_dir: str, rank: int, registry, history: bool,
                 max_entries: int = 100_000):
        self.run_dir, self.rank, self.registry = run_dir, rank, registry
        self.count = 0
        self.history = False
        import torch

        if history:
            try:
                torch.cuda.memory._record_memory_history(max_entries=max_entries)
                self.history = True
                registry.ok("torch.cuda.memory._record_memory_history")
            except Exception as e:
                registry.missing("torch.cuda.memory._record_memory_history", repr(e))
        attach = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
        if attach is None:
            registry.missing("torch._C._cuda_attach_out_of_memory_observer", "not in this torch")
            return
        attach(self._on_oom)
        registry.ok("torch._C._cuda_attach_out_of_memory_observer")

    def _on_oom(self, device, alloc, device_allocated, device_free) -> None:
        self.count += 1
        if not self.history:
            return
        try:
            import torch

            path = os.path.join(self.run_dir, f"oom-rank{self.rank:05d}-{self.count}.pickle")
            torch.cuda.memory._dump_snapshot(path)
        except Exception as e:  # never in the way of the OOM itself
            self.registry.error("oom_snapshot", e)


def capacity_bytes(device: Any = None) -> int | None:
    try:
        import torch

        return int(torch.cuda.mem_get_info(device)[1])
    except Exception as e:
        warnings.warn(f"zerodoc: cannot read GPU capacity ({e})", stacklevel=2)
        return None
