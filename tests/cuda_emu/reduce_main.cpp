/* reduce_main.cpp: the CUDA kernels of the deterministic reductions
 * (cuda/colsum.cuh, cuda/embedding.cuh), their own source run by the emulator,
 * against the CPU backend's functions (csrc/cpu/bias.c, layernorm.c,
 * embedding.c, linked in): every output bit for bit, at tiny, ragged and XTTS
 * v2 sizes, each dtype. The parts of `sum` and `grad_sumsq` (cuda/reduce.cuh),
 * whose order differs from the CPU's, against a host model of the order its
 * header states. Workspaces and outputs start poisoned; every device
 * buffer has a guard page after its end and its slack checked.
 *
 * Usage: reduce_emu SEED [quick]. Prints one line per case and "failures: N". */
#include "emu.h"
#include "emu_check.h"

#include "engine/backend.h"
#include "colsum.cuh"
#include "gelu.cuh"
#include "embedding.cuh"
#include "reduce.cuh"

extern "C" {
#include "cpu/cpu.h" /* the CPU backend's kernels, linked in */
}

#include <random>
#include <string>
#include <vector>

static std::mt19937_64 rng;

template <typename T> static T normal(double scale) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    return stf<T>((float)(scale * nd(rng)));
}

/* Both stages of colsum.cu's launch, grid.y capped at max_y (the host's cap,
 * lowered in some cases so blocks stride over the chunks). */
template <typename F>
static void colsum_launch(F f, float *out0, float *out1, int rows, int cols, double *parts,
                          unsigned max_y) {
    const int R = pxt_colsum_chunk_rows(rows, cols), nchunks = pxt_colsum_chunks(rows, cols);
    emu_dim3 grid, block;
    grid.x = (unsigned)((cols + PXT_COLSUM_BLOCK - 1) / PXT_COLSUM_BLOCK);
    block.x = PXT_COLSUM_BLOCK;
    if (nchunks > 0) { /* V columns a thread, as colsum.cu picks them */
        grid.y = (unsigned)nchunks < max_y ? (unsigned)nchunks : max_y;
        pxt_colsum_dispatch(f, cols, [&](auto v) {
            constexpr int V = decltype(v)::value;
            grid.x = (unsigned)((cols / V + PXT_COLSUM_BLOCK - 1) / PXT_COLSUM_BLOCK);
            emu_launch(grid, block, 0, [&] { pxt_colsum_parts_kernel<F, V>(parts, f, rows, cols, R, nchunks); });
        });
        grid.x = (unsigned)((cols + PXT_COLSUM_BLOCK - 1) / PXT_COLSUM_BLOCK);
    }
    grid.y = F::NV;
    emu_launch(grid, block, 0, [&] { pxt_colsum_finish_kernel(out0, out1, parts, nchunks, cols); });
}

/* ld > N: the rows ld apart, the columns past N NaN (the heads' padded logits) */
template <typename T> static void bias_case(int M, int N, unsigned max_y, int ld = 0) {
    ld = ld ? ld : N;
    T *dout = device<T>((size_t)M * ld, [&](size_t i) {
        return (int)(i % ld) < N ? normal<T>(3.0) : stf<T>(NAN);
    });
    float *want = device<float>(N, [](size_t) { return normal<float>(1.0); });
    float *got = device<float>(N, [&](size_t j) { return want[j]; });
    size_t nparts = (size_t)pxt_colsum_chunks(M, N) * N;
    double *parts = (double *)emu_alloc(nparts * sizeof(double) + 8); /* poisoned */
    pxt_cpu_bias_backward(0, want, dout, M, N, ld, dtype_of<T>(), NULL);
    long e0 = emu_errors;
    colsum_launch(pxt_colsum_rows<T>{dout, ld}, got, NULL, M, N, parts, max_y);
    bool ok = same_bits(got, want, N * sizeof(float)) && emu_errors == e0 &&
              emu_tail_intact(got) && emu_tail_intact(parts);
    report("bias_backward " + std::string(name_of<T>()) + " M=" + std::to_string(M) + " N=" +
               std::to_string(N) + (ld != N ? " ld=" + std::to_string(ld) : "") +
               (max_y < 65535 ? " (grid.y " + std::to_string(max_y) + ")" : ""),
           ok);
    emu_free(dout), emu_free(want), emu_free(got), emu_free(parts);
}

/* gemm_fused's DGELU_BGRAD without cuBLASLt (colsum.cu's pxt_cuda_dgelu_bgrad): d and
 * dbias the CPU's gelu_backward then bias_backward bits; off > 0 misaligns the rows
 * (V = 1) */
template <typename T> static void dgelu_case(int M, int N, int off) {
    const size_t n = (size_t)M * N;
    T *pre = device<T>(n + off, [](size_t) { return normal<T>(3.0); }) + off;
    T *p0 = device<T>(n, [](size_t) { return normal<T>(1.0); });
    T *want = device<T>(n, [&](size_t i) { return p0[i]; });
    T *got = device<T>(n + off, [&](size_t i) { return i < (size_t)off ? stf<T>(0.0f) : p0[i - off]; }) + off;
    float *bwant = device<float>(N, [](size_t) { return normal<float>(1.0); });
    float *bgot = device<float>(N, [&](size_t j) { return bwant[j]; });
    double *parts = (double *)emu_alloc((size_t)pxt_colsum_chunks(M, N) * N * sizeof(double) + 8);
    pxt_cpu_gelu_backward(0, want, pre, want, n, dtype_of<T>());
    pxt_cpu_bias_backward(0, bwant, want, M, N, N, dtype_of<T>(), NULL);
    long e0 = emu_errors;
    const pxt_colsum_dgelu<T> f = {got, pre, N};
    const int V = pxt_colsum_width(f, N);
    colsum_launch(f, bgot, NULL, M, N, parts, 65535);
    bool ok = same_bits(got, want, n * sizeof(T)) && same_bits(bgot, bwant, N * sizeof(float)) &&
              emu_errors == e0 && emu_tail_intact(got - off) && emu_tail_intact(bgot) && emu_tail_intact(parts);
    report("dgelu + bias gradient " + std::string(name_of<T>()) + " M=" + std::to_string(M) + " N=" +
               std::to_string(N) + " V=" + std::to_string(V) + (off ? " misaligned" : ""),
           ok);
    for (void *p : {(void *)(pre - off), (void *)p0, (void *)want, (void *)(got - off), (void *)bwant,
                    (void *)bgot, (void *)parts})
        emu_free(p);
}

template <typename T> static void layernorm_case(int N, int C) {
    T *x = device<T>((size_t)N * C, [](size_t) { return normal<T>(2.0); });
    T *w = device<T>(C, [](size_t) { return normal<T>(1.0); });
    T *b = device<T>(C, [](size_t) { return normal<T>(1.0); });
    T *dout = device<T>((size_t)N * C, [](size_t) { return normal<T>(1.0); });
    T *y = device<T>((size_t)N * C, [](size_t) { return stf<T>(0.0f); });
    T *dinp = device<T>((size_t)N * C, [](size_t) { return stf<T>(0.0f); });
    float *mean = device<float>(N, [](size_t) { return 0.0f; });
    float *rstd = device<float>(N, [](size_t) { return 0.0f; });
    pxt_cpu_layernorm_forward(0, y, mean, rstd, x, w, b, N, C, 1e-5f, dtype_of<T>());
    float *wd = device<float>(C, [](size_t) { return normal<float>(1.0); });
    float *wb = device<float>(C, [](size_t) { return normal<float>(1.0); });
    float *gd = device<float>(C, [&](size_t j) { return wd[j]; });
    float *gb = device<float>(C, [&](size_t j) { return wb[j]; });
    pxt_cpu_layernorm_backward(0, dinp, wd, wb, dout, x, w, mean, rstd, N, C, dtype_of<T>(), NULL);
    double *parts = (double *)emu_alloc(2 * (size_t)pxt_colsum_chunks(N, C) * C * sizeof(double) + 8);
    long e0 = emu_errors;
    colsum_launch(pxt_colsum_ln<T>{{dout, x, C}, mean, rstd}, gd, gb, N, C, parts, 65535);
    bool ok = same_bits(gd, wd, C * sizeof(float)) && same_bits(gb, wb, C * sizeof(float)) &&
              emu_errors == e0 && emu_tail_intact(gd) && emu_tail_intact(gb) && emu_tail_intact(parts);
    report("layernorm dweight, dbias " + std::string(name_of<T>()) + " N=" + std::to_string(N) +
               " C=" + std::to_string(C), ok);
    for (void *p : {(void *)x, (void *)w, (void *)b, (void *)dout, (void *)y, (void *)dinp,
                    (void *)mean, (void *)rstd, (void *)wd, (void *)wb, (void *)gd, (void *)gb,
                    (void *)parts})
        emu_free(p);
}

/* ids: "random" over V, "one" id throughout, "positions" 0..149 repeating, "skewed"
 * (half the rows id 0) */
template <typename T> static void embedding_case(int N, int V, int C, const char *kind, unsigned max_y) {
    std::uniform_int_distribution<int> ui(0, V - 1);
    std::uniform_real_distribution<double> ur(0.0, 1.0);
    int32_t *ids = device<int32_t>(N, [&](size_t i) -> int32_t {
        if (!strcmp(kind, "one")) return V - 1;
        if (!strcmp(kind, "positions")) return (int32_t)(i % 150 % V);
        if (!strcmp(kind, "skewed") && ur(rng) < 0.5) return 0;
        return ui(rng);
    });
    T *dout = device<T>((size_t)N * C, [](size_t) { return normal<T>(1.0); });
    float *want = device<float>((size_t)V * C, [](size_t) { return normal<float>(1.0); });
    float *got = device<float>((size_t)V * C, [&](size_t i) { return want[i]; });
    void *cpu_ws = emu_alloc(pxt_cpu_embedding_workspace(N, C, V));
    pxt_cpu_embedding_backward(0, want, dout, ids, N, C, V, dtype_of<T>(), cpu_ws);
    double *parts = (double *)emu_alloc((size_t)N * C * sizeof(double)); /* poisoned */
    uint8_t *flags = (uint8_t *)emu_alloc(N);
    long e0 = emu_errors;
    const int nchunks = (N + PXT_EMB_CHUNK - 1) / PXT_EMB_CHUNK;
    const unsigned rowblocks = (unsigned)((N + PXT_EMB_WARPS - 1) / PXT_EMB_WARPS);
    emu_dim3 grid, block;
    block.x = 32 * PXT_EMB_WARPS;
    grid.x = rowblocks;
    emu_launch(grid, block, 0, [&] { pxt_emb_flags_kernel(flags, ids, N); });
    grid.x = (unsigned)((C + 31) / 32);
    grid.y = (unsigned)nchunks < max_y ? (unsigned)nchunks : max_y;
    emu_launch(grid, block, 0, [&] { pxt_emb_parts_kernel<T>(parts, flags, dout, ids, N, C); });
    grid.y = rowblocks < max_y ? rowblocks : max_y;
    emu_launch(grid, block, 0, [&] { pxt_emb_sum_kernel<T>(got, parts, flags, dout, ids, N, C); });
    bool ok = same_bits(got, want, (size_t)V * C * sizeof(float)) && emu_errors == e0 &&
              emu_tail_intact(got) && emu_tail_intact(flags) && emu_tail_intact(parts);
    report("embedding_backward " + std::string(name_of<T>()) + " N=" + std::to_string(N) + " V=" +
               std::to_string(V) + " C=" + std::to_string(C) + " " + kind +
               (max_y < 65535 ? " (grid.y " + std::to_string(max_y) + ")" : ""),
           ok);
    for (void *p : {(void *)ids, (void *)dout, (void *)want, (void *)got, cpu_ws, (void *)parts,
                    (void *)flags})
        emu_free(p);
}

/* reduce.cuh's parts of x (n) or x^2 (SQUARE), nparts blocks, against the order its
 * header states, modelled on the host: per part, thread t adds elements t, t + 256,
 * ... in order from 0.0; then the tree, halves added pairwise from 128 down. */
template <bool SQUARE> static void parts_sum_case(size_t n, int nparts) {
    /* magnitudes over 2^-30 .. 2^30: double sums of floats round, so the order shows */
    std::uniform_int_distribution<int> ex(-30, 30);
    float *x = device<float>(n, [&](size_t) { return std::ldexp(normal<float>(1.0), ex(rng)); });
    double *got = (double *)emu_alloc(nparts * sizeof(double)); /* poisoned */
    std::vector<double> want(nparts), sh(PXT_PARTS_BLOCK);
    const size_t len = (n + nparts - 1) / nparts;
    for (int p = 0; p < nparts; p++) {
        const size_t lo = (size_t)p * len < n ? (size_t)p * len : n, hi = n - lo < len ? n : lo + len;
        for (int t = 0; t < PXT_PARTS_BLOCK; t++) {
            double a = 0.0;
            for (size_t i = lo + t; i < hi; i += PXT_PARTS_BLOCK) {
                const double d = x[i];
                a += SQUARE ? d * d : d;
            }
            sh[t] = a;
        }
        for (int s = PXT_PARTS_BLOCK / 2; s > 0; s >>= 1)
            for (int t = 0; t < s; t++)
                sh[t] += sh[t + s];
        want[p] = sh[0];
    }
    long e0 = emu_errors;
    emu_dim3 grid, block;
    grid.x = (unsigned)nparts;
    block.x = PXT_PARTS_BLOCK;
    emu_launch(grid, block, 0, [&] { parts_sum_kernel<SQUARE>(got, x, n, nparts); });
    bool ok = same_bits(got, want.data(), nparts * sizeof(double)) && emu_errors == e0 && emu_tail_intact(got);
    report("parts_sum " + std::string(SQUARE ? "x^2" : "x") + " n=" + std::to_string(n) + " parts=" +
               std::to_string(nparts),
           ok);
    emu_free(x);
    emu_free(got);
}

int main(int argc, char **argv) {
    rng.seed(argc > 1 ? strtoull(argv[1], NULL, 10) : 1);
    const bool quick = argc > 2 && !strcmp(argv[2], "quick");
    /* column sums: one chunk, chunk edges (16, 17 rows), many chunks, strided grid, XTTS */
    bias_case<float>(1, 1, 65535);
    bias_case<float>(16, 5, 65535);
    bias_case<pxt_bf16>(17, 5, 65535);
    bias_case<pxt_f16>(1000, 130, 65535);
    bias_case<float>(5000, 7, 3);
    bias_case<pxt_bf16>(700, 300, 2);
    bias_case<float>(300, 6681, 65535, 6688); /* the text head's bias gradient */
    bias_case<pxt_bf16>(700, 300, 65535, 304);
    bias_case<pxt_f16>(100, 8, 65535, 12);
    bias_case<pxt_f16>(100, 8, 65535, 10); /* rows 20 bytes apart: one column a thread */
    dgelu_case<float>(1, 1, 0);
    dgelu_case<pxt_bf16>(17, 40, 0);
    dgelu_case<pxt_f16>(300, 130, 0);
    dgelu_case<pxt_bf16>(200, 64, 1);
    dgelu_case<float>(33, 12, 0);
    layernorm_case<float>(1, 1);
    layernorm_case<pxt_f16>(33, 5);
    layernorm_case<pxt_bf16>(700, 96);
    embedding_case<float>(1, 1, 1, "random", 65535);
    embedding_case<float>(64, 5, 3, "random", 65535);
    embedding_case<pxt_bf16>(65, 5, 40, "one", 65535);
    embedding_case<pxt_f16>(300, 1026, 33, "random", 65535);
    embedding_case<pxt_bf16>(608, 608, 64, "positions", 3);
    embedding_case<float>(1000, 4, 130, "skewed", 65535);
    embedding_case<pxt_bf16>(300, 70, 40, "random", 65535); /* ids alone and repeated in a chunk */
    /* parts: empty ones (n < parts), under one round of loads, the main loop and its tail */
    parts_sum_case<true>(1, PXT_SUMSQ_PARTS);
    parts_sum_case<false>(200, PXT_SUMSQ_PARTS);
    parts_sum_case<true>(3 * PXT_PARTS_AHEAD * PXT_PARTS_BLOCK + 17, 3);
    parts_sum_case<true>(1000003, PXT_SUMSQ_PARTS);
    parts_sum_case<false>(777777, 7);
    if (!quick) { /* XTTS v2: batch 8 x 490 positions, d = 1024; one sample's 308 audio rows */
        bias_case<pxt_bf16>(8 * 490, 1024, 65535);
        bias_case<pxt_bf16>(8 * 490, 4096, 65535);
        layernorm_case<pxt_bf16>(8 * 490, 1024);
        dgelu_case<pxt_bf16>(8 * 490, 4096, 0);
        embedding_case<pxt_bf16>(308, 1026, 1024, "random", 65535);
        embedding_case<pxt_bf16>(308, 608, 1024, "positions", 65535);
    }
    printf("failures: %d\n", failures);
    return failures != 0;
}
