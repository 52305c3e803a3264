/* dropout.cu: dropout of rows, forward and backward (csrc/cpu/dropout.c is the
 * reference).
 *
 * The masks are engine/dropout.h's: a pure function of (site key, sample,
 * position, channel), so this kernel draws the CPU's bits in any order. One
 * thread owns a group of four channels of one row, the four words of one
 * Philox call, as the CPU's loop does; the arithmetic is the CPU's (x * factor,
 * then + resid, each rounded: -fmad=false), so the results are its bits. */
#include "elem.cuh"
#include "engine/dropout.h"

/* dst, src, resid (N, C): dst = resid + src * mask (resid NULL: src * mask). The
 * forward is dst = src = x; the backward dst = dx, src = dy, no resid (dx may be dy:
 * each element is read, then written, by one thread). One thread per (row, group of 4
 * channels). */
template <typename T>
__global__ static void dropout_rows_kernel(T *dst, const T *src, const T *resid, int N, int C,
                                           int groups, pxt_dropout d) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)N * groups) {
        return;
    }
    int r = (int)(i / groups), c0 = (int)(i % groups) * 4;
    uint32_t w[4];
    pxt_dropout_row_words(&d, r, c0, w);
    size_t row = (size_t)r * C;
    int n = C - c0 < 4 ? C - c0 : 4;
    for (int k = 0; k < n; k++) {
        size_t e = row + c0 + k;
        float v = ldf(src[e]) * pxt_dropout_factor(&d, w[k]);
        dst[e] = stf<T>(resid ? ldf(resid[e]) + v : v);
    }
}

static int dropout_rows(int index, void *dst, const void *src, const void *resid, int N, int C,
                        const pxt_dropout *d, pxt_dtype dt, const char *op) {
    if (N < 0 || C < 0 || !d || d->T < 1) {
        return pxt_error(PXT_ERR_VALUE, "%s: bad size N=%d C=%d T=%d", op, N, C, d ? d->T : 0);
    }
    PXT_CUDA_ENTER(index);
    int groups = (C + 3) / 4;
    size_t n = (size_t)N * groups; /* threads; N * groups / 256 blocks < 2^31 for int N, C */
    PXT_TRY(pxt_cuda_dispatch(dt, op, [&](auto tag) {
        using T = decltype(tag);
        if (n) {
            unsigned int blocks = (unsigned int)((n + PXT_EW_BLOCK - 1) / PXT_EW_BLOCK);
            dropout_rows_kernel<T><<<blocks, PXT_EW_BLOCK, 0, pxt_cuda_stream(index)>>>(
                (T *)dst, (const T *)src, (const T *)resid, N, C, groups, *d);
        }
    }));
    PXT_CUDA_CHECK_LAUNCH(op);
    return PXT_OK;
}

/* x, resid (N, C): x = resid + x * mask (resid NULL: x * mask). */
int pxt_cuda_dropout_forward(int index, void *x, const void *resid, int N, int C,
                             const pxt_dropout *d, pxt_dtype dt) {
    return dropout_rows(index, x, x, resid, N, C, d, dt, "dropout_forward");
}

/* dx, dy (N, C): dx = dy * mask; dx may be dy. */
int pxt_cuda_dropout_backward(int index, void *dx, const void *dy, int N, int C,
                              const pxt_dropout *d, pxt_dtype dt) {
    return dropout_rows(index, dx, dy, NULL, N, C, d, dt, "dropout_backward");
}
