/* attention.c (CPU): exact attention, tiled with an online softmax (FlashAttention-2).
 *
 * No Tq x Tk buffer exists anywhere: a thread holds one (BR queries) x (BC keys)
 * tile of scores at a time, in its slab of the workspace.
 *
 * forward   parallel over (b, h, query block): for each key tile, S = Qs K^T
 *           (Qs = q * scale), online softmax (running max m, sum l), O += P V;
 *           out = O / l, lse = m + log l (fp32). A row that sees no valid key
 *           gets zeros and lse = -inf.
 * backward  Di = rowsum(dO * O) first; then P = exp(S - lse) is recomputed tile by
 *           tile, dP = dO V^T, dS = P (dP - Di), with no atomics and a fixed order
 *           of every sum (bit-identical for any thread count). With at least two
 *           heads per thread, one pass per head (b, h): key blocks in order, each
 *           against the query tiles that see it, dV += P^T dO, dK += dS^T Qs, and
 *           dQ += dS K into the thread's (Tq, D) buffer (5 GEMMs per tile pair).
 *           Else two passes in one parallel region (7 GEMMs per pair, but work for
 *           every thread): over (b, h, key block) for dK, dV; over (b, h, query
 *           block) for dQ. Both modes give the same bits.
 *
 * Tiles are packed to zero-padded fp32 (16-bit inputs are converted there, math
 * is fp32, stores round to nearest even). Masked keys (key_mask, k_lengths) and
 * rows past q_lengths are never read: their tile rows are zeros, so padding that
 * holds garbage (even NaN) cannot leak into valid outputs. The backward packs rows
 * that saw no key (lse -inf) as zeros too: their q * scale may be inf.
 *
 * The tile code (micro-GEMM, exp, softmax rows) lives in attention_tile.h and is
 * compiled for AVX-512, AVX2+FMA and a generic baseline; the best one the CPU has
 * is picked at the first call (pxt_cpu_attention_set_isa overrides it, for tests).
 *
 * Dropout of the probabilities (args->drop.p > 0): the forward scales P by the
 * mask after the row sums (the lse is the undropped softmax's) and before
 * O += P V; the backward regenerates the mask tile by tile and uses P Z for dV
 * and dP Z in dS = P (dP Z - Di), Di = rowsum(dO * O) as without dropout. */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "engine/backend.h"
#include "cpu.h"

#define BR 64  /* query rows of a tile */
#define BC 64  /* keys of a tile */
#define MR 4   /* rows of a GEMM micro-tile */
#define PAD 16 /* tile widths and Dp are multiples of this many floats (64 bytes) */

typedef struct {
    const pxt_attn_args *a;
    int Dp;     /* D rounded up to PAD */
    size_t esz; /* bytes per element of q, k, v, out, ... */
    const char *q, *k, *v, *out_c, *dout;
    char *out, *dq, *dk, *dv;
    const float *lse; /* (B, H, Tq) backward input */
    float *lse_out;   /* (B, H, Tq) forward output */
    const float *Di;  /* (B, H, Tq) rowsum(dO * O), backward */
} attn_ctx;

/* ---- small helpers shared by every instruction set ---------------------------- */

static inline int imin(int x, int y) { return x < y ? x : y; }
static inline int iclamp(int x, int lo, int hi) { return x < lo ? lo : x > hi ? hi : x; }
static inline int round_up(int x, int m) { return (x + m - 1) / m * m; }

/* Valid query rows / keys of sample b (lengths clamped to the sequence). */
static inline int q_len(const pxt_attn_args *a, int b) {
    return a->q_lengths ? iclamp(a->q_lengths[b], 0, a->Tq) : a->Tq;
}
static inline int k_len(const pxt_attn_args *a, int b) {
    return a->k_lengths ? iclamp(a->k_lengths[b], 0, a->Tk) : a->Tk;
}

/* live[i] for query rows 0 .. n-1 of a tile: the row saw a key (its lse is not -inf). */
static inline void live_rows(const float *lse, int n, uint8_t *live) {
    for (int i = 0; i < n; i++) {
        live[i] = lse[i] != -INFINITY;
    }
}

/* valid[j] for keys j0 .. j0+n-1 of sample b by key_mask; returns how many are. */
static inline int key_valid(const pxt_attn_args *a, int b, int j0, int n, uint8_t *valid) {
    if (!a->key_mask) {
        memset(valid, 1, (size_t)n);
        return n;
    }
    const uint8_t *km = a->key_mask + (size_t)b * a->Tk + j0;
    int count = 0;
    for (int j = 0; j < n; j++) {
        count += valid[j] = km[j] != 0;
    }
    return count;
}

/* Row t of head (b, h) of an operand laid out by s. */
static inline char *row_ptr(const attn_ctx *c, const void *base, const pxt_strides *s, int b, int h,
                            int t) {
    int64_t e = (int64_t)b * s->b + (int64_t)h * s->h + (int64_t)t * s->t;
    return (char *)base + e * (int64_t)c->esz;
}

static inline float bf16_load(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* dst (D) in dt = mul * src (D), rounded to nearest even. */
static inline void store_row(char *restrict dst, const float *restrict src, int D, pxt_dtype dt,
                             float mul) {
    if (dt == PXT_FLOAT32) {
        float *o = (float *)dst;
#pragma omp simd
        for (int d = 0; d < D; d++) {
            o[d] = src[d] * mul;
        }
    } else if (dt == PXT_BFLOAT16) {
        uint16_t *o = (uint16_t *)dst;
        for (int d = 0; d < D; d++) {
            o[d] = pxt_f32_to_bf16(src[d] * mul);
        }
    } else {
        uint16_t *o = (uint16_t *)dst;
        for (int d = 0; d < D; d++) {
            o[d] = pxt_f32_to_f16(src[d] * mul);
        }
    }
}

/* ---- dropout of the probabilities ---------------------------------------------------
 * The mask of (b, h, query i, key j) comes from dropout.h (its positions, its
 * sample), drawn eight keys per Philox call. A tile holds queries i0 .. i0+nq-1
 * against keys j0 .. j0+nk-1; element (i, j) sits at t[i * qs + j * ks], so the
 * forward's (keys, queries) tiles and the backward's (queries, keys) ones share
 * this code. assign: t = mask factor (0 or 1 / (1 - p)); else t *= it. */
static void dropout_tile(const pxt_attn_args *a, float *t, int qs, int ks, int b, int h, int i0,
                         int nq, int j0, int nk, int assign) {
    const pxt_dropout *d = &a->drop;
    for (int i = 0; i < nq; i++) {
        uint32_t qpos = pxt_dropout_pos(d, i0 + i), w[4] = {0, 0, 0, 0}, group = 0;
        for (int j = 0; j < nk; j++) {
            uint32_t kpos = pxt_dropout_pos(d, j0 + j);
            if (j == 0 || kpos >> 3 != group) { /* a new group of eight keys */
                group = kpos >> 3;
                pxt_dropout_attn_words(d, b, h, qpos, kpos, w);
            }
            float z = pxt_dropout_attn_kept(d, w, kpos) ? d->scale : 0.0f;
            float *e = t + (size_t)i * qs + (size_t)j * ks;
            *e = assign ? z : *e * z;
        }
    }
}

/* ---- the tile code, once per instruction set ------------------------------------ */

typedef void (*attn_item_fn)(const attn_ctx *c, float *ws, int b, int h, int block);

typedef struct {
    const char *name;
    attn_item_fn fwd, bwd_kv, bwd_q, bwd_head;
    float (*di)(const attn_ctx *c, int b, int h, int i); /* rowsum(dO * O) of one row */
} attn_isa;

#define TILE_CAT2(a, b) a##_##b
#define TILE_CAT(a, b) TILE_CAT2(a, b)
#define TILE(name) TILE_CAT(name, TILE_ISA)

/* generic: 4-wide GCC vectors (SSE2 on x86-64, whatever the target has elsewhere) */
typedef float attn_v4f __attribute__((vector_size(16)));
typedef int32_t attn_v4i __attribute__((vector_size(16)));
static inline attn_v4f v4_select(attn_v4i m, attn_v4f x, attn_v4f y) {
    return (attn_v4f)((m & (attn_v4i)x) | (~m & (attn_v4i)y));
}
#define TILE_ISA generic
#define VF attn_v4f
#define VI attn_v4i
#define VW 4
#define NVMAX 2
#define VSET1(x) ((attn_v4f){0.0f, 0.0f, 0.0f, 0.0f} + (float)(x))
#define VFMA(a, b, c) ((a) * (b) + (c))
#define VMAX(a, b) v4_select((a) > (b), (a), (b))
#define VMIN(a, b) v4_select((a) < (b), (a), (b))
#include "attention_tile.h" /* undefines the parameters above */
static const attn_isa isa_generic = {"generic",          fwd_item_generic,      bwd_kv_item_generic,
                                     bwd_q_item_generic, bwd_head_item_generic, di_row_generic};

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define ATTN_X86 1

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#define TILE_ISA avx2
#define LOAD_F16(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(p)))
#define VF __m256
#define VI __v8si
#define VW 8
#define NVMAX 2
#define VSET1(x) _mm256_set1_ps(x)
#define VFMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define VMAX(a, b) _mm256_max_ps(a, b)
#define VMIN(a, b) _mm256_min_ps(a, b)
#include "attention_tile.h" /* undefines the parameters above */
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma,f16c")
#define TILE_ISA avx512
#define LOAD_F16(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(p)))
#define VF __m512
#define VI __v16si
#define VW 16
#define NVMAX 4
#define VSET1(x) _mm512_set1_ps(x)
#define VFMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define VMAX(a, b) _mm512_max_ps(a, b)
#define VMIN(a, b) _mm512_min_ps(a, b)
#include "attention_tile.h" /* undefines the parameters above */
#pragma GCC pop_options

static const attn_isa isa_avx2 = {"avx2",          fwd_item_avx2,      bwd_kv_item_avx2,
                                  bwd_q_item_avx2, bwd_head_item_avx2, di_row_avx2};
static const attn_isa isa_avx512 = {"avx512",          fwd_item_avx512,      bwd_kv_item_avx512,
                                    bwd_q_item_avx512, bwd_head_item_avx512, di_row_avx512};
#endif

/* ---- instruction set selection ------------------------------------------------ */

static const attn_isa *isa_best(void) {
#ifdef ATTN_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx2") &&
        __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) {
        return &isa_avx512;
    }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("f16c")) {
        return &isa_avx2;
    }
#endif
    return &isa_generic;
}

/* Set by pxt_cpu_attention_set_isa (tests), else the best one; a plain pointer:
 * switching while another thread runs attention is not supported. */
static const attn_isa *isa_active;

static const attn_isa *isa(void) {
    if (!isa_active) {
        isa_active = isa_best();
    }
    return isa_active;
}

int pxt_cpu_attention_set_isa(const char *name) {
    if (!name || !strcmp(name, "auto")) {
        isa_active = isa_best();
        return PXT_OK;
    }
    if (!strcmp(name, "generic")) {
        isa_active = &isa_generic;
        return PXT_OK;
    }
#ifdef ATTN_X86
    __builtin_cpu_init();
    int have2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                __builtin_cpu_supports("f16c");
    if (!strcmp(name, "avx2") && have2) {
        isa_active = &isa_avx2;
        return PXT_OK;
    }
    if (!strcmp(name, "avx512") && have2 && __builtin_cpu_supports("avx512f")) {
        isa_active = &isa_avx512;
        return PXT_OK;
    }
#endif
    return pxt_error(PXT_ERR_VALUE,
                     "isa: expected 'auto', 'generic', 'avx2' or 'avx512' that this CPU supports, "
                     "got '%s'",
                     name);
}

const char *pxt_cpu_attention_isa(void) { return isa()->name; }

/* ---- workspace -------------------------------------------------------------------- */

static int attn_threads(void) {
    int n = omp_get_max_threads();
    return n > 0 ? n : 1;
}

/* The backward runs in one pass per head (b, h) when there are enough heads
 * to keep every thread busy, else in two passes over key and query blocks; the
 * results are bit-identical either way (see attention_tile.h). */
static int one_pass(const pxt_attn_args *a, int nt) {
    return (int64_t)a->B * a->H >= 2 * (int64_t)nt;
}

/* Floats of one thread's slab (every buffer a multiple of PAD floats). The
 * backward slab fits both modes whenever one pass is possible at some thread
 * count, so a run with fewer threads than the workspace was sized for (say
 * threadpoolctl lowered OpenMP's count in between) still fits. */
static size_t slab_floats_raw(const pxt_attn_args *a, size_t Dp, int backward) {
    if (!backward) { /* QT, K, V rows, P^T, O, m, l, alpha */
        return Dp * BR + 2 * BC * Dp + BC * BR + BR * Dp + 3 * BR;
    }
    /* with dropout, both passes hold a tile of mask factors */
    size_t z = a->drop.p > 0.0f ? (size_t)BR * BC : 0;
    /* K^T, V^T, K rows, dK, dV, q and dout rows, P, dS, -lse, Di, key masks, mask */
    size_t pair = 2 * Dp * BC + 3 * BC * Dp + 2 * BR * Dp + 2 * BR * BC + 2 * BR + BC + z;
    if (one_pass(a, 1)) { /* plus dQ of the whole head */
        pair += (size_t)round_up(a->Tq, PAD) * Dp;
    }
    /* q^T, dout^T, dQ, K, V rows, S^T, dS^T, -lse, Di, mask */
    size_t q = 2 * Dp * BR + BR * Dp + 2 * BC * Dp + 2 * BC * BR + 2 * BR + z;
    return pair > q ? pair : q;
}

static size_t slab_floats(const pxt_attn_args *a, size_t Dp, int backward) {
    size_t n = slab_floats_raw(a, Dp, backward);
    return (n + PAD - 1) / PAD * PAD; /* every thread's slab stays 64-byte aligned */
}

static size_t di_floats(const pxt_attn_args *a) {
    return ((size_t)a->B * a->H * a->Tq + PAD - 1) / PAD * PAD;
}

/* threads x slab (per-thread tiles; for one pass, one head's dQ), plus Di
 * (B, H, Tq) for backward, plus alignment: linear in Tq, constant in Tk. Sized
 * for omp_get_max_threads() of the calling thread: run the kernel with at most
 * that many. */
size_t pxt_cpu_attention_workspace(const pxt_attn_args *a, int backward) {
    if (!a || a->D < 1 || a->Tq < 0 || a->B < 0 || a->H < 0) {
        return 0;
    }
    size_t Dp = (size_t)round_up(a->D, PAD);
    size_t floats = (size_t)attn_threads() * slab_floats(a, Dp, backward);
    if (backward) {
        floats += di_floats(a);
    }
    return floats * sizeof(float) + 64;
}

static int check_args(const pxt_attn_args *a, const void *workspace) {
    if (!a) {
        return pxt_error(PXT_ERR_VALUE, "attention: no arguments");
    }
    if (a->B < 0 || a->H < 0 || a->Tq < 0 || a->Tk < 0 || a->D < 1) {
        return pxt_error(PXT_ERR_VALUE,
                         "attention: expected B, H, Tq, Tk >= 0 and D >= 1, got B=%d H=%d Tq=%d "
                         "Tk=%d D=%d",
                         a->B, a->H, a->Tq, a->Tk, a->D);
    }
    if ((int64_t)a->B * a->H > INT32_MAX) {
        return pxt_error(PXT_ERR_VALUE, "attention: B*H=%lld heads is more than 2^31 - 1",
                         (long long)a->B * a->H);
    }
    if (a->D > (1 << 20)) {
        return pxt_error(PXT_ERR_VALUE, "attention: head dim D=%d is larger than 1048576", a->D);
    }
    if (a->dt != PXT_FLOAT32 && a->dt != PXT_FLOAT16 && a->dt != PXT_BFLOAT16) {
        return pxt_error(PXT_ERR_TYPE,
                         "attention: expected dtype float32, float16 or bfloat16, got %s",
                         pxt_dtype_name(a->dt));
    }
    if (!workspace) {
        return pxt_error(PXT_ERR_VALUE, "attention: no workspace (attention_workspace bytes)");
    }
    if (!(a->drop.p >= 0.0f && a->drop.p < 1.0f)) {
        return pxt_error(PXT_ERR_VALUE, "attention: dropout probability must be in [0, 1), got %g",
                         (double)a->drop.p);
    }
    return PXT_OK;
}

static float *ws_base(void *workspace) {
    uintptr_t p = ((uintptr_t)workspace + 63) & ~(uintptr_t)63;
    return (float *)p;
}

/* ---- the table entries ------------------------------------------------------------ */

int pxt_cpu_attention_forward(int index, const pxt_attn_args *a, void *out, float *lse,
                              const void *q, const void *k, const void *v, void *workspace) {
    (void)index;
    int rc = check_args(a, workspace);
    if (rc != PXT_OK) {
        return rc;
    }
    pxt_attn_args resolved = *a; /* the dropout's key read here: host memory */
    resolved.drop = pxt_dropout_resolve(a->drop);
    a = &resolved;
    attn_ctx c = {.a = a,
                  .Dp = round_up(a->D, PAD),
                  .esz = pxt_dtype_size(a->dt),
                  .q = q,
                  .k = k,
                  .v = v,
                  .out = out,
                  .lse_out = lse};
    const int nqb = (a->Tq + BR - 1) / BR, BH = a->B * a->H;
    const int64_t total = (int64_t)BH * nqb;
    if (total == 0) {
        return PXT_OK;
    }
    const attn_isa *is = isa();
    int nt = attn_threads();
    const size_t slab = slab_floats(a, (size_t)c.Dp, 0);
    float *base = ws_base(workspace);
    if (nt > total) {
        nt = (int)total;
    }
#pragma omp parallel num_threads(nt)
    {
        float *ws = base + (size_t)omp_get_thread_num() * slab;
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < total; t++) { /* a head's blocks in a row: K, V in cache */
            int bh = (int)(t / nqb), blk = (int)(t % nqb);
            int qb = a->causal ? nqb - 1 - blk : blk; /* the longest rows first */
            is->fwd(&c, ws, bh / a->H, bh % a->H, qb);
        }
    }
    return PXT_OK;
}

int pxt_cpu_attention_backward(int index, const pxt_attn_args *a, void *dq, void *dk, void *dv,
                               const void *dout, const void *q, const void *k, const void *v,
                               const void *out, const float *lse, void *workspace) {
    (void)index;
    int rc = check_args(a, workspace);
    if (rc != PXT_OK) {
        return rc;
    }
    pxt_attn_args resolved = *a; /* the dropout's key read here: host memory */
    resolved.drop = pxt_dropout_resolve(a->drop);
    a = &resolved;
    attn_ctx c = {.a = a,
                  .Dp = round_up(a->D, PAD),
                  .esz = pxt_dtype_size(a->dt),
                  .q = q,
                  .k = k,
                  .v = v,
                  .out_c = out,
                  .dout = dout,
                  .dq = dq,
                  .dk = dk,
                  .dv = dv,
                  .lse = lse};
    const int BH = a->B * a->H;
    const int nqb = (a->Tq + BR - 1) / BR, nkb = (a->Tk + BC - 1) / BC;
    const int64_t nq_items = (int64_t)BH * nqb, nk_items = (int64_t)BH * nkb;
    const int64_t rows = (int64_t)BH * a->Tq;
    if (nq_items + nk_items == 0) {
        return PXT_OK;
    }
    const attn_isa *is = isa();
    int nt = attn_threads();
    const int per_head = one_pass(a, nt);
    const size_t slab = slab_floats(a, (size_t)c.Dp, 1);
    float *base = ws_base(workspace);
    float *Di = base + (size_t)nt * slab; /* (B, H, Tq) */
    c.Di = Di;
#pragma omp parallel num_threads(nt)
    {
        float *ws = base + (size_t)omp_get_thread_num() * slab;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) { /* Di = rowsum(dO * O), 0 past q_length */
            int bh = (int)(r / a->Tq), i = (int)(r % a->Tq), b = bh / a->H, h = bh % a->H;
            Di[r] = i < q_len(a, b) ? is->di(&c, b, h, i) : 0.0f;
        }
        /* implicit barrier: Di is complete */
        if (per_head) {
#pragma omp for schedule(dynamic, 1)
            for (int64_t t = 0; t < BH; t++) {
                is->bwd_head(&c, ws, (int)(t / a->H), (int)(t % a->H), 0);
            }
        } else {
            /* both passes, longest items first; threads done with dQ items go on
             * to dK/dV ones (nowait) */
#pragma omp for schedule(dynamic, 1) nowait
            for (int64_t t = 0; t < nq_items; t++) {
                int bh = (int)(t / nqb), blk = (int)(t % nqb);
                int qb = a->causal ? nqb - 1 - blk : blk;
                is->bwd_q(&c, ws, bh / a->H, bh % a->H, qb);
            }
#pragma omp for schedule(dynamic, 1)
            for (int64_t t = 0; t < nk_items; t++) {
                int bh = (int)(t / nkb), kb = (int)(t % nkb);
                is->bwd_kv(&c, ws, bh / a->H, bh % a->H, kb);
            }
        }
    }
    return PXT_OK;
}

#undef BR
#undef BC
#undef MR
#undef PAD
#undef TILE_CAT2
#undef TILE_CAT
#undef TILE
#undef ATTN_X86
