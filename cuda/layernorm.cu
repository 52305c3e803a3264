/* layernorm.cu: LayerNorm over the last dimension, forward and backward
 * (csrc/cpu/layernorm.c is the reference).
 *
 * Rows go one per warp: the row sums are taken in double (lanes take the row's
 * vectors in turn, then a fixed butterfly, vec.cuh's), and mean, rstd are saved as
 * float32 as on the CPU; the forward's and the backward's dinp kernels are in
 * layernorm.cuh (the emulator of tests/cuda_emu runs them too). dweight and dbias are backend.h's two-stage column sums (colsum.cu):
 * the CPU's bits, with (chunks x columns) threads instead of one per column. */
#include "elem.cuh"

#include "layernorm.cuh"

int pxt_cuda_layernorm_forward(int index, void *out, float *mean, float *rstd, const void *inp,
                               const void *weight, const void *bias, int N, int C, float eps,
                               pxt_dtype dt) {
    if (N < 0 || C <= 0) {
        return pxt_error(PXT_ERR_VALUE, "layernorm_forward: bad size N=%d C=%d", N, C);
    }
    PXT_CUDA_ENTER(index);
    /* a warp per row (layernorm.cuh), 16 bytes per access where C and the pointers allow */
    PXT_TRY(pxt_cuda_dispatch(dt, "layernorm_forward", [&](auto tag) {
        using T = decltype(tag);
        const void *ptrs[] = {out, inp, weight, bias};
        pxt_vec_dispatch<T>(pxt_vec_width(sizeof(T), C, ptrs, 4), [&](auto v) {
            if (N) {
                pxt_ln_forward_kernel<T, decltype(v)::value>
                    <<<(N + PXT_LN_WARPS - 1) / PXT_LN_WARPS, 32 * PXT_LN_WARPS, 0,
                       pxt_cuda_stream(index)>>>((T *)out, mean, rstd, (const T *)inp,
                                                 (const T *)weight, (const T *)bias, N, C, eps);
            }
        });
    }));
    PXT_CUDA_CHECK_LAUNCH("layernorm_forward");
    return PXT_OK;
}

int pxt_cuda_layernorm_backward(int index, void *dinp, float *dweight, float *dbias,
                                const void *dout, const void *inp, const void *weight,
                                const float *mean, const float *rstd, int N, int C, pxt_dtype dt,
                                void *workspace) {
    if (N < 0 || C <= 0) {
        return pxt_error(PXT_ERR_VALUE, "layernorm_backward: bad size N=%d C=%d", N, C);
    }
    PXT_CUDA_ENTER(index);
    cudaStream_t stream = pxt_cuda_stream(index);
    /* dinp, dout, inp (N, C); weight (C); dweight, dbias (C) fp32; mean, rstd (N) */
    /* pass 1, a warp per row (layernorm.cuh): dinp (N, C) += */
    PXT_TRY(pxt_cuda_dispatch(dt, "layernorm_backward", [&](auto tag) {
        using T = decltype(tag);
        const void *ptrs[] = {dinp, dout, inp, weight};
        pxt_vec_dispatch<T>(pxt_vec_width(sizeof(T), C, ptrs, 4), [&](auto v) {
            if (N) {
                pxt_ln_dinp_kernel<T, decltype(v)::value>
                    <<<(N + PXT_LN_WARPS - 1) / PXT_LN_WARPS, 32 * PXT_LN_WARPS, 0, stream>>>(
                        (T *)dinp, (const T *)dout, (const T *)inp, (const T *)weight, mean, rstd,
                        N, C);
            }
        });
    }));
    PXT_CUDA_CHECK_LAUNCH("layernorm_backward (dinp)");
    /* pass 2: dbias += sum_i dout, dweight += sum_i n * dout, two-stage */
    return pxt_cuda_layernorm_dparams(index, dweight, dbias, dout, inp, mean, rstd, N, C, dt,
                                      workspace);
}
