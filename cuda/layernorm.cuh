/* layernorm.cuh: the kernel of LayerNorm's backward's dinp (csrc/cpu/layernorm.c
 * is the reference; dweight and dbias are colsum.cuh's two-stage column sums).
 *
 *   dinp += rstd * (g - mean(g) - n * mean(g * n)),  n = (x - mean) * rstd, g = weight * dout
 *
 * A warp per row: lanes take the row's vectors of V elements in turn (16 bytes
 * per access for 16-bit rows of 1024), sum in double, and add in a fixed
 * butterfly; the second pass reads the row again (from L1/L2) and writes.
 *
 * Kernels only: the includer provides ldf(), stf<T>() and the 16-bit storage
 * types (elem.cuh on the GPU, tests/cuda_emu's emulator on the CPU). */
#ifndef PXT_CUDA_LAYERNORM_CUH
#define PXT_CUDA_LAYERNORM_CUH

#include "vec.cuh"

#define PXT_LN_WARPS 8 /* rows per block of the row kernels (layernorm.cu's forward too) */

/* dinp, dout, inp (N, C); weight (C); mean, rstd (N). Grid ceil(N / WARPS), 32 x WARPS. */
template <typename T, int V>
__global__ static void __launch_bounds__(32 * PXT_LN_WARPS)
    pxt_ln_dinp_kernel(T *dinp, const T *dout, const T *inp, const T *weight, const float *mean,
                       const float *rstd, int N, int C) {
    const int row = blockIdx.x * PXT_LN_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) {
        return; /* the whole warp */
    }
    const size_t base = (size_t)row * C;
    const T *x = inp + base, *dy = dout + base; /* (C) */
    T *dx = dinp + base;
    const float m = mean[row], r = rstd[row];
    double sg = 0.0, sgn = 0.0;
    for (int j = lane * V; j < C; j += 32 * V) {
        float v[V], d[V], w[V];
        pxt_vload<T, V>(v, x + j);
        pxt_vload<T, V>(d, dy + j);
        pxt_vload<T, V>(w, weight + j);
        for (int q = 0; q < V; q++) {
            float n = (v[q] - m) * r;
            float g = w[q] * d[q];
            sg += g;
            sgn += (double)g * n;
        }
    }
    const float mg = (float)(pxt_warp_sumd(sg) / C), mgn = (float)(pxt_warp_sumd(sgn) / C);
    for (int j = lane * V; j < C; j += 32 * V) {
        float v[V], d[V], w[V], a[V];
        pxt_vload<T, V>(v, x + j);
        pxt_vload<T, V>(d, dy + j);
        pxt_vload<T, V>(w, weight + j);
        pxt_vload<T, V>(a, dx + j);
        for (int q = 0; q < V; q++) {
            float n = (v[q] - m) * r;
            float g = w[q] * d[q];
            a[q] = a[q] + (g - mg - n * mgn) * r;
        }
        pxt_vstore<T, V>(dx + j, a);
    }
}

#endif /* PXT_CUDA_LAYERNORM_CUH */
