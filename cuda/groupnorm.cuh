/* groupnorm.cuh: the kernels of GroupNorm's forward and of its backward's dinp
 * (csrc/cpu/groupnorm.c is the reference; dweight and dbias are colsum.cuh's
 * two-stage column sums, pxt_colsum_gn).
 *
 * inp (B, S, C) holds channels contiguously, so group g of sample b is S rows
 * of cg = C / G contiguous channels, C apart. One block per (sample, group):
 * its threads take the group's S x cg / V vectors of V channels in turn
 * (consecutive threads on consecutive vectors of a row, then the next rows:
 * coalesced), sum in double, and add the threads' sums in a fixed tree
 * (pxt_block_sumd). A group of XTTS v2 (517 frames x 32 channels) is 33 KiB in
 * bf16, so its second and third reads come from L2.
 *
 * Kernels only: the includer provides ldf(), stf<T>() and the 16-bit storage
 * types (elem.cuh on the GPU, tests/cuda_emu's emulator on the CPU). */
#ifndef PXT_CUDA_GROUPNORM_CUH
#define PXT_CUDA_GROUPNORM_CUH

#include "layernorm.cuh" /* pxt_norm_dinp_sums/_apply */
#include "vec.cuh"

#define PXT_GN_THREADS 256 /* threads per (sample, group) block */

/* Calls f(k, j) for this thread's vectors of a group of S rows x cg channels
 * (rows C apart): k the vector's offset from the group's first element, j its
 * first channel within the group. Vectors are numbered row by row, thread i
 * taking i, i + THREADS, ...; (row, vector) advance by the stride's quotient
 * and remainder, without a division per vector. */
template <int V, typename F>
__device__ static inline void pxt_gn_each(int S, int C, int cg, F &&f) {
    const int nv = cg / V; /* vectors per row */
    const int dt = PXT_GN_THREADS / nv, dj = PXT_GN_THREADS % nv;
    int t = (int)threadIdx.x / nv, j = (int)threadIdx.x % nv;
    while (t < S) {
        f((size_t)t * C + (size_t)j * V, j * V);
        t += dt;
        j += dj;
        if (j >= nv) {
            j -= nv;
            t++;
        }
    }
}

/* out (B, S, C) = (inp - mean) * rstd * weight + bias per (sample, group);
 * mean, rstd (B, G) fp32 from double sums (the variance around the rounded
 * mean: two passes, no cancellation). Grid B x G, PXT_GN_THREADS threads. */
template <typename T, int V>
__global__ static void __launch_bounds__(PXT_GN_THREADS)
    pxt_gn_forward_kernel(T *out, float *mean, float *rstd, const T *inp, const T *weight,
                          const T *bias, int S, int C, int G, float eps) {
    const int bg = blockIdx.x, cg = C / G, c0 = (bg % G) * cg;
    const size_t base = (size_t)(bg / G) * S * C + (size_t)c0;
    const T *x = inp + base; /* (S, cg) C apart */
    T *o = out + base;
    const T *w = weight + c0, *b = bias + c0; /* (cg) */
    const double M = (double)S * cg;
    double s[1] = {0.0};
    pxt_gn_each<V>(S, C, cg, [&](size_t k, int) {
        float v[V];
        pxt_vload<T, V>(v, x + k);
        for (int q = 0; q < V; q++) {
            s[0] += v[q];
        }
    });
    pxt_block_sumd<PXT_GN_THREADS>(s);
    const float m = (float)(s[0] / M);
    double var[1] = {0.0};
    pxt_gn_each<V>(S, C, cg, [&](size_t k, int) {
        float v[V];
        pxt_vload<T, V>(v, x + k);
        for (int q = 0; q < V; q++) {
            double d = (double)v[q] - m;
            var[0] += d * d;
        }
    });
    pxt_block_sumd<PXT_GN_THREADS>(var);
    const float r = (float)(1.0 / sqrt(var[0] / M + eps));
    pxt_gn_each<V>(S, C, cg, [&](size_t k, int j) {
        float v[V], wv[V], bv[V];
        pxt_vload<T, V>(v, x + k);
        pxt_vload<T, V>(wv, w + j);
        pxt_vload<T, V>(bv, b + j);
        for (int q = 0; q < V; q++) {
            float n = (v[q] - m) * r;
            v[q] = n * wv[q] + bv[q];
        }
        pxt_vstore<T, V>(o + k, v);
    });
    if (threadIdx.x == 0) {
        mean[bg] = m;
        rstd[bg] = r;
    }
}

/* dinp (B, S, C) += rstd * (g - mean(g) - n * mean(g * n)) per (sample, group),
 * with n = (inp - mean) * rstd and g = weight * dout; the two means from
 * double sums. Grid B x G, PXT_GN_THREADS threads. */
template <typename T, int V>
__global__ static void __launch_bounds__(PXT_GN_THREADS)
    pxt_gn_dinp_kernel(T *dinp, const T *dout, const T *inp, const T *weight, const float *mean,
                       const float *rstd, int S, int C, int G) {
    const int bg = blockIdx.x, cg = C / G, c0 = (bg % G) * cg;
    const size_t base = (size_t)(bg / G) * S * C + (size_t)c0;
    const T *x = inp + base, *dy = dout + base; /* (S, cg) C apart */
    T *dx = dinp + base;
    const T *w = weight + c0; /* (cg) */
    const float m = mean[bg], r = rstd[bg];
    const double M = (double)S * cg;
    double s[2] = {0.0, 0.0}; /* sum g, sum g * n */
    pxt_gn_each<V>(S, C, cg, [&](size_t k, int j) {
        pxt_norm_dinp_sums<T, V>(x + k, dy + k, w + j, m, r, s[0], s[1]);
    });
    pxt_block_sumd<PXT_GN_THREADS>(s);
    const float mg = (float)(s[0] / M), mgn = (float)(s[1] / M);
    pxt_gn_each<V>(S, C, cg, [&](size_t k, int j) {
        pxt_norm_dinp_apply<T, V>(dx + k, x + k, dy + k, w + j, m, r, mg, mgn);
    });
}

#endif /* PXT_CUDA_GROUPNORM_CUH */
