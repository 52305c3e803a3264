/* cpu.h: the CPU backend's kernels, shared between its files. */
#ifndef PXT_CPU_H
#define PXT_CPU_H

#include "engine/pxt.h"

int pxt_cpu_cast(int index, void *dst, pxt_dtype dt, const void *src, pxt_dtype st, size_t n);

/* Kernels of the backend table (semantics in backend.h). */
/* matmul.c */
int pxt_cpu_gemm(int index, int trans_a, int trans_b, int M, int N, int K, float alpha,
                 const void *A, const void *B, float beta, void *C, pxt_dtype dt_ab, pxt_dtype dt_c,
                 void *workspace);
int pxt_cpu_gemm_ld(int index, int trans_a, int trans_b, int M, int N, int K, float alpha,
                    const void *A, int lda, const void *B, int ldb, float beta, void *C, int ldc,
                    pxt_dtype dt_ab, pxt_dtype dt_c, void *workspace);
size_t pxt_cpu_gemm_workspace(int M, int N, int K, pxt_dtype dt_ab);
/* gemm_fused.c */
struct pxt_gemm_args;
int pxt_cpu_gemm_fused(int index, const struct pxt_gemm_args *g, void *workspace);
size_t pxt_cpu_gemm_fused_workspace(const struct pxt_gemm_args *g);
/* bias.c */
int pxt_cpu_add_bias(int index, void *out, const void *bias, int M, int N, pxt_dtype dt);
int pxt_cpu_bias_backward(int index, float *dbias, const void *dout, int M, int N, int ld,
                          pxt_dtype dt, void *workspace);
size_t pxt_cpu_colsum_workspace(int rows, int cols);
/* layernorm.c */
int pxt_cpu_layernorm_forward(int index, void *out, float *mean, float *rstd, const void *inp,
                              const void *weight, const void *bias, int N, int C, float eps,
                              pxt_dtype dt);
int pxt_cpu_layernorm_backward(int index, void *dinp, float *dweight, float *dbias,
                               const void *dout, const void *inp, const void *weight,
                               const float *mean, const float *rstd, int N, int C, pxt_dtype dt,
                               void *workspace);
/* gelu.c */
int pxt_cpu_gelu_forward(int index, void *out, const void *inp, size_t n, pxt_dtype dt);
int pxt_cpu_gelu_backward(int index, void *dinp, const void *inp, const void *dout, size_t n,
                          pxt_dtype dt);
int pxt_cpu_add(int index, void *out, const void *a, const void *b, size_t n, pxt_dtype dt);
/* embedding.c */
int pxt_cpu_embedding_forward(int index, void *out, const int32_t *ids, const void *table, int N,
                              int C, int accumulate, pxt_dtype dt);
int pxt_cpu_embedding_backward(int index, float *dtable, const void *dout, const int32_t *ids,
                               int N, int C, int V, pxt_dtype dt, void *workspace);
size_t pxt_cpu_embedding_workspace(int N, int C, int V);
/* xent.c */
int pxt_cpu_softmax_xent(int index, float *logits, int ld, const float *bias, float *losses,
                         const int32_t *targets, int N, int V, float scale, int backward);
int pxt_cpu_sum(int index, double *out, const float *x, size_t n);

/* attention.c */
struct pxt_attn_args;
int pxt_cpu_attention_forward(int index, const struct pxt_attn_args *args, void *out, float *lse,
                              const void *q, const void *k, const void *v, void *workspace);
int pxt_cpu_attention_backward(int index, const struct pxt_attn_args *args, void *dq, void *dk,
                               void *dv, const void *dout, const void *q, const void *k,
                               const void *v, const void *out, const float *lse, void *workspace);
size_t pxt_cpu_attention_workspace(const struct pxt_attn_args *args, int backward);
/* The attention tiles' instruction set: "generic", "avx2", "avx512", or NULL /
 * "auto" for the best this CPU has (the default); PXT_ERR_VALUE for one it lacks. */
int pxt_cpu_attention_set_isa(const char *name);
const char *pxt_cpu_attention_isa(void);

/* dropout.c */
struct pxt_dropout;
int pxt_cpu_dropout_forward(int index, void *x, const void *resid, int N, int C,
                            const struct pxt_dropout *d, pxt_dtype dt);
int pxt_cpu_dropout_backward(int index, void *dx, const void *dy, int N, int C,
                             const struct pxt_dropout *d, pxt_dtype dt);
/* groupnorm.c */
int pxt_cpu_groupnorm_forward(int index, void *out, float *mean, float *rstd, const void *inp,
                              const void *weight, const void *bias, int B, int S, int C, int G,
                              float eps, pxt_dtype dt);
int pxt_cpu_groupnorm_backward(int index, void *dinp, float *dweight, float *dbias,
                               const void *dout, const void *inp, const void *weight,
                               const float *mean, const float *rstd, int B, int S, int C, int G,
                               pxt_dtype dt, void *workspace);
/* rmsnorm.c */
int pxt_cpu_rmsnorm_forward(int index, void *out, float *norm, const void *inp, const void *gamma,
                            int N, int C, float scale, float eps, pxt_dtype dt);
int pxt_cpu_rmsnorm_backward(int index, void *dinp, float *dgamma, const void *dout,
                             const void *inp, const void *gamma, const float *norm, int N, int C,
                             float scale, float eps, pxt_dtype dt, void *workspace);
/* geglu.c */
int pxt_cpu_geglu_forward(int index, void *out, const void *inp, int N, int F, pxt_dtype dt);
int pxt_cpu_geglu_backward(int index, void *dinp, const void *inp, const void *dout, int N, int F,
                           pxt_dtype dt);

/* optim.c */
struct pxt_adamw_args;
int pxt_cpu_grad_sumsq(int index, double *sumsq, int *nonfinite, const float *g, size_t n,
                       void *workspace);
int pxt_cpu_adamw(int index, const struct pxt_adamw_args *args, float *master, float *m, float *v,
                  float *ema, void *params, const float *grads);
int pxt_cpu_swap(int index, void *a, void *b, size_t n, pxt_dtype dt);

#endif
