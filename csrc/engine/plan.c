/* plan.c: lays out the arena of a step (see plan.h).
 *
 * Arena (training):
 *   inputs  | resid (L+1, N, C) | per-block saved | ln_f, final_norm outputs | scratch
 *   scratch = dres (N,C) | dA (N,4C) | dB (N,C) | work + attention ws | gemm ws
 *             (the heads phase puts its logits chunk over work + attention ws,
 *              and for a 16-bit model the fp32 head biases and a dt copy of dlogits)
 * Phases run one after another, so the scratch is shared: forward uses work and
 * attention workspace, heads use dB (dh2) and the logits chunk, backward uses
 * all of it. Evaluation keeps two residual buffers and no gradients. */
#include <stdlib.h>
#include <string.h>

#include "plan.h"
#include "block.h" /* which activations a policy saves, and their sizes */

#define ARENA_ALIGN 256
#define LOGITS_ROWS 256 /* rows of logits per chunk: big enough for an efficient GEMM */

size_t *pxt_plan_slot(pxt_block_offsets *o, int act) {
    size_t *s[PXT_ACT_PLAIN] = {&o->ln1, &o->mean1, &o->rstd1, &o->qkv, &o->att, &o->lse,
                                &o->x2, &o->ln2, &o->mean2, &o->rstd2, &o->fc, &o->gelu};
    return s[act];
}

static size_t act_bytes(const pxt_plan *p, int act) {
    return pxt_block_act_bytes(act, p->B, p->T, 0, p->C, p->H, p->dt);
}

static size_t align(size_t n) { return (n + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN; }

/* Reserves bytes at *cursor; returns their offset. */
static size_t take(size_t *cursor, size_t bytes) {
    size_t at = *cursor;
    *cursor += align(bytes);
    return at;
}

size_t pxt_plan_block_bytes(const pxt_plan *p, pxt_ckpt policy) {
    size_t total = 0;
    for (int a = 0; a < PXT_ACT_PLAIN; a++)
        if (pxt_block_saves(policy, a))
            total += align(act_bytes(p, a));
    return total;
}

static size_t max_sz(size_t a, size_t b) { return a > b ? a : b; }

/* The largest widening workspace any GEMM of the step asks for. */
static size_t gemm_ws_max(const pxt_plan *p, const pxt_backend *be) {
    if (!be->gemm_workspace)
        return 0;
    int N = p->N, C = p->C, R = p->logits_rows;
    int V = p->text_vocab > p->audio_vocab ? p->text_vocab : p->audio_vocab;
    int shapes[][3] = {
        {N, 3 * C, C}, {N, C, C}, {N, 4 * C, C}, {N, C, 4 * C},   /* forward */
        {N, C, 3 * C}, {C, 3 * C, N}, {C, C, N}, {C, 4 * C, N}, {4 * C, C, N}, /* backward */
        {R, V, C}, {R, C, V}, {V, C, R},                           /* heads */
    };
    size_t m = 0;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        m = max_sz(m, be->gemm_workspace(shapes[i][0], shapes[i][1], shapes[i][2], p->dt));
    return m;
}

static size_t attn_ws(const pxt_plan *p, const pxt_backend *be, int backward) {
    if (!be->attention_workspace)
        return 0;
    size_t C = (size_t)p->C;
    pxt_attn_args a = {
        .B = p->B, .H = p->H, .Tq = p->T, .Tk = p->T, .D = p->C / p->H, .causal = 1,
        .scale = 1.0f, .q = {(int64_t)(p->T * 3 * C), (int64_t)(C / p->H), (int64_t)(3 * C)},
        .dt = p->dt,
    };
    a.k = a.v = a.q;
    a.o = (pxt_strides){(int64_t)(p->T * C), (int64_t)(C / p->H), (int64_t)C};
    return be->attention_workspace(&a, backward);
}

int pxt_plan_make(pxt_plan *p, const pxt_gpt_config *c, const pxt_backend *be, int B, int Lt,
                  int La, int Nc, pxt_dtype dt, const pxt_ckpt *policy, int train) {
    memset(p, 0, sizeof *p);
    if (B < 1)
        return pxt_error(PXT_ERR_VALUE, "batch_size: must be >= 1, got %d", B);
    if (Lt < 1 || Lt > c->max_text)
        return pxt_error(PXT_ERR_VALUE, "text_len: must be in [1, max_text_tokens=%d], got %d",
                         c->max_text, Lt);
    if (La < 1 || La > c->max_audio)
        return pxt_error(PXT_ERR_VALUE, "audio_len: must be in [1, max_audio_tokens=%d], got %d",
                         c->max_audio, La);
    if (Nc < 0)
        return pxt_error(PXT_ERR_VALUE, "cond_len: must be >= 0, got %d", Nc);
    if (Nc + Lt + La > c->max_seq)
        return pxt_error(PXT_ERR_VALUE,
                         "sequence length %d (%d conditioning + %d text + %d audio) exceeds "
                         "max_attention_sequence_length=%d; pyxtts never truncates: shorten the "
                         "sample or raise the maximum", Nc + Lt + La, Nc, Lt, La, c->max_seq);
    p->B = B, p->Lt = Lt, p->La = La, p->Nc = Nc, p->T = Nc + Lt + La, p->N = B * p->T;
    p->C = c->d_model, p->H = c->n_heads, p->L = c->n_layers;
    p->text_vocab = c->text_vocab, p->audio_vocab = c->audio_vocab;
    p->dt = dt, p->train = train;
    p->logits_rows = Lt > La ? Lt : La;
    if (p->logits_rows > LOGITS_ROWS)
        p->logits_rows = LOGITS_ROWS;
    int L = p->L;
    p->policy = malloc(sizeof *p->policy * (size_t)L);
    p->blocks = calloc((size_t)L, sizeof *p->blocks);
    p->block_saved_bytes = calloc((size_t)L, sizeof *p->block_saved_bytes);
    if (!p->policy || !p->blocks || !p->block_saved_bytes) {
        pxt_plan_free(p);
        return pxt_error(PXT_ERR_OOM, "out of host memory for the memory plan");
    }
    for (int l = 0; l < L; l++)
        p->policy[l] = train ? policy[l] : PXT_CKPT_FULL; /* evaluation saves nothing */
    size_t N = (size_t)p->N, C = (size_t)p->C, es = pxt_dtype_size(dt);
    size_t cur = 0;

    /* inputs: token ids, targets, position ids (int32), key mask, per-row losses */
    p->text_ids = take(&cur, (size_t)B * Lt * 4);
    p->audio_ids = take(&cur, (size_t)B * La * 4);
    p->text_tgt = take(&cur, (size_t)B * Lt * 4);
    p->audio_tgt = take(&cur, (size_t)B * La * 4);
    p->text_pos = take(&cur, (size_t)B * Lt * 4);
    p->audio_pos = take(&cur, (size_t)B * La * 4);
    p->key_mask = take(&cur, N);
    p->losses = take(&cur, (size_t)B * (Lt + La) * sizeof(float));
    p->inputs_bytes = cur;

    /* saved: residual stream (every block input, then the stack's output) */
    size_t nres = train ? (size_t)L + 1 : 2; /* evaluation ping-pongs two buffers */
    p->resid = take(&cur, nres * N * C * es);
    p->resid_bytes = cur - p->resid;
    int needs_work[PXT_ACT_PLAIN] = {0};
    for (int l = 0; l < L; l++) {
        size_t start = cur;
        for (int a = 0; a < PXT_ACT_PLAIN; a++) {
            if (pxt_block_saves(p->policy[l], a))
                *pxt_plan_slot(&p->blocks[l], a) = take(&cur, act_bytes(p, a));
            else
                needs_work[a] = 1;
        }
        p->block_saved_bytes[l] = cur - start;
    }
    size_t final_start = cur;
    p->hf = take(&cur, N * C * es);
    p->hf_mean = take(&cur, N * 4);
    p->hf_rstd = take(&cur, N * 4);
    p->h2 = take(&cur, N * C * es);
    p->h2_mean = take(&cur, N * 4);
    p->h2_rstd = take(&cur, N * 4);
    p->final_bytes = cur - final_start;
    p->saved_bytes = cur - p->resid;

    /* scratch */
    p->scratch = cur;
    if (train) {
        p->dres = take(&cur, N * C * es);
        p->dA = take(&cur, N * 4 * C * es);
        p->dB = take(&cur, N * C * es);
    }
    p->grad_bytes = cur - p->scratch;
    size_t after_grads = cur;
    for (int a = 0; a < PXT_ACT_PLAIN; a++)
        if (needs_work[a])
            *pxt_plan_slot(&p->work, a) = take(&cur, act_bytes(p, a));
    p->work_bytes = cur - after_grads;
    p->attn_ws_bytes = max_sz(attn_ws(p, be, 0), train ? attn_ws(p, be, 1) : 0);
    p->attn_ws = take(&cur, p->attn_ws_bytes);
    size_t block_phase_end = cur;
    /* heads: the logits chunk reuses the block area, which is idle by then */
    int V = c->text_vocab > c->audio_vocab ? c->text_vocab : c->audio_vocab;
    size_t lcur = after_grads;
    p->logits_bytes = (size_t)p->logits_rows * (size_t)V * sizeof(float);
    p->logits = take(&lcur, p->logits_bytes);
    if (dt != PXT_FLOAT32) { /* the head GEMMs take one dtype for A and B; add_bias too */
        size_t before = lcur;
        p->head_bias32 = take(&lcur, ((size_t)c->text_vocab + (size_t)c->audio_vocab) * sizeof(float));
        if (train)
            p->dlogits16 = take(&lcur, (size_t)p->logits_rows * (size_t)V * es);
        p->head_cast_bytes = lcur - before;
    }
    cur = max_sz(block_phase_end, lcur);
    p->gemm_ws_bytes = gemm_ws_max(p, be);
    p->gemm_ws = take(&cur, p->gemm_ws_bytes);
    p->scratch_bytes = cur - p->scratch;
    p->arena_bytes = cur;
    return PXT_OK;
}

void pxt_plan_free(pxt_plan *p) {
    free(p->policy);
    free(p->blocks);
    free(p->block_saved_bytes);
    p->policy = NULL;
    p->blocks = NULL;
    p->block_saved_bytes = NULL;
}
