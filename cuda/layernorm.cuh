/* layernorm.cuh: LayerNorm's forward and its backward's dinp (csrc/cpu/layernorm.c
 * is the reference; dweight and dbias are colsum.cuh's two-stage column sums).
 *
 *   out = (x - mean) * rstd * weight + bias,  mean, rstd (float) from double sums
 *   dinp += rstd * (g - mean(g) - n * mean(g * n)),  n = (x - mean) * rstd, g = weight * dout
 *
 * A warp per row: lanes take the row's vectors of V elements in turn (16 bytes
 * per access for 16-bit rows of 1024), sum in double, and add in a fixed
 * butterfly; the later passes read the row again (from L1/L2) and write.
 *
 * Kernels only: the includer provides ldf(), stf<T>() and the 16-bit storage
 * types (elem.cuh on the GPU, tests/cuda_emu's emulator on the CPU). */
#ifndef PXT_CUDA_LAYERNORM_CUH
#define PXT_CUDA_LAYERNORM_CUH

#include "vec.cuh"

#define PXT_LN_WARPS 8 /* rows per block of the row kernels (layernorm.cu's forward too) */

/* The normalisation gradient of V elements, shared with GroupNorm (a group is its row):
 * n = (x - m) * r and g = w * dy; the first pass adds sum g and sum g n (double), the
 * second adds r * (g - mg - n * mgn) into dx, mg and mgn the two sums' means. Both
 * passes recompute n and g from x, dy and w (pxt_norm_dinp_terms) rather than keep them. */
template <typename T, int V>
__device__ static inline void pxt_norm_dinp_terms(const T *x, const T *dy, const T *w, float m,
                                                  float r, float n[V], float g[V]) {
    float v[V], d[V], wv[V];
    pxt_vload<T, V>(v, x);
    pxt_vload<T, V>(d, dy);
    pxt_vload<T, V>(wv, w);
    for (int q = 0; q < V; q++) {
        n[q] = (v[q] - m) * r;
        g[q] = wv[q] * d[q];
    }
}

template <typename T, int V>
__device__ static inline void pxt_norm_dinp_sums(const T *x, const T *dy, const T *w, float m,
                                                 float r, double &sg, double &sgn) {
    float n[V], g[V];
    pxt_norm_dinp_terms<T, V>(x, dy, w, m, r, n, g);
    for (int q = 0; q < V; q++) {
        sg += g[q];
        sgn += (double)g[q] * n[q];
    }
}

template <typename T, int V>
__device__ static inline void pxt_norm_dinp_apply(T *dx, const T *x, const T *dy, const T *w,
                                                  float m, float r, float mg, float mgn) {
    float n[V], g[V], a[V];
    pxt_norm_dinp_terms<T, V>(x, dy, w, m, r, n, g);
    pxt_vload<T, V>(a, dx);
    for (int q = 0; q < V; q++) {
        a[q] = a[q] + (g[q] - mg - n[q] * mgn) * r;
    }
    pxt_vstore<T, V>(dx, a);
}

/* out, inp (N, C); weight, bias (C); mean, rstd (N). Grid ceil(N / WARPS), 32 x WARPS.
 * The CPU's expressions; its sums add in order, these in a tree, so mean and rstd may be
 * an ulp from the CPU's (the double sums differ by ~1e-16 relative). */
template <typename T, int V>
__global__ static void __launch_bounds__(32 * PXT_LN_WARPS)
    pxt_ln_forward_kernel(T *out, float *mean, float *rstd, const T *inp, const T *weight,
                          const T *bias, int N, int C, float eps) {
    const int row = blockIdx.x * PXT_LN_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) {
        return; /* the whole warp */
    }
    const T *x = inp + (size_t)row * C; /* (C) */
    T *o = out + (size_t)row * C;       /* (C) */
    double s = 0.0;
    for (int j = lane * V; j < C; j += 32 * V) {
        float v[V];
        pxt_vload<T, V>(v, x + j);
        for (int q = 0; q < V; q++) {
            s += v[q];
        }
    }
    const float m = (float)(pxt_warp_sumd(s) / C);
    double var = 0.0; /* around the rounded mean: two passes, no cancellation */
    for (int j = lane * V; j < C; j += 32 * V) {
        float v[V];
        pxt_vload<T, V>(v, x + j);
        for (int q = 0; q < V; q++) {
            const double d = (double)v[q] - m;
            var += d * d;
        }
    }
    const float r = (float)(1.0 / sqrt(pxt_warp_sumd(var) / C + eps));
    for (int j = lane * V; j < C; j += 32 * V) {
        float v[V], wv[V], bv[V];
        pxt_vload<T, V>(v, x + j);
        pxt_vload<T, V>(wv, weight + j);
        pxt_vload<T, V>(bv, bias + j);
        for (int q = 0; q < V; q++) {
            const float n = (v[q] - m) * r;
            v[q] = n * wv[q] + bv[q];
        }
        pxt_vstore<T, V>(o + j, v);
    }
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
}

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
        pxt_norm_dinp_sums<T, V>(x + j, dy + j, weight + j, m, r, sg, sgn);
    }
    const float mg = (float)(pxt_warp_sumd(sg) / C), mgn = (float)(pxt_warp_sumd(sgn) / C);
    for (int j = lane * V; j < C; j += 32 * V) {
        pxt_norm_dinp_apply<T, V>(dx + j, x + j, dy + j, weight + j, m, r, mg, mgn);
    }
}

#endif /* PXT_CUDA_LAYERNORM_CUH */
