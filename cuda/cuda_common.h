/* cuda_common.h: what the CUDA backend's files share: error checks, the
 * stream every call queues on, the cuBLAS handle, the kernels' entry points.
 * Internal to cuda/: code above backend.h never includes it. */
#ifndef PXT_CUDA_COMMON_H
#define PXT_CUDA_COMMON_H

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "engine/backend.h"

/* Turns a failed CUDA call into `return pxt_error(PXT_ERR_DEVICE, ...)`.
 * The failed call also set the runtime's last error; clear it so a later
 * cudaGetLastError() after a kernel launch does not report it again. */
#define PXT_CUDA_CHECK(call)                                                                       \
    do {                                                                                           \
        cudaError_t err_ = (call);                                                                 \
        if (err_ != cudaSuccess) {                                                                 \
            (void)cudaGetLastError();                                                              \
            return pxt_error(PXT_ERR_DEVICE, "%s failed: %s", #call, cudaGetErrorString(err_));    \
        }                                                                                          \
    } while (0)

#define PXT_CUBLAS_CHECK(call)                                                                     \
    do {                                                                                           \
        cublasStatus_t st_ = (call);                                                               \
        if (st_ != CUBLAS_STATUS_SUCCESS)                                                          \
            return pxt_error(PXT_ERR_DEVICE, "%s failed: %s (%s)", #call,                          \
                             cublasGetStatusName(st_), cublasGetStatusString(st_));                \
    } while (0)

/* After a kernel launch: a bad configuration (grid, shared memory) or an
 * earlier asynchronous fault surfaces here as PXT_ERR_DEVICE naming `what`. */
#define PXT_CUDA_CHECK_LAUNCH(what)                                                                \
    do {                                                                                           \
        cudaError_t err_ = cudaGetLastError();                                                     \
        if (err_ != cudaSuccess)                                                                   \
            return pxt_error(PXT_ERR_DEVICE, "%s: kernel launch failed: %s", what,                 \
                             cudaGetErrorString(err_));                                            \
    } while (0)

/* The stream all work on device `index` is queued on. The legacy default
 * stream for now: it orders everything, so no event bookkeeping is needed.
 * Per-device streams later change only this function. */
static inline cudaStream_t pxt_cuda_stream(int index) {
    (void)index;
    return (cudaStream_t)0;
}

#ifdef __cplusplus
extern "C" {
#endif

/* The device's cuBLAS handle, created on first use, bound to pxt_cuda_stream. */
int pxt_cuda_cublas(int index, cublasHandle_t *out);

/* cast.cu: the backend's `cast` entry (see backend.h). */
int pxt_cuda_cast(int index, void *dst, pxt_dtype dt, const void *src, pxt_dtype st, size_t n);

/* Kernels of the backend table (semantics in backend.h, reference in csrc/cpu/). */
/* matmul.cu */
int pxt_cuda_gemm(int index, int trans_a, int trans_b, int M, int N, int K, float alpha,
                  const void *A, const void *B, float beta, void *C, pxt_dtype dt_ab,
                  pxt_dtype dt_c, void *workspace);
size_t pxt_cuda_gemm_workspace(int M, int N, int K, pxt_dtype dt_ab);
int pxt_cuda_add_bias(int index, void *out, const void *bias, int M, int N, pxt_dtype dt);
int pxt_cuda_bias_backward(int index, float *dbias, const void *dout, int M, int N, pxt_dtype dt);
/* layernorm.cu */
int pxt_cuda_layernorm_forward(int index, void *out, float *mean, float *rstd, const void *inp,
                               const void *weight, const void *bias, int N, int C, float eps,
                               pxt_dtype dt);
int pxt_cuda_layernorm_backward(int index, void *dinp, float *dweight, float *dbias,
                                const void *dout, const void *inp, const void *weight,
                                const float *mean, const float *rstd, int N, int C, pxt_dtype dt);
/* gelu.cu */
int pxt_cuda_gelu_forward(int index, void *out, const void *inp, size_t n, pxt_dtype dt);
int pxt_cuda_gelu_backward(int index, void *dinp, const void *inp, const void *dout, size_t n,
                           pxt_dtype dt);
/* elementwise.cu */
int pxt_cuda_add(int index, void *out, const void *a, const void *b, size_t n, pxt_dtype dt);
/* embedding.cu */
int pxt_cuda_embedding_forward(int index, void *out, const int32_t *ids, const void *table, int N,
                               int C, int accumulate, pxt_dtype dt);
int pxt_cuda_embedding_backward(int index, float *dtable, const void *dout, const int32_t *ids,
                                int N, int C, pxt_dtype dt);
/* xent.cu */
int pxt_cuda_softmax_xent(int index, float *logits, float *losses, const int32_t *targets, int N,
                          int V, float scale, int backward);
int pxt_cuda_sum(int index, double *out, const float *x, size_t n);
/* attention.cu */
int pxt_cuda_attention_forward(int index, const struct pxt_attn_args *args, void *out, float *lse,
                               const void *q, const void *k, const void *v, void *workspace);
int pxt_cuda_attention_backward(int index, const struct pxt_attn_args *args, void *dq, void *dk,
                                void *dv, const void *dout, const void *q, const void *k,
                                const void *v, const void *out, const float *lse, void *workspace);
size_t pxt_cuda_attention_workspace(const struct pxt_attn_args *args, int backward);
/* attention_tc.cu: the tensor-core path for 16-bit inputs. select sets *use_tc
 * (1: take it) from the arguments, the device, the alignment of ptrs (nptrs)
 * and PYXTTS_CUDA_ATTENTION; it fails when that says "tc" and the path cannot
 * run. The device must be current. Di is rowsum(dO * O) (B, H, Tq). */
int pxt_cuda_attention_tc_select(int index, const struct pxt_attn_args *args,
                                 const void *const *ptrs, int nptrs, int *use_tc);
int pxt_cuda_attention_tc_forward(int index, const struct pxt_attn_args *args, void *out,
                                  float *lse, const void *q, const void *k, const void *v);
int pxt_cuda_attention_tc_backward(int index, const struct pxt_attn_args *args, void *dq, void *dk,
                                   void *dv, const void *dout, const void *q, const void *k,
                                   const void *v, const float *lse, const float *Di);
/* The path of the last attention call: 1 tensor cores, 0 the fallback, -1 none
 * yet (for benchmarks and debuggers; no Python binding). */
int pxt_cuda_attention_last_path(void);
/* optim.cu */
int pxt_cuda_grad_sumsq(int index, double *sumsq, int *nonfinite, const float *g, size_t n,
                        void *workspace);
int pxt_cuda_adamw(int index, const struct pxt_adamw_args *args, float *master, float *m, float *v,
                   float *ema, void *params, const float *grads);
int pxt_cuda_swap(int index, void *a, void *b, size_t n, pxt_dtype dt);

#ifdef __cplusplus
}
#endif
#endif /* PXT_CUDA_COMMON_H */
