"""Peak memory while a benchmark runs: host RSS of this process and its descendants
(cluster workers included) and, on a GPU, device-wide use, CuPy's pool and NVML's
utilisation, sampled in a thread."""

from __future__ import annotations

import contextlib
import math
import threading
import time
from typing import Any

from device import Device


def _proc_tree_rss() -> int:
    """RSS of this process and all its descendants (cluster workers included); psutil
    comes with distributed."""
    import psutil

    me = psutil.Process()
    total = me.memory_info().rss
    for child in me.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            total += child.memory_info().rss
    return total


class _DeviceMemory:
    """Device-wide used bytes (NVML, else the CUDA driver) and CuPy's pool of this process."""

    def __init__(self):
        import cupy

        self.cupy = cupy
        self.pool = cupy.get_default_memory_pool()
        self.nvml = None
        try:
            import pynvml

            pynvml.nvmlInit()
            bus = cupy.cuda.Device(0).pci_bus_id
            handle = None
            for key in (bus, bus.encode()):  # str or bytes, depending on the version
                with contextlib.suppress(Exception):
                    handle = handle or pynvml.nvmlDeviceGetHandleByPciBusId(key)
            self.nvml = (pynvml, handle) if handle is not None else None
        except Exception:  # noqa: BLE001 - no NVML: the driver's memGetInfo instead
            self.nvml = None

    def sample(self) -> dict[str, int]:
        busy = {}
        if self.nvml is not None:
            pynvml, handle = self.nvml
            used = int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
            # percent of NVML's last sample period with a kernel running on the device
            busy = {"gpu_busy": int(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)}
        else:
            free, total = self.cupy.cuda.runtime.memGetInfo()
            used = int(total - free)
        return {"device_used": used, "pool_used": int(self.pool.used_bytes()),
                "pool_total": int(self.pool.total_bytes()), **busy}


class PeakMemory:
    """Peak memory while the ``with`` block runs, sampled every ``interval`` seconds.

    Host: RSS of this process and its descendants (cluster workers). Device
    (GPU runs): device-wide used memory (NVML, else ``cudaMemGetInfo``; it
    includes other processes on the device, such as cluster workers) and
    CuPy's default pool in this process (``used_bytes``, ``total_bytes``).
    Baselines are taken on entry, so peaks can be read as increases. Short
    spikes between samples can be missed.
    """

    def __init__(self, device: Device, interval: float = 0.02):
        self.device_mem = _DeviceMemory() if device.is_gpu else None
        self.interval = interval
        self.peak: dict[str, int] = {}
        self.baseline: dict[str, int] = {}
        self.busy: list[tuple[float, int]] = []  # (time.time(), GPU utilisation percent)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> dict[str, int]:
        out = {"host_rss": _proc_tree_rss()}
        if self.device_mem is not None:
            out.update(self.device_mem.sample())
        return out

    def _record(self) -> None:
        sample = self._sample()
        busy = sample.pop("gpu_busy", None)
        if busy is not None:
            self.busy.append((time.time(), busy))
        for key, value in sample.items():
            self.peak[key] = max(self.peak.get(key, 0), value)

    def busy_between(self, start: float, stop: float) -> float | None:
        """Mean GPU utilisation (percent, NVML, the first GPU) sampled between two
        ``time.time()`` instants; None without NVML samples there."""
        values = [b for t, b in self.busy if start <= t <= stop]
        return round(sum(values) / len(values), 1) if values else None

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._record()

    def __enter__(self) -> PeakMemory:
        self.baseline = self._sample()
        self.baseline.pop("gpu_busy", None)
        self.peak = dict(self.baseline)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self._record()

    def result(self) -> dict[str, int | None]:
        """``peak_*`` and ``baseline_*`` bytes per quantity (device ones None on a CPU run)."""
        out: dict[str, int | None] = {}
        for key in ("host_rss", "device_used", "pool_used", "pool_total"):
            out[f"peak_{key}_bytes"] = self.peak.get(key)
            out[f"baseline_{key}_bytes"] = self.baseline.get(key)
        out["mean_gpu_busy_percent"] = self.busy_between(-math.inf, math.inf)
        return out
