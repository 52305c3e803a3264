/* rmsnorm.cu: the perceiver's RMS norm on the GPU, forward and backward
 * (csrc/cpu/rmsnorm.c is the reference; the kernels are in rmsnorm.cuh, where
 * the emulator of tests/cuda_emu runs them too).
 *
 * A warp per row, reading vectors of up to 16 bytes where C and the pointers
 * allow it. dgamma is backend.h's two-stage column sum (colsum.cu): the CPU's
 * bits, deterministic, without atomics. */
#include "elem.cuh"

#include "rmsnorm.cuh"

static int check(int N, int C, const char *op) {
    if (N < 0 || C < 1) {
        return pxt_error(PXT_ERR_VALUE, "%s: bad size N=%d C=%d", op, N, C);
    }
    return PXT_OK;
}

int pxt_cuda_rmsnorm_forward(int index, void *out, float *norm, const void *inp, const void *gamma,
                             int N, int C, float scale, float eps, pxt_dtype dt) {
    PXT_TRY(check(N, C, "rmsnorm_forward"));
    PXT_CUDA_ENTER(index);
    /* out, inp (N, C); gamma (C); norm (N) */
    PXT_TRY(pxt_cuda_dispatch(dt, "rmsnorm_forward", [&](auto tag) {
        using T = decltype(tag);
        const void *ptrs[] = {out, inp, gamma};
        pxt_vec_dispatch<T>(pxt_vec_width(sizeof(T), C, ptrs, 3), [&](auto v) {
            if (N) {
                pxt_rms_forward_kernel<T, decltype(v)::value>
                    <<<(N + PXT_RMS_WARPS - 1) / PXT_RMS_WARPS, 32 * PXT_RMS_WARPS, 0,
                       pxt_cuda_stream(index)>>>((T *)out, norm, (const T *)inp, (const T *)gamma,
                                                 N, C, scale, eps);
            }
        });
    }));
    PXT_CUDA_CHECK_LAUNCH("rmsnorm_forward");
    return PXT_OK;
}

int pxt_cuda_rmsnorm_backward(int index, void *dinp, float *dgamma, const void *dout,
                              const void *inp, const void *gamma, const float *norm, int N, int C,
                              float scale, float eps, pxt_dtype dt, void *workspace) {
    PXT_TRY(check(N, C, "rmsnorm_backward"));
    PXT_CUDA_ENTER(index);
    /* pass 1, a warp per row: dinp (N, C) += */
    PXT_TRY(pxt_cuda_dispatch(dt, "rmsnorm_backward", [&](auto tag) {
        using T = decltype(tag);
        const void *ptrs[] = {dinp, dout, inp, gamma};
        pxt_vec_dispatch<T>(pxt_vec_width(sizeof(T), C, ptrs, 4), [&](auto v) {
            if (N) {
                pxt_rms_dinp_kernel<T, decltype(v)::value>
                    <<<(N + PXT_RMS_WARPS - 1) / PXT_RMS_WARPS, 32 * PXT_RMS_WARPS, 0,
                       pxt_cuda_stream(index)>>>((T *)dinp, (const T *)dout, (const T *)inp,
                                                 (const T *)gamma, norm, N, C, scale, eps);
            }
        });
    }));
    PXT_CUDA_CHECK_LAUNCH("rmsnorm_backward (dinp)");
    /* pass 2: dgamma (C) += sum_i dout * x / max(n, eps) * scale, two-stage */
    return pxt_cuda_rmsnorm_dgamma(index, dgamma, dout, inp, norm, N, C, scale, eps, dt, workspace);
}
