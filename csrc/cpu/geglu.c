/* geglu.c (CPU): GEGLU, the gated feed-forward of the perceiver, forward and
 * backward.
 *
 *   out = a * gelu(g),  [a | g] = the two halves of a row of inp
 *   gelu(g) = g Phi(g),  Phi(g) = (1 + erf(g / sqrt 2)) / 2   (exact, not tanh)
 *   gelu'(g) = Phi(g) + g phi(g),  phi(g) = exp(-g^2 / 2) / sqrt(2 pi) */
#include <math.h>

#include "cpu.h"
#include "elem.h"

#define SQRT1_2 0.70710678118654752440f
#define INV_SQRT_2PI 0.39894228040143267794f

static int check(int N, int F, pxt_dtype dt, const char *op) {
    PXT_TRY(pxt_cpu_check_float(dt, op));
    if (N < 0 || F < 1) {
        return pxt_error(PXT_ERR_VALUE, "%s: bad size N=%d F=%d", op, N, F);
    }
    return PXT_OK;
}

int pxt_cpu_geglu_forward(int index, void *out, const void *inp, int N, int F, pxt_dtype dt) {
    (void)index;
    PXT_TRY(check(N, F, dt, "geglu_forward"));
    /* out (N, F); inp (N, 2F) */
#pragma omp parallel for schedule(static) if ((size_t)N * F >= PXT_OMP_MIN_WORK)
    for (int r = 0; r < N; r++) {
        size_t a0 = (size_t)r * 2 * F, g0 = a0 + (size_t)F, o0 = (size_t)r * F;
        for (int j = 0; j < F; j++) {
            float g = pxt_ld(inp, g0 + j, dt);
            float gelu = g * 0.5f * (1.0f + erff(g * SQRT1_2));
            pxt_st(out, o0 + j, dt, pxt_ld(inp, a0 + j, dt) * gelu);
        }
    }
    return PXT_OK;
}

int pxt_cpu_geglu_backward(int index, void *dinp, const void *inp, const void *dout, int N, int F,
                           pxt_dtype dt) {
    (void)index;
    PXT_TRY(check(N, F, dt, "geglu_backward"));
    /* dinp, inp (N, 2F); dout (N, F) */
#pragma omp parallel for schedule(static) if ((size_t)N * F >= PXT_OMP_MIN_WORK)
    for (int r = 0; r < N; r++) {
        size_t a0 = (size_t)r * 2 * F, g0 = a0 + (size_t)F, o0 = (size_t)r * F;
        for (int j = 0; j < F; j++) {
            float a = pxt_ld(inp, a0 + j, dt), g = pxt_ld(inp, g0 + j, dt);
            float dy = pxt_ld(dout, o0 + j, dt);
            float cdf = 0.5f * (1.0f + erff(g * SQRT1_2));
            float pdf = INV_SQRT_2PI * expf(-0.5f * g * g);
            pxt_st(dinp, a0 + j, dt, dy * g * cdf);
            pxt_st(dinp, g0 + j, dt, dy * a * (cdf + g * pdf));
        }
    }
    return PXT_OK;
}

#undef SQRT1_2
#undef INV_SQRT_2PI
