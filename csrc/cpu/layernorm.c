/* layernorm.c: LayerNorm over the last dimension, forward and backward.
 *
 * Row statistics are reduced in double (C terms per row) and saved as float32
 * mean and rstd, which the backward reuses instead of recomputing. The backward
 * splits in two passes so that no thread ever adds into another's output:
 * dinp row by row (rows are independent), dweight and dbias by column slices,
 * each a two-stage column sum chunked as backend.h says (the CUDA kernels' bits,
 * for any thread count). */
#include <math.h>

#include "engine/backend.h"
#include "cpu.h"
#include "elem.h"

int pxt_cpu_layernorm_forward(int index, void *out, float *mean, float *rstd, const void *inp,
                              const void *weight, const void *bias, int N, int C, float eps,
                              pxt_dtype dt) {
    (void)index;
    int rc = pxt_cpu_check_float(dt, "layernorm_forward");
    if (rc != PXT_OK) {
        return rc;
    }
    if (N < 0 || C <= 0) {
        return pxt_error(PXT_ERR_VALUE, "layernorm_forward: bad size N=%d C=%d", N, C);
    }
    /* out, inp (N, C); weight, bias (C); mean, rstd (N) */
#pragma omp parallel for schedule(static) if ((size_t)N * C >= PXT_OMP_MIN_WORK)
    for (int i = 0; i < N; i++) {
        size_t row = (size_t)i * C;
        double s = 0.0;
        for (int j = 0; j < C; j++) {
            s += pxt_ld(inp, row + j, dt);
        }
        float m = (float)(s / C);
        /* variance around the rounded mean: two passes, no cancellation */
        double v = 0.0;
        for (int j = 0; j < C; j++) {
            double d = (double)pxt_ld(inp, row + j, dt) - m;
            v += d * d;
        }
        float r = (float)(1.0 / sqrt(v / C + eps));
        for (int j = 0; j < C; j++) {
            float n = (pxt_ld(inp, row + j, dt) - m) * r;
            pxt_st(out, row + j, dt, n * pxt_ld(weight, j, dt) + pxt_ld(bias, j, dt));
        }
        mean[i] = m;
        rstd[i] = r;
    }
    return PXT_OK;
}

int pxt_cpu_layernorm_backward(int index, void *dinp, float *dweight, float *dbias,
                               const void *dout, const void *inp, const void *weight,
                               const float *mean, const float *rstd, int N, int C, pxt_dtype dt,
                               void *workspace) {
    (void)index, (void)workspace;
    int rc = pxt_cpu_check_float(dt, "layernorm_backward");
    if (rc != PXT_OK) {
        return rc;
    }
    if (N < 0 || C <= 0) {
        return pxt_error(PXT_ERR_VALUE, "layernorm_backward: bad size N=%d C=%d", N, C);
    }
    /* dinp, dout, inp (N, C); weight (C); dweight, dbias (C) fp32; mean, rstd (N) */
    int par = (size_t)N * C >= PXT_OMP_MIN_WORK;

    /* pass 1, rows: with n = norm, g = weight * dout,
     * dinp += rstd * (g - mean(g) - n * mean(g * n)) */
#pragma omp parallel for schedule(static) if (par)
    for (int i = 0; i < N; i++) {
        size_t row = (size_t)i * C;
        float m = mean[i], r = rstd[i];
        double sg = 0.0, sgn = 0.0;
        for (int j = 0; j < C; j++) {
            float n = (pxt_ld(inp, row + j, dt) - m) * r;
            float g = pxt_ld(weight, j, dt) * pxt_ld(dout, row + j, dt);
            sg += g;
            sgn += (double)g * n;
        }
        float mg = (float)(sg / C), mgn = (float)(sgn / C);
        for (int j = 0; j < C; j++) {
            float n = (pxt_ld(inp, row + j, dt) - m) * r;
            float g = pxt_ld(weight, j, dt) * pxt_ld(dout, row + j, dt);
            pxt_st(dinp, row + j, dt, pxt_ld(dinp, row + j, dt) + (g - mg - n * mgn) * r);
        }
    }

    /* pass 2, column slices: dbias += sum_i dout, dweight += sum_i n * dout,
     * per chunk of R rows (stage 1), then the chunks in order (stage 2) */
    int R = pxt_colsum_chunk_rows(N, C);
    int nslices = (C + PXT_COL_SLICE - 1) / PXT_COL_SLICE;
#pragma omp parallel for schedule(static) if (par)
    for (int s = 0; s < nslices; s++) {
        int c0 = s * PXT_COL_SLICE, w = C - c0 < PXT_COL_SLICE ? C - c0 : PXT_COL_SLICE;
        double dw[PXT_COL_SLICE] = {0}, db[PXT_COL_SLICE] = {0}; /* (w) totals */
        double pw[PXT_COL_SLICE], pb[PXT_COL_SLICE];             /* (w) one chunk's */
        for (int i0 = 0; i0 < N; i0 += R) {
            int i1 = N - i0 < R ? N : i0 + R;
            for (int j = 0; j < w; j++) {
                pw[j] = pb[j] = 0.0;
            }
            for (int i = i0; i < i1; i++) {
                size_t row = (size_t)i * C + c0;
                float m = mean[i], r = rstd[i];
                for (int j = 0; j < w; j++) {
                    float g = pxt_ld(dout, row + j, dt);
                    float n = (pxt_ld(inp, row + j, dt) - m) * r;
                    pb[j] += g;
                    pw[j] += (double)n * g;
                }
            }
            for (int j = 0; j < w; j++) {
                dw[j] += pw[j];
                db[j] += pb[j];
            }
        }
        for (int j = 0; j < w; j++) {
            dweight[c0 + j] = (float)(dweight[c0 + j] + dw[j]);
            dbias[c0 + j] = (float)(dbias[c0 + j] + db[j]);
        }
    }
    return PXT_OK;
}
