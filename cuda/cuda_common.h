/* cuda_common.h: what the CUDA backend's files share: error checks, the
 * device scope every entry opens, the device's stream and library handles,
 * the kernels' entry points. Internal to cuda/: code above backend.h never
 * includes it.
 *
 * Devices and streams. Every entry of the table starts with PXT_CUDA_ENTER:
 * it makes the entry's device current, readies the device's state once (its
 * stream, cuBLAS and cuBLASLt handles, pinned staging) and gives the caller's
 * current device back when the entry returns, so pyxtts never moves torch's
 * (or anyone's) current device. All work on a device is queued on its one
 * non-default stream, in order; nothing inside a step waits for it except the
 * copies into host memory (D2H) and `synchronize`. The stream is created
 * blocking (not cudaStreamNonBlocking): it stays ordered with the legacy
 * default stream, where torch and DLPack producers queue their work unless
 * told otherwise. */
#ifndef PXT_CUDA_COMMON_H
#define PXT_CUDA_COMMON_H

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "engine/backend.h"
#include "sizes.h" /* the workspace sizes, in every build */

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

/* After a kernel launch: a bad configuration (grid, shared memory), a device
 * this build has no code for, or an earlier asynchronous fault surfaces here as
 * PXT_ERR_DEVICE naming `what` (pxt_cuda_launch_error). */
#define PXT_CUDA_CHECK_LAUNCH(what)                                                                \
    do {                                                                                           \
        cudaError_t err_ = cudaGetLastError();                                                     \
        if (err_ != cudaSuccess)                                                                   \
            return pxt_cuda_launch_error(what, err_);                                              \
    } while (0)

/* Per-device state, made once by pxt_cuda_device_ready (backend_cuda.cu). */
extern cudaStream_t pxt_cuda_streams[PXT_MAX_DEVICES];

/* The stream this thread records a graph on, per device (graph.cu), or NULL. */
extern thread_local cudaStream_t pxt_cuda_capture[PXT_MAX_DEVICES];

/* The stream all work on device `index` is queued on: valid inside a
 * PXT_CUDA_ENTER scope of that device. While this thread records a graph
 * (graph_begin .. graph_end), its capture stream: the work is recorded. */
static inline cudaStream_t pxt_cuda_stream(int index) {
    cudaStream_t c = pxt_cuda_capture[index];
    return c ? c : pxt_cuda_streams[index];
}

#ifdef __cplusplus
extern "C" {
#endif
/* Makes device index's stream, handles and staging once; PXT_OK or why not. */
int pxt_cuda_device_ready(int index);
#ifdef __cplusplus
}

/* The scope of one backend entry: device `index` current and ready while it
 * lives, the caller's current device restored when it ends. */
struct pxt_cuda_scope {
    int prev, index, rc;
    explicit pxt_cuda_scope(int i) : prev(-1), index(i), rc(PXT_OK) {
        if (i < 0 || i >= PXT_MAX_DEVICES) {
            rc = pxt_error(PXT_ERR_VALUE, "cuda:%d: device index out of range", i);
            return;
        }
        if (cudaGetDevice(&prev) != cudaSuccess) { /* no context yet: nothing to restore */
            (void)cudaGetLastError();
            prev = -1;
        }
        if (prev != i) {
            cudaError_t err = cudaSetDevice(i);
            if (err != cudaSuccess) {
                (void)cudaGetLastError();
                rc = pxt_error(PXT_ERR_DEVICE, "cudaSetDevice(%d) failed: %s", i,
                               cudaGetErrorString(err));
                return;
            }
        }
        rc = pxt_cuda_device_ready(i);
    }
    ~pxt_cuda_scope() {
        if (prev >= 0 && prev != index && cudaSetDevice(prev) != cudaSuccess) {
            (void)cudaGetLastError(); /* a destructor has no one to report to */
        }
    }
    pxt_cuda_scope(const pxt_cuda_scope &) = delete;
    pxt_cuda_scope &operator=(const pxt_cuda_scope &) = delete;
};

/* Opens the entry's device scope; returns its error from the enclosing function. */
#define PXT_CUDA_ENTER(index)                                                                      \
    pxt_cuda_scope pxt_scope_(index);                                                              \
    if (pxt_scope_.rc != PXT_OK)                                                                   \
    return pxt_scope_.rc

/* The device's cuBLAS handle, held under the device's lock while the guard
 * lives: cublasSetWorkspace and the math mode are the handle's state, so a
 * product sets them and queues its call without another thread in between. */
struct pxt_cuda_blas {
    int index;
    cublasHandle_t h;
    explicit pxt_cuda_blas(int i);
    ~pxt_cuda_blas();
    pxt_cuda_blas(const pxt_cuda_blas &) = delete;
    pxt_cuda_blas &operator=(const pxt_cuda_blas &) = delete;
};
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* The device's cuBLASLt handle (thread-safe; made by pxt_cuda_device_ready). */
cublasLtHandle_t pxt_cuda_lt(int index);
/* PXT_OK where device index (ready) has bfloat16 arithmetic (sm_80+); else
 * PXT_ERR_NOT_IMPLEMENTED naming `what`, the device's capability and float16. */
int pxt_cuda_bf16_check(int index, const char *what);
/* The error of a failed launch of `what` (err from cudaGetLastError); where the
 * current device has no code in this build, how to build for it. */
int pxt_cuda_launch_error(const char *what, cudaError_t err);
/* Copies n bytes from host memory to the device on its stream, through pinned
 * staging: returns once src may be reused, without waiting for the device. */
int pxt_cuda_h2d(int index, void *dst, const void *src, size_t n);

/* cast.cu: the backend's `cast` entry (see backend.h). */
int pxt_cuda_cast(int index, void *dst, pxt_dtype dt, const void *src, pxt_dtype st, size_t n);

/* Kernels of the backend table (semantics in backend.h, reference in csrc/cpu/). */
/* graph.cu: the graph_* entries (see backend.h) */
int pxt_cuda_graph_begin(int index);
int pxt_cuda_graph_end(int index, void **graph);
void pxt_cuda_graph_abort(int index);
int pxt_cuda_graph_launch(int index, void *graph);
void pxt_cuda_graph_free(int index, void *graph);
/* matmul.cu */
int pxt_cuda_gemm(int index, int trans_a, int trans_b, int M, int N, int K, float alpha,
                  const void *A, const void *B, float beta, void *C, pxt_dtype dt_ab,
                  pxt_dtype dt_c, void *workspace);
int pxt_cuda_gemm_ld(int index, int trans_a, int trans_b, int M, int N, int K, float alpha,
                     const void *A, int lda, const void *B, int ldb, float beta, void *C, int ldc,
                     pxt_dtype dt_ab, pxt_dtype dt_c, void *workspace);
int pxt_cuda_add_bias(int index, void *out, const void *bias, int M, int N, pxt_dtype dt);
/* gemm_fused.cu */
int pxt_cuda_gemm_fused(int index, const struct pxt_gemm_args *g, void *workspace);
/* The path of the last gemm_fused call: 1 cuBLASLt's epilogue, 0 the unfused
 * composition, -1 none yet (for tests and benchmarks). */
int pxt_cuda_gemm_fused_last_path(void);
/* colsum.cu: the two-stage column sums */
/* d (M, N) = gelu'(pre) * d and dbias (N) += its column sums, in one pass over the
 * rows: the bits of gelu_backward then bias_backward. workspace: colsum_workspace(M, N). */
int pxt_cuda_dgelu_bgrad(int index, void *d, const void *pre, float *dbias, int M, int N,
                         pxt_dtype dt, void *workspace);
int pxt_cuda_bias_backward(int index, float *dbias, const void *dout, int M, int N, int ld,
                           pxt_dtype dt, void *workspace);
/* dweight (C) += sum_i n * dout, dbias (C) += sum_i dout, n = (inp - mean) * rstd */
int pxt_cuda_layernorm_dparams(int index, float *dweight, float *dbias, const void *dout,
                               const void *inp, const float *mean, const float *rstd, int N, int C,
                               pxt_dtype dt, void *workspace);
/* dweight (C) += sum n * dout, dbias (C) += sum dout over the B x S rows of
 * GroupNorm's (B, S, C); n from the (sample, group)'s mean and rstd (B, G) */
int pxt_cuda_groupnorm_dparams(int index, float *dweight, float *dbias, const void *dout,
                               const void *inp, const float *mean, const float *rstd, int B, int S,
                               int C, int G, pxt_dtype dt, void *workspace);
/* dgamma (C) += sum_i dout * inp / max(norm, eps) * scale */
int pxt_cuda_rmsnorm_dgamma(int index, float *dgamma, const void *dout, const void *inp,
                            const float *norm, int N, int C, float scale, float eps, pxt_dtype dt,
                            void *workspace);
/* layernorm.cu */
int pxt_cuda_layernorm_forward(int index, void *out, float *mean, float *rstd, const void *inp,
                               const void *weight, const void *bias, int N, int C, float eps,
                               pxt_dtype dt);
int pxt_cuda_layernorm_backward(int index, void *dinp, float *dweight, float *dbias,
                                const void *dout, const void *inp, const void *weight,
                                const float *mean, const float *rstd, int N, int C, pxt_dtype dt,
                                void *workspace);
/* gelu.cu */
int pxt_cuda_gelu_forward(int index, void *out, const void *inp, size_t n, pxt_dtype dt);
int pxt_cuda_gelu_backward(int index, void *dinp, const void *inp, const void *dout, size_t n,
                           pxt_dtype dt);
/* dropout.cu */
int pxt_cuda_dropout_forward(int index, void *x, const void *resid, int N, int C,
                             const pxt_dropout *d, pxt_dtype dt);
int pxt_cuda_dropout_backward(int index, void *dx, const void *dy, int N, int C,
                              const pxt_dropout *d, pxt_dtype dt);
/* groupnorm.cu, rmsnorm.cu, geglu.cu: the conditioning path's ops */
int pxt_cuda_groupnorm_forward(int index, void *out, float *mean, float *rstd, const void *inp,
                               const void *weight, const void *bias, int B, int S, int C, int G,
                               float eps, pxt_dtype dt);
int pxt_cuda_groupnorm_backward(int index, void *dinp, float *dweight, float *dbias,
                                const void *dout, const void *inp, const void *weight,
                                const float *mean, const float *rstd, int B, int S, int C, int G,
                                pxt_dtype dt, void *workspace);
int pxt_cuda_rmsnorm_forward(int index, void *out, float *norm, const void *inp, const void *gamma,
                             int N, int C, float scale, float eps, pxt_dtype dt);
int pxt_cuda_rmsnorm_backward(int index, void *dinp, float *dgamma, const void *dout,
                              const void *inp, const void *gamma, const float *norm, int N, int C,
                              float scale, float eps, pxt_dtype dt, void *workspace);
int pxt_cuda_geglu_forward(int index, void *out, const void *inp, int N, int F, pxt_dtype dt);
int pxt_cuda_geglu_backward(int index, void *dinp, const void *inp, const void *dout, int N, int F,
                            pxt_dtype dt);
/* elementwise.cu */
int pxt_cuda_add(int index, void *out, const void *a, const void *b, size_t n, pxt_dtype dt);
/* embedding.cu */
int pxt_cuda_embedding_forward(int index, void *out, const int32_t *ids, const void *table, int N,
                               int C, int accumulate, pxt_dtype dt);
int pxt_cuda_embedding_backward(int index, float *dtable, const void *dout, const int32_t *ids,
                                int N, int C, int V, pxt_dtype dt, void *workspace);
/* xent.cu */
int pxt_cuda_softmax_xent(int index, float *logits, int ld, const float *bias, float *losses,
                          const int32_t *targets, int N, int V, float scale, int backward);
int pxt_cuda_sum(int index, double *out, const float *x, size_t n);
/* attention.cu */
int pxt_cuda_attention_forward(int index, const struct pxt_attn_args *args, void *out, float *lse,
                               const void *q, const void *k, const void *v, void *workspace);
int pxt_cuda_attention_backward(int index, const struct pxt_attn_args *args, void *dq, void *dk,
                                void *dv, const void *dout, const void *q, const void *k,
                                const void *v, const void *out, const float *lse, void *workspace);
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
                                   const void *v, const float *lse, const float *Di, void *extra);
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
