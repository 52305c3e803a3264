/* plan.h: the memory plan of one training step (or evaluation forward).
 *
 * From (config, batch, lengths, dtype, checkpoint policy per block) it lays
 * out every byte the step needs in one arena: inputs, what forward saves for
 * backward, and the scratch that the phases (forward, heads, backward) take
 * in turn. The same numbers drive estimate_memory, the batch-size search and
 * the arena itself, so a step can only run out of memory before it starts.
 * Pure arithmetic: planning the real XTTS size allocates nothing. */
#ifndef PXT_PLAN_H
#define PXT_PLAN_H

#include "backend.h"
#include "layout.h"

typedef enum { PXT_CKPT_NONE = 0, PXT_CKPT_SELECTIVE = 1, PXT_CKPT_FULL = 2 } pxt_ckpt;

/* Offsets (bytes from the arena start) of a block's activations. Where an
 * activation is not saved by the policy, its offset points into the shared
 * work area (recomputed in backward). */
typedef struct {
    size_t ln1, mean1, rstd1, qkv, att, lse, x2, ln2, mean2, rstd2, fc, gelu;
} pxt_block_offsets;

typedef struct {
    /* shape */
    int B, Lt, La, Nc, T, N; /* N = B * T rows */
    int C, H, L, text_vocab, audio_vocab;
    pxt_dtype dt;
    int train; /* 0: evaluation forward (nothing saved) */
    int logits_rows; /* rows per logits chunk */
    pxt_ckpt *policy; /* (L) per block; owned */

    /* inputs (int32 / uint8) */
    size_t text_ids, audio_ids, text_tgt, audio_tgt, text_pos, audio_pos, key_mask, losses;
    size_t inputs_bytes;
    /* saved for backward (or the ping-pong residuals of evaluation) */
    size_t resid;        /* (L + 1, N, C): block inputs, then the last output */
    size_t resid_bytes;
    pxt_block_offsets *blocks; /* (L); owned */
    size_t *block_saved_bytes; /* (L); owned */
    size_t hf, hf_mean, hf_rstd;   /* ln_f output (N, C), stats (N) */
    size_t h2, h2_mean, h2_rstd;   /* final_norm output (N, C), stats (N) */
    size_t final_bytes;
    size_t saved_bytes;            /* resid + blocks + final */
    /* scratch: one region, used in turn by each phase */
    size_t scratch;                /* start of the region */
    pxt_block_offsets work;        /* a whole block's activations (forward, recompute) */
    size_t work_bytes;
    size_t attn_ws, attn_ws_bytes; /* attention workspace (max of forward, backward) */
    size_t logits, logits_bytes;   /* (logits_rows, max vocab) fp32 */
    /* 16-bit models only (0 bytes in fp32): dlogits cast to dt for the head
     * GEMMs (logits_rows, max vocab) dt, and both head biases cast to fp32 once
     * per step (text_vocab + audio_vocab) fp32; both next to the logits chunk */
    size_t dlogits16, head_bias32, head_cast_bytes;
    size_t gemm_ws, gemm_ws_bytes; /* widening buffers of 16-bit gemms */
    size_t dres, dA, dB;           /* backward: (N, C), (N, 4C), (N, C) */
    size_t grad_bytes;             /* dres + dA + dB */
    size_t scratch_bytes;          /* max over phases */
    size_t arena_bytes;            /* inputs + saved + scratch */
} pxt_plan;

/* Plans a step. policy: L entries (copied). backend gives workspace sizes.
 * Returns PXT_ERR_VALUE for shapes the config refuses (named). */
int pxt_plan_make(pxt_plan *p, const pxt_gpt_config *c, const pxt_backend *be, int B, int Lt,
                  int La, int Nc, pxt_dtype dt, const pxt_ckpt *policy, int train);
void pxt_plan_free(pxt_plan *p);

/* The offset field of activation `act` (PXT_ACT_*, block.h) in o. */
size_t *pxt_plan_slot(pxt_block_offsets *o, int act);

/* Bytes a block's saved activations take under a policy. */
size_t pxt_plan_block_bytes(const pxt_plan *p, pxt_ckpt policy);

#endif /* PXT_PLAN_H */
