/* groupnorm.cu: GroupNorm of the conditioning encoder on the GPU, forward and
 * backward (csrc/cpu/groupnorm.c is the reference; the kernels are in
 * groupnorm.cuh, where the emulator of tests/cuda_emu runs them too).
 *
 * A block per (sample, group), reading the group as vectors of up to 16 bytes
 * where the channels per group and the pointers allow it. dweight and dbias are
 * backend.h's two-stage column sums over the B x S rows (colsum.cu): the CPU's
 * bits, deterministic, without atomics. */
#include "elem.cuh"

#include "groupnorm.cuh"

static int check(int B, int S, int C, int G, const char *op) {
    if (B < 0 || S < 1 || C < 1 || G < 1 || C % G) {
        return pxt_error(PXT_ERR_VALUE, "%s: bad size B=%d S=%d C=%d G=%d", op, B, S, C, G);
    }
    return PXT_OK;
}

int pxt_cuda_groupnorm_forward(int index, void *out, float *mean, float *rstd, const void *inp,
                               const void *weight, const void *bias, int B, int S, int C, int G,
                               float eps, pxt_dtype dt) {
    PXT_TRY(check(B, S, C, G, "groupnorm_forward"));
    PXT_CUDA_ENTER(index);
    /* out, inp (B, S, C); weight, bias (C); mean, rstd (B, G) */
    PXT_TRY(pxt_cuda_dispatch(dt, "groupnorm_forward", [&](auto tag) {
        using T = decltype(tag);
        const void *ptrs[] = {out, inp, weight, bias};
        pxt_vec_dispatch<T>(pxt_vec_width(sizeof(T), C / G, ptrs, 4), [&](auto v) {
            if (B) {
                pxt_gn_forward_kernel<T, decltype(v)::value>
                    <<<B * G, PXT_GN_THREADS, 0, pxt_cuda_stream(index)>>>(
                        (T *)out, mean, rstd, (const T *)inp, (const T *)weight, (const T *)bias, S,
                        C, G, eps);
            }
        });
    }));
    PXT_CUDA_CHECK_LAUNCH("groupnorm_forward");
    return PXT_OK;
}

int pxt_cuda_groupnorm_backward(int index, void *dinp, float *dweight, float *dbias,
                                const void *dout, const void *inp, const void *weight,
                                const float *mean, const float *rstd, int B, int S, int C, int G,
                                pxt_dtype dt, void *workspace) {
    PXT_TRY(check(B, S, C, G, "groupnorm_backward"));
    PXT_CUDA_ENTER(index);
    /* pass 1, a block per (sample, group): dinp (B, S, C) += */
    PXT_TRY(pxt_cuda_dispatch(dt, "groupnorm_backward", [&](auto tag) {
        using T = decltype(tag);
        const void *ptrs[] = {dinp, dout, inp, weight};
        pxt_vec_dispatch<T>(pxt_vec_width(sizeof(T), C / G, ptrs, 4), [&](auto v) {
            if (B) {
                pxt_gn_dinp_kernel<T, decltype(v)::value>
                    <<<B * G, PXT_GN_THREADS, 0, pxt_cuda_stream(index)>>>(
                        (T *)dinp, (const T *)dout, (const T *)inp, (const T *)weight, mean, rstd,
                        S, C, G);
            }
        });
    }));
    PXT_CUDA_CHECK_LAUNCH("groupnorm_backward (dinp)");
    /* pass 2: dweight (C) += sum n * dout, dbias (C) += sum dout, two-stage */
    return pxt_cuda_groupnorm_dparams(index, dweight, dbias, dout, inp, mean, rstd, B, S, C, G, dt,
                                      workspace);
}
