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

#include "engine/backend.h"
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
    /* pass 2, column slices: dgamma += sum_i dout * x / max(n, eps) * scale, per
     * chunk of R rows (stage 1), then the chunks in order (stage 2) */
    const int R = pxt_colsum_chunk_rows(N, C);
    int nslices = (C + PXT_COL_SLICE - 1) / PXT_COL_SLICE;
#pragma omp parallel for schedule(static) if (par)
    for (int s = 0; s < nslices; s++) {
        int c0 = s * PXT_COL_SLICE, w = C - c0 < PXT_COL_SLICE ? C - c0 : PXT_COL_SLICE;
        double dg[PXT_COL_SLICE] = {0}, pg[PXT_COL_SLICE]; /* (w) total, one chunk's */
        for (int i0 = 0; i0 < N; i0 += R) {
            int i1 = N - i0 < R ? N : i0 + R;
            for (int j = 0; j < w; j++) {
                pg[j] = 0.0;
            }
            for (int i = i0; i < i1; i++) {
                size_t row = (size_t)i * C + c0;
                float inv = 1.0f / (norm[i] > eps ? norm[i] : eps);
                for (int j = 0; j < w; j++) {
                    pg[j] += (double)pxt_ld(dout, row + j, dt) *
                             (pxt_ld(inp, row + j, dt) * inv * scale);
                }
            }
            for (int j = 0; j < w; j++) {
                dg[j] += pg[j];
            }
        }
        for (int j = 0; j < w; j++) {
            dgamma[c0 + j] = (float)(dgamma[c0 + j] + dg[j]);
        }
    }
    return PXT_OK;
}
