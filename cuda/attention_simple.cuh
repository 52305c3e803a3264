/* attention_simple.cuh: exact attention, tiled with an online softmax (FlashAttention-2
 * style), forward and backward (csrc/cpu/attention.c is the reference).
 *
 * First version: fp32 arithmetic on the CUDA cores (no tensor-core mma yet),
 * tiles in shared memory, head dim D <= 128 (kernels are instantiated for
 * D <= 64 and D <= 128). No Tq x Tk buffer exists: a block holds one tile of
 * scores at a time.
 *
 * forward   a block per (b, h, 32 query rows); 4 threads per row, each holding a
 *           quarter of the row's output accumulator (columns d = g, g+4, ...)
 *           and 8 of the 32 scores of a key tile. Per key tile: S = Qs K^T
 *           (Qs = q * scale), running max m and sum l over the 4 lanes of the
 *           row, O = O * alpha + P V. out = O / l, lse = m + log l; a row that
 *           sees no valid key gets zeros and lse = -inf.
 * backward  Di = rowsum(dO * O) into the workspace (B, H, Tq) first; then two
 *           kernels that recompute P = exp(S - lse) and dS = P (dP - Di),
 *           dP = dO V^T, without atomics: one block per (b, h, 32 keys) walks
 *           the query tiles in order for dK = sum dS^T Qs, dV = sum P^T dO; one
 *           block per (b, h, 32 queries) walks the key tiles in order for
 *           dQ = scale * sum dS K. Every sum has a fixed order: the same bits
 *           on every run.
 *
 * Dropout of the probabilities (a.drop.p > 0; the kernels' DROP instances, so
 * p = 0 runs code without it): the masks of dropout.h, the CPU's bits
 * (attn_keep_bits). The forward scales P by the mask after the row sums (the
 * lse stays the undropped softmax's) and before O += P V; the backward
 * regenerates the mask and uses P Z for dV and dS = P (dP Z - Di), Di =
 * rowsum(dO * O) of the dropped output, as csrc/cpu/attention.c.
 *
 * bfloat16 / float16 with D = 64 or 128 on sm_80+ go to the tensor-core
 * kernels of attention_tc.cuh instead (attention.cu's entries ask attention_tc.cu;
 * the switch PYXTTS_CUDA_ATTENTION=simple|tc|auto is described there).
 *
 * Masked keys (key_mask, k_lengths) and rows past q_lengths are never read:
 * their tile rows are zeros and their probabilities are forced to 0, so
 * padding that holds garbage (even NaN) cannot leak into valid outputs.
 *
 * This header holds the kernels and their launches; cuda/attention/simple_*.cu
 * compile one (storage type, head-dim bound) each, in parallel; attention.cu holds
 * the entry points. */
#ifndef PXT_ATTENTION_SIMPLE_CUH
#define PXT_ATTENTION_SIMPLE_CUH

#include <math.h>

#include "attention.cuh"

/* ---- helpers: lengths, mask and rows in attention_common.cuh ------------------------ */

/* dst (R, SD) smem tile = mul * rows t0.. of (b, h); rows where ok is false
 * (and columns >= D) are zeros and their memory is never read */
template <typename T, typename OK>
__device__ static inline void load_tile(float *dst, int SD, int R, const T *base,
                                        const pxt_strides &s, int b, int h, int t0, int D,
                                        float mul, OK ok) {
    for (int e = threadIdx.x; e < R * D; e += ATTN_THREADS) {
        int r = e / D, d = e % D;
        dst[r * SD + d] = ok(r) ? ldf(row_ptr(base, s, b, h, t0 + r)[d]) * mul : 0.0f;
    }
}

/* dot of two smem rows of length D, d ascending (the same order everywhere) */
__device__ static inline float dot_row(const float *x, const float *y, int D) {
    float acc = 0.0f;
    for (int d = 0; d < D; d++) {
        acc = fmaf(x[d], y[d], acc);
    }
    return acc;
}

/* ---- forward ------------------------------------------------------------------------ */

/* out (o layout), lse (B, H, Tq); q, k, v by their layouts */
template <typename T, int DMAX, bool DROP>
__global__ static void __launch_bounds__(ATTN_THREADS)
    attn_fwd_kernel(pxt_attn_args a, T *out, float *lse, const T *q, const T *k, const T *v,
                    int nqb) {
    [[maybe_unused]] const pxt_dropout drop = DROP ? pxt_dropout_resolve(a.drop) : a.drop;
    constexpr int SDMAX = DMAX + 1, DPT = DMAX / 4, SPT = FWD_BC / 4, PS = FWD_BC + 1;
    __shared__ float Qs[FWD_BR * SDMAX]; /* (BR, SD) q * scale */
    __shared__ float KV[FWD_BC * SDMAX]; /* (BC, SD) the key tile, then the value tile */
    __shared__ float P[FWD_BR * PS];     /* (BR, BC + 1) probabilities */
    __shared__ unsigned char kval[FWD_BC];
    const int bh = blockIdx.x / nqb, blk = blockIdx.x % nqb;
    const int b = bh / a.H, h = bh % a.H;
    const int i0 = (a.causal ? nqb - 1 - blk : blk) * FWD_BR; /* the longest rows first */
    const int D = a.D, SD = D | 1; /* odd row stride: rows fall in different banks */
    const int tid = threadIdx.x, r = tid / 4, g = tid % 4;
    const int ql = q_len(a, b), kl = k_len(a, b);
    const int nq = iclamp(ql - i0, 0, FWD_BR);

    load_tile(Qs, SD, FWD_BR, q, a.q, b, h, i0, D, a.scale, [&](int rr) { return rr < nq; });
    float o[DPT]; /* (D / 4) columns d = g + 4 i of row r */
#pragma unroll
    for (int i = 0; i < DPT; i++) {
        o[i] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    bool saw = false; /* row r has a visible key: then no l > 0 means overflow or NaN */
    int kend = kl;
    if (a.causal) {
        kend = min(kend, i0 + nq); /* keys after the block's last row are never seen */
    }
    if (nq == 0) {
        kend = 0;
    }
    for (int j0 = 0; j0 < kend; j0 += FWD_BC) {
        __syncthreads(); /* Qs is loaded; the last tile's V reads are done */
        if (tid < FWD_BC) {
            kval[tid] = key_ok(a, b, j0 + tid, kl);
        }
        load_tile(KV, SD, FWD_BC, k, a.k, b, h, j0, D, 1.0f,
                  [&](int c) { return key_ok(a, b, j0 + c, kl); });
        __syncthreads();
        float s[SPT]; /* scores of keys c = g + 4 jj */
        float mx = -INFINITY;
#pragma unroll
        for (int jj = 0; jj < SPT; jj++) {
            int c = g + 4 * jj;
            float acc = dot_row(Qs + r * SD, KV + c * SD, D);
            bool seen = kval[c] && (!a.causal || j0 + c <= i0 + r);
            s[jj] = seen ? acc : -INFINITY;
            saw |= seen;
            mx = fmaxf(mx, s[jj]);
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1)); /* the row's 4 lanes */
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        float m_new = fmaxf(m, mx);
        /* a row with no valid key so far subtracts 0: exp(-inf - 0) = 0 */
        float m_use = m_new == -INFINITY ? 0.0f : m_new;
        float alpha = expf(m - m_use), sum = 0.0f;
#pragma unroll
        for (int jj = 0; jj < SPT; jj++) {
            s[jj] = expf(s[jj] - m_use);
            sum += s[jj];
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        l = l * alpha + sum;
        m = m_new;
        if constexpr (DROP) { /* P Z after the sums: l stays the undropped softmax's */
            /* lane g draws keys 8g .. 8g+7 of the row, the quad shares the 32 bits */
            uint32_t keep = (uint32_t)attn_keep_bits_n<8>(drop, b, h, i0 + r, j0 + 8 * g) << 8 * g;
            keep |= __shfl_xor_sync(0xffffffffu, keep, 1);
            keep |= __shfl_xor_sync(0xffffffffu, keep, 2);
#pragma unroll
            for (int jj = 0; jj < SPT; jj++) {
                s[jj] *= keep >> (g + 4 * jj) & 1u ? drop.scale : 0.0f;
            }
        }
        __syncthreads(); /* every thread is done with the key tile */
#pragma unroll
        for (int jj = 0; jj < SPT; jj++) {
            P[r * PS + g + 4 * jj] = s[jj];
        }
        load_tile(KV, SD, FWD_BC, v, a.v, b, h, j0, D, 1.0f,
                  [&](int c) { return key_ok(a, b, j0 + c, kl); });
        __syncthreads();
#pragma unroll
        for (int i = 0; i < DPT; i++) { /* O = O * alpha + P V */
            int d = g + 4 * i;
            if (d < D) {
                float acc = o[i] * alpha;
                for (int c = 0; c < FWD_BC; c++) {
                    acc = fmaf(P[r * PS + c], KV[c * SD + d], acc);
                }
                o[i] = acc;
            }
        }
    }
    saw = __shfl_xor_sync(0xffffffffu, (int)saw, 1) | saw; /* the row's 4 lanes (whole warp) */
    saw = __shfl_xor_sync(0xffffffffu, (int)saw, 2) | saw;
    if (i0 + r >= a.Tq) {
        return;
    }
    T *dst = row_ptr(out, a.o, b, h, i0 + r);
    float *lrow = lse + ((size_t)bh * a.Tq + i0 + r);
    const bool any = r < nq && l > 0.0f;
    /* no valid key: zeros; scores that overflowed float, or NaN: NaN, never zeros */
    const bool bad = r < nq && saw && !any;
    const float inv = any ? 1.0f / l : bad ? NAN : 0.0f;
#pragma unroll
    for (int i = 0; i < DPT; i++) {
        int d = g + 4 * i;
        if (d < D) {
            dst[d] = stf<T>(any || bad ? o[i] * inv : 0.0f);
        }
    }
    if (g == 0) {
        *lrow = any ? m + logf(l) : bad ? NAN : -INFINITY;
    }
}

/* ---- backward: dK, dV per key block ------------------------------------------------- */

/* dk, dv (k, v layouts) of keys j0 .. j0+31 of (b, h); thread (c = key, g) */
template <typename T, int DMAX, bool DROP>
__global__ static void __launch_bounds__(ATTN_THREADS)
    attn_bwd_kv_kernel(pxt_attn_args a, T *dk, T *dv, const T *dout, const T *q, const T *k,
                       const T *v, const float *lse, const float *Di, int nkb) {
    [[maybe_unused]] const pxt_dropout drop = DROP ? pxt_dropout_resolve(a.drop) : a.drop;
    constexpr int SDMAX = DMAX + 1, DPT = DMAX / 4, RPT = KV_BR / 4, PS = KV_BR + 1;
    __shared__ float Ks[KV_BC * SDMAX], Vs[KV_BC * SDMAX];  /* (BC, SD) */
    __shared__ float Qs[KV_BR * SDMAX], dOs[KV_BR * SDMAX]; /* (BR, SD) q * scale, dout */
    __shared__ float Ps[KV_BC * PS], dSs[KV_BC * PS];       /* (BC, BR + 1) P^T, dS^T */
    __shared__ float nl[KV_BR], di[KV_BR];                  /* (BR) -lse (or -inf), Di */
    __shared__ uint32_t kept[KV_BR]; /* (BR) dropout: bit c set when key c is kept */
    __shared__ unsigned char kval[KV_BC];
    const int bh = blockIdx.x / nkb, j0 = (blockIdx.x % nkb) * KV_BC;
    const int b = bh / a.H, h = bh % a.H;
    const int D = a.D, SD = D | 1;
    const int tid = threadIdx.x, c = tid / 4, g = tid % 4;
    const int ql = q_len(a, b), kl = k_len(a, b);

    if (tid < KV_BC) {
        kval[tid] = key_ok(a, b, j0 + tid, kl);
    }
    load_tile(Ks, SD, KV_BC, k, a.k, b, h, j0, D, 1.0f,
              [&](int cc) { return key_ok(a, b, j0 + cc, kl); });
    load_tile(Vs, SD, KV_BC, v, a.v, b, h, j0, D, 1.0f,
              [&](int cc) { return key_ok(a, b, j0 + cc, kl); });
    float dK[DPT], dV[DPT]; /* columns d = g + 4 i of key c */
#pragma unroll
    for (int i = 0; i < DPT; i++) {
        dK[i] = dV[i] = 0.0f;
    }
    /* causal: queries before the block's first key see none of it */
    const int istart = a.causal ? j0 / KV_BR * KV_BR : 0;
    const int iend = j0 < kl ? ql : 0; /* a block past k_length has nothing to add */
    const float *lse_bh = lse + (size_t)bh * a.Tq, *Di_bh = Di + (size_t)bh * a.Tq;
    for (int i0 = istart; i0 < iend; i0 += KV_BR) {
        const int nq = min(KV_BR, ql - i0);
        __syncthreads(); /* the K, V load (first time) and the last tile's reads are done */
        /* a row that saw no key (lse -inf) loads as zeros: its dS is 0, but q * scale may be
         * inf (a huge scale), and 0 * inf in dK += dS^T Qs would be NaN */
        auto live = [&](int r) { return r < nq && lse_bh[i0 + r] != -INFINITY; };
        load_tile(Qs, SD, KV_BR, q, a.q, b, h, i0, D, a.scale, live);
        load_tile(dOs, SD, KV_BR, dout, a.o, b, h, i0, D, 1.0f, live);
        if (tid < KV_BR) {
            float L = tid < nq ? lse_bh[i0 + tid] : -INFINITY;
            nl[tid] = L == -INFINITY ? -INFINITY : -L; /* a NaN lse carries on */
            di[tid] = tid < nq ? Di_bh[i0 + tid] : 0.0f;
        }
        if constexpr (DROP) { /* warp 0: lane l draws keys 8 (l % 4) .. +7 of row l / 4 */
            if (tid < 32) {
                const int rr = tid / 4, part = tid % 4;
                uint32_t bits = (uint32_t)attn_keep_bits_n<8>(drop, b, h, i0 + rr, j0 + 8 * part)
                                << 8 * part;
                bits |= __shfl_xor_sync(0xffffffffu, bits, 1);
                bits |= __shfl_xor_sync(0xffffffffu, bits, 2);
                if (part == 0) {
                    kept[rr] = bits;
                }
            }
        }
        __syncthreads();
#pragma unroll
        for (int rr = 0; rr < RPT; rr++) {
            int r = g + 4 * rr;
            float s = dot_row(Qs + r * SD, Ks + c * SD, D);
            float dp = dot_row(dOs + r * SD, Vs + c * SD, D);
            bool seen = kval[c] && r < nq && (!a.causal || j0 + c <= i0 + r);
            float p = seen ? expf(s + nl[r]) : 0.0f;
            if constexpr (DROP) { /* dV takes P Z, dS = P (dP Z - Di) */
                const float z = kept[r] >> c & 1u ? drop.scale : 0.0f;
                Ps[c * PS + r] = p * z;
                dSs[c * PS + r] = seen ? p * (dp * z - di[r]) : 0.0f;
            } else {
                Ps[c * PS + r] = p;
                dSs[c * PS + r] = seen ? p * (dp - di[r]) : 0.0f;
            }
        }
        __syncthreads();
#pragma unroll
        for (int i = 0; i < DPT; i++) { /* dV += P^T dO, dK += dS^T Qs */
            int d = g + 4 * i;
            if (d < D) {
                for (int r = 0; r < KV_BR; r++) {
                    dV[i] = fmaf(Ps[c * PS + r], dOs[r * SD + d], dV[i]);
                    dK[i] = fmaf(dSs[c * PS + r], Qs[r * SD + d], dK[i]);
                }
            }
        }
    }
    __syncthreads(); /* kval is complete even when no query tile ran */
    if (j0 + c >= a.Tk) {
        return;
    }
    T *dkr = row_ptr(dk, a.k, b, h, j0 + c), *dvr = row_ptr(dv, a.v, b, h, j0 + c);
    const bool keep = kval[c]; /* masked keys and keys past k_length: zeros */
#pragma unroll
    for (int i = 0; i < DPT; i++) {
        int d = g + 4 * i;
        if (d < D) {
            dkr[d] = stf<T>(keep ? dK[i] : 0.0f);
            dvr[d] = stf<T>(keep ? dV[i] : 0.0f);
        }
    }
}

/* ---- backward: dQ per query block --------------------------------------------------- */

/* dq (q layout) of rows i0 .. i0+31 of (b, h); thread (r = row, g) */
template <typename T, int DMAX, bool DROP>
__global__ static void __launch_bounds__(ATTN_THREADS)
    attn_bwd_q_kernel(pxt_attn_args a, T *dq, const T *dout, const T *q, const T *k, const T *v,
                      const float *lse, const float *Di, int nqb) {
    [[maybe_unused]] const pxt_dropout drop = DROP ? pxt_dropout_resolve(a.drop) : a.drop;
    constexpr int SDMAX = DMAX + 1, DPT = DMAX / 4, CPT = DQ_BC / 4, PS = DQ_BC + 1;
    __shared__ float Qs[DQ_BR * SDMAX], dOs[DQ_BR * SDMAX]; /* (BR, SD) q * scale, dout */
    __shared__ float Ks[DQ_BC * SDMAX], Vs[DQ_BC * SDMAX];  /* (BC, SD) */
    __shared__ float dSs[DQ_BR * PS];                       /* (BR, BC + 1) */
    __shared__ unsigned char kval[DQ_BC];
    const int bh = blockIdx.x / nqb, blk = blockIdx.x % nqb;
    const int b = bh / a.H, h = bh % a.H;
    const int i0 = (a.causal ? nqb - 1 - blk : blk) * DQ_BR;
    const int D = a.D, SD = D | 1;
    const int tid = threadIdx.x, r = tid / 4, g = tid % 4;
    const int ql = q_len(a, b), kl = k_len(a, b);
    const int nq = iclamp(ql - i0, 0, DQ_BR);

    load_tile(Qs, SD, DQ_BR, q, a.q, b, h, i0, D, a.scale, [&](int rr) { return rr < nq; });
    load_tile(dOs, SD, DQ_BR, dout, a.o, b, h, i0, D, 1.0f, [&](int rr) { return rr < nq; });
    float nl = -INFINITY, di = 0.0f; /* of row r */
    if (r < nq) {
        float L = lse[(size_t)bh * a.Tq + i0 + r];
        nl = L == -INFINITY ? -INFINITY : -L; /* a NaN lse carries on */
        di = Di[(size_t)bh * a.Tq + i0 + r];
    }
    float dQ[DPT];
#pragma unroll
    for (int i = 0; i < DPT; i++) {
        dQ[i] = 0.0f;
    }
    int kend = nq ? kl : 0;
    if (a.causal) {
        kend = min(kend, i0 + nq);
    }
    for (int j0 = 0; j0 < kend; j0 += DQ_BC) {
        __syncthreads(); /* Qs, dOs loaded; the last tile's reads are done */
        if (tid < DQ_BC) {
            kval[tid] = key_ok(a, b, j0 + tid, kl);
        }
        load_tile(Ks, SD, DQ_BC, k, a.k, b, h, j0, D, 1.0f,
                  [&](int c) { return key_ok(a, b, j0 + c, kl); });
        load_tile(Vs, SD, DQ_BC, v, a.v, b, h, j0, D, 1.0f,
                  [&](int c) { return key_ok(a, b, j0 + c, kl); });
        uint32_t keep = 0;    /* dropout: bit c set when key j0 + c is kept for row r */
        if constexpr (DROP) { /* lane g draws keys 2g, 2g+1, the quad shares the 8 bits */
            keep = (uint32_t)attn_keep_bits(drop, b, h, i0 + r, j0 + 2 * g, 2) << 2 * g;
            keep |= __shfl_xor_sync(0xffffffffu, keep, 1);
            keep |= __shfl_xor_sync(0xffffffffu, keep, 2);
        }
        __syncthreads();
#pragma unroll
        for (int cc = 0; cc < CPT; cc++) {
            int c = g + 4 * cc;
            float s = dot_row(Qs + r * SD, Ks + c * SD, D);
            float dp = dot_row(dOs + r * SD, Vs + c * SD, D);
            bool seen = kval[c] && r < nq && (!a.causal || j0 + c <= i0 + r);
            float p = seen ? expf(s + nl) : 0.0f;
            if constexpr (DROP) { /* dS = P (dP Z - Di) */
                dp *= keep >> c & 1u ? drop.scale : 0.0f;
            }
            dSs[r * PS + c] = seen ? p * (dp - di) : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int i = 0; i < DPT; i++) { /* dQ += dS K */
            int d = g + 4 * i;
            if (d < D) {
                for (int c = 0; c < DQ_BC; c++) {
                    dQ[i] = fmaf(dSs[r * PS + c], Ks[c * SD + d], dQ[i]);
                }
            }
        }
    }
    if (i0 + r >= a.Tq) {
        return;
    }
    T *dst = row_ptr(dq, a.q, b, h, i0 + r);
#pragma unroll
    for (int i = 0; i < DPT; i++) {
        int d = g + 4 * i;
        if (d < D) { /* the scale of Qs, applied once; rows past q_length: zeros */
            dst[d] = stf<T>(r < nq ? dQ[i] * a.scale : 0.0f);
        }
    }
}

/* ---- launches, one instance per file ---------------------------------------------- */

template <typename T, int DMAX>
void attn_fwd_launch(unsigned int grid, cudaStream_t stream, const pxt_attn_args &a, T *out,
                     float *lse, const T *q, const T *k, const T *v, int nqb) {
    if (a.drop.p > 0.0f) { /* the instance with dropout; p = 0 runs none of its code */
        attn_fwd_kernel<T, DMAX, true>
            <<<grid, ATTN_THREADS, 0, stream>>>(a, out, lse, q, k, v, nqb);
    } else {
        attn_fwd_kernel<T, DMAX, false>
            <<<grid, ATTN_THREADS, 0, stream>>>(a, out, lse, q, k, v, nqb);
    }
}

template <typename T, int DMAX>
void attn_bwd_kv_launch(unsigned int grid, cudaStream_t stream, const pxt_attn_args &a, T *dk,
                        T *dv, const T *dout, const T *q, const T *k, const T *v, const float *lse,
                        const float *Di, int nkb) {
    if (a.drop.p > 0.0f) {
        attn_bwd_kv_kernel<T, DMAX, true>
            <<<grid, ATTN_THREADS, 0, stream>>>(a, dk, dv, dout, q, k, v, lse, Di, nkb);
    } else {
        attn_bwd_kv_kernel<T, DMAX, false>
            <<<grid, ATTN_THREADS, 0, stream>>>(a, dk, dv, dout, q, k, v, lse, Di, nkb);
    }
}

template <typename T, int DMAX>
void attn_bwd_q_launch(unsigned int grid, cudaStream_t stream, const pxt_attn_args &a, T *dq,
                       const T *dout, const T *q, const T *k, const T *v, const float *lse,
                       const float *Di, int nqb) {
    if (a.drop.p > 0.0f) {
        attn_bwd_q_kernel<T, DMAX, true>
            <<<grid, ATTN_THREADS, 0, stream>>>(a, dq, dout, q, k, v, lse, Di, nqb);
    } else {
        attn_bwd_q_kernel<T, DMAX, false>
            <<<grid, ATTN_THREADS, 0, stream>>>(a, dq, dout, q, k, v, lse, Di, nqb);
    }
}

/* the explicit instantiation of one instance's launches: the body of a file
 * cuda/attention/simple_<dtype>_d<DMAX>.cu */
#define PXT_ATTN_SIMPLE_INSTANCE(T, DMAX)                                                          \
    template void attn_fwd_launch<T, DMAX>(unsigned int, cudaStream_t, const pxt_attn_args &, T *, \
                                           float *, const T *, const T *, const T *, int);         \
    template void attn_bwd_kv_launch<T, DMAX>(unsigned int, cudaStream_t, const pxt_attn_args &,   \
                                              T *, T *, const T *, const T *, const T *,           \
                                              const T *, const float *, const float *, int);       \
    template void attn_bwd_q_launch<T, DMAX>(unsigned int, cudaStream_t, const pxt_attn_args &,    \
                                             T *, const T *, const T *, const T *, const T *,      \
                                             const float *, const float *, int);

#endif /* PXT_ATTENTION_SIMPLE_CUH */
