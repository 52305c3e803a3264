/* backend.h: the table of function pointers every backend fills.
 *
 * Code above this table (allocator, tensors, engine) never names a device API;
 * it asks pxt_backend_for(type) and calls through the table. The CPU backend is
 * the reference; the CUDA backend mirrors it entry for entry. Every entry
 * returns a PXT_* status and, on failure, has set the thread's error message.
 * Pointers passed in are device pointers of the backend's own device. */
#ifndef PXT_BACKEND_H
#define PXT_BACKEND_H

#include "dropout.h"
#include "pxt.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    PXT_COPY_H2D = 0, /* host -> device */
    PXT_COPY_D2H = 1, /* device -> host */
    PXT_COPY_D2D = 2, /* device -> same device */
} pxt_copy_kind;

typedef struct {
    char name[256];
    size_t total_memory; /* bytes: device memory, or physical RAM on the CPU */
    int major, minor;    /* compute capability (0, 0 on the CPU) */
    int multiprocessors; /* SMs, or online CPU cores */
} pxt_device_props;

/* Element strides of a (B, H, T, D) operand whose last dim is contiguous: the
 * model hands q, k, v as views into its (B, T, 3C) QKV buffer, no permute. */
typedef struct {
    int64_t b, h, t;
} pxt_strides;

typedef struct pxt_attn_args {
    int B, H, Tq, Tk, D;
    int causal;               /* query i sees keys j <= i (top-left, as torch) */
    float scale;              /* usually 1 / sqrt(D) */
    const int32_t *q_lengths; /* (B) on the device, or NULL: rows >= length are zeros */
    const int32_t *k_lengths; /* (B) or NULL: keys >= length are masked */
    const uint8_t *key_mask;  /* (B, Tk) or NULL: 0 masks the key */
    pxt_strides q, k, v, o;   /* layouts of q, k, v and out (dout shares o's) */
    pxt_dtype dt;
    /* dropout of the attention probabilities (drop.p = 0: none), only where the
     * backend's attention_dropout is 1: query i and key j of sample b are
     * positions pxt_dropout_pos(&drop, i) and (j) of sample drop.sample0 + b; the
     * log-sum-exp stays the undropped softmax's, the backward regenerates the
     * forward's mask (see dropout.h) */
    pxt_dropout drop;
} pxt_attn_args;

/* Fences of a device (backend fence_record / fence_wait). */
#define PXT_FENCES 4

/* Fixed number of parts of grad_sumsq's deterministic reduction. */
#define PXT_SUMSQ_PARTS 256

/* ---- deterministic reductions: the chunking every backend shares -------------
 * Column sums (bias_backward, layernorm's dweight and dbias, the conditioning
 * path's norms' weight gradients) run in two stages on every backend: the rows are
 * cut into chunks of pxt_colsum_chunk_rows(rows, cols) consecutive rows; stage
 * 1 sums each column of each chunk in double, rows in order, from 0.0; stage 2
 * adds a column's chunk sums in chunk order in double, from 0.0, and adds that
 * total to the fp32 output once. The chunks depend on the shape alone (never
 * on thread or SM counts), so every backend gives the same bits, while a GPU
 * runs chunks x columns partial sums in parallel. PXT_COLSUM_PARALLEL is about
 * how many partial sums a shape gets; chunks are at least PXT_COLSUM_MIN_ROWS
 * rows so that stage 2 stays short. */
#define PXT_COLSUM_PARALLEL (1 << 17)
#define PXT_COLSUM_MIN_ROWS 16

static inline int pxt_colsum_chunk_rows(int rows, int cols) {
    int64_t want = (int64_t)PXT_COLSUM_PARALLEL / (cols > 0 ? cols : 1); /* chunks */
    if (want < 1) {
        want = 1;
    }
    int64_t r = ((int64_t)rows + want - 1) / want;
    return (int)(r < PXT_COLSUM_MIN_ROWS ? PXT_COLSUM_MIN_ROWS : r);
}

static inline int pxt_colsum_chunks(int rows, int cols) {
    int r = pxt_colsum_chunk_rows(rows, cols);
    return (int)(((int64_t)rows + r - 1) / r);
}

/* embedding_backward's scatter, in two stages as well: ids are cut into chunks
 * of PXT_EMB_CHUNK consecutive rows; stage 1 adds, per chunk and per id present
 * in it, that id's rows of dout in order in double from 0.0; stage 2 adds, per
 * id, its chunk sums in chunk order in double from 0.0 (chunks without the id
 * add nothing) and adds the total to the table row once. A repeated id (a
 * padding token, a position of every sample) is thus summed in parallel pieces
 * of at most PXT_EMB_CHUNK rows, in the same order everywhere. */
#define PXT_EMB_CHUNK 64

/* embedding_backward's size and workspace checks, shared by the backends so
 * their refusals agree: PXT_OK with *empty = 1 when there is nothing to add. */
static inline int pxt_embedding_backward_check(int N, int C, int V, const void *workspace,
                                               int *empty) {
    *empty = 1;
    if (N < 0 || C < 0 || V < 0) {
        return pxt_error(PXT_ERR_VALUE, "embedding_backward: negative size N=%d C=%d V=%d", N, C,
                         V);
    }
    if (N == 0 || C == 0) {
        return PXT_OK;
    }
    if (!workspace) {
        return pxt_error(PXT_ERR_VALUE, "embedding_backward: no workspace "
                                        "(embedding_workspace() bytes), got NULL");
    }
    *empty = 0;
    return PXT_OK;
}

/* One tensor of the flat buffers: elements [offset, offset + numel). */
typedef struct pxt_adamw_segment {
    size_t offset, numel;
    int decay; /* 1: decoupled weight decay applies (tensors of 2+ dims) */
} pxt_adamw_segment;

/* Scalars of one AdamW step, computed on the host in double and rounded to
 * float once, as torch does with its Python-float hyper-parameters. Per element
 * of each segment (all float arithmetic):
 *   g  = grads * grad_scale                  (unscale by 1/loss_scale, clip)
 *   p  = master; p *= decay_factor           (decay segments only: 1 - lr * wd)
 *   m  = m + one_minus_beta1 * (g - m)       (torch's lerp, weight < 0.5)
 *   v  = v * beta2 + one_minus_beta2 * g * g
 *   p += neg_step_size * (m / (sqrt(v) / bias_correction2_sqrt + eps))
 *   master = p; ema = ema_decay * ema + one_minus_ema_decay * p   (ema != NULL)
 *   params = (dt) p                          (skipped when params == master) */
typedef struct pxt_adamw_args {
    const pxt_adamw_segment *segments; /* (n_segments), device memory */
    int n_segments;
    float grad_scale, decay_factor, one_minus_beta1, beta2, one_minus_beta2;
    float neg_step_size, bias_correction2_sqrt, eps;
    float ema_decay, one_minus_ema_decay;
    pxt_dtype dt; /* of params */
} pxt_adamw_args;

/* The epilogues of gemm_fused. With P = alpha op(A) op(B) + beta C (C read only
 * when beta != 0; NULL means D itself), all on (M, N):
 *   PXT_EPI_NONE         D = P
 *   PXT_EPI_BIAS         D = P + bias
 *   PXT_EPI_BIAS_GELU    pre = P + bias; D = gelu_tanh(pre)   (pre kept for backward)
 *   PXT_EPI_DGELU_BGRAD  D = P * gelu_tanh'(pre); dbias += column sums of D
 *                        (alpha = 1, beta = 0: the MLP's dfc and its bias gradient)
 *   PXT_EPI_BGRAD_B      D = P; dbias += column sums of op(B) over its K rows
 *                        (alpha = 1, trans_b = 0: dW += x^T dy with db += sum dy) */
typedef enum {
    PXT_EPI_NONE = 0,
    PXT_EPI_BIAS = 1,
    PXT_EPI_BIAS_GELU = 2,
    PXT_EPI_DGELU_BGRAD = 3,
    PXT_EPI_BGRAD_B = 4,
} pxt_epilogue;

/* Arguments of gemm_fused: the operands of `gemm` plus the epilogue's. A, B are
 * dt_ab; C, D, bias, pre are dt_c; dbias is fp32 and accumulates. */
typedef struct pxt_gemm_args {
    int trans_a, trans_b, M, N, K;
    float alpha, beta;
    const void *A, *B;
    const void *C; /* (M, N) or NULL (= D); may equal D */
    void *D;       /* (M, N) */
    pxt_dtype dt_ab, dt_c;
    pxt_epilogue epilogue;
    const void *bias; /* (N): BIAS, BIAS_GELU */
    void *pre;        /* (M, N): written by BIAS_GELU, read by DGELU_BGRAD */
    float *dbias;     /* (N) +=: DGELU_BGRAD, BGRAD_B */
} pxt_gemm_args;

/* PXT_OK when g's epilogue arguments are consistent (pointers present, alpha and
 * beta as the epilogue requires), else PXT_ERR_VALUE naming the problem. Both
 * backends check with it, so their refusals agree. */
int pxt_gemm_args_check(const pxt_gemm_args *g);

struct pxt_backend;
/* gemm_fused as the unfused ops of backend `be` one after another (copy, gemm,
 * add_bias, gelu, gelu', bias_backward): the CPU's gemm_fused, and the CUDA
 * backend's wherever cuBLASLt has no kernel. gemm_ws: gemm_workspace bytes;
 * sums_ws: colsum_workspace of the bias gradient's shape. */
int pxt_gemm_fused_composed(const struct pxt_backend *be, int index, const pxt_gemm_args *g,
                            void *gemm_ws, void *sums_ws);

/* What build_info() reports of a backend's libraries ("" where none). */
typedef struct {
    char runtime[32];  /* the runtime's version ("13.0"); "" on the CPU */
    char driver[32];   /* the installed driver's CUDA version; "" without a driver */
    char library[512]; /* the matmul library: cuBLAS "13.0.2", OpenBLAS's build config */
} pxt_backend_info;

typedef struct pxt_backend {
    const char *name; /* "cpu", "cuda" */

    /* ---- extras ----------------------------------------------------------------
     * Set-up once at import (NULL: none), library versions, and the instruction
     * set of the kernels for tests and benchmarks: kernel_isa(NULL) reads it,
     * kernel_isa(name) sets it ("auto": the best the device has), PXT_ERR_VALUE
     * for one it lacks (NULL entry: the backend has one kind of kernels). */
    void (*init)(void);
    void (*info)(pxt_backend_info *out);
    int (*kernel_isa)(const char *name, const char **active);

    /* Devices. device_count never fails: a missing driver is 0 devices. */
    int (*device_count)(void);
    int (*device_props)(int index, pxt_device_props *out);
    /* Free and total bytes right now, as the driver sees them. */
    int (*mem_info)(int index, size_t *free_bytes, size_t *total_bytes);

    /* Raw memory under the caching allocator: 256-byte aligned at least.
     * raw_alloc returns PXT_ERR_OOM when the device is full. */
    int (*raw_alloc)(int index, size_t nbytes, void **ptr);
    void (*raw_free)(int index, void *ptr);

    /* Every call below is queued in order with the device's other work; a call
     * that returns before the device has run it is still seen by the next one.
     * Host memory is safe at return: a copy from it (H2D) has taken the bytes,
     * a copy into it (D2H) has landed (the one kind of call that waits). */
    int (*copy)(int index, void *dst, const void *src, size_t nbytes, pxt_copy_kind kind);
    int (*memset_zero)(int index, void *dst, size_t nbytes);

    /* ---- host memory the device moves without a bounce (optimizer offload) ----
     * host_alloc: nbytes (> 0) of host memory, 256-byte aligned, for copy_async:
     * page-locked and visible to every device on CUDA (cudaHostAlloc, portable,
     * made under device `index`'s context), ordinary memory on the CPU, which
     * has nothing to lock it for. *pinned says which. PXT_ERR_OOM when the host
     * refuses. */
    int (*host_alloc)(int index, size_t nbytes, void **ptr, int *pinned);
    void (*host_free)(int index, void *ptr);
    /* As copy between the device and host memory from host_alloc, but only
     * queued: the host bytes may be read (D2H) or written again (H2D) once a
     * fence recorded after the copy has been waited for. The CPU backend copies
     * before it returns. */
    int (*copy_async)(int index, void *dst, const void *src, size_t nbytes, pxt_copy_kind kind);
    /* fence_record marks the work queued on the device so far as fence f
     * (0 <= f < PXT_FENCES); fence_wait blocks until that work has run (at once
     * for a fence never recorded). */
    int (*fence_record)(int index, int f);
    int (*fence_wait)(int index, int f);
    /* dst[i] = (dst_dtype) src[i] for n elements; floats round to nearest even. */
    int (*cast)(int index, void *dst, pxt_dtype dst_dtype, const void *src, pxt_dtype src_dtype,
                size_t n);
    /* Waits for all queued work on the device. */
    int (*synchronize)(int index);

    /* ---- graphs: a step's work recorded once, replayed (NULL: none) -----------
     * graph_begin: this thread's calls on device `index` are recorded from now on,
     * not run, until graph_end makes *graph an executable graph of them (or says
     * why recording failed: nothing recorded ran). graph_abort ends a record after
     * a failed call (graph_end included, which may fail before it closes the record)
     * and keeps that call's error message; with no record open it does nothing. A
     * record holds queued device work only: no copy from or into host memory, no
     * wait. graph_launch queues the graph's work in order with the device's other
     * work. */
    int (*graph_begin)(int index);
    int (*graph_end)(int index, void **graph);
    void (*graph_abort)(int index);
    int (*graph_launch)(int index, void *graph);
    void (*graph_free)(int index, void *graph);

    /* ---- kernels ---------------------------------------------------------------
     * Row-major. "(N, C)" is N rows of C contiguous elements. `dt` is the dtype of
     * activations and parameters (float32, or 16-bit with fp32 arithmetic);
     * gradients of parameters, layernorm statistics, lse, logits and losses are
     * always float32. "+=" marks outputs that accumulate. A kernel allocates
     * nothing: scratch memory comes in `workspace`, sized by its *_workspace
     * entry, so the memory plan can count it. A NULL entry is an op the backend
     * does not have yet (the engine raises instead of calling it). */

    /* C (M, N) = alpha * op(A) (M, K) . op(B) (K, N) + beta * C.
     * op(A) is A stored (M, K), or with trans_a A stored (K, M) and transposed;
     * likewise B: (K, N), or (N, K) with trans_b. A and B are dt_ab, C is dt_c;
     * accumulation in fp32. */
    int (*gemm)(int index, int trans_a, int trans_b, int M, int N, int K, float alpha,
                const void *A, const void *B, float beta, void *C, pxt_dtype dt_ab, pxt_dtype dt_c,
                void *workspace);
    /* gemm over matrices whose rows are further apart than their widths: the
     * rows of the stored A, B and C start lda, ldb and ldc elements apart (at
     * least K or M, N or K, and N). The heads' logits rows are padded to a
     * multiple of 8 elements with it: rows of 16 bytes' alignment are what
     * cuBLAS's fast kernels take. The same workspace as gemm. */
    int (*gemm_ld)(int index, int trans_a, int trans_b, int M, int N, int K, float alpha,
                   const void *A, int lda, const void *B, int ldb, float beta, void *C, int ldc,
                   pxt_dtype dt_ab, pxt_dtype dt_c, void *workspace);
    size_t (*gemm_workspace)(int M, int N, int K, pxt_dtype dt_ab);
    /* out (M, N) += bias (N), broadcast over rows. */
    int (*add_bias)(int index, void *out, const void *bias, int M, int N, pxt_dtype dt);
    /* dbias (N) += sum over rows of dout (M, N), its rows ld >= N elements apart,
     * chunked as pxt_colsum_chunk_rows says (the same bits on every backend).
     * workspace: colsum_workspace(M, N). */
    int (*bias_backward)(int index, float *dbias, const void *dout, int M, int N, int ld,
                         pxt_dtype dt, void *workspace);
    /* Bytes of workspace bias_backward and layernorm_backward need for a column
     * reduction of (rows, cols) (0 on the CPU, which needs none). */
    size_t (*colsum_workspace)(int rows, int cols);

    /* Fused GEMM: one product with its epilogue (see pxt_gemm_args), cuBLASLt's
     * epilogues on CUDA (own kernels where cuBLASLt has no kernel for a case), the
     * unfused composition of the ops above on the CPU. workspace:
     * gemm_fused_workspace(g) bytes. */
    int (*gemm_fused)(int index, const struct pxt_gemm_args *g, void *workspace);
    size_t (*gemm_fused_workspace)(const struct pxt_gemm_args *g);

    /* out (N, C) = (inp - mean) * rstd * weight + bias; mean, rstd (N) saved. */
    int (*layernorm_forward)(int index, void *out, float *mean, float *rstd, const void *inp,
                             const void *weight, const void *bias, int N, int C, float eps,
                             pxt_dtype dt);
    /* dinp (N, C) +=, dweight (C) +=, dbias (C) +=. dweight and dbias are column
     * sums chunked as pxt_colsum_chunk_rows says. workspace: colsum_workspace(N, C). */
    int (*layernorm_backward)(int index, void *dinp, float *dweight, float *dbias, const void *dout,
                              const void *inp, const void *weight, const float *mean,
                              const float *rstd, int N, int C, pxt_dtype dt, void *workspace);

    /* out (n) = gelu_tanh(inp (n)). */
    int (*gelu_forward)(int index, void *out, const void *inp, size_t n, pxt_dtype dt);
    /* dinp (n) = dout * gelu_tanh'(inp); dinp may alias dout. */
    int (*gelu_backward)(int index, void *dinp, const void *inp, const void *dout, size_t n,
                         pxt_dtype dt);
    /* out (n) = a + b; out may alias a or b. */
    int (*add)(int index, void *out, const void *a, const void *b, size_t n, pxt_dtype dt);

    /* out (N, C) (+)= table (V, C)[ids (N)]; ids are in [0, V) (checked by the caller). */
    int (*embedding_forward)(int index, void *out, const int32_t *ids, const void *table, int N,
                             int C, int accumulate, pxt_dtype dt);
    /* dtable (V, C) += scatter of dout (N, C) by ids (N), in the two stages of
     * PXT_EMB_CHUNK (the same bits on every backend). workspace:
     * embedding_workspace(N, C, V). */
    int (*embedding_backward)(int index, float *dtable, const void *dout, const int32_t *ids, int N,
                              int C, int V, pxt_dtype dt, void *workspace);
    size_t (*embedding_workspace)(int N, int C, int V);

    /* Softmax cross-entropy on fp32 logits (N, V), rows ld >= V elements apart,
     * plus bias (V) fp32 when not NULL (one fp32 add per logit, as add_bias),
     * against targets (N); a target of -1 is ignored (loss 0, zero gradient).
     * losses (N) = -log softmax[target]. With backward, logits are overwritten by
     * dlogits = scale * (softmax - onehot) and columns V..ld-1 by zeros; without,
     * they are left as they were. */
    int (*softmax_xent)(int index, float *logits, int ld, const float *bias, float *losses,
                        const int32_t *targets, int N, int V, float scale, int backward);
    /* *out = sum of x (n), in double on the host, in a fixed order (deterministic). */
    int (*sum)(int index, double *out, const float *x, size_t n);

    /* Exact attention, tiled with an online softmax: no Tq x Tk buffer. See
     * pxt_attn_args. out has o_stride layout; lse (B, H, Tq) fp32, -inf for a
     * query row that sees no valid key (its output row is zeros). */
    int (*attention_forward)(int index, const struct pxt_attn_args *args, void *out, float *lse,
                             const void *q, const void *k, const void *v, void *workspace);
    /* dq, dk, dv (written, same layouts as q, k, v) from dout (layout of out). */
    int (*attention_backward)(int index, const struct pxt_attn_args *args, void *dq, void *dk,
                              void *dv, const void *dout, const void *q, const void *k,
                              const void *v, const void *out, const float *lse, void *workspace);
    size_t (*attention_workspace)(const struct pxt_attn_args *args, int backward);
    /* 1 when attention_forward/backward apply pxt_attn_args.drop; 0: they refuse
     * a call with drop.p > 0 (PXT_ERR_NOT_IMPLEMENTED) */
    int attention_dropout;

    /* ---- dropout of rows (masks of dropout.h; rows as pxt_dropout lays them out) ---- */
    /* x (N, C) = resid + x * mask, or x * mask when resid is NULL (mask: 0 or d->scale). */
    int (*dropout_forward)(int index, void *x, const void *resid, int N, int C,
                           const pxt_dropout *d, pxt_dtype dt);
    /* dx (N, C) = dy * mask; dx may alias dy. */
    int (*dropout_backward)(int index, void *dx, const void *dy, int N, int C, const pxt_dropout *d,
                            pxt_dtype dt);

    /* ---- the conditioning path's own ops (engine/cond.h) ------------------------ */
    /* GroupNorm of inp (B, S, C), sample by sample, over G groups of C / G
     * channels: each (sample, group) normalised by the mean and variance of its
     * S x C/G elements (sums in double, statistics fp32, as torch's GroupNorm on
     * a (B, C, S) input); out = norm * weight + bias; mean, rstd (B, G) saved. */
    int (*groupnorm_forward)(int index, void *out, float *mean, float *rstd, const void *inp,
                             const void *weight, const void *bias, int B, int S, int C, int G,
                             float eps, pxt_dtype dt);
    /* dinp (B, S, C) +=, dweight (C) +=, dbias (C) +=: the two column sums over
     * the B x S rows chunked as pxt_colsum_chunk_rows(B * S, C) says (the same
     * bits on every backend). workspace: colsum_workspace(B * S, C). */
    int (*groupnorm_backward)(int index, void *dinp, float *dweight, float *dbias, const void *dout,
                              const void *inp, const void *weight, const float *mean,
                              const float *rstd, int B, int S, int C, int G, pxt_dtype dt,
                              void *workspace);
    /* out (N, C) = inp / max(|inp|, eps) * scale * gamma, row by row (F.normalize,
     * then a gain); norm (N) fp32 = |inp| saved. */
    int (*rmsnorm_forward)(int index, void *out, float *norm, const void *inp, const void *gamma,
                           int N, int C, float scale, float eps, pxt_dtype dt);
    /* dinp (N, C) +=, dgamma (C) +=: dgamma's column sum chunked as
     * pxt_colsum_chunk_rows(N, C) says (the same bits on every backend).
     * workspace: colsum_workspace(N, C). */
    int (*rmsnorm_backward)(int index, void *dinp, float *dgamma, const void *dout, const void *inp,
                            const void *gamma, const float *norm, int N, int C, float scale,
                            float eps, pxt_dtype dt, void *workspace);
    /* GEGLU: out (N, F) = a * gelu(g) for rows inp (N, 2F) = [a | g], gelu the
     * exact one (x Phi(x), erf). */
    int (*geglu_forward)(int index, void *out, const void *inp, int N, int F, pxt_dtype dt);
    /* dinp (N, 2F) = [dout gelu(g) | dout a gelu'(g)] (written). */
    int (*geglu_backward)(int index, void *dinp, const void *inp, const void *dout, int N, int F,
                          pxt_dtype dt);

    /* ---- optimizer (single passes over the flat buffers, see engine/adamw.h) ---- */
    /* *sumsq = sum of g[i]^2 over g (n) fp32, accumulated in double over
     * PXT_SUMSQ_PARTS fixed contiguous parts added in order: the bits depend on n
     * alone, never on the thread count. *nonfinite = 1 when some g[i] is inf or
     * NaN (the double sum of finite fp32 squares cannot overflow), else 0.
     * workspace: PXT_SUMSQ_PARTS doubles of device memory. */
    int (*grad_sumsq)(int index, double *sumsq, int *nonfinite, const float *g, size_t n,
                      void *workspace);
    /* One AdamW step (torch.optim.AdamW, non-amsgrad, foreach=False) over the
     * segments of pxt_adamw_args; elements outside every segment (padding
     * between tensors) are never read nor written. See pxt_adamw_args. */
    int (*adamw)(int index, const struct pxt_adamw_args *args, float *master, float *m, float *v,
                 float *ema, void *params, const float *grads);
    /* Exchanges a (n) and b (n) of dtype dt (swap_ema with fp32 parameters). */
    int (*swap)(int index, void *a, void *b, size_t n, pxt_dtype dt);
} pxt_backend;

/* The backend of a device type, or NULL when this build has none (CPU-only). */
const pxt_backend *pxt_backend_for(pxt_device_type type);
/* What a memory plan for a device type may ask: its backend, or in a build without
 * the CUDA backend, the CUDA backend's workspace sizes alone (cuda/sizes.c, in every
 * build), so any machine plans a step for a card. NULL for an unknown type. */
const pxt_backend *pxt_backend_plan_for(pxt_device_type type);

/* Filled by csrc/cpu/backend_cpu.c and cuda/backend_cuda.cu (cuda/sizes.c the
 * planning table); only backend.c names them (engine and bindings ask
 * pxt_backend_for). */
const pxt_backend *pxt_cpu_backend(void);
#ifdef PXT_WITH_CUDA
const pxt_backend *pxt_cuda_backend(void);
#endif
const pxt_backend *pxt_cuda_sizes_backend(void);

#ifdef __cplusplus
}
#endif
#endif /* PXT_BACKEND_H */
