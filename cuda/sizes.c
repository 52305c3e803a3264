/* sizes.c: the CUDA backend's workspace sizes and attention switches (sizes.h), in
 * every build. Each size is a function of the call's shape (and the switches) alone:
 * the kernels in the .cu files carve their scratch out of exactly these bytes. */
#include "sizes.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static size_t align256(size_t n) { return (n + 255) / 256 * 256; }

static size_t max_sz(size_t a, size_t b) { return a > b ? a : b; }

size_t pxt_cuda_gemm_workspace(int M, int N, int K, pxt_dtype dt_ab) {
    (void)M, (void)N, (void)K, (void)dt_ab;
    /* dt_c is not known here: the staging is always reserved (4 MiB) */
    return PXT_CUDA_GEMM_CUBLAS_WS + PXT_CUDA_GEMM_STAGE * sizeof(float);
}

/* Two sums per column at most (layernorm); 0 for an empty shape. */
size_t pxt_cuda_colsum_workspace(int rows, int cols) {
    if (rows <= 0 || cols <= 0) {
        return 0;
    }
    return align256(2 * (size_t)pxt_colsum_chunks(rows, cols) * (size_t)cols * sizeof(double));
}

/* [gemm's (cuBLAS / cuBLASLt scratch, staging) | dbias (N) fp32 | the composition's
 * column-sum partials] */
size_t pxt_cuda_gemm_fused_workspace(const pxt_gemm_args *g) {
    size_t gemm =
        align256(max_sz(pxt_cuda_gemm_workspace(g->M, g->N, g->K, g->dt_ab), PXT_CUDA_LT_WS));
    size_t tmp = align256((size_t)(g->N > 0 ? g->N : 0) * sizeof(float));
    size_t sums =
        max_sz(pxt_cuda_colsum_workspace(g->M, g->N), pxt_cuda_colsum_workspace(g->K, g->N));
    return gemm + tmp + sums;
}

/* [parts (N, C) double | flags (N) u8] */
size_t pxt_cuda_embedding_workspace(int N, int C, int V) {
    (void)V;
    if (N <= 0 || C <= 0) {
        return 0;
    }
    return align256((size_t)N * (size_t)C * sizeof(double)) + align256((size_t)N);
}

/* a switch's value, read from the environment once: racing readers agree */
static int read_once(atomic_int *cache, const char *name, const char *const *values, int bad) {
    int m = atomic_load_explicit(cache, memory_order_relaxed);
    if (m != -2) {
        return m;
    }
    const char *s = getenv(name);
    m = bad;
    if (!s || !*s) {
        m = 0; /* the first value is the default */
    }
    for (int i = 0; values[i] && m == bad; i++) {
        if (!strcmp(s, values[i])) {
            m = i;
        }
    }
    atomic_store_explicit(cache, m, memory_order_relaxed);
    return m;
}

int pxt_cuda_attention_mode(void) {
    static atomic_int mode = -2;
    static const char *const values[] = {"auto", "simple", "tc", NULL}; /* PXT_TC_MODE_* */
    return read_once(&mode, "PYXTTS_CUDA_ATTENTION", values, PXT_TC_MODE_BAD);
}

int pxt_cuda_attention_bwd_mode(void) {
    static atomic_int mode = -2;
    static const char *const values[] = {"two-kernel", "one-pass", NULL}; /* PXT_TC_BWD_* */
    return read_once(&mode, "PYXTTS_CUDA_ATTENTION_BWD", values, PXT_TC_BWD_BAD);
}

/* The tensor-core backward's own workspace after Di: the one-pass schedule's dQ
 * partials where PYXTTS_CUDA_ATTENTION_BWD selects it, for the calls the tensor-core
 * kernels can take (attention_tc.cu), else none. */
static size_t tc_bwd_bytes(const pxt_attn_args *a) {
    if (pxt_cuda_attention_bwd_mode() != PXT_TC_BWD_ONE ||
        pxt_cuda_attention_mode() == PXT_TC_MODE_SIMPLE ||
        (a->dt != PXT_BFLOAT16 && a->dt != PXT_FLOAT16) || (a->D != 64 && a->D != 128)) {
        return 0;
    }
    return pxt_tc_split_bytes(a);
}

/* Di (B, H, Tq) fp32, 256-byte aligned at the start: linear in Tq, none for the forward.
 * The tensor-core path (attention_tc.cu) reads the same Di; its one-pass backward, where
 * PYXTTS_CUDA_ATTENTION_BWD selects it, also its dQ partials after it (linear in Tq). */
size_t pxt_cuda_attention_workspace(const pxt_attn_args *a, int backward) {
    if (!a || !backward || a->B < 0 || a->H < 0 || a->Tq < 0) {
        return 0;
    }
    const size_t extra = tc_bwd_bytes(a);
    if (extra == SIZE_MAX) {
        return SIZE_MAX; /* too large to plan: the allocation fails and says so */
    }
    return extra ? pxt_cuda_attention_di_bytes(a) + extra + 256
                 : (size_t)a->B * a->H * a->Tq * sizeof(float) + 256;
}

/* The CUDA backend as far as a plan goes: its name and workspace entries, no devices
 * and no kernels (backend.h's pxt_backend_plan_for gives it where the build has no
 * CUDA backend). */
static const pxt_backend sizes_backend = {
    .name = "cuda",
    .gemm_workspace = pxt_cuda_gemm_workspace,
    .colsum_workspace = pxt_cuda_colsum_workspace,
    .gemm_fused_workspace = pxt_cuda_gemm_fused_workspace,
    .embedding_workspace = pxt_cuda_embedding_workspace,
    .attention_workspace = pxt_cuda_attention_workspace,
};

const pxt_backend *pxt_cuda_sizes_backend(void) { return &sizes_backend; }
