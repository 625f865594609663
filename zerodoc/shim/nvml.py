"""NVML: device utilisation, memory, PCIe/NVLink throughput and the link class between the
job's GPUs. nvidia-ml-py is imported lazily; without it (or without a driver) NVML is a
logged fact (`zerodoc_hook_available{hook="nvml"} 0`), not an error.

Sampling runs on a daemon thread once a second, never in the training step; the step end
only copies the latest sample.
"""

from __future__ import annotations

import os
import threading


def link_class_from_topology(nvlink_peers: int, common_ancestor: str | None,
                             multi_node: bool) -> str:
    """The link class the slow-link rule expects between this job's ranks.

    nvlink_peers: active NVLink connections of this GPU; common_ancestor: NVML topology
    level between local GPUs ("internal", "single", "multiple", "hostbridge", "node",
    "system"), None for a single GPU; multi_node: ranks on other hosts.
    """
    if multi_node:
        return "infiniband"  # the inter-node hop bounds the all-gather; configurable
    if nvlink_peers > 0:
        return "nvlink"
    if common_ancestor is None:
        return "local"
    return "pcie"


_TOPO_NAMES = {0: "internal", 10: "single", 20: "multiple", 30: "hostbridge", 40: "node",
               50: "system"}


class NvmlSampler:
    def __init__(self, nvml, handle, registry, interval_s: float = 1.0):
        self._nvml = nvml
        self._h = handle
        self._registry = registry
        self._interval = interval_s
        self._latest: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="zerodoc-nvml", daemon=True)
        self.link_class = "unknown"

    @classmethod
    def start(cls, registry, device_index: int | None = None) -> "NvmlSampler | None":
        try:
            import pynvml as nvml
        except ImportError:
            registry.missing("nvml", "nvidia-ml-py not installed (pip install nvidia-ml-py)")
            return None
        try:
            nvml.nvmlInit()
            import torch

            idx = torch.cuda.current_device() if device_index is None else device_index
            bus = torch.cuda.get_device_properties(idx).pci_bus_id if hasattr(
                torch.cuda.get_device_properties(idx), "pci_bus_id") else None
            h = (nvml.nvmlDeviceGetHandleByPciBusId(bus) if bus
                 else nvml.nvmlDeviceGetHandleByIndex(idx))
        except Exception as e:
            registry.missing("nvml", f"NVML unavailable ({e!r})")
            return None
        registry.ok("nvml")
        s = cls(nvml, h, registry)
        s.link_class = s._link_class()
        s._thread.start()
        return s

    def _link_class(self) -> str:
        nvml = self._nvml
        peers = 0
        try:
            for link in range(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18)):
                try:
                    if nvml.nvmlDeviceGetNvLinkState(self._h, link):
                        peers += 1
                except nvml.NVMLError:
                    break
        except Exception:
            peers = 0
        ancestor = None
        try:
            n = nvml.nvmlDeviceGetCount()
            for i in range(n):
                other = nvml.nvmlDeviceGetHandleByIndex(i)
                if nvml.nvmlDeviceGetPciInfo(other).busId == \
                        nvml.nvmlDeviceGetPciInfo(self._h).busId:
                    continue
                lvl = nvml.nvmlDeviceGetTopologyCommonAncestor(self._h, other)
                ancestor = _TOPO_NAMES.get(int(lvl), str(lvl))
                break
        except Exception:
            pass
        multi = int(os.environ.get("WORLD_SIZE", 1)) > int(
            os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", 1)))
        return link_class_from_topology(peers, ancestor, multi)

    def _sample(self) -> dict[str, float]:
        nvml, h = self._nvml, self._h
        out: dict[str, float] = {}
        mem = nvml.nvmlDeviceGetMemoryInfo(h)
        out["gpu_used"] = mem.used
        out["gpu_total"] = mem.total
        out["gpu_utilization_ratio"] = nvml.nvmlDeviceGetUtilizationRates(h).gpu / 100.0
        try:  # KB/s over the last 20 ms window
            out["pcie_tx_bytes_per_second"] = nvml.nvmlDeviceGetPcieThroughput(
                h, nvml.NVML_PCIE_UTIL_TX_BYTES) * 1024
            out["pcie_rx_bytes_per_second"] = nvml.nvmlDeviceGetPcieThroughput(
                h, nvml.NVML_PCIE_UTIL_RX_BYTES) * 1024
        except Exception:
            pass
        return out

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self._latest = self._sample()
            except Exception as e:
                self._registry.error("nvml", e)

    def latest(self) -> dict[str, float]:
        return dict(self._latest)

    def stop(self) -> None:
        self._stop.set()
