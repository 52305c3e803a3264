/* colsum.cu: the deterministic column sums on the GPU (kernels in colsum.cuh):
 * bias_backward, layernorm's dweight and dbias for layernorm.cu, GroupNorm's
 * dweight and dbias for groupnorm.cu, the RMS norm's dgamma for rmsnorm.cu, and
 * fc's GELU gradient with its bias gradient for gemm_fused.cu. The
 * chunking is backend.h's, so the results are the CPU's bits (csrc/cpu/bias.c,
 * layernorm.c), while (chunks x columns) threads share the rows: about 2^17
 * partial sums per call, against one thread per column walking every row. */
#include "elem.cuh"

#include "colsum.cuh"
#include "gelu.cuh"

#define COLSUM_MAX_GRID_Y 65535

/* Both stages of the terms f over (rows, cols) into out0 (and out1). The
 * device is current (the caller's PXT_CUDA_ENTER). */
template <typename F>
static int colsum_run(int index, F f, float *out0, float *out1, int rows, int cols, void *workspace,
                      const char *what) {
    if (cols == 0) {
        return PXT_OK;
    }
    const int R = pxt_colsum_chunk_rows(rows, cols), nchunks = pxt_colsum_chunks(rows, cols);
    if (nchunks > 0 && !workspace) {
        return pxt_error(PXT_ERR_VALUE,
                         "%s: no workspace (colsum_workspace(%d, %d) bytes), got "
                         "NULL",
                         what, rows, cols);
    }
    cudaStream_t stream = pxt_cuda_stream(index);
    double *parts = (double *)workspace; /* (NV, nchunks, cols) */
    const unsigned int gx = (unsigned int)((cols + PXT_COLSUM_BLOCK - 1) / PXT_COLSUM_BLOCK);
    if (nchunks > 0) { /* V columns a thread where the rows allow 16-byte loads */
        pxt_colsum_dispatch(f, cols, [&](auto v) {
            constexpr int V = decltype(v)::value;
            dim3 grid((unsigned int)((cols / V + PXT_COLSUM_BLOCK - 1) / PXT_COLSUM_BLOCK),
                      nchunks < COLSUM_MAX_GRID_Y ? nchunks : COLSUM_MAX_GRID_Y);
            pxt_colsum_parts_kernel<F, V>
                <<<grid, PXT_COLSUM_BLOCK, 0, stream>>>(parts, f, rows, cols, R, nchunks);
        });
        PXT_CUDA_CHECK_LAUNCH(what);
    }
    pxt_colsum_finish_kernel<<<dim3(gx, F::NV), PXT_COLSUM_BLOCK, 0, stream>>>(out0, out1, parts,
                                                                               nchunks, cols);
    PXT_CUDA_CHECK_LAUNCH(what);
    return PXT_OK;
}

int pxt_cuda_bias_backward(int index, float *dbias, const void *dout, int M, int N, int ld,
                           pxt_dtype dt, void *workspace) {
    if (M < 0 || N < 0) {
        return pxt_error(PXT_ERR_VALUE, "bias_backward: negative size M=%d N=%d", M, N);
    }
    if (ld < N) {
        return pxt_error(PXT_ERR_VALUE, "bias_backward: rows %d apart, fewer than N=%d", ld, N);
    }
    PXT_CUDA_ENTER(index);
    int rc = PXT_OK;
    PXT_TRY(pxt_cuda_dispatch(dt, "bias_backward", [&](auto tag) {
        using T = decltype(tag);
        pxt_colsum_rows<T> f = {(const T *)dout, ld};
        rc = colsum_run(index, f, dbias, NULL, M, N, workspace, "bias_backward");
    }));
    return rc;
}

int pxt_cuda_layernorm_dparams(int index, float *dweight, float *dbias, const void *dout,
                               const void *inp, const float *mean, const float *rstd, int N, int C,
                               pxt_dtype dt, void *workspace) {
    PXT_CUDA_ENTER(index);
    int rc = PXT_OK;
    PXT_TRY(pxt_cuda_dispatch(dt, "layernorm_backward", [&](auto tag) {
        using T = decltype(tag);
        pxt_colsum_ln<T> f = {{(const T *)dout, (const T *)inp, C}, mean, rstd};
        rc = colsum_run(index, f, dweight, dbias, N, C, workspace,
                        "layernorm_backward (dweight, dbias)");
    }));
    return rc;
}

int pxt_cuda_groupnorm_dparams(int index, float *dweight, float *dbias, const void *dout,
                               const void *inp, const float *mean, const float *rstd, int B, int S,
                               int C, int G, pxt_dtype dt, void *workspace) {
    PXT_CUDA_ENTER(index);
    int rc = PXT_OK;
    PXT_TRY(pxt_cuda_dispatch(dt, "groupnorm_backward", [&](auto tag) {
        using T = decltype(tag);
        pxt_colsum_gn<T> f = {{(const T *)dout, (const T *)inp, C}, mean, rstd, S, G, C / G};
        rc = colsum_run(index, f, dweight, dbias, B * S, C, workspace,
                        "groupnorm_backward (dweight, dbias)");
    }));
    return rc;
}

int pxt_cuda_rmsnorm_dgamma(int index, float *dgamma, const void *dout, const void *inp,
                            const float *norm, int N, int C, float scale, float eps, pxt_dtype dt,
                            void *workspace) {
    PXT_CUDA_ENTER(index);
    int rc = PXT_OK;
    PXT_TRY(pxt_cuda_dispatch(dt, "rmsnorm_backward", [&](auto tag) {
        using T = decltype(tag);
        pxt_colsum_rms<T> f = {{(const T *)dout, (const T *)inp, C}, norm, scale, eps};
        rc = colsum_run(index, f, dgamma, NULL, N, C, workspace, "rmsnorm_backward (dgamma)");
    }));
    return rc;
}

int pxt_cuda_dgelu_bgrad(int index, void *d, const void *pre, float *dbias, int M, int N,
                         pxt_dtype dt, void *workspace) {
    if (M < 0 || N < 0) {
        return pxt_error(PXT_ERR_VALUE, "gemm_fused (GELU gradient): negative size M=%d N=%d", M,
                         N);
    }
    PXT_CUDA_ENTER(index);
    int rc = PXT_OK;
    PXT_TRY(pxt_cuda_dispatch(dt, "gemm_fused (GELU gradient)", [&](auto tag) {
        using T = decltype(tag);
        pxt_colsum_dgelu<T> f = {(T *)d, (const T *)pre, N};
        rc = colsum_run(index, f, dbias, NULL, M, N, workspace,
                        "gemm_fused (GELU and bias gradients)");
    }));
    return rc;
}

#undef COLSUM_MAX_GRID_Y
