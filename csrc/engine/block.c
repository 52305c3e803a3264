/* block.c: the GPT-2 block's forward and backward (see block.h). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "block.h"

int pxt_ctx_check_ops(const pxt_backend *be, const char *dev) {
    struct {
        const void *fn;
        const char *name;
    } ops[] = {
        {(const void *)be->gemm, "gemm"},
        {(const void *)be->add_bias, "add_bias"},
        {(const void *)be->bias_backward, "bias_backward"},
        {(const void *)be->colsum_workspace, "colsum_workspace"},
        {(const void *)be->gemm_fused, "gemm_fused"},
        {(const void *)be->gemm_fused_workspace, "gemm_fused_workspace"},
        {(const void *)be->layernorm_forward, "layernorm_forward"},
        {(const void *)be->layernorm_backward, "layernorm_backward"},
        {(const void *)be->gelu_forward, "gelu_forward"},
        {(const void *)be->gelu_backward, "gelu_backward"},
        {(const void *)be->add, "add"},
        {(const void *)be->embedding_forward, "embedding_forward"},
        {(const void *)be->embedding_backward, "embedding_backward"},
        {(const void *)be->embedding_workspace, "embedding_workspace"},
        {(const void *)be->softmax_xent, "softmax_xent"},
        {(const void *)be->sum, "sum"},
        {(const void *)be->attention_forward, "attention_forward"},
        {(const void *)be->attention_backward, "attention_backward"},
        {(const void *)be->attention_workspace, "attention_workspace"},
    };
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
        if (!ops[i].fn) {
            return pxt_error(PXT_ERR_NOT_IMPLEMENTED,
                             "the %s backend has no '%s' kernel yet: training on %s is not "
                             "available in this version of pyxtts",
                             be->name, ops[i].name, dev);
        }
    }
    return PXT_OK;
}

int pxt_ctx_check_extra_ops(const pxt_backend *be, const char *dev, int dropout, int conditioning) {
    static const char *why[2] = {
        "training with dropout cannot run on %s in this version of pyxtts; set "
        "ModelConfig.dropout=0, or train on the CPU",
        "the conditioning path (batch['cond_mels']) cannot run on %s in this version of "
        "pyxtts; pass fixed cond_latents instead, or train on the CPU",
    };
    struct {
        const void *fn;
        const char *name;
        int cond; /* 0: a dropout op, 1: a conditioning op */
    } ops[] = {
        {(const void *)be->dropout_forward, "dropout_forward", 0},
        {(const void *)be->dropout_backward, "dropout_backward", 0},
        {(const void *)be->groupnorm_forward, "groupnorm_forward", 1},
        {(const void *)be->groupnorm_backward, "groupnorm_backward", 1},
        {(const void *)be->rmsnorm_forward, "rmsnorm_forward", 1},
        {(const void *)be->rmsnorm_backward, "rmsnorm_backward", 1},
        {(const void *)be->geglu_forward, "geglu_forward", 1},
        {(const void *)be->geglu_backward, "geglu_backward", 1},
    };
    char reason[256];
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
        if ((ops[i].cond ? conditioning : dropout) && !ops[i].fn) {
            snprintf(reason, sizeof reason, why[ops[i].cond], dev);
            return pxt_error(PXT_ERR_NOT_IMPLEMENTED, "the %s backend has no '%s' kernel yet: %s",
                             be->name, ops[i].name, reason);
        }
    }
    if (dropout && !be->attention_dropout) {
        snprintf(reason, sizeof reason, why[0], dev);
        return pxt_error(PXT_ERR_NOT_IMPLEMENTED,
                         "the %s backend's attention kernels have no dropout of the attention "
                         "probabilities yet: %s",
                         be->name, reason);
    }
    return PXT_OK;
}

/* q, k, v are thirds of the (B, T, 3C) qkv rows; the output is (B, T, C). */
pxt_attn_args pxt_block_self_attn_args(const pxt_ctx *x) {
    int64_t C = x->C, T = x->T, D = x->C / x->H;
    pxt_attn_args a = {
        .B = x->B,
        .H = x->H,
        .Tq = x->T,
        .Tk = x->T,
        .D = (int)D,
        .causal = !x->non_causal,
        .scale = 1.0f / sqrtf((float)D),
        .key_mask = x->key_mask,
        .q = {T * 3 * C, D, 3 * C},
        .k = {T * 3 * C, D, 3 * C},
        .v = {T * 3 * C, D, 3 * C},
        .o = {T * C, D, C},
        .dt = x->dt,
        .drop = x->drop_attn,
    };
    return a;
}

/* Queries (B, T, C) against the halves of the (B, Tc, 2C) xkv rows, every
 * unmasked context key visible; the output is (B, T, C). */
pxt_attn_args pxt_block_cross_attn_args(const pxt_ctx *x) {
    int64_t C = x->C, T = x->T, Tc = x->Tc, D = x->C / x->H;
    pxt_attn_args a = {
        .B = x->B,
        .H = x->H,
        .Tq = x->T,
        .Tk = x->Tc,
        .D = (int)D,
        .causal = 0,
        .scale = 1.0f / sqrtf((float)D),
        .key_mask = x->context_mask,
        .q = {T * C, D, C},
        .k = {Tc * 2 * C, D, 2 * C},
        .v = {Tc * 2 * C, D, 2 * C},
        .o = {T * C, D, C},
        .dt = x->dt,
    };
    return a;
}

int pxt_block_colsum_shapes(const pxt_ctx *x, int shapes[][2]) {
    int N = x->B * x->T, Nc = x->B * x->Tc, C = x->C;
    const int all[PXT_BLOCK_COLSUMS_MAX][2] = {
        {N, C},
        {N, 3 * C},
        {N, 4 * C},  /* layernorms and biases */
        {Nc, 2 * C}, /* the context's keys and values */
    };
    int n = x->Tc > 0 ? 4 : 3;
    memcpy(shapes, all, sizeof all[0] * (size_t)n);
    return n;
}

int pxt_block_gemm_shapes(const pxt_ctx *x, int shapes[][3]) {
    int N = x->B * x->T, Nc = x->B * x->Tc, C = x->C;
    const int all[PXT_BLOCK_GEMMS_MAX][3] = {
        {N, 3 * C, C},  {N, C, C},      {N, 4 * C, C},  {N, C, 4 * C},                /* forward */
        {N, C, 3 * C},  {C, 3 * C, N},  {C, C, N},      {C, 4 * C, N}, {4 * C, C, N}, /* backward */
        {Nc, 2 * C, C}, {Nc, C, 2 * C}, {C, 2 * C, Nc},                               /* cross */
    };
    int n = x->Tc > 0 ? 12 : 9;
    memcpy(shapes, all, sizeof all[0] * (size_t)n);
    return n;
}

static char *at(const void *base, size_t elems, pxt_dtype dt) {
    return (char *)base + elems * pxt_dtype_size(dt);
}

/* ---- the block's products, through the fused GEMM ------------------------------ */

/* y (M, N) = a (M, K) W (K, N) + b, plus resid (M, N) when given: one product
 * whose epilogue adds the bias (and the residual, as beta C). */
static int linear(const pxt_ctx *x, int M, int N, int K, const void *a, const void *w,
                  const void *b, const void *resid, void *y) {
    pxt_gemm_args g = {.M = M,
                       .N = N,
                       .K = K,
                       .alpha = 1.0f,
                       .beta = resid ? 1.0f : 0.0f,
                       .A = a,
                       .B = w,
                       .C = resid,
                       .D = y,
                       .dt_ab = x->dt,
                       .dt_c = x->dt,
                       .epilogue = PXT_EPI_BIAS,
                       .bias = b};
    return x->be->gemm_fused(x->dev, &g, x->gemm_ws);
}

/* dW (K, N) += a^T dy and, when db is given, db (N) += the column sums of dy, for
 * a (M, K) and dy (M, N): one product whose epilogue reduces dy as well. */
static int linear_dweight(const pxt_ctx *x, int M, int N, int K, const void *a, const void *dy,
                          float *dw, float *db) {
    pxt_gemm_args g = {.trans_a = 1,
                       .M = K,
                       .N = N,
                       .K = M,
                       .alpha = 1.0f,
                       .beta = 1.0f,
                       .A = a,
                       .B = dy,
                       .D = dw,
                       .dt_ab = x->dt,
                       .dt_c = PXT_FLOAT32,
                       .epilogue = db ? PXT_EPI_BGRAD_B : PXT_EPI_NONE,
                       .dbias = db};
    return x->be->gemm_fused(x->dev, &g, x->gemm_ws);
}

/* ---- the activations one by one ---------------------------------------------- */

int pxt_block_saves(pxt_ckpt policy, int act) {
    switch (policy) {
    case PXT_CKPT_NONE: return 1;
    case PXT_CKPT_SELECTIVE:
        return act != PXT_ACT_LN1 && act != PXT_ACT_LN2 && act != PXT_ACT_GELU &&
               act != PXT_ACT_LNX;
    default: return 0;
    }
}

size_t pxt_block_act_bytes(int act, int B, int T, int Tc, int C, int H, pxt_dtype dt) {
    size_t N = (size_t)B * (size_t)T, es = pxt_dtype_size(dt);
    switch (act) {
    case PXT_ACT_LN1:
    case PXT_ACT_ATT:
    case PXT_ACT_X2:
    case PXT_ACT_LN2:
    case PXT_ACT_LNX:
    case PXT_ACT_XQ:
    case PXT_ACT_XATT:
    case PXT_ACT_X3: return N * (size_t)C * es;
    case PXT_ACT_QKV: return N * 3 * (size_t)C * es;
    case PXT_ACT_FC:
    case PXT_ACT_GELU: return N * 4 * (size_t)C * es;
    case PXT_ACT_XKV: return (size_t)B * (size_t)Tc * 2 * (size_t)C * es;
    case PXT_ACT_MEAN1:
    case PXT_ACT_RSTD1:
    case PXT_ACT_MEAN2:
    case PXT_ACT_RSTD2:
    case PXT_ACT_MEANX:
    case PXT_ACT_RSTDX: return N * sizeof(float);
    case PXT_ACT_LSE:
    case PXT_ACT_XLSE: return N * (size_t)H * sizeof(float);
    default: return 0;
    }
}

void pxt_block_acts_set(pxt_block_acts *a, int act, void *ptr) {
    switch (act) {
    case PXT_ACT_LN1: a->ln1 = ptr; break;
    case PXT_ACT_MEAN1: a->mean1 = ptr; break;
    case PXT_ACT_RSTD1: a->rstd1 = ptr; break;
    case PXT_ACT_QKV: a->qkv = ptr; break;
    case PXT_ACT_ATT: a->att = ptr; break;
    case PXT_ACT_LSE: a->lse = ptr; break;
    case PXT_ACT_X2: a->x2 = ptr; break;
    case PXT_ACT_LN2: a->ln2 = ptr; break;
    case PXT_ACT_MEAN2: a->mean2 = ptr; break;
    case PXT_ACT_RSTD2: a->rstd2 = ptr; break;
    case PXT_ACT_FC: a->fc = ptr; break;
    case PXT_ACT_GELU: a->gelu = ptr; break;
    case PXT_ACT_LNX: a->lnx = ptr; break;
    case PXT_ACT_MEANX: a->meanx = ptr; break;
    case PXT_ACT_RSTDX: a->rstdx = ptr; break;
    case PXT_ACT_XQ: a->xq = ptr; break;
    case PXT_ACT_XKV: a->xkv = ptr; break;
    case PXT_ACT_XATT: a->xatt = ptr; break;
    case PXT_ACT_XLSE: a->xlse = ptr; break;
    case PXT_ACT_X3: a->x3 = ptr; break;
    default: break;
    }
}

/* ---- forward --------------------------------------------------------------- */

/* Cross-attention sublayer: x3 (N, C) = x2 + attention(LN(x2) W_q, context W_kv) W_cp. */
static int cross_forward(const pxt_ctx *x, const pxt_block_params *p, const pxt_block_acts *a) {
    const pxt_backend *be = x->be;
    int d = x->dev, N = x->B * x->T, Nc = x->B * x->Tc, C = x->C;
    pxt_dtype dt = x->dt;
    /* queries: lnx (N, C) -> xq (N, C); keys | values: context (Nc, C) -> xkv (Nc, 2C) */
    PXT_TRY(be->layernorm_forward(d, a->lnx, a->meanx, a->rstdx, a->x2, p->w[PXT_XLN_W],
                                  p->w[PXT_XLN_B], N, C, x->eps, dt));
    PXT_TRY(linear(x, N, C, C, a->lnx, p->w[PXT_XQ_W], p->w[PXT_XQ_B], NULL, a->xq));
    PXT_TRY(linear(x, Nc, 2 * C, C, x->context, p->w[PXT_XKV_W], p->w[PXT_XKV_B], NULL, a->xkv));
    pxt_attn_args args = pxt_block_cross_attn_args(x);
    PXT_TRY(be->attention_forward(d, &args, a->xatt, a->xlse, a->xq, a->xkv,
                                  at(a->xkv, (size_t)C, dt), x->attn_ws));
    return linear(x, N, C, C, a->xatt, p->w[PXT_XPROJ_W], p->w[PXT_XPROJ_B], a->x2, a->x3);
}

int pxt_block_forward(const pxt_ctx *x, const pxt_block_params *p, const pxt_block_acts *a,
                      const void *inp, void *out) {
    const pxt_backend *be = x->be;
    int d = x->dev, N = x->B * x->T, C = x->C;
    pxt_dtype dt = x->dt;
    size_t NC = (size_t)N * C;
    /* attention half: ln1 (N, C) -> qkv (N, 3C) -> att (N, C) -> x2 = x + proj */
    PXT_TRY(be->layernorm_forward(d, a->ln1, a->mean1, a->rstd1, inp, p->w[PXT_LN1_W],
                                  p->w[PXT_LN1_B], N, C, x->eps, dt));
    PXT_TRY(linear(x, N, 3 * C, C, a->ln1, p->w[PXT_ATTN_W], p->w[PXT_ATTN_B], NULL, a->qkv));
    pxt_attn_args args = pxt_block_self_attn_args(x);
    PXT_TRY(be->attention_forward(d, &args, a->att, a->lse, a->qkv, at(a->qkv, (size_t)C, dt),
                                  at(a->qkv, 2 * (size_t)C, dt), x->attn_ws));
    if (x->drop_attn_out.p > 0.0f) { /* x2 = x + drop(att W + b): the mask before the sum */
        PXT_TRY(linear(x, N, C, C, a->att, p->w[PXT_PROJ_W], p->w[PXT_PROJ_B], NULL, a->x2));
        PXT_TRY(be->dropout_forward(d, a->x2, inp, N, C, &x->drop_attn_out, dt));
    } else { /* the projection's epilogue adds the residual (beta = 1): no (N, C) temporary */
        PXT_TRY(linear(x, N, C, C, a->att, p->w[PXT_PROJ_W], p->w[PXT_PROJ_B], inp, a->x2));
    }
    /* cross-attention half (with a context): x3 = x2 + cross-attention */
    const void *r = a->x2; /* the residual entering the MLP */
    if (x->context) {
        PXT_TRY(cross_forward(x, p, a));
        r = a->x3;
    }
    /* MLP half: ln2 (N, C) -> fc (N, 4C) -> gelu (N, 4C) -> y = r + proj */
    PXT_TRY(be->layernorm_forward(d, a->ln2, a->mean2, a->rstd2, r, p->w[PXT_LN2_W],
                                  p->w[PXT_LN2_B], N, C, x->eps, dt));
    if (x->gelu_apart) {
        PXT_TRY(linear(x, N, 4 * C, C, a->ln2, p->w[PXT_FC_W], p->w[PXT_FC_B], NULL, a->fc));
        PXT_TRY(be->gelu_forward(d, a->gelu, a->fc, NC * 4, dt));
    } else { /* fc = ln2 W + b kept for backward, gelu(fc) from the same epilogue */
        pxt_gemm_args g = {.M = N,
                           .N = 4 * C,
                           .K = C,
                           .alpha = 1.0f,
                           .A = a->ln2,
                           .B = p->w[PXT_FC_W],
                           .D = a->gelu,
                           .dt_ab = dt,
                           .dt_c = dt,
                           .epilogue = PXT_EPI_BIAS_GELU,
                           .bias = p->w[PXT_FC_B],
                           .pre = a->fc};
        PXT_TRY(be->gemm_fused(d, &g, x->gemm_ws));
    }
    if (!out) {
        return PXT_OK;
    }
    if (x->drop_mlp_out.p > 0.0f) { /* y = r + drop(gelu W + b) */
        PXT_TRY(linear(x, N, C, 4 * C, a->gelu, p->w[PXT_FCP_W], p->w[PXT_FCP_B], NULL, out));
        return be->dropout_forward(d, out, r, N, C, &x->drop_mlp_out, dt);
    }
    return linear(x, N, C, 4 * C, a->gelu, p->w[PXT_FCP_W], p->w[PXT_FCP_B], r, out);
}

/* ---- recomputation for checkpointing --------------------------------------- */

/* Brings back what the policy did not save; acts gets the pointers to use. */
static int recompute(const pxt_ctx *x, const pxt_block_params *p, const pxt_block_acts *saved,
                     const pxt_block_acts *work, pxt_ckpt policy, const void *inp,
                     pxt_block_acts *acts) {
    const pxt_backend *be = x->be;
    int d = x->dev, N = x->B * x->T, C = x->C;
    switch (policy) {
    case PXT_CKPT_NONE: *acts = *saved; return PXT_OK;
    case PXT_CKPT_SELECTIVE:
        /* layernorms and GELU from their saved inputs; the statistics come out
         * bit-identical to the saved ones (same kernel, same input), and so does
         * GELU: the forward of a selective block ran gelu_forward too (gelu_apart) */
        *acts = *saved;
        acts->ln1 = work->ln1;
        acts->ln2 = work->ln2;
        acts->gelu = work->gelu;
        PXT_TRY(be->layernorm_forward(d, acts->ln1, acts->mean1, acts->rstd1, inp, p->w[PXT_LN1_W],
                                      p->w[PXT_LN1_B], N, C, x->eps, x->dt));
        if (x->context) {
            acts->lnx = work->lnx;
            PXT_TRY(be->layernorm_forward(d, acts->lnx, acts->meanx, acts->rstdx, acts->x2,
                                          p->w[PXT_XLN_W], p->w[PXT_XLN_B], N, C, x->eps, x->dt));
        }
        PXT_TRY(be->layernorm_forward(d, acts->ln2, acts->mean2, acts->rstd2,
                                      x->context ? acts->x3 : acts->x2, p->w[PXT_LN2_W],
                                      p->w[PXT_LN2_B], N, C, x->eps, x->dt));
        return be->gelu_forward(d, acts->gelu, acts->fc, (size_t)N * 4 * C, x->dt);
    default: /* full: the whole block again, from its input */
        *acts = *work;
        return pxt_block_forward(x, p, acts, inp, NULL);
    }
}

/* ---- backward -------------------------------------------------------------- */

/* dres: dx3 on entry, dx2 on exit; dcontext +=. dA holds dxq (N, C), dB dxatt
 * then dlnx (N, C), x->dkv the context keys' and values' gradient (Nc, 2C). */
static int cross_backward(const pxt_ctx *x, const pxt_block_params *p, const pxt_block_grads *g,
                          const pxt_block_acts *a, void *dres, void *dA, void *dB) {
    const pxt_backend *be = x->be;
    int d = x->dev, N = x->B * x->T, Nc = x->B * x->Tc, C = x->C;
    pxt_dtype dt = x->dt;
    /* out: dxatt (N, C) = dx3 W_cp^T; dW_cp (C, C) += xatt^T dx3, db_cp += sum dx3 */
    PXT_TRY(
        be->gemm(d, 0, 1, N, C, C, 1.0f, dres, p->w[PXT_XPROJ_W], 0.0f, dB, dt, dt, x->gemm_ws));
    PXT_TRY(linear_dweight(x, N, C, C, a->xatt, dres, g->g[PXT_XPROJ_W], g->g[PXT_XPROJ_B]));
    /* attention: dxq (N, C) into dA, dk | dv (Nc, 2C) into dkv, laid out like xkv */
    pxt_attn_args args = pxt_block_cross_attn_args(x);
    PXT_TRY(be->attention_backward(d, &args, dA, x->dkv, at(x->dkv, (size_t)C, dt), dB, a->xq,
                                   a->xkv, at(a->xkv, (size_t)C, dt), a->xatt, a->xlse,
                                   x->attn_ws));
    /* queries: dlnx (N, C) = dxq W_q^T; dW_q (C, C) += lnx^T dxq, db_q += sum dxq */
    PXT_TRY(be->gemm(d, 0, 1, N, C, C, 1.0f, dA, p->w[PXT_XQ_W], 0.0f, dB, dt, dt, x->gemm_ws));
    PXT_TRY(linear_dweight(x, N, C, C, a->lnx, dA, g->g[PXT_XQ_W], g->g[PXT_XQ_B]));
    /* keys | values: dcontext (Nc, C) += dkv W_kv^T; dW_kv (C, 2C) += context^T dkv */
    PXT_TRY(be->gemm(d, 0, 1, Nc, C, 2 * C, 1.0f, x->dkv, p->w[PXT_XKV_W], 1.0f, x->dcontext, dt,
                     dt, x->gemm_ws));
    PXT_TRY(linear_dweight(x, Nc, 2 * C, C, x->context, x->dkv, g->g[PXT_XKV_W], g->g[PXT_XKV_B]));
    /* lnx: dx2 = dx3 + LNx'(dlnx), accumulated into dres */
    return be->layernorm_backward(d, dres, g->g[PXT_XLN_W], g->g[PXT_XLN_B], dB, a->x2,
                                  p->w[PXT_XLN_W], a->meanx, a->rstdx, N, C, dt, x->reduce_ws);
}

int pxt_block_backward(const pxt_ctx *x, const pxt_block_params *p, const pxt_block_grads *g,
                       const pxt_block_acts *saved, const pxt_block_acts *work, pxt_ckpt policy,
                       const void *inp, void *dres, void *dA, void *dB) {
    const pxt_backend *be = x->be;
    int d = x->dev, N = x->B * x->T, C = x->C;
    pxt_dtype dt = x->dt;
    pxt_block_acts a;
    PXT_TRY(recompute(x, p, saved, work, policy, inp, &a));
    /* the MLP branch's gradient: dy, or with dropout dy * mask (in dB, free until dln2) */
    const void *dy = dres;
    if (x->drop_mlp_out.p > 0.0f) {
        PXT_TRY(be->dropout_backward(d, dB, dres, N, C, &x->drop_mlp_out, dt));
        dy = dB;
    }
    /* MLP out: dfc (N, 4C) = (dy W_fcp^T) * gelu'(fc) and db_fc += sum dfc, one
     * product; dW_fcp (4C, C) += gelu^T dy and db_fcp += sum dy, another */
    pxt_gemm_args gd = {.trans_b = 1,
                        .M = N,
                        .N = 4 * C,
                        .K = C,
                        .alpha = 1.0f,
                        .A = dy,
                        .B = p->w[PXT_FCP_W],
                        .D = dA,
                        .dt_ab = dt,
                        .dt_c = dt,
                        .epilogue = PXT_EPI_DGELU_BGRAD,
                        .pre = a.fc,
                        .dbias = g->g[PXT_FC_B]};
    PXT_TRY(be->gemm_fused(d, &gd, x->gemm_ws));
    PXT_TRY(linear_dweight(x, N, C, 4 * C, a.gelu, dy, g->g[PXT_FCP_W], g->g[PXT_FCP_B]));
    /* MLP in: dln2 (N, C) = dfc W_fc^T; dW_fc (C, 4C) += ln2^T dfc (its bias is done) */
    PXT_TRY(be->gemm(d, 0, 1, N, C, 4 * C, 1.0f, dA, p->w[PXT_FC_W], 0.0f, dB, dt, dt, x->gemm_ws));
    PXT_TRY(linear_dweight(x, N, 4 * C, C, a.ln2, dA, g->g[PXT_FC_W], NULL));
    /* ln2: dr = dy + LN2'(dln2), accumulated into dres (r = x3 or x2) */
    PXT_TRY(be->layernorm_backward(d, dres, g->g[PXT_LN2_W], g->g[PXT_LN2_B], dB,
                                   x->context ? a.x3 : a.x2, p->w[PXT_LN2_W], a.mean2, a.rstd2, N,
                                   C, dt, x->reduce_ws));
    /* cross-attention: dres becomes dx2, dcontext accumulates */
    if (x->context) {
        PXT_TRY(cross_backward(x, p, g, &a, dres, dA, dB));
    }
    /* the attention branch's gradient: dx2, or with dropout dx2 * mask (in dA, free
     * until the attention's backward fills it) */
    const void *dx2 = dres;
    if (x->drop_attn_out.p > 0.0f) {
        PXT_TRY(be->dropout_backward(d, dA, dres, N, C, &x->drop_attn_out, dt));
        dx2 = dA;
    }
    /* attention out: datt (N, C) = dx2 W_proj^T; dW_proj (C, C) += att^T dx2, db += sum dx2 */
    PXT_TRY(be->gemm(d, 0, 1, N, C, C, 1.0f, dx2, p->w[PXT_PROJ_W], 0.0f, dB, dt, dt, x->gemm_ws));
    PXT_TRY(linear_dweight(x, N, C, C, a.att, dx2, g->g[PXT_PROJ_W], g->g[PXT_PROJ_B]));
    /* attention: dqkv (N, 3C) into dA, laid out like qkv */
    pxt_attn_args args = pxt_block_self_attn_args(x);
    PXT_TRY(be->attention_backward(d, &args, dA, at(dA, (size_t)C, dt), at(dA, 2 * (size_t)C, dt),
                                   dB, a.qkv, at(a.qkv, (size_t)C, dt),
                                   at(a.qkv, 2 * (size_t)C, dt), a.att, a.lse, x->attn_ws));
    /* QKV: dln1 (N, C) = dqkv W_attn^T; dW_attn (C, 3C) += ln1^T dqkv, db += sum dqkv */
    PXT_TRY(
        be->gemm(d, 0, 1, N, C, 3 * C, 1.0f, dA, p->w[PXT_ATTN_W], 0.0f, dB, dt, dt, x->gemm_ws));
    PXT_TRY(linear_dweight(x, N, 3 * C, C, a.ln1, dA, g->g[PXT_ATTN_W], g->g[PXT_ATTN_B]));
    /* ln1: dx = dx2 + LN1'(dln1), accumulated into dres */
    return be->layernorm_backward(d, dres, g->g[PXT_LN1_W], g->g[PXT_LN1_B], dB, inp,
                                  p->w[PXT_LN1_W], a.mean1, a.rstd1, N, C, dt, x->reduce_ws);
}
