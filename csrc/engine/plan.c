/* plan.c: the arenas of a GPT step and of a standalone block (see plan.h).
 *
 * GPT arena (training):
 *   inputs  | resid (L+1, N, C) | per-block saved | ln_f, final_norm outputs | scratch
 *   scratch = dres (N,C) | dA (N,4C) | dB (N,C) | work + attention ws | gemm ws |
 *             reduction ws (column sums' and the embedding scatter's partials)
 *             (the heads phase puts its logits chunk over work + attention ws,
 *              and for a 16-bit model the fp32 head biases and a dt copy of dlogits,
 *              then the chunk's rows gathered from every sample)
 * Phases run one after another, so the scratch is shared: forward uses work and
 * attention workspace, heads use dB (dh2) and the logits chunk, backward uses
 * all of it. Evaluation keeps two residual buffers and no gradients. */
#include <stdlib.h>
#include <string.h>

#include "plan.h"

#define LOGITS_ROWS 256 /* rows of logits per chunk: big enough for an efficient GEMM */

static size_t max_sz(size_t a, size_t b) { return a > b ? a : b; }

/* ---- helpers -------------------------------------------------------------------- */

size_t pxt_plan_align(size_t n) {
    return (n + PXT_ARENA_ALIGN - 1) / PXT_ARENA_ALIGN * PXT_ARENA_ALIGN;
}

size_t pxt_plan_take(size_t *cursor, size_t bytes) {
    size_t at = *cursor;
    *cursor += pxt_plan_align(bytes);
    return at;
}

static int n_acts(const pxt_ctx *x) { return x->Tc > 0 ? PXT_ACT_COUNT : PXT_ACT_PLAIN; }

static size_t act_bytes(const pxt_ctx *x, int act) {
    return pxt_block_act_bytes(act, x->B, x->T, x->Tc, x->C, x->H, x->dt);
}

size_t pxt_plan_block_saved(pxt_block_offsets *o, size_t *cursor, const pxt_ctx *x,
                            pxt_ckpt policy) {
    size_t start = *cursor;
    for (int a = 0; a < n_acts(x); a++) {
        if (pxt_block_saves(policy, a)) {
            o->at[a] = pxt_plan_take(cursor, act_bytes(x, a));
        }
    }
    return *cursor - start;
}

size_t pxt_plan_block_work(pxt_block_offsets *o, size_t *cursor, const pxt_ctx *x,
                           const int needed[PXT_ACT_COUNT]) {
    size_t start = *cursor;
    for (int a = 0; a < n_acts(x); a++) {
        if (needed[a]) {
            o->at[a] = pxt_plan_take(cursor, act_bytes(x, a));
        }
    }
    return *cursor - start;
}

pxt_block_acts pxt_plan_block_acts(char *base, const pxt_block_offsets *saved,
                                   const pxt_block_offsets *work, pxt_ckpt policy, int cross) {
    pxt_block_acts a;
    memset(&a, 0, sizeof a);
    for (int act = 0; act < (cross ? PXT_ACT_COUNT : PXT_ACT_PLAIN); act++) {
        const pxt_block_offsets *o = pxt_block_saves(policy, act) ? saved : work;
        pxt_block_acts_set(&a, act, base + o->at[act]);
    }
    return a;
}

size_t pxt_plan_attn_ws(const pxt_backend *be, const pxt_ctx *x, int backward) {
    if (!be->attention_workspace) {
        return 0;
    }
    pxt_attn_args s = pxt_block_self_attn_args(x);
    size_t m = be->attention_workspace(&s, 0);
    if (backward) {
        m = max_sz(m, be->attention_workspace(&s, 1));
    }
    if (x->Tc > 0) {
        pxt_attn_args c = pxt_block_cross_attn_args(x);
        m = max_sz(m, be->attention_workspace(&c, 0));
        if (backward) {
            m = max_sz(m, be->attention_workspace(&c, 1));
        }
    }
    return m;
}

size_t pxt_plan_gemm_ws(const pxt_backend *be, const int (*shapes)[3], int n, pxt_dtype dt) {
    size_t m = 0;
    for (int i = 0; i < n; i++) {
        pxt_gemm_args g = {
            .M = shapes[i][0], .N = shapes[i][1], .K = shapes[i][2], .dt_ab = dt, .dt_c = dt};
        if (be->gemm_workspace) {
            m = max_sz(m, be->gemm_workspace(g.M, g.N, g.K, dt));
        }
        if (be->gemm_fused_workspace) {
            m = max_sz(m, be->gemm_fused_workspace(&g));
            g.dt_c = PXT_FLOAT32; /* the weight gradients */
            m = max_sz(m, be->gemm_fused_workspace(&g));
        }
    }
    return m;
}

size_t pxt_plan_colsum_ws(const pxt_backend *be, const int (*shapes)[2], int n) {
    size_t m = 0;
    for (int i = 0; be->colsum_workspace && i < n; i++) {
        m = max_sz(m, be->colsum_workspace(shapes[i][0], shapes[i][1]));
    }
    return m;
}

/* ---- the GPT step ----------------------------------------------------------------- */

/* The block GEMMs and the heads' ((R, V, C) logits, (R, C, V) dh2, (V, C, R) dW). */
static size_t gpt_gemm_ws(const pxt_plan *p, const pxt_ctx *x, const pxt_backend *be) {
    int shapes[PXT_BLOCK_GEMMS_MAX + 3][3];
    int n = pxt_block_gemm_shapes(x, shapes), R = p->logits_rows, C = p->C;
    int V = p->text_vocab > p->audio_vocab ? p->text_vocab : p->audio_vocab;
    const int heads[3][3] = {{R, V, C}, {R, C, V}, {V, C, R}};
    memcpy(shapes[n], heads, sizeof heads);
    return pxt_plan_gemm_ws(be, (const int (*)[3])shapes, n + 3, p->dt);
}

/* The step's reductions: the blocks' column sums (the final norms' shape is
 * theirs), the head biases' (R, V) and the four embedding scatters. */
static size_t gpt_reduce_ws(const pxt_plan *p, const pxt_ctx *x, const pxt_backend *be,
                            const pxt_gpt_config *c) {
    int shapes[PXT_BLOCK_COLSUMS_MAX + 2][2];
    int n = pxt_block_colsum_shapes(x, shapes);
    const int heads[2][2] = {{p->logits_rows, c->text_vocab}, {p->logits_rows, c->audio_vocab}};
    memcpy(shapes[n], heads, sizeof heads);
    size_t m = pxt_plan_colsum_ws(be, (const int (*)[2])shapes, n + 2);
    if (be->embedding_workspace) {
        const int tables[4][2] = {{p->Lt, c->text_vocab},
                                  {p->Lt, c->max_text},
                                  {p->La, c->audio_vocab},
                                  {p->La, c->max_audio}};
        for (int i = 0; i < 4; i++) {
            m = max_sz(m, be->embedding_workspace(tables[i][0], p->C, tables[i][1]));
        }
    }
    return m;
}

static int check_shape(const pxt_gpt_config *c, int B, int Lt, int La, int Nc, int S) {
    if (B < 1) {
        return pxt_error(PXT_ERR_VALUE, "batch_size: must be >= 1, got %d", B);
    }
    if (Lt < 1 || Lt > c->max_text) {
        return pxt_error(PXT_ERR_VALUE, "text_len: must be in [1, max_text_tokens=%d], got %d",
                         c->max_text, Lt);
    }
    if (La < 1 || La > c->max_audio) {
        return pxt_error(PXT_ERR_VALUE, "audio_len: must be in [1, max_audio_tokens=%d], got %d",
                         c->max_audio, La);
    }
    if (Nc < 0) {
        return pxt_error(PXT_ERR_VALUE, "cond_len: must be >= 0, got %d", Nc);
    }
    /* the step's rows (B x T) are GEMM dimensions, which are int */
    if ((int64_t)B * ((int64_t)Nc + Lt + La) > INT32_MAX) {
        return pxt_error(PXT_ERR_VALUE,
                         "batch_size: %d samples of %lld positions make %lld rows, more than the "
                         "limit of 2**31 - 1 per step",
                         B, (long long)Nc + Lt + La, (long long)B * ((long long)Nc + Lt + La));
    }
    if (S < 0) {
        return pxt_error(PXT_ERR_VALUE, "cond_frames: must be >= 0, got %d", S);
    }
    if (S > 0 && !c->conditioning) {
        return pxt_error(PXT_ERR_VALUE,
                         "cond_frames: %d mel frames, but this model has no conditioning path "
                         "(ModelConfig.conditioning is False); pass cond_latents instead",
                         S);
    }
    if (S > c->max_cond_frames) {
        return pxt_error(PXT_ERR_VALUE,
                         "cond_frames: %d mel frames exceed ModelConfig.max_cond_frames=%d; "
                         "pyxtts never truncates: shorten the reference or raise the maximum",
                         S, c->max_cond_frames);
    }
    /* the encoder's rows (B x S) and the perceiver's keys (B x (Nl + S)) are GEMM dimensions */
    if (S > 0 && (int64_t)B * ((int64_t)S + c->n_cond) > INT32_MAX) {
        return pxt_error(PXT_ERR_VALUE,
                         "batch_size: %d samples of %d mel frames make more rows than the limit of "
                         "2**31 - 1 per step",
                         B, S);
    }
    if (S > 0 && Nc != c->n_cond) {
        return pxt_error(PXT_ERR_VALUE,
                         "cond_len: the conditioning path gives n_cond_latents=%d latents, got "
                         "cond_len=%d",
                         c->n_cond, Nc);
    }
    if ((int64_t)Nc + Lt + La > c->max_seq) {
        return pxt_error(PXT_ERR_VALUE,
                         "sequence length %lld (%d conditioning + %d text + %d audio) exceeds "
                         "max_attention_sequence_length=%d; pyxtts never truncates: shorten the "
                         "sample or raise the maximum",
                         (long long)Nc + Lt + La, Nc, Lt, La, c->max_seq);
    }
    return PXT_OK;
}

/* ---- the conditioning path inside the GPT step ---------------------------------------- */

static size_t enc_bytes(const pxt_cond_plan *q, int act) {
    return pxt_enc_act_bytes(&q->shape, act);
}
static size_t perc_bytes(const pxt_cond_plan *q, int act) {
    return pxt_perc_act_bytes(&q->shape, act);
}

/* Its input: the mel (B, 80, S) in the model's dtype. */
static void cond_inputs(pxt_cond_plan *q, size_t *cur) {
    const pxt_cond_ctx *x = &q->shape;
    size_t start = *cur;
    q->mel = pxt_plan_take(cur, (size_t)x->B * PXT_MEL_CHANNELS * x->S * pxt_dtype_size(x->dt));
    q->inputs_bytes = *cur - start;
}

/* What training keeps from its forward to its backward (nothing in evaluation). */
static void cond_saved(pxt_cond_plan *q, size_t *cur) {
    const pxt_cond_ctx *x = &q->shape;
    size_t es = pxt_dtype_size(x->dt), start = *cur;
    size_t NS = (size_t)x->B * x->S, Nn = (size_t)x->B * x->Nl, C = (size_t)x->C;
    q->hs = pxt_plan_take(cur, (PXT_COND_BLOCKS + 1) * NS * C * es);
    q->lats = pxt_plan_take(cur, (PXT_PERC_LAYERS + 1) * Nn * C * es);
    q->rnorm = pxt_plan_take(cur, Nn * sizeof(float));
    for (int k = 0; k < PXT_COND_BLOCKS; k++) {
        for (int a = 0; a < PXT_ENC_ACTS; a++) {
            if (pxt_enc_saves(q->policy, a)) {
                q->enc[k][a] = pxt_plan_take(cur, enc_bytes(q, a));
            }
        }
    }
    for (int l = 0; l < PXT_PERC_LAYERS; l++) {
        for (int a = 0; a < PXT_PERC_ACTS; a++) {
            if (pxt_perc_saves(q->policy, a)) {
                q->perc[l][a] = pxt_plan_take(cur, perc_bytes(q, a));
            }
        }
    }
    q->dcond = pxt_plan_take(cur, Nn * C * es);
    q->saved_bytes = *cur - start;
}

/* Its scratch from `scratch` (see plan.h); returns where it ends. */
static size_t cond_scratch(pxt_cond_plan *q, const pxt_backend *be, size_t scratch, int train) {
    const pxt_cond_ctx *x = &q->shape;
    size_t es = pxt_dtype_size(x->dt), cur = scratch;
    size_t NS = (size_t)x->B * x->S, Nn = (size_t)x->B * x->Nl, C = (size_t)x->C;
    size_t F = (size_t)x->ff, inner = PXT_PERC_HEADS * PXT_PERC_HEAD_DIM;
    for (int a = 0; a < PXT_ENC_ACTS; a++) {
        if (!pxt_enc_saves(q->policy, a)) {
            q->enc_work[a] = pxt_plan_take(&cur, enc_bytes(q, a));
        }
    }
    for (int a = 0; a < PXT_PERC_ACTS; a++) {
        if (!pxt_perc_saves(q->policy, a)) {
            q->perc_work[a] = pxt_plan_take(&cur, perc_bytes(q, a));
        }
    }
    pxt_attn_args ea = pxt_enc_attn_args(x), pa = pxt_perc_attn_args(x);
    size_t ws = 0;
    if (be->attention_workspace) {
        for (int bwd = 0; bwd <= train; bwd++) {
            ws = max_sz(
                ws, max_sz(be->attention_workspace(&ea, bwd), be->attention_workspace(&pa, bwd)));
        }
    }
    q->attn_ws_bytes = pxt_plan_align(ws);
    q->attn_ws = pxt_plan_take(&cur, q->attn_ws_bytes);
    int shapes[PXT_COND_GEMMS_MAX][3];
    int n = pxt_cond_gemm_shapes(x, shapes);
    q->gemm_ws_bytes = pxt_plan_align(pxt_plan_gemm_ws(be, (const int (*)[3])shapes, n, x->dt));
    q->gemm_ws = pxt_plan_take(&cur, q->gemm_ws_bytes);
    int sums[PXT_COND_COLSUMS_MAX][2];
    n = pxt_cond_colsum_shapes(x, sums);
    q->reduce_ws_bytes =
        train ? pxt_plan_align(pxt_plan_colsum_ws(be, (const int (*)[2])sums, n)) : 0;
    q->reduce_ws = pxt_plan_take(&cur, q->reduce_ws_bytes); /* backward only */
    size_t phases = cur;
    /* phase 1, the forward: the RMS norm's output; evaluation's streams */
    q->out = pxt_plan_take(&cur, Nn * C * es);
    if (!train) {
        q->hs = pxt_plan_take(&cur, 2 * NS * C * es);
        q->lats = pxt_plan_take(&cur, 2 * Nn * C * es);
        q->rnorm = pxt_plan_take(&cur, Nn * sizeof(float));
    }
    size_t end = cur;
    if (train) { /* phase 2, the backward */
        cur = phases;
        q->d1 = pxt_plan_take(&cur, NS * C * es);
        size_t d2 = cur;
        q->d2 = pxt_plan_take(&cur, NS * C * es);
        q->datt = pxt_plan_take(&cur, NS * C * es);
        q->dqkv = pxt_plan_take(&cur, NS * 3 * C * es);
        end = max_sz(end, cur);
        cur = d2; /* the perceiver's, while d1 gathers the context's gradient */
        q->dl = pxt_plan_take(&cur, Nn * C * es);
        q->dg = pxt_plan_take(&cur, Nn * F * es);
        q->du = pxt_plan_take(&cur, Nn * 2 * F * es);
        q->pdatt = pxt_plan_take(&cur, Nn * inner * es);
        q->dq = pxt_plan_take(&cur, Nn * inner * es);
        q->dkv = pxt_plan_take(&cur, (size_t)x->B * ((size_t)x->Nl + x->S) * 2 * inner * es);
        end = max_sz(end, cur);
    }
    q->scratch_bytes = end - scratch;
    return end;
}

int pxt_plan_make(pxt_plan *p, const pxt_gpt_config *c, const pxt_backend *be, int B, int Lt,
                  int La, int Nc, int S, pxt_dtype dt, const pxt_ckpt *policy, int train) {
    memset(p, 0, sizeof *p);
    PXT_TRY(check_shape(c, B, Lt, La, Nc, S));
    p->B = B, p->Lt = Lt, p->La = La, p->Nc = Nc, p->T = Nc + Lt + La, p->N = B * p->T;
    p->C = c->d_model, p->H = c->n_heads, p->L = c->n_layers;
    p->text_vocab = c->text_vocab, p->audio_vocab = c->audio_vocab;
    p->dt = dt, p->train = train;
    /* a chunk gathers valid rows across samples: as many as the batch has, at most */
    int64_t most = (int64_t)B * (Lt > La ? Lt : La);
    p->logits_rows = most < LOGITS_ROWS ? (int)most : LOGITS_ROWS;
    int L = p->L;
    p->policy = malloc(sizeof *p->policy * (size_t)L);
    p->blocks = calloc((size_t)L, sizeof *p->blocks);
    p->block_saved_bytes = calloc((size_t)L, sizeof *p->block_saved_bytes);
    if (!p->policy || !p->blocks || !p->block_saved_bytes) {
        pxt_plan_free(p);
        return pxt_error(PXT_ERR_OOM, "out of host memory for the memory plan");
    }
    for (int l = 0; l < L; l++) {
        p->policy[l] = train ? policy[l] : PXT_CKPT_FULL; /* evaluation saves nothing */
    }
    /* a GPT block: causal self-attention, no context */
    /* with dropout the attention's workspace holds mask tiles: its probability counts */
    const pxt_ctx shape = {.B = B,
                           .T = p->T,
                           .C = p->C,
                           .H = p->H,
                           .dt = dt,
                           .drop_attn = {.p = train ? c->dropout : 0.0f}};
    size_t N = (size_t)p->N, C = (size_t)p->C, es = pxt_dtype_size(dt);
    size_t cur = 0;

    /* inputs: token ids, targets, position ids (int32), key mask, per-row losses, the
     * live values */
    p->text_ids = pxt_plan_take(&cur, (size_t)B * Lt * 4);
    p->audio_ids = pxt_plan_take(&cur, (size_t)B * La * 4);
    p->text_tgt = pxt_plan_take(&cur, (size_t)B * Lt * 4);
    p->audio_tgt = pxt_plan_take(&cur, (size_t)B * La * 4);
    p->text_pos = pxt_plan_take(&cur, (size_t)B * Lt * 4);
    p->audio_pos = pxt_plan_take(&cur, (size_t)B * La * 4);
    p->key_mask = pxt_plan_take(&cur, N);
    p->losses = pxt_plan_take(&cur, (size_t)B * (Lt + La) * sizeof(float));
    p->live = pxt_plan_take(&cur, 3 * sizeof(uint64_t));
    pxt_cond_plan *q = &p->cond;
    if (S > 0) {
        q->S = S;
        q->policy = train ? policy[L] : PXT_CKPT_FULL;
        q->shape = (pxt_cond_ctx){.dt = dt,
                                  .B = B,
                                  .S = S,
                                  .C = c->d_model,
                                  .H = c->n_heads,
                                  .G = pxt_cond_groups(c->d_model),
                                  .Nl = c->n_cond,
                                  .ff = pxt_cond_ff_inner(c->d_model)};
        cond_inputs(q, &cur);
    }
    p->inputs_bytes = cur;

    /* saved: residual stream (every block input, then the stack's output) */
    size_t nres = train ? (size_t)L + 1 : 2; /* evaluation ping-pongs two buffers */
    p->resid = pxt_plan_take(&cur, nres * N * C * es);
    p->resid_bytes = cur - p->resid;
    int needs_work[PXT_ACT_COUNT] = {0};
    for (int l = 0; l < L; l++) {
        p->block_saved_bytes[l] = pxt_plan_block_saved(&p->blocks[l], &cur, &shape, p->policy[l]);
        for (int a = 0; a < PXT_ACT_PLAIN; a++) {
            needs_work[a] |= !pxt_block_saves(p->policy[l], a);
        }
    }
    size_t final_start = cur;
    p->hf = pxt_plan_take(&cur, N * C * es);
    p->hf_mean = pxt_plan_take(&cur, N * 4);
    p->hf_rstd = pxt_plan_take(&cur, N * 4);
    p->h2 = pxt_plan_take(&cur, N * C * es);
    p->h2_mean = pxt_plan_take(&cur, N * 4);
    p->h2_rstd = pxt_plan_take(&cur, N * 4);
    p->final_bytes = cur - final_start;
    if (S > 0 && train) {
        cond_saved(q, &cur);
    }
    p->saved_bytes = cur - p->resid;

    /* scratch */
    p->scratch = cur;
    if (train) {
        p->dres = pxt_plan_take(&cur, N * C * es);
        p->dA = pxt_plan_take(&cur, N * 4 * C * es);
        p->dB = pxt_plan_take(&cur, N * C * es);
    }
    p->grad_bytes = cur - p->scratch;
    size_t after_grads = cur;
    p->work_bytes = pxt_plan_block_work(&p->work, &cur, &shape, needs_work);
    p->attn_ws_bytes = pxt_plan_attn_ws(be, &shape, train);
    p->attn_ws = pxt_plan_take(&cur, p->attn_ws_bytes);
    size_t block_phase_end = cur;
    /* heads: the logits chunk reuses the block area, which is idle by then */
    int V = c->text_vocab > c->audio_vocab ? c->text_vocab : c->audio_vocab;
    size_t lcur = after_grads;
    p->logits_bytes = (size_t)p->logits_rows * (size_t)pxt_head_ld(V) * sizeof(float);
    p->logits = pxt_plan_take(&lcur, p->logits_bytes);
    if (dt != PXT_FLOAT32) { /* the head GEMMs take one dtype for A and B; xent fp32 biases */
        size_t before = lcur;
        p->head_bias32 =
            pxt_plan_take(&lcur, ((size_t)c->text_vocab + (size_t)c->audio_vocab) * sizeof(float));
        if (train) {
            p->dlogits16 =
                pxt_plan_take(&lcur, (size_t)p->logits_rows * (size_t)pxt_head_ld(V) * es);
        }
        p->head_cast_bytes = lcur - before;
    }
    size_t rows = (size_t)p->logits_rows, before_gather = lcur;
    p->head_rows = pxt_plan_take(&lcur, rows * C * es);
    p->head_tgt = pxt_plan_take(&lcur, rows * sizeof(int32_t));
    p->head_loss = pxt_plan_take(&lcur, rows * sizeof(float));
    if (train) {
        p->head_dh = pxt_plan_take(&lcur, rows * C * es);
    }
    p->head_gather_bytes = lcur - before_gather;
    cur = max_sz(block_phase_end, lcur);
    p->gemm_ws_bytes = gpt_gemm_ws(p, &shape, be);
    p->gemm_ws = pxt_plan_take(&cur, p->gemm_ws_bytes);
    p->reduce_ws_bytes = train ? gpt_reduce_ws(p, &shape, be, c) : 0; /* backward only */
    p->reduce_ws = pxt_plan_take(&cur, p->reduce_ws_bytes);
    if (S > 0) { /* the conditioning path's phases share the region */
        cur = max_sz(cur, cond_scratch(q, be, p->scratch, train));
    }
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

int pxt_plan_same(const pxt_plan *a, const pxt_plan *b) {
    if (a->B != b->B || a->Lt != b->Lt || a->La != b->La || a->Nc != b->Nc ||
        a->train != b->train || a->L != b->L || !a->policy || !b->policy ||
        a->arena_bytes != b->arena_bytes || a->cond.S != b->cond.S ||
        a->cond.policy != b->cond.policy) {
        return 0;
    }
    for (int l = 0; l < a->L; l++) {
        if (a->policy[l] != b->policy[l]) {
            return 0;
        }
    }
    return 1;
}

/* ---- a standalone block ----------------------------------------------------------- */

void pxt_block_plan_make(pxt_block_plan *p, const pxt_backend *be, int B, int T, int Tc, int C,
                         int H, int cross, pxt_ckpt policy, pxt_dtype dt) {
    memset(p, 0, sizeof *p);
    p->B = B, p->T = T, p->Tc = cross ? Tc : 0, p->C = C, p->H = H, p->cross = cross;
    p->policy = policy, p->dt = dt;
    const pxt_ctx shape = {.B = B, .T = T, .C = C, .H = H, .Tc = p->Tc, .dt = dt};
    size_t es = pxt_dtype_size(dt), N = (size_t)B * T, Nc = (size_t)B * p->Tc, cur = 0;
    p->x = pxt_plan_take(&cur, N * C * es);
    p->key_mask = pxt_plan_take(&cur, N);
    if (cross) {
        p->context = pxt_plan_take(&cur, Nc * C * es);
        p->context_mask = pxt_plan_take(&cur, Nc);
    }
    p->inputs_bytes = cur;
    p->y = pxt_plan_take(&cur, N * C * es);
    p->output_bytes = cur - p->y;
    p->saved_bytes = pxt_plan_block_saved(&p->saved, &cur, &shape, policy);
    size_t start = cur;
    p->dres = pxt_plan_take(&cur, N * C * es);
    p->dA = pxt_plan_take(&cur, N * 4 * C * es);
    p->dB = pxt_plan_take(&cur, N * C * es);
    if (cross) {
        p->dkv = pxt_plan_take(&cur, Nc * 2 * C * es);
        p->dcontext = pxt_plan_take(&cur, Nc * C * es);
    }
    p->grad_bytes = cur - start;
    int needed[PXT_ACT_COUNT];
    for (int a = 0; a < PXT_ACT_COUNT; a++) {
        needed[a] = !pxt_block_saves(policy, a);
    }
    p->work_bytes = pxt_plan_block_work(&p->work, &cur, &shape, needed);
    /* bytes as the arena lays them out, so the parts add up to the arena */
    p->attn_ws_bytes = pxt_plan_align(pxt_plan_attn_ws(be, &shape, 1));
    p->attn_ws = pxt_plan_take(&cur, p->attn_ws_bytes);
    int shapes[PXT_BLOCK_GEMMS_MAX][3];
    int n = pxt_block_gemm_shapes(&shape, shapes);
    p->gemm_ws_bytes = pxt_plan_align(pxt_plan_gemm_ws(be, (const int (*)[3])shapes, n, dt));
    p->gemm_ws = pxt_plan_take(&cur, p->gemm_ws_bytes);
    int sums[PXT_BLOCK_COLSUMS_MAX][2];
    int ns = pxt_block_colsum_shapes(&shape, sums);
    p->reduce_ws_bytes = pxt_plan_align(pxt_plan_colsum_ws(be, (const int (*)[2])sums, ns));
    p->reduce_ws = pxt_plan_take(&cur, p->reduce_ws_bytes);
    p->arena_bytes = cur;
}

int pxt_block_plan_same(const pxt_block_plan *a, const pxt_block_plan *b) {
    return a->B == b->B && a->T == b->T && a->Tc == b->Tc && a->cross == b->cross &&
           a->policy == b->policy && a->arena_bytes == b->arena_bytes;
}

#undef LOGITS_ROWS
