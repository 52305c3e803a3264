/* embedding.c: table lookup forward, scatter-add backward.
 *
 * The backward is a scatter: several rows of dout may hit the same table row
 * (repeated tokens, every batch's position 0). Instead of atomics, each task
 * owns a slice of the C columns for every table row and walks all N ids in
 * order, so each dtable element receives its additions in index order:
 * bit-identical for any thread count. */
#include "cpu.h"
#include "elem.h"

int pxt_cpu_embedding_forward(int index, void *out, const int32_t *ids, const void *table, int N,
                              int C, int accumulate, pxt_dtype dt) {
    (void)index;
    int rc = pxt_cpu_check_float(dt, "embedding_forward");
    if (rc != PXT_OK) {
        return rc;
    }
    if (N < 0 || C < 0) {
        return pxt_error(PXT_ERR_VALUE, "embedding_forward: negative size N=%d C=%d", N, C);
    }
    /* out (N, C); ids (N) in [0, V) (the caller checked: V is not passed in);
     * table (V, C) */
#pragma omp parallel for schedule(static) if ((size_t)N * C >= PXT_OMP_MIN_WORK)
    for (int i = 0; i < N; i++) {
        size_t row = (size_t)i * C, trow = (size_t)ids[i] * C;
        for (int j = 0; j < C; j++) {
            float v = pxt_ld(table, trow + j, dt);
            pxt_st(out, row + j, dt, accumulate ? pxt_ld(out, row + j, dt) + v : v);
        }
    }
    return PXT_OK;
}

int pxt_cpu_embedding_backward(int index, float *dtable, const void *dout, const int32_t *ids,
                               int N, int C, pxt_dtype dt) {
    (void)index;
    int rc = pxt_cpu_check_float(dt, "embedding_backward");
    if (rc != PXT_OK) {
        return rc;
    }
    if (N < 0 || C < 0) {
        return pxt_error(PXT_ERR_VALUE, "embedding_backward: negative size N=%d C=%d", N, C);
    }
    /* dtable (V, C) fp32 +=; dout (N, C); ids (N) in [0, V) */
    int nslices = (C + PXT_COL_SLICE - 1) / PXT_COL_SLICE;
#pragma omp parallel for schedule(static) if ((size_t)N * C >= PXT_OMP_MIN_WORK)
    for (int s = 0; s < nslices; s++) {
        int c0 = s * PXT_COL_SLICE, w = C - c0 < PXT_COL_SLICE ? C - c0 : PXT_COL_SLICE;
        for (int i = 0; i < N; i++) {
            float *drow = dtable + (size_t)ids[i] * C + c0; /* (w) */
            size_t row = (size_t)i * C + c0;
            for (int j = 0; j < w; j++) {
                drow[j] += pxt_ld(dout, row + j, dt);
            }
        }
    }
    return PXT_OK;
}
