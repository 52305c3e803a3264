"""Memory helpers over the native allocator: summaries and cleanup."""
from __future__ import annotations

import gc

from pyxtts import _C

DeviceLike = str | int | None


def _devices() -> list[str]:
    # the host pool too: an offloaded optimizer's page-locked state, gone once deleted,
    # stays cached there (4.94 GiB for XTTS v2) until emptied
    return ["cpu", "host"] + [f"cuda:{i}" for i in range(_C.device_count())]


def cleanup_gpu_memory(device: DeviceLike = None) -> int:
    """Collect garbage, then return every unused cached segment to its device.

    With ``device=None`` every device is cleaned (the CPU and the host pool of the
    offloaded optimizer's state included). Returns the bytes released. Live tensors are
    never touched.
    """
    gc.collect()
    devices = _devices() if device is None else [device]
    return sum(_C.empty_cache(d) for d in devices)


def format_bytes(n: int | None) -> str:
    """1536 -> '1.50 KiB'; None (no limit) -> 'none'."""
    if n is None:
        return "none"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024.0 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024.0
    return str(n)


def memory_summary(device: DeviceLike = None) -> str:
    """A readable table of the allocator's statistics for one device."""
    s = _C.memory_stats(device)
    rows = [
        ("allocated", format_bytes(s["allocated_bytes"]), format_bytes(s["peak_allocated_bytes"])),
        ("reserved", format_bytes(s["reserved_bytes"]), format_bytes(s["peak_reserved_bytes"])),
        ("cached (free, reserved)", format_bytes(s["cached_bytes"]), ""),
        ("inactive split", format_bytes(s["inactive_split_bytes"]), ""),
        ("limit", format_bytes(s["limit_bytes"]), ""),
        ("device total", format_bytes(s["device_total_bytes"]), ""),
    ]
    counts = [
        ("allocations", s["num_allocs"]), ("frees", s["num_frees"]),
        ("active blocks", s["num_active_blocks"]), ("segments", s["num_segments"]),
        ("device allocations", s["num_raw_allocs"]), ("device frees", s["num_raw_frees"]),
        ("retries after releasing cache", s["num_alloc_retries"]), ("out-of-memory errors", s["num_ooms"]),
    ]
    width = 32
    lines = [f"pyxtts memory summary: {s['device']}", "=" * 60,
             f"{'':{width}}{'current':>14}{'peak':>14}", "-" * 60]
    lines += [f"{name:{width}}{cur:>14}{peak:>14}".rstrip() for name, cur, peak in rows]
    lines.append("-" * 60)
    lines += [f"{name:{width}}{value:>14}" for name, value in counts]
    lines.append("=" * 60)
    return "\n".join(lines)
