/* block.h: the pre-LayerNorm GPT-2 block, forward and backward, on buffers.
 *
 *   ln1 = LN(x); qkv = ln1 W_attn + b; att = attention(q, k, v); x2 = x + att W_proj + b
 *   [cross-attention, when the step has a context (B, Tc, C):
 *    lnx = LN(x2); xq = lnx W_q + b; xkv = context W_kv + b;
 *    xatt = attention(xq, xk, xv) (non-causal, context key mask); x3 = x2 + xatt W_cp + b]
 *   r = x3 with cross-attention, else x2
 *   ln2 = LN(r); fc = ln2 W_fc + b; gelu = GELU(fc); y = r + gelu W_fcp + b
 *
 * Dropout in training, where GPT-2 has it (x->drop_*.p > 0): on the attention
 * probabilities (inside the attention kernels) and on both residual branches,
 * x2 = x + drop(att W_proj + b) and y = r + drop(gelu W_fcp + b). The masks are
 * drawn from the sites' keys (dropout.h), so recomputation reproduces them. The
 * cross-attention branch has none.
 *
 * The plain block and the block with cross-attention are the same functions:
 * x->context == NULL means "no cross-attention", and then no cross-attention
 * parameter, gradient or activation pointer is ever read (they may be NULL).
 * The caller owns every buffer (they come from the step's arena); a block
 * allocates nothing. No Python here.
 *
 * Parameters (all y = x @ W + b; names as pyxtts.Block.parameters() gives them):
 *   ln_1.weight, ln_1.bias (C)              attn.c_attn.weight (C, 3C), bias (3C)
 *   attn.c_proj.weight (C, C), bias (C)     ln_2.weight, ln_2.bias (C)
 *   mlp.c_fc.weight (C, 4C), bias (4C)      mlp.c_proj.weight (4C, C), bias (C)
 * and with cross-attention:
 *   crossattn.ln.weight, crossattn.ln.bias (C)
 *   crossattn.q.weight (C, C), bias (C)     queries from the block's stream
 *   crossattn.kv.weight (C, 2C), bias (2C)  keys | values from the context
 *   crossattn.c_proj.weight (C, C), bias (C) */
#ifndef PXT_BLOCK_H
#define PXT_BLOCK_H

#include "backend.h"
#include "layout.h"

/* What a block saves for its backward (the rest is recomputed there): none
 * recomputes nothing, selective the layernorm outputs and GELU, full all. */
typedef enum { PXT_CKPT_NONE = 0, PXT_CKPT_SELECTIVE = 1, PXT_CKPT_FULL = 2 } pxt_ckpt;

/* What every op of a step shares. Zero-initialised fields give the plain causal
 * GPT block (the model builds it with designated initialisers). */
typedef struct {
    const pxt_backend *be;
    int dev;        /* device index */
    pxt_dtype dt;   /* activations and parameters */
    int B, T, C, H; /* N = B * T rows */
    float eps;
    const uint8_t *key_mask; /* (B, T) on the device: 0 = padding, never attended; or NULL */
    void *attn_ws;   /* attention workspace (max over the block's attentions, fwd and bwd) */
    void *gemm_ws;   /* GEMM workspace, plain and fused (pxt_plan_gemm_ws of the block's) */
    void *reduce_ws; /* column sums' workspace (pxt_plan_colsum_ws of the block's) */
    int non_causal;  /* 1: self-attention sees every (unmasked) key, as an encoder */
    /* 1: GELU by gelu_forward after the bias GEMM instead of in its epilogue, so
     * that a "selective" block, which recomputes GELU that way in backward, uses
     * the very bits its forward used (the epilogue's GELU may round otherwise) */
    int gelu_apart;
    /* cross-attention: all unused when context is NULL. An encoder-decoder stack
     * shares one context among its decoder blocks, and dcontext sums over them. */
    const void *context;         /* (B, Tc, C) dt: the encoder's output, or NULL */
    const uint8_t *context_mask; /* (B, Tc): 0 = padding, never attended; or NULL */
    int Tc;                      /* context rows per sample (>= 1 with a context) */
    void *dcontext;              /* (B, Tc, C) dt, += in backward */
    void *dkv;                   /* (B, Tc, 2C) dt: backward scratch (dk | dv) */
    /* dropout (zero-initialised: none): the block's three sites, rows of T per sample */
    pxt_dropout drop_attn;     /* the attention probabilities */
    pxt_dropout drop_attn_out; /* the attention's residual branch */
    pxt_dropout drop_mlp_out;  /* the MLP's residual branch */
} pxt_ctx;

/* Parameter tensor j of a block (gpt.h's enum); the PXT_X* entries only with a context. */
typedef struct {
    const void *w[PXT_BLOCK_TENSORS_CROSS]; /* device pointers, dtype dt, shapes above */
} pxt_block_params;

typedef struct {
    float *g[PXT_BLOCK_TENSORS_CROSS]; /* fp32 gradients, same shapes; accumulated */
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
    /* cross-attention (NULL without) */
    void *lnx;            /* (N, C) LN(x2) */
    float *meanx, *rstdx; /* (N) */
    void *xq;             /* (N, C) queries, (B, T, H, D) */
    void *xkv;            /* (B * Tc, 2C): keys | values of the context, each (B, Tc, H, D) */
    void *xatt;           /* (N, C) cross-attention output */
    float *xlse;          /* (B, H, T) */
    void *x3;             /* (N, C) residual after cross-attention */
} pxt_block_acts;

/* The activations one by one, for laying out arenas: which a checkpoint policy
 * saves (the rest are recomputed into the work area in backward) and their
 * sizes. none saves all; selective saves the matmul and attention outputs,
 * the lse and the layernorm statistics, and recomputes the layernorm outputs
 * and GELU; full saves nothing (the block input is kept by the caller). */
enum {
    PXT_ACT_LN1,
    PXT_ACT_MEAN1,
    PXT_ACT_RSTD1,
    PXT_ACT_QKV,
    PXT_ACT_ATT,
    PXT_ACT_LSE,
    PXT_ACT_X2,
    PXT_ACT_LN2,
    PXT_ACT_MEAN2,
    PXT_ACT_RSTD2,
    PXT_ACT_FC,
    PXT_ACT_GELU,
    PXT_ACT_PLAIN, /* the activations above exist in every block; those below with a context */
    PXT_ACT_LNX = PXT_ACT_PLAIN,
    PXT_ACT_MEANX,
    PXT_ACT_RSTDX,
    PXT_ACT_XQ,
    PXT_ACT_XKV,
    PXT_ACT_XATT,
    PXT_ACT_XLSE,
    PXT_ACT_X3,
    PXT_ACT_COUNT
};
int pxt_block_saves(pxt_ckpt policy, int act);
/* Bytes of an activation for shape (B, T, Tc, C, H) and dtype dt (fp32 statistics). */
size_t pxt_block_act_bytes(int act, int B, int T, int Tc, int C, int H, pxt_dtype dt);
/* Sets activation `act` of a to ptr. */
void pxt_block_acts_set(pxt_block_acts *a, int act, void *ptr);

/* Every op a step needs; PXT_ERR_NOT_IMPLEMENTED naming the first one missing. */
int pxt_ctx_check_ops(const pxt_backend *be, const char *device_name);
/* The ops of dropout (dropout != 0) and of the conditioning path (conditioning
 * != 0) a training step needs; PXT_ERR_NOT_IMPLEMENTED naming the first one
 * missing, what needs it and how to do without. */
int pxt_ctx_check_extra_ops(const pxt_backend *be, const char *device_name, int dropout,
                            int conditioning);

/* The attention calls of a block (for workspace sizes): self-attention, and
 * the cross-attention (meaningful when x->Tc > 0). */
pxt_attn_args pxt_block_self_attn_args(const pxt_ctx *x);
pxt_attn_args pxt_block_cross_attn_args(const pxt_ctx *x);

/* The (M, N, K) of every GEMM the block's forward and backward make, for the
 * GEMM workspace: 9, or 12 with a context (x->Tc > 0). shapes holds 12. */
#define PXT_BLOCK_GEMMS_MAX 12
int pxt_block_gemm_shapes(const pxt_ctx *x, int shapes[][3]);
/* The (rows, cols) of every column sum the block's backward takes (bias and
 * layernorm gradients), for the reduction workspace: 3, or 4 with a context. */
#define PXT_BLOCK_COLSUMS_MAX 4
int pxt_block_colsum_shapes(const pxt_ctx *x, int shapes[][2]);

/* y (N, C) = block(x (N, C)); activations written to `a`. y may be NULL
 * (recomputation in backward needs the activations only). */
int pxt_block_forward(const pxt_ctx *x, const pxt_block_params *p, const pxt_block_acts *a,
                      const void *inp, void *out);

/* dres (N, C): dy on entry, dx on exit. Gradients accumulate into g, and with
 * a context dcontext += its gradient. Under "selective" or "full", what the
 * policy did not save is recomputed into `work` first (saved holds what it
 * did). dA (N, 4C) and dB (N, C) are scratch (and x->dkv with a context). */
int pxt_block_backward(const pxt_ctx *x, const pxt_block_params *p, const pxt_block_grads *g,
                       const pxt_block_acts *saved, const pxt_block_acts *work, pxt_ckpt policy,
                       const void *inp, void *dres, void *dA, void *dB);

#endif /* PXT_BLOCK_H */
