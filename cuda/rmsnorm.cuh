/* rmsnorm.cuh: the kernels of the perceiver's RMS norm forward and of its
 * backward's dinp (csrc/cpu/rmsnorm.c is the reference; dgamma is colsum.cuh's
 * two-stage column sum, pxt_colsum_rms).
 *
 *   out = x / max(|x|, eps) * scale * gamma,  norm = |x| (fp32, from a double sum)
 *
 * A warp per row (XTTS v2: 8 x 32 rows of 1024): lanes take the row's vectors
 * of V elements in turn, sum in double, and add in a fixed butterfly.
 *
 * Kernels only: the includer provides ldf(), stf<T>() and the 16-bit storage
 * types (elem.cuh on the GPU, tests/cuda_emu's emulator on the CPU). */
#ifndef PXT_CUDA_RMSNORM_CUH
#define PXT_CUDA_RMSNORM_CUH

#include "vec.cuh"

#define PXT_RMS_WARPS 4 /* rows per block */

/* out, inp (N, C); gamma (C); norm (N). Grid ceil(N / WARPS), 32 x WARPS threads. */
template <typename T, int V>
__global__ static void __launch_bounds__(32 * PXT_RMS_WARPS)
    pxt_rms_forward_kernel(T *out, float *norm, const T *inp, const T *gamma, int N, int C,
                           float scale, float eps) {
    const int row = blockIdx.x * PXT_RMS_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) {
        return; /* the whole warp */
    }
    const T *x = inp + (size_t)row * C; /* (C) */
    T *o = out + (size_t)row * C;
    double s = 0.0;
    for (int j = lane * V; j < C; j += 32 * V) {
        float v[V];
        pxt_vload<T, V>(v, x + j);
        for (int q = 0; q < V; q++) {
            double d = v[q];
            s += d * d;
        }
    }
    const float n = (float)sqrt(pxt_warp_sumd(s));
    const float inv = 1.0f / (n > eps ? n : eps);
    for (int j = lane * V; j < C; j += 32 * V) {
        float v[V], g[V];
        pxt_vload<T, V>(v, x + j);
        pxt_vload<T, V>(g, gamma + j);
        for (int q = 0; q < V; q++) {
            v[q] = v[q] * inv * scale * g[q];
        }
        pxt_vstore<T, V>(o + j, v);
    }
    if (lane == 0) {
        norm[row] = n;
    }
}

/* dinp (N, C) +=: with g = dout * gamma * scale, (g - xh (xh . g)) / n where
 * n = norm > eps (xh = x / n, the dot in double), else g / eps. Grid as the
 * forward's. */
template <typename T, int V>
__global__ static void __launch_bounds__(32 * PXT_RMS_WARPS)
    pxt_rms_dinp_kernel(T *dinp, const T *dout, const T *inp, const T *gamma, const float *norm,
                        int N, int C, float scale, float eps) {
    const int row = blockIdx.x * PXT_RMS_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) {
        return;
    }
    const size_t base = (size_t)row * C;
    const T *x = inp + base, *dy = dout + base; /* (C) */
    T *dx = dinp + base;
    const float n = norm[row];
    if (n > eps) { /* warp-uniform */
        const float inv = 1.0f / n;
        double dot = 0.0; /* xh . g */
        for (int j = lane * V; j < C; j += 32 * V) {
            float v[V], d[V], gm[V];
            pxt_vload<T, V>(v, x + j);
            pxt_vload<T, V>(d, dy + j);
            pxt_vload<T, V>(gm, gamma + j);
            for (int q = 0; q < V; q++) {
                float g = d[q] * gm[q] * scale;
                dot += (double)(v[q] * inv) * g;
            }
        }
        const float fd = (float)pxt_warp_sumd(dot);
        for (int j = lane * V; j < C; j += 32 * V) {
            float v[V], d[V], gm[V], a[V];
            pxt_vload<T, V>(v, x + j);
            pxt_vload<T, V>(d, dy + j);
            pxt_vload<T, V>(gm, gamma + j);
            pxt_vload<T, V>(a, dx + j);
            for (int q = 0; q < V; q++) {
                float g = d[q] * gm[q] * scale;
                float xh = v[q] * inv;
                a[q] = a[q] + (g - xh * fd) * inv;
            }
            pxt_vstore<T, V>(dx + j, a);
        }
    } else {
        for (int j = lane * V; j < C; j += 32 * V) {
            float d[V], gm[V], a[V];
            pxt_vload<T, V>(d, dy + j);
            pxt_vload<T, V>(gm, gamma + j);
            pxt_vload<T, V>(a, dx + j);
            for (int q = 0; q < V; q++) {
                float g = d[q] * gm[q] * scale;
                a[q] = a[q] + g / eps;
            }
            pxt_vstore<T, V>(dx + j, a);
        }
    }
}

#endif /* PXT_CUDA_RMSNORM_CUH */
