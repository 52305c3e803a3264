"""CPU attention benchmark: pyxtts exact tiled attention against torch's
scaled_dot_product_attention, forward + backward, float32, causal.

    python tests/bench/bench_attention.py [--T 430 1024] [--B 8] [--H 4] [--D 64]
                                          [--repeats 7] [--json out.json]

Both run with the same number of threads (os.cpu_count(): torch.set_num_threads
and OpenMP's default), each in its own subprocess, so neither library's idle
OpenMP threads spin against the other's. Times are the best (and the median) of
`repeats` forward+backward steps after a cold one. Memory, over the cold step
(after a tiny warm-up that starts the thread pools): pyxtts's allocator peak
(pyxtts.max_memory_allocated minus the inputs), and for both the growth of the
process's peak RSS (VmHWM, reset through /proc/self/clear_refs), which counts
what each library allocates beyond its inputs: outputs, saved tensors, workspace.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

# a source checkout: pyxtts is the package two levels up (built in place)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

def rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def warm_up(lib: str, threads: int) -> None:
    import numpy as np

    x = np.ones((1, 2, 16, 8), np.float32)
    if lib == "torch":
        import torch

        t = torch.tensor(x, requires_grad=True)
        torch.nn.functional.scaled_dot_product_attention(t, t, t, is_causal=True).sum().backward()
    else:
        import pyxtts

        out, lse = pyxtts.attention_forward(x, x, x)
        pyxtts.attention_backward(x, x, x, x, out, lse)


def worker(lib: str, B: int, H: int, T: int, D: int, repeats: int) -> dict:
    import numpy as np

    threads = os.cpu_count()
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((B, H, T, D)).astype(np.float32) for _ in range(4)]
    if lib == "torch":
        import torch

        torch.set_num_threads(threads)
        q, k, v = (torch.tensor(a, requires_grad=True) for a in arrays[:3])
        dout = torch.tensor(arrays[3])

        def step():
            t0 = time.perf_counter()
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            t1 = time.perf_counter()
            out.backward(dout)
            t2 = time.perf_counter()
            for x in (q, k, v):
                x.grad = None
            return t1 - t0, t2 - t1
    else:
        import pyxtts

        q, k, v, dout = (pyxtts.tensor(a) for a in arrays)

        def step():
            t0 = time.perf_counter()
            out, lse = pyxtts.attention_forward(q, k, v, causal=True)
            t1 = time.perf_counter()
            pyxtts.attention_backward(dout, q, k, v, out, lse, causal=True)
            t2 = time.perf_counter()
            return t1 - t0, t2 - t1
    del arrays
    warm_up(lib, threads)  # thread pools and code pages, on a tiny problem
    rss_before = rss_kib("VmRSS")
    have_hwm = reset_peak_rss()
    alloc_peak = None
    if lib == "pyxtts":
        base = pyxtts.memory_allocated("cpu")
        pyxtts.reset_peak_memory_stats("cpu")
    first = step()  # the cold step: what it allocates shows in the peak RSS
    if lib == "pyxtts":
        alloc_peak = pyxtts.max_memory_allocated("cpu") - base
    rss_peak = (rss_kib("VmHWM") - rss_before) * 1024 if have_hwm else None
    times = [step() for _ in range(repeats)]
    del first
    total = [f + b for f, b in times]
    return {"lib": lib, "B": B, "H": H, "T": T, "D": D, "threads": threads,
            "best_s": min(total), "median_s": statistics.median(total),
            "fwd_best_s": min(f for f, _ in times), "bwd_best_s": min(b for _, b in times),
            "alloc_peak_bytes": alloc_peak, "rss_peak_increase_bytes": rss_peak}


def run_worker(lib, args, T) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", lib, "--B", str(args.B),
           "--H", str(args.H), "--D", str(args.D), "--T", str(T), "--repeats", str(args.repeats)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        x for x in (ROOT, os.environ.get("PYTHONPATH", "")) if x))
    res = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
    return json.loads(res.stdout.strip().splitlines()[-1])


def mib(x) -> str:
    return "-" if x is None else f"{x / 2**20:.1f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--T", type=int, nargs="+", default=[430, 1024])
    p.add_argument("--B", type=int, default=8)
    p.add_argument("--H", type=int, default=4)
    p.add_argument("--D", type=int, default=64)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--json", help="also write the rows here")
    p.add_argument("--worker", choices=["pyxtts", "torch"], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.B, args.H, args.T[0], args.D, args.repeats)))
        return

    import platform

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    print("command: " + " ".join(["python", os.path.relpath(os.path.abspath(__file__))]
                                 + sys.argv[1:]))
    print(f"cpu: {cpu}, {os.cpu_count()} threads for both "
          f"libraries; float32, causal, B={args.B} H={args.H} D={args.D}; best of {args.repeats}")
    rows = []
    header = (f"{'T':>6} {'lib':>7} {'fwd+bwd ms':>11} {'median ms':>10} {'fwd ms':>8} "
              f"{'bwd ms':>8} {'alloc peak MiB':>15} {'RSS peak +MiB':>14}")
    print(header)
    print("-" * len(header))
    for T in args.T:
        res = {lib: run_worker(lib, args, T) for lib in ("pyxtts", "torch")}
        rows += res.values()
        for lib, r in res.items():
            print(f"{T:>6} {lib:>7} {r['best_s'] * 1e3:>11.1f} {r['median_s'] * 1e3:>10.1f} "
                  f"{r['fwd_best_s'] * 1e3:>8.1f} {r['bwd_best_s'] * 1e3:>8.1f} "
                  f"{mib(r['alloc_peak_bytes']):>15} {mib(r['rss_peak_increase_bytes']):>14}")
        px, th = res["pyxtts"], res["torch"]
        rss = ("-" if not (px["rss_peak_increase_bytes"] and th["rss_peak_increase_bytes"])
               else f"{px['rss_peak_increase_bytes'] / th['rss_peak_increase_bytes']:.2f}")
        keys = ("best_s", "median_s", "fwd_best_s", "bwd_best_s")
        ratio = {key: px[key] / th[key] for key in keys}
        print(f"{T:>6} {'ratio':>7} {ratio['best_s']:>11.2f} {ratio['median_s']:>10.2f} "
              f"{ratio['fwd_best_s']:>8.2f} {ratio['bwd_best_s']:>8.2f} {'':>15} {rss:>14}"
              "   (pyxtts / torch)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
