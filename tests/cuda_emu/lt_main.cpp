/* lt_main.cpp: a host model of the index math of cuda/gemm_fused.cu.
 *
 * cuda/lt_map.h turns a row-major pxt_gemm_args into the column-major product
 * cuBLASLt computes. This program runs that product through a model of
 * cuBLASLt written from its documentation (column-major storage with leading
 * dimensions, op() per transpose flag, BIAS over D's rows, GELU_AUX_BIAS
 * writing the GELU input to the aux matrix, DGELU_BGRAD's bias gradient over
 * the "n" dimension, BGRADA's over "k" of op(A)), in float64, and compares it
 * with backend.h's row-major definition computed directly: every element of D,
 * pre and dbias, every epilogue, every transpose, sizes 1 to 33.
 *
 * Usage: lt_emu SEED. Prints one line per failing case and "failures: N". */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <random>
#include <vector>

extern "C" {
#include "engine/pxt.h"
}
#include "lt_map.h"

static double gelu(double x) { return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }

static double dgelu(double x) {
    double u = 0.7978845608028654 * (x + 0.044715 * x * x * x), t = tanh(u);
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 3 * 0.044715 * x * x);
}

struct Out {
    std::vector<double> D, pre, dbias;
};

/* The model: cuBLASLt's documented semantics on column-major operands. */
static void lt_model(const pxt_lt_map &m, double alpha, double beta, const double *C,
                     const double *bias, Out &o) {
    const double *A = (const double *)m.a, *B = (const double *)m.b;
    auto opA = [&](int64_t i, int64_t k) { return m.transa ? A[k + i * m.a_ld] : A[i + k * m.a_ld]; };
    auto opB = [&](int64_t k, int64_t j) { return m.transb ? B[j + k * m.b_ld] : B[k + j * m.b_ld]; };
    for (int64_t i = 0; i < m.m; i++) { /* rows of D' */
        for (int64_t j = 0; j < m.n; j++) {
            double acc = 0;
            for (int64_t k = 0; k < m.k; k++)
                acc += opA(i, k) * opB(k, j);
            acc = alpha * acc + (beta != 0.0 ? beta * C[i + j * m.d_ld] : 0.0);
            double &d = o.D[i + j * m.d_ld];
            switch (m.epi) {
            case PXT_LT_BIAS: d = acc + bias[i]; break;
            case PXT_LT_GELU_AUX_BIAS:
                o.pre[i + j * m.aux_ld] = acc + bias[i];
                d = gelu(acc + bias[i]);
                break;
            case PXT_LT_DGELU_BGRAD:
                d = acc * dgelu(o.pre[i + j * m.aux_ld]);
                o.dbias[i] += d; /* over n */
                break;
            default: d = acc; break;
            }
        }
        if (m.epi == PXT_LT_BGRADA)
            for (int64_t k = 0; k < m.k; k++)
                o.dbias[i] += opA(i, k); /* over k of op(A) */
    }
}

/* backend.h's row-major definition, directly. */
static void rowmajor(const pxt_gemm_args &g, const double *A, const double *B, const double *C,
                     const double *bias, Out &o) {
    const int M = g.M, N = g.N, K = g.K;
    auto a = [&](int r, int k) { return g.trans_a ? A[(size_t)k * M + r] : A[(size_t)r * K + k]; };
    auto b = [&](int k, int c) { return g.trans_b ? B[(size_t)c * K + k] : B[(size_t)k * N + c]; };
    for (int r = 0; r < M; r++)
        for (int c = 0; c < N; c++) {
            double acc = 0;
            for (int k = 0; k < K; k++)
                acc += a(r, k) * b(k, c);
            acc = g.alpha * acc + (g.beta != 0.0f ? g.beta * C[(size_t)r * N + c] : 0.0);
            double &d = o.D[(size_t)r * N + c];
            switch (g.epilogue) {
            case PXT_EPI_BIAS: d = acc + bias[c]; break;
            case PXT_EPI_BIAS_GELU:
                o.pre[(size_t)r * N + c] = acc + bias[c];
                d = gelu(acc + bias[c]);
                break;
            case PXT_EPI_DGELU_BGRAD:
                d = acc * dgelu(o.pre[(size_t)r * N + c]);
                o.dbias[c] += d; /* column sums of D */
                break;
            default: d = acc; break;
            }
        }
    if (g.epilogue == PXT_EPI_BGRAD_B) /* column sums of op(B) over its K rows */
        for (int k = 0; k < K; k++)
            for (int c = 0; c < N; c++)
                o.dbias[c] += b(k, c);
}

static int close(const std::vector<double> &x, const std::vector<double> &y) {
    for (size_t i = 0; i < x.size(); i++)
        if (!(fabs(x[i] - y[i]) <= 1e-12 * (1.0 + fabs(y[i]))))
            return 0;
    return 1;
}

int main(int argc, char **argv) {
    /* PYXTTS_CUDA_LT_EPILOGUES' parser */
    {
        const int none = 1 << PXT_EPI_NONE, bias = 1 << PXT_EPI_BIAS, gelu = 1 << PXT_EPI_BIAS_GELU,
                  dgelu = 1 << PXT_EPI_DGELU_BGRAD, bgrad = 1 << PXT_EPI_BGRAD_B;
        const struct {
            const char *s;
            int want;
        } masks[] = {{NULL, none | bias | gelu | dgelu},
                     {"", none | bias | gelu | dgelu}, /* empty: unset, as the other switches */
                     {"bgrad_b", none | bgrad},
                     {"bias,bias_gelu,dgelu_bgrad,bgrad_b", none | bias | gelu | dgelu | bgrad},
                     {"bias,,bgrad_b,", none | bias | bgrad},
                     {"none", none},
                     {"bias,gelu", -1},
                     {"bgrad", -1},
                     {"bias_gelux", -1}};
        for (auto &c : masks) {
            int got = pxt_lt_epilogue_mask(c.s);
            if (got != c.want) {
                printf("FAIL PYXTTS_CUDA_LT_EPILOGUES=%s: mask %d, want %d\n", c.s ? c.s : "(unset)",
                       got, c.want);
                return 1;
            }
        }
    }
    std::mt19937_64 rng(argc > 1 ? strtoull(argv[1], NULL, 10) : 1);
    std::normal_distribution<double> nd(0.0, 1.0);
    const int sizes[][3] = {{1, 1, 1}, {3, 5, 7}, {16, 8, 4}, {7, 16, 33}, {33, 2, 9}};
    const pxt_epilogue epis[] = {PXT_EPI_NONE, PXT_EPI_BIAS, PXT_EPI_BIAS_GELU,
                                 PXT_EPI_DGELU_BGRAD, PXT_EPI_BGRAD_B};
    int failures = 0, cases = 0;
    for (auto &s : sizes)
        for (pxt_epilogue e : epis)
            for (int ta = 0; ta < 2; ta++)
                for (int tb = 0; tb < 2; tb++)
                    for (int withc = 0; withc < 2; withc++) {
                        if (e == PXT_EPI_BGRAD_B && tb)
                            continue; /* backend.h: B not transposed */
                        if (e == PXT_EPI_DGELU_BGRAD && withc)
                            continue; /* beta = 0 */
                        const int M = s[0], N = s[1], K = s[2];
                        auto fill = [&](size_t n) {
                            std::vector<double> v(n);
                            for (auto &x : v) x = nd(rng);
                            return v;
                        };
                        std::vector<double> A = fill((size_t)M * K), B = fill((size_t)K * N);
                        std::vector<double> C = fill((size_t)M * N), bias = fill(N);
                        std::vector<double> pre = fill((size_t)M * N);
                        pxt_gemm_args g = {};
                        g.trans_a = ta, g.trans_b = tb, g.M = M, g.N = N, g.K = K;
                        g.alpha = e == PXT_EPI_DGELU_BGRAD || e == PXT_EPI_BGRAD_B ? 1.0f : 0.75f;
                        g.beta = withc ? -0.5f : 0.0f;
                        g.A = A.data(), g.B = B.data(), g.epilogue = e;
                        Out want{std::vector<double>((size_t)M * N), pre, std::vector<double>(N)};
                        Out got = want;
                        rowmajor(g, A.data(), B.data(), C.data(), bias.data(), want);
                        pxt_lt_map m;
                        pxt_lt_map_of(&g, &m);
                        lt_model(m, g.alpha, g.beta, C.data(), bias.data(), got);
                        cases++;
                        if (!close(got.D, want.D) || !close(got.pre, want.pre) ||
                            !close(got.dbias, want.dbias)) {
                            printf("FAIL M=%d N=%d K=%d epilogue %d trans_a %d trans_b %d beta %g\n",
                                   M, N, K, (int)e, ta, tb, (double)g.beta);
                            failures++;
                        }
                    }
    printf("%d cases\nfailures: %d\n", cases, failures);
    return failures != 0;
}
