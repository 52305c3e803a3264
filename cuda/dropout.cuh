/* dropout.cuh: the kernel of dropout of rows, forward and backward (csrc/cpu/dropout.c
 * is the reference; dropout.cu launches it).
 *
 * The masks are engine/dropout.h's: a pure function of (site key, sample, position,
 * channel), so this kernel draws the CPU's bits in any order. One thread owns a group of
 * four channels of one row, the four words of one Philox call, as the CPU's loop does;
 * the arithmetic is the CPU's (x * factor, then + resid, each rounded: -fmad=false), so
 * the results are its bits. Where C is a multiple of 4 and the rows are aligned (V = 4)
 * a thread moves its four elements in one access (a warp 256 contiguous bytes of
 * 16-bit rows, not four strided passes), else element by element (V = 1).
 *
 * Kernels only: the includer provides ldf(), stf<T>() and the 16-bit storage types
 * (elem.cuh on the GPU, tests/cuda_emu's emulator on the CPU). */
#ifndef PXT_CUDA_DROPOUT_CUH
#define PXT_CUDA_DROPOUT_CUH

#include "engine/dropout.h"
#include "vec.cuh"

/* dst, src, resid (N, C): dst = resid + src * mask (resid NULL: src * mask). The forward
 * is dst = src = x; the backward dst = dx, src = dy, no resid (dx may be dy: each element
 * is read, then written, by one thread). One thread per (row, group of 4 channels):
 * groups = ceil(C / 4) a row. V = 4 needs C % 4 == 0 and dst, src, resid aligned to 4
 * elements. */
template <typename T, int V>
__global__ static void pxt_dropout_rows_kernel(T *dst, const T *src, const T *resid, int N, int C,
                                               int groups, pxt_dropout site) {
    static_assert(V == 1 || V == 4, "a group's four channels at once, or one by one");
    const pxt_dropout d = pxt_dropout_resolve(site); /* a live key read here */
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)N * groups) {
        return;
    }
    const int r = (int)(i / groups), c0 = (int)(i % groups) * 4;
    uint32_t w[4];
    pxt_dropout_row_words(&d, r, c0, w);
    const size_t e0 = (size_t)r * C + c0;
    if constexpr (V == 4) {
        float x[4], a[4];
        pxt_vload<T, 4>(x, src + e0);
        if (resid) {
            pxt_vload<T, 4>(a, resid + e0);
        }
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const float v = x[k] * pxt_dropout_factor(&d, w[k]);
            x[k] = resid ? a[k] + v : v;
        }
        pxt_vstore<T, 4>(dst + e0, x);
    } else {
        const int n = C - c0 < 4 ? C - c0 : 4;
        for (int k = 0; k < n; k++) {
            const size_t e = e0 + k;
            const float v = ldf(src[e]) * pxt_dropout_factor(&d, w[k]);
            dst[e] = stf<T>(resid ? ldf(resid[e]) + v : v);
        }
    }
}

#endif /* PXT_CUDA_DROPOUT_CUH */
