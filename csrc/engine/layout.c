/* layout.c: the XTTS GPT's config rules and parameter layouts (see layout.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layout.h"

#define ALIGN_ELEMS 64 /* 256 bytes of fp32: every tensor starts aligned */

static const char *block_suffix[PXT_BLOCK_TENSORS] = {
    "ln_1.weight",        "ln_1.bias",        "attn.c_attn.weight", "attn.c_attn.bias",
    "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight",        "ln_2.bias",
    "mlp.c_fc.weight",    "mlp.c_fc.bias",    "mlp.c_proj.weight",  "mlp.c_proj.bias",
};

/* Appends a tensor of shape (d0), (d0, d1) or (d0, d1, d2); returns its index. */
static int add_nd(pxt_param_layout *l, int cap, const char *name, int ndim, const int64_t *shape,
                  int decay, int init) {
    if (l->count >= cap) {
        return -1;
    }
    pxt_param_info *p = &l->params[l->count];
    snprintf(p->name, sizeof p->name, "%s", name);
    p->ndim = ndim;
    p->numel = 1;
    for (int i = 0; i < PXT_PARAM_DIMS; i++) {
        p->shape[i] = i < ndim ? shape[i] : 1;
        p->numel *= (size_t)p->shape[i];
    }
    p->offset = l->numel;
    p->decay = decay;
    p->init = init;
    p->fan_in = ndim > 1 ? (int)(p->numel / (size_t)shape[0]) : 0;
    l->numel += (p->numel + ALIGN_ELEMS - 1) / ALIGN_ELEMS * ALIGN_ELEMS;
    return l->count++;
}

/* A GPT-2 tensor of 1 or 2 dims: matrices N(0, 0.02) (resid: the residual
 * projections' std), 1-d weights ones, biases zeros. */
static int add(pxt_param_layout *l, int cap, const char *name, int ndim, int64_t d0, int64_t d1,
               int decay) {
    const int64_t shape[2] = {d0, d1};
    size_t len = strlen(name);
    int init = ndim == 2                                       ? PXT_INIT_NORMAL
               : len > 7 && !strcmp(name + len - 7, ".weight") ? PXT_INIT_ONES
                                                               : PXT_INIT_ZEROS;
    if (ndim == 2 && (strstr(name, "attn.c_proj.weight") || strstr(name, "mlp.c_proj.weight"))) {
        init = PXT_INIT_RESID;
    }
    return add_nd(l, cap, name, ndim, shape, decay, init);
}

/* The 12 tensors of a block, named prefix + suffix; returns the first index. */
static int add_block(pxt_param_layout *l, int cap, const char *prefix, int64_t C) {
    char name[PXT_NAME_LEN];
    int first = -1;
    static const int shape_kind[PXT_BLOCK_TENSORS][3] = {
        /* ndim, rows (in units of C), cols (in units of C) */
        {1, 1, 0}, {1, 1, 0}, {2, 1, 3}, {1, 3, 0}, {2, 1, 1}, {1, 1, 0},
        {1, 1, 0}, {1, 1, 0}, {2, 1, 4}, {1, 4, 0}, {2, 4, 1}, {1, 1, 0},
    };
    for (int j = 0; j < PXT_BLOCK_TENSORS; j++) {
        snprintf(name, sizeof name, "%s%s", prefix, block_suffix[j]);
        int nd = shape_kind[j][0];
        int i = add(l, cap, name, nd, shape_kind[j][1] * C, shape_kind[j][2] * C, nd == 2);
        if (i < 0) {
            return -1;
        }
        if (j == 0) {
            first = i;
        }
    }
    return first;
}

/* The conditioning path's 54 tensors (see layout.h), torch's initialisation:
 * Linear and Conv1d weights and biases U(+-1/sqrt(fan_in)), the blocks' proj_out
 * zeros, GroupNorm and RMS norm gains ones, the latents N(0, 0.02). */
static int add_conditioning(pxt_param_layout *l, int cap, const pxt_gpt_config *c) {
    char name[PXT_NAME_LEN];
    const int64_t C = c->d_model, I = pxt_cond_ff_inner(c->d_model);
    const int64_t inner = PXT_PERC_HEADS * PXT_PERC_HEAD_DIM;
    const int64_t init_w[3] = {C, PXT_MEL_CHANNELS, 1}, vec_c[1] = {C};
    const int Wd = 1, No = 0; /* decay: conv and linear weights (2+ dims) only */
    l->cond0 = add_nd(l, cap, "conditioning_encoder.init.weight", 3, init_w, Wd, PXT_INIT_FANIN);
    int last = add_nd(l, cap, "conditioning_encoder.init.bias", 1, vec_c, No, PXT_INIT_FANIN);
    if (last >= 0) {
        l->params[last].fan_in = PXT_MEL_CHANNELS; /* a bias draws with its weight's fan-in */
    }
    for (int k = 0; k < PXT_COND_BLOCKS; k++) {
        const struct {
            const char *suffix;
            int ndim;
            int64_t shape[3];
            int decay, init;
        } t[PXT_CB_TENSORS] = {
            {"norm.weight", 1, {C}, No, PXT_INIT_ONES},
            {"norm.bias", 1, {C}, No, PXT_INIT_ZEROS},
            {"qkv.weight", 3, {3 * C, C, 1}, Wd, PXT_INIT_FANIN},
            {"qkv.bias", 1, {3 * C}, No, PXT_INIT_FANIN},
            {"proj_out.weight", 3, {C, C, 1}, Wd, PXT_INIT_ZEROS},
            {"proj_out.bias", 1, {C}, No, PXT_INIT_ZEROS},
        };
        for (int j = 0; j < PXT_CB_TENSORS; j++) {
            snprintf(name, sizeof name, "conditioning_encoder.attn.%d.%s", k, t[j].suffix);
            last = add_nd(l, cap, name, t[j].ndim, t[j].shape, t[j].decay, t[j].init);
            if (last >= 0 && j == PXT_CB_QKV_B) {
                l->params[last].fan_in = (int)C;
            }
        }
    }
    const int64_t lat[2] = {c->n_cond, C};
    add_nd(l, cap, "conditioning_perceiver.latents", 2, lat, Wd, PXT_INIT_NORMAL);
    for (int k = 0; k < PXT_PERC_LAYERS; k++) {
        const struct {
            const char *suffix;
            int ndim;
            int64_t shape[2];
            int decay, fan_in;
        } t[PXT_PL_TENSORS] = {
            {"0.to_q.weight", 2, {inner, C}, Wd, 0},   {"0.to_kv.weight", 2, {2 * inner, C}, Wd, 0},
            {"0.to_out.weight", 2, {C, inner}, Wd, 0}, {"1.0.weight", 2, {2 * I, C}, Wd, 0},
            {"1.0.bias", 1, {2 * I}, No, (int)C},      {"1.2.weight", 2, {C, I}, Wd, 0},
            {"1.2.bias", 1, {C}, No, (int)I},
        };
        for (int j = 0; j < PXT_PL_TENSORS; j++) {
            snprintf(name, sizeof name, "conditioning_perceiver.layers.%d.%s", k, t[j].suffix);
            last = add_nd(l, cap, name, t[j].ndim, t[j].shape, t[j].decay, PXT_INIT_FANIN);
            if (last >= 0 && t[j].fan_in) {
                l->params[last].fan_in = t[j].fan_in;
            }
        }
    }
    last = add_nd(l, cap, "conditioning_perceiver.norm.gamma", 1, vec_c, No, PXT_INIT_ONES);
    return last < 0 ? -1 : 0;
}

int pxt_param_layout_init(pxt_param_layout *l, const pxt_gpt_config *c) {
    memset(l, 0, sizeof *l);
    int cap = 16 + PXT_BLOCK_TENSORS * c->n_layers + (c->conditioning ? PXT_COND_TENSORS : 0);
    l->params = calloc((size_t)cap, sizeof *l->params);
    if (!l->params) {
        return pxt_error(PXT_ERR_OOM, "out of host memory for the parameter table");
    }
    int64_t C = c->d_model;
    l->text_emb = add(l, cap, "text_embedding.weight", 2, c->text_vocab, C, 1);
    l->mel_emb = add(l, cap, "mel_embedding.weight", 2, c->audio_vocab, C, 1);
    l->text_pos = add(l, cap, "text_pos_embedding.emb.weight", 2, c->max_text, C, 1);
    l->mel_pos = add(l, cap, "mel_pos_embedding.emb.weight", 2, c->max_audio, C, 1);
    for (int i = 0; i < c->n_layers; i++) {
        char prefix[PXT_NAME_LEN];
        snprintf(prefix, sizeof prefix, "gpt.h.%d.", i);
        int first = add_block(l, cap, prefix, C);
        if (i == 0) {
            l->block0 = first;
        }
    }
    l->ln_f_w = add(l, cap, "gpt.ln_f.weight", 1, C, 0, 0);
    l->ln_f_b = add(l, cap, "gpt.ln_f.bias", 1, C, 0, 0);
    l->fnorm_w = add(l, cap, "final_norm.weight", 1, C, 0, 0);
    l->fnorm_b = add(l, cap, "final_norm.bias", 1, C, 0, 0);
    l->text_head_w = add(l, cap, "text_head.weight", 2, c->text_vocab, C, 1);
    l->text_head_b = add(l, cap, "text_head.bias", 1, c->text_vocab, 0, 0);
    l->mel_head_w = add(l, cap, "mel_head.weight", 2, c->audio_vocab, C, 1);
    l->mel_head_b = add(l, cap, "mel_head.bias", 1, c->audio_vocab, 0, 0);
    l->cond0 = l->count;
    if (c->conditioning && add_conditioning(l, cap, c) < 0) {
        pxt_param_layout_free(l);
        return pxt_error(PXT_ERR_VALUE, "the parameter table overflowed (a bug)");
    }
    return PXT_OK;
}

int pxt_block_layout_init(pxt_param_layout *l, int d_model, int cross) {
    static const char *cross_name[] = {
        "crossattn.ln.weight",     "crossattn.ln.bias",     "crossattn.q.weight",
        "crossattn.q.bias",        "crossattn.kv.weight",   "crossattn.kv.bias",
        "crossattn.c_proj.weight", "crossattn.c_proj.bias",
    };
    static const int cross_shape[][3] = {
        /* ndim, rows, cols in units of C */
        {1, 1, 0}, {1, 1, 0}, {2, 1, 1}, {1, 1, 0}, {2, 1, 2}, {1, 2, 0}, {2, 1, 1}, {1, 1, 0},
    };
    int cap = cross ? PXT_BLOCK_TENSORS_CROSS : PXT_BLOCK_TENSORS;
    memset(l, 0, sizeof *l);
    l->params = calloc((size_t)cap, sizeof *l->params);
    if (!l->params) {
        return pxt_error(PXT_ERR_OOM, "out of host memory for the parameter table");
    }
    int64_t C = d_model;
    l->block0 = add_block(l, cap, "", C);
    for (int j = PXT_BLOCK_TENSORS; j < cap; j++) {
        const int *k = cross_shape[j - PXT_BLOCK_TENSORS];
        add(l, cap, cross_name[j - PXT_BLOCK_TENSORS], k[0], k[1] * C, k[2] * C, k[0] == 2);
    }
    l->text_emb = l->mel_emb = l->text_pos = l->mel_pos = -1;
    l->ln_f_w = l->ln_f_b = l->fnorm_w = l->fnorm_b = -1;
    l->text_head_w = l->text_head_b = l->mel_head_w = l->mel_head_b = -1;
    l->cond0 = l->count;
    return PXT_OK;
}

void pxt_param_layout_free(pxt_param_layout *l) {
    free(l->params);
    l->params = NULL;
    l->count = 0;
}

int pxt_gpt_config_check(const pxt_gpt_config *c) {
    const struct {
        const char *name; /* as ModelConfig spells it */
        int value;
    } sizes[] = {
        {"n_layers", c->n_layers},
        {"d_model", c->d_model},
        {"n_heads", c->n_heads},
        {"text_vocab_size", c->text_vocab},
        {"audio_vocab_size", c->audio_vocab},
        {"max_text_tokens", c->max_text},
        {"max_audio_tokens", c->max_audio},
        {"max_attention_sequence_length", c->max_seq},
    };
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        if (sizes[i].value < 1) {
            return pxt_error(PXT_ERR_VALUE, "ModelConfig.%s: must be >= 1, got %d", sizes[i].name,
                             sizes[i].value);
        }
    }
    if (c->d_model % c->n_heads != 0) {
        return pxt_error(PXT_ERR_VALUE,
                         "ModelConfig.d_model: must be divisible by n_heads=%d, got %d", c->n_heads,
                         c->d_model);
    }
    if (c->n_cond < 0) {
        return pxt_error(PXT_ERR_VALUE, "ModelConfig.n_cond_latents: must be >= 0, got %d",
                         c->n_cond);
    }
    if (!(c->eps > 0.0f) || !isfinite(c->eps)) {
        return pxt_error(PXT_ERR_VALUE,
                         "ModelConfig.layer_norm_eps: must be finite and > 0, got %g",
                         (double)c->eps);
    }
    const struct {
        const char *name;
        float value;
    } weights[] = {{"text_loss_weight", c->text_w}, {"audio_loss_weight", c->audio_w}};
    for (size_t i = 0; i < 2; i++) {
        if (!(weights[i].value >= 0.0f) || !isfinite(weights[i].value)) {
            return pxt_error(PXT_ERR_VALUE, "ModelConfig.%s: must be finite and >= 0, got %g",
                             weights[i].name, (double)weights[i].value);
        }
    }
    /* limits that refuse absurd sizes before anything loops over them: layers, the
     * elements of one tensor (GEMM operands are indexed with int), and the parameters */
    if (c->n_layers > PXT_MAX_LAYERS) {
        return pxt_error(PXT_ERR_VALUE, "ModelConfig.n_layers: must be <= %d, got %d",
                         PXT_MAX_LAYERS, c->n_layers);
    }
    const struct {
        const char *name;
        int64_t rows;
    } tables[] = {{"d_model (its 4*d_model x d_model MLP matrices)", 4 * (int64_t)c->d_model},
                  {"text_vocab_size", c->text_vocab},
                  {"audio_vocab_size", c->audio_vocab},
                  {"max_text_tokens", c->max_text},
                  {"max_audio_tokens", c->max_audio}};
    for (size_t i = 0; i < sizeof tables / sizeof tables[0]; i++) {
        size_t n; /* 4 * d_model * d_model passes 2**63 from d_model = 1.52e9 */
        if (!pxt_mul_ok((size_t)tables[i].rows, (size_t)c->d_model, &n) || n > INT32_MAX) {
            return pxt_error(PXT_ERR_VALUE,
                             "ModelConfig.%s: a %lld x %d tensor has more than 2**31 - 1 "
                             "elements, the limit of one tensor",
                             tables[i].name, (long long)tables[i].rows, c->d_model);
        }
    }
    /* every term below is < 2**31 (checked above), so the sum fits in 64 bits */
    int64_t d = c->d_model;
    int64_t per_block = 12 * d * d + 13 * d;
    int64_t rest = ((int64_t)c->text_vocab + c->audio_vocab) * (2 * d + 1) +
                   ((int64_t)c->max_text + c->max_audio) * d + 4 * d;
    if (per_block * c->n_layers + rest > PXT_MAX_PARAMS) {
        return pxt_error(PXT_ERR_VALUE,
                         "ModelConfig: %lld parameters (n_layers=%d, d_model=%d), more than the "
                         "limit of 2**38",
                         (long long)(per_block * c->n_layers + rest), c->n_layers, c->d_model);
    }
    /* sizes the kernels index with int: keep every (rows x cols) product in range */
    if ((int64_t)c->d_model * 4 * c->max_seq > INT32_MAX / 4) {
        return pxt_error(PXT_ERR_VALUE,
                         "ModelConfig: d_model x max_attention_sequence_length (%d x %d) is too "
                         "large",
                         c->d_model, c->max_seq);
    }
    if (!(c->dropout >= 0.0f && c->dropout < 1.0f)) {
        return pxt_error(PXT_ERR_VALUE, "ModelConfig.dropout: must be in [0, 1), got %g",
                         (double)c->dropout);
    }
    if (c->conditioning) {
        if (c->n_cond < 1) {
            return pxt_error(PXT_ERR_VALUE,
                             "ModelConfig.n_cond_latents: must be >= 1 with conditioning (the "
                             "perceiver's latents), got %d",
                             c->n_cond);
        }
        if (pxt_cond_groups(c->d_model) <= 2) {
            return pxt_error(PXT_ERR_VALUE,
                             "ModelConfig.d_model: the conditioning encoder's GroupNorm needs more "
                             "than 2 groups of channels (as Coqui's normalization()); %d channels "
                             "give %d; use conditioning=False or another d_model",
                             c->d_model, pxt_cond_groups(c->d_model));
        }
        if (c->max_cond_frames < 1) {
            return pxt_error(PXT_ERR_VALUE, "ModelConfig.max_cond_frames: must be >= 1, got %d",
                             c->max_cond_frames);
        }
        /* rows of the encoder (frames) and of the perceiver's keys (latents + frames) */
        if ((int64_t)c->d_model * 4 * ((int64_t)c->max_cond_frames + c->n_cond) > INT32_MAX / 4 ||
            (int64_t)pxt_cond_ff_inner(c->d_model) * 2 * c->n_cond > INT32_MAX / 4) {
            return pxt_error(
                PXT_ERR_VALUE,
                "ModelConfig: d_model x (max_cond_frames + n_cond_latents) (%d x %lld) "
                "is too large",
                c->d_model, (long long)c->max_cond_frames + c->n_cond);
        }
    }
    return PXT_OK;
}

int pxt_cond_groups(int C) {
    int g = C <= 16 ? 8 : C <= 64 ? 16 : 32;
    while (g > 1 && C % g) {
        g /= 2;
    }
    return g;
}

int pxt_cond_ff_inner(int C) { return (int)((int64_t)C * 8 / 3); }

#undef ALIGN_ELEMS
