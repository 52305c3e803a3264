/* colsum.cuh: the kernels of the two-stage column sums (backend.h fixes the
 * order): stage 1, one thread per (chunk, column), sums its chunk's rows in
 * order in double; stage 2, one thread per column, adds the chunk sums in
 * chunk order and the total to the fp32 output once.
 *
 * Kernels and their row functors only: the includer provides ldf() and the
 * 16-bit storage types (elem.cuh on the GPU, the host emulator of
 * tests/cuda_emu on the CPU, which runs this very source). A functor F gives
 * NV terms of element (i, j) as doubles: F::NV sums are taken at once (NV = 2
 * for layernorm's and GroupNorm's dweight and dbias, which read the same rows). */
#ifndef PXT_CUDA_COLSUM_CUH
#define PXT_CUDA_COLSUM_CUH

#define PXT_COLSUM_BLOCK 256 /* columns per block of both stages */
#define PXT_COLSUM_AHEAD 32  /* stage 2: loads a thread has in flight before their adds */

/* The terms of bias_backward: dout (rows, cols) itself. */
template <typename T> struct pxt_colsum_rows {
    static constexpr int NV = 1;
    const T *x; /* (rows, cols) */
    int cols;
    __device__ void operator()(int i, int j, double *v) const {
        v[0] = ldf(x[(size_t)i * cols + j]);
    }
};

/* The terms of layernorm's dweight and dbias: n * dout and dout, with
 * n = (inp - mean) * rstd rounded to float as the forward formed it. */
template <typename T> struct pxt_colsum_ln {
    static constexpr int NV = 2;
    const T *dout, *inp;      /* (rows, cols) */
    const float *mean, *rstd; /* (rows) */
    int cols;
    __device__ void operator()(int i, int j, double *v) const {
        size_t k = (size_t)i * cols + j;
        float g = ldf(dout[k]);
        float n = (ldf(inp[k]) - mean[i]) * rstd[i];
        v[0] = (double)n * g;
        v[1] = g;
    }
};

/* The terms of GroupNorm's dweight and dbias over the B x S rows of (B, S, C):
 * n * dout and dout, n = (inp - mean) * rstd of the row's sample and the
 * column's group, rounded to float as the forward formed it. */
template <typename T> struct pxt_colsum_gn {
    static constexpr int NV = 2;
    const T *dout, *inp;      /* (B * S, C) */
    const float *mean, *rstd; /* (B, G) */
    int cols, S, G, cg;       /* C, frames, groups, C / G */
    __device__ void operator()(int i, int j, double *v) const {
        size_t k = (size_t)i * cols + j;
        int bg = i / S * G + j / cg;
        float g = ldf(dout[k]);
        float n = (ldf(inp[k]) - mean[bg]) * rstd[bg];
        v[0] = (double)n * g;
        v[1] = g;
    }
};

/* The terms of the RMS norm's dgamma: dout * (inp * inv * scale), inv =
 * 1 / max(norm, eps) rounded to float as the forward formed it. */
template <typename T> struct pxt_colsum_rms {
    static constexpr int NV = 1;
    const T *dout, *inp; /* (rows, cols) */
    const float *norm;   /* (rows) */
    int cols;
    float scale, eps;
    __device__ void operator()(int i, int j, double *v) const {
        size_t k = (size_t)i * cols + j;
        float inv = 1.0f / (norm[i] > eps ? norm[i] : eps);
        v[0] = (double)ldf(dout[k]) * (ldf(inp[k]) * inv * scale);
    }
};

/* Stage 1. parts (NV, nchunks, cols): parts[v][c][j] = sum of f(i, j)[v] over the
 * rows i of chunk c (chunk_rows consecutive rows), from 0.0, in order. Grid
 * (ceil(cols / BLOCK), up to nchunks); blocks stride over the chunks. */
template <typename F>
__global__ static void pxt_colsum_parts_kernel(double *parts, F f, int rows, int cols,
                                               int chunk_rows, int nchunks) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= cols) {
        return;
    }
    for (int c = blockIdx.y; c < nchunks; c += gridDim.y) {
        const int i0 = c * chunk_rows, i1 = rows - i0 < chunk_rows ? rows : i0 + chunk_rows;
        double acc[F::NV], t[F::NV];
        for (int v = 0; v < F::NV; v++) {
            acc[v] = 0.0;
        }
        for (int i = i0; i < i1; i++) {
            f(i, j, t);
            for (int v = 0; v < F::NV; v++) {
                acc[v] += t[v];
            }
        }
        for (int v = 0; v < F::NV; v++) {
            parts[((size_t)v * nchunks + c) * cols + j] = acc[v];
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
