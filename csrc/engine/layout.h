/* layout.h: the XTTS GPT's configuration, its rules, and flat parameter layouts.
 *
 * Parameters live in one flat buffer, gradients (fp32) in another with the
 * same element offsets; every named parameter is a view. Names and shapes are
 * those of the GPT of an XTTS v2 checkpoint (layout.c builds them), so its
 * weights load directly. The config rules are here and only here: the Python
 * ModelConfig asks pxt_gpt_config_check through check_model_config. */
#ifndef PXT_LAYOUT_H
#define PXT_LAYOUT_H

#include "pxt.h"

/* Limits of a config (pxt_gpt_config_check): far above any real model, low enough
 * that nothing sized by a config can loop for minutes or overflow. */
#define PXT_MAX_LAYERS 4096
#define PXT_MAX_PARAMS ((int64_t)1 << 38)

typedef struct {
    int n_layers, d_model, n_heads;
    int text_vocab, audio_vocab;
    int max_text, max_audio; /* rows of the positional tables */
    int n_cond;              /* conditioning latents the config expects (0: none) */
    float eps;               /* layernorm */
    float text_w, audio_w;   /* loss weights */
    int max_seq;             /* max_attention_sequence_length: longer is an error */
} pxt_gpt_config;

/* Tensors of one block, in the order they sit in the flat buffer. */
enum {
    PXT_LN1_W,
    PXT_LN1_B,
    PXT_ATTN_W,
    PXT_ATTN_B,
    PXT_PROJ_W,
    PXT_PROJ_B,
    PXT_LN2_W,
    PXT_LN2_B,
    PXT_FC_W,
    PXT_FC_B,
    PXT_FCP_W,
    PXT_FCP_B,
    PXT_BLOCK_TENSORS
};

/* A block with cross-attention (pyxtts.Block(cross_attention=True)) has 8 more,
 * after the 12 above: crossattn.ln.weight/bias (C), crossattn.q.weight (C, C) +
 * bias (C), crossattn.kv.weight (C, 2C) + bias (2C), crossattn.c_proj.weight
 * (C, C) + bias (C). The GPT's blocks have none (its layout is unchanged). */
enum {
    PXT_XLN_W = PXT_BLOCK_TENSORS,
    PXT_XLN_B,
    PXT_XQ_W,
    PXT_XQ_B,
    PXT_XKV_W,
    PXT_XKV_B,
    PXT_XPROJ_W,
    PXT_XPROJ_B,
    PXT_BLOCK_TENSORS_CROSS
};

#define PXT_NAME_LEN 64

typedef struct {
    char name[PXT_NAME_LEN]; /* e.g. "gpt.h.3.attn.c_attn.weight" */
    int ndim;
    int64_t shape[2];
    size_t offset; /* in elements from the start of the flat buffer (256-byte aligned) */
    size_t numel;
    int decay; /* 1 for matrices and embeddings (AdamW weight decay applies) */
} pxt_param_info;

typedef struct {
    pxt_param_info *params;
    int count;
    size_t numel; /* elements in the flat buffer, padding included */
    /* indices into params */
    int text_emb, mel_emb, text_pos, mel_pos, ln_f_w, ln_f_b, fnorm_w, fnorm_b, text_head_w,
        text_head_b, mel_head_w, mel_head_b;
    int block0; /* block i's tensor j is params[block0 + i * PXT_BLOCK_TENSORS + j] */
} pxt_param_layout;

/* Fills layout (params malloc'd; free with pxt_param_layout_free). PXT_ERR_OOM. */
int pxt_param_layout_init(pxt_param_layout *l, const pxt_gpt_config *c);
void pxt_param_layout_free(pxt_param_layout *l);

/* The layout of a single block's parameters (pyxtts.Block), names without a
 * prefix ("ln_1.weight", ...): the 12 tensors of a GPT block, then with cross
 * the 8 of its cross-attention; params[j] is tensor j of the enums above. */
int pxt_block_layout_init(pxt_param_layout *l, int d_model, int cross);

/* Checks a config; PXT_ERR_VALUE "ModelConfig.<field>: must be <rule>, got <value>"
 * for the first field that breaks a rule. */
int pxt_gpt_config_check(const pxt_gpt_config *c);

#endif /* PXT_LAYOUT_H */
