/* matmul.c: gemm through OpenBLAS, the bias add and its backward.
 *
 * gemm with 16-bit operands. OpenBLAS multiplies float32 only, so:
 *   - 16-bit A and B are widened into float32 copies in the workspace, whose
 *     layout is [A32 (M*K) | B32 (K*N)] (gemm_workspace: (M*K + K*N) * 4 bytes
 *     for a 16-bit dt_ab, 0 for float32); the transposes apply to the copies.
 *   - a 16-bit C is computed in float32 tiles of at most GEMM_TILE elements
 *     (128 KiB on the stack, so the workspace does not depend on dt_c, which
 *     gemm_workspace does not see): each tile is one sgemm over the whole K,
 *     with beta * C added in float32, then rounded once into C. A tile is
 *     GEMM_TILE_N columns wide and as many rows as fit (128), which keeps each
 *     sgemm call large enough for OpenBLAS's blocking: at (3440, 1024) x
 *     (1024, 4096) a bf16 C costs ~1.3x a float32 C on one thread (smaller
 *     tiles cost more, from re-packing B per tile).
 * So every result is the float32 sum of products, rounded once to dt_c.
 *
 * Threads: OpenBLAS runs single-threaded (pxt_cpu_init) and the engine's one
 * thread pool, OpenMP's, shares out tiles of C whose edges depend on the
 * product's shape only (so does a 16-bit C's staging), never on the thread
 * count: every result has the same bits for any OMP_NUM_THREADS. Two pools on
 * the same cores spin against each other: measured 25x slower steps. */
#include <cblas.h> /* scipy-openblas32: symbols carry a scipy_ prefix */
#include <omp.h>

#include "cpu.h"
#include "elem.h"

#define GEMM_TILE 32768 /* floats in a 16-bit C's staging tile (128 KiB) */
#define GEMM_TILE_N 256 /* its width in columns (at most) */

size_t pxt_cpu_gemm_workspace(int M, int N, int K, pxt_dtype dt_ab) {
    if (dt_ab == PXT_FLOAT32 || M <= 0 || N <= 0 || K <= 0) {
        return 0;
    }
    return ((size_t)M * (size_t)K + (size_t)K * (size_t)N) * sizeof(float);
}

/* The tile grid of a float32 C. OpenBLAS's bits for an element depend on the
 * shape of the call that computes it (splitting a (132, 96, 96) product into two
 * row panels changes 11-30% of its elements), so the grid is a function of
 * (M, N, K) alone, never of the thread count: threads take whole tiles, and any
 * number of them gives the same bits. Each tile is one single-threaded sgemm
 * over the whole K. The grid halves the longer tile edge while a tile keeps
 * TILE_MIN_FLOPS of work and edges of TILE_MIN_EDGE, up to TILE_MAX tiles.
 * Tiles cost: OpenBLAS repacks op(A) for every column of tiles and op(B) for
 * every row of them. tests/bench/bench_gemm_tiles.py models a step's GEMMs
 * on T threads from each tile's CPU time: against the old split into T panels,
 * this grid (8 tiles, edges >= 64) costs 4% at d=256 on 2 threads, 1.5% on 4
 * and nothing on 8; 16 tiles cost 6-9% on 2 threads, and edges >= 128 kept the
 * d=64 model's weight gradients on one thread (+16%). So at most 8 threads
 * share one product. */
#define TILE_ALIGN 16            /* tile edges on multiples of 16 rows / columns */
#define TILE_MIN_EDGE 64         /* rows or columns of the narrowest tile */
#define TILE_MIN_FLOPS (1 << 22) /* work of the smallest tile: ~0.1 ms on one core */
#define TILE_MAX 8               /* tiles of the largest products */

/* Rows of C split into *pm parts and columns into *pn (both powers of two). */
static void tile_grid(int M, int N, int K, int *pm, int *pn) {
    double flops = 2.0 * M * N * K;
    int m = 1, n = 1;
    while (m * n < TILE_MAX && flops / (2 * m * n) >= TILE_MIN_FLOPS) {
        int h = M / m, w = N / n; /* the current tile edges */
        int can_m = h >= 2 * TILE_MIN_EDGE, can_n = w >= 2 * TILE_MIN_EDGE;
        if (can_m && (h >= w || !can_n)) {
            m *= 2;
        } else if (can_n) {
            n *= 2;
        } else {
            break;
        }
    }
    *pm = m;
    *pn = n;
}

/* The first index of part p of dim split into parts (parts' edges on TILE_ALIGN). */
static int part_start(int dim, int p, int parts) {
    return p == parts ? dim : (int)((long long)dim * p / parts) / TILE_ALIGN * TILE_ALIGN;
}

/* C (M, N) = alpha op(A) op(B) + beta C in float32, ldc = N, tile by tile. */
static void sgemm_tiles(enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int M, int N, int K,
                        float alpha, const float *a, int lda, const float *b, int ldb, float beta,
                        float *C, int ldc) {
    int pm, pn;
    tile_grid(M, N, K, &pm, &pn);
    int tiles = pm * pn;
#pragma omp parallel for schedule(dynamic, 1) if (tiles > 1 && !omp_in_parallel())
    for (int t = 0; t < tiles; t++) {
        int i0 = part_start(M, t / pn, pm), i1 = part_start(M, t / pn + 1, pm);
        int j0 = part_start(N, t % pn, pn), j1 = part_start(N, t % pn + 1, pn);
        /* rows i0.. of op(A): rows of A, or columns of the stored (K, M);
         * columns j0.. of op(B): columns of B, or rows of the stored (N, K) */
        const float *ap = ta == CblasTrans ? a + i0 : a + (size_t)i0 * lda;
        const float *bp = tb == CblasTrans ? b + (size_t)j0 * ldb : b + j0;
        scipy_cblas_sgemm(CblasRowMajor, ta, tb, i1 - i0, j1 - j0, K, alpha, ap, lda, bp, ldb, beta,
                          C + (size_t)i0 * ldc + j0, ldc);
    }
}

/* dst (rows, cols) = (float) src (rows, cols) whose rows are ld elements apart, in
 * parallel chunks (a cast is memory bound); dst is dense. */
static void widen(float *dst, const void *src, int rows, int cols, int ld, pxt_dtype dt) {
    const uint16_t *s = src;
    if (ld == cols) { /* one run of rows * cols */
        const size_t chunk = 1 << 16, n = (size_t)rows * cols;
        long nchunks = (long)((n + chunk - 1) / chunk);
#pragma omp parallel for schedule(static) if (nchunks > 1)
        for (long c = 0; c < nchunks; c++) {
            size_t lo = (size_t)c * chunk, len = n - lo < chunk ? n - lo : chunk;
            pxt_cpu_cast(0, dst + lo, PXT_FLOAT32, s + lo, dt, len);
        }
        return;
    }
#pragma omp parallel for schedule(static) if ((size_t)rows * cols >= PXT_OMP_MIN_WORK)
    for (int i = 0; i < rows; i++) {
        pxt_cpu_cast(0, dst + (size_t)i * cols, PXT_FLOAT32, s + (size_t)i * ld, dt, (size_t)cols);
    }
}

/* The leading dimensions of a product: each at least its stored width. */
static int check_ld(int trans_a, int trans_b, int M, int N, int K, int lda, int ldb, int ldc) {
    int wa = trans_a ? M : K, wb = trans_b ? K : N;
    if (lda < wa || ldb < wb || ldc < N) {
        return pxt_error(PXT_ERR_VALUE,
                         "gemm: leading dimensions lda=%d ldb=%d ldc=%d below the widths %d %d %d",
                         lda, ldb, ldc, wa, wb, N);
    }
    return PXT_OK;
}

int pxt_cpu_gemm(int index, int trans_a, int trans_b, int M, int N, int K, float alpha,
                 const void *A, const void *B, float beta, void *C, pxt_dtype dt_ab, pxt_dtype dt_c,
                 void *workspace) {
    return pxt_cpu_gemm_ld(index, trans_a, trans_b, M, N, K, alpha, A, trans_a ? M : K, B,
                           trans_b ? K : N, beta, C, N, dt_ab, dt_c, workspace);
}

int pxt_cpu_gemm_ld(int index, int trans_a, int trans_b, int M, int N, int K, float alpha,
                    const void *A, int lda, const void *B, int ldb, float beta, void *C, int ldc,
                    pxt_dtype dt_ab, pxt_dtype dt_c, void *workspace) {
    (void)index;
    int rc = pxt_cpu_check_float(dt_ab, "gemm (A, B)");
    if (rc == PXT_OK) {
        rc = pxt_cpu_check_float(dt_c, "gemm (C)");
    }
    if (rc != PXT_OK) {
        return rc;
    }
    if (M < 0 || N < 0 || K < 0) {
        return pxt_error(PXT_ERR_VALUE, "gemm: negative size M=%d N=%d K=%d", M, N, K);
    }
    PXT_TRY(check_ld(trans_a, trans_b, M, N, K, lda, ldb, ldc));
    if (M == 0 || N == 0) {
        return PXT_OK;
    }
    if (K == 0) { /* no products: C = beta * C (beta = 0 ignores what C held) */
        for (int i = 0; i < M; i++) {
            for (int j = 0; j < N; j++) {
                size_t e = (size_t)i * ldc + j;
                pxt_st(C, e, dt_c, beta == 0.0f ? 0.0f : beta * pxt_ld(C, e, dt_c));
            }
        }
        return PXT_OK;
    }
    const float *a = A; /* op(A) (M, K): stored (M, K), or (K, M) with trans_a; rows lda apart */
    const float *b = B; /* op(B) (K, N): stored (K, N), or (N, K) with trans_b; rows ldb apart */
    if (dt_ab != PXT_FLOAT32) {
        if (!workspace) {
            return pxt_error(PXT_ERR_VALUE, "gemm: 16-bit operands need a workspace of "
                                            "gemm_workspace() bytes, got NULL");
        }
        /* dense float32 copies: the same numbers, so the same bits as dense operands */
        float *a32 = workspace;           /* (M*K) */
        float *b32 = a32 + (size_t)M * K; /* (K*N) */
        widen(a32, A, trans_a ? K : M, trans_a ? M : K, lda, dt_ab);
        widen(b32, B, trans_b ? N : K, trans_b ? K : N, ldb, dt_ab);
        a = a32;
        b = b32;
        lda = trans_a ? M : K;
        ldb = trans_b ? K : N;
    }
    enum CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans;
    enum CBLAS_TRANSPOSE tb = trans_b ? CblasTrans : CblasNoTrans;
    if (dt_c == PXT_FLOAT32) {
        /* BLAS semantics: beta = 0 never reads C, so garbage (even NaN) is fine */
        sgemm_tiles(ta, tb, M, N, K, alpha, a, lda, b, ldb, beta, C, ldc);
        return PXT_OK;
    }
    /* 16-bit C: float32 tiles (mb, nb), each rounded once into C; tiles of rows
     * go to threads, each with its own staging tile on its stack */
    int nb = N < GEMM_TILE_N ? N : GEMM_TILE_N;
    int mb = GEMM_TILE / nb;
    int mtiles = (M + mb - 1) / mb;
#pragma omp parallel for schedule(static) if (mtiles > 1 && !omp_in_parallel())
    for (int t = 0; t < mtiles; t++) {
        float tile[GEMM_TILE]; /* (mb, nb) */
        int i0 = t * mb;
        int mi = M - i0 < mb ? M - i0 : mb;
        /* rows i0.. of op(A): rows of A, or columns of the stored (K, M) */
        const float *ap = trans_a ? a + i0 : a + (size_t)i0 * lda;
        for (int j0 = 0; j0 < N; j0 += nb) {
            int nj = N - j0 < nb ? N - j0 : nb;
            /* columns j0.. of op(B): columns of B, or rows of the stored (N, K) */
            const float *bp = trans_b ? b + (size_t)j0 * ldb : b + j0;
            if (beta != 0.0f) { /* beta = 0: C is not read (it may hold NaN) */
                for (int i = 0; i < mi; i++) {
                    for (int j = 0; j < nj; j++) {
                        tile[i * nj + j] = pxt_ld(C, (size_t)(i0 + i) * ldc + j0 + j, dt_c);
                    }
                }
            }
            scipy_cblas_sgemm(CblasRowMajor, ta, tb, mi, nj, K, alpha, ap, lda, bp, ldb, beta, tile,
                              nj);
            for (int i = 0; i < mi; i++) {
                for (int j = 0; j < nj; j++) {
                    pxt_st(C, (size_t)(i0 + i) * ldc + j0 + j, dt_c, tile[i * nj + j]);
                }
            }
        }
    }
    return PXT_OK;
}

#undef GEMM_TILE
#undef GEMM_TILE_N
#undef TILE_ALIGN
#undef TILE_MIN_EDGE
#undef TILE_MIN_FLOPS
#undef TILE_MAX
