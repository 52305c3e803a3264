/* step_main.cpp: the loss's and the optimizer's CUDA kernels (cuda/xent.cuh,
 * cuda/adamw.cuh), their own source run by the emulator, with xent.cu's and optim.cu's
 * launch shapes.
 *
 * What must match how:
 *  - AdamW bit for bit: the CPU backend's pxt_cpu_adamw (csrc/cpu/optim.c, linked in) on
 *    the same state, every dtype, with and without an EMA, fp32 parameters that are the
 *    master, segments with and without weight decay, gaps between them that neither
 *    touches (poisoned, checked still poisoned), segments longer than one sweep of the
 *    x blocks and more segments than grid.y (both strides go round);
 *  - softmax cross-entropy within a bound of float64: its double sums add in a tree, not
 *    in the CPU's order, and it rounds l - max to float before expf, so an element is off
 *    by a few units of the float grid of its terms (the bound below). Exactly: the
 *    forward writes nothing into the logits; the backward zeroes the pad columns V..ld-1
 *    (they start NaN); an ignored row (target -1) has loss 0 and, with backward, zeros; a
 *    target outside [-1, V) gives NaN, never a read outside the row; and the bias is
 *    added in fp32 first: the kernel with a bias gives the bits of the kernel without one
 *    on logits + bias rounded to float.
 * Outputs start poisoned, every element is checked, every device buffer has a guard page
 * after its end and its slack checked.
 *
 * Usage: step_emu SEED [quick]. Prints one line per case and "failures: N". */
#include "emu.h"
#include "emu_check.h"

#include "engine/backend.h"
#include "adamw.cuh"
#include "xent.cuh"

extern "C" {
#include "cpu/cpu.h" /* the CPU backend's kernels, linked in */
}

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

static std::mt19937_64 rng;

static float normal(double scale) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    return (float)(scale * nd(rng));
}

/* ---- AdamW ------------------------------------------------------------------------ */

/* One step over n elements in the given segments, grid (bx, by) as optim.cu launches
 * it (bx 64, by the segment count capped at 65535; smaller here to make both strides go
 * round), against the CPU's update on a copy of the same state. */
template <typename T>
static void adamw_case(size_t n, std::vector<pxt_adamw_segment> segs, bool with_ema, bool alias,
                       unsigned bx, unsigned by) {
    const float poison = NAN;
    std::vector<char> inside(n, 0);
    for (const pxt_adamw_segment &s : segs)
        for (size_t i = s.offset; i < s.offset + s.numel; i++)
            inside[i] = 1;
    /* the state of a run some steps in: moments of the gradients' scale, v >= 0 */
    std::vector<float> g0(n), m0(n), v0(n), w0(n), e0(n);
    for (size_t i = 0; i < n; i++) {
        g0[i] = i % 97 == 5 ? 0.0f : normal(1e-2);
        m0[i] = normal(1e-3);
        v0[i] = std::fabs(normal(1e-5));
        w0[i] = normal(0.05);
        e0[i] = w0[i] + normal(1e-3);
    }
    auto state = [&](const std::vector<float> &src) {
        return device<float>(n, [&](size_t i) { return inside[i] ? src[i] : poison; });
    };
    float *grads = state(g0);
    float *gm = state(m0), *gv = state(v0), *gw = state(w0), *ge = with_ema ? state(e0) : NULL;
    float *cm = state(m0), *cv = state(v0), *cw = state(w0), *ce = with_ema ? state(e0) : NULL;
    /* the compute-precision parameters: the master itself (fp32 alias), or their own copy */
    T *gp = alias ? (T *)gw : device<T>(n, [&](size_t i) { return stf<T>(inside[i] ? w0[i] : poison); });
    T *cp = alias ? (T *)cw : device<T>(n, [&](size_t i) { return stf<T>(inside[i] ? w0[i] : poison); });
    pxt_adamw_segment *dsegs = device<pxt_adamw_segment>(segs.size(), [&](size_t i) { return segs[i]; });
    const double lr = 2e-3, b1 = 0.9, b2 = 0.96, wd = 0.01, step = 7;
    pxt_adamw_args a = {};
    a.segments = dsegs;
    a.n_segments = (int)segs.size();
    a.grad_scale = 0.731f; /* a clipped step */
    a.decay_factor = (float)(1.0 - lr * wd);
    a.one_minus_beta1 = (float)(1.0 - b1);
    a.beta2 = (float)b2;
    a.one_minus_beta2 = (float)(1.0 - b2);
    a.neg_step_size = (float)(-lr / (1.0 - std::pow(b1, step)));
    a.bias_correction2_sqrt = (float)std::sqrt(1.0 - std::pow(b2, step));
    a.eps = 1e-8f;
    a.ema_decay = 0.999f;
    a.one_minus_ema_decay = (float)(1.0 - 0.999);
    a.dt = dtype_of<T>();
    int rc = pxt_cpu_adamw(0, &a, cw, cm, cv, ce, cp, grads);
    long err0 = emu_errors;
    emu_dim3 grid, block;
    grid.x = bx;
    grid.y = by;
    block.x = PXT_ADAMW_BLOCK;
    const int write_params = !alias;
    emu_launch(grid, block, 0, [&] {
        if (with_ema)
            pxt_adamw_kernel<T, true>(a, gw, gm, gv, ge, gp, grads, write_params);
        else
            pxt_adamw_kernel<T, false>(a, gw, gm, gv, NULL, gp, grads, write_params);
    });
    bool ok = rc == PXT_OK && emu_errors == err0;
    const size_t fb = n * sizeof(float);
    ok = ok && same_bits(gw, cw, fb) && same_bits(gm, cm, fb) && same_bits(gv, cv, fb);
    ok = ok && (!with_ema || same_bits(ge, ce, fb)) && same_bits(gp, cp, n * sizeof(T));
    size_t untouched = 0, changed = 0;
    for (size_t i = 0; i < n; i++) { /* the gaps still poisoned, every element updated */
        if (!inside[i])
            untouched += std::isnan(gw[i]) && std::isnan(gm[i]) && std::isnan(gv[i]);
        else
            changed += gw[i] != w0[i] || gm[i] != m0[i];
    }
    const size_t n_in = (size_t)std::count(inside.begin(), inside.end(), 1);
    ok = ok && untouched == n - n_in && changed == n_in;
    for (void *p : {(void *)grads, (void *)gm, (void *)gv, (void *)gw, (void *)cm, (void *)cv,
                    (void *)cw, (void *)dsegs})
        ok = ok && emu_tail_intact(p);
    report("adamw " + std::string(alias ? "f32 (params = master)" : name_of<T>()) +
               (with_ema ? " ema" : "") + " n=" + std::to_string(n) + " segments=" +
               std::to_string(segs.size()) + " grid " + std::to_string(bx) + "x" + std::to_string(by),
           ok);
    for (void *p : {(void *)grads, (void *)gm, (void *)gv, (void *)gw, (void *)ge, (void *)cm,
                    (void *)cv, (void *)cw, (void *)ce, (void *)dsegs})
        if (p)
            emu_free(p);
    if (!alias) {
        emu_free(gp);
        emu_free(cp);
    }
}

/* ---- softmax cross-entropy --------------------------------------------------------- */

static void xent_launch(float *x, int ld, const float *bias, float *losses, const int32_t *t, int N,
                        int V, float scale, int backward) {
    emu_dim3 grid, block;
    grid.x = (unsigned)N;
    block.x = PXT_XENT_BLOCK;
    emu_launch(grid, block, 0,
               [&] { pxt_softmax_xent_kernel(x, ld, bias, losses, t, V, scale, backward); });
}

/* N rows of V logits ld apart (pads NaN), with or without a bias, targets in [0, V) but
 * every fifth row ignored (-1) and, with `stray`, row 1 past V and row 2 below -1. */
static void xent_case(int N, int V, int ld, bool with_bias, float spread, bool stray) {
    std::uniform_int_distribution<int> ut(0, V - 1);
    std::vector<int32_t> tv(N);
    for (int i = 0; i < N; i++)
        tv[i] = i % 5 == 4 ? -1 : ut(rng);
    if (stray && N > 2) {
        tv[1] = V + 3;
        tv[2] = -7;
    }
    const size_t nx = (size_t)N * ld;
    std::vector<float> x0(nx);
    for (size_t i = 0; i < nx; i++)
        x0[i] = (int)(i % ld) < V ? normal(spread) : NAN;
    std::vector<float> b0(V);
    for (int j = 0; j < V; j++)
        b0[j] = normal(1.0);
    int32_t *t = device<int32_t>(N, [&](size_t i) { return tv[i]; });
    float *bias = with_bias ? device<float>(V, [&](size_t j) { return b0[j]; }) : NULL;
    const float scale = 0.37f;
    long err0 = emu_errors;
    for (int backward = 0; backward <= 1; backward++) {
        float *x = device<float>(nx, [&](size_t i) { return x0[i]; });
        float *losses = device<float>(N, [](size_t) { return NAN; });
        xent_launch(x, ld, bias, losses, t, N, V, scale, backward);
        double worst_loss = 0.0, worst_grad = 0.0; /* error / bound, at most 1 */
        bool exact = true;
        for (int i = 0; i < N; i++) {
            const float *row = x + (size_t)i * ld, *row0 = x0.data() + (size_t)i * ld;
            if (!backward) { /* nothing written, the pads still NaN */
                exact = exact && same_bits(row, row0, (size_t)ld * sizeof(float));
            } else {
                for (int j = V; j < ld; j++)
                    exact = exact && row[j] == 0.0f && !std::signbit(row[j]);
            }
            if (tv[i] == -1 || tv[i] < -1 || tv[i] >= V) {
                const bool ignored = tv[i] == -1;
                exact = exact && (ignored ? losses[i] == 0.0f : std::isnan(losses[i]));
                for (int j = 0; backward && j < V; j++)
                    exact = exact && (ignored ? row[j] == 0.0f : std::isnan(row[j]));
                continue;
            }
            /* float64: the logits as the kernel forms them (x + bias, one float add) */
            std::vector<double> l(V);
            double mx = -INFINITY;
            for (int j = 0; j < V; j++) {
                l[j] = with_bias ? (double)(float)(row0[j] + b0[j]) : (double)row0[j];
                mx = std::max(mx, l[j]);
            }
            double s = 0.0, spanned = 0.0; /* sum exp(l - max); the largest |l - max| it weighs */
            for (int j = 0; j < V; j++)
                s += std::exp(l[j] - mx);
            for (int j = 0; j < V; j++)
                if (std::exp(l[j] - mx) / s > 1e-12)
                    spanned = std::max(spanned, mx - l[j]);
            const double want = mx - l[tv[i]] + std::log(s);
            /* l - max is rounded to float before expf (relative 2^-24 of |l - max|, the
             * exponent's error), expf and the float sums a few units more */
            const double u = std::ldexp(1.0, -24);
            const double loss_bound = (std::fabs(mx) + std::fabs(l[tv[i]]) + spanned + 8.0) * 4 * u;
            worst_loss = std::max(worst_loss, std::fabs(losses[i] - want) / loss_bound);
            for (int j = 0; backward && j < V; j++) {
                const double p = std::exp(l[j] - mx) / s;
                const double g = scale * (p - (j == tv[i] ? 1.0 : 0.0));
                const double bound = scale * (p * ((mx - l[j]) + spanned + 8.0) * 4 * u +
                                              (j == tv[i] ? 2 * u : 0.0)) + 1e-37;
                worst_grad = std::max(worst_grad, std::fabs(row[j] - g) / bound);
            }
        }
        char line[256];
        snprintf(line, sizeof line, "softmax_xent%s N=%d V=%d ld=%d%s%s err/bound %.2f %.2f",
                 backward ? " backward" : "", N, V, ld, with_bias ? " bias" : "",
                 stray ? " stray targets" : "", worst_loss, worst_grad);
        report(line, exact && worst_loss <= 1.0 && worst_grad <= 1.0 && emu_errors == err0 &&
                         emu_tail_intact(x) && emu_tail_intact(losses));
        /* the bias added in fp32 first: the kernel without one, on x + bias in float */
        if (with_bias) {
            float *xb = device<float>(nx, [&](size_t i) {
                const int j = (int)(i % ld);
                return j < V ? x0[i] + b0[j] : x0[i];
            });
            float *lb = device<float>(N, [](size_t) { return NAN; });
            xent_launch(xb, ld, NULL, lb, t, N, V, scale, backward);
            /* the forward writes no logits: there the losses alone can differ */
            const bool same = (!backward || same_bits(xb, x, nx * sizeof(float))) &&
                              same_bits(lb, losses, N * sizeof(float));
            report("softmax_xent" + std::string(backward ? " backward" : "") +
                       " bias = logits + bias without one, bit for bit", same);
            emu_free(xb);
            emu_free(lb);
        }
        emu_free(x);
        emu_free(losses);
    }
    emu_free(t);
    if (bias)
        emu_free(bias);
}

int main(int argc, char **argv) {
    rng.seed(argc > 1 ? strtoull(argv[1], NULL, 10) : 1);
    const bool quick = argc > 2 && !strcmp(argv[2], "quick");
    /* segments: one element, gaps (padding) between tensors, one longer than a sweep of
     * the x blocks (3 x 256 here), decay on and off */
    const std::vector<pxt_adamw_segment> segs = {
        {0, 1, 0}, {8, 1000, 1}, {1016, 37, 0}, {1056, 5000, 1}, {6064, 3, 1}};
    adamw_case<float>(6080, segs, false, false, 3, 5);
    adamw_case<float>(6080, segs, true, true, 3, 5);
    adamw_case<pxt_bf16>(6080, segs, true, false, 3, 5);
    adamw_case<pxt_f16>(6080, segs, false, false, 3, 2); /* grid.y < segments */
    adamw_case<pxt_bf16>(6080, segs, false, false, 64, 5);
    xent_case(1, 1, 1, false, 1.0f, false);
    xent_case(7, 5, 8, true, 1.0f, true);
    xent_case(12, 300, 304, true, 4.0f, true);
    xent_case(6, 257, 257, false, 30.0f, false); /* large logits: the max subtracted */
    xent_case(10, 1026, 1032, true, 2.0f, false); /* the audio head's rows */
    if (!quick) {
        xent_case(9, 6681, 6688, true, 2.0f, true); /* the text head's rows */
        adamw_case<pxt_bf16>(3 * 16384 + 77, {{5, 3 * 16384, 1}, {3 * 16384 + 9, 60, 0}}, true,
                             false, 64, 2);
    }
    printf("failures: %d\n", failures);
    return failures != 0;
}
