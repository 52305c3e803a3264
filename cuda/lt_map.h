/* lt_map.h: a row-major pxt_gemm_args as the column-major product cuBLASLt
 * computes (gemm_fused.cu uses it; tests/cuda_emu checks it on the host
 * against a column-major model of cuBLASLt's documented semantics).
 *
 * A row-major (M, N) matrix is the column-major (N, M) one with the same bytes,
 * so D = op(A) op(B) is computed as D' = D^T = op(B)^T op(A)^T: Lt's A is our B
 * and Lt's B our A, each with the transpose flag the caller gave (the storage
 * already is the transpose Lt wants), and Lt's (m, n, k) = (N, M, K). In D'
 * our columns are rows, so:
 *   - a bias over our columns is Lt's bias over D's rows (BIAS, GELU_AUX_BIAS);
 *   - column sums of our D are Lt's sums over n: DGELU_BGRAD's bias gradient;
 *   - column sums of our op(B) over K are Lt's BGRADA (op(A') summed over k);
 *   - pre (M, N) row-major is Lt's aux matrix (N rows) with leading dim N.
 * Plain C, no cuBLAS types: the epilogue is named by pxt_lt_epi. */
#ifndef PXT_CUDA_LT_MAP_H
#define PXT_CUDA_LT_MAP_H

#include <string.h>

#include "engine/backend.h"

typedef enum {
    PXT_LT_DEFAULT = 0,
    PXT_LT_BIAS,
    PXT_LT_GELU_AUX_BIAS,
    PXT_LT_DGELU_BGRAD,
    PXT_LT_BGRADA,
} pxt_lt_epi;

typedef struct {
    int transa, transb;           /* Lt's ops of its A and B: 1 = transposed */
    const void *a, *b;            /* Lt's A (= our B) and B (= our A) */
    int64_t a_rows, a_cols, a_ld; /* Lt's A as stored, column-major */
    int64_t b_rows, b_cols, b_ld; /* Lt's B as stored */
    int64_t m, n, k;              /* D' (m, n) = op(A') (m, k) op(B') (k, n) */
    int64_t d_ld;                 /* of C' and D' */
    pxt_lt_epi epi;
    int64_t aux_ld; /* of pre, when the epilogue has it */
} pxt_lt_map;

static inline void pxt_lt_map_of(const pxt_gemm_args *g, pxt_lt_map *m) {
    m->transa = g->trans_b;
    m->transb = g->trans_a;
    m->a = g->B;
    m->b = g->A;
    /* our B: (K, N) row-major = (N, K) col-major ld N; with trans_b stored (N, K) = (K, N) ld K */
    m->a_rows = g->trans_b ? g->K : g->N;
    m->a_cols = g->trans_b ? g->N : g->K;
    m->a_ld = m->a_rows;
    /* our A: (M, K) row-major = (K, M) col-major ld K; with trans_a stored (K, M) = (M, K) ld M */
    m->b_rows = g->trans_a ? g->M : g->K;
    m->b_cols = g->trans_a ? g->K : g->M;
    m->b_ld = m->b_rows;
    m->m = g->N;
    m->n = g->M;
    m->k = g->K;
    m->d_ld = g->N;
    m->aux_ld = g->N;
    switch (g->epilogue) {
    case PXT_EPI_BIAS: m->epi = PXT_LT_BIAS; break;
    case PXT_EPI_BIAS_GELU: m->epi = PXT_LT_GELU_AUX_BIAS; break;
    case PXT_EPI_DGELU_BGRAD: m->epi = PXT_LT_DGELU_BGRAD; break;
    case PXT_EPI_BGRAD_B: m->epi = PXT_LT_BGRADA; break;
    default: m->epi = PXT_LT_DEFAULT; break;
    }
}

/* The epilogues gemm_fused's `auto` gives to cuBLASLt, from PYXTTS_CUDA_LT_EPILOGUES
 * (s: comma-separated _op_gemm_fused names, NULL: unset): bit e for pxt_epilogue e, a
 * plain product's (none) always; -1 for a name that is no epilogue's. Unset or empty (as
 * the other PYXTTS_CUDA_* switches read it): all but bgrad_b (gemm_fused.cu says why);
 * "none" gives cuBLASLt no epilogue. */
static inline int pxt_lt_epilogue_mask(const char *s) {
    static const char *const names[] = {"none", "bias", "bias_gelu", "dgelu_bgrad", "bgrad_b"};
    int m = 1 << PXT_EPI_NONE;
    if (!s || !*s) {
        return m | 1 << PXT_EPI_BIAS | 1 << PXT_EPI_BIAS_GELU | 1 << PXT_EPI_DGELU_BGRAD;
    }
    while (*s) {
        size_t n = strcspn(s, ",");
        int found = -1;
        for (int e = 0; e < 5; e++) {
            if (n == strlen(names[e]) && !strncmp(s, names[e], n)) {
                found = e;
            }
        }
        if (n && found < 0) {
            return -1;
        }
        m |= n ? 1 << found : 0;
        s += n + (s[n] == ',');
    }
    return m;
}

#endif /* PXT_CUDA_LT_MAP_H */
