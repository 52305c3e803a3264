/* groupnorm.c (CPU): GroupNorm of the conditioning encoder, forward and backward.
 *
 * The input is (B, S, C) rows (channels contiguous), the transpose of torch's
 * (B, C, S): group g of sample b is channels [g C/G, (g+1) C/G) of its S rows.
 * Statistics are reduced in double over the group's S x C/G elements (two
 * passes) and saved as fp32 mean and rstd (B, G). The backward splits like
 * layernorm.c: dinp group by group (groups are independent), dweight and dbias
 * by column slices over all B x S rows, each a two-stage column sum chunked as
 * backend.h says (bit-identical for any thread count, and the CUDA kernels'
 * bits). */
#include <math.h>

#include "cpu.h"
#include "elem.h"

static int check(int B, int S, int C, int G, pxt_dtype dt, const char *op) {
    PXT_TRY(pxt_cpu_check_float(dt, op));
    if (B < 0 || S < 1 || C < 1 || G < 1 || C % G) {
        return pxt_error(PXT_ERR_VALUE, "%s: bad size B=%d S=%d C=%d G=%d", op, B, S, C, G);
    }
    return PXT_OK;
}

int pxt_cpu_groupnorm_forward(int index, void *out, float *mean, float *rstd, const void *inp,
                              const void *weight, const void *bias, int B, int S, int C, int G,
                              float eps, pxt_dtype dt) {
    (void)index;
    PXT_TRY(check(B, S, C, G, dt, "groupnorm_forward"));
    const int cg = C / G;
    const double M = (double)S * cg;
    /* out, inp (B, S, C); weight, bias (C); mean, rstd (B, G) */
#pragma omp parallel for schedule(static) if ((size_t)B * S * C >= PXT_OMP_MIN_WORK)
    for (int bg = 0; bg < B * G; bg++) {
        const int b = bg / G, c0 = (bg % G) * cg;
        const size_t base = (size_t)b * S * C + (size_t)c0;
        double s = 0.0;
        for (int t = 0; t < S; t++) {
            for (int j = 0; j < cg; j++) {
                s += pxt_ld(inp, base + (size_t)t * C + j, dt);
            }
        }
        float m = (float)(s / M);
        double v = 0.0; /* around the rounded mean: no cancellation */
        for (int t = 0; t < S; t++) {
            for (int j = 0; j < cg; j++) {
                double d = (double)pxt_ld(inp, base + (size_t)t * C + j, dt) - m;
                v += d * d;
            }
        }
        float r = (float)(1.0 / sqrt(v / M + eps));
        for (int t = 0; t < S; t++) {
            for (int j = 0; j < cg; j++) {
                size_t i = base + (size_t)t * C + j;
                float n = (pxt_ld(inp, i, dt) - m) * r;
                pxt_st(out, i, dt, n * pxt_ld(weight, c0 + j, dt) + pxt_ld(bias, c0 + j, dt));
            }
        }
        mean[bg] = m;
        rstd[bg] = r;
    }
    return PXT_OK;
}

/* The terms of dweight and dbias of row i (frame i % S of sample i / S): n * dout and
 * dout, n = (inp - mean) * rstd of the column's group, rounded to float as the forward
 * formed it. */
typedef struct {
    const void *dout, *inp;   /* (B * S, C) */
    const float *mean, *rstd; /* (B, G) */
    int S, C, G, cg;
    pxt_dtype dt;
} gn_terms;

static void gn_row(const void *ctx, int i, int c0, int w, double part[2][PXT_COL_SLICE]) {
    const gn_terms *t = ctx;
    size_t row = (size_t)i * t->C + c0;
    int b = i / t->S;
    for (int j = 0; j < w; j++) {
        int bg = b * t->G + (c0 + j) / t->cg;
        float g = pxt_ld(t->dout, row + j, t->dt);
        float n = (pxt_ld(t->inp, row + j, t->dt) - t->mean[bg]) * t->rstd[bg];
        part[0][j] += (double)n * g;
        part[1][j] += g;
    }
}

int pxt_cpu_groupnorm_backward(int index, void *dinp, float *dweight, float *dbias,
                               const void *dout, const void *inp, const void *weight,
                               const float *mean, const float *rstd, int B, int S, int C, int G,
                               pxt_dtype dt, void *workspace) {
    (void)index, (void)workspace;
    PXT_TRY(check(B, S, C, G, dt, "groupnorm_backward"));
    const int cg = C / G;
    const double M = (double)S * cg;
    int par = (size_t)B * S * C >= PXT_OMP_MIN_WORK;

    /* pass 1, groups: with n = norm, g = weight * dout,
     * dinp += rstd * (g - mean(g) - n * mean(g * n)) over the group's elements */
#pragma omp parallel for schedule(static) if (par)
    for (int bg = 0; bg < B * G; bg++) {
        const int b = bg / G, c0 = (bg % G) * cg;
        const size_t base = (size_t)b * S * C + (size_t)c0;
        const float m = mean[bg], r = rstd[bg];
        double sg = 0.0, sgn = 0.0;
        for (int t = 0; t < S; t++) {
            for (int j = 0; j < cg; j++) {
                size_t i = base + (size_t)t * C + j;
                float n = (pxt_ld(inp, i, dt) - m) * r;
                float g = pxt_ld(weight, c0 + j, dt) * pxt_ld(dout, i, dt);
                sg += g;
                sgn += (double)g * n;
            }
        }
        float mg = (float)(sg / M), mgn = (float)(sgn / M);
        for (int t = 0; t < S; t++) {
            for (int j = 0; j < cg; j++) {
                size_t i = base + (size_t)t * C + j;
                float n = (pxt_ld(inp, i, dt) - m) * r;
                float g = pxt_ld(weight, c0 + j, dt) * pxt_ld(dout, i, dt);
                pxt_st(dinp, i, dt, pxt_ld(dinp, i, dt) + (g - mg - n * mgn) * r);
            }
        }
    }

    /* pass 2, column sums over the B x S rows: dweight += sum n * dout, dbias += sum dout */
    gn_terms t = {dout, inp, mean, rstd, S, C, G, cg, dt};
    pxt_cpu_colsum(B * S, C, gn_row, &t, dweight, dbias);
    return PXT_OK;
}
