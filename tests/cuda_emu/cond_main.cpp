/* cond_main.cpp: the CUDA kernels of the conditioning path's ops (cuda/groupnorm.cuh,
 * cuda/rmsnorm.cuh, cuda/geglu.cuh, and their weight gradients in cuda/colsum.cuh; and the
 * MLP's GELU, cuda/gelu.cuh, LayerNorm's forward and dinp, cuda/layernorm.cuh, and the
 * dropout of rows, cuda/dropout.cuh), their
 * own source run by the emulator, against the CPU backend's functions (csrc/cpu/
 * groupnorm.c, rmsnorm.c, geglu.c, linked in), at tiny, ragged, misaligned and XTTS v2
 * sizes, each dtype. Launches are those of the .cu files: the same grids, block sizes and
 * vector widths (pxt_vec_width), the elementwise grid capped in some cases so that the
 * grid-stride loops go round.
 *
 * What must match how:
 *  - bit for bit: GEGLU, GELU and dropout (the CPU's float expressions; the emulator's erff and expf are
 *    the CPU's glibc), and the weight gradients dweight, dbias, dgamma (backend.h's
 *    chunked column sums of the same float terms, from the CPU's saved statistics);
 *  - within a bound: the rest, whose double sums (GroupNorm's statistics and means, the
 *    RMS norm's |x| and dot) add in a tree rather than in order. The double sums differ
 *    by ~1e-16 relative, so a float rounded from one may differ by 1 ulp: statistics
 *    within 2 u (u = 2^-24) of themselves, fp32 outputs within 8 u of the magnitudes of
 *    the terms that form them (as tests/test_cond_ops.py bounds the CPU against float64),
 *    16-bit outputs within that before their rounding, so at most one step of the 16-bit
 *    grid apart.
 * Outputs start poisoned (NaN), every element is checked, every device buffer has a
 * guard page after its end and its slack checked.
 *
 * Usage: cond_emu SEED [quick]. Prints one line per case and "failures: N". */
#include "emu.h"
#include "emu_check.h"

#include "engine/backend.h"
#include "colsum.cuh"
#include "dropout.cuh"
#include "geglu.cuh"
#include "gelu.cuh"
#include "groupnorm.cuh"
#include "layernorm.cuh"
#include "rmsnorm.cuh"

extern "C" {
#include "cpu/cpu.h" /* the CPU backend's kernels, linked in */
}

#include <random>
#include <string>

static std::mt19937_64 rng;
static const double U = 1.0 / (1 << 24); /* float32 unit roundoff */

template <typename T> static T *poisoned(size_t n) { return (T *)emu_alloc(n * sizeof(T) + (n == 0)); }

template <typename T> static T normal(double scale, double offset = 0.0) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    return stf<T>((float)(offset + scale * nd(rng)));
}

/* 16-bit values one step of their grid apart (or equal): neighbours in bits, one sign */
static bool adjacent(uint16_t a, uint16_t b) {
    if (a == b)
        return true;
    if ((a ^ b) & 0x8000u)
        return (a & 0x7fffu) == 0 && (b & 0x7fffu) == 0; /* +0 and -0 */
    return (a > b ? a - b : b - a) == 1;
}

/* got against want (n values of T): fp32 within tol(i); 16-bit equal or adjacent and
 * within tol(i) plus one step of the grid at want. NaN fails. Prints the worst. */
template <typename T, typename F>
static bool close(const T *got, const T *want, size_t n, F tol, const char *what) {
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++) {
        double g = ldf(got[i]), w = ldf(want[i]), t = tol(i);
        bool ok = std::fabs(g - w) <= t;
        if constexpr (!std::is_same_v<T, float>) {
            uint16_t gb, wb;
            memcpy(&gb, &got[i], 2), memcpy(&wb, &want[i], 2);
            ok = adjacent(gb, wb) && (gb == wb || std::fabs(g - w) <= t + std::fabs(w) * (1.0 / 128) + 6e-8);
        }
        if (!ok && !bad++)
            first = i;
    }
    if (bad)
        printf("  %s: %zu of %zu off, first at %zu: %.9g vs %.9g (tol %.3g)\n", what, bad, n, first,
               (double)ldf(got[first]), (double)ldf(want[first]), tol(first));
    return bad == 0;
}

/* ---- GroupNorm ------------------------------------------------------------------------ */

/* B, S, C, G; off shifts every buffer by one element (vectors impossible: V = 1) */
template <typename T> static void groupnorm_case(int B, int S, int C, int G, int off) {
    const size_t n = (size_t)B * S * C, bg = (size_t)B * G;
    const pxt_dtype dt = dtype_of<T>();
    const int cg = C / G;
    T *x = device<T>(n + off, [](size_t) { return normal<T>(2.0, 1.0); }) + off;
    T *w = device<T>(C + off, [](size_t) { return normal<T>(1.0); }) + off;
    T *b = device<T>(C + off, [](size_t) { return normal<T>(0.5); }) + off;
    T *dout = device<T>(n + off, [](size_t) { return normal<T>(1.0); }) + off;
    T *di0 = device<T>(n, [](size_t) { return normal<T>(1.0); });
    T *want = poisoned<T>(n), *got = poisoned<T>(n + off) + off;
    float *wm = poisoned<float>(bg), *wr = poisoned<float>(bg), *gm = poisoned<float>(bg), *gr = poisoned<float>(bg);
    long e0 = emu_errors;
    /* forward */
    pxt_cpu_groupnorm_forward(0, want, wm, wr, x, w, b, B, S, C, G, 1e-5f, dt);
    const void *fptrs[] = {got, x, w, b};
    const int Vf = pxt_vec_width(sizeof(T), cg, fptrs, 4);
    emu_dim3 grid, block;
    grid.x = (unsigned)bg;
    block.x = PXT_GN_THREADS;
    pxt_vec_dispatch<T>(Vf, [&](auto v) {
        if (B)
            emu_launch(grid, block, 0, [&] {
                pxt_gn_forward_kernel<T, decltype(v)::value>(got, gm, gr, x, w, b, S, C, G, 1e-5f);
            });
    });
    std::string name = std::string(name_of<T>()) + " B=" + std::to_string(B) + " S=" + std::to_string(S) +
                       " C=" + std::to_string(C) + " G=" + std::to_string(G) + " V=" + std::to_string(Vf);
    bool ok = close(gm, wm, bg, [&](size_t i) { return 2 * U * std::fabs(wm[i]) + 1e-30; }, "mean") &&
              close(gr, wr, bg, [&](size_t i) { return 2 * U * wr[i]; }, "rstd");
    /* out: (x - m) r w + b; a 1-ulp m or r moves it by u (|x| + |m|) r |w| each */
    ok = ok && close(got, want, n, [&](size_t i) {
             size_t k = i / ((size_t)S * C) * G + i % C / cg;
             int j = (int)(i % C);
             double xv = ldf(x[i]), nv = (xv - wm[k]) * wr[k], wv = ldf(w[j]);
             return 8 * U * (std::fabs(nv * wv) + std::fabs(ldf(b[j])) + (std::fabs(xv) + std::fabs(wm[k])) * wr[k] * std::fabs(wv)) + 1e-30;
         }, "out");
    report("groupnorm forward " + name + (off ? " misaligned" : ""), ok && emu_errors == e0 && emu_tail_intact(gm) && emu_tail_intact(gr));

    /* backward from the CPU's statistics: dinp += (both from di0), dweight, dbias += */
    T *dwant = device<T>(n, [&](size_t i) { return di0[i]; });
    T *dgot = device<T>(n + off, [&](size_t i) { return i < (size_t)off ? stf<T>(0.0f) : di0[i - off]; }) + off;
    float *wdw = device<float>(C, [](size_t) { return normal<float>(1.0); });
    float *wdb = device<float>(C, [](size_t) { return normal<float>(1.0); });
    float *gdw = device<float>(C, [&](size_t j) { return wdw[j]; });
    float *gdb = device<float>(C, [&](size_t j) { return wdb[j]; });
    pxt_cpu_groupnorm_backward(0, dwant, wdw, wdb, dout, x, w, wm, wr, B, S, C, G, dt, NULL);
    const void *bptrs[] = {dgot, dout, x, w};
    const int Vb = pxt_vec_width(sizeof(T), cg, bptrs, 4);
    e0 = emu_errors;
    pxt_vec_dispatch<T>(Vb, [&](auto v) {
        if (B)
            emu_launch(grid, block, 0, [&] {
                pxt_gn_dinp_kernel<T, decltype(v)::value>(dgot, dout, x, w, wm, wr, S, C, G);
            });
    });
    const int rows = B * S, R = pxt_colsum_chunk_rows(rows, C), nchunks = pxt_colsum_chunks(rows, C);
    double *parts = poisoned<double>(2 * (size_t)nchunks * C);
    pxt_colsum_gn<T> f = {{dout, x, C}, wm, wr, S, G, cg};
    grid.x = (unsigned)((C + PXT_COLSUM_BLOCK - 1) / PXT_COLSUM_BLOCK);
    block.x = PXT_COLSUM_BLOCK;
    if (nchunks > 0) {
        grid.y = (unsigned)(nchunks < 3 ? nchunks : 3); /* blocks stride over the chunks */
        pxt_colsum_dispatch(f, C, [&](auto v) { /* V columns a thread, as colsum.cu */
            constexpr int V = decltype(v)::value;
            grid.x = (unsigned)((C / V + PXT_COLSUM_BLOCK - 1) / PXT_COLSUM_BLOCK);
            emu_launch(grid, block, 0, [&] { pxt_colsum_parts_kernel<decltype(f), V>(parts, f, rows, C, R, nchunks); });
        });
        grid.x = (unsigned)((C + PXT_COLSUM_BLOCK - 1) / PXT_COLSUM_BLOCK);
    }
    grid.y = 2;
    emu_launch(grid, block, 0, [&] { pxt_colsum_finish_kernel(gdw, gdb, parts, nchunks, C); });
    /* dinp: rstd (g - mg - n mgn) + di0, a 1-ulp mg or mgn moving it by u r |mg| or u r |n mgn| */
    std::vector<double> amg(bg, 0.0), amgn(bg, 0.0); /* mean |g|, mean |g n| per group */
    for (size_t i = 0; i < n; i++) {
        size_t k = i / ((size_t)S * C) * G + i % C / cg;
        double g = std::fabs((double)ldf(w[i % C]) * ldf(dout[i])), nv = ((double)ldf(x[i]) - wm[k]) * wr[k];
        amg[k] += g / ((double)S * cg), amgn[k] += std::fabs(g * nv) / ((double)S * cg);
    }
    ok = close(dgot, dwant, n, [&](size_t i) {
             size_t k = i / ((size_t)S * C) * G + i % C / cg;
             double g = std::fabs((double)ldf(w[i % C]) * ldf(dout[i])), nv = ((double)ldf(x[i]) - wm[k]) * wr[k];
             return 8 * U * (wr[k] * (g + amg[k] + std::fabs(nv) * amgn[k]) + std::fabs(ldf(di0[i]))) + 1e-30;
         }, "dinp") &&
         same_bits(gdw, wdw, C * sizeof(float)) && same_bits(gdb, wdb, C * sizeof(float));
    report("groupnorm backward " + name + (off ? " misaligned" : ""),
           ok && emu_errors == e0 && emu_tail_intact(gdw) && emu_tail_intact(gdb) && emu_tail_intact(parts));
    for (void *p : {(void *)(x - off), (void *)(w - off), (void *)(b - off), (void *)(dout - off), (void *)di0,
                    (void *)want, (void *)(got - off), (void *)wm, (void *)wr, (void *)gm, (void *)gr,
                    (void *)dwant, (void *)(dgot - off), (void *)wdw, (void *)wdb, (void *)gdw, (void *)gdb,
                    (void *)parts})
        emu_free(p);
}

/* ---- RMS norm ----------------------------------------------------------------------------- */

/* N rows of C; zero_row: row 1 all zeros (F.normalize's eps branch); off as groupnorm's */
template <typename T> static void rmsnorm_case(int N, int C, int zero_row, int off) {
    const size_t n = (size_t)N * C;
    const pxt_dtype dt = dtype_of<T>();
    const float scale = std::sqrt((float)C), eps = zero_row ? 1e-3f : 1e-12f;
    T *x = device<T>(n + off, [&](size_t i) {
               return zero_row && i >= (size_t)off + C && i < (size_t)off + 2 * C ? stf<T>(0.0f) : normal<T>(1.5, 0.5);
           }) + off;
    T *gam = device<T>(C + off, [](size_t) { return normal<T>(1.0); }) + off;
    T *dout = device<T>(n + off, [](size_t) { return normal<T>(1.0); }) + off;
    T *di0 = device<T>(n, [](size_t) { return normal<T>(1.0); });
    T *want = poisoned<T>(n), *got = poisoned<T>(n + off) + off;
    float *wn = poisoned<float>(N), *gn = poisoned<float>(N);
    long e0 = emu_errors;
    pxt_cpu_rmsnorm_forward(0, want, wn, x, gam, N, C, scale, eps, dt);
    const void *fptrs[] = {got, x, gam};
    const int Vf = pxt_vec_width(sizeof(T), C, fptrs, 3);
    emu_dim3 grid, block;
    grid.x = (unsigned)((N + PXT_RMS_WARPS - 1) / PXT_RMS_WARPS);
    block.x = 32 * PXT_RMS_WARPS;
    pxt_vec_dispatch<T>(Vf, [&](auto v) {
        if (N)
            emu_launch(grid, block, 0, [&] {
                pxt_rms_forward_kernel<T, decltype(v)::value>(got, gn, x, gam, N, C, scale, eps);
            });
    });
    std::string name = std::string(name_of<T>()) + " N=" + std::to_string(N) + " C=" + std::to_string(C) +
                       " V=" + std::to_string(Vf) + (zero_row ? " zero row" : "") + (off ? " misaligned" : "");
    bool ok = close(gn, wn, N, [&](size_t i) { return 2 * U * wn[i]; }, "norm") &&
              close(got, want, n, [&](size_t i) { return 8 * U * std::fabs(ldf(want[i])) + 1e-30; }, "out");
    report("rmsnorm forward " + name, ok && emu_errors == e0 && emu_tail_intact(gn));

    T *dwant = device<T>(n, [&](size_t i) { return di0[i]; });
    T *dgot = device<T>(n + off, [&](size_t i) { return i < (size_t)off ? stf<T>(0.0f) : di0[i - off]; }) + off;
    float *wdg = device<float>(C, [](size_t) { return normal<float>(1.0); });
    float *gdg = device<float>(C, [&](size_t j) { return wdg[j]; });
    pxt_cpu_rmsnorm_backward(0, dwant, wdg, dout, x, gam, wn, N, C, scale, eps, dt, NULL);
    const void *bptrs[] = {dgot, dout, x, gam};
    const int Vb = pxt_vec_width(sizeof(T), C, bptrs, 4);
    e0 = emu_errors;
    pxt_vec_dispatch<T>(Vb, [&](auto v) {
        if (N)
            emu_launch(grid, block, 0, [&] {
                pxt_rms_dinp_kernel<T, decltype(v)::value>(dgot, dout, x, gam, wn, N, C, scale, eps);
            });
    });
    const int R = pxt_colsum_chunk_rows(N, C), nchunks = pxt_colsum_chunks(N, C);
    double *parts = poisoned<double>((size_t)nchunks * C);
    pxt_colsum_rms<T> f = {{dout, x, C}, wn, scale, eps};
    grid.x = (unsigned)((C + PXT_COLSUM_BLOCK - 1) / PXT_COLSUM_BLOCK);
    block.x = PXT_COLSUM_BLOCK;
    if (nchunks > 0) {
        grid.y = (unsigned)nchunks;
        pxt_colsum_dispatch(f, C, [&](auto v) { /* V columns a thread, as colsum.cu */
            constexpr int V = decltype(v)::value;
            grid.x = (unsigned)((C / V + PXT_COLSUM_BLOCK - 1) / PXT_COLSUM_BLOCK);
            emu_launch(grid, block, 0, [&] { pxt_colsum_parts_kernel<decltype(f), V>(parts, f, N, C, R, nchunks); });
        });
        grid.x = (unsigned)((C + PXT_COLSUM_BLOCK - 1) / PXT_COLSUM_BLOCK);
    }
    grid.y = 1;
    emu_launch(grid, block, 0, [&] { pxt_colsum_finish_kernel(gdg, NULL, parts, nchunks, C); });
    /* dinp: (g - xh fd) / n + di0; a 1-ulp fd moves it by u |xh| |fd| / n, fd <= sum |xh g| */
    std::vector<double> dots(N, 0.0); /* sum |xh g| per row */
    for (size_t i = 0; i < n; i++) {
        double d = std::max((double)wn[i / C], (double)eps);
        dots[i / C] += std::fabs(ldf(x[i]) / d * ldf(dout[i]) * ldf(gam[i % C]) * scale);
    }
    ok = close(dgot, dwant, n, [&](size_t i) {
             double d = std::max((double)wn[i / C], (double)eps), xh = std::fabs(ldf(x[i])) / d;
             double g = std::fabs((double)ldf(dout[i]) * ldf(gam[i % C]) * scale);
             return 8 * U * ((g + xh * dots[i / C]) / d + std::fabs(ldf(di0[i]))) + 1e-30;
         }, "dinp") &&
         same_bits(gdg, wdg, C * sizeof(float));
    report("rmsnorm backward " + name, ok && emu_errors == e0 && emu_tail_intact(gdg) && emu_tail_intact(parts));
    for (void *p : {(void *)(x - off), (void *)(gam - off), (void *)(dout - off), (void *)di0, (void *)want,
                    (void *)(got - off), (void *)wn, (void *)gn, (void *)dwant, (void *)(dgot - off),
                    (void *)wdg, (void *)gdg, (void *)parts})
        emu_free(p);
}

/* A grid-stride launch of the elementwise kernels' 256-thread blocks (PXT_EW_BLOCK) over nv
 * vectors, the grid capped at max_grid so that the loop goes round; nothing when nv is 0. */
template <class F> static void ew_launch(size_t nv, unsigned max_grid, F body) {
    if (!nv)
        return;
    emu_dim3 grid, block;
    block.x = 256;
    size_t blocks = (nv + 255) / 256;
    grid.x = (unsigned)(blocks < max_grid ? blocks : max_grid);
    emu_launch(grid, block, 0, body);
}

/* ---- GEGLU ----------------------------------------------------------------------------------- */

template <typename T> static void geglu_case(int N, int F, int off, unsigned max_grid) {
    const size_t n = (size_t)N * F;
    const pxt_dtype dt = dtype_of<T>();
    T *x = device<T>(2 * n + off, [](size_t) { return normal<T>(2.0); }) + off;
    T *dout = device<T>(n + off, [](size_t) { return normal<T>(1.0); }) + off;
    T *want = poisoned<T>(n), *got = poisoned<T>(n + off) + off;
    T *dwant = poisoned<T>(2 * n), *dgot = poisoned<T>(2 * n + off) + off;
    pxt_cpu_geglu_forward(0, want, x, N, F, dt);
    pxt_cpu_geglu_backward(0, dwant, x, dout, N, F, dt);
    long e0 = emu_errors;
    const void *fptrs[] = {got, x}, *bptrs[] = {dgot, x, dout};
    const int Vf = pxt_vec_width(sizeof(T), F, fptrs, 2), Vb = pxt_vec_width(sizeof(T), F, bptrs, 3);
    pxt_vec_dispatch<T>(Vf, [&](auto v) {
        constexpr int V = decltype(v)::value;
        ew_launch((size_t)N * (F / V), max_grid, [&] { pxt_geglu_forward_kernel<T, V>(got, x, N, F); });
    });
    pxt_vec_dispatch<T>(Vb, [&](auto v) {
        constexpr int V = decltype(v)::value;
        ew_launch((size_t)N * (F / V), max_grid,
                  [&] { pxt_geglu_backward_kernel<T, V>(dgot, x, dout, N, F); });
    });
    bool ok = same_bits(got, want, n * sizeof(T)) && same_bits(dgot, dwant, 2 * n * sizeof(T));
    report("geglu " + std::string(name_of<T>()) + " N=" + std::to_string(N) + " F=" + std::to_string(F) +
               " V=" + std::to_string(Vf) + "/" + std::to_string(Vb) + (off ? " misaligned" : "") +
               (max_grid < 65535 ? " (grid " + std::to_string(max_grid) + ")" : ""),
           ok && emu_errors == e0 && emu_tail_intact(got - off) && emu_tail_intact(dgot - off));
    for (void *p : {(void *)(x - off), (void *)(dout - off), (void *)want, (void *)(got - off), (void *)dwant,
                    (void *)(dgot - off)})
        emu_free(p);
}

/* ---- GELU (the MLP's, tanh form; cuda/gelu.cuh) ----------------------------------------------- */

/* n elements; off misaligns every buffer by that many elements (vectors of 1); max_grid
 * caps the grid so that the grid-stride loop goes round. Bit for bit: the CPU's float
 * expressions, and the emulator's expf is the CPU's glibc. */
template <typename T> static void gelu_case(size_t n, int off, unsigned max_grid) {
    const pxt_dtype dt = dtype_of<T>();
    T *x = device<T>(n + off, [](size_t) { return normal<T>(3.0); }) + off;
    T *dout = device<T>(n + off, [](size_t) { return normal<T>(1.0); }) + off;
    T *want = poisoned<T>(n), *got = poisoned<T>(n + off) + off;
    T *dwant = poisoned<T>(n), *dgot = poisoned<T>(n + off) + off;
    pxt_cpu_gelu_forward(0, want, x, n, dt);
    pxt_cpu_gelu_backward(0, dwant, x, dout, n, dt);
    long e0 = emu_errors;
    const void *fptrs[] = {got, x}, *bptrs[] = {dgot, x, dout};
    const int Vf = pxt_vec_width(sizeof(T), (int)(n % 16), fptrs, 2);
    const int Vb = pxt_vec_width(sizeof(T), (int)(n % 16), bptrs, 3);
    pxt_vec_dispatch<T>(Vf, [&](auto v) {
        constexpr int V = decltype(v)::value;
        ew_launch(n / V, max_grid, [&] { pxt_gelu_forward_kernel<T, V>(got, x, n); });
    });
    pxt_vec_dispatch<T>(Vb, [&](auto v) {
        constexpr int V = decltype(v)::value;
        ew_launch(n / V, max_grid, [&] { pxt_gelu_backward_kernel<T, V>(dgot, x, dout, n); });
    });
    bool ok = same_bits(got, want, n * sizeof(T)) && same_bits(dgot, dwant, n * sizeof(T));
    report("gelu " + std::string(name_of<T>()) + " n=" + std::to_string(n) + " V=" + std::to_string(Vf) + "/" +
               std::to_string(Vb) + (off ? " misaligned" : "") +
               (max_grid < 65535 ? " (grid " + std::to_string(max_grid) + ")" : ""),
           ok && emu_errors == e0 && emu_tail_intact(got - off) && emu_tail_intact(dgot - off));
    for (void *p : {(void *)(x - off), (void *)(dout - off), (void *)want, (void *)(got - off), (void *)dwant,
                    (void *)(dgot - off)})
        emu_free(p);
}

/* ---- dropout of rows (cuda/dropout.cuh) ------------------------------------------------------ */

/* N rows of C, rows of T per sample, segments at seg1, seg2; resid: the forward adds a
 * residual; off as groupnorm's. The CPU's bits: forward in place (x = resid + x * mask),
 * backward in place and out of place (dx = dy * mask), launched as dropout.cu does. */
template <typename T> static void dropout_case(int N, int C, int Trows, int seg1, int seg2, bool resid, int off) {
    const size_t n = (size_t)N * C;
    const pxt_dtype dt = dtype_of<T>();
    const uint64_t seed = rng(), live[3] = {seed, 5, rng() % 100};
    const pxt_dropout d = pxt_dropout_make(0.3f, pxt_dropout_key(seed, 5, 3), Trows, seg1, seg2, (uint32_t)live[2]);
    /* the kernel gets the key live ({seed, step, sample0} in device memory, as the GPT step
     * passes it) every other case, and must draw the CPU's bits from d either way */
    const pxt_dropout dk = seed & 1 ? pxt_dropout_make_live(0.3f, live, 3, Trows, seg1, seg2) : d;
    T *x0 = device<T>(n, [](size_t) { return normal<T>(1.0); });
    T *res = resid ? device<T>(n + off, [](size_t) { return normal<T>(1.0); }) + off : nullptr;
    T *want = device<T>(n, [&](size_t i) { return x0[i]; });
    T *got = device<T>(n + off, [&](size_t i) { return i < (size_t)off ? stf<T>(0.0f) : x0[i - off]; }) + off;
    T *dwant = device<T>(n, [&](size_t i) { return x0[i]; });
    T *dgot = device<T>(n + off, [&](size_t i) { return i < (size_t)off ? stf<T>(0.0f) : x0[i - off]; }) + off;
    T *dapart = poisoned<T>(n + off) + off;
    pxt_cpu_dropout_forward(0, want, res, N, C, &d, dt);
    pxt_cpu_dropout_backward(0, dwant, dwant, N, C, &d, dt);
    long e0 = emu_errors;
    const int groups = (C + 3) / 4;
    const void *ptrs[] = {got, got, res ? (const void *)res : (const void *)got};
    const int V = pxt_vec_width(sizeof(T), C, ptrs, 3) >= 4 ? 4 : 1;
    auto run = [&](T *dst, const T *src, const T *rs) {
        if (V == 4) ew_launch((size_t)N * groups, 65535, [&] { pxt_dropout_rows_kernel<T, 4>(dst, src, rs, N, C, groups, dk); });
        else ew_launch((size_t)N * groups, 65535, [&] { pxt_dropout_rows_kernel<T, 1>(dst, src, rs, N, C, groups, dk); });
    };
    run(dapart, x0, nullptr); /* the backward out of place: dx = dy * mask, dy = x0 */
    run(got, got, res);
    run(dgot, dgot, nullptr);
    bool ok = same_bits(got, want, n * sizeof(T)) && same_bits(dgot, dwant, n * sizeof(T)) &&
              same_bits(dapart, dwant, n * sizeof(T));
    report("dropout rows " + std::string(name_of<T>()) + " N=" + std::to_string(N) + " C=" + std::to_string(C) +
               " V=" + std::to_string(V) + (resid ? " +resid" : "") + (off ? " misaligned" : ""),
           ok && emu_errors == e0 && emu_tail_intact(got - off) && emu_tail_intact(dgot - off) &&
               emu_tail_intact(dapart - off));
    for (void *p : {(void *)x0, (void *)want, (void *)(got - off), (void *)dwant, (void *)(dgot - off),
                    (void *)(dapart - off)})
        emu_free(p);
    if (res) emu_free(res - off);
}

/* ---- LayerNorm's forward and dinp (the GPT blocks'; cuda/layernorm.cuh) ------------------------ */

/* N rows of C against the CPU's forward; off as groupnorm's. mean, rstd within 2 u of
 * themselves; out within 8 u of the magnitudes of its terms (groupnorm's bounds). */
template <typename T> static void layernorm_forward_case(int N, int C, int off) {
    const size_t n = (size_t)N * C;
    const pxt_dtype dt = dtype_of<T>();
    T *x = device<T>(n + off, [](size_t) { return normal<T>(1.5, 0.5); }) + off;
    T *w = device<T>(C + off, [](size_t) { return normal<T>(1.0); }) + off;
    T *b = device<T>(C + off, [](size_t) { return normal<T>(0.5); }) + off;
    T *want = poisoned<T>(n), *got = poisoned<T>(n + off) + off;
    float *wm = poisoned<float>(N), *wr = poisoned<float>(N), *gm = poisoned<float>(N), *gr = poisoned<float>(N);
    pxt_cpu_layernorm_forward(0, want, wm, wr, x, w, b, N, C, 1e-5f, dt);
    long e0 = emu_errors;
    const void *ptrs[] = {got, x, w, b};
    const int V = pxt_vec_width(sizeof(T), C, ptrs, 4);
    emu_dim3 grid, block;
    grid.x = (unsigned)((N + PXT_LN_WARPS - 1) / PXT_LN_WARPS);
    block.x = 32 * PXT_LN_WARPS;
    pxt_vec_dispatch<T>(V, [&](auto v) {
        if (N)
            emu_launch(grid, block, 0, [&] {
                pxt_ln_forward_kernel<T, decltype(v)::value>(got, gm, gr, x, w, b, N, C, 1e-5f);
            });
    });
    bool ok = close(gm, wm, N, [&](size_t i) { return 2 * U * std::fabs(wm[i]) + 1e-30; }, "mean") &&
              close(gr, wr, N, [&](size_t i) { return 2 * U * wr[i]; }, "rstd");
    ok = ok && close(got, want, n, [&](size_t i) {
             const size_t k = i / C;
             const int j = (int)(i % C);
             double xv = ldf(x[i]), nv = (xv - wm[k]) * wr[k], wv = ldf(w[j]);
             return 8 * U * (std::fabs(nv * wv) + std::fabs(ldf(b[j])) + (std::fabs(xv) + std::fabs(wm[k])) * wr[k] * std::fabs(wv)) + 1e-30;
         }, "out");
    report("layernorm forward " + std::string(name_of<T>()) + " N=" + std::to_string(N) + " C=" + std::to_string(C) +
               " V=" + std::to_string(V) + (off ? " misaligned" : ""),
           ok && emu_errors == e0 && emu_tail_intact(gm) && emu_tail_intact(gr) && emu_tail_intact(got - off));
    for (void *p : {(void *)(x - off), (void *)(w - off), (void *)(b - off), (void *)want, (void *)(got - off),
                    (void *)wm, (void *)wr, (void *)gm, (void *)gr})
        emu_free(p);
}

/* N rows of C from the CPU's saved statistics; off as groupnorm's. dinp within 8 u of the
 * magnitudes of its terms: the double sums add in a tree, so mean(g) and mean(g n) may be
 * an ulp apart from the CPU's. */
template <typename T> static void layernorm_case(int N, int C, int off) {
    const size_t n = (size_t)N * C;
    const pxt_dtype dt = dtype_of<T>();
    T *x = device<T>(n + off, [](size_t) { return normal<T>(1.5, 0.5); }) + off;
    T *w = device<T>(C + off, [](size_t) { return normal<T>(1.0); }) + off;
    T *b = device<T>(C, [](size_t) { return normal<T>(1.0); });
    T *dout = device<T>(n + off, [](size_t) { return normal<T>(1.0); }) + off;
    T *di0 = device<T>(n, [](size_t) { return normal<T>(1.0); });
    T *y = poisoned<T>(n);
    float *mean = poisoned<float>(N), *rstd = poisoned<float>(N);
    float *dw = device<float>(C, [](size_t) { return 0.0f; }), *db = device<float>(C, [](size_t) { return 0.0f; });
    pxt_cpu_layernorm_forward(0, y, mean, rstd, x, w, b, N, C, 1e-5f, dt);
    T *dwant = device<T>(n, [&](size_t i) { return di0[i]; });
    T *dgot = device<T>(n + off, [&](size_t i) { return i < (size_t)off ? stf<T>(0.0f) : di0[i - off]; }) + off;
    pxt_cpu_layernorm_backward(0, dwant, dw, db, dout, x, w, mean, rstd, N, C, dt, NULL);
    long e0 = emu_errors;
    const void *ptrs[] = {dgot, dout, x, w};
    const int V = pxt_vec_width(sizeof(T), C, ptrs, 4);
    emu_dim3 grid, block;
    grid.x = (unsigned)((N + PXT_LN_WARPS - 1) / PXT_LN_WARPS);
    block.x = 32 * PXT_LN_WARPS;
    pxt_vec_dispatch<T>(V, [&](auto v) {
        if (N)
            emu_launch(grid, block, 0, [&] {
                pxt_ln_dinp_kernel<T, decltype(v)::value>(dgot, dout, x, w, mean, rstd, N, C);
            });
    });
    std::vector<double> s1(N, 0.0), s2(N, 0.0); /* mean |g|, mean |g n| per row */
    for (size_t i = 0; i < n; i++) {
        double g = std::fabs((double)ldf(w[i % C]) * ldf(dout[i]));
        double nn = std::fabs(((double)ldf(x[i]) - mean[i / C]) * rstd[i / C]);
        s1[i / C] += g / C;
        s2[i / C] += g * nn / C;
    }
    bool ok = close(dgot, dwant, n, [&](size_t i) {
        double r = rstd[i / C], nn = std::fabs(((double)ldf(x[i]) - mean[i / C]) * r);
        double g = std::fabs((double)ldf(w[i % C]) * ldf(dout[i]));
        return 8 * U * ((g + s1[i / C] + nn * s2[i / C]) * r + std::fabs(ldf(di0[i]))) + 1e-30;
    }, "dinp");
    report("layernorm dinp " + std::string(name_of<T>()) + " N=" + std::to_string(N) + " C=" + std::to_string(C) +
               " V=" + std::to_string(V) + (off ? " misaligned" : ""),
           ok && emu_errors == e0 && emu_tail_intact(dgot - off));
    for (void *p : {(void *)(x - off), (void *)(w - off), (void *)b, (void *)(dout - off), (void *)di0, (void *)y,
                    (void *)mean, (void *)rstd, (void *)dw, (void *)db, (void *)dwant, (void *)(dgot - off)})
        emu_free(p);
}

template <typename T> static void all_small() {
    /* channels per group 2, 3 (no vectors), 4, 8 (bf16's 16 bytes), 32, 1024, 4096 (more
     * vectors per row than threads); S = 1; no samples */
    groupnorm_case<T>(1, 1, 16, 8, 0);
    groupnorm_case<T>(2, 5, 48, 16, 0);
    groupnorm_case<T>(3, 17, 64, 16, 0);
    groupnorm_case<T>(2, 9, 64, 8, 0);
    groupnorm_case<T>(2, 40, 96, 3, 0);
    groupnorm_case<T>(1, 3, 2048, 2, 0);
    groupnorm_case<T>(1, 2, 4096, 1, 0);
    groupnorm_case<T>(0, 4, 64, 2, 0);
    groupnorm_case<T>(2, 7, 256, 8, 1);
    rmsnorm_case<T>(1, 1, 0, 0);
    rmsnorm_case<T>(3, 7, 0, 0);
    rmsnorm_case<T>(10, 33, 0, 0);
    rmsnorm_case<T>(5, 1000, 1, 0);
    rmsnorm_case<T>(6, 1024, 0, 1);
    rmsnorm_case<T>(0, 8, 0, 0);
    geglu_case<T>(1, 1, 0, 65535);
    geglu_case<T>(3, 5, 0, 65535);
    geglu_case<T>(7, 66, 0, 2);
    geglu_case<T>(40, 33, 0, 65535);
    geglu_case<T>(9, 64, 1, 65535);
    geglu_case<T>(0, 8, 0, 65535);
    gelu_case<T>(1, 0, 65535);
    gelu_case<T>(7, 0, 65535);
    gelu_case<T>(4096 + 8, 0, 3);
    gelu_case<T>(1000, 1, 65535);
    gelu_case<T>(0, 0, 65535);
    dropout_case<T>(1, 1, 1, 1, 1, false, 0);
    dropout_case<T>(3, 7, 3, 1, 2, true, 0);      /* C % 4 != 0: element by element */
    dropout_case<T>(12, 64, 6, 2, 4, true, 0);     /* 2 samples of 6 rows, 3 segments */
    dropout_case<T>(10, 1024, 5, 5, 5, false, 1);  /* misaligned: element by element */
    dropout_case<T>(0, 8, 1, 1, 1, true, 0);
    layernorm_forward_case<T>(1, 1, 0);
    layernorm_forward_case<T>(3, 7, 0);
    layernorm_forward_case<T>(10, 1000, 0);
    layernorm_forward_case<T>(9, 1024, 1);
    layernorm_forward_case<T>(17, 1024, 0);
    layernorm_forward_case<T>(0, 8, 0);
    layernorm_case<T>(1, 1, 0);
    layernorm_case<T>(3, 7, 0);
    layernorm_case<T>(10, 1000, 0);
    layernorm_case<T>(9, 1024, 1);
    layernorm_case<T>(0, 8, 0);
}

int main(int argc, char **argv) {
    rng.seed(argc > 1 ? strtoull(argv[1], NULL, 10) : 1);
    const bool quick = argc > 2 && !strcmp(argv[2], "quick");
    all_small<float>();
    all_small<pxt_bf16>();
    all_small<pxt_f16>();
    if (!quick) { /* XTTS v2: 8 samples of 517 frames, d = 1024 in 32 groups; 8 x 32 latents, F = 2730 */
        groupnorm_case<pxt_bf16>(8, 517, 1024, 32, 0);
        groupnorm_case<float>(2, 517, 1024, 32, 0);
        rmsnorm_case<pxt_bf16>(8 * 32, 1024, 0, 0);
        rmsnorm_case<float>(8 * 32, 1024, 0, 0);
        geglu_case<pxt_bf16>(8 * 32, 2730, 0, 65535);
        geglu_case<float>(8 * 32, 2730, 0, 65535);
        gelu_case<pxt_bf16>((size_t)490 * 4096, 0, 65535); /* one sample of fc's activations */
        dropout_case<pxt_bf16>(8 * 490, 1024, 490, 32, 232, true, 0); /* a block's residual, batch 8 */
        layernorm_forward_case<pxt_bf16>(8 * 490, 1024, 0);     /* a block's, batch 8 */
        layernorm_case<pxt_bf16>(8 * 490, 1024, 0);
    }
    printf("failures: %d\n", failures);
    return failures != 0;
}
