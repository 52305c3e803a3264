/* plan.h: the memory planner, one for every model part.
 *
 * A step's arena is laid out once, before the step, from its shapes, dtype and
 * checkpoint policies: inputs, what forward saves for backward, and the scratch
 * that the phases (forward, heads, backward) take in turn. The same numbers
 * drive estimate_memory, the batch-size search and the arena itself, so a step
 * can only run out of memory before it starts. Pure arithmetic: planning the
 * real XTTS size allocates nothing (ggml-alloc's measure pass, as an API).
 *
 * A model part lays out its regions with the helpers below: a cursor that
 * hands out 256-byte aligned offsets, the saved and work areas of its blocks,
 * and the GEMM and attention workspaces they need. Two recipes use them: the
 * GPT step (pxt_plan_make), the conditioning path inside it included, and a
 * standalone block (pxt_block_plan_make). */
#ifndef PXT_PLAN_H
#define PXT_PLAN_H

#include "block.h"
#include "cond.h"

/* ---- helpers every recipe shares ------------------------------------------- */

#define PXT_ARENA_ALIGN 256

size_t pxt_plan_align(size_t bytes);
/* Reserves bytes at *cursor; returns their offset. */
size_t pxt_plan_take(size_t *cursor, size_t bytes);

/* The elements between two rows of a head's logits (and of their 16-bit copy):
 * V rounded up to a multiple of 8, so every row starts 16-byte aligned (32 for
 * the fp32 logits). cuBLAS picks its fast kernels only for aligned rows: with
 * XTTS v2's odd text vocabulary (6681) the head's products ran on align-1
 * kernels at a tenth of the speed of the blocks' (an H200's profile). */
static inline int pxt_head_ld(int V) { return (V + 7) / 8 * 8; }

/* Offsets (bytes from the arena start) of a block's activations, PXT_ACT_*. */
typedef struct {
    size_t at[PXT_ACT_COUNT];
} pxt_block_offsets;

/* Lays out at *cursor the activations of a block of shape x (pointers unused)
 * that policy saves; returns their bytes. */
size_t pxt_plan_block_saved(pxt_block_offsets *o, size_t *cursor, const pxt_ctx *x,
                            pxt_ckpt policy);
/* Lays out at *cursor the activations flagged in needed (PXT_ACT_*): the work
 * area that recomputation writes into. Returns its bytes. */
size_t pxt_plan_block_work(pxt_block_offsets *o, size_t *cursor, const pxt_ctx *x,
                           const int needed[PXT_ACT_COUNT]);
/* A block's activation pointers: those policy saves at `saved`, the others in
 * the work area. */
pxt_block_acts pxt_plan_block_acts(char *base, const pxt_block_offsets *saved,
                                   const pxt_block_offsets *work, pxt_ckpt policy, int cross);
/* Workspace bytes of a block's attentions (self, and cross with a context),
 * forward and, with backward, the backward's: the largest. */
size_t pxt_plan_attn_ws(const pxt_backend *be, const pxt_ctx *x, int backward);
/* The largest GEMM workspace over n (M, N, K) shapes at dtype dt: plain, and
 * fused into dt or (the weight gradients) into fp32. */
size_t pxt_plan_gemm_ws(const pxt_backend *be, const int (*shapes)[3], int n, pxt_dtype dt);
/* The largest column-sum workspace over n (rows, cols) shapes. */
size_t pxt_plan_colsum_ws(const pxt_backend *be, const int (*shapes)[2], int n);

/* ---- the GPT step ------------------------------------------------------------- */

/* The conditioning path of a step whose batch carries cond_mels (S > 0). Offsets
 * from the arena's start. In training its inputs, saved activations and dcond
 * sit before the GPT's scratch; its scratch starts at the GPT's (the path runs
 * before the GPT's forward and after its backward):
 *   scratch = work (the acts the policy recomputes) | attention ws | gemm ws |
 *             column sums' ws (training) |
 *             forward: out | eval: hs, lats, rnorm   (phase 1)
 *             backward: d1 | d2 | datt | dqkv, with the perceiver's
 *             dl | dg | du | pdatt | dq | dkv over d2 onwards          (phase 2)
 * The encoder's stream hs holds h0 and every block's output (the perceiver's
 * context last), lats the latents per sample and each layer's output. */
typedef struct {
    int S;           /* mel frames; 0: the step has no conditioning path */
    pxt_ckpt policy; /* of every encoder block and perceiver layer */
    pxt_cond_ctx shape;
    size_t mel, inputs_bytes; /* (B, 80, S) dt */
    size_t hs, lats, rnorm;   /* (7, B*S, C), (3, B*Nl, C), (B*Nl) fp32; eval: 2, 2, 1 */
    size_t enc[PXT_COND_BLOCKS][PXT_ENC_ACTS];   /* saved, by the policy */
    size_t perc[PXT_PERC_LAYERS][PXT_PERC_ACTS]; /* saved, by the policy */
    size_t dcond;                                /* (B*Nl, C): the latents' gradient from the GPT */
    size_t saved_bytes;                          /* hs, lats, rnorm, saved acts, dcond (training) */
    size_t enc_work[PXT_ENC_ACTS], perc_work[PXT_PERC_ACTS];
    size_t attn_ws, attn_ws_bytes, gemm_ws, gemm_ws_bytes, reduce_ws, reduce_ws_bytes;
    size_t out;                        /* (B*Nl, C) the RMS norm's output */
    size_t d1, d2, datt, dqkv;         /* (B*S, C) x 3, (B*S, 3C) */
    size_t dl, dg, du, pdatt, dq, dkv; /* (B*Nl, C), (B*Nl, F), (B*Nl, 2F), 2 x (B*Nl, 512),
                                          (B, Nl + S, 1024) */
    size_t scratch_bytes;              /* from the GPT's scratch start */
} pxt_cond_plan;

typedef struct {
    /* shape */
    int B, Lt, La, Nc, T, N; /* N = B * T rows */
    int C, H, L, text_vocab, audio_vocab;
    pxt_dtype dt;
    int train;        /* 0: evaluation forward (nothing saved) */
    int logits_rows;  /* rows per logits chunk, gathered across samples */
    pxt_ckpt *policy; /* (L) per block; owned */

    /* inputs (int32 / uint8) */
    size_t text_ids, audio_ids, text_tgt, audio_tgt, text_pos, audio_pos, key_mask, losses;
    /* the step's values that change from one micro-batch to the next without
     * changing its launches, read by the kernels (dropout.h's live keys):
     * (3) uint64 {dropout seed, dropout step, first sample} */
    size_t live;
    size_t inputs_bytes;
    /* saved for backward (or the ping-pong residuals of evaluation) */
    size_t resid; /* (L + 1, N, C): block inputs, then the last output */
    size_t resid_bytes;
    pxt_block_offsets *blocks;   /* (L); owned */
    size_t *block_saved_bytes;   /* (L); owned */
    size_t hf, hf_mean, hf_rstd; /* ln_f output (N, C), stats (N) */
    size_t h2, h2_mean, h2_rstd; /* final_norm output (N, C), stats (N) */
    size_t final_bytes;
    size_t saved_bytes; /* resid + blocks + final */
    /* scratch: one region, used in turn by each phase */
    size_t scratch;         /* start of the region */
    pxt_block_offsets work; /* a whole block's activations (forward, recompute) */
    size_t work_bytes;
    size_t attn_ws, attn_ws_bytes; /* attention workspace (max of forward, backward) */
    size_t logits, logits_bytes;   /* (logits_rows, pxt_head_ld(max vocab)) fp32 */
    /* 16-bit models only (0 bytes in fp32): dlogits cast to dt for the head
     * GEMMs (logits_rows, pxt_head_ld(max vocab)) dt, and both head biases cast to
     * fp32 once per step (text_vocab + audio_vocab) fp32; both next to the logits
     * chunk */
    size_t dlogits16, head_bias32, head_cast_bytes;
    /* the heads gather each chunk's valid rows from every sample: their h2 rows
     * (logits_rows, C) dt, targets (logits_rows) int32 and losses (logits_rows)
     * fp32, and (train) their dh2 rows (logits_rows, C) dt, before scattering back */
    size_t head_rows, head_dh, head_tgt, head_loss, head_gather_bytes;
    size_t gemm_ws, gemm_ws_bytes;     /* GEMM workspace (plain and fused products) */
    size_t reduce_ws, reduce_ws_bytes; /* column sums' and embedding scatter's partials */
    size_t dres, dA, dB;               /* backward: (N, C), (N, 4C), (N, C) */
    size_t grad_bytes;                 /* dres + dA + dB */
    size_t scratch_bytes;              /* max over phases */
    size_t arena_bytes;                /* inputs + saved + scratch */
    pxt_cond_plan cond;                /* the conditioning path (cond.S = 0: none) */
} pxt_plan;

/* Plans a GPT step. policy: L entries (copied), then with S > 0 mel frames (a
 * batch with cond_mels) one more for the conditioning path. backend gives
 * workspace sizes. Returns PXT_ERR_VALUE for shapes the config refuses (named). */
int pxt_plan_make(pxt_plan *p, const pxt_gpt_config *c, const pxt_backend *be, int B, int Lt,
                  int La, int Nc, int S, pxt_dtype dt, const pxt_ckpt *policy, int train);
void pxt_plan_free(pxt_plan *p);
/* Same shape and policies (an arena of one fits the other). */
int pxt_plan_same(const pxt_plan *a, const pxt_plan *b);

/* ---- a standalone block ---------------------------------------------------------
 *
 *   inputs   x (N, C) | key_mask (B, T) u8 | context (Nc, C) | context_mask (B, Tc) u8
 *   output   y (N, C)
 *   saved    the activations the policy keeps (pxt_block_saves)
 *   grads    dres (N, C): dy -> dx | dA (N, 4C) | dB (N, C) | dkv (Nc, 2C) | dcontext (Nc, C)
 *   work     the activations the policy recomputes
 *   ws       attention workspace (max over self/cross, fwd/bwd) | GEMM workspace |
 *            column sums' workspace
 * N = B T, Nc = B Tc (the context regions only with cross-attention). No region
 * overlaps another, so y survives the backward and dx the next forward. */
typedef struct {
    int B, T, Tc, C, H, cross;
    pxt_ckpt policy;
    pxt_dtype dt;
    size_t x, key_mask, context, context_mask, inputs_bytes;
    size_t y, output_bytes;
    pxt_block_offsets saved, work; /* each activation in one of them, by the policy */
    size_t saved_bytes;
    size_t dres, dA, dB, dkv, dcontext, grad_bytes;
    size_t work_bytes;
    size_t attn_ws, attn_ws_bytes, gemm_ws, gemm_ws_bytes, reduce_ws, reduce_ws_bytes;
    size_t arena_bytes;
} pxt_block_plan;

void pxt_block_plan_make(pxt_block_plan *p, const pxt_backend *be, int B, int T, int Tc, int C,
                         int H, int cross, pxt_ckpt policy, pxt_dtype dt);
int pxt_block_plan_same(const pxt_block_plan *a, const pxt_block_plan *b);

#endif /* PXT_PLAN_H */
