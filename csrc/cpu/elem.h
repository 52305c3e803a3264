/* elem.h: element access shared by the CPU kernels.
 *
 * Activations and parameters come as float32, float16 or bfloat16; kernels load
 * every element to float, compute in float (or double for long reductions) and
 * store once, rounded to nearest even (the conversions of pxt.h). */
#ifndef PXT_CPU_ELEM_H
#define PXT_CPU_ELEM_H

#include "engine/pxt.h"

/* p[i] of dtype dt as a float. */
static inline float pxt_ld(const void *p, size_t i, pxt_dtype dt) {
    switch (dt) {
    case PXT_FLOAT16: return pxt_f16_to_f32(((const uint16_t *)p)[i]);
    case PXT_BFLOAT16: return pxt_bf16_to_f32(((const uint16_t *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

/* p[i] = v, rounded to dtype dt. */
static inline void pxt_st(void *p, size_t i, pxt_dtype dt, float v) {
    switch (dt) {
    case PXT_FLOAT16: ((uint16_t *)p)[i] = pxt_f32_to_f16(v); break;
    case PXT_BFLOAT16: ((uint16_t *)p)[i] = pxt_f32_to_bf16(v); break;
    default: ((float *)p)[i] = v; break;
    }
}

/* PXT_OK when dt is an activation dtype, else PXT_ERR_TYPE naming the op. */
static inline int pxt_cpu_check_float(pxt_dtype dt, const char *op) {
    if (dt == PXT_FLOAT32 || dt == PXT_FLOAT16 || dt == PXT_BFLOAT16) {
        return PXT_OK;
    }
    return pxt_error(PXT_ERR_TYPE, "%s: dtype must be float32, float16 or bfloat16, got %s", op,
                     pxt_dtype_name(dt));
}

/* Checks ids (n) are in [lo, hi) before a kernel indexes with them: O(n), and a
 * bad id would otherwise read or write outside a table. */
static inline int pxt_cpu_check_ids(const int32_t *ids, int n, int lo, int hi, const char *op) {
    for (int i = 0; i < n; i++) {
        if (ids[i] < lo || ids[i] >= hi) {
            return pxt_error(PXT_ERR_VALUE, "%s: index %d at position %d is outside [%d, %d)", op,
                             (int)ids[i], i, lo, hi);
        }
    }
    return PXT_OK;
}

/* Work (elements) below which a kernel stays on one thread: a parallel region
 * costs a few microseconds. */
#define PXT_OMP_MIN_WORK 32768

/* Width of the column slices of the deterministic column reductions: each
 * thread owns whole slices and adds rows into them in order, so the result does
 * not depend on the number of threads. */
#define PXT_COL_SLICE 64

/* One row's terms of a column sum (of one or two sums at once): adds the terms of
 * row i, columns c0 .. c0+w-1 (w <= PXT_COL_SLICE), to part[0][0 .. w) and, for
 * a second sum, part[1][0 .. w), in column order. */
typedef void (*pxt_cpu_colsum_row)(const void *ctx, int i, int c0, int w,
                                   double part[2][PXT_COL_SLICE]);

/* out0 (cols) += the column sums of the first terms over rows, out1 (cols; NULL:
 * none) of the second, as backend.h chunks them: per chunk of
 * pxt_colsum_chunk_rows(rows, cols) rows in double from 0.0, rows in order; the
 * chunk sums in order; the total added once. A task per slice of columns: the
 * same bits for any thread count, and the CUDA kernels' (bias.c). */
void pxt_cpu_colsum(int rows, int cols, pxt_cpu_colsum_row row, const void *ctx, float *out0,
                    float *out1);

#endif
