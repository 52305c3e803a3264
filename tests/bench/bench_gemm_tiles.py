"""How the CPU gemm's tile grid was chosen: the GEMMs of one training step, cut into tiles
by candidate grids, timed tile by tile on one core, then dealt to T threads.

    python tests/bench/bench_gemm_tiles.py [--config small|tiny] [--threads 2] [--repeats 3]

csrc/cpu/matmul.c cuts each float32 product into a grid of tiles that depends on its shape
only (so the bits never depend on the thread count); OpenBLAS repacks operands for every
tile, so more tiles cost more CPU time while fewer tiles leave threads idle. This script
calls OpenBLAS (scipy-openblas32, the library pyxtts links) directly through ctypes, one
single-threaded sgemm per tile as the engine does, for:

- "per-thread": the split the engine used before, one panel per thread along the longer
  dimension (its bits depended on the thread count);
- "MAX/EDGE": the engine's grid rule (tile_grid in matmul.c) with at most MAX tiles and
  edges of at least EDGE; the engine uses 8/64.

Each tile is timed alone (process CPU time, best of --repeats), so the figures hold on a
busy machine; the "T-thread time" deals the tiles in order to the least loaded of T
threads, as OpenMP's dynamic schedule does, and takes the longest thread. It is a model:
it leaves out the parallel region's own cost and the threads' competition for memory.
"""
from __future__ import annotations

import argparse
import ctypes
import glob
import os
import time

import numpy as np

# the engine's constants (matmul.c): TILE_ALIGN, TILE_MIN_FLOPS
ALIGN, MIN_FLOPS = 16, 1 << 22
# (tokens, d_model, text vocab, audio vocab, layers, text / audio head chunks of 256 rows):
# the configs of bench_model_cpu.py
CONFIGS = {"small": (8 * 432, 256, 6681, 1026, 4, 5, 9), "tiny": (8 * 152, 64, 256, 256, 2, 2, 3)}


def openblas():
    import scipy_openblas32

    lib = ctypes.CDLL(glob.glob(os.path.join(scipy_openblas32.get_lib_dir(), "libscipy_openblas*.so"))[0])
    lib.scipy_openblas_set_num_threads(1)
    return lib.scipy_cblas_sgemm


def step_gemms(name):
    """[(trans_a, trans_b, M, N, K, count)] of one forward + backward (block.c, model.c)."""
    N, C, V1, V2, L, c1, c2 = CONFIGS[name]
    per_block = [(0, 0, N, 3 * C, C), (0, 0, N, C, C), (0, 0, N, 4 * C, C), (0, 0, N, C, 4 * C),  # forward
                 (0, 1, N, C, 3 * C), (1, 0, C, 3 * C, N), (0, 1, N, C, C), (1, 0, C, C, N),       # backward
                 (0, 1, N, 4 * C, C), (1, 0, 4 * C, C, N), (0, 1, N, C, 4 * C), (1, 0, C, 4 * C, N)]
    heads = [(*g, c) for V, c in ((V1, c1), (V2, c2))  # logits, dX, dW per 256-row chunk
             for g in ((0, 1, 256, V, C), (0, 0, 256, C, V), (1, 0, V, C, 256))]
    return [(*g, L) for g in per_block] + heads


def tile_grid(M, N, K, most, edge):
    """matmul.c's tile_grid: (row parts, column parts)."""
    flops, m, n = 2.0 * M * N * K, 1, 1
    while m * n < most and flops / (2 * m * n) >= MIN_FLOPS:
        h, w = M // m, N // n
        can_m, can_n = h >= 2 * edge, w >= 2 * edge
        if can_m and (h >= w or not can_n):
            m *= 2
        elif can_n:
            n *= 2
        else:
            break
    return m, n


def per_thread(M, N, K, threads):
    """The engine's split before: one panel per thread along the longer dimension."""
    dim = max(M, N)
    parts = min(dim // ALIGN, threads)
    if parts <= 1 or M * N * K < (1 << 21):
        return 1, 1
    return (parts, 1) if M >= N else (1, parts)


def part_start(dim, p, parts):
    return dim if p == parts else (dim * p // parts) // ALIGN * ALIGN


def tile_times(sgemm, ta, tb, A, B, C, grid, repeats):
    """CPU seconds of each tile's sgemm, best of repeats."""
    M, N = C.shape
    K = A.shape[0] if ta else A.shape[1]
    pm, pn = grid
    vp = ctypes.c_void_p
    out = []
    for t in range(pm * pn):
        i0, i1 = part_start(M, t // pn, pm), part_start(M, t // pn + 1, pm)
        j0, j1 = part_start(N, t % pn, pn), part_start(N, t % pn + 1, pn)
        a = A.ctypes.data + 4 * (i0 if ta else i0 * K)
        b = B.ctypes.data + 4 * (j0 * K if tb else j0)
        best = float("inf")
        for _ in range(repeats):
            c0 = time.process_time()
            sgemm(101, 112 if ta else 111, 112 if tb else 111, i1 - i0, j1 - j0, K, ctypes.c_float(1.0),
                  vp(a), M if ta else K, vp(b), K if tb else N, ctypes.c_float(0.0),
                  vp(C.ctypes.data + 4 * (i0 * N + j0)), N)
            best = min(best, time.process_time() - c0)
        out.append(best)
    return out


def makespan(times, threads):
    load = [0.0] * threads
    for x in times:
        load[load.index(min(load))] += x
    return max(load)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", choices=list(CONFIGS), default="small")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    sgemm = openblas()
    schemes = {"per-thread": lambda M, N, K: per_thread(M, N, K, args.threads)}
    for most, edge in ((8, 64), (8, 128), (16, 64), (16, 128), (32, 64)):
        schemes[f"{most}/{edge}"] = lambda M, N, K, most=most, edge=edge: tile_grid(M, N, K, most, edge)
    schemes["one call"] = lambda M, N, K: (1, 1)
    rng = np.random.default_rng(0)
    totals = {s: [0.0, 0.0] for s in schemes}
    for ta, tb, M, N, K, count in step_gemms(args.config):
        A = rng.standard_normal((K, M) if ta else (M, K)).astype(np.float32)
        B = rng.standard_normal((N, K) if tb else (K, N)).astype(np.float32)
        C = np.zeros((M, N), np.float32)
        for s, grid in schemes.items():
            times = tile_times(sgemm, ta, tb, A, B, C, grid(M, N, K), args.repeats)
            totals[s][0] += count * sum(times)
            totals[s][1] += count * makespan(times, args.threads)
    base = totals["per-thread"][1]
    print(f"# GEMMs of one {args.config} step; command: python tests/bench/bench_gemm_tiles.py "
          f"--config {args.config} --threads {args.threads} --repeats {args.repeats}")
    print(f"{'grid':12} {'CPU time':>10} {f'{args.threads}-thread time':>16} {'vs per-thread':>14}")
    for s, (cpu, span) in totals.items():
        print(f"{s:12} {cpu * 1e3:>8.1f}ms {span * 1e3:>14.1f}ms {span / base:>13.3f}x")


if __name__ == "__main__":
    main()
