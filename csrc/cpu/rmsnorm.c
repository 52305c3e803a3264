/* rmsnorm.c (CPU): the perceiver's RMS norm, forward and backward.
 *
 *   out = x / max(|x|, eps) * scale * gamma     (F.normalize, then the gain)
 *
 * The norm is reduced in double and saved as fp32. Backward, with n = |x| and
 * g = dout * gamma * scale: dx = (g - xh (xh . g)) / n, xh = x / n, where n > eps;
 * below eps the divisor is the constant eps and dx = g / eps. dgamma sums over
 * rows in column slices, a two-stage column sum chunked as backend.h says
 * (bit-identical for any thread count, and the CUDA kernels' bits). */
#include <math.h>

#include "cpu.h"
#include "elem.h"

static int check(int N, int C, pxt_dtype dt, const char *op) {
    PXT_TRY(pxt_cpu_check_float(dt, op));
    if (N < 0 || C < 1) {
        return pxt_error(PXT_ERR_VALUE, "%s: bad size N=%d C=%d", op, N, C);
    }
    return PXT_OK;
}

int pxt_cpu_rmsnorm_forward(int index, void *out, float *norm, const void *inp, const void *gamma,
                            int N, int C, float scale, float eps, pxt_dtype dt) {
    (void)index;
    PXT_TRY(check(N, C, dt, "rmsnorm_forward"));
    /* out, inp (N, C); gamma (C); norm (N) */
#pragma omp parallel for schedule(static) if ((size_t)N * C >= PXT_OMP_MIN_WORK)
    for (int i = 0; i < N; i++) {
        size_t row = (size_t)i * C;
        double s = 0.0;
        for (int j = 0; j < C; j++) {
            double v = pxt_ld(inp, row + j, dt);
            s += v * v;
        }
        float n = (float)sqrt(s);
        float inv = 1.0f / (n > eps ? n : eps);
        for (int j = 0; j < C; j++) {
            pxt_st(out, row + j, dt, pxt_ld(inp, row + j, dt) * inv * scale * pxt_ld(gamma, j, dt));
        }
        norm[i] = n;
    }
    return PXT_OK;
}

/* The terms of dgamma of row i: dout * (x * inv * scale), inv = 1 / max(norm, eps)
 * rounded to float as the forward formed it. */
typedef struct {
    const void *dout, *inp; /* (N, C) */
    const float *norm;      /* (N) */
    int C;
    float scale, eps;
    pxt_dtype dt;
} rms_terms;

static void rms_row(const void *ctx, int i, int c0, int w, double part[2][PXT_COL_SLICE]) {
    const rms_terms *t = ctx;
    size_t row = (size_t)i * t->C + c0;
    float inv = 1.0f / (t->norm[i] > t->eps ? t->norm[i] : t->eps);
    for (int j = 0; j < w; j++) {
        part[0][j] += (double)pxt_ld(t->dout, row + j, t->dt) *
                      (pxt_ld(t->inp, row + j, t->dt) * inv * t->scale);
    }
}

int pxt_cpu_rmsnorm_backward(int index, void *dinp, float *dgamma, const void *dout,
                             const void *inp, const void *gamma, const float *norm, int N, int C,
                             float scale, float eps, pxt_dtype dt, void *workspace) {
    (void)index, (void)workspace;
    PXT_TRY(check(N, C, dt, "rmsnorm_backward"));
    int par = (size_t)N * C >= PXT_OMP_MIN_WORK;
    /* pass 1, rows: dinp (N, C) += */
#pragma omp parallel for schedule(static) if (par)
    for (int i = 0; i < N; i++) {
        size_t row = (size_t)i * C;
        float n = norm[i];
        if (n > eps) {
            float inv = 1.0f / n;
            double dot = 0.0; /* xh . g */
            for (int j = 0; j < C; j++) {
                float g = pxt_ld(dout, row + j, dt) * pxt_ld(gamma, j, dt) * scale;
                dot += (double)(pxt_ld(inp, row + j, dt) * inv) * g;
            }
            float fd = (float)dot;
            for (int j = 0; j < C; j++) {
                float g = pxt_ld(dout, row + j, dt) * pxt_ld(gamma, j, dt) * scale;
                float xh = pxt_ld(inp, row + j, dt) * inv;
                pxt_st(dinp, row + j, dt, pxt_ld(dinp, row + j, dt) + (g - xh * fd) * inv);
            }
        } else {
            for (int j = 0; j < C; j++) {
                float g = pxt_ld(dout, row + j, dt) * pxt_ld(gamma, j, dt) * scale;
                pxt_st(dinp, row + j, dt, pxt_ld(dinp, row + j, dt) + g / eps);
            }
        }
    }
    /* pass 2, the column sum: dgamma += sum_i dout * x / max(n, eps) * scale */
    rms_terms t = {dout, inp, norm, C, scale, eps, dt};
    pxt_cpu_colsum(N, C, rms_row, &t, dgamma, NULL);
    return PXT_OK;
}
