/* block.c: the GPT-2 block's forward and backward (see block.h). */
#include <math.h>

#include "block.h"

#define TRY(call)                       \
    do {                                \
        int rc_ = (call);               \
        if (rc_ != PXT_OK)              \
            return rc_;                 \
    } while (0)

int pxt_ctx_check_ops(const pxt_backend *be, const char *dev) {
    struct {
        const void *fn;
        const char *name;
    } ops[] = {
        {(const void *)be->gemm, "gemm"},
        {(const void *)be->add_bias, "add_bias"},
        {(const void *)be->bias_backward, "bias_backward"},
        {(const void *)be->layernorm_forward, "layernorm_forward"},
        {(const void *)be->layernorm_backward, "layernorm_backward"},
        {(const void *)be->gelu_forward, "gelu_forward"},
        {(const void *)be->gelu_backward, "gelu_backward"},
        {(const void *)be->add, "add"},
        {(const void *)be->embedding_forward, "embedding_forward"},
        {(const void *)be->embedding_backward, "embedding_backward"},
        {(const void *)be->softmax_xent, "softmax_xent"},
        {(const void *)be->sum, "sum"},
        {(const void *)be->attention_forward, "attention_forward"},
        {(const void *)be->attention_backward, "attention_backward"},
        {(const void *)be->attention_workspace, "attention_workspace"},
    };
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        if (!ops[i].fn)
            return pxt_error(PXT_ERR_NOT_IMPLEMENTED,
                             "the %s backend has no '%s' kernel yet: training on %s is not "
                             "available in this version of pyxtts", be->name, ops[i].name, dev);
    return PXT_OK;
}

/* q, k, v are thirds of the (B, T, 3C) qkv rows; the output is (B, T, C). */
static pxt_attn_args attn_args(const pxt_ctx *x) {
    int64_t C = x->C, T = x->T, D = x->C / x->H;
    pxt_attn_args a = {
        .B = x->B, .H = x->H, .Tq = x->T, .Tk = x->T, .D = (int)D, .causal = 1,
        .scale = 1.0f / sqrtf((float)D), .key_mask = x->key_mask,
        .q = {T * 3 * C, D, 3 * C}, .k = {T * 3 * C, D, 3 * C}, .v = {T * 3 * C, D, 3 * C},
        .o = {T * C, D, C}, .dt = x->dt,
    };
    return a;
}

static char *at(const void *base, size_t elems, pxt_dtype dt) {
    return (char *)base + elems * pxt_dtype_size(dt);
}

/* ---- forward --------------------------------------------------------------- */

int pxt_block_forward(const pxt_ctx *x, const pxt_block_params *p, const pxt_block_acts *a,
                      const void *inp, void *out) {
    const pxt_backend *be = x->be;
    int d = x->dev, N = x->B * x->T, C = x->C;
    pxt_dtype dt = x->dt;
    size_t NC = (size_t)N * C;
    /* attention half: ln1 (N, C) -> qkv (N, 3C) -> att (N, C) -> x2 = x + proj */
    TRY(be->layernorm_forward(d, a->ln1, a->mean1, a->rstd1, inp, p->w[PXT_LN1_W],
                              p->w[PXT_LN1_B], N, C, x->eps, dt));
    TRY(be->gemm(d, 0, 0, N, 3 * C, C, 1.0f, a->ln1, p->w[PXT_ATTN_W], 0.0f, a->qkv, dt, dt,
                 x->gemm_ws));
    TRY(be->add_bias(d, a->qkv, p->w[PXT_ATTN_B], N, 3 * C, dt));
    pxt_attn_args args = attn_args(x);
    TRY(be->attention_forward(d, &args, a->att, a->lse, a->qkv, at(a->qkv, (size_t)C, dt),
                              at(a->qkv, 2 * (size_t)C, dt), x->attn_ws));
    /* the projection accumulates onto a copy of the residual: no (N, C) temporary */
    TRY(be->copy(d, a->x2, inp, NC * pxt_dtype_size(dt), PXT_COPY_D2D));
    TRY(be->gemm(d, 0, 0, N, C, C, 1.0f, a->att, p->w[PXT_PROJ_W], 1.0f, a->x2, dt, dt,
                 x->gemm_ws));
    TRY(be->add_bias(d, a->x2, p->w[PXT_PROJ_B], N, C, dt));
    /* MLP half: ln2 (N, C) -> fc (N, 4C) -> gelu (N, 4C) -> y = x2 + proj */
    TRY(be->layernorm_forward(d, a->ln2, a->mean2, a->rstd2, a->x2, p->w[PXT_LN2_W],
                              p->w[PXT_LN2_B], N, C, x->eps, dt));
    TRY(be->gemm(d, 0, 0, N, 4 * C, C, 1.0f, a->ln2, p->w[PXT_FC_W], 0.0f, a->fc, dt, dt,
                 x->gemm_ws));
    TRY(be->add_bias(d, a->fc, p->w[PXT_FC_B], N, 4 * C, dt));
    TRY(be->gelu_forward(d, a->gelu, a->fc, NC * 4, dt));
    if (!out)
        return PXT_OK;
    TRY(be->copy(d, out, a->x2, NC * pxt_dtype_size(dt), PXT_COPY_D2D));
    TRY(be->gemm(d, 0, 0, N, C, 4 * C, 1.0f, a->gelu, p->w[PXT_FCP_W], 1.0f, out, dt, dt,
                 x->gemm_ws));
    return be->add_bias(d, out, p->w[PXT_FCP_B], N, C, dt);
}

/* ---- recomputation for checkpointing --------------------------------------- */

/* Brings back what the policy did not save; acts gets the pointers to use. */
static int recompute(const pxt_ctx *x, const pxt_block_params *p, const pxt_block_acts *saved,
                     const pxt_block_acts *work, pxt_ckpt policy, const void *inp,
                     pxt_block_acts *acts) {
    const pxt_backend *be = x->be;
    int d = x->dev, N = x->B * x->T, C = x->C;
    switch (policy) {
    case PXT_CKPT_NONE:
        *acts = *saved;
        return PXT_OK;
    case PXT_CKPT_SELECTIVE:
        /* layernorms and GELU from their saved inputs; the statistics come out
         * bit-identical to the saved ones (same kernel, same input) */
        *acts = *saved;
        acts->ln1 = work->ln1;
        acts->ln2 = work->ln2;
        acts->gelu = work->gelu;
        TRY(be->layernorm_forward(d, acts->ln1, acts->mean1, acts->rstd1, inp, p->w[PXT_LN1_W],
                                  p->w[PXT_LN1_B], N, C, x->eps, x->dt));
        TRY(be->layernorm_forward(d, acts->ln2, acts->mean2, acts->rstd2, acts->x2,
                                  p->w[PXT_LN2_W], p->w[PXT_LN2_B], N, C, x->eps, x->dt));
        return be->gelu_forward(d, acts->gelu, acts->fc, (size_t)N * 4 * C, x->dt);
    default: /* full: the whole block again, from its input */
        *acts = *work;
        return pxt_block_forward(x, p, acts, inp, NULL);
    }
}

/* ---- backward -------------------------------------------------------------- */

int pxt_block_backward(const pxt_ctx *x, const pxt_block_params *p, const pxt_block_grads *g,
                       const pxt_block_acts *saved, const pxt_block_acts *work, pxt_ckpt policy,
                       const void *inp, void *dres, void *dA, void *dB) {
    const pxt_backend *be = x->be;
    int d = x->dev, N = x->B * x->T, C = x->C;
    pxt_dtype dt = x->dt, f32 = PXT_FLOAT32;
    pxt_block_acts a;
    TRY(recompute(x, p, saved, work, policy, inp, &a));
    /* MLP out: dgelu (N, 4C) = dy W_fcp^T; dW_fcp (4C, C) += gelu^T dy */
    TRY(be->gemm(d, 0, 1, N, 4 * C, C, 1.0f, dres, p->w[PXT_FCP_W], 0.0f, dA, dt, dt,
                 x->gemm_ws));
    TRY(be->gemm(d, 1, 0, 4 * C, C, N, 1.0f, a.gelu, dres, 1.0f, g->g[PXT_FCP_W], dt, f32,
                 x->gemm_ws));
    TRY(be->bias_backward(d, g->g[PXT_FCP_B], dres, N, C, dt));
    /* GELU, in place: dfc (N, 4C) */
    TRY(be->gelu_backward(d, dA, a.fc, dA, (size_t)N * 4 * C, dt));
    /* MLP in: dln2 (N, C) = dfc W_fc^T; dW_fc (C, 4C) += ln2^T dfc */
    TRY(be->gemm(d, 0, 1, N, C, 4 * C, 1.0f, dA, p->w[PXT_FC_W], 0.0f, dB, dt, dt, x->gemm_ws));
    TRY(be->gemm(d, 1, 0, C, 4 * C, N, 1.0f, a.ln2, dA, 1.0f, g->g[PXT_FC_W], dt, f32,
                 x->gemm_ws));
    TRY(be->bias_backward(d, g->g[PXT_FC_B], dA, N, 4 * C, dt));
    /* ln2: dx2 = dy + LN2'(dln2), accumulated into dres */
    TRY(be->layernorm_backward(d, dres, g->g[PXT_LN2_W], g->g[PXT_LN2_B], dB, a.x2,
                               p->w[PXT_LN2_W], a.mean2, a.rstd2, N, C, dt));
    /* attention out: datt (N, C) = dx2 W_proj^T; dW_proj (C, C) += att^T dx2 */
    TRY(be->gemm(d, 0, 1, N, C, C, 1.0f, dres, p->w[PXT_PROJ_W], 0.0f, dB, dt, dt, x->gemm_ws));
    TRY(be->gemm(d, 1, 0, C, C, N, 1.0f, a.att, dres, 1.0f, g->g[PXT_PROJ_W], dt, f32,
                 x->gemm_ws));
    TRY(be->bias_backward(d, g->g[PXT_PROJ_B], dres, N, C, dt));
    /* attention: dqkv (N, 3C) into dA, laid out like qkv */
    pxt_attn_args args = attn_args(x);
    TRY(be->attention_backward(d, &args, dA, at(dA, (size_t)C, dt), at(dA, 2 * (size_t)C, dt), dB,
                               a.qkv, at(a.qkv, (size_t)C, dt), at(a.qkv, 2 * (size_t)C, dt),
                               a.att, a.lse, x->attn_ws));
    /* QKV: dln1 (N, C) = dqkv W_attn^T; dW_attn (C, 3C) += ln1^T dqkv */
    TRY(be->gemm(d, 0, 1, N, C, 3 * C, 1.0f, dA, p->w[PXT_ATTN_W], 0.0f, dB, dt, dt,
                 x->gemm_ws));
    TRY(be->gemm(d, 1, 0, C, 3 * C, N, 1.0f, a.ln1, dA, 1.0f, g->g[PXT_ATTN_W], dt, f32,
                 x->gemm_ws));
    TRY(be->bias_backward(d, g->g[PXT_ATTN_B], dA, N, 3 * C, dt));
    /* ln1: dx = dx2 + LN1'(dln1), accumulated into dres */
    return be->layernorm_backward(d, dres, g->g[PXT_LN1_W], g->g[PXT_LN1_B], dB, inp,
                                  p->w[PXT_LN1_W], a.mean1, a.rstd1, N, C, dt);
}
