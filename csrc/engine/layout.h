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
    float dropout;           /* GPT-2's dropout probability in training (0: none) */
    int conditioning;        /* 1: the conditioning encoder and perceiver (cond.h) */
    int max_cond_frames;     /* the longest reference mel a batch may carry (frames) */
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

/* The conditioning path's tensors (conditioning=1), after the heads, named and
 * shaped as Coqui's GPT has them: conditioning_encoder.init (a 1x1 conv 80 -> C),
 * then PXT_COND_BLOCKS attention blocks of PXT_CB_TENSORS, the perceiver's
 * latents, PXT_PERC_LAYERS layers of PXT_PL_TENSORS, its norm's gamma. */
#define PXT_COND_BLOCKS 6
#define PXT_PERC_LAYERS 2
#define PXT_MEL_CHANNELS 80
#define PXT_PERC_HEADS 8     /* the perceiver's attention: 8 heads of 64 */
#define PXT_PERC_HEAD_DIM 64 /* whatever d_model is */
enum { PXT_CE_INIT_W, PXT_CE_INIT_B, PXT_CE_BLOCK0 };
enum { /* conditioning_encoder.attn.{k}. */
       PXT_CB_NORM_W,
       PXT_CB_NORM_B,
       PXT_CB_QKV_W, /* (3C, C, 1): channels head by head, [q | k | v] inside a head */
       PXT_CB_QKV_B,
       PXT_CB_PROJ_W, /* (C, C, 1) */
       PXT_CB_PROJ_B,
       PXT_CB_TENSORS
};
enum {               /* conditioning_perceiver.layers.{l}. */
       PXT_PL_Q_W,   /* 0.to_q.weight (512, C) */
       PXT_PL_KV_W,  /* 0.to_kv.weight (1024, C): keys | values */
       PXT_PL_OUT_W, /* 0.to_out.weight (C, 512) */
       PXT_PL_FF1_W, /* 1.0.weight (2F, C): GEGLU's input | gate */
       PXT_PL_FF1_B,
       PXT_PL_FF2_W, /* 1.2.weight (C, F) */
       PXT_PL_FF2_B,
       PXT_PL_TENSORS
};
#define PXT_CE_LATENTS (PXT_CE_BLOCK0 + PXT_COND_BLOCKS * PXT_CB_TENSORS)
#define PXT_CP_LAYER0 (PXT_CE_LATENTS + 1)
#define PXT_CP_GAMMA (PXT_CP_LAYER0 + PXT_PERC_LAYERS * PXT_PL_TENSORS)
#define PXT_COND_TENSORS (PXT_CP_GAMMA + 1) /* 54 */

/* How a tensor is initialised (flat.c), from one seeded stream in layout order. */
enum {
    PXT_INIT_NORMAL, /* N(0, 0.02): GPT-2's matrices and embeddings, the latents */
    PXT_INIT_RESID,  /* N(0, 0.02 / sqrt(2 n_layers)): GPT-2's residual projections */
    PXT_INIT_ONES,   /* norm gains */
    PXT_INIT_ZEROS,  /* biases, and the conditioning blocks' zero-initialised proj_out */
    PXT_INIT_FANIN,  /* U(-1/sqrt(fan_in), 1/sqrt(fan_in)): torch's Linear and Conv1d */
};

#define PXT_NAME_LEN 64
#define PXT_PARAM_DIMS 3

typedef struct {
    char name[PXT_NAME_LEN]; /* e.g. "gpt.h.3.attn.c_attn.weight" */
    int ndim;
    int64_t shape[PXT_PARAM_DIMS];
    size_t offset; /* in elements from the start of the flat buffer (256-byte aligned) */
    size_t numel;
    int decay;  /* 1 for matrices and embeddings (AdamW weight decay applies) */
    int init;   /* PXT_INIT_* */
    int fan_in; /* of PXT_INIT_FANIN */
} pxt_param_info;

typedef struct {
    pxt_param_info *params;
    int count;
    size_t numel; /* elements in the flat buffer, padding included */
    /* indices into params */
    int text_emb, mel_emb, text_pos, mel_pos, ln_f_w, ln_f_b, fnorm_w, fnorm_b, text_head_w,
        text_head_b, mel_head_w, mel_head_b;
    int block0; /* block i's tensor j is params[block0 + i * PXT_BLOCK_TENSORS + j] */
    int cond0;  /* the conditioning path's tensor j is params[cond0 + j]; count when none */
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

/* The conditioning encoder's GroupNorm groups for C channels, as Coqui's
 * normalization() picks them: 32 (8 up to 16 channels, 16 up to 64) halved until
 * they divide C; 2 or fewer is a model Coqui refuses (the config check does). */
int pxt_cond_groups(int C);
/* The perceiver's feed-forward inner width, int(C * 4 * 2 / 3). */
int pxt_cond_ff_inner(int C);

#endif /* PXT_LAYOUT_H */
