/* attention_tile.h: the hot tile code of CPU attention, instantiated once per
 * instruction set by cpu/attention.c (no include guard on purpose).
 *
 * The includer defines, before each inclusion:
 *   TILE(name)       name with the instruction set's suffix (name_avx512, ...)
 *   VF, VI, VW       float and int32 vector types and their width in floats
 *   NVMAX            vectors per row of a GEMM micro-tile (MR rows x NVMAX*VW columns)
 *   VSET1(x), VFMA(a, b, c) (= a * b + c), VMAX(a, b), VMIN(a, b) (both return b
 *                    where either is NaN, so NaN propagates through VMAX(lo, x))
 *   LOAD_F16(p)      optional: VW float16 at p as a VF (F16C), else a scalar loop
 * and undefines them all at its end, ready for the next instruction set; it uses
 * the shared definitions: attn_ctx, the tile sizes, the packing helpers.
 *
 * Tiles are fp32 and zero-padded: a row of a (rows, Dp) tile holds D values then
 * zeros; a transposed (Dp, BR|BC) tile holds one query/key per column. Every GEMM
 * width is a multiple of PAD floats, so vectors never straddle an end.
 *
 * Each work item transposes its own block once (q for a query block, k and v
 * for a key block); the tiles it streams through are plain row copies. */

typedef uint32_t TILE(vu) __attribute__((vector_size(VW * 4)));
typedef uint16_t TILE(vh) __attribute__((vector_size(VW * 2)));

static inline VF TILE(vload)(const float *p) {
    VF v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void TILE(vstore)(float *p, VF v) { memcpy(p, &v, sizeof v); }

static inline VF TILE(vsel)(VI m, VF a, VF b) { return (VF)((m & (VI)a) | (~m & (VI)b)); }

/* e^x for x <= 88 (Cephes expf: 2^n * poly(r), |r| <= ln2/2, ~1 ulp). x below
 * -87.3 (e^x under FLT_MIN) and -inf give exactly 0; NaN stays NaN. */
static inline VF TILE(vexp)(VF x) {
    const VF lo = VSET1(-87.33f), hi = VSET1(88.37f), magic = VSET1(12582912.0f); /* 1.5 * 2^23 */
    VI keep = ~(VI)(x < lo);
    x = VMIN(hi, VMAX(lo, x));
    VF t = VFMA(x, VSET1(1.44269504088896341f), magic);
    VF n = t - magic;                            /* round(x / ln2), exact */
    TILE(vu) ni = (TILE(vu))t - (TILE(vu))magic; /* the same as an int (mod 2^32) */
    VF r = VFMA(n, VSET1(-0.693359375f), x);     /* x - n ln2, in two steps */
    r = VFMA(n, VSET1(2.12194440e-4f), r);
    VF p = VSET1(1.9875691500e-4f);
    p = VFMA(p, r, VSET1(1.3981999507e-3f));
    p = VFMA(p, r, VSET1(8.3334519073e-3f));
    p = VFMA(p, r, VSET1(4.1665795894e-2f));
    p = VFMA(p, r, VSET1(1.6666665459e-1f));
    p = VFMA(p, r, VSET1(5.0000001201e-1f));
    p = VFMA(p, r * r, r + VSET1(1.0f));
    VF scale = (VF)((ni + 127u) << 23); /* 2^n, n in [-126, 128) */
    return (VF)((VI)(p * scale) & keep);
}

/* ---- loading tiles ------------------------------------------------------------ */

/* dst (D) = mul * src (D) converted from dt (bf16 and f16 exactly, then one
 * rounding of the product). */
static inline void TILE(load_row)(float *restrict dst, const char *restrict src, int D,
                                  pxt_dtype dt, float mul) {
    const VF mv = VSET1(mul);
    int d = 0;
    if (dt == PXT_FLOAT32) {
        const float *s = (const float *)(const void *)src;
        for (; d + VW <= D; d += VW) {
            TILE(vstore)(dst + d, TILE(vload)(s + d) * mv);
        }
        for (; d < D; d++) {
            dst[d] = s[d] * mul;
        }
    } else if (dt == PXT_BFLOAT16) {
        const uint16_t *s = (const uint16_t *)(const void *)src;
        for (; d + VW <= D; d += VW) {
            TILE(vh) hv;
            memcpy(&hv, s + d, sizeof hv);
            TILE(vu) w = __builtin_convertvector(hv, TILE(vu)) << 16;
            TILE(vstore)(dst + d, (VF)w * mv);
        }
        for (; d < D; d++) {
            dst[d] = bf16_load(s[d]) * mul;
        }
    } else {
        const uint16_t *s = (const uint16_t *)(const void *)src;
#ifdef LOAD_F16
        for (; d + VW <= D; d += VW) {
            TILE(vstore)(dst + d, LOAD_F16(s + d) * mv);
        }
#endif
        for (; d < D; d++) {
            dst[d] = pxt_f16_to_f32(s[d]) * mul;
        }
    }
}

/* Packs rows r < n (stride bytes apart, valid[r] != 0 when valid is given) into
 * dst (nfill, ld) as fp32 times mul, zero-padded to Dp; other rows are zeros. */
static void TILE(pack_rows)(float *restrict dst, int ld, int nfill, const char *src, int64_t stride,
                            int n, const uint8_t *valid, int D, int Dp, pxt_dtype dt, float mul) {
    for (int r = 0; r < nfill; r++) {
        float *d = dst + (size_t)r * ld;
        if (r < n && (!valid || valid[r])) {
            TILE(load_row)(d, src + r * stride, D, dt, mul);
            memset(d + D, 0, (size_t)(Dp - D) * sizeof *d);
        } else {
            memset(d, 0, (size_t)Dp * sizeof *d);
        }
    }
}

/* The same rows as the columns of dst (D, ld): dst[d * ld + r]; columns up to nfill. */
static void TILE(pack_cols)(float *restrict dst, int ld, int nfill, const char *src, int64_t stride,
                            int n, const uint8_t *valid, int D, pxt_dtype dt, float mul) {
    float row[256]; /* a row goes through here in chunks */
    const int chunk = (int)(sizeof row / sizeof row[0]);
    for (int r = 0; r < nfill; r++) {
        if (r < n && (!valid || valid[r])) {
            for (int d0 = 0; d0 < D; d0 += chunk) {
                int nd = imin(D - d0, chunk);
                TILE(load_row)(row, src + r * stride + (int64_t)d0 * (int64_t)pxt_dtype_size(dt),
                               nd, dt, mul);
                for (int d = 0; d < nd; d++) {
                    dst[(size_t)(d0 + d) * ld + r] = row[d];
                }
            }
        } else {
            for (int d = 0; d < D; d++) {
                dst[(size_t)d * ld + r] = 0.0f;
            }
        }
    }
}

/* Di = rowsum(dO * O) of query row i of head (b, h), fp32, in a fixed order. */
static float TILE(di_row)(const attn_ctx *c, int b, int h, int i) {
    const pxt_attn_args *a = c->a;
    const char *op = row_ptr(c, c->out_c, &a->o, b, h, i);
    const char *dp = row_ptr(c, c->dout, &a->o, b, h, i);
    float o[256], g[256];
    const int chunk = (int)(sizeof o / sizeof o[0]);
    VF acc = VSET1(0.0f);
    float tail = 0.0f;
    for (int d0 = 0; d0 < a->D; d0 += chunk) {
        int nd = imin(a->D - d0, chunk), d = 0;
        TILE(load_row)(o, op + (size_t)d0 * c->esz, nd, a->dt, 1.0f);
        TILE(load_row)(g, dp + (size_t)d0 * c->esz, nd, a->dt, 1.0f);
        for (; d + VW <= nd; d += VW) {
            acc = VFMA(TILE(vload)(o + d), TILE(vload)(g + d), acc);
        }
        for (; d < nd; d++) {
            tail += o[d] * g[d];
        }
    }
    for (int l = 0; l < VW; l++) {
        tail += acc[l];
    }
    return tail;
}

/* ---- GEMM on tiles: C (M, N) (+)= op(A) (M, K) . B (K, N) ---------------------
 * op(A) is A stored (M, K) row-major, or with ta A stored (K, M) (element (m, k)
 * at A[k * lda + m]). M a multiple of MR, N of VW. Each element of C is one FMA
 * chain over k in order, starting from C (acc) or 0: the same bits whatever the
 * tiling around it. The micro-tile keeps MR x nv vectors of C in registers. */
static inline __attribute__((always_inline)) void TILE(micro)(const int ta, const int nv, int K,
                                                              const float *restrict A, int lda,
                                                              const float *restrict B, int ldb,
                                                              float *restrict C, int ldc, int acc) {
    VF c[MR][NVMAX];
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 8
        for (int v = 0; v < nv; v++) {
            c[r][v] = acc ? TILE(vload)(C + (size_t)r * ldc + v * VW) : VSET1(0.0f);
        }
    for (int k = 0; k < K; k++) {
        VF bv[NVMAX];
        const float *b = B + (size_t)k * ldb;
#pragma GCC unroll 8
        for (int v = 0; v < nv; v++) {
            bv[v] = TILE(vload)(b + v * VW);
        }
#pragma GCC unroll 8
        for (int r = 0; r < MR; r++) {
            VF a = VSET1(ta ? A[(size_t)k * lda + r] : A[(size_t)r * lda + k]);
#pragma GCC unroll 8
            for (int v = 0; v < nv; v++) {
                c[r][v] = VFMA(a, bv[v], c[r][v]);
            }
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 8
        for (int v = 0; v < nv; v++) {
            TILE(vstore)(C + (size_t)r * ldc + v * VW, c[r][v]);
        }
}

static inline __attribute__((always_inline)) void
TILE(gemm_any)(const int ta, int M, int N, int K, const float *restrict A, int lda,
               const float *restrict B, int ldb, float *restrict C, int ldc, int acc) {
#define A_ROWS(m) (ta ? A + (m) : A + (size_t)(m) * lda)
    int n = 0;
    for (; n + NVMAX * VW <= N; n += NVMAX * VW) { /* B's panel (K, NVMAX*VW) stays in L1 */
        for (int m = 0; m < M; m += MR) {
            TILE(micro)(ta, NVMAX, K, A_ROWS(m), lda, B + n, ldb, C + (size_t)m * ldc + n, ldc,
                        acc);
        }
    }
#if NVMAX > 2
    for (; n + 2 * VW <= N; n += 2 * VW) {
        for (int m = 0; m < M; m += MR) {
            TILE(micro)(ta, 2, K, A_ROWS(m), lda, B + n, ldb, C + (size_t)m * ldc + n, ldc, acc);
        }
    }
#endif
    for (; n < N; n += VW) {
        for (int m = 0; m < M; m += MR) {
            TILE(micro)(ta, 1, K, A_ROWS(m), lda, B + n, ldb, C + (size_t)m * ldc + n, ldc, acc);
        }
    }
#undef A_ROWS
}

/* C = A B (A row-major) and C = A^T B (A stored (K, M)). */
static void TILE(gemm)(int M, int N, int K, const float *restrict A, int lda,
                       const float *restrict B, int ldb, float *restrict C, int ldc, int acc) {
    TILE(gemm_any)(0, M, N, K, A, lda, B, ldb, C, ldc, acc);
}

static void TILE(gemm_at)(int M, int N, int K, const float *restrict A, int lda,
                          const float *restrict B, int ldb, float *restrict C, int ldc, int acc) {
    TILE(gemm_any)(1, M, N, K, A, lda, B, ldb, C, ldc, acc);
}

static inline void TILE(fill)(float *p, int n, float v) {
    for (int i = 0; i < n; i++) {
        p[i] = v;
    }
}

/* ---- forward: one (b, h, query block) ------------------------------------------
 * Scores are held transposed, S^T (keys, queries), so the online softmax runs
 * down the columns with plain vector max/add (one query per lane). */
static void TILE(fwd_item)(const attn_ctx *c, float *ws, int b, int h, int qb) {
    const pxt_attn_args *a = c->a;
    const int D = a->D, Dp = c->Dp, i0 = qb * BR;
    const int nrows = imin(BR, a->Tq - i0);
    const int nq = iclamp(q_len(a, b) - i0, 0, nrows); /* rows that are computed */
    const int64_t kst = a->k.t * (int64_t)c->esz, vst = a->v.t * (int64_t)c->esz;
    float *QT = ws;                   /* (Dp, BR) q * scale, one query per column */
    float *Kr = QT + (size_t)Dp * BR; /* (BC, Dp) key rows */
    float *Vr = Kr + (size_t)BC * Dp; /* (BC, Dp) value rows */
    float *PT = Vr + (size_t)BC * Dp; /* (BC, BR) scores^T, then P^T */
    float *O = PT + (size_t)BC * BR;  /* (BR, Dp) unnormalised output rows */
    float *m = O + (size_t)BR * Dp;   /* (BR) running max per query */
    float *l = m + BR;                /* (BR) running sum */
    float *alpha = l + BR;            /* (BR) rescale of this tile */
    uint8_t valid[BC];
    uint8_t seen[BR]; /* query i has an unmasked key: no l > 0 then means overflow or NaN */
    float *lse = c->lse_out + ((size_t)b * a->H + h) * a->Tq;

    if (nq > 0) {
        const int Mr = round_up(nq, MR), Nq = round_up(nq, PAD);
        int kend = k_len(a, b);
        if (a->causal) {
            kend = imin(kend, i0 + nq);
        }
        TILE(pack_cols)(QT, BR, Nq, row_ptr(c, c->q, &a->q, b, h, i0), a->q.t * (int64_t)c->esz, nq,
                        NULL, D, a->dt, a->scale);
        TILE(fill)(m, Nq, -INFINITY);
        TILE(fill)(l, Nq, 0.0f);
        memset(O, 0, (size_t)Mr * Dp * sizeof *O);
        memset(seen, 0, sizeof seen);
        for (int j0 = 0; j0 < kend; j0 += BC) {
            const int nk = imin(BC, kend - j0), Mk = round_up(nk, MR);
            if (!key_valid(a, b, j0, nk, valid)) {
                continue;
            }
            int jv = 0; /* the tile's first unmasked key: query i sees it unless causal hides it */
            while (jv < nk && !valid[jv]) {
                jv++;
            }
            for (int i = 0; i < nq && jv < nk; i++) {
                seen[i] |= !a->causal || j0 + jv <= i0 + i;
            }
            TILE(pack_rows)(Kr, Dp, Mk, row_ptr(c, c->k, &a->k, b, h, j0), kst, nk, valid, D, Dp,
                            a->dt, 1.0f);
            TILE(pack_rows)(Vr, Dp, nk, row_ptr(c, c->v, &a->v, b, h, j0), vst, nk, valid, D, Dp,
                            a->dt, 1.0f);
            TILE(gemm)(Mk, Nq, D, Kr, Dp, QT, BR, PT, BR, 0); /* S^T = K Qs^T */
            for (int j = 0; j < Mk; j++) {                    /* masks: -inf */
                float *row = PT + (size_t)j * BR;
                if (j >= nk || !valid[j]) {
                    TILE(fill)(row, Nq, -INFINITY);
                } else if (a->causal) { /* queries i0+i < j0+j do not see key j0+j */
                    TILE(fill)(row, iclamp(j0 + j - i0, 0, Nq), -INFINITY);
                }
            }
            for (int i = 0; i < Nq; i += VW) {
                VF mx = VSET1(-INFINITY);
                for (int j = 0; j < Mk; j++) {
                    mx = VMAX(TILE(vload)(PT + (size_t)j * BR + i), mx);
                }
                VF m_old = TILE(vload)(m + i), m_new = VMAX(mx, m_old);
                /* a query with no valid key so far subtracts 0: exp(-inf - 0) = 0 */
                VF m_use = TILE(vsel)((VI)(m_new == VSET1(-INFINITY)), VSET1(0.0f), m_new);
                VF al = TILE(vexp)(m_old - m_use), sum = VSET1(0.0f);
                for (int j = 0; j < Mk; j++) {
                    float *p = PT + (size_t)j * BR + i;
                    VF pv = TILE(vexp)(TILE(vload)(p) - m_use);
                    TILE(vstore)(p, pv);
                    sum += pv;
                }
                TILE(vstore)(l + i, VFMA(TILE(vload)(l + i), al, sum));
                TILE(vstore)(m + i, m_new);
                TILE(vstore)(alpha + i, al);
            }
            for (int i = 0; i < nq; i++) {
                if (alpha[i] != 1.0f) {
                    VF av = VSET1(alpha[i]);
                    float *o = O + (size_t)i * Dp;
                    for (int d = 0; d < Dp; d += VW) {
                        TILE(vstore)(o + d, TILE(vload)(o + d) * av);
                    }
                }
            }
            if (a->drop.p > 0.0f) { /* O += (P Z) V; l keeps the undropped sum */
                dropout_tile(a, PT, 1, BR, b, h, i0, nq, j0, nk, 0);
            }
            TILE(gemm_at)(Mr, Dp, nk, PT, BR, Vr, Dp, O, Dp, 1); /* O += P V */
        }
        for (int i = 0; i < nq; i++) {
            char *dst = row_ptr(c, c->out, &a->o, b, h, i0 + i);
            if (l[i] > 0.0f) {
                store_row(dst, O + (size_t)i * Dp, D, a->dt, 1.0f / l[i]);
                lse[i0 + i] = m[i] + logf(l[i]);
            } else if (seen[i]) { /* scores that overflowed float, or NaN: NaN, never zeros */
                TILE(fill)(O + (size_t)i * Dp, D, NAN);
                store_row(dst, O + (size_t)i * Dp, D, a->dt, 1.0f);
                lse[i0 + i] = NAN;
            } else { /* no valid key: zeros, lse -inf */
                memset(dst, 0, (size_t)D * c->esz);
                lse[i0 + i] = -INFINITY;
            }
        }
    }
    for (int i = nq; i < nrows; i++) { /* rows past q_length */
        memset(row_ptr(c, c->out, &a->o, b, h, i0 + i), 0, (size_t)D * c->esz);
        lse[i0 + i] = -INFINITY;
    }
}

/* ---- backward --------------------------------------------------------------------
 * For a (query tile, key tile) pair: S = Qs K^T, P = exp(S - lse), dP = dO V^T,
 * dS = P (dP - Di); then dV += P^T dO, dK += dS^T Qs, dQ += dS K (dQ is scaled
 * once at the end, dK carries the scale through Qs). Every entry of P and dS is
 * computed by the same expression in every path, so which path ran (one pass per
 * head, or the two-pass split) does not change a bit of the result. */

/* The key block of a backward work item, packed once: K^T and V^T as columns
 * (for S and dP), K rows (for dQ), the dK, dV accumulators. */
typedef struct {
    float *KT, *VT; /* (Dp, BC) */
    float *Kr;      /* (BC, Dp) */
    float *dK, *dV; /* (BC, Dp) */
    VI *keep;       /* (BC / VW) all-ones where the key is valid */
    int b, h, j0, nk, Mk, Nc;
} TILE(kblock);

/* A query tile: rows of q * scale and dout, -lse and Di per row. */
typedef struct {
    float *Qs, *dOr; /* (BR, Dp) */
    float *S, *dS;   /* (BR, BC) P, then dS, per (query, key) */
    float *nl, *Di;  /* (BR) -lse (-inf for a row with none), rowsum(dO * O) */
    float *Z;        /* (BR, BC) dropout's mask factors (with dropout only) */
} TILE(qtile);

/* One pair, query rows i0 .. i0+nq-1 against the key block; dQ (rows from i0,
 * leading dim Dp) accumulates when given. */
static void TILE(bwd_pair)(const attn_ctx *c, const TILE(kblock) * kb, const TILE(qtile) * qt,
                           int i0, int nq, float *dQ) {
    const pxt_attn_args *a = c->a;
    const int D = a->D, Dp = c->Dp, Mr = round_up(nq, MR), Nc = kb->Nc;
    const int drop = a->drop.p > 0.0f;
    TILE(gemm)(Mr, Nc, D, qt->Qs, Dp, kb->KT, BC, qt->S, BC, 0);   /* S = Qs K^T */
    TILE(gemm)(Mr, Nc, D, qt->dOr, Dp, kb->VT, BC, qt->dS, BC, 0); /* dP = dO V^T */
    if (drop) { /* the forward's mask of these (query, key) pairs */
        dropout_tile(a, qt->Z, BC, 1, kb->b, kb->h, i0, Mr, kb->j0, Nc, 1);
    }
    for (int i = 0; i < Mr; i++) {
        float *p = qt->S + (size_t)i * BC, *ds = qt->dS + (size_t)i * BC;
        const float *z = drop ? qt->Z + (size_t)i * BC : NULL;
        VF nl = VSET1(qt->nl[i]), di = VSET1(qt->Di[i]);
        for (int j = 0; j < Nc; j += VW) {
            VF pv = TILE(vexp)(TILE(vload)(p + j) + nl);
            VF dp = TILE(vload)(ds + j), pz = pv; /* with dropout: dP Z and P Z */
            if (drop) {
                VF zv = TILE(vload)(z + j);
                dp = dp * zv;
                pz = pv * zv;
            }
            VF dsv = pv * (dp - di);
            VI keep = kb->keep[j / VW];
            TILE(vstore)(p + j, (VF)((VI)pz & keep));
            TILE(vstore)(ds + j, (VF)((VI)dsv & keep));
        }
        if (a->causal) { /* keys j0+j > i0+i are not seen */
            int lim = iclamp(i0 + i - kb->j0 + 1, 0, Nc);
            memset(p + lim, 0, (size_t)(Nc - lim) * sizeof *p);
            memset(ds + lim, 0, (size_t)(Nc - lim) * sizeof *ds);
        }
    }
    TILE(gemm_at)(kb->Mk, Dp, nq, qt->S, BC, qt->dOr, Dp, kb->dV, Dp, 1); /* dV += P^T dO */
    TILE(gemm_at)(kb->Mk, Dp, nq, qt->dS, BC, qt->Qs, Dp, kb->dK, Dp, 1); /* dK += dS^T Qs */
    if (dQ) {
        TILE(gemm)(Mr, Dp, kb->nk, qt->dS, BC, kb->Kr, Dp, dQ, Dp, 1); /* dQ += dS K */
    }
}

/* Packs key block kb (keys j0 ..) of (b, h); returns 0 when it has no valid key. */
static int TILE(kblock_pack)(const attn_ctx *c, TILE(kblock) * kb, int b, int h, int kbi,
                             uint8_t *valid, int with_rows) {
    const pxt_attn_args *a = c->a;
    const int D = a->D, Dp = c->Dp;
    const int j0 = kbi * BC, nk = iclamp(k_len(a, b) - j0, 0, imin(BC, a->Tk - j0));
    kb->b = b, kb->h = h;
    kb->j0 = j0, kb->nk = nk, kb->Mk = round_up(nk, MR), kb->Nc = round_up(nk, PAD);
    if (nk <= 0 || !key_valid(a, b, j0, nk, valid)) {
        return 0;
    }
    const char *kp = row_ptr(c, c->k, &a->k, b, h, j0), *vp = row_ptr(c, c->v, &a->v, b, h, j0);
    const int64_t kst = a->k.t * (int64_t)c->esz, vst = a->v.t * (int64_t)c->esz;
    TILE(pack_cols)(kb->KT, BC, kb->Nc, kp, kst, nk, valid, D, a->dt, 1.0f);
    TILE(pack_cols)(kb->VT, BC, kb->Nc, vp, vst, nk, valid, D, a->dt, 1.0f);
    if (with_rows) {
        TILE(pack_rows)(kb->Kr, Dp, nk, kp, kst, nk, valid, D, Dp, a->dt, 1.0f);
    }
    for (int j = 0; j < kb->Nc; j += VW) {
        VI keep;
        for (int l = 0; l < VW; l++) {
            keep[l] = (j + l < nk && valid[j + l]) ? -1 : 0;
        }
        kb->keep[j / VW] = keep;
    }
    memset(kb->dK, 0, (size_t)kb->Mk * Dp * sizeof(float));
    memset(kb->dV, 0, (size_t)kb->Mk * Dp * sizeof(float));
    return 1;
}

/* Query rows i0 .. i0+nq-1 of (b, h) into qt (rows up to a multiple of MR). A row that saw
 * no key (lse -inf) is packed as zeros: its P and dS are zero anyway, but its q * scale
 * may overflow to inf (a huge scale), and 0 * inf in dK += dS^T Qs would be NaN in the
 * gradient of a key it never saw. */
static void TILE(qtile_pack)(const attn_ctx *c, TILE(qtile) * qt, int b, int h, int i0, int nq) {
    const pxt_attn_args *a = c->a;
    const int D = a->D, Dp = c->Dp, Mr = round_up(nq, MR);
    const float *lse = c->lse + ((size_t)b * a->H + h) * a->Tq + i0;
    const float *Di = c->Di + ((size_t)b * a->H + h) * a->Tq + i0;
    const int64_t qst = a->q.t * (int64_t)c->esz, ost = a->o.t * (int64_t)c->esz;
    uint8_t live[BR];
    live_rows(lse, nq, live);
    TILE(pack_rows)(qt->Qs, Dp, Mr, row_ptr(c, c->q, &a->q, b, h, i0), qst, nq, live, D, Dp, a->dt,
                    a->scale);
    TILE(pack_rows)(qt->dOr, Dp, Mr, row_ptr(c, c->dout, &a->o, b, h, i0), ost, nq, live, D, Dp,
                    a->dt, 1.0f);
    for (int i = 0; i < Mr; i++) {
        qt->nl[i] = i < nq && live[i] ? -lse[i] : -INFINITY;
        qt->Di[i] = i < nq ? Di[i] : 0.0f;
    }
}

/* Writes dK, dV of the key block (zeros for masked keys and keys past k_length). */
static void TILE(kblock_store)(const attn_ctx *c, const TILE(kblock) * kb, int b, int h,
                               const uint8_t *valid, int any) {
    const pxt_attn_args *a = c->a;
    const int nrows = imin(BC, a->Tk - kb->j0);
    for (int j = 0; j < nrows; j++) {
        char *dk = row_ptr(c, c->dk, &a->k, b, h, kb->j0 + j);
        char *dv = row_ptr(c, c->dv, &a->v, b, h, kb->j0 + j);
        if (any && j < kb->nk && valid[j]) {
            store_row(dk, kb->dK + (size_t)j * c->Dp, a->D, a->dt, 1.0f);
            store_row(dv, kb->dV + (size_t)j * c->Dp, a->D, a->dt, 1.0f);
        } else {
            memset(dk, 0, (size_t)a->D * c->esz);
            memset(dv, 0, (size_t)a->D * c->esz);
        }
    }
}

/* Carves a pair slab: the key block's and the query tile's buffers. */
static float *TILE(pair_slab)(const attn_ctx *c, float *ws, TILE(kblock) * kb, TILE(qtile) * qt) {
    const size_t Dp = (size_t)c->Dp;
    kb->KT = ws;
    kb->VT = kb->KT + Dp * BC;
    kb->Kr = kb->VT + Dp * BC;
    kb->dK = kb->Kr + (size_t)BC * Dp;
    kb->dV = kb->dK + (size_t)BC * Dp;
    qt->Qs = kb->dV + (size_t)BC * Dp;
    qt->dOr = qt->Qs + (size_t)BR * Dp;
    qt->S = qt->dOr + (size_t)BR * Dp;
    qt->dS = qt->S + (size_t)BR * BC;
    qt->nl = qt->dS + (size_t)BR * BC;
    qt->Di = qt->nl + BR;
    kb->keep = (VI *)(void *)(qt->Di + BR); /* BC floats, 64-byte aligned */
    qt->Z = (float *)(void *)kb->keep + BC;
    return qt->Z + (c->a->drop.p > 0.0f ? (size_t)BR * BC : 0);
}

/* Pass 1 of the two-pass backward: one (b, h, key block) -> its dK, dV. */
static void TILE(bwd_kv_item)(const attn_ctx *c, float *ws, int b, int h, int kbi) {
    TILE(kblock) kb;
    TILE(qtile) qt;
    uint8_t valid[BC];
    TILE(pair_slab)(c, ws, &kb, &qt);
    const int qend = q_len(c->a, b);
    int any = TILE(kblock_pack)(c, &kb, b, h, kbi, valid, 0);
    if (any) {
        for (int i0 = c->a->causal ? kb.j0 : 0; i0 < qend; i0 += BR) {
            int nq = imin(BR, qend - i0);
            TILE(qtile_pack)(c, &qt, b, h, i0, nq);
            TILE(bwd_pair)(c, &kb, &qt, i0, nq, NULL);
        }
    }
    TILE(kblock_store)(c, &kb, b, h, valid, any);
}

/* The one-pass backward of a whole head (b, h): key blocks in order, each
 * against the query tiles that see it; dQ (round_up(Tq, BR), Dp) accumulates
 * in the thread's slab. */
static void TILE(bwd_head_item)(const attn_ctx *c, float *ws, int b, int h, int unused) {
    (void)unused;
    const pxt_attn_args *a = c->a;
    TILE(kblock) kb;
    TILE(qtile) qt;
    uint8_t valid[BC];
    float *dQ = TILE(pair_slab)(c, ws, &kb, &qt);
    const int qend = q_len(a, b), nkb = (a->Tk + BC - 1) / BC;
    memset(dQ, 0, (size_t)round_up(qend, MR) * c->Dp * sizeof *dQ);
    for (int kbi = 0; kbi < nkb; kbi++) {
        int any = TILE(kblock_pack)(c, &kb, b, h, kbi, valid, 1);
        if (any) {
            for (int i0 = a->causal ? kb.j0 : 0; i0 < qend; i0 += BR) {
                int nq = imin(BR, qend - i0);
                TILE(qtile_pack)(c, &qt, b, h, i0, nq);
                TILE(bwd_pair)(c, &kb, &qt, i0, nq, dQ + (size_t)i0 * c->Dp);
            }
        }
        TILE(kblock_store)(c, &kb, b, h, valid, any);
    }
    for (int i = 0; i < a->Tq; i++) {
        char *dst = row_ptr(c, c->dq, &a->q, b, h, i);
        if (i < qend) {
            store_row(dst, dQ + (size_t)i * c->Dp, a->D, a->dt, a->scale);
        } else {
            memset(dst, 0, (size_t)a->D * c->esz);
        }
    }
}

/* Pass 2 of the two-pass backward: one (b, h, query block) -> its dQ. Scores are
 * held transposed (keys, queries) so q and dout are transposed once per item. */
static void TILE(bwd_q_item)(const attn_ctx *c, float *ws, int b, int h, int qb) {
    const pxt_attn_args *a = c->a;
    const int D = a->D, Dp = c->Dp, i0 = qb * BR;
    const int nrows = imin(BR, a->Tq - i0);
    const int nq = iclamp(q_len(a, b) - i0, 0, nrows);
    const size_t esz = c->esz;
    float *QT = ws;                    /* (Dp, BR) q * scale as columns */
    float *dOT = QT + (size_t)Dp * BR; /* (Dp, BR) dout as columns */
    float *dQ = dOT + (size_t)Dp * BR; /* (BR, Dp) accumulator */
    float *Kr = dQ + (size_t)BR * Dp;  /* (BC, Dp) key rows */
    float *Vr = Kr + (size_t)BC * Dp;  /* (BC, Dp) value rows */
    float *PT = Vr + (size_t)BC * Dp;  /* (BC, BR) scores^T */
    float *dST = PT + (size_t)BC * BR; /* (BC, BR) dP^T, then dS^T */
    float *nl = dST + (size_t)BC * BR; /* (BR) -lse or -inf */
    float *Di = nl + BR;               /* (BR) */
    float *ZT = Di + BR;               /* (BC, BR) dropout's mask factors (with dropout) */
    const int drop = a->drop.p > 0.0f;
    uint8_t valid[BC];

    if (nq > 0) {
        const int Mr = round_up(nq, MR), Nq = round_up(nq, PAD);
        int kend = k_len(a, b);
        if (a->causal) {
            kend = imin(kend, i0 + nq);
        }
        const float *lse = c->lse + ((size_t)b * a->H + h) * a->Tq + i0;
        const float *Dg = c->Di + ((size_t)b * a->H + h) * a->Tq + i0;
        const char *qp = row_ptr(c, c->q, &a->q, b, h, i0);
        const char *op = row_ptr(c, c->dout, &a->o, b, h, i0);
        uint8_t live[BR]; /* rows that saw a key (qtile_pack says why the others are zeros) */
        live_rows(lse, nq, live);
        TILE(pack_cols)(QT, BR, Nq, qp, a->q.t * (int64_t)esz, nq, live, D, a->dt, a->scale);
        TILE(pack_cols)(dOT, BR, Nq, op, a->o.t * (int64_t)esz, nq, live, D, a->dt, 1.0f);
        for (int i = 0; i < Nq; i++) {
            nl[i] = i < nq && live[i] ? -lse[i] : -INFINITY;
            Di[i] = i < nq ? Dg[i] : 0.0f;
        }
        memset(dQ, 0, (size_t)Mr * Dp * sizeof *dQ);
        for (int j0 = 0; j0 < kend; j0 += BC) {
            const int nk = imin(BC, kend - j0), Mk = round_up(nk, MR);
            if (!key_valid(a, b, j0, nk, valid)) {
                continue;
            }
            const int64_t kst = a->k.t * (int64_t)esz, vst = a->v.t * (int64_t)esz;
            TILE(pack_rows)(Kr, Dp, Mk, row_ptr(c, c->k, &a->k, b, h, j0), kst, nk, valid, D, Dp,
                            a->dt, 1.0f);
            TILE(pack_rows)(Vr, Dp, Mk, row_ptr(c, c->v, &a->v, b, h, j0), vst, nk, valid, D, Dp,
                            a->dt, 1.0f);
            TILE(gemm)(Mk, Nq, D, Kr, Dp, QT, BR, PT, BR, 0);   /* S^T = K Qs^T */
            TILE(gemm)(Mk, Nq, D, Vr, Dp, dOT, BR, dST, BR, 0); /* dP^T = V dO^T */
            if (drop) { /* the forward's mask, transposed like the scores */
                dropout_tile(a, ZT, 1, BR, b, h, i0, Nq, j0, Mk, 1);
            }
            for (int j = 0; j < Mk; j++) {
                float *p = PT + (size_t)j * BR, *ds = dST + (size_t)j * BR;
                const float *z = ZT + (size_t)j * BR;
                if (j >= nk || !valid[j]) {
                    memset(ds, 0, (size_t)Nq * sizeof *ds);
                    continue;
                }
                for (int i = 0; i < Nq; i += VW) {
                    VF pv = TILE(vexp)(TILE(vload)(p + i) + TILE(vload)(nl + i));
                    VF dp = TILE(vload)(ds + i); /* with dropout: dP Z */
                    if (drop) {
                        dp = dp * TILE(vload)(z + i);
                    }
                    TILE(vstore)(ds + i, pv * (dp - TILE(vload)(Di + i)));
                }
                if (a->causal) { /* queries i0+i < j0+j do not see this key */
                    memset(ds, 0, (size_t)iclamp(j0 + j - i0, 0, Nq) * sizeof *ds);
                }
            }
            TILE(gemm_at)(Mr, Dp, nk, dST, BR, Kr, Dp, dQ, Dp, 1); /* dQ += dS K */
        }
        for (int i = 0; i < nq; i++) {
            store_row(row_ptr(c, c->dq, &a->q, b, h, i0 + i), dQ + (size_t)i * Dp, D, a->dt,
                      a->scale);
        }
    }
    for (int i = nq; i < nrows; i++) {
        memset(row_ptr(c, c->dq, &a->q, b, h, i0 + i), 0, (size_t)D * esz);
    }
}

/* the parameters of this instantiation end here */
#undef TILE_ISA
#undef VF
#undef VI
#undef VW
#undef NVMAX
#undef VSET1
#undef VFMA
#undef VMAX
#undef VMIN
#undef LOAD_F16
