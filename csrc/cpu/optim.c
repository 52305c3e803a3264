/* optim.c: the optimizer's passes over the flat buffers: the deterministic
 * global sum of squares of the gradients (clipping, the finite check of loss
 * scaling) and the fused AdamW update (semantics in backend.h). */
#include <math.h>
#include <string.h>

#include "engine/backend.h"
#include "cpu.h"
#include "elem.h"

int pxt_cpu_grad_sumsq(int index, double *sumsq, int *nonfinite, const float *g, size_t n,
                       void *workspace) {
    (void)index;
    double *part = workspace; /* (PXT_SUMSQ_PARTS) */
    size_t len = (n + PXT_SUMSQ_PARTS - 1) / PXT_SUMSQ_PARTS;
#pragma omp parallel for schedule(static) if (n >= PXT_OMP_MIN_WORK)
    for (int p = 0; p < PXT_SUMSQ_PARTS; p++) {
        size_t lo = (size_t)p * len < n ? (size_t)p * len : n;
        size_t hi = n - lo < len ? n : lo + len;
        double a0 = 0.0, a1 = 0.0, a2 = 0.0, a3 = 0.0;
        size_t i = lo;
        for (; i + 4 <= hi; i += 4) {
            double x0 = g[i], x1 = g[i + 1], x2 = g[i + 2], x3 = g[i + 3];
            a0 += x0 * x0;
            a1 += x1 * x1;
            a2 += x2 * x2;
            a3 += x3 * x3;
        }
        for (; i < hi; i++) {
            a0 += (double)g[i] * g[i];
        }
        part[p] = (a0 + a1) + (a2 + a3);
    }
    double total = 0.0;
    for (int p = 0; p < PXT_SUMSQ_PARTS; p++) {
        total += part[p];
    }
    /* squares of finite floats are < 1.2e77: only inf or NaN inputs make this non-finite */
    *sumsq = total;
    *nonfinite = !isfinite(total);
    return PXT_OK;
}

/* pxt_f32_to_bf16 (round to nearest even, NaN kept quiet) written to inline, so that
 * the update's loop stores its bf16 parameters in SIMD lanes; the same bits. */
static inline uint16_t bf16_of(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t quiet = (u >> 16) | 0x0040u;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
}

/* How the update writes the compute-precision parameters: not at all (they are the
 * master), fp32, bf16, fp16. A constant at each call site of adamw_core. */
enum { OUT_NONE, OUT_F32, OUT_BF16, OUT_F16 };

/* The update of elements [lo, hi) of one segment, vectorised: every operation is
 * IEEE-exact per element (no contraction in C11 mode), so the SIMD lanes give the
 * bits of the scalar loop. has_ema and out are constants at each call site. */
static inline void adamw_core(const pxt_adamw_args *a, float df, size_t lo, size_t hi,
                              float *restrict master, float *restrict m, float *restrict v,
                              float *restrict ema, const float *restrict grads,
                              void *restrict params, int has_ema, int out) {
    const float gs = a->grad_scale, w1 = a->one_minus_beta1, b2 = a->beta2;
    const float w2 = a->one_minus_beta2, nss = a->neg_step_size;
    const float bc2 = a->bias_correction2_sqrt, eps = a->eps;
    const float ed = a->ema_decay, w3 = a->one_minus_ema_decay;
    float *restrict p32 = params;
    uint16_t *restrict p16 = params;
#pragma omp simd
    for (size_t i = lo; i < hi; i++) {
        float g = grads[i] * gs;
        float p = master[i] * df; /* df = 1 (exact) outside decay segments, as torch's wd = 0 */
        float mi = m[i] + w1 * (g - m[i]);
        float vi = v[i] * b2 + w2 * g * g;
        float denom = sqrtf(vi) / bc2 + eps;
        p = p + nss * (mi / denom);
        m[i] = mi;
        v[i] = vi;
        master[i] = p;
        if (has_ema) {
            ema[i] = ed * ema[i] + w3 * p;
        }
        if (out == OUT_F32) {
            p32[i] = p;
        } else if (out == OUT_BF16) {
            p16[i] = bf16_of(p);
        }
    }
    if (out == OUT_F16) { /* fp16's rounding has no branch-free form worth inlining */
        for (size_t i = lo; i < hi; i++) {
            p16[i] = pxt_f32_to_f16(master[i]);
        }
    }
}

/* adamw_core with its constants spelt out, one instance per case. */
#define ADAMW_CORE(out)                                                                            \
    (ema ? adamw_core(a, df, lo, hi, master, m, v, ema, grads, params, 1, (out))                   \
         : adamw_core(a, df, lo, hi, master, m, v, NULL, grads, params, 0, (out)))

/* Clones for AVX-512 and AVX2 beside the baseline (SSE2 on x86-64), picked at load time:
 * the update is bound by memory and the divider, and the baseline's vectors are half
 * AVX2's. The bits are the same in every clone: C11 mode contracts nothing into FMAs, and
 * sqrt and division are exact in every lane. */
#if defined(__x86_64__) && defined(__GNUC__)
#define ADAMW_CLONES __attribute__((target_clones("avx512f", "avx2", "default"), noinline))
#else
#define ADAMW_CLONES
#endif

ADAMW_CLONES
static void adamw_range(const pxt_adamw_args *a, int decay, size_t lo, size_t hi, float *master,
                        float *m, float *v, float *ema, void *params, const float *grads) {
    float df = decay ? a->decay_factor : 1.0f;
    if ((void *)master == params) {
        ADAMW_CORE(OUT_NONE);
    } else if (a->dt == PXT_BFLOAT16) {
        ADAMW_CORE(OUT_BF16);
    } else if (a->dt == PXT_FLOAT16) {
        ADAMW_CORE(OUT_F16);
    } else {
        ADAMW_CORE(OUT_F32);
    }
}

#undef ADAMW_CORE
#undef ADAMW_CLONES

/* Chunks of this many elements are the unit of work: big tensors split over
 * threads, small ones (biases) go whole to one thread. Elementwise: any split
 * gives the same bits. */
#define ADAMW_CHUNK 16384

int pxt_cpu_adamw(int index, const pxt_adamw_args *a, float *master, float *m, float *v, float *ema,
                  void *params, const float *grads) {
    (void)index;
    PXT_TRY(pxt_cpu_check_float(a->dt, "adamw (params)"));
    if ((void *)master == params && a->dt != PXT_FLOAT32) {
        return pxt_error(PXT_ERR_VALUE, "adamw: params may alias master only when float32");
    }
    size_t total = 0;
    for (int s = 0; s < a->n_segments; s++) {
        total += a->segments[s].numel;
    }
#pragma omp parallel if (total >= PXT_OMP_MIN_WORK)
    for (int s = 0; s < a->n_segments; s++) {
        const pxt_adamw_segment *seg = &a->segments[s];
        size_t chunks = (seg->numel + ADAMW_CHUNK - 1) / ADAMW_CHUNK;
#pragma omp for schedule(static) nowait
        for (size_t c = 0; c < chunks; c++) {
            size_t lo = seg->offset + c * ADAMW_CHUNK;
            size_t hi = seg->offset + seg->numel;
            if (hi - lo > ADAMW_CHUNK) {
                hi = lo + ADAMW_CHUNK;
            }
            adamw_range(a, seg->decay, lo, hi, master, m, v, ema, params, grads);
        }
    }
    return PXT_OK;
}

int pxt_cpu_swap(int index, void *a, void *b, size_t n, pxt_dtype dt) {
    (void)index;
    size_t nbytes = n * pxt_dtype_size(dt);
    unsigned char *x = a, *y = b;
#pragma omp parallel for schedule(static) if (nbytes >= 4 * PXT_OMP_MIN_WORK)
    for (size_t i = 0; i < nbytes; i += 4096) {
        unsigned char tmp[4096];
        size_t k = nbytes - i < sizeof tmp ? nbytes - i : sizeof tmp;
        memcpy(tmp, x + i, k);
        memcpy(x + i, y + i, k);
        memcpy(y + i, tmp, k);
    }
    return PXT_OK;
}

#undef ADAMW_CHUNK
