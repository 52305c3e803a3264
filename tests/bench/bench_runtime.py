"""Runtime-core benchmark: host round trips and the cost of a cached allocation.

    python tests/bench/bench_runtime.py [--device cpu|cuda] [--json out.json]

Round trip = pyxtts.tensor(a) followed by .numpy(): two full copies of the data.
It is set beside numpy.copy (one copy) and beside torch.tensor(a).numpy() (the same
two copies in PyTorch), in one run on one machine. Allocation cost is timed in C
(pyxtts._C._bench_alloc) against malloc and posix_memalign, and in Python against
numpy.empty and torch.empty (object creation included).
"""
from __future__ import annotations

import argparse
import json
import platform
import resource
import time
from typing import Callable

import numpy as np

import pyxtts
from pyxtts import _C

try:
    import torch
except ImportError:  # the comparison columns are left out
    torch = None


def best_of(fn: Callable[[], object], repeats: int) -> float:
    """Smallest wall time of `repeats` calls (seconds): the least disturbed run."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def round_trips(device: str) -> list[dict]:
    rows = []
    rng = np.random.default_rng()
    for size in (4 << 10, 1 << 20, 64 << 20, 256 << 20):
        a = rng.standard_normal(size // 4, dtype=np.float32)
        repeats = 200 if size <= 1 << 20 else 5
        t_np = best_of(lambda: a.copy(), repeats)
        t_px = best_of(lambda: pyxtts.tensor(a, device=device).numpy(), repeats)
        assert np.array_equal(pyxtts.tensor(a, device=device).numpy(), a)
        row = {"bytes": size, "numpy_copy_s": t_np, "pyxtts_round_trip_s": t_px,
               "pyxtts_GBps": 2 * size / t_px / 1e9, "numpy_copy_GBps": size / t_np / 1e9,
               "ratio_vs_numpy_copy": t_px / t_np}
        if torch is not None:
            tdev = "cuda" if device.startswith("cuda") else "cpu"
            t_th = best_of(lambda: torch.tensor(a, device=tdev).cpu().numpy(), repeats)
            row.update(torch_round_trip_s=t_th, ratio_vs_torch=t_px / t_th)
        rows.append(row)
    return rows


def create_drop(make: Callable[[], object], n: int = 1000) -> None:
    """n objects created and dropped one after another (one alive at a time)."""
    for _ in range(n):
        make()


def allocations(device: str) -> list[dict]:
    rows = []
    for size in (256, 4 << 10, 1 << 20, 16 << 20):
        c = _C._bench_alloc(size, 100_000, device)
        t_px = best_of(lambda: create_drop(lambda: pyxtts.empty(size, dtype=pyxtts.uint8, device=device)), 20) / 1000
        t_np = best_of(lambda: create_drop(lambda: np.empty(size, dtype=np.uint8)), 20) / 1000
        row = {"bytes": size, "c_cached_ns": c["cached_ns"], "c_malloc_ns": c["malloc_ns"],
               "c_posix_memalign_ns": c["posix_memalign_ns"], "py_pyxtts_empty_ns": t_px * 1e9,
               "py_numpy_empty_ns": t_np * 1e9}
        if torch is not None:
            tdev = "cuda" if device.startswith("cuda") else "cpu"
            t_th = best_of(lambda: create_drop(lambda: torch.empty(size, dtype=torch.uint8, device=tdev)), 20) / 1000
            row["py_torch_empty_ns"] = t_th * 1e9
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", help="write the raw figures here")
    args = ap.parse_args()
    pyxtts.reset_peak_memory_stats(args.device)
    rt = round_trips(args.device)
    al = allocations(args.device)
    stats = pyxtts.memory_stats(args.device)
    info = {"machine": platform.node(), "cpu": pyxtts.device_info("cpu")["name"],
            "device": pyxtts.device_info(args.device)["name"], "python": platform.python_version(),
            "numpy": np.__version__, "torch": torch.__version__ if torch else None,
            "pyxtts": pyxtts.build_info(), "date": time.strftime("%Y-%m-%d"),
            "peak_allocated_bytes": stats["peak_allocated_bytes"],
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    print(f"# pyxtts runtime benchmark on {info['cpu']} ({args.device}), {info['date']}")
    print("\nhost round trip (tensor(a).numpy(): 2 copies) vs numpy.copy (1 copy) and torch (2 copies)")
    print(f"{'size':>10} {'numpy.copy':>12} {'pyxtts rt':>12} {'GB/s moved':>11} {'vs copy':>8} {'vs torch':>9}")
    for r in rt:
        vt = f"{r['ratio_vs_torch']:.2f}x" if "ratio_vs_torch" in r else "-"
        print(f"{r['bytes']:>10} {r['numpy_copy_s']*1e6:>10.1f}us {r['pyxtts_round_trip_s']*1e6:>10.1f}us "
              f"{r['pyxtts_GBps']:>11.2f} {r['ratio_vs_numpy_copy']:>7.2f}x {vt:>9}")
    print("\nallocate + free, ns per pair: C level (cached vs libc), Python level (object included)")
    print(f"{'size':>10} {'cached':>8} {'malloc':>8} {'memalign':>9} | {'pyxtts.empty':>12} {'np.empty':>9} {'torch.empty':>11}")
    for r in al:
        th = f"{r['py_torch_empty_ns']:.0f}" if "py_torch_empty_ns" in r else "-"
        print(f"{r['bytes']:>10} {r['c_cached_ns']:>8.1f} {r['c_malloc_ns']:>8.1f} {r['c_posix_memalign_ns']:>9.1f} | "
              f"{r['py_pyxtts_empty_ns']:>12.0f} {r['py_numpy_empty_ns']:>9.0f} {th:>11}")
    print(f"\npeak allocated {info['peak_allocated_bytes']} B, peak RSS {info['peak_rss_bytes']} B")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"info": info, "round_trip": rt, "alloc": al}, f, indent=2)


if __name__ == "__main__":
    main()
