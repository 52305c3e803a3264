/* matmul.cu: gemm through cuBLAS and the bias add (csrc/cpu/matmul.c and
 * bias.c are the reference; the bias backward is in colsum.cu).
 *
 * Row-major to cuBLAS's column-major: a row-major (M, N) matrix is the
 * column-major (N, M) one with the same bytes, so C = op(A) op(B) is computed
 * as C^T = op(B)^T op(A)^T: cuBLAS gets B first, N and M swapped, and each
 * operand with the transpose flag the caller gave (the storage already is
 * the transpose cuBLAS wants).
 *
 * Precision: CUBLAS_COMPUTE_32F (fp32 accumulation, no TF32: exactness vs the
 * CPU matters more than speed for float32) and reduced-precision split-K
 * reductions disallowed, so a 16-bit C is the fp32 result rounded once, as on
 * the CPU. cuBLAS has no fp32 A/B with a 16-bit C (nor bf16 A/B with an fp16
 * C, or the reverse): those pairs are computed in fp32 panels in a staging
 * area of the workspace, then rounded into C.
 *
 * Workspace, [cuBLAS scratch (GEMM_CUBLAS_WS) | staging (GEMM_STAGE floats)]: fixed
 * sizes (sizes.c's pxt_cuda_gemm_workspace), so the memory plan counts one number and
 * cuBLAS never allocates behind the allocator's back (cublasSetWorkspace). */
#include "elem.cuh"

#define GEMM_CUBLAS_WS PXT_CUDA_GEMM_CUBLAS_WS /* bytes (sizes.h) */
#define GEMM_STAGE PXT_CUDA_GEMM_STAGE         /* floats of the fp32 -> 16-bit staging */

static int cuda_type(pxt_dtype dt, cudaDataType_t *out, const char *what) {
    switch (dt) {
    case PXT_FLOAT32: *out = CUDA_R_32F; return PXT_OK;
    case PXT_FLOAT16: *out = CUDA_R_16F; return PXT_OK;
    case PXT_BFLOAT16: *out = CUDA_R_16BF; return PXT_OK;
    default:
        return pxt_error(PXT_ERR_TYPE, "%s: dtype must be float32, float16 or bfloat16, got %s",
                         what, pxt_dtype_name(dt));
    }
}

/* ---- small kernels --------------------------------------------------------------- */

/* C (M, N), rows ldc apart, = beta * C, or 0 where beta = 0 (C is not read then:
 * it may hold NaN) */
template <typename T> __global__ static void scale_kernel(T *c, float beta, int M, int N, int ldc) {
    size_t n = (size_t)M * N, stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        T *e = c + (i / N) * ldc + i % N;
        *e = stf<T>(beta == 0.0f ? 0.0f : beta * ldf(*e));
    }
}

/* tile (rows, cols) fp32 <-> C (rows, cols) of leading dim ldc, 16-bit */
template <typename T>
__global__ static void tile_load_kernel(float *tile, const T *c, int rows, int cols, int ldc) {
    size_t n = (size_t)rows * cols, stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        tile[i] = ldf(c[(i / cols) * ldc + i % cols]);
    }
}

template <typename T>
__global__ static void tile_store_kernel(T *c, const float *tile, int rows, int cols, int ldc) {
    size_t n = (size_t)rows * cols, stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        c[(i / cols) * ldc + i % cols] = stf<T>(tile[i]);
    }
}

/* ---- gemm -------------------------------------------------------------------------- */

/* One row-major product, rows lda, ldb and ldc apart (see the top comment). */
static int gemm_ex(cublasHandle_t h, int trans_a, int trans_b, int M, int N, int K, float alpha,
                   const void *A, int lda, cudaDataType_t ta, const void *B, int ldb, float beta,
                   void *C, cudaDataType_t tc, int ldc) {
    PXT_CUBLAS_CHECK(cublasGemmEx(h, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                  trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, B, ta, ldb,
                                  A, ta, lda, &beta, C, tc, ldc, CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT));
    return PXT_OK;
}

/* Pairs cuBLAS lacks (float32 A, B into a 16-bit C; bf16 A, B into an fp16 C
 * and back): panels of C (mb rows, nb columns) are computed in fp32 in the
 * staging area (beta * C loaded there first), then rounded once into C. */
template <typename T>
static int gemm_staged(cublasHandle_t h, cudaStream_t stream, int trans_a, int trans_b, int M,
                       int N, int K, float alpha, const char *A, int lda, const char *B, int ldb,
                       cudaDataType_t tab, size_t esz, float beta, T *C, int ldc, float *stage) {
    int nb = (size_t)N < GEMM_STAGE ? N : (int)GEMM_STAGE;
    int mb = (int)(GEMM_STAGE / (size_t)nb);
    for (int i0 = 0; i0 < M; i0 += mb) {
        int mi = M - i0 < mb ? M - i0 : mb;
        /* rows i0.. of op(A): rows of A (M, K), or columns of the stored (K, M) */
        const char *ap = A + (trans_a ? (size_t)i0 : (size_t)i0 * lda) * esz;
        for (int j0 = 0; j0 < N; j0 += nb) {
            int nj = N - j0 < nb ? N - j0 : nb;
            /* columns j0.. of op(B): columns of B (K, N), or rows of the stored (N, K) */
            const char *bp = B + (trans_b ? (size_t)j0 * ldb : (size_t)j0) * esz;
            T *cp = C + (size_t)i0 * ldc + j0;
            unsigned int grid = pxt_ew_grid((size_t)mi * nj);
            if (beta != 0.0f) {
                tile_load_kernel<T><<<grid, PXT_EW_BLOCK, 0, stream>>>(stage, cp, mi, nj, ldc);
                PXT_CUDA_CHECK_LAUNCH("gemm (staging load)");
            }
            PXT_CUBLAS_CHECK(cublasGemmEx(h, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                          trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, nj, mi, K, &alpha,
                                          bp, tab, ldb, ap, tab, lda, &beta, stage, CUDA_R_32F, nj,
                                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
            tile_store_kernel<T><<<grid, PXT_EW_BLOCK, 0, stream>>>(cp, stage, mi, nj, ldc);
            PXT_CUDA_CHECK_LAUNCH("gemm (staging store)");
        }
    }
    return PXT_OK;
}

int pxt_cuda_gemm(int index, int trans_a, int trans_b, int M, int N, int K, float alpha,
                  const void *A, const void *B, float beta, void *C, pxt_dtype dt_ab,
                  pxt_dtype dt_c, void *workspace) {
    return pxt_cuda_gemm_ld(index, trans_a, trans_b, M, N, K, alpha, A, trans_a ? M : K, B,
                            trans_b ? K : N, beta, C, N, dt_ab, dt_c, workspace);
}

int pxt_cuda_gemm_ld(int index, int trans_a, int trans_b, int M, int N, int K, float alpha,
                     const void *A, int lda, const void *B, int ldb, float beta, void *C, int ldc,
                     pxt_dtype dt_ab, pxt_dtype dt_c, void *workspace) {
    cudaDataType_t tab = CUDA_R_32F, tc = CUDA_R_32F;
    PXT_TRY(cuda_type(dt_ab, &tab, "gemm (A, B)"));
    PXT_TRY(cuda_type(dt_c, &tc, "gemm (C)"));
    if (M < 0 || N < 0 || K < 0) {
        return pxt_error(PXT_ERR_VALUE, "gemm: negative size M=%d N=%d K=%d", M, N, K);
    }
    if (lda < (trans_a ? M : K) || ldb < (trans_b ? K : N) || ldc < N) {
        return pxt_error(PXT_ERR_VALUE,
                         "gemm: leading dimensions lda=%d ldb=%d ldc=%d below the widths %d %d %d",
                         lda, ldb, ldc, trans_a ? M : K, trans_b ? K : N, N);
    }
    if (M == 0 || N == 0) {
        return PXT_OK;
    }
    if (!workspace) {
        return pxt_error(PXT_ERR_VALUE, "gemm: no workspace (gemm_workspace() bytes), got NULL");
    }
    PXT_CUDA_ENTER(index);
    if (dt_ab == PXT_BFLOAT16) {
        PXT_TRY(pxt_cuda_bf16_check(index, "gemm"));
    }
    cudaStream_t stream = pxt_cuda_stream(index);
    if (K == 0) { /* no products: C = beta * C, as the CPU (cuBLAS leaves k = 0 to us) */
        size_t n = (size_t)M * N;
        PXT_TRY(pxt_cuda_dispatch(dt_c, "gemm (C)", [&](auto tag) {
            using T = decltype(tag);
            scale_kernel<T><<<pxt_ew_grid(n), PXT_EW_BLOCK, 0, stream>>>((T *)C, beta, M, N, ldc);
        }));
        PXT_CUDA_CHECK_LAUNCH("gemm (k = 0)");
        return PXT_OK;
    }
    pxt_cuda_blas blas(index); /* the handle, ours until the product is queued */
    cublasHandle_t h = blas.h;
    /* per call, not per handle: the workspace is the caller's, and the math mode
     * must hold even if something else shares the handle */
    /* the stream first (setting it resets the workspace): this thread's, which
     * is a capture stream while it records a graph */
    PXT_CUBLAS_CHECK(cublasSetStream(h, stream));
    PXT_CUBLAS_CHECK(cublasSetWorkspace(h, workspace, GEMM_CUBLAS_WS));
    PXT_CUBLAS_CHECK(cublasSetMathMode(
        h, (cublasMath_t)(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
    if (dt_c != PXT_FLOAT32 && dt_c != dt_ab) { /* a pair cuBLAS has no kernel for */
        float *stage = (float *)((char *)workspace + GEMM_CUBLAS_WS); /* (GEMM_STAGE) */
        size_t esz = pxt_dtype_size(dt_ab);
        if (dt_c == PXT_FLOAT16) {
            return gemm_staged(h, stream, trans_a, trans_b, M, N, K, alpha, (const char *)A, lda,
                               (const char *)B, ldb, tab, esz, beta, (pxt_f16 *)C, ldc, stage);
        }
        return gemm_staged(h, stream, trans_a, trans_b, M, N, K, alpha, (const char *)A, lda,
                           (const char *)B, ldb, tab, esz, beta, (pxt_bf16 *)C, ldc, stage);
    }
    return gemm_ex(h, trans_a, trans_b, M, N, K, alpha, A, lda, tab, B, ldb, beta, C, tc, ldc);
}

/* ---- bias ---------------------------------------------------------------------------- */

/* out (M, N) += bias (N), elementwise */
template <typename T> __global__ static void add_bias_kernel(T *out, const T *bias, int M, int N) {
    size_t n = (size_t)M * N, stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        out[i] = stf<T>(ldf(out[i]) + ldf(bias[i % N]));
    }
}

int pxt_cuda_add_bias(int index, void *out, const void *bias, int M, int N, pxt_dtype dt) {
    if (M < 0 || N < 0) {
        return pxt_error(PXT_ERR_VALUE, "add_bias: negative size M=%d N=%d", M, N);
    }
    PXT_CUDA_ENTER(index);
    size_t n = (size_t)M * N;
    PXT_TRY(pxt_cuda_dispatch(dt, "add_bias", [&](auto tag) {
        using T = decltype(tag);
        if (n) {
            add_bias_kernel<T><<<pxt_ew_grid(n), PXT_EW_BLOCK, 0, pxt_cuda_stream(index)>>>(
                (T *)out, (const T *)bias, M, N);
        }
    }));
    PXT_CUDA_CHECK_LAUNCH("add_bias");
    return PXT_OK;
}

#undef GEMM_CUBLAS_WS
#undef GEMM_STAGE
