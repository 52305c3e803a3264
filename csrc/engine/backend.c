/* backend.c: which backend serves a device type. */
#include "backend.h"

const pxt_backend *pxt_backend_for(pxt_device_type type) {
    switch (type) {
    case PXT_CPU: return pxt_cpu_backend();
#ifdef PXT_WITH_CUDA
    case PXT_CUDA: return pxt_cuda_backend();
#endif
    default: return NULL;
    }
}

const pxt_backend *pxt_backend_plan_for(pxt_device_type type) {
    const pxt_backend *be = pxt_backend_for(type);
    return be ? be : type == PXT_CUDA ? pxt_cuda_sizes_backend() : NULL;
}

int pxt_gemm_args_check(const pxt_gemm_args *g) {
    if (g->M < 0 || g->N < 0 || g->K < 0) {
        return pxt_error(PXT_ERR_VALUE, "gemm_fused: negative size M=%d N=%d K=%d", g->M, g->N,
                         g->K);
    }
    if (!g->D) {
        return pxt_error(PXT_ERR_VALUE, "gemm_fused: D (the output) is NULL");
    }
    switch (g->epilogue) {
    case PXT_EPI_NONE: return PXT_OK;
    case PXT_EPI_BIAS:
        return g->bias ? PXT_OK : pxt_error(PXT_ERR_VALUE, "gemm_fused (bias): bias is NULL");
    case PXT_EPI_BIAS_GELU:
        if (!g->bias || !g->pre) {
            return pxt_error(PXT_ERR_VALUE, "gemm_fused (bias + gelu): bias and pre are required");
        }
        if (g->pre == g->D) {
            return pxt_error(PXT_ERR_VALUE, "gemm_fused (bias + gelu): pre must not be D");
        }
        return PXT_OK;
    case PXT_EPI_DGELU_BGRAD:
        if (!g->pre || !g->dbias) {
            return pxt_error(PXT_ERR_VALUE,
                             "gemm_fused (dgelu + bgrad): pre and dbias are required");
        }
        if (g->alpha != 1.0f || g->beta != 0.0f) {
            return pxt_error(PXT_ERR_VALUE,
                             "gemm_fused (dgelu + bgrad): needs alpha = 1 and "
                             "beta = 0, got %g and %g",
                             (double)g->alpha, (double)g->beta);
        }
        return PXT_OK;
    case PXT_EPI_BGRAD_B:
        if (!g->dbias) {
            return pxt_error(PXT_ERR_VALUE, "gemm_fused (bgrad of B): dbias is NULL");
        }
        if (g->alpha != 1.0f || g->trans_b) {
            return pxt_error(PXT_ERR_VALUE,
                             "gemm_fused (bgrad of B): needs alpha = 1 and B not "
                             "transposed, got alpha %g, trans_b %d",
                             (double)g->alpha, g->trans_b);
        }
        return PXT_OK;
    default: return pxt_error(PXT_ERR_VALUE, "gemm_fused: unknown epilogue %d", (int)g->epilogue);
    }
}

int pxt_gemm_fused_composed(const pxt_backend *be, int index, const pxt_gemm_args *g, void *gemm_ws,
                            void *sums_ws) {
    PXT_TRY(pxt_gemm_args_check(g));
    size_t mn = (size_t)g->M * (size_t)g->N;
    /* the product lands in pre for bias + gelu (D gets gelu of it), else in D */
    void *P = g->epilogue == PXT_EPI_BIAS_GELU ? g->pre : g->D; /* (M, N) */
    const void *C = g->C ? g->C : g->D;
    if (g->beta != 0.0f && C != P && mn) {
        PXT_TRY(be->copy(index, P, C, mn * pxt_dtype_size(g->dt_c), PXT_COPY_D2D));
    }
    PXT_TRY(be->gemm(index, g->trans_a, g->trans_b, g->M, g->N, g->K, g->alpha, g->A, g->B, g->beta,
                     P, g->dt_ab, g->dt_c, gemm_ws));
    switch (g->epilogue) {
    case PXT_EPI_BIAS: return be->add_bias(index, P, g->bias, g->M, g->N, g->dt_c);
    case PXT_EPI_BIAS_GELU:
        PXT_TRY(be->add_bias(index, P, g->bias, g->M, g->N, g->dt_c));
        return be->gelu_forward(index, g->D, P, mn, g->dt_c);
    case PXT_EPI_DGELU_BGRAD:
        PXT_TRY(be->gelu_backward(index, g->D, g->pre, g->D, mn, g->dt_c));
        return be->bias_backward(index, g->dbias, g->D, g->M, g->N, g->N, g->dt_c, sums_ws);
    case PXT_EPI_BGRAD_B: /* op(B) = B (K, N): its column sums over the K rows */
        return be->bias_backward(index, g->dbias, g->B, g->K, g->N, g->N, g->dt_ab, sums_ws);
    default: return PXT_OK;
    }
}
