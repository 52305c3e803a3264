/* dropout.c (CPU): dropout of rows, forward and backward.
 *
 * Each row's masks come from dropout.h, four channels per Philox call: the bits
 * depend on the element's (sample, position, channel) and the site's key only,
 * so they are the same for any thread count, in the backward and in a
 * recomputation as in the forward. */
#include "cpu.h"
#include "elem.h"
#include "engine/backend.h" /* pxt_dropout and its generator (engine/dropout.h) */

static int check(const pxt_dropout *d, int N, int C, pxt_dtype dt, const char *op) {
    PXT_TRY(pxt_cpu_check_float(dt, op));
    if (N < 0 || C < 0 || !d || d->T < 1) {
        return pxt_error(PXT_ERR_VALUE, "%s: bad size N=%d C=%d T=%d", op, N, C, d ? d->T : 0);
    }
    return PXT_OK;
}

int pxt_cpu_dropout_forward(int index, void *x, const void *resid, int N, int C,
                            const pxt_dropout *d, pxt_dtype dt) {
    (void)index;
    PXT_TRY(check(d, N, C, dt, "dropout_forward"));
    const pxt_dropout live = pxt_dropout_resolve(*d); /* host memory: read here */
    d = &live;
    /* x, resid (N, C): x = resid + x * mask */
#pragma omp parallel for schedule(static) if ((size_t)N * C >= PXT_OMP_MIN_WORK)
    for (int r = 0; r < N; r++) {
        size_t row = (size_t)r * C;
        uint32_t w[4];
        for (int c = 0; c < C; c++) {
            if ((c & 3) == 0) {
                pxt_dropout_row_words(d, r, c, w);
            }
            float v = pxt_ld(x, row + c, dt) * pxt_dropout_factor(d, w[c & 3]);
            pxt_st(x, row + c, dt, resid ? pxt_ld(resid, row + c, dt) + v : v);
        }
    }
    return PXT_OK;
}

int pxt_cpu_dropout_backward(int index, void *dx, const void *dy, int N, int C,
                             const pxt_dropout *d, pxt_dtype dt) {
    (void)index;
    PXT_TRY(check(d, N, C, dt, "dropout_backward"));
    const pxt_dropout live = pxt_dropout_resolve(*d); /* host memory: read here */
    d = &live;
    /* dx, dy (N, C): dx = dy * mask; element i is read before it is written */
#pragma omp parallel for schedule(static) if ((size_t)N * C >= PXT_OMP_MIN_WORK)
    for (int r = 0; r < N; r++) {
        size_t row = (size_t)r * C;
        uint32_t w[4];
        for (int c = 0; c < C; c++) {
            if ((c & 3) == 0) {
                pxt_dropout_row_words(d, r, c, w);
            }
            pxt_st(dx, row + c, dt, pxt_ld(dy, row + c, dt) * pxt_dropout_factor(d, w[c & 3]));
        }
    }
    return PXT_OK;
}
