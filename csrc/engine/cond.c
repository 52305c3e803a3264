/* cond.c: the conditioning encoder and the perceiver, forward and backward (see cond.h). */
#include <math.h>
#include <string.h>

#include "cond.h"

#define INNER (PXT_PERC_HEADS * PXT_PERC_HEAD_DIM) /* 512: the perceiver's q, k, v width */

static char *at(const void *base, size_t elems, pxt_dtype dt) {
    return (char *)base + elems * pxt_dtype_size(dt);
}

/* ---- the activations one by one ----------------------------------------------- */

int pxt_enc_saves(pxt_ckpt policy, int act) {
    switch (policy) {
    case PXT_CKPT_NONE: return 1;
    case PXT_CKPT_SELECTIVE: return act != PXT_ENC_XN;
    default: return 0;
    }
}

int pxt_perc_saves(pxt_ckpt policy, int act) {
    switch (policy) {
    case PXT_CKPT_NONE: return 1;
    case PXT_CKPT_SELECTIVE: return act != PXT_PERC_G;
    default: return 0;
    }
}

size_t pxt_enc_act_bytes(const pxt_cond_ctx *x, int act) {
    size_t N = (size_t)x->B * (size_t)x->S, C = (size_t)x->C, es = pxt_dtype_size(x->dt);
    switch (act) {
    case PXT_ENC_MEAN:
    case PXT_ENC_RSTD: return (size_t)x->B * (size_t)x->G * sizeof(float);
    case PXT_ENC_XN:
    case PXT_ENC_ATT: return N * C * es;
    case PXT_ENC_QKV: return N * 3 * C * es;
    case PXT_ENC_LSE: return N * (size_t)x->H * sizeof(float);
    default: return 0;
    }
}

size_t pxt_perc_act_bytes(const pxt_cond_ctx *x, int act) {
    size_t Nn = (size_t)x->B * (size_t)x->Nl, es = pxt_dtype_size(x->dt);
    switch (act) {
    case PXT_PERC_Q:
    case PXT_PERC_ATT: return Nn * INNER * es;
    case PXT_PERC_KV: return (size_t)x->B * ((size_t)x->Nl + (size_t)x->S) * 2 * INNER * es;
    case PXT_PERC_LSE: return Nn * PXT_PERC_HEADS * sizeof(float);
    case PXT_PERC_MID: return Nn * (size_t)x->C * es;
    case PXT_PERC_U: return Nn * 2 * (size_t)x->ff * es;
    case PXT_PERC_G: return Nn * (size_t)x->ff * es;
    default: return 0;
    }
}

/* ---- attention calls and GEMM shapes --------------------------------------------- */

/* QKVAttentionLegacy: head h's q, k, v are channels [3hD, 3hD + D), [.. + D, .. + 2D),
 * [.. + 2D, .. + 3D) of each (B, S, 3C) qkv row; the output is (B, S, C), heads
 * side by side. */
pxt_attn_args pxt_enc_attn_args(const pxt_cond_ctx *x) {
    int64_t C = x->C, S = x->S, D = x->C / x->H;
    pxt_attn_args a = {
        .B = x->B,
        .H = x->H,
        .Tq = x->S,
        .Tk = x->S,
        .D = (int)D,
        .causal = 0,
        .scale = 1.0f / sqrtf((float)D),
        .q = {S * 3 * C, 3 * D, 3 * C},
        .k = {S * 3 * C, 3 * D, 3 * C},
        .v = {S * 3 * C, 3 * D, 3 * C},
        .o = {S * C, D, C},
        .dt = x->dt,
    };
    return a;
}

/* The latents' queries (B, Nl, 512) against keys | values (B, Nl + S, 1024). */
pxt_attn_args pxt_perc_attn_args(const pxt_cond_ctx *x) {
    int64_t Nl = x->Nl, Tk = (int64_t)x->Nl + x->S, D = PXT_PERC_HEAD_DIM;
    pxt_attn_args a = {
        .B = x->B,
        .H = PXT_PERC_HEADS,
        .Tq = x->Nl,
        .Tk = (int)Tk,
        .D = (int)D,
        .causal = 0,
        .scale = 1.0f / sqrtf((float)D),
        .q = {Nl * INNER, D, INNER},
        .k = {Tk * 2 * INNER, D, 2 * INNER},
        .v = {Tk * 2 * INNER, D, 2 * INNER},
        .o = {Nl * INNER, D, INNER},
        .dt = x->dt,
    };
    return a;
}

int pxt_cond_gemm_shapes(const pxt_cond_ctx *x, int shapes[][3]) {
    const int C = x->C, S = x->S, Nl = x->Nl, F = x->ff, N = x->B * x->S, Nn = x->B * x->Nl;
    const int M = PXT_MEL_CHANNELS, Q = INNER, KV = 2 * INNER;
    const int all[][3] = {
        {S, C, M},      {C, M, S},                                   /* init conv */
        {N, 3 * C, C},  {N, C, C},   {C, C, N},      {N, C, 3 * C},  /* encoder block */
        {3 * C, C, N},                                               /* .. */
        {Nn, Q, C},     {Nl, KV, C}, {S, KV, C},     {Nn, C, Q},     /* perceiver fwd */
        {Nn, 2 * F, C}, {Nn, C, F},                                  /* .. */
        {Nn, F, C},     {C, F, Nn},  {Nn, C, 2 * F}, {2 * F, C, Nn}, /* perceiver bwd */
        {Nn, Q, C},     {C, Q, Nn},  {Nn, C, Q},     {Nl, C, KV},    /* .. */
        {Q, C, Nn},     {KV, C, Nl}, {KV, C, S},     {S, C, KV},     /* .. */
    };
    int n = (int)(sizeof all / sizeof all[0]);
    memcpy(shapes, all, sizeof all);
    return n;
}

int pxt_cond_colsum_shapes(const pxt_cond_ctx *x, int shapes[][2]) {
    const int C = x->C, N = x->B * x->S, Nn = x->B * x->Nl;
    const int all[PXT_COND_COLSUMS_MAX][2] = {
        {N, C},            /* the init conv's and the blocks' proj_out biases */
        {N, 3 * C},        /* the blocks' qkv biases */
        {Nn, C},           /* the feed-forwards' output biases */
        {Nn, 2 * x->ff},   /* the feed-forwards' input biases */
        {x->B, x->Nl * C}, /* the latents, shared by the samples */
    };
    memcpy(shapes, all, sizeof all);
    return PXT_COND_COLSUMS_MAX;
}

void pxt_cond_views(const pxt_flat *f, pxt_cond_params *p, pxt_cond_grads *g) {
    for (int j = 0; j < PXT_COND_TENSORS; j++) {
        p->w[j] = pxt_flat_param(f, f->layout.cond0 + j);
        g->g[j] = pxt_flat_grad(f, f->layout.cond0 + j);
    }
}

/* ---- the encoder's input conv ------------------------------------------------------ */

int pxt_cond_init_forward(const pxt_cond_ctx *x, const pxt_cond_params *p, const void *mel,
                          void *h0) {
    const pxt_backend *be = x->be;
    int d = x->dev, S = x->S, C = x->C;
    pxt_dtype dt = x->dt;
    /* per sample: h0_b (S, C) = mel_b^T (S, 80) W^T (80, C) */
    for (int b = 0; b < x->B; b++) {
        PXT_TRY(be->gemm(d, 1, 1, S, C, PXT_MEL_CHANNELS, 1.0f,
                         at(mel, (size_t)b * PXT_MEL_CHANNELS * S, dt), p->w[PXT_CE_INIT_W], 0.0f,
                         at(h0, (size_t)b * S * C, dt), dt, dt, x->gemm_ws));
    }
    return be->add_bias(d, h0, p->w[PXT_CE_INIT_B], x->B * S, C, dt);
}

int pxt_cond_init_backward(const pxt_cond_ctx *x, const pxt_cond_params *p, const pxt_cond_grads *g,
                           const void *mel, const void *dh0) {
    const pxt_backend *be = x->be;
    int d = x->dev, S = x->S, C = x->C;
    pxt_dtype dt = x->dt;
    (void)p;
    /* dW (C, 80) += sum_b dh0_b^T (C, S) mel_b^T (S, 80) */
    for (int b = 0; b < x->B; b++) {
        PXT_TRY(be->gemm(d, 1, 1, C, PXT_MEL_CHANNELS, S, 1.0f, at(dh0, (size_t)b * S * C, dt),
                         at(mel, (size_t)b * PXT_MEL_CHANNELS * S, dt), 1.0f, g->g[PXT_CE_INIT_W],
                         dt, PXT_FLOAT32, x->gemm_ws));
    }
    return be->bias_backward(d, g->g[PXT_CE_INIT_B], dh0, x->B * S, C, C, dt, x->reduce_ws);
}

/* ---- an encoder block --------------------------------------------------------------- */

int pxt_enc_forward(const pxt_cond_ctx *x, const pxt_cond_params *p, int k, const pxt_enc_acts *a,
                    const void *h, void *y) {
    const pxt_backend *be = x->be;
    const void *const *w = p->w + PXT_CE_BLOCK0 + k * PXT_CB_TENSORS;
    int d = x->dev, N = x->B * x->S, C = x->C, D = x->C / x->H;
    pxt_dtype dt = x->dt;
    void *xn = a->a[PXT_ENC_XN], *qkv = a->a[PXT_ENC_QKV], *att = a->a[PXT_ENC_ATT];
    /* xn (N, C) = GroupNorm(h); qkv (N, 3C) = xn W^T + b */
    PXT_TRY(be->groupnorm_forward(d, xn, a->a[PXT_ENC_MEAN], a->a[PXT_ENC_RSTD], h,
                                  w[PXT_CB_NORM_W], w[PXT_CB_NORM_B], x->B, x->S, C, x->G,
                                  PXT_GROUPNORM_EPS, dt));
    PXT_TRY(
        be->gemm(d, 0, 1, N, 3 * C, C, 1.0f, xn, w[PXT_CB_QKV_W], 0.0f, qkv, dt, dt, x->gemm_ws));
    PXT_TRY(be->add_bias(d, qkv, w[PXT_CB_QKV_B], N, 3 * C, dt));
    /* att (N, C): every frame attends to every frame */
    pxt_attn_args args = pxt_enc_attn_args(x);
    PXT_TRY(be->attention_forward(d, &args, att, a->a[PXT_ENC_LSE], qkv, at(qkv, (size_t)D, dt),
                                  at(qkv, 2 * (size_t)D, dt), x->attn_ws));
    if (!y) {
        return PXT_OK;
    }
    /* y (N, C) = xn + att W_proj^T + b: onto a copy of the normed input */
    PXT_TRY(be->copy(d, y, xn, (size_t)N * C * pxt_dtype_size(dt), PXT_COPY_D2D));
    PXT_TRY(be->gemm(d, 0, 1, N, C, C, 1.0f, att, w[PXT_CB_PROJ_W], 1.0f, y, dt, dt, x->gemm_ws));
    return be->add_bias(d, y, w[PXT_CB_PROJ_B], N, C, dt);
}

/* Brings back what the policy did not save; *a gets the pointers to use. */
static int enc_recompute(const pxt_cond_ctx *x, const pxt_cond_params *p, int k,
                         const pxt_enc_acts *saved, const pxt_enc_acts *work, pxt_ckpt policy,
                         const void *h, pxt_enc_acts *a) {
    const void *const *w = p->w + PXT_CE_BLOCK0 + k * PXT_CB_TENSORS;
    switch (policy) {
    case PXT_CKPT_NONE: *a = *saved; return PXT_OK;
    case PXT_CKPT_SELECTIVE: /* the norm's output, statistics bit-identical to the saved */
        *a = *saved;
        a->a[PXT_ENC_XN] = work->a[PXT_ENC_XN];
        return x->be->groupnorm_forward(x->dev, a->a[PXT_ENC_XN], a->a[PXT_ENC_MEAN],
                                        a->a[PXT_ENC_RSTD], h, w[PXT_CB_NORM_W], w[PXT_CB_NORM_B],
                                        x->B, x->S, x->C, x->G, PXT_GROUPNORM_EPS, x->dt);
    default: *a = *work; return pxt_enc_forward(x, p, k, a, h, NULL);
    }
}

int pxt_enc_backward(const pxt_cond_ctx *x, const pxt_cond_params *p, const pxt_cond_grads *g,
                     int k, const pxt_enc_acts *saved, const pxt_enc_acts *work, pxt_ckpt policy,
                     const void *h, void *dy, void *dh, void *datt, void *dqkv) {
    const pxt_backend *be = x->be;
    const void *const *w = p->w + PXT_CE_BLOCK0 + k * PXT_CB_TENSORS;
    float *const *gw = g->g + PXT_CE_BLOCK0 + k * PXT_CB_TENSORS;
    int d = x->dev, N = x->B * x->S, C = x->C, D = x->C / x->H;
    pxt_dtype dt = x->dt, f32 = PXT_FLOAT32;
    pxt_enc_acts a;
    PXT_TRY(enc_recompute(x, p, k, saved, work, policy, h, &a));
    const void *xn = a.a[PXT_ENC_XN], *qkv = a.a[PXT_ENC_QKV], *att = a.a[PXT_ENC_ATT];
    /* proj: datt (N, C) = dy W_proj; dW_proj (C, C) += dy^T att */
    PXT_TRY(be->gemm(d, 0, 0, N, C, C, 1.0f, dy, w[PXT_CB_PROJ_W], 0.0f, datt, dt, dt, x->gemm_ws));
    PXT_TRY(
        be->gemm(d, 1, 0, C, C, N, 1.0f, dy, att, 1.0f, gw[PXT_CB_PROJ_W], dt, f32, x->gemm_ws));
    PXT_TRY(be->bias_backward(d, gw[PXT_CB_PROJ_B], dy, N, C, C, dt, x->reduce_ws));
    /* attention: dqkv (N, 3C), laid out like qkv */
    pxt_attn_args args = pxt_enc_attn_args(x);
    PXT_TRY(be->attention_backward(d, &args, dqkv, at(dqkv, (size_t)D, dt),
                                   at(dqkv, 2 * (size_t)D, dt), datt, qkv, at(qkv, (size_t)D, dt),
                                   at(qkv, 2 * (size_t)D, dt), att, a.a[PXT_ENC_LSE], x->attn_ws));
    /* qkv: dxn = dy (the residual) + dqkv W_qkv, in place; dW_qkv (3C, C) += dqkv^T xn */
    PXT_TRY(
        be->gemm(d, 0, 0, N, C, 3 * C, 1.0f, dqkv, w[PXT_CB_QKV_W], 1.0f, dy, dt, dt, x->gemm_ws));
    PXT_TRY(be->gemm(d, 1, 0, 3 * C, C, N, 1.0f, dqkv, xn, 1.0f, gw[PXT_CB_QKV_W], dt, f32,
                     x->gemm_ws));
    PXT_TRY(be->bias_backward(d, gw[PXT_CB_QKV_B], dqkv, N, 3 * C, 3 * C, dt, x->reduce_ws));
    /* norm: dh += GroupNorm'(dxn) */
    return be->groupnorm_backward(d, dh, gw[PXT_CB_NORM_W], gw[PXT_CB_NORM_B], dy, h,
                                  w[PXT_CB_NORM_W], a.a[PXT_ENC_MEAN], a.a[PXT_ENC_RSTD], x->B,
                                  x->S, C, x->G, dt, x->reduce_ws);
}

/* ---- a perceiver layer -------------------------------------------------------------- */

int pxt_perc_forward(const pxt_cond_ctx *x, const pxt_cond_params *p, int l, const pxt_perc_acts *a,
                     const void *lat, const void *context, void *out) {
    const pxt_backend *be = x->be;
    const void *const *w = p->w + PXT_CP_LAYER0 + l * PXT_PL_TENSORS;
    int d = x->dev, C = x->C, S = x->S, Nl = x->Nl, F = x->ff, Nn = x->B * x->Nl;
    pxt_dtype dt = x->dt;
    size_t es = pxt_dtype_size(dt);
    void *q = a->a[PXT_PERC_Q], *kv = a->a[PXT_PERC_KV], *att = a->a[PXT_PERC_ATT];
    void *mid = a->a[PXT_PERC_MID], *u = a->a[PXT_PERC_U], *g = a->a[PXT_PERC_G];
    /* q (Nn, 512) = lat W_q^T; per sample kv_b (Nl + S, 1024) = [lat_b | context_b] W_kv^T */
    PXT_TRY(be->gemm(d, 0, 1, Nn, INNER, C, 1.0f, lat, w[PXT_PL_Q_W], 0.0f, q, dt, dt, x->gemm_ws));
    for (int b = 0; b < x->B; b++) {
        char *kvb = at(kv, (size_t)b * (Nl + S) * 2 * INNER, dt);
        PXT_TRY(be->gemm(d, 0, 1, Nl, 2 * INNER, C, 1.0f, at(lat, (size_t)b * Nl * C, dt),
                         w[PXT_PL_KV_W], 0.0f, kvb, dt, dt, x->gemm_ws));
        PXT_TRY(be->gemm(d, 0, 1, S, 2 * INNER, C, 1.0f, at(context, (size_t)b * S * C, dt),
                         w[PXT_PL_KV_W], 0.0f, at(kvb, (size_t)Nl * 2 * INNER, dt), dt, dt,
                         x->gemm_ws));
    }
    /* att (Nn, 512); mid (Nn, C) = lat + att W_out^T */
    pxt_attn_args args = pxt_perc_attn_args(x);
    PXT_TRY(be->attention_forward(d, &args, att, a->a[PXT_PERC_LSE], q, kv, at(kv, INNER, dt),
                                  x->attn_ws));
    PXT_TRY(be->copy(d, mid, lat, (size_t)Nn * C * es, PXT_COPY_D2D));
    PXT_TRY(
        be->gemm(d, 0, 1, Nn, C, INNER, 1.0f, att, w[PXT_PL_OUT_W], 1.0f, mid, dt, dt, x->gemm_ws));
    /* feed-forward: u (Nn, 2F) = mid W_1^T + b_1; g (Nn, F) = GEGLU(u) */
    PXT_TRY(
        be->gemm(d, 0, 1, Nn, 2 * F, C, 1.0f, mid, w[PXT_PL_FF1_W], 0.0f, u, dt, dt, x->gemm_ws));
    PXT_TRY(be->add_bias(d, u, w[PXT_PL_FF1_B], Nn, 2 * F, dt));
    PXT_TRY(be->geglu_forward(d, g, u, Nn, F, dt));
    if (!out) {
        return PXT_OK;
    }
    /* out (Nn, C) = mid + g W_2^T + b_2 */
    PXT_TRY(be->copy(d, out, mid, (size_t)Nn * C * es, PXT_COPY_D2D));
    PXT_TRY(be->gemm(d, 0, 1, Nn, C, F, 1.0f, g, w[PXT_PL_FF2_W], 1.0f, out, dt, dt, x->gemm_ws));
    return be->add_bias(d, out, w[PXT_PL_FF2_B], Nn, C, dt);
}

static int perc_recompute(const pxt_cond_ctx *x, const pxt_cond_params *p, int l,
                          const pxt_perc_acts *saved, const pxt_perc_acts *work, pxt_ckpt policy,
                          const void *lat, const void *context, pxt_perc_acts *a) {
    switch (policy) {
    case PXT_CKPT_NONE: *a = *saved; return PXT_OK;
    case PXT_CKPT_SELECTIVE: /* GEGLU's output from its saved input */
        *a = *saved;
        a->a[PXT_PERC_G] = work->a[PXT_PERC_G];
        return x->be->geglu_forward(x->dev, a->a[PXT_PERC_G], a->a[PXT_PERC_U], x->B * x->Nl, x->ff,
                                    x->dt);
    default: *a = *work; return pxt_perc_forward(x, p, l, a, lat, context, NULL);
    }
}

int pxt_perc_backward(const pxt_cond_ctx *x, const pxt_cond_params *p, const pxt_cond_grads *g,
                      int l, const pxt_perc_acts *saved, const pxt_perc_acts *work, pxt_ckpt policy,
                      const void *lat, const void *context, void *dl, void *dcontext,
                      const pxt_perc_scratch *s) {
    const pxt_backend *be = x->be;
    const void *const *w = p->w + PXT_CP_LAYER0 + l * PXT_PL_TENSORS;
    float *const *gw = g->g + PXT_CP_LAYER0 + l * PXT_PL_TENSORS;
    int d = x->dev, C = x->C, S = x->S, Nl = x->Nl, F = x->ff, Nn = x->B * x->Nl;
    pxt_dtype dt = x->dt, f32 = PXT_FLOAT32;
    pxt_perc_acts a;
    PXT_TRY(perc_recompute(x, p, l, saved, work, policy, lat, context, &a));
    /* feed-forward out: dg (Nn, F) = dout W_2; dW_2 (C, F) += dout^T g */
    PXT_TRY(
        be->gemm(d, 0, 0, Nn, F, C, 1.0f, dl, w[PXT_PL_FF2_W], 0.0f, s->dg, dt, dt, x->gemm_ws));
    PXT_TRY(be->gemm(d, 1, 0, C, F, Nn, 1.0f, dl, a.a[PXT_PERC_G], 1.0f, gw[PXT_PL_FF2_W], dt, f32,
                     x->gemm_ws));
    PXT_TRY(be->bias_backward(d, gw[PXT_PL_FF2_B], dl, Nn, C, C, dt, x->reduce_ws));
    /* GEGLU, then feed-forward in: dmid = dout + du W_1 (in place); dW_1 (2F, C) += du^T mid */
    PXT_TRY(be->geglu_backward(d, s->du, a.a[PXT_PERC_U], s->dg, Nn, F, dt));
    PXT_TRY(be->gemm(d, 0, 0, Nn, C, 2 * F, 1.0f, s->du, w[PXT_PL_FF1_W], 1.0f, dl, dt, dt,
                     x->gemm_ws));
    PXT_TRY(be->gemm(d, 1, 0, 2 * F, C, Nn, 1.0f, s->du, a.a[PXT_PERC_MID], 1.0f, gw[PXT_PL_FF1_W],
                     dt, f32, x->gemm_ws));
    PXT_TRY(be->bias_backward(d, gw[PXT_PL_FF1_B], s->du, Nn, 2 * F, 2 * F, dt, x->reduce_ws));
    /* attention out: datt (Nn, 512) = dmid W_out; dW_out (C, 512) += dmid^T att */
    PXT_TRY(be->gemm(d, 0, 0, Nn, INNER, C, 1.0f, dl, w[PXT_PL_OUT_W], 0.0f, s->datt, dt, dt,
                     x->gemm_ws));
    PXT_TRY(be->gemm(d, 1, 0, C, INNER, Nn, 1.0f, dl, a.a[PXT_PERC_ATT], 1.0f, gw[PXT_PL_OUT_W], dt,
                     f32, x->gemm_ws));
    /* attention: dq (Nn, 512), dkv (B, Nl + S, 1024) laid out like kv */
    void *kv = a.a[PXT_PERC_KV];
    pxt_attn_args args = pxt_perc_attn_args(x);
    PXT_TRY(be->attention_backward(d, &args, s->dq, s->dkv, at(s->dkv, INNER, dt), s->datt,
                                   a.a[PXT_PERC_Q], kv, at(kv, INNER, dt), a.a[PXT_PERC_ATT],
                                   a.a[PXT_PERC_LSE], x->attn_ws));
    /* queries: dlat = dmid + dq W_q; dW_q (512, C) += dq^T lat */
    PXT_TRY(
        be->gemm(d, 0, 0, Nn, C, INNER, 1.0f, s->dq, w[PXT_PL_Q_W], 1.0f, dl, dt, dt, x->gemm_ws));
    PXT_TRY(be->gemm(d, 1, 0, INNER, C, Nn, 1.0f, s->dq, lat, 1.0f, gw[PXT_PL_Q_W], dt, f32,
                     x->gemm_ws));
    /* keys | values, per sample: dlat_b += dkv_lat W_kv, dcontext_b += dkv_ctx W_kv,
     * dW_kv (1024, C) += dkv_lat^T lat_b + dkv_ctx^T context_b */
    for (int b = 0; b < x->B; b++) {
        const char *dkl = at(s->dkv, (size_t)b * (Nl + S) * 2 * INNER, dt);
        const char *dkc = at(dkl, (size_t)Nl * 2 * INNER, dt);
        const char *latb = at(lat, (size_t)b * Nl * C, dt);
        const char *ctxb = at(context, (size_t)b * S * C, dt);
        PXT_TRY(be->gemm(d, 0, 0, Nl, C, 2 * INNER, 1.0f, dkl, w[PXT_PL_KV_W], 1.0f,
                         at(dl, (size_t)b * Nl * C, dt), dt, dt, x->gemm_ws));
        PXT_TRY(be->gemm(d, 0, 0, S, C, 2 * INNER, 1.0f, dkc, w[PXT_PL_KV_W], 1.0f,
                         at(dcontext, (size_t)b * S * C, dt), dt, dt, x->gemm_ws));
        PXT_TRY(be->gemm(d, 1, 0, 2 * INNER, C, Nl, 1.0f, dkl, latb, 1.0f, gw[PXT_PL_KV_W], dt, f32,
                         x->gemm_ws));
        PXT_TRY(be->gemm(d, 1, 0, 2 * INNER, C, S, 1.0f, dkc, ctxb, 1.0f, gw[PXT_PL_KV_W], dt, f32,
                         x->gemm_ws));
    }
    return PXT_OK;
}

#undef INNER
