/* colsum.cuh: the kernels of the two-stage column sums (backend.h fixes the
 * order): stage 1, one thread per (chunk, column), sums its chunk's rows in
 * order in double; stage 2, one thread per column, adds the chunk sums in
 * chunk order and the total to the fp32 output once.
 *
 * Kernels and their row functors only: the includer provides ldf() and the
 * 16-bit storage types (elem.cuh on the GPU, the host emulator of
 * tests/cuda_emu on the CPU, which runs this very source). A functor F gives
 * NV terms of element (i, j) as doubles: F::NV sums are taken at once (NV = 2
 * for layernorm's and GroupNorm's dweight and dbias, which read the same rows).
 * Stage 1 read its rows 2 bytes a thread (16-bit rows) until it took V columns a
 * thread: on the H200 it ran at 1.6 TB/s, the profile's third largest non-GEMM cost. */
#ifndef PXT_CUDA_COLSUM_CUH
#define PXT_CUDA_COLSUM_CUH

#include "vec.cuh"

#define PXT_COLSUM_BLOCK 256 /* columns per block of both stages */
#define PXT_COLSUM_AHEAD 32  /* stage 2: loads a thread has in flight before their adds */

/* A functor F gives the terms of V consecutive columns j .. j+V-1 of row i at once,
 * in two steps: F::load<V> reads its NL row vectors (16-byte loads where cols % V == 0
 * and its rows are aligned, which the host checks with F::width(cols), vec.cuh's
 * pxt_vec_width over its pointers), F::terms<V> forms the NV terms from them. The
 * terms are the same numbers for any V: only how they are loaded changes. */

/* The terms of bias_backward: dout (rows, cols) itself, its rows ld apart. */
template <typename T> struct pxt_colsum_rows {
    static constexpr int NV = 1;
    using elem = T;
    const T *x; /* (rows, cols), rows ld apart */
    int ld;
    static constexpr int NL = 1;
    template <int V> __device__ void load(int i, int j, float (&a)[NL][V]) const {
        pxt_vload<T, V>(a[0], x + (size_t)i * ld + j);
    }
    template <int V>
    __device__ void terms(int, int, const float (&a)[NL][V], double (&v)[NV][V]) const {
#pragma unroll
        for (int q = 0; q < V; q++) {
            v[0][q] = a[0][q];
        }
    }
    int width(int n) const { /* the rows' starts aligned too */
        const void *p[] = {x};
        int v = pxt_vec_width(sizeof(T), n, p, 1);
        while (ld % v) {
            v /= 2;
        }
        return v;
    }
};

/* The loads of the norms' weight gradients: dout and inp (rows, cols), row i's
 * vectors at column j. */
template <typename T> struct pxt_colsum_dout_inp {
    static constexpr int NL = 2; /* dout, inp */
    using elem = T;
    const T *dout, *inp; /* (rows, cols) */
    int cols;
    template <int V> __device__ void load(int i, int j, float (&a)[NL][V]) const {
        pxt_vload<T, V>(a[0], dout + (size_t)i * cols + j);
        pxt_vload<T, V>(a[1], inp + (size_t)i * cols + j);
    }
    int width(int n) const {
        const void *p[] = {dout, inp};
        return pxt_vec_width(sizeof(T), n, p, 2);
    }
};

/* The terms of layernorm's dweight and dbias: n * dout and dout, with
 * n = (inp - mean) * rstd rounded to float as the forward formed it. */
template <typename T> struct pxt_colsum_ln : pxt_colsum_dout_inp<T> {
    static constexpr int NV = 2, NL = 2;
    const float *mean, *rstd; /* (rows) */
    template <int V>
    __device__ void terms(int i, int, const float (&a)[NL][V], double (&v)[NV][V]) const {
        const float m = mean[i], r = rstd[i];
#pragma unroll
        for (int q = 0; q < V; q++) {
            float n = (a[1][q] - m) * r;
            v[0][q] = (double)n * a[0][q];
            v[1][q] = a[0][q];
        }
    }
};

/* The terms of GroupNorm's dweight and dbias over the B x S rows of (B, S, C):
 * n * dout and dout, n = (inp - mean) * rstd of the row's sample and the
 * column's group, rounded to float as the forward formed it. */
template <typename T> struct pxt_colsum_gn : pxt_colsum_dout_inp<T> {
    static constexpr int NV = 2, NL = 2; /* rows: the B x S of (B, S, C) */
    const float *mean, *rstd;            /* (B, G) */
    int S, G, cg;                        /* frames, groups, C / G */
    template <int V>
    __device__ void terms(int i, int j, const float (&a)[NL][V], double (&v)[NV][V]) const {
#pragma unroll
        for (int q = 0; q < V; q++) { /* a vector may straddle two groups */
            const int bg = i / S * G + (j + q) / cg;
            float n = (a[1][q] - mean[bg]) * rstd[bg];
            v[0][q] = (double)n * a[0][q];
            v[1][q] = a[0][q];
        }
    }
};

/* The terms of the RMS norm's dgamma: dout * (inp * inv * scale), inv =
 * 1 / max(norm, eps) rounded to float as the forward formed it. */
template <typename T> struct pxt_colsum_rms : pxt_colsum_dout_inp<T> {
    static constexpr int NV = 1, NL = 2;
    const float *norm; /* (rows) */
    float scale, eps;
    template <int V>
    __device__ void terms(int i, int, const float (&a)[NL][V], double (&v)[NV][V]) const {
        const float inv = 1.0f / (norm[i] > eps ? norm[i] : eps);
#pragma unroll
        for (int q = 0; q < V; q++) {
            v[0][q] = (double)a[0][q] * (a[1][q] * inv * scale);
        }
    }
};

/* Stage 1. parts (NV, nchunks, cols): parts[v][c][j] = sum of f's term v of (i, j)
 * over the rows i of chunk c (chunk_rows consecutive rows), from 0.0, in order. A
 * thread takes V consecutive columns (V = f.width(cols) or 1). Grid
 * (ceil(cols / V / BLOCK), up to nchunks); blocks stride over the chunks. The rows go
 * PXT_COLSUM_ROWS at a time: their loads first (f.load), then their terms and adds in
 * row order (f.terms), so a thread has several rows' loads in flight even where f
 * stores (gemm_fused's GELU gradient), which the compiler could not move loads past. */
#define PXT_COLSUM_ROWS 8

/* Host: the columns a thread of stage 1 takes for f: whole vectors of at most 4
 * elements. The bytes a call has in flight are (partial sums) x ROWS x (rows read) x
 * (element size) whatever V is, and the partial sums (about 2^17) are fixed by the
 * chunking the bits depend on: so V only trades threads for registers, and 4 keeps
 * 8 rows' loads in registers (ROWS 8: ~4 MB in flight for 16-bit rows read twice,
 * about what the H200's 4.8 TB/s needs to cover the loads' latency). */
template <typename F> static inline int pxt_colsum_width(const F &f, int cols) {
    return f.width(cols) >= 4 ? 4 : 1; /* no 2: a third more kernels for shapes no model has */
}

/* Host: launch(std::integral_constant<int, V>{}) with V = pxt_colsum_width(f, cols). */
template <typename F, typename L>
static inline void pxt_colsum_dispatch(const F &f, int cols, L &&launch) {
    if (pxt_colsum_width(f, cols) == 4) {
        launch(std::integral_constant<int, 4>{});
    } else {
        launch(std::integral_constant<int, 1>{});
    }
}

template <typename F, int V>
__global__ static void pxt_colsum_parts_kernel(double *parts, F f, int rows, int cols,
                                               int chunk_rows, int nchunks) {
    constexpr int NV = F::NV, NL = F::NL, U = PXT_COLSUM_ROWS;
    const int j = (blockIdx.x * blockDim.x + threadIdx.x) * V;
    if (j >= cols) {
        return;
    }
    for (int c = blockIdx.y; c < nchunks; c += gridDim.y) {
        const int i0 = c * chunk_rows, i1 = rows - i0 < chunk_rows ? rows : i0 + chunk_rows;
        double acc[NV][V];
#pragma unroll
        for (int v = 0; v < NV; v++) {
#pragma unroll
            for (int q = 0; q < V; q++) {
                acc[v][q] = 0.0;
            }
        }
        for (int i = i0; i < i1; i += U) {
            const int n = i1 - i < U ? i1 - i : U; /* rows of this round */
            float a[U][NL][V];
#pragma unroll
            for (int u = 0; u < U; u++) {
                if (u < n) {
                    f.template load<V>(i + u, j, a[u]);
                }
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                if (u < n) {
                    double t[NV][V];
                    f.template terms<V>(i + u, j, a[u], t);
#pragma unroll
                    for (int v = 0; v < NV; v++) {
#pragma unroll
                        for (int q = 0; q < V; q++) {
                            acc[v][q] += t[v][q];
                        }
                    }
                }
            }
        }
#pragma unroll
        for (int v = 0; v < NV; v++) {
#pragma unroll
            for (int q = 0; q < V; q++) {
                parts[((size_t)v * nchunks + c) * cols + j + q] = acc[v][q];
            }
        }
    }
}

/* Stage 2. out_v (cols) fp32 += the sum from 0.0 of parts[v][c][j] over the
 * chunks c in order, v = blockIdx.y (out1 unused with one sum per column).
 * Grid (ceil(cols / BLOCK), NV). */
__global__ static void pxt_colsum_finish_kernel(float *out0, float *out1, const double *parts,
                                                int nchunks, int cols) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x, v = blockIdx.y;
    if (j >= cols) {
        return;
    }
    const double *p = parts + (size_t)v * nchunks * cols + j; /* (nchunks) strided by cols */
    double acc = 0.0;
    /* the loads are independent, the adds in order: AHEAD loads issued before their adds
     * (a column has 32-128 chunk sums at XTTS v2's sizes; loaded one round at a time this
     * kernel, a few blocks wide, took 6.5 us a call on the H200, waiting on the loads) */
    int c = 0;
    for (; c + PXT_COLSUM_AHEAD <= nchunks; c += PXT_COLSUM_AHEAD) {
        double v[PXT_COLSUM_AHEAD];
#pragma unroll
        for (int u = 0; u < PXT_COLSUM_AHEAD; u++) {
            v[u] = p[(size_t)(c + u) * cols];
        }
#pragma unroll
        for (int u = 0; u < PXT_COLSUM_AHEAD; u++) {
            acc += v[u];
        }
    }
    for (; c < nchunks; c++) {
        acc += p[(size_t)c * cols];
    }
    float *out = v == 0 ? out0 : out1;
    out[j] = (float)(out[j] + acc);
}

#endif /* PXT_CUDA_COLSUM_CUH */
