/* sizes.h: what the memory plan asks of the CUDA backend, in plain C: the bytes of
 * workspace each op needs, and the attention switches those depend on. sizes.c is
 * compiled into every build, the CPU-only one included, so that a machine without
 * the CUDA toolkit or a GPU plans a step for a card (`pyxtts memtest --device cuda
 * --memory 8GiB`) from the very functions the CUDA backend sizes its calls with.
 * Included from C (sizes.c) and from the CUDA sources. */
#ifndef PXT_CUDA_SIZES_H
#define PXT_CUDA_SIZES_H

#include <stddef.h>
#include <stdint.h>

#include "engine/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* gemm's workspace: cuBLAS's scratch (what it asks for on Hopper), then the fp32
 * staging of the pairs cuBLAS has no kernel for (matmul.cu) */
#define PXT_CUDA_GEMM_CUBLAS_WS ((size_t)32 << 20) /* bytes */
#define PXT_CUDA_GEMM_STAGE ((size_t)1 << 20)      /* floats (4 MiB) */
/* gemm_fused's cuBLASLt scratch: the head of its gemm workspace (gemm_fused.cu) */
#define PXT_CUDA_LT_WS ((size_t)32 << 20)

/* The workspace entries of the CUDA backend's table (semantics in backend.h). */
size_t pxt_cuda_gemm_workspace(int M, int N, int K, pxt_dtype dt_ab);
size_t pxt_cuda_gemm_fused_workspace(const struct pxt_gemm_args *g);
size_t pxt_cuda_colsum_workspace(int rows, int cols);
size_t pxt_cuda_embedding_workspace(int N, int C, int V);
size_t pxt_cuda_attention_workspace(const struct pxt_attn_args *a, int backward);

/* Di (B, H, Tq) fp32 at the start of attention's backward workspace, 256-byte aligned */
static inline size_t pxt_cuda_attention_di_bytes(const struct pxt_attn_args *a) {
    return ((size_t)a->B * a->H * a->Tq * sizeof(float) + 255) / 256 * 256;
}

/* PYXTTS_CUDA_ATTENTION (auto | simple | tc) and PYXTTS_CUDA_ATTENTION_BWD (two-kernel
 * | one-pass), each read once per process: the kernels' choice and the plan's agree. */
enum { PXT_TC_MODE_BAD = -1, PXT_TC_MODE_AUTO = 0, PXT_TC_MODE_SIMPLE = 1, PXT_TC_MODE_TC = 2 };
enum { PXT_TC_BWD_BAD = -1, PXT_TC_BWD_TWO = 0, PXT_TC_BWD_ONE = 1 };
int pxt_cuda_attention_mode(void);
int pxt_cuda_attention_bwd_mode(void);

/* The one-pass backward's warps (16 keys each): 8 (128 keys, FlashAttention-2's block
 * for D = 64: half the dQ partials' traffic per product of 64 keys) for D = 64; 4 for
 * D = 128, whose 128 keys would not fit the 99 KiB of sm_86/89. */
#define PXT_TC_BWD1_WARPS(D) ((D) <= 64 ? 8 : 4)

/* The one-pass backward's splits: about one wave of CTAs (B H S) on a 132-SM card (an
 * SM holds one CTA at D = 64, 8 warps of 255 registers; two at D = 128), rounded to the
 * nearest, at least 1 and at most one per key block: more splits only add partials to
 * reduce. A function of the arguments alone, so that a plan made on any machine sizes the
 * workspace the call will use. */
#define TC_SPLIT_SMS 132
static inline int pxt_tc_splits(const struct pxt_attn_args *a) {
    const int bk = 16 * PXT_TC_BWD1_WARPS(a->D);
    const int64_t nkb = ((int64_t)a->Tk + bk - 1) / bk, bh = (int64_t)a->B * a->H;
    if (nkb <= 0 || bh <= 0) {
        return 0;
    }
    const int64_t ctas = (int64_t)TC_SPLIT_SMS * (a->D <= 64 ? 1 : 2);
    int64_t s = (ctas + bh / 2) / bh;
    s = s < 1 ? 1 : s;
    return (int)(s < nkb ? s : nkb);
}
/* bytes of its fp32 dQ partials (S, B, H, Tq, D); SIZE_MAX if that overflows */
static inline size_t pxt_tc_split_bytes(const struct pxt_attn_args *a) {
    size_t n = (size_t)pxt_tc_splits(a);
    const size_t f[] = {(size_t)a->B, (size_t)a->H, (size_t)a->Tq, (size_t)a->D, sizeof(float)};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        if (!pxt_mul_ok(n, f[i], &n)) {
            return SIZE_MAX;
        }
    }
    return n;
}

#ifdef __cplusplus
}
#endif

#endif
