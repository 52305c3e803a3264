/* block.h: the pre-LayerNorm GPT-2 block, forward and backward, on buffers.
 *
 *   ln1 = LN(x); qkv = ln1 W_attn + b; att = attention(q, k, v); x2 = x + att W_proj + b
 *   ln2 = LN(x2); fc = ln2 W_fc + b; gelu = GELU(fc); y = x2 + gelu W_fcp + b
 *
 * The caller owns every buffer (they come from the step's arena); a block
 * allocates nothing. No Python here. */
#ifndef PXT_BLOCK_H
#define PXT_BLOCK_H

#include "gpt.h"
#include "plan.h"

/* What every op of a step shares. */
typedef struct {
    const pxt_backend *be;
    int dev;          /* device index */
    pxt_dtype dt;     /* activations and parameters */
    int B, T, C, H;   /* N = B * T rows */
    float eps;
    const uint8_t *key_mask; /* (B, T) on the device: 0 = padding, never attended */
    void *attn_ws;    /* attention workspace (plan.attn_ws_bytes) */
    void *gemm_ws;    /* GEMM widening workspace (plan.gemm_ws_bytes) */
} pxt_ctx;

typedef struct {
    const void *w[PXT_BLOCK_TENSORS]; /* device pointers, dtype dt, DESIGN.md shapes */
} pxt_block_params;

typedef struct {
    float *g[PXT_BLOCK_TENSORS]; /* fp32 gradients, same shapes; accumulated */
} pxt_block_grads;

/* Pointers to a block's activations (saved, or in the work area). */
typedef struct {
    void *ln1;            /* (N, C) */
    float *mean1, *rstd1; /* (N) */
    void *qkv;            /* (N, 3C): q | k | v, each (B, T, H, D) */
    void *att;            /* (N, C) attention output, heads side by side */
    float *lse;           /* (B, H, T) */
    void *x2;             /* (N, C) residual after attention */
    void *ln2;            /* (N, C) */
    float *mean2, *rstd2; /* (N) */
    void *fc;             /* (N, 4C) */
    void *gelu;           /* (N, 4C) */
} pxt_block_acts;

/* Every op a step needs; PXT_ERR_NOT_IMPLEMENTED naming the first one missing. */
int pxt_ctx_check_ops(const pxt_backend *be, const char *device_name);

/* y (N, C) = block(x (N, C)); activations written to `a`. y may be NULL
 * (recomputation in backward needs the activations only). */
int pxt_block_forward(const pxt_ctx *x, const pxt_block_params *p, const pxt_block_acts *a,
                      const void *inp, void *out);

/* dres (N, C): dy on entry, dx on exit. Gradients accumulate into g. Under
 * "selective" or "full", what the policy did not save is recomputed into
 * `work` first (saved holds what it did). dA (N, 4C) and dB (N, C) are scratch. */
int pxt_block_backward(const pxt_ctx *x, const pxt_block_params *p, const pxt_block_grads *g,
                       const pxt_block_acts *saved, const pxt_block_acts *work, pxt_ckpt policy,
                       const void *inp, void *dres, void *dA, void *dB);

#endif /* PXT_BLOCK_H */
