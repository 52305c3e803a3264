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

/* The terms of dweight and dbias of row i: n * dout and dout, n = (inp - mean) * rstd
 * rounded to float as the forward formed it. */
typedef struct {
    const void *dout, *inp;   /* (N, C) */
    const float *mean, *rstd; /* (N) */
    int C;
    pxt_dtype dt;
} ln_terms;

static void ln_row(const void *ctx, int i, int c0, int w, double part[2][PXT_COL_SLICE]) {
    const ln_terms *t = ctx;
    size_t row = (size_t)i * t->C + c0;
    float m = t->mean[i], r = t->rstd[i];
    for (int j = 0; j < w; j++) {
        float g = pxt_ld(t->dout, row + j, t->dt);
        float n = (pxt_ld(t->inp, row + j, t->dt) - m) * r;
        part[0][j] += (double)n * g;
        part[1][j] += g;
    }
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

    /* pass 2, column sums: dweight += sum_i n * dout, dbias += sum_i dout */
    ln_terms t = {dout, inp, mean, rstd, C, dt};
    pxt_cpu_colsum(N, C, ln_row, &t, dweight, dbias);
    return PXT_OK;
}
