/* dropout.cu: dropout of rows, forward and backward (csrc/cpu/dropout.c is the
 * reference): the launches of dropout.cuh's kernel, the CPU's bits. */
#include "elem.cuh"

#include "dropout.cuh"

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
        if (!n) {
            return;
        }
        const unsigned int blocks = (unsigned int)((n + PXT_EW_BLOCK - 1) / PXT_EW_BLOCK);
        /* a group's four elements in one access where C and the rows allow it */
        const void *ptrs[] = {dst, src, resid ? resid : dst};
        if (pxt_vec_width(sizeof(T), C, ptrs, 3) >= 4) {
            pxt_dropout_rows_kernel<T, 4><<<blocks, PXT_EW_BLOCK, 0, pxt_cuda_stream(index)>>>(
                (T *)dst, (const T *)src, (const T *)resid, N, C, groups, *d);
        } else {
            pxt_dropout_rows_kernel<T, 1><<<blocks, PXT_EW_BLOCK, 0, pxt_cuda_stream(index)>>>(
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
