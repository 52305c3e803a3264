/* attention_tc.cuh: the tensor-core attention kernels (FlashAttention-2 style) for
 * 16-bit inputs, forward and backward, and their launches. attention_tc.cu says when
 * they run; cuda/attention/tc_*.cu compile one (storage type, head dim) each.
 *
 * Arithmetic: mma.sync.m16n8k16 with 16-bit A, B and fp32 accumulators. Q, K,
 * V, dO enter the mma as stored (exact); S, dP and every sum are fp32. Two
 * things are rounded to the 16-bit type because the mma needs them there:
 * P (before O += P V and dV += P^T dO) and dS (before dK += dS^T Q and
 * dQ += dS K; dS carries the softmax scale already, so float16 overflows
 * sqrt(D) times later); each is one relative rounding (2^-8 bf16, 2^-11 fp16) per
 * term, so these results are NOT the fallback's "fp32 result rounded once"
 * (tests/test_cuda_attention_tc.py derives the tolerance). The softmax is in
 * base 2: x = s * scale * log2(e), p = exp2(x - m); lse = m ln 2 + ln l; exp2 is
 * the hardware's ex2.approx.ftz (tc_exp2: 2^-22 relative, far inside those bounds).
 *
 * forward   a CTA per (b, h, 128 query rows), 4 warps x 32 rows for D = 64
 *           (64 rows, 4 x 16, for D = 128: registers). Q (BQ, D) stays in
 *           registers as mma A fragments; K and V tiles of 64 keys are
 *           double-buffered in shared memory with cp.async (the next tile
 *           loads while this one computes). Per tile a warp does S (32, 64) =
 *           Q K^T, the online softmax on its accumulators, then O (32, D) +=
 *           P V with P straight from the S accumulators (the C
 *           fragment of m16n8 is the A fragment of the next mma). Causal: the
 *           CTA stops at its last row's diagonal, a warp skips tiles wholly
 *           after its rows, and only tiles that cross the diagonal, a key
 *           mask or k_length pay for the per-element mask.
 * backward  deterministic, no atomics, as the fallback: Di = rowsum(dO * O)
 *           (attention.cu's kernel, into the workspace), then
 *           dK/dV kernel: a CTA per (b, h, 64 keys), 4 warps x 16 keys, K and
 *             V in shared memory, walking query tiles (64 rows for D = 64, 32
 *             for D = 128: registers) with Q and dO double-buffered:
 *             S^T = K Q^T, dP^T = V dO^T, P^T = exp2(S^T c - lse2), dS^T =
 *             scale P^T (dP^T - Di); dV += P^T dO, dK += dS^T Q.
 *           dQ kernel: a CTA per (b, h, 64 queries), 4 warps x 16 rows, Q and
 *             dO in shared memory, walking key tiles (64 / 32 keys) with K and
 *             V double-buffered: S, dP, P, dS as above, dQ += dS K.
 *           Each output element is a sum in a fixed order: same bits every run.
 * backward, one pass (PYXTTS_CUDA_ATTENTION_BWD=one-pass; attention_tc.cu): the dK/dV
 *           kernel's work plus dQ through per-split fp32 partials, 5 products per pair
 *           instead of 7; described at attn_tc_bwd_kernel below.
 *
 * Dropout of the probabilities (a.drop.p > 0; the kernels' DROP instances, so p = 0
 * runs code without it): the masks of dropout.h, the CPU's bits. A warp draws the
 * bits of its tile once (one Philox call per query and group of eight key positions,
 * attn_keep_bits): lane l the keys of one query (a part of them when the tile has
 * fewer queries than lanes), then each lane gathers the bits of the (query, key)
 * pairs its mma fragments hold by shuffles. The forward scales P by the mask after
 * the row sums (the lse stays the undropped softmax's) and before O += P V; the
 * backward uses P Z for dV and dS = P (dP Z - Di), Di = rowsum(dO * O) of the
 * dropped output, as csrc/cpu/attention.c.
 *
 * Shared-memory rows are D + 8 elements: 8 ldmatrix row addresses then fall
 * in 8 different 16-byte bank groups (no conflicts) and stay 16-byte aligned.
 * Masked keys and rows past q_length are zero-filled by cp.async with a source
 * size of 0 (the memory is never read); their probabilities are forced to 0. */
#ifndef PXT_ATTENTION_TC_CUH
#define PXT_ATTENTION_TC_CUH

#include <math.h>
#include <string.h>
#include <type_traits>

#include "attention.cuh"
#include "attention_tc_plan.h" /* TC_THREADS, the tile shapes, the shared memory of each kernel */

/* ---- PTX wrappers -------------------------------------------------------------------
 * mma.m16n8k16 with bf16/f16 and cp.async exist from sm_80. The kernels are
 * compiled for every target, but below sm_80 these bodies trap: the host
 * never launches them there (tc_select checks the device and the binary). */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define TC_SM80 1
#else
#define TC_SM80 0
#endif

__device__ static inline uint32_t smem_u32(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* 16 bytes global -> shared; bytes past src_bytes (all 16 when 0) are zeros */
__device__ static inline void cp_async16(uint32_t dst, const void *src, int src_bytes) {
#if TC_SM80
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes)
                 : "memory");
#else
    (void)dst, (void)src, (void)src_bytes;
    __trap();
#endif
}
__device__ static inline void cp_async_commit() {
#if TC_SM80
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
/* waits until at most N of this thread's committed groups are in flight */
template <int N> __device__ static inline void cp_async_wait() {
#if TC_SM80
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

/* four 8x8 16-bit matrices; lanes 8i..8i+7 give the row addresses of matrix i;
 * lane l gets of matrix i the elements (row l/4, cols 2(l%4), 2(l%4)+1) */
__device__ static inline void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
#if TC_SM80
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
#else
    (void)addr;
    r[0] = r[1] = r[2] = r[3] = 0;
    __trap();
#endif
}
/* the same, transposed: lane l gets (rows 2(l%4), 2(l%4)+1, col l/4) */
__device__ static inline void ldsm_x4_t(uint32_t (&r)[4], uint32_t addr) {
#if TC_SM80
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
#else
    (void)addr;
    r[0] = r[1] = r[2] = r[3] = 0;
    __trap();
#endif
}

/* c (16x8 fp32) += a (16x16, row) . b (16x8, col). Lane l = 4g + t holds
 *   a: {(g, 2t..2t+1), (g+8, 2t..), (g, 2t+8..), (g+8, 2t+8..)}
 *   b: {(k 2t..2t+1, n g), (k 2t+8.., n g)}
 *   c: {(g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1)} */
template <typename T>
__device__ static inline void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                       uint32_t b1) {
#if TC_SM80
    if constexpr (std::is_same_v<T, pxt_bf16>) {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
            "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
            "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
#else
    (void)c, (void)a, (void)b0, (void)b1;
    __trap();
#endif
}

/* 2^x of the softmax: ex2.approx.ftz, one MUFU.EX2 (relative error under 2^-22; a
 * subnormal input counts as 0 and a result under 2^-126 is 0). exp2f adds a range
 * fix-up of three instructions per probability for subnormal results, which neither
 * the fp32 sums nor the 16-bit P can tell from 0. 2^-inf = 0 and 2^NaN = NaN, as exp2f. */
__device__ static inline float tc_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

/* two floats -> one register of two 16-bit values (lo in the low half), RNE */
template <typename T> __device__ static inline uint32_t pack2(float lo, float hi) {
    uint32_t u;
    if constexpr (std::is_same_v<T, pxt_bf16>) {
        __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
        memcpy(&u, &v, 4);
    } else {
        __half2 v = __floats2half2_rn(lo, hi);
        memcpy(&u, &v, 4);
    }
    return u;
}

/* an output pair (cols d, d+1 of one row) with the CPU's rounding and NaN bits */
template <typename T> __device__ static inline void store2(T *dst, float x, float y) {
    uint32_t w = (uint32_t)stf<T>(x).bits | ((uint32_t)stf<T>(y).bits << 16);
    *(uint32_t *)dst = w; /* d even, rows 16-byte aligned (tc_select checks) */
}

/* cp.async rows t0 .. t0+R-1 of (b, h) into dst (R, D + PAD); a row where
 * ok(r) is false is zero-filled and its memory never read. Not committed. */
template <int R, int D, int NTH = TC_THREADS, typename T, typename OK>
__device__ static inline void load_rows(uint16_t *dst, const T *base, const pxt_strides &s, int b,
                                        int h, int t0, OK ok) {
    constexpr int CPR = D / 8, SD = D + TC_PAD; /* 16-byte chunks per row */
    for (int e = threadIdx.x; e < R * CPR; e += NTH) {
        const int r = e / CPR, c = e % CPR;
        const bool valid = ok(r);
        const T *src = valid ? row_ptr(base, s, b, h, t0 + r) + c * 8 : base;
        cp_async16(smem_u32(dst + r * SD + c * 8), src, valid ? 16 : 0);
    }
}

/* A fragment (16 rows from row0, k cols kc*16..+15) of a (.., SD) smem tile */
template <int SD>
__device__ static inline void frag_a(uint32_t (&r)[4], const uint16_t *tile, int row0, int kc,
                                     int lane) {
    ldsm_x4(r, smem_u32(tile + (row0 + lane % 16) * SD + kc * 16 + (lane / 16) * 8));
}
/* B fragments of two n-tiles (rows n0..n0+15 of the tile are n, cols kc*16.. are k):
 * r = {b0, b1} of n0..n0+7, then {b0, b1} of n0+8..n0+15 (tile stored (n, k)) */
template <int SD>
__device__ static inline void frag_b_nk(uint32_t (&r)[4], const uint16_t *tile, int n0, int kc,
                                        int lane) {
    ldsm_x4(r, smem_u32(tile + (n0 + (lane / 16) * 8 + lane % 8) * SD + kc * 16 +
                        ((lane / 8) % 2) * 8));
}
/* B fragments of two n-tiles for a tile stored (k, n): rows k0..k0+15 are k,
 * cols n0..n0+15 are n; r = {b0, b1} of cols n0.., then of cols n0+8.. */
template <int SD>
__device__ static inline void frag_b_kn(uint32_t (&r)[4], const uint16_t *tile, int k0, int n0,
                                        int lane) {
    ldsm_x4_t(r,
              smem_u32(tile + (k0 + ((lane / 8) % 2) * 8 + lane % 8) * SD + n0 + (lane / 16) * 8));
}

/* ---- dropout: a warp's keep bits ---------------------------------------------------
 * A tile of WR rows (queries; 16 or 32) x NK keys (NK <= 64) of one warp: lane l draws
 * row l % WR, keys (l / WR) KPL .. + KPL - 1 of it (KPL = NK WR / 32) */
template <int WR, int NK>
__device__ static inline uint64_t tc_keep_draw(const pxt_dropout &d, int b, int h, int row0, int j0,
                                               int lane) {
    constexpr int KPL = NK * WR / 32;
    return attn_keep_bits_n<KPL>(d, b, h, row0 + lane % WR, j0 + lane / WR * KPL);
}
/* the NK keep bits of row R of the tile (bit c: key c), from the lanes that drew them;
 * every lane of the warp calls it */
template <int WR, int NK> __device__ static inline uint64_t tc_keep_gather(uint64_t mine, int R) {
    constexpr int LPR = 32 / WR, KPL = NK * WR / 32; /* lanes per row, keys per lane */
    uint64_t bits = 0;
#pragma unroll
    for (int part = 0; part < LPR; part++) {
        uint64_t w = __shfl_sync(0xffffffffu, (uint32_t)mine, R + part * WR);
        if constexpr (KPL > 32) {
            w |= (uint64_t)__shfl_sync(0xffffffffu, (uint32_t)(mine >> 32), R + part * WR) << 32;
        }
        bits |= w << (part * KPL);
    }
    return bits;
}

/* Every one of the N key flags at kv is set (N a multiple of 16): one vote of the warp.
 * A tile whose keys are all attendable then skips the per-element mask (a shared-memory
 * flag, compares and a select per score) unless the causal diagonal crosses it: with a
 * key mask, which XTTS's padded batches always have, most tiles have no masked key, and
 * the mask's work ran on every element of every tile. */
template <int N>
__device__ static __forceinline__ bool tc_keys_all_ok(const unsigned char *kv, int lane) {
    bool ok = true;
#pragma unroll
    for (int c = lane; c < N; c += 32) {
        ok = ok && kv[c];
    }
    return __ballot_sync(0xffffffffu, ok) == 0xffffffffu;
}

#define TC_LOG2E 1.4426950408889634f
#define TC_LN2 0.6931471805599453f

/* ---- forward ------------------------------------------------------------------------ */

/* out (o layout), lse (B, H, Tq) of BQ = 64 MT query rows of (b, h); warp w owns
 * rows 16 MT w .. 16 MT (w + 1) - 1 of the block, m-tile mt the 16 from 16 MT w + 16 mt */
template <typename T, int D, bool DROP>
__global__ static void __launch_bounds__(TC_THREADS)
    attn_tc_fwd_kernel(pxt_attn_args a, T *out, float *lse, const T *q, const T *k, const T *v,
                       int nqb) {
    [[maybe_unused]] const pxt_dropout drop = DROP ? pxt_dropout_resolve(a.drop) : a.drop;
    constexpr int MT = fwd_mt<D>(), BQ = fwd_bq<D>(), WR = 16 * MT; /* rows per warp */
    constexpr int SD = D + TC_PAD, KC = D / 16, NT = TC_BK / 8, DT = D / 8;
    extern __shared__ __align__(16) uint16_t smem[];
    uint16_t *Qs = smem;                                          /* (BQ, SD) */
    uint16_t *Ks = Qs + BQ * SD;                                  /* (2, BK, SD) double buffer */
    uint16_t *Vs = Ks + 2 * TC_BK * SD;                           /* (2, BK, SD) */
    unsigned char *kval = (unsigned char *)(Vs + 2 * TC_BK * SD); /* (2, BK) key attendable */
    const int bh = blockIdx.x / nqb, blk = blockIdx.x % nqb;
    const int b = bh / a.H, h = bh % a.H;
    const int i0 = (a.causal ? nqb - 1 - blk : blk) * BQ; /* the longest rows first */
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int ql = q_len(a, b), kl = k_len(a, b);
    const int nq = iclamp(ql - i0, 0, BQ);
    const int iw = i0 + WR * warp; /* the warp's first row */
    int kend = kl;
    if (a.causal) {
        kend = min(kend, i0 + nq); /* keys after the CTA's last row are never seen */
    }
    if (nq == 0) {
        kend = 0;
    }
    const int ntiles = (kend + TC_BK - 1) / TC_BK;
    const bool warp_live = iw < i0 + nq; /* some of the warp's rows are valid */
    const float c2 = a.scale * TC_LOG2E; /* scores into log2 units */

    auto load_kv = [&](int tile, int buf) {
        const int j0 = tile * TC_BK;
        auto ok = [&](int c) { return key_ok(a, b, j0 + c, kl); };
        load_rows<TC_BK, D>(Ks + buf * TC_BK * SD, k, a.k, b, h, j0, ok);
        load_rows<TC_BK, D>(Vs + buf * TC_BK * SD, v, a.v, b, h, j0, ok);
        if (threadIdx.x < TC_BK) {
            kval[buf * TC_BK + threadIdx.x] = ok(threadIdx.x);
        }
    };
    load_rows<BQ, D>(Qs, q, a.q, b, h, i0, [&](int r) { return r < nq; });
    if (ntiles > 0) {
        load_kv(0, 0);
    }
    cp_async_commit(); /* group: Q and tile 0 */

    uint32_t qf[MT][KC][4]; /* the warp's Q rows as A fragments */
    float o[MT][DT]
           [4]; /* O (16, D) per m-tile: n-tile dt holds cols dt*8 + 2t, +1 of rows g, g+8 */
    float m[MT][2],
        l[MT][2]; /* running max (log2 units) of rows g, g+8; this lane's part of the sums */
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int dt = 0; dt < DT; dt++) {
            o[mt][dt][0] = o[mt][dt][1] = o[mt][dt][2] = o[mt][dt][3] = 0.0f;
        }
        m[mt][0] = m[mt][1] = -INFINITY;
        l[mt][0] = l[mt][1] = 0.0f;
    }
    /* bit 2 mt + hf: row g + 8 hf of m-tile mt had a visible key in this lane's columns
     * (then no l > 0 means scores that overflowed float, or NaN) */
    uint32_t saw = 0;
    static_assert(2 * MT < 32, "one bit per row of the warp's m-tiles");

    for (int it = 0; it < ntiles; it++) {
        const int buf = it & 1, j0 = it * TC_BK;
        if (it + 1 < ntiles) {
            load_kv(it + 1, buf ^ 1); /* overlaps this tile's math */
        }
        cp_async_commit();
        cp_async_wait<1>(); /* this thread's part of tile it (and Q) landed */
        __syncthreads();    /* everyone's part landed; kval[buf] visible */
        if (it == 0) {
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int kc = 0; kc < KC; kc++) {
                    frag_a<SD>(qf[mt][kc], Qs, WR * warp + 16 * mt, kc, lane);
                }
        }
        /* a warp whose rows all precede the tile (causal), or are all padding, skips it */
        const bool skip = !warp_live || (a.causal && j0 > iw + WR - 1);
        if (!skip) {
            const uint16_t *Kt = Ks + buf * TC_BK * SD, *Vt = Vs + buf * TC_BK * SD;
            /* the per-element mask only where a key is masked or past k_length (kval
             * 0), or after some row of the warp (the diagonal); voted before the
             * products, whose scores then leave no room for the flags' registers */
            const bool need_mask = !tc_keys_all_ok<TC_BK>(kval + buf * TC_BK, lane) ||
                                   (a.causal && j0 + TC_BK - 1 > iw);
            float s[MT][NT][4]; /* S (16, BK) per m-tile: n-tile nt holds keys nt*8 + 2t, +1 */
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    s[mt][nt][0] = s[mt][nt][1] = s[mt][nt][2] = s[mt][nt][3] = 0.0f;
                }
#pragma unroll
            for (int kc = 0; kc < KC; kc++) {
#pragma unroll
                for (int np = 0; np < NT / 2; np++) {
                    uint32_t bf[4];
                    frag_b_nk<SD>(bf, Kt, np * 16, kc, lane);
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        mma16816<T>(s[mt][2 * np], qf[mt][kc], bf[0], bf[1]);
                        mma16816<T>(s[mt][2 * np + 1], qf[mt][kc], bf[2], bf[3]);
                    }
                }
            }
            if (!need_mask) {
                saw = (1u << 2 * MT) - 1u; /* every row sees every key of the tile */
            }
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                float mx[2] = {m[mt][0], m[mt][1]};
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        float x = s[mt][nt][e] * c2;
                        if (need_mask) {
                            const int c = nt * 8 + 2 * t + (e & 1);
                            const int row = iw + 16 * mt + g + 8 * (e >> 1);
                            if (!kval[buf * TC_BK + c] || (a.causal && j0 + c > row)) {
                                x = -INFINITY;
                            } else {
                                saw |= 1u << (2 * mt + (e >> 1));
                            }
                        }
                        s[mt][nt][e] = x;
                        mx[e >> 1] = fmaxf(mx[e >> 1], x);
                    }
                float alpha[2], mu[2];
#pragma unroll
                for (int hf = 0; hf < 2; hf++) { /* the row's 4 lanes agree on the max */
                    mx[hf] = fmaxf(mx[hf], __shfl_xor_sync(0xffffffffu, mx[hf], 1));
                    mx[hf] = fmaxf(mx[hf], __shfl_xor_sync(0xffffffffu, mx[hf], 2));
                    /* a row with no valid key so far subtracts 0: exp2(-inf - 0) = 0 */
                    mu[hf] = mx[hf] == -INFINITY ? 0.0f : mx[hf];
                    alpha[hf] = tc_exp2(m[mt][hf] - mu[hf]);
                    m[mt][hf] = mx[hf];
                }
                float sum[2] = {0.0f, 0.0f};
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        s[mt][nt][e] = tc_exp2(s[mt][nt][e] - mu[e >> 1]);
                        sum[e >> 1] += s[mt][nt][e];
                    }
                /* fp32 p for l (lse keeps fp32 accuracy); P V uses p rounded to T */
                l[mt][0] = l[mt][0] * alpha[0] + sum[0];
                l[mt][1] = l[mt][1] * alpha[1] + sum[1];
#pragma unroll
                for (int dt = 0; dt < DT; dt++) {
                    o[mt][dt][0] *= alpha[0], o[mt][dt][1] *= alpha[0];
                    o[mt][dt][2] *= alpha[1], o[mt][dt][3] *= alpha[1];
                }
            }
            if constexpr (DROP) { /* P Z after the sums: l stays the undropped softmax's */
                const uint64_t mine = tc_keep_draw<WR, TC_BK>(drop, b, h, iw, j0, lane);
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int hf = 0; hf < 2; hf++) {
                        const uint64_t keep = tc_keep_gather<WR, TC_BK>(mine, 16 * mt + g + 8 * hf);
#pragma unroll
                        for (int nt = 0; nt < NT; nt++)
#pragma unroll
                            for (int e = 0; e < 2; e++) { /* key nt*8 + 2t + e of row g + 8 hf */
                                s[mt][nt][2 * hf + e] *=
                                    keep >> (nt * 8 + 2 * t + e) & 1u ? drop.scale : 0.0f;
                            }
                    }
            }
#pragma unroll
            for (int kc = 0; kc < TC_BK / 16; kc++) { /* O += P V, 16 keys at a time */
                uint32_t pa[MT][4]; /* P of the m-tiles as A fragments (C layout = A layout) */
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    pa[mt][0] = pack2<T>(s[mt][2 * kc][0], s[mt][2 * kc][1]);
                    pa[mt][1] = pack2<T>(s[mt][2 * kc][2], s[mt][2 * kc][3]);
                    pa[mt][2] = pack2<T>(s[mt][2 * kc + 1][0], s[mt][2 * kc + 1][1]);
                    pa[mt][3] = pack2<T>(s[mt][2 * kc + 1][2], s[mt][2 * kc + 1][3]);
                }
#pragma unroll
                for (int dp = 0; dp < DT / 2; dp++) {
                    uint32_t bf[4];
                    frag_b_kn<SD>(bf, Vt, kc * 16, dp * 16, lane);
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        mma16816<T>(o[mt][2 * dp], pa[mt], bf[0], bf[1]);
                        mma16816<T>(o[mt][2 * dp + 1], pa[mt], bf[2], bf[3]);
                    }
                }
            }
        }
        __syncthreads(); /* the next iteration's load overwrites this buffer */
    }
    cp_async_wait<0>(); /* no copy outlives the CTA (none issued when ntiles == 0 but Q) */

    saw |= __shfl_xor_sync(0xffffffffu, saw, 1); /* the quad's columns */
    saw |= __shfl_xor_sync(0xffffffffu, saw, 2);
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            float lsum = l[mt][hf]; /* the quad's parts, in a fixed butterfly */
            lsum += __shfl_xor_sync(0xffffffffu, lsum, 1);
            lsum += __shfl_xor_sync(0xffffffffu, lsum, 2);
            const int r = iw + 16 * mt + g + 8 * hf;
            if (r >= a.Tq) {
                continue;
            }
            const bool any = r < i0 + nq && lsum > 0.0f;
            /* no valid key: zeros; scores that overflowed float, or NaN: NaN, never zeros */
            const bool bad = r < i0 + nq && (saw >> (2 * mt + hf) & 1u) && !any;
            /* the zeros are written, not o * 0: o is NaN in a padding row whose zero scores
             * met an infinite scale */
            const float inv = any ? 1.0f / lsum : NAN;
            T *dst = row_ptr(out, a.o, b, h, r);
#pragma unroll
            for (int dt = 0; dt < DT; dt++) {
                store2<T>(dst + dt * 8 + 2 * t, any || bad ? o[mt][dt][2 * hf] * inv : 0.0f,
                          any || bad ? o[mt][dt][2 * hf + 1] * inv : 0.0f);
            }
            if (t == 0) {
                lse[(size_t)bh * a.Tq + r] = any   ? m[mt][hf] * TC_LN2 + logf(lsum)
                                             : bad ? NAN
                                                   : -INFINITY;
            }
        }
}

/* Query tile i0 .. i0+BQ-1 of (b, h) into buffer buf of the backward's shared memory (NTH
 * threads): Q and dO rows (cp.async, not committed; rows past ql zero-filled), their lse
 * in log2 units (+inf for a row that sees no key or is padding: p = exp2(x - inf) = 0; a
 * NaN lse, scores that overflowed, carries on) and Di (0 for no row). */
template <int BQ, int D, int NTH, typename T>
__device__ static inline void bwd_load_qtile(uint16_t *Qs, uint16_t *dOs, float *L2s, float *Dis,
                                             int buf, const T *q, const T *dout,
                                             const pxt_attn_args &a, int b, int h, int i0, int ql,
                                             const float *lse_bh, const float *Di_bh) {
    constexpr int SD = D + TC_PAD;
    const int nq = min(BQ, ql - i0);
    auto ok = [&](int r) { return r < nq; };
    load_rows<BQ, D, NTH>(Qs + buf * BQ * SD, q, a.q, b, h, i0, ok);
    load_rows<BQ, D, NTH>(dOs + buf * BQ * SD, dout, a.o, b, h, i0, ok);
    if (threadIdx.x < BQ) {
        const int r = threadIdx.x;
        const float L = r < nq ? lse_bh[i0 + r] : -INFINITY;
        L2s[buf * BQ + r] = L == -INFINITY ? INFINITY : L * TC_LOG2E;
        Dis[buf * BQ + r] = r < nq && L != -INFINITY ? Di_bh[i0 + r] : 0.0f;
    }
}

/* dk, dv rows of the warp's 16 keys from j0 + 16 warp: its accumulators rounded once;
 * masked keys and keys past k_length (kval 0) get zeros, keys past Tk nothing */
template <typename T, int D>
__device__ static inline void bwd_store_kv(const pxt_attn_args &a, T *dk, T *dv,
                                           const float (&dK)[D / 8][4], const float (&dV)[D / 8][4],
                                           const unsigned char *kval, int b, int h, int j0,
                                           int warp, int lane) {
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        const int c = 16 * warp + g + 8 * hf;
        if (j0 + c >= a.Tk) {
            continue;
        }
        const bool keep = kval[c];
        T *dkr = row_ptr(dk, a.k, b, h, j0 + c), *dvr = row_ptr(dv, a.v, b, h, j0 + c);
#pragma unroll
        for (int dt = 0; dt < D / 8; dt++) {
            const int d = dt * 8 + 2 * t;
            store2<T>(dkr + d, keep ? dK[dt][2 * hf] : 0.0f, keep ? dK[dt][2 * hf + 1] : 0.0f);
            store2<T>(dvr + d, keep ? dV[dt][2 * hf] : 0.0f, keep ? dV[dt][2 * hf + 1] : 0.0f);
        }
    }
}

/* ---- backward: a warp's 16 keys against one query tile ------------------------------- */

/* The backward's two products over the head dim, sharing their k loop: s = A B^T and
 * dp = A2 B2^T for the warp's 16 rows (row0 .. of A, A2) against the NT * 8 rows of B,
 * B2, added into s and dp (fp32). The dK/dV step takes K, V against Q, dO (S^T, dP^T);
 * the dQ kernel Q, dO against K, V (S, dP). */
template <typename T, int SD, int KC, int NT>
__device__ static __forceinline__ void
tc_two_products(float (&s)[NT][4], float (&dp)[NT][4], const uint16_t *A, const uint16_t *A2,
                int row0, const uint16_t *B, const uint16_t *B2, int lane) {
#pragma unroll
    for (int kc = 0; kc < KC; kc++) {
        uint32_t fa[4], fa2[4];
        frag_a<SD>(fa, A, row0, kc, lane);
        frag_a<SD>(fa2, A2, row0, kc, lane);
#pragma unroll
        for (int np = 0; np < NT / 2; np++) {
            uint32_t bf[4];
            frag_b_nk<SD>(bf, B, np * 16, kc, lane);
            mma16816<T>(s[2 * np], fa, bf[0], bf[1]);
            mma16816<T>(s[2 * np + 1], fa, bf[2], bf[3]);
            frag_b_nk<SD>(bf, B2, np * 16, kc, lane);
            mma16816<T>(dp[2 * np], fa2, bf[0], bf[1]);
            mma16816<T>(dp[2 * np + 1], fa2, bf[2], bf[3]);
        }
    }
}

/* The step of the dK/dV kernel and of the one-pass kernel: S^T = K Q^T and dP^T = V dO^T
 * for the warp's 16 keys (rows 16 warp .. of Ks, Vs) and the tile's BQ queries (Qt, dOt;
 * L2 their lse in log2 units, Dt their Di), P^T and the scaled dS^T as the header says,
 * then dV += P^T dO and dK += dS^T Q. on_ds(kc, da) gets the dS^T fragments of each 16
 * queries (the one-pass kernel stores them for dQ). j0: the CTA's first key, jw the
 * warp's, i0 the tile's first query, kl the sample's key length, kval the CTA's key flags. */
template <typename T, int D, bool DROP, typename OnDs>
__device__ static __forceinline__ void
bwd_kv_tile(const pxt_attn_args &a, [[maybe_unused]] const pxt_dropout &drop, int b, int h,
            int warp, int lane, const uint16_t *Ks, const uint16_t *Vs, const uint16_t *Qt,
            const uint16_t *dOt, const float *L2, const float *Dt, const unsigned char *kval,
            int j0, int jw, int i0, int kl, float (&dK)[D / 8][4], float (&dV)[D / 8][4],
            OnDs on_ds) {
    constexpr int BQ = bwd_bq<D>(), SD = D + TC_PAD, KC = D / 16, NT = BQ / 8, DT = D / 8;
    const int g = lane / 4, t = lane % 4;
    const float c2 = a.scale * TC_LOG2E;

    float s[NT][4], dp[NT][4]; /* S^T, dP^T (16 keys, BQ queries) */
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            s[nt][e] = dp[nt][e] = 0.0f;
        }
    tc_two_products<T, SD, KC, NT>(s, dp, Ks, Vs, 16 * warp, Qt, dOt, lane);
    const bool need_mask =
        !tc_keys_all_ok<16>(kval + 16 * warp, lane) || (a.causal && i0 < jw + 15);
    /* dropout: lane l draws the warp's 16 keys of queries l, l + 32 (as BQ has),
     * 16 bits each; qkeep[nt][e] the bits of query nt*8 + 2t + e */
    [[maybe_unused]] uint32_t qkeep[NT][2];
    if constexpr (DROP) {
        uint32_t mine = 0;
#pragma unroll
        for (int x = 0; x < BQ / 32; x++) {
            mine |= (uint32_t)attn_keep_bits_n<16>(drop, b, h, i0 + lane + 32 * x, jw) << 16 * x;
        }
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int r = nt * 8 + 2 * t + e;
                qkeep[nt][e] = __shfl_sync(0xffffffffu, mine, r % 32) >> 16 * (r / 32);
            }
    }
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int r = nt * 8 + 2 * t + (e & 1);     /* query in the tile */
            const int c = 16 * warp + g + 8 * (e >> 1); /* key in the CTA */
            float p = tc_exp2(fmaf(s[nt][e], c2, -L2[r]));
            /* a row of no key has p = 0 through L2 = +inf, but not where c2
             * overflowed (scale > FLT_MAX / log2 e): 0 * inf is NaN */
            if ((need_mask && (!kval[c] || (a.causal && j0 + c > i0 + r))) || L2[r] == INFINITY) {
                p = 0.0f;
            }
            if constexpr (DROP) { /* dV takes P Z, dS = P (dP Z - Di) */
                const float z = qkeep[nt][e & 1] >> (g + 8 * (e >> 1)) & 1u ? drop.scale : 0.0f;
                s[nt][e] = p * z;
                dp[nt][e] = p * (dp[nt][e] * z - Dt[r]) * a.scale;
            } else {
                s[nt][e] = p;                                  /* P^T */
                dp[nt][e] = p * (dp[nt][e] - Dt[r]) * a.scale; /* dS^T, scaled */
            }
        }
#pragma unroll
    for (int kc = 0; kc < BQ / 16; kc++) { /* 16 queries at a time */
        uint32_t pa[4] = {pack2<T>(s[2 * kc][0], s[2 * kc][1]),
                          pack2<T>(s[2 * kc][2], s[2 * kc][3]),
                          pack2<T>(s[2 * kc + 1][0], s[2 * kc + 1][1]),
                          pack2<T>(s[2 * kc + 1][2], s[2 * kc + 1][3])};
        uint32_t da[4] = {pack2<T>(dp[2 * kc][0], dp[2 * kc][1]),
                          pack2<T>(dp[2 * kc][2], dp[2 * kc][3]),
                          pack2<T>(dp[2 * kc + 1][0], dp[2 * kc + 1][1]),
                          pack2<T>(dp[2 * kc + 1][2], dp[2 * kc + 1][3])};
        on_ds(kc, da);
#pragma unroll
        for (int dq = 0; dq < DT / 2; dq++) {
            uint32_t bf[4];
            frag_b_kn<SD>(bf, dOt, kc * 16, dq * 16, lane); /* dV += P^T dO */
            mma16816<T>(dV[2 * dq], pa, bf[0], bf[1]);
            mma16816<T>(dV[2 * dq + 1], pa, bf[2], bf[3]);
            frag_b_kn<SD>(bf, Qt, kc * 16, dq * 16, lane); /* dK += dS^T Q */
            mma16816<T>(dK[2 * dq], da, bf[0], bf[1]);
            mma16816<T>(dK[2 * dq + 1], da, bf[2], bf[3]);
        }
    }
}

/* ---- backward: dK, dV per 64 keys ---------------------------------------------------- */

/* dk, dv (k, v layouts) of keys j0 .. j0+63 of (b, h) */
template <typename T, int D, bool DROP>
__global__ static void __launch_bounds__(TC_THREADS)
    attn_tc_bwd_kv_kernel(pxt_attn_args a, T *dk, T *dv, const T *dout, const T *q, const T *k,
                          const T *v, const float *lse, const float *Di, int nkb) {
    [[maybe_unused]] const pxt_dropout drop = DROP ? pxt_dropout_resolve(a.drop) : a.drop;
    constexpr int BQ = bwd_bq<D>(), SD = D + TC_PAD, DT = D / 8;
    extern __shared__ __align__(16) uint16_t smem[];
    uint16_t *Ks = smem;                       /* (BK, SD) */
    uint16_t *Vs = Ks + TC_BK * SD;            /* (BK, SD) */
    uint16_t *Qs = Vs + TC_BK * SD;            /* (2, BQ, SD) double buffer */
    uint16_t *dOs = Qs + 2 * BQ * SD;          /* (2, BQ, SD) */
    float *L2s = (float *)(dOs + 2 * BQ * SD); /* (2, BQ) lse in log2 units, +inf: no row */
    float *Dis = L2s + 2 * BQ;                 /* (2, BQ) Di, 0 for no row */
    unsigned char *kval = (unsigned char *)(Dis + 2 * BQ); /* (BK) */
    const int bh = blockIdx.x / nkb, j0 = (blockIdx.x % nkb) * TC_BK;
    const int b = bh / a.H, h = bh % a.H;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int ql = q_len(a, b), kl = k_len(a, b);
    const int jw = j0 + 16 * warp; /* the warp's first key */
    const float *lse_bh = lse + (size_t)bh * a.Tq, *Di_bh = Di + (size_t)bh * a.Tq;

    auto kok = [&](int c) { return key_ok(a, b, j0 + c, kl); };
    load_rows<TC_BK, D>(Ks, k, a.k, b, h, j0, kok);
    load_rows<TC_BK, D>(Vs, v, a.v, b, h, j0, kok);
    if (threadIdx.x < TC_BK) {
        kval[threadIdx.x] = kok(threadIdx.x);
    }
    /* causal: queries before the CTA's first key see none of it */
    const int istart = a.causal ? j0 / BQ * BQ : 0;
    const int iend = j0 < kl ? ql : 0; /* a CTA past k_length has nothing to add */
    const int ntiles = iend > istart ? (iend - istart + BQ - 1) / BQ : 0;
    auto load_q = [&](int tile, int buf) {
        bwd_load_qtile<BQ, D, TC_THREADS>(Qs, dOs, L2s, Dis, buf, q, dout, a, b, h,
                                          istart + tile * BQ, ql, lse_bh, Di_bh);
    };
    if (ntiles > 0) {
        load_q(0, 0);
    }
    cp_async_commit(); /* group: K, V and query tile 0 */

    float dK[DT][4], dV[DT][4]; /* (16 keys, D) of the warp */
#pragma unroll
    for (int dt = 0; dt < DT; dt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            dK[dt][e] = dV[dt][e] = 0.0f;
        }

    for (int it = 0; it < ntiles; it++) {
        const int buf = it & 1, i0 = istart + it * BQ;
        if (it + 1 < ntiles) {
            load_q(it + 1, buf ^ 1);
        }
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        /* a warp whose keys all follow the tile's last query (causal), or are all
         * past k_length, skips it: its dK, dV stay 0 and are written as zeros */
        const bool skip = (a.causal && i0 + BQ - 1 < jw) || jw >= kl;
        if (!skip) {
            bwd_kv_tile<T, D, DROP>(a, drop, b, h, warp, lane, Ks, Vs, Qs + buf * BQ * SD,
                                    dOs + buf * BQ * SD, L2s + buf * BQ, Dis + buf * BQ, kval, j0,
                                    jw, i0, kl, dK, dV, [](int, const uint32_t (&)[4]) {});
        }
        __syncthreads();
    }
    cp_async_wait<0>();
    __syncthreads(); /* kval is complete even when no query tile ran */

    bwd_store_kv<T, D>(a, dk, dv, dK, dV, kval, b, h, j0, warp, lane);
}

/* ---- backward: dQ per 64 queries ----------------------------------------------------- */

/* dq (q layout) of rows i0 .. i0+63 of (b, h) */
template <typename T, int D, bool DROP>
__global__ static void __launch_bounds__(TC_THREADS)
    attn_tc_bwd_q_kernel(pxt_attn_args a, T *dq, const T *dout, const T *q, const T *k, const T *v,
                         const float *lse, const float *Di, int nqb) {
    [[maybe_unused]] const pxt_dropout drop = DROP ? pxt_dropout_resolve(a.drop) : a.drop;
    constexpr int BK = bwd_bq<D>(), SD = D + TC_PAD, KC = D / 16, NT = BK / 8, DT = D / 8;
    extern __shared__ __align__(16) uint16_t smem[];
    uint16_t *Qs = smem;                                       /* (BQ, SD) */
    uint16_t *dOs = Qs + TC_BQ * SD;                           /* (BQ, SD) */
    uint16_t *Ks = dOs + TC_BQ * SD;                           /* (2, BK, SD) double buffer */
    uint16_t *Vs = Ks + 2 * BK * SD;                           /* (2, BK, SD) */
    unsigned char *kval = (unsigned char *)(Vs + 2 * BK * SD); /* (2, BK) */
    const int bh = blockIdx.x / nqb, blk = blockIdx.x % nqb;
    const int b = bh / a.H, h = bh % a.H;
    const int i0 = (a.causal ? nqb - 1 - blk : blk) * TC_BQ;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int ql = q_len(a, b), kl = k_len(a, b);
    const int nq = iclamp(ql - i0, 0, TC_BQ);
    const int iw = i0 + 16 * warp;
    const bool warp_live = iw < i0 + nq;
    const float c2 = a.scale * TC_LOG2E;
    int kend = nq ? kl : 0;
    if (a.causal) {
        kend = min(kend, i0 + nq);
    }
    const int ntiles = (kend + BK - 1) / BK;

    /* rows g, g+8 of the warp: lse (log2 units, +inf: no row or no key) and Di */
    float L2[2], Dr[2];
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        const int r = iw + g + 8 * hf;
        const float L = r < i0 + nq ? lse[(size_t)bh * a.Tq + r] : -INFINITY;
        L2[hf] = L == -INFINITY ? INFINITY : L * TC_LOG2E; /* a NaN lse carries on */
        Dr[hf] = r < i0 + nq && L != -INFINITY ? Di[(size_t)bh * a.Tq + r] : 0.0f;
    }
    auto rok = [&](int r) { return r < nq; };
    load_rows<TC_BQ, D>(Qs, q, a.q, b, h, i0, rok);
    load_rows<TC_BQ, D>(dOs, dout, a.o, b, h, i0, rok);
    auto load_kv = [&](int tile, int buf) {
        const int j0 = tile * BK;
        auto ok = [&](int c) { return key_ok(a, b, j0 + c, kl); };
        load_rows<BK, D>(Ks + buf * BK * SD, k, a.k, b, h, j0, ok);
        load_rows<BK, D>(Vs + buf * BK * SD, v, a.v, b, h, j0, ok);
        if (threadIdx.x < BK) {
            kval[buf * BK + threadIdx.x] = ok(threadIdx.x);
        }
    };
    if (ntiles > 0) {
        load_kv(0, 0);
    }
    cp_async_commit();

    float dQ[DT][4]; /* (16 rows, D) of the warp */
#pragma unroll
    for (int dt = 0; dt < DT; dt++) {
        dQ[dt][0] = dQ[dt][1] = dQ[dt][2] = dQ[dt][3] = 0.0f;
    }

    for (int it = 0; it < ntiles; it++) {
        const int buf = it & 1, j0 = it * BK;
        if (it + 1 < ntiles) {
            load_kv(it + 1, buf ^ 1);
        }
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        const bool skip = !warp_live || (a.causal && j0 > iw + 15);
        if (!skip) {
            const uint16_t *Kt = Ks + buf * BK * SD, *Vt = Vs + buf * BK * SD;
            float s[NT][4], dp[NT][4]; /* S, dP (16 rows, BK keys) */
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    s[nt][e] = dp[nt][e] = 0.0f;
                }
            tc_two_products<T, SD, KC, NT>(s, dp, Qs, dOs, 16 * warp, Kt, Vt, lane);
            const bool need_mask =
                !tc_keys_all_ok<BK>(kval + buf * BK, lane) || (a.causal && j0 + BK - 1 > iw);
            [[maybe_unused]] uint64_t keep[2]; /* dropout: the keep bits of rows g, g + 8 */
            if constexpr (DROP) {
                const uint64_t mine = tc_keep_draw<16, BK>(drop, b, h, iw, j0, lane);
                keep[0] = tc_keep_gather<16, BK>(mine, g);
                keep[1] = tc_keep_gather<16, BK>(mine, g + 8);
            }
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int c = nt * 8 + 2 * t + (e & 1), hf = e >> 1;
                    float p = tc_exp2(fmaf(s[nt][e], c2, -L2[hf]));
                    if ((need_mask &&
                         (!kval[buf * BK + c] || (a.causal && j0 + c > iw + g + 8 * hf))) ||
                        L2[hf] == INFINITY) { /* a row of no key: as in the dK/dV kernel */
                        p = 0.0f;
                    }
                    if constexpr (DROP) { /* dS = P (dP Z - Di) */
                        dp[nt][e] *= keep[hf] >> c & 1u ? drop.scale : 0.0f;
                    }
                    dp[nt][e] = p * (dp[nt][e] - Dr[hf]) * a.scale; /* dS, scaled */
                }
#pragma unroll
            for (int kc = 0; kc < BK / 16; kc++) { /* dQ += dS K, 16 keys at a time */
                uint32_t sa[4] = {pack2<T>(dp[2 * kc][0], dp[2 * kc][1]),
                                  pack2<T>(dp[2 * kc][2], dp[2 * kc][3]),
                                  pack2<T>(dp[2 * kc + 1][0], dp[2 * kc + 1][1]),
                                  pack2<T>(dp[2 * kc + 1][2], dp[2 * kc + 1][3])};
#pragma unroll
                for (int dq2 = 0; dq2 < DT / 2; dq2++) {
                    uint32_t bf[4];
                    frag_b_kn<SD>(bf, Kt, kc * 16, dq2 * 16, lane);
                    mma16816<T>(dQ[2 * dq2], sa, bf[0], bf[1]);
                    mma16816<T>(dQ[2 * dq2 + 1], sa, bf[2], bf[3]);
                }
            }
        }
        __syncthreads();
    }
    cp_async_wait<0>();

#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        const int r = iw + g + 8 * hf;
        if (r >= a.Tq) {
            continue;
        }
        const bool keep = r < i0 + nq; /* rows past q_length: zeros */
        T *dst = row_ptr(dq, a.q, b, h, r);
#pragma unroll
        for (int dt = 0; dt < DT; dt++) {
            store2<T>(dst + dt * 8 + 2 * t, keep ? dQ[dt][2 * hf] : 0.0f,
                      keep ? dQ[dt][2 * hf + 1] : 0.0f);
        }
    }
}

/* ---- backward in one pass: dQ through split partials -------------------------------
 * FlashAttention-2's deterministic schedule: 5 products per (query tile, key block)
 * pair (S^T, dP^T, dV, dK, dQ) against the 7 of the two kernels above, which compute
 * S and dP twice. A CTA per (b, h, split s of S = pxt_tc_splits) of bwd1_warps warps, 16
 * keys each (a key block: 128 keys at D = 64, 64 at D = 128): it takes the key blocks
 * n = s, s + S, s + 2S, ... in turn (round robin: under the causal mask the early key
 * blocks have the most query tiles), each as the dK/dV kernel does, and per query tile
 * also stores dS^T (the 16-bit values dK's product uses) in shared memory, then adds
 * dS K (BQ, D) into its split's fp32 partial dqp[s] (S, B, H, Tq, D). No other CTA
 * touches that partial: its first key block writes the rows, later ones add, one fp32
 * add per element per key block in key-block order. attn_tc_dq_reduce_kernel sums the
 * splits in the order s = 0, 1, ..., S-1 and rounds once: the same bits every run. */

/* whether split s's partial holds row i (< q_len) of a sample of key length kl: its
 * first key block starts before kl and, causal, at or before the row's query tile (the
 * kernel's istart). Later key blocks of the split touch a subset of those rows. */
template <int BQ, int BK>
__device__ static inline bool split_has_row(const pxt_attn_args &a, int s, int i, int kl) {
    const int j0 = s * BK;
    return j0 < kl && (!a.causal || i >= j0 / BQ * BQ);
}

/* A fragment (16 rows from m0, k cols k0..k0+15) of a tile stored (k, m) */
template <int SS>
__device__ static inline void frag_a_km(uint32_t (&r)[4], const uint16_t *tile, int m0, int k0,
                                        int lane) {
    ldsm_x4_t(r,
              smem_u32(tile + (k0 + (lane / 16) * 8 + lane % 8) * SS + m0 + ((lane / 8) % 2) * 8));
}

/* dk, dv of the split's key blocks; dqp[s] (B, H, Tq, D) fp32 of rows < q_len */
template <typename T, int D, bool DROP>
__global__ static void __launch_bounds__(32 * bwd1_warps<D>())
    attn_tc_bwd_kernel(pxt_attn_args a, T *dk, T *dv, float *dqp, const T *dout, const T *q,
                       const T *k, const T *v, const float *lse, const float *Di, int nkb, int S) {
    [[maybe_unused]] const pxt_dropout drop = DROP ? pxt_dropout_resolve(a.drop) : a.drop;
    constexpr int BQ = bwd_bq<D>(), SD = D + TC_PAD, NT = BQ / 8, DT = D / 8;
    constexpr int NW = bwd1_warps<D>(), NTH = 32 * NW, BK = 16 * NW; /* 16 keys a warp */
    constexpr int SQ = BQ + TC_PAD; /* dS^T rows: 8 ldmatrix rows in 8 bank groups */
    constexpr int WQ = BQ / 16;     /* warps along the tile's rows in dQ; NW / WQ along D */
    constexpr int CW = D / (NW / WQ), CT = CW / 8; /* dQ columns of a warp, its n-tiles */
    static_assert(NW % WQ == 0 && CT % 2 == 0, "a warp's dQ is 16 rows x a multiple of 16");
    extern __shared__ __align__(16) uint16_t smem[];
    uint16_t *Ks = smem;                   /* (BK, SD) */
    uint16_t *Vs = Ks + BK * SD;           /* (BK, SD) */
    uint16_t *Qs = Vs + BK * SD;           /* (2, BQ, SD) double buffer */
    uint16_t *dOs = Qs + 2 * BQ * SD;      /* (2, BQ, SD) */
    uint16_t *dSs = dOs + 2 * BQ * SD;     /* (BK, SQ) dS^T of the tile, 16-bit */
    float *L2s = (float *)(dSs + BK * SQ); /* (2, BQ) lse in log2 units, +inf: no row */
    float *Dis = L2s + 2 * BQ;             /* (2, BQ) Di, 0 for no row */
    unsigned char *kval = (unsigned char *)(Dis + 2 * BQ); /* (BK) */
    const int bh = blockIdx.x / S, split = blockIdx.x % S;
    const int b = bh / a.H, h = bh % a.H;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int ql = q_len(a, b), kl = k_len(a, b);
    const float *lse_bh = lse + (size_t)bh * a.Tq, *Di_bh = Di + (size_t)bh * a.Tq;
    float *dqp_bh = dqp + ((size_t)split * a.B * a.H + bh) * a.Tq * D; /* (Tq, D) */
    const int qr = 16 * (warp % WQ), qc = CW * (warp / WQ);            /* the warp's dQ block */

    for (int n = split; n < nkb; n += S) {
        const int j0 = n * BK, jw = j0 + 16 * warp; /* the block's, the warp's first key */
        const bool first = n == split; /* writes its rows of the partial; later blocks add */
        auto kok = [&](int c) { return key_ok(a, b, j0 + c, kl); };
        load_rows<BK, D, NTH>(Ks, k, a.k, b, h, j0, kok);
        load_rows<BK, D, NTH>(Vs, v, a.v, b, h, j0, kok);
        if (threadIdx.x < BK) {
            kval[threadIdx.x] = kok(threadIdx.x);
        }
        const int istart = a.causal ? j0 / BQ * BQ : 0;
        const int iend = j0 < kl ? ql : 0;
        const int ntiles = iend > istart ? (iend - istart + BQ - 1) / BQ : 0;
        auto load_q = [&](int tile, int buf) {
            bwd_load_qtile<BQ, D, NTH>(Qs, dOs, L2s, Dis, buf, q, dout, a, b, h, istart + tile * BQ,
                                       ql, lse_bh, Di_bh);
        };
        if (ntiles > 0) {
            load_q(0, 0);
        }
        cp_async_commit(); /* group: K, V and query tile 0 */

        float dK[DT][4], dV[DT][4]; /* (16 keys, D) of the warp */
#pragma unroll
        for (int dt = 0; dt < DT; dt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                dK[dt][e] = dV[dt][e] = 0.0f;
            }

        for (int it = 0; it < ntiles; it++) {
            const int buf = it & 1, i0 = istart + it * BQ;
            if (it + 1 < ntiles) {
                load_q(it + 1, buf ^ 1);
            }
            cp_async_commit();
            cp_async_wait<1>();
            __syncthreads();
            const uint16_t *Qt = Qs + buf * BQ * SD, *dOt = dOs + buf * BQ * SD;
            /* a warp whose keys all follow the tile's last query (causal), or are all
             * past k_length, adds nothing to dK, dV and puts zeros in its rows of dS^T */
            const bool skip = (a.causal && i0 + BQ - 1 < jw) || jw >= kl;
            if (skip) {
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    *(uint32_t *)(dSs + (16 * warp + g) * SQ + nt * 8 + 2 * t) = 0u;
                    *(uint32_t *)(dSs + (16 * warp + g + 8) * SQ + nt * 8 + 2 * t) = 0u;
                }
            } else {
                bwd_kv_tile<T, D, DROP>(
                    a, drop, b, h, warp, lane, Ks, Vs, Qt, dOt, L2s + buf * BQ, Dis + buf * BQ,
                    kval, j0, jw, i0, kl, dK, dV, [&](int kc, const uint32_t (&da)[4]) {
                        /* dS^T rows g, g + 8 of the warp's keys, queries 16 kc + 2t (+1), + 8 */
                        uint16_t *ds = dSs + (16 * warp + g) * SQ + 16 * kc + 2 * t;
                        *(uint32_t *)ds = da[0];
                        *(uint32_t *)(ds + 8 * SQ) = da[1];
                        *(uint32_t *)(ds + 8) = da[2];
                        *(uint32_t *)(ds + 8 * SQ + 8) = da[3];
                    });
            }
            __syncthreads(); /* dS^T of every warp's keys is in shared memory */
            /* dQ (16 rows from qr, CW cols from qc) = dS K over the block's BK keys */
            float acc[CT][4];
#pragma unroll
            for (int ct = 0; ct < CT; ct++) {
                acc[ct][0] = acc[ct][1] = acc[ct][2] = acc[ct][3] = 0.0f;
            }
#pragma unroll
            for (int kc = 0; kc < BK / 16; kc++) {
                uint32_t sa[4];
                frag_a_km<SQ>(sa, dSs, qr, kc * 16, lane);
#pragma unroll
                for (int c2p = 0; c2p < CT / 2; c2p++) {
                    uint32_t bf[4];
                    frag_b_kn<SD>(bf, Ks, kc * 16, qc + c2p * 16, lane);
                    mma16816<T>(acc[2 * c2p], sa, bf[0], bf[1]);
                    mma16816<T>(acc[2 * c2p + 1], sa, bf[2], bf[3]);
                }
            }
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const int r = i0 + qr + g + 8 * hf;
                if (r >= ql) {
                    continue; /* never read: the reduction writes zeros there */
                }
                float *dst = dqp_bh + (size_t)r * D + qc + 2 * t;
#pragma unroll
                for (int ct = 0; ct < CT; ct++) {
                    float2 x = make_float2(acc[ct][2 * hf], acc[ct][2 * hf + 1]);
                    if (!first) {
                        const float2 old = *(const float2 *)(dst + ct * 8);
                        x.x = old.x + x.x;
                        x.y = old.y + x.y;
                    }
                    *(float2 *)(dst + ct * 8) = x;
                }
            }
            __syncthreads(); /* the next tile's loads and dS^T overwrite these buffers */
        }
        cp_async_wait<0>();
        __syncthreads(); /* kval is complete even when no query tile ran */

        bwd_store_kv<T, D>(a, dk, dv, dK, dV, kval, b, h, j0, warp, lane);
        __syncthreads(); /* the next key block overwrites K, V and kval */
    }
}

/* dq (q layout) = the splits' partials summed in order s = 0..S-1, rounded once; zeros
 * past q_length. A thread per pair of columns of one row. */
template <typename T, int D>
__global__ static void __launch_bounds__(TC_THREADS)
    attn_tc_dq_reduce_kernel(pxt_attn_args a, T *dq, const float *dqp, int S) {
    constexpr int BQ = bwd_bq<D>(), BK = 16 * bwd1_warps<D>();
    const int64_t e = (int64_t)blockIdx.x * TC_THREADS + threadIdx.x;
    const int64_t rows = (int64_t)a.B * a.H * a.Tq;
    if (e >= rows * (D / 2)) {
        return;
    }
    const int64_t row = e / (D / 2);
    const int d = (int)(e % (D / 2)) * 2;
    const int bh = (int)(row / a.Tq), i = (int)(row % a.Tq), b = bh / a.H, h = bh % a.H;
    float x = 0.0f, y = 0.0f;
    if (i < q_len(a, b)) {
        const int kl = k_len(a, b);
        const size_t stride = (size_t)a.B * a.H * a.Tq * D; /* one split's partial */
        const float *p = dqp + (size_t)row * D + d;
        for (int s = 0; s < S; s++) {
            if (split_has_row<BQ, BK>(a, s, i, kl)) {
                const float2 w = *(const float2 *)(p + s * stride);
                x += w.x;
                y += w.y;
            }
        }
    }
    store2<T>(row_ptr(dq, a.q, b, h, i) + d, x, y);
}

/* ---- host: launches, one instance per file ----------------------------------------- */

/* the opt-in to more than 48 KiB of dynamic shared memory, then the launch */
template <typename K, typename... Args>
static int launch(K kernel, unsigned int grid, int threads, int smem, cudaStream_t stream,
                  Args... args) {
    PXT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    kernel<<<grid, threads, smem, stream>>>(args...);
    return PXT_OK;
}

template <typename T, int D>
int attn_tc_fwd_launch(const pxt_attn_args *a, void *out, float *lse, const void *q, const void *k,
                       const void *v, cudaStream_t stream) {
    const int nqb = (a->Tq + fwd_bq<D>() - 1) / fwd_bq<D>();
    unsigned int grid = 0;
    PXT_TRY(attn_grid(a, nqb, &grid));
    if (!grid) {
        return PXT_OK;
    }
    /* the instance with dropout only where p > 0: p = 0 runs none of its code */
    PXT_TRY(
        launch(a->drop.p > 0.0f ? attn_tc_fwd_kernel<T, D, true> : attn_tc_fwd_kernel<T, D, false>,
               grid, TC_THREADS, fwd_smem_bytes<D>(), stream, *a, (T *)out, lse, (const T *)q,
               (const T *)k, (const T *)v, nqb));
    PXT_CUDA_CHECK_LAUNCH("attention_forward (tensor cores)");
    return PXT_OK;
}

/* dqp: NULL for the dK/dV and dQ kernels; else pxt_tc_split_bytes of workspace for the
 * one-pass kernel's dQ partials (attention_tc.cu says which runs) */
template <typename T, int D>
int attn_tc_bwd_launch(const pxt_attn_args *a, void *dq, void *dk, void *dv, const void *dout,
                       const void *q, const void *k, const void *v, const float *lse,
                       const float *Di, float *dqp, cudaStream_t stream) {
    if (dqp) {
        const int nkb = (a->Tk + 16 * bwd1_warps<D>() - 1) / (16 * bwd1_warps<D>());
        const int S = pxt_tc_splits(a);
        unsigned int grid = 0;
        PXT_TRY(attn_grid(a, S, &grid));
        if (grid) {
            PXT_TRY(launch(
                a->drop.p > 0.0f ? attn_tc_bwd_kernel<T, D, true> : attn_tc_bwd_kernel<T, D, false>,
                grid, 32 * bwd1_warps<D>(), bwd_smem_bytes<D>(), stream, *a, (T *)dk, (T *)dv, dqp,
                (const T *)dout, (const T *)q, (const T *)k, (const T *)v, lse, Di, nkb, S));
            PXT_CUDA_CHECK_LAUNCH("attention_backward (one pass; tensor cores)");
        }
        const int64_t pairs = (int64_t)a->B * a->H * a->Tq * (D / 2);
        const int64_t blocks = (pairs + TC_THREADS - 1) / TC_THREADS;
        if (blocks > INT32_MAX) {
            return pxt_error(PXT_ERR_VALUE, "attention: %lld blocks are more than one grid holds",
                             (long long)blocks);
        }
        if (blocks) {
            attn_tc_dq_reduce_kernel<T, D>
                <<<(unsigned int)blocks, TC_THREADS, 0, stream>>>(*a, (T *)dq, dqp, S);
            PXT_CUDA_CHECK_LAUNCH("attention_backward (dq from the splits; tensor cores)");
        }
        return PXT_OK;
    }
    const int nkb = (a->Tk + TC_BK - 1) / TC_BK, nqb = (a->Tq + TC_BQ - 1) / TC_BQ;
    unsigned int kgrid = 0, qgrid = 0;
    PXT_TRY(attn_grid(a, nkb, &kgrid));
    PXT_TRY(attn_grid(a, nqb, &qgrid));
    if (kgrid) {
        PXT_TRY(launch(a->drop.p > 0.0f ? attn_tc_bwd_kv_kernel<T, D, true>
                                        : attn_tc_bwd_kv_kernel<T, D, false>,
                       kgrid, TC_THREADS, kv_smem_bytes<D>(), stream, *a, (T *)dk, (T *)dv,
                       (const T *)dout, (const T *)q, (const T *)k, (const T *)v, lse, Di, nkb));
        PXT_CUDA_CHECK_LAUNCH("attention_backward (dk, dv; tensor cores)");
    }
    if (qgrid) {
        PXT_TRY(launch(a->drop.p > 0.0f ? attn_tc_bwd_q_kernel<T, D, true>
                                        : attn_tc_bwd_q_kernel<T, D, false>,
                       qgrid, TC_THREADS, q_smem_bytes<D>(), stream, *a, (T *)dq, (const T *)dout,
                       (const T *)q, (const T *)k, (const T *)v, lse, Di, nqb));
        PXT_CUDA_CHECK_LAUNCH("attention_backward (dq; tensor cores)");
    }
    return PXT_OK;
}

/* the instance's kernels as this binary runs them on the current device: *fwd the
 * forward's attributes (binaryVersion, ptxVersion: which code runs), *static_smem the
 * most static shared memory of its nine kernels (attention_tc_plan.h adds it) */
template <typename T, int D>
cudaError_t attn_tc_attributes(cudaFuncAttributes *fwd, size_t *static_smem) {
    cudaFuncAttributes fa[9];
    cudaError_t e[9] = {cudaFuncGetAttributes(&fa[0], attn_tc_fwd_kernel<T, D, false>),
                        cudaFuncGetAttributes(&fa[1], attn_tc_fwd_kernel<T, D, true>),
                        cudaFuncGetAttributes(&fa[2], attn_tc_bwd_kv_kernel<T, D, false>),
                        cudaFuncGetAttributes(&fa[3], attn_tc_bwd_kv_kernel<T, D, true>),
                        cudaFuncGetAttributes(&fa[4], attn_tc_bwd_q_kernel<T, D, false>),
                        cudaFuncGetAttributes(&fa[5], attn_tc_bwd_q_kernel<T, D, true>),
                        cudaFuncGetAttributes(&fa[6], attn_tc_bwd_kernel<T, D, false>),
                        cudaFuncGetAttributes(&fa[7], attn_tc_bwd_kernel<T, D, true>),
                        cudaFuncGetAttributes(&fa[8], attn_tc_dq_reduce_kernel<T, D>)};
    *static_smem = 0;
    for (int i = 0; i < 9; i++) {
        if (e[i] != cudaSuccess) {
            return e[i];
        }
        *static_smem = fa[i].sharedSizeBytes > *static_smem ? fa[i].sharedSizeBytes : *static_smem;
    }
    *fwd = fa[0];
    return cudaSuccess;
}

/* the explicit instantiation of one instance's launches: the body of a file
 * cuda/attention/tc_<dtype>_d<D>.cu */
#define PXT_ATTN_TC_INSTANCE(T, D)                                                                 \
    template int attn_tc_fwd_launch<T, D>(const pxt_attn_args *, void *, float *, const void *,    \
                                          const void *, const void *, cudaStream_t);               \
    template int attn_tc_bwd_launch<T, D>(const pxt_attn_args *, void *, void *, void *,           \
                                          const void *, const void *, const void *, const void *,  \
                                          const float *, const float *, float *, cudaStream_t);    \
    template cudaError_t attn_tc_attributes<T, D>(cudaFuncAttributes *, size_t *);

#endif /* PXT_ATTENTION_TC_CUH */
