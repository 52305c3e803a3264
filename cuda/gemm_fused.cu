/* gemm_fused.cu: the fused GEMM entry (backend.h's pxt_gemm_args): one
 * cuBLASLt product whose epilogue adds the bias, applies GELU, GELU's gradient
 * or reduces the bias gradient, so the (M, N) result is written once instead
 * of being read and written again by add_bias, gelu and bias_backward.
 *
 * cuBLASLt has no kernel for some cases (a dtype pair, an alignment, a size);
 * cublasLtMatmulAlgoGetHeuristic says so, and then the entry composes the
 * unfused ops instead, exactly as the CPU does (pxt_gemm_fused_composed): the
 * same results up to the products' and epilogues' rounding. The heuristic's
 * answer is cached per shape, dtypes, epilogue and pointer alignment.
 *
 * Bias gradients come out of cuBLASLt in fp32 (CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE)
 * into the workspace and are then added to dbias: a bias gradient rounded to
 * 16 bits is never accepted (the composition's double sums are used instead).
 *
 * PYXTTS_CUDA_GEMM_FUSED: auto (default) takes cuBLASLt where it has a kernel,
 * for the epilogues PYXTTS_CUDA_LT_EPILOGUES names; lt requires it for every
 * epilogue (an error where it has none: for tests and benchmarks); composed
 * never uses it.
 *
 * PYXTTS_CUDA_LT_EPILOGUES (auto's, comma-separated _op_gemm_fused names; default
 * bias,bias_gelu,dgelu_bgrad): bgrad_b is left out. For it cuBLASLt runs three
 * kernels besides the product (a memset, its BgradAB reduction, and the add of its
 * fp32 result into the accumulating gradient): 90 calls and 1.43 ms of an H200's
 * step in run 3's profile, where the composition's two column-sum kernels read dy
 * once and add into the gradient directly, with the CPU's bits. gpu_check.sh times
 * the step both ways.
 *
 * Workspace: [gemm's (cuBLAS / cuBLASLt scratch, staging) | dbias (N) fp32 |
 * the composition's column-sum partials]. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <atomic>

#include "elem.cuh"
#include "lt_map.h"

#define LT_WS PXT_CUDA_LT_WS /* bytes of cuBLASLt scratch: the head of gemm's workspace */
#define LT_CACHE 512         /* remembered heuristic answers */

static size_t align256(size_t n) { return (n + 255) / 256 * 256; }

static size_t max_sz(size_t a, size_t b) { return a > b ? a : b; }

static std::atomic<int> last_path(-1);

extern "C" int pxt_cuda_gemm_fused_last_path(void) {
    return last_path.load(std::memory_order_relaxed);
}

enum { MODE_AUTO, MODE_LT, MODE_COMPOSED, MODE_BAD };

static int read_mode(void) {
    const char *s = getenv("PYXTTS_CUDA_GEMM_FUSED");
    if (!s || !*s || !strcmp(s, "auto")) {
        return MODE_AUTO;
    }
    if (!strcmp(s, "lt")) {
        return MODE_LT;
    }
    if (!strcmp(s, "composed")) {
        return MODE_COMPOSED;
    }
    return MODE_BAD;
}

/* The epilogues `auto` gives to cuBLASLt (lt_map.h's mask), PYXTTS_CUDA_LT_EPILOGUES
 * read once (racing readers agree). */
static int lt_epilogues(void) {
    static std::atomic<int> cached{-2};
    int m = cached.load(std::memory_order_relaxed);
    if (m == -2) {
        m = pxt_lt_epilogue_mask(getenv("PYXTTS_CUDA_LT_EPILOGUES"));
        cached.store(m, std::memory_order_relaxed);
    }
    return m;
}

/* dbias (n) += tmp (n): cuBLASLt's bias gradient into the accumulating one */
__global__ static void add_f32_kernel(float *dbias, const float *tmp, int n) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j < n) {
        dbias[j] = dbias[j] + tmp[j];
    }
}

/* ---- cuBLASLt ----------------------------------------------------------------------- */

static int lt_type(pxt_dtype dt, cudaDataType_t *out) {
    switch (dt) {
    case PXT_FLOAT32: *out = CUDA_R_32F; return 1;
    case PXT_FLOAT16: *out = CUDA_R_16F; return 1;
    case PXT_BFLOAT16: *out = CUDA_R_16BF; return 1;
    default: return 0;
    }
}

static cublasLtEpilogue_t lt_epilogue(pxt_lt_epi e) {
    switch (e) {
    case PXT_LT_BIAS: return CUBLASLT_EPILOGUE_BIAS;
    case PXT_LT_GELU_AUX_BIAS: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case PXT_LT_DGELU_BGRAD: return CUBLASLT_EPILOGUE_DGELU_BGRAD;
    case PXT_LT_BGRADA: return CUBLASLT_EPILOGUE_BGRADA;
    default: return CUBLASLT_EPILOGUE_DEFAULT;
    }
}

/* The largest power of two (<= 256) dividing the address: what the heuristic
 * may assume of a pointer. */
static uint32_t alignment(const void *p) {
    uintptr_t a = (uintptr_t)p;
    uint32_t al = 256;
    while (al > 1 && a % al) {
        al /= 2;
    }
    return al;
}

/* What decides cuBLASLt's answer; equal keys get the same algorithm. */
typedef struct {
    int index, trans_a, trans_b, M, N, K, dt_ab, dt_c, epilogue, beta_nonzero;
    uint32_t align[6]; /* A, B, C, D, bias / dbias, pre */
} lt_key;

typedef struct {
    lt_key key;
    int used, supported;
    cublasLtMatmulAlgo_t algo;
} lt_entry;

static lt_entry cache[LT_CACHE];
static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;

static size_t key_slot(const lt_key *k) {
    const unsigned char *b = (const unsigned char *)k;
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < sizeof *k; i++) {
        h = (h ^ b[i]) * 1099511628211ull;
    }
    return (size_t)(h % LT_CACHE);
}

/* Descriptors of one product, destroyed with the object. */
struct lt_descs {
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t a = NULL, b = NULL, c = NULL, d = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    ~lt_descs() {
        if (pref) {
            cublasLtMatmulPreferenceDestroy(pref);
        }
        if (d) {
            cublasLtMatrixLayoutDestroy(d);
        }
        if (c) {
            cublasLtMatrixLayoutDestroy(c);
        }
        if (b) {
            cublasLtMatrixLayoutDestroy(b);
        }
        if (a) {
            cublasLtMatrixLayoutDestroy(a);
        }
        if (op) {
            cublasLtMatmulDescDestroy(op);
        }
    }
};

template <typename V>
static cublasStatus_t set_op(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, V v) {
    return cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof v);
}

/* The descriptors of g as map m says (bias_out: where a bias gradient lands). */
static int lt_describe(const pxt_gemm_args *g, const pxt_lt_map *m, cudaDataType_t tab,
                       cudaDataType_t tc, float *bias_out, lt_descs *ds) {
    PXT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&ds->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    PXT_CUBLAS_CHECK(set_op(ds->op, CUBLASLT_MATMUL_DESC_TRANSA,
                            (int32_t)(m->transa ? CUBLAS_OP_T : CUBLAS_OP_N)));
    PXT_CUBLAS_CHECK(set_op(ds->op, CUBLASLT_MATMUL_DESC_TRANSB,
                            (int32_t)(m->transb ? CUBLAS_OP_T : CUBLAS_OP_N)));
    PXT_CUBLAS_CHECK(set_op(ds->op, CUBLASLT_MATMUL_DESC_EPILOGUE, (uint32_t)lt_epilogue(m->epi)));
    switch (m->epi) {
    case PXT_LT_BIAS:
    case PXT_LT_GELU_AUX_BIAS: /* bias of D's type (the parameter's) */
        PXT_CUBLAS_CHECK(set_op(ds->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, g->bias));
        break;
    case PXT_LT_DGELU_BGRAD:
    case PXT_LT_BGRADA: /* a float32 bias gradient, never a 16-bit one */
        PXT_CUBLAS_CHECK(set_op(ds->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, (void *)bias_out));
        PXT_CUBLAS_CHECK(set_op(ds->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, (int32_t)CUDA_R_32F));
        break;
    default: break;
    }
    if (m->epi == PXT_LT_GELU_AUX_BIAS || m->epi == PXT_LT_DGELU_BGRAD) {
        PXT_CUBLAS_CHECK(set_op(ds->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, g->pre));
        PXT_CUBLAS_CHECK(set_op(ds->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, m->aux_ld));
        PXT_CUBLAS_CHECK(set_op(ds->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, (int32_t)tc));
    }
    PXT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ds->a, tab, m->a_rows, m->a_cols, m->a_ld));
    PXT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ds->b, tab, m->b_rows, m->b_cols, m->b_ld));
    PXT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ds->c, tc, m->m, m->n, m->d_ld));
    PXT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ds->d, tc, m->m, m->n, m->d_ld));
    return PXT_OK;
}

/* The cached answer for key k, looked up or asked for: *supported, *algo. */
static int lt_algo(int index, const lt_key *k, lt_descs *ds, int *supported,
                   cublasLtMatmulAlgo_t *algo) {
    size_t slot = key_slot(k);
    pthread_mutex_lock(&cache_lock);
    int hit = cache[slot].used && !memcmp(&cache[slot].key, k, sizeof *k);
    if (hit) {
        *supported = cache[slot].supported;
        *algo = cache[slot].algo;
    }
    pthread_mutex_unlock(&cache_lock);
    if (hit) {
        return PXT_OK;
    }
    cublasLtMatmulPreference_t pref;
    PXT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    ds->pref = pref; /* destroyed with the descriptors */
    size_t ws = LT_WS;
    /* no split-K reduction in 16-bit output precision: as the plain gemm's math mode */
    uint32_t schemes =
        CUBLASLT_REDUCTION_SCHEME_MASK & ~(uint32_t)CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE;
    PXT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    PXT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes, sizeof schemes));
    const cublasLtMatmulPreferenceAttributes_t al[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; i++) { /* Lt's A is our B: the key's order is ours */
        PXT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, al[i],
                                                              &k->align[i == 0   ? 1
                                                                        : i == 1 ? 0
                                                                                 : i],
                                                              sizeof(uint32_t)));
    }
    cublasLtMatmulHeuristicResult_t res;
    int count = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(pxt_cuda_lt(index), ds->op, ds->a, ds->b,
                                                       ds->c, ds->d, pref, 1, &res, &count);
    /* "no kernel for this" is an answer, not an error: the composition takes it */
    if (st != CUBLAS_STATUS_SUCCESS && st != CUBLAS_STATUS_NOT_SUPPORTED &&
        st != CUBLAS_STATUS_INVALID_VALUE) {
        PXT_CUBLAS_CHECK(st);
    }
    *supported = st == CUBLAS_STATUS_SUCCESS && count > 0 && res.state == CUBLAS_STATUS_SUCCESS;
    if (*supported) {
        *algo = res.algo;
    }
    pthread_mutex_lock(&cache_lock);
    cache[slot].key = *k;
    cache[slot].supported = *supported;
    if (*supported) {
        cache[slot].algo = *algo;
    }
    cache[slot].used = 1;
    pthread_mutex_unlock(&cache_lock);
    return PXT_OK;
}

/* One product through cuBLASLt; *taken = 0 (and nothing queued) where it has
 * no kernel for g. */
static int lt_run(int index, const pxt_gemm_args *g, void *lt_ws, float *dbias_tmp, int *taken) {
    *taken = 0;
    cudaDataType_t tab, tc;
    if (!lt_type(g->dt_ab, &tab) || !lt_type(g->dt_c, &tc)) {
        return PXT_OK;
    }
    /* pairs Lt multiplies: one dtype throughout, or 16-bit operands into fp32 */
    if (g->dt_c != g->dt_ab && g->dt_c != PXT_FLOAT32) {
        return PXT_OK;
    }
    if (g->M == 0 || g->N == 0 || g->K == 0) {
        return PXT_OK; /* the composition's edge cases (K = 0 is C = beta C) */
    }
    pxt_lt_map m;
    pxt_lt_map_of(g, &m);
    const int bgrad = m.epi == PXT_LT_DGELU_BGRAD || m.epi == PXT_LT_BGRADA;
    const void *C = g->C ? g->C : g->D;
    lt_key k;
    memset(&k, 0, sizeof k); /* padding too: keys are compared as bytes */
    k.index = index, k.trans_a = g->trans_a, k.trans_b = g->trans_b, k.M = g->M, k.N = g->N;
    k.K = g->K, k.dt_ab = g->dt_ab, k.dt_c = g->dt_c, k.epilogue = g->epilogue;
    k.beta_nonzero = g->beta != 0.0f;
    k.align[0] = alignment(g->A), k.align[1] = alignment(g->B), k.align[2] = alignment(C);
    k.align[3] = alignment(g->D);
    k.align[4] = alignment(bgrad ? (const void *)dbias_tmp : g->bias);
    k.align[5] = alignment(g->pre);
    lt_descs ds;
    PXT_TRY(lt_describe(g, &m, tab, tc, dbias_tmp, &ds));
    int supported = 0;
    cublasLtMatmulAlgo_t algo;
    PXT_TRY(lt_algo(index, &k, &ds, &supported, &algo));
    if (!supported) {
        return PXT_OK;
    }
    cudaStream_t stream = pxt_cuda_stream(index);
    PXT_CUBLAS_CHECK(cublasLtMatmul(pxt_cuda_lt(index), ds.op, &g->alpha, m.a, ds.a, m.b, ds.b,
                                    &g->beta, C, ds.c, g->D, ds.d, &algo, lt_ws, LT_WS, stream));
    if (bgrad) {
        add_f32_kernel<<<(g->N + 255) / 256, 256, 0, stream>>>(g->dbias, dbias_tmp, g->N);
        PXT_CUDA_CHECK_LAUNCH("gemm_fused (bias gradient)");
    }
    *taken = 1;
    return PXT_OK;
}

int pxt_cuda_gemm_fused(int index, const pxt_gemm_args *g, void *workspace) {
    PXT_TRY(pxt_gemm_args_check(g));
    const int mode = read_mode(), allowed = lt_epilogues();
    if (mode == MODE_BAD) {
        return pxt_error(PXT_ERR_VALUE, "PYXTTS_CUDA_GEMM_FUSED=%s: expected auto, lt or composed",
                         getenv("PYXTTS_CUDA_GEMM_FUSED"));
    }
    if (allowed < 0) {
        return pxt_error(PXT_ERR_VALUE,
                         "PYXTTS_CUDA_LT_EPILOGUES=%s: expected names among bias, bias_gelu, "
                         "dgelu_bgrad, bgrad_b, separated by commas",
                         getenv("PYXTTS_CUDA_LT_EPILOGUES"));
    }
    if (!workspace) {
        return pxt_error(PXT_ERR_VALUE, "gemm_fused: no workspace (gemm_fused_workspace() bytes), "
                                        "got NULL");
    }
    PXT_CUDA_ENTER(index);
    if (g->dt_ab == PXT_BFLOAT16) {
        PXT_TRY(pxt_cuda_bf16_check(index, "gemm_fused"));
    }
    char *gemm_ws = (char *)workspace;
    size_t gemm_bytes =
        align256(max_sz(pxt_cuda_gemm_workspace(g->M, g->N, g->K, g->dt_ab), LT_WS));
    float *dbias_tmp = (float *)(gemm_ws + gemm_bytes); /* (N) */
    void *sums_ws = (char *)dbias_tmp + align256((size_t)g->N * sizeof(float));
    int taken = 0;
    if (mode == MODE_LT || (mode == MODE_AUTO && allowed >> g->epilogue & 1)) {
        PXT_TRY(lt_run(index, g, gemm_ws, dbias_tmp, &taken));
    }
    last_path.store(taken, std::memory_order_relaxed);
    if (taken) {
        return PXT_OK;
    }
    if (mode == MODE_LT) {
        return pxt_error(PXT_ERR_NOT_IMPLEMENTED,
                         "gemm_fused: PYXTTS_CUDA_GEMM_FUSED=lt but cuBLASLt has no kernel for "
                         "M=%d N=%d K=%d trans %d%d %s -> %s, epilogue %d",
                         g->M, g->N, g->K, g->trans_a, g->trans_b, pxt_dtype_name(g->dt_ab),
                         pxt_dtype_name(g->dt_c), (int)g->epilogue);
    }
    if (g->epilogue == PXT_EPI_DGELU_BGRAD) { /* the product, then one pass for the rest */
        PXT_TRY(pxt_cuda_gemm(index, g->trans_a, g->trans_b, g->M, g->N, g->K, g->alpha, g->A, g->B,
                              g->beta, g->D, g->dt_ab, g->dt_c, gemm_ws));
        return pxt_cuda_dgelu_bgrad(index, g->D, g->pre, g->dbias, g->M, g->N, g->dt_c, sums_ws);
    }
    return pxt_gemm_fused_composed(pxt_cuda_backend(), index, g, gemm_ws, sums_ws);
}

#undef LT_WS
#undef LT_CACHE
