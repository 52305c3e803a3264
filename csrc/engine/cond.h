/* cond.h: XTTS v2's conditioning path, forward and backward, on buffers.
 *
 * From the mel spectrogram of a reference slice to the latents the GPT sees
 * first, as Coqui's GPT computes them (get_style_emb):
 *
 *   conditioning_encoder
 *     h0 (B, S, C) = conv1x1(mel (B, 80, S))                     init: W (C, 80, 1), b
 *     6 attention blocks, h -> y:
 *       xn = GroupNorm(h)           G groups, statistics fp32, eps 1e-5
 *       qkv = xn W_qkv^T + b        (B, S, 3C); channels head by head, [q | k | v]
 *                                   inside a head (QKVAttentionLegacy)
 *       att = attention(q, k, v)    every frame sees every frame, no mask,
 *                                   scale 1/sqrt(C/H) (Coqui: ch^-1/4 on q and on k)
 *       y = xn + att W_proj^T + b   the residual is added to the normed input
 *   conditioning_perceiver (context = h6)
 *     lat0 = latents (Nl, C) for every sample; 2 layers, lat -> out:
 *       q = lat W_q^T                         (B, Nl, 512): 8 heads of 64
 *       kv = [lat | context] W_kv^T           (B, Nl + S, 1024): keys | values
 *       mid = lat + attention(q, k, v) W_out^T        (scale 1/8, no mask)
 *       u = mid W_1^T + b_1 (B, Nl, 2F); g = u[:F] * gelu(u[F:]) (exact GELU)
 *       out = mid + g W_2^T + b_2                      F = int(8C / 3)
 *     cond = lat2 / max(|lat2|, 1e-12) * sqrt(C) * gamma         (B, Nl, C)
 *
 * No dropout: Coqui's conditioning_dropout is never applied and the perceiver's
 * attention dropout is 0. Activations are (rows, channels) like the GPT's
 * (torch's (B, C, S) transposed), so a 1x1 conv is a GEMM with the weight
 * (out, in) transposed. The caller owns every buffer (the step's arena); a
 * function allocates nothing. No Python here. */
#ifndef PXT_COND_H
#define PXT_COND_H

#include "block.h"
#include "flat.h"

#define PXT_GROUPNORM_EPS 1e-5f /* torch.nn.GroupNorm's default */
#define PXT_RMSNORM_EPS 1e-12f  /* F.normalize's default */

/* What every op of the path shares. */
typedef struct {
    const pxt_backend *be;
    int dev;
    pxt_dtype dt;
    int B, S, C; /* samples, mel frames, d_model */
    int H, G;    /* the encoder's heads (the GPT's n_heads) and GroupNorm groups */
    int Nl, ff;  /* latents, the perceiver's feed-forward inner width F */
    void *attn_ws, *gemm_ws, *reduce_ws;
} pxt_cond_ctx;

/* Parameter pointers (dtype dt) and their fp32 gradients, by layout.h's enums. */
typedef struct {
    const void *w[PXT_COND_TENSORS];
} pxt_cond_params;
typedef struct {
    float *g[PXT_COND_TENSORS];
} pxt_cond_grads;

/* An encoder block's activations. */
enum {
    PXT_ENC_MEAN, /* (B, G) fp32 */
    PXT_ENC_RSTD, /* (B, G) fp32 */
    PXT_ENC_XN,   /* (B*S, C) GroupNorm's output */
    PXT_ENC_QKV,  /* (B*S, 3C) */
    PXT_ENC_ATT,  /* (B*S, C) */
    PXT_ENC_LSE,  /* (B, H, S) fp32 */
    PXT_ENC_ACTS
};
/* A perceiver layer's activations. */
enum {
    PXT_PERC_Q,   /* (B*Nl, 512) */
    PXT_PERC_KV,  /* (B, Nl + S, 1024) */
    PXT_PERC_ATT, /* (B*Nl, 512) */
    PXT_PERC_LSE, /* (B, 8, Nl) fp32 */
    PXT_PERC_MID, /* (B*Nl, C) after the attention's residual */
    PXT_PERC_U,   /* (B*Nl, 2F) */
    PXT_PERC_G,   /* (B*Nl, F) GEGLU's output */
    PXT_PERC_ACTS
};
typedef struct {
    void *a[PXT_ENC_ACTS];
} pxt_enc_acts;
typedef struct {
    void *a[PXT_PERC_ACTS];
} pxt_perc_acts;

/* What a policy saves (like block.h's): none all, selective all but the norm's
 * output and GEGLU's, full nothing (the block inputs are kept by the caller). */
int pxt_enc_saves(pxt_ckpt policy, int act);
int pxt_perc_saves(pxt_ckpt policy, int act);
size_t pxt_enc_act_bytes(const pxt_cond_ctx *x, int act);
size_t pxt_perc_act_bytes(const pxt_cond_ctx *x, int act);

/* The attention calls (for workspace sizes): an encoder block's, a perceiver layer's. */
pxt_attn_args pxt_enc_attn_args(const pxt_cond_ctx *x);
pxt_attn_args pxt_perc_attn_args(const pxt_cond_ctx *x);
/* (M, N, K) of every GEMM of the path, forward and backward; shapes holds
 * PXT_COND_GEMMS_MAX. */
#define PXT_COND_GEMMS_MAX 28
int pxt_cond_gemm_shapes(const pxt_cond_ctx *x, int shapes[][3]);
/* (rows, cols) of every column sum of its backward (the biases' and the
 * latents'), for the reduction workspace; shapes holds PXT_COND_COLSUMS_MAX. */
#define PXT_COND_COLSUMS_MAX 5
int pxt_cond_colsum_shapes(const pxt_cond_ctx *x, int shapes[][2]);

/* The parameters of a model's flat state (tensors from layout.cond0). */
void pxt_cond_views(const pxt_flat *f, pxt_cond_params *p, pxt_cond_grads *g);

/* h0 (B*S, C) = the encoder's 1x1 conv of mel (B, 80, S). */
int pxt_cond_init_forward(const pxt_cond_ctx *x, const pxt_cond_params *p, const void *mel,
                          void *h0);
/* The init conv's gradients from dh0 (B*S, C). */
int pxt_cond_init_backward(const pxt_cond_ctx *x, const pxt_cond_params *p, const pxt_cond_grads *g,
                           const void *mel, const void *dh0);

/* Encoder block k: y (B*S, C) = block(h); activations into a. y NULL: only
 * the activations (recomputation). */
int pxt_enc_forward(const pxt_cond_ctx *x, const pxt_cond_params *p, int k, const pxt_enc_acts *a,
                    const void *h, void *y);
/* dy (B*S, C) is overwritten (it becomes dxn); dh (B*S, C) += the input's
 * gradient. What the policy did not save is recomputed into work. datt (B*S, C)
 * and dqkv (B*S, 3C) are scratch. */
int pxt_enc_backward(const pxt_cond_ctx *x, const pxt_cond_params *p, const pxt_cond_grads *g,
                     int k, const pxt_enc_acts *saved, const pxt_enc_acts *work, pxt_ckpt policy,
                     const void *h, void *dy, void *dh, void *datt, void *dqkv);

/* Perceiver layer l: out (B*Nl, C) = layer(lat, context (B*S, C)); out NULL:
 * only the activations (recomputation). */
int pxt_perc_forward(const pxt_cond_ctx *x, const pxt_cond_params *p, int l, const pxt_perc_acts *a,
                     const void *lat, const void *context, void *out);
/* dl (B*Nl, C): dout on entry, dlat on exit; dcontext (B*S, C) +=. Scratch:
 * dg (B*Nl, F), du (B*Nl, 2F), datt, dq (B*Nl, 512), dkv (B, Nl + S, 1024). */
typedef struct {
    void *dg, *du, *datt, *dq, *dkv;
} pxt_perc_scratch;
int pxt_perc_backward(const pxt_cond_ctx *x, const pxt_cond_params *p, const pxt_cond_grads *g,
                      int l, const pxt_perc_acts *saved, const pxt_perc_acts *work, pxt_ckpt policy,
                      const void *lat, const void *context, void *dl, void *dcontext,
                      const pxt_perc_scratch *s);

#endif /* PXT_COND_H */
