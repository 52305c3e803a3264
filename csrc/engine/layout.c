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

static int add(pxt_param_layout *l, int cap, const char *name, int ndim, int64_t d0, int64_t d1,
               int decay) {
    if (l->count >= cap) {
        return -1;
    }
    pxt_param_info *p = &l->params[l->count];
    snprintf(p->name, sizeof p->name, "%s", name);
    p->ndim = ndim;
    p->shape[0] = d0;
    p->shape[1] = ndim == 2 ? d1 : 1;
    p->numel = (size_t)d0 * (size_t)(ndim == 2 ? d1 : 1);
    p->offset = l->numel;
    p->decay = decay;
    l->numel += (p->numel + ALIGN_ELEMS - 1) / ALIGN_ELEMS * ALIGN_ELEMS;
    return l->count++;
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

int pxt_param_layout_init(pxt_param_layout *l, const pxt_gpt_config *c) {
    memset(l, 0, sizeof *l);
    int cap = 16 + PXT_BLOCK_TENSORS * c->n_layers;
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
        if (tables[i].rows * c->d_model > INT32_MAX) {
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
    return PXT_OK;
}

#undef ALIGN_ELEMS
