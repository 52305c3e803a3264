"""GPUMonitor: a background thread sampling memory while training runs."""
from __future__ import annotations

import os
import threading
import time
from typing import Any

from pyxtts import _C
from pyxtts._args import real
from pyxtts.memory import format_bytes


def _rss_bytes() -> int:
    """Resident set size of this process (Linux /proc; 0 where unavailable)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGESIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _peak_rss_bytes() -> int:
    """Peak resident set size of this process so far (getrusage; 0 where unavailable)."""
    try:
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # KiB on Linux
    except (ImportError, OSError):
        return 0


class _NVML:
    """Device utilisation and memory from NVML (the optional nvidia-ml-py package)."""

    def __init__(self) -> None:
        self.handles: dict[str, Any] = {}
        try:
            import pynvml  # type: ignore[import-not-found]

            pynvml.nvmlInit()
            self.nvml = pynvml
            for i in range(pynvml.nvmlDeviceGetCount()):
                self.handles[f"cuda:{i}"] = pynvml.nvmlDeviceGetHandleByIndex(i)
        except Exception:  # noqa: BLE001 - no package, no driver, no GPU: no NVML fields
            self.handles = {}

    def sample(self, device: str) -> dict[str, int]:
        h = self.handles.get(device)
        if h is None:
            return {}
        util = self.nvml.nvmlDeviceGetUtilizationRates(h)
        mem = self.nvml.nvmlDeviceGetMemoryInfo(h)
        return {"gpu_util_percent": int(util.gpu), "nvml_used_bytes": int(mem.used),
                "nvml_total_bytes": int(mem.total)}


MIN_INTERVAL_S = 0.01


class GPUMonitor:
    """Samples, every `interval` seconds on a daemon thread: per device the allocator's
    allocated / reserved / peak bytes (and, on NVIDIA with nvidia-ml-py, utilisation and
    the driver's used memory), plus the process RSS. Also a context manager.

        mon = GPUMonitor(interval=0.5); mon.start_monitoring()
        ... train ...
        mon.stop_monitoring(); print(mon.get_summary_report()); mon.plot("memory.png")
    """

    def __init__(self, interval: float = 1.0, devices: str | list[str] | None = None) -> None:
        # seconds; a sample reads every device's statistics, so a shorter interval would
        # be a busy loop whose samples outgrow memory
        self.interval = real("interval", interval, minimum=MIN_INTERVAL_S)
        if devices is None:
            devices = ["cpu"] + [f"cuda:{i}" for i in range(_C.device_count())]
        elif isinstance(devices, str):  # one device ("cpu" was once walked letter by letter)
            devices = [devices]
        elif not isinstance(devices, (list, tuple)) or not all(isinstance(d, str) for d in devices):
            raise TypeError(f"devices: expected None, a device name or a list of them, got {devices!r}")
        self.devices = list(devices)
        for d in self.devices:
            _C.memory_stats(d)  # a bad device name fails here, not in the thread
        self.samples: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml = _NVML()
        self._t0 = 0.0

    def sample(self) -> dict[str, Any]:
        """One sample now (also what the thread records)."""
        s: dict[str, Any] = {"time_s": time.monotonic() - self._t0, "rss_bytes": _rss_bytes()}
        for d in self.devices:
            st = _C.memory_stats(d)
            s[d] = {"allocated_bytes": st["allocated_bytes"], "reserved_bytes": st["reserved_bytes"],
                    "peak_allocated_bytes": st["peak_allocated_bytes"], **self._nvml.sample(d)}
        return s

    def _run(self) -> None:
        while True:
            self.samples.append(self.sample())
            if self._stop.wait(self.interval):
                break

    def start_monitoring(self) -> None:
        if self._thread is not None:
            raise RuntimeError("GPUMonitor: already monitoring; call stop_monitoring() first")
        self.samples = []
        self._stop.clear()
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="pyxtts-gpu-monitor", daemon=True)
        self._thread.start()

    def stop_monitoring(self) -> None:
        """Stops the thread (after one last sample) and waits for it."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        self.samples.append(self.sample())

    def __enter__(self) -> "GPUMonitor":
        self.start_monitoring()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_monitoring()

    def get_summary_report(self) -> str:
        if not self.samples:
            return "GPUMonitor: no samples (start_monitoring() was not called)"
        span = self.samples[-1]["time_s"] - self.samples[0]["time_s"]
        lines = [f"GPUMonitor: {len(self.samples)} samples over {span:.1f} s "
                 f"(every {self.interval:g} s)",
                 f"  process RSS: peak {format_bytes(max(s['rss_bytes'] for s in self.samples))}"]
        for d in self.devices:
            rows = [s[d] for s in self.samples]
            line = (f"  {d}: allocated peak {format_bytes(max(r['peak_allocated_bytes'] for r in rows))}, "
                    f"reserved peak {format_bytes(max(r['reserved_bytes'] for r in rows))}, "
                    f"allocated at the end {format_bytes(rows[-1]['allocated_bytes'])}")
            if "gpu_util_percent" in rows[-1]:
                util = sum(r["gpu_util_percent"] for r in rows) / len(rows)
                line += f", mean utilisation {util:.0f}%"
            lines.append(line)
        return "\n".join(lines)

    def plot(self, path: str | None = None):
        """Memory over time (matplotlib, when installed); saved to `path` if given."""
        try:
            import matplotlib

            if path is not None:
                matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError as exc:
            raise ImportError("GPUMonitor.plot needs matplotlib: pip install matplotlib") from exc
        fig, ax = plt.subplots(figsize=(8, 4))
        t = [s["time_s"] for s in self.samples]
        gib = 2**30
        ax.plot(t, [s["rss_bytes"] / gib for s in self.samples], label="process RSS")
        for d in self.devices:
            ax.plot(t, [s[d]["allocated_bytes"] / gib for s in self.samples], label=f"{d} allocated")
            ax.plot(t, [s[d]["reserved_bytes"] / gib for s in self.samples], "--", label=f"{d} reserved")
        ax.set_xlabel("seconds")
        ax.set_ylabel("GiB")
        ax.legend()
        fig.tight_layout()
        if path is not None:
            fig.savefig(path)
        return fig
