/* gpt.c: the XTTS GPT step (see gpt.h): forward, fused heads, backward. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpt.h"

int pxt_gpt_init(pxt_gpt *m, const pxt_gpt_config *c, pxt_device dev, pxt_dtype dt, int ckpt,
                 uint64_t seed) {
    memset(m, 0, sizeof *m);
    PXT_TRY(pxt_gpt_config_check(c));
    const pxt_backend *be = pxt_backend_for(dev.type);
    char dname[32];
    if (!be) {
        return pxt_error(PXT_ERR_VALUE, "device: this build has no backend for %s",
                         pxt_device_str(dev, dname, sizeof dname));
    }
    PXT_TRY(pxt_ctx_check_ops(be, pxt_device_str(dev, dname, sizeof dname)));
    pxt_param_layout layout;
    PXT_TRY(pxt_param_layout_init(&layout, c));
    m->cfg = *c;
    m->ckpt = ckpt;
    return pxt_flat_init(&m->flat, &layout, dev, dt, seed,
                         0.02f / sqrtf(2.0f * (float)c->n_layers));
}

void pxt_gpt_free_graphs(pxt_gpt *m) {
    const pxt_backend *be = m->flat.be;
    for (int i = 0; i < PXT_GPT_GRAPHS; i++) {
        if (m->graph[i].graph && be && be->graph_free) {
            be->graph_free(m->flat.device.index, m->graph[i].graph);
        }
        m->graph[i].graph = NULL;
    }
}

void pxt_gpt_free(pxt_gpt *m) {
    pxt_gpt_free_graphs(m);
    pxt_storage_clear(&m->arena);
    pxt_plan_free(&m->plan);
    pxt_flat_free(&m->flat);
}

/* ---- the plan --------------------------------------------------------------------- */

int pxt_gpt_plan(pxt_plan *p, const pxt_gpt_config *c, const pxt_backend *be, pxt_dtype dt, int B,
                 int Lt, int La, int Nc, int S, int ckpt, int train, size_t budget) {
    int L = c->n_layers, n = L + (S > 0); /* units: the blocks, then the conditioning path */
    memset(p, 0, sizeof *p);              /* the auto loop frees the previous try */
    pxt_ckpt *pol = malloc(sizeof *pol * (size_t)n);
    if (!pol) {
        return pxt_error(PXT_ERR_OOM, "out of host memory for the memory plan");
    }
    int rc;
    if (ckpt != PXT_CKPT_AUTO || !train) {
        for (int u = 0; u < n; u++) {
            pol[u] = ckpt == PXT_CKPT_AUTO ? PXT_CKPT_NONE : (pxt_ckpt)ckpt;
        }
        rc = pxt_plan_make(p, c, be, B, Lt, La, Nc, S, dt, pol, train);
    } else {
        rc = PXT_OK;
        for (int step = 0; step <= 2 * n; step++) {
            /* step k: the first min(k, n) units selective, the first k - n full, the
             * conditioning path (unit L, stored last) counted first */
            for (int i = 0; i < n; i++) {
                int u = S > 0 ? (i == 0 ? L : i - 1) : i;
                pol[u] = i < step - n ? PXT_CKPT_FULL
                         : i < step   ? PXT_CKPT_SELECTIVE
                                      : PXT_CKPT_NONE;
            }
            pxt_plan_free(p);
            rc = pxt_plan_make(p, c, be, B, Lt, La, Nc, S, dt, pol, train);
            if (rc != PXT_OK || p->arena_bytes <= budget) {
                break;
            }
        }
    }
    free(pol);
    return rc;
}

size_t pxt_gpt_fixed_bytes(const pxt_gpt_blocks *b, int train) {
    return b->params + (train ? b->grads + b->opt : 0);
}

size_t pxt_gpt_total_bytes(const pxt_gpt_blocks *b, int train) {
    return pxt_gpt_fixed_bytes(b, train) + b->arena;
}

size_t pxt_gpt_arena_budget(const pxt_gpt *m) {
    pxt_allocator *a = pxt_allocator_get(m->flat.device);
    pxt_alloc_stats s;
    pxt_get_stats(a, &s);
    size_t cap = s.limit_bytes != PXT_NO_LIMIT ? s.limit_bytes : pxt_allocator_device_total(a);
    size_t used = s.allocated_bytes - (m->arena ? pxt_block_size(m->arena->block) : 0);
    return cap > used ? cap - used : 0;
}

/* ---- before the step -------------------------------------------------------------- */

int pxt_gpt_check_batch(const pxt_gpt *m, const pxt_gpt_batch *in, int train) {
    const pxt_gpt_config *c = &m->cfg;
    char dname[32];
    PXT_TRY(pxt_ctx_check_extra_ops(m->flat.be, pxt_device_str(m->flat.device, dname, sizeof dname),
                                    train && c->dropout > 0.0f, in->S > 0));
    if (in->S > 0 && (!in->mels || in->cond)) {
        return pxt_error(PXT_ERR_VALUE, "_step: mels and cond are exclusive");
    }
    for (int b = 0; b < in->B; b++) {
        if (in->text_len[b] < 0 || in->text_len[b] > in->Lt || in->audio_len[b] < 0 ||
            in->audio_len[b] > in->La) {
            return pxt_error(PXT_ERR_VALUE, "_step: lengths of sample %d out of range", b);
        }
    }
    for (size_t i = 0; i < (size_t)in->B * in->Lt; i++) {
        if (in->text_ids[i] < 0 || in->text_ids[i] >= c->text_vocab || in->text_tgt[i] < -1 ||
            in->text_tgt[i] >= c->text_vocab || in->text_pos[i] < 0 ||
            in->text_pos[i] >= c->max_text) {
            return pxt_error(PXT_ERR_VALUE, "_step: text id, target or position out of range");
        }
    }
    for (size_t i = 0; i < (size_t)in->B * in->La; i++) {
        if (in->audio_ids[i] < 0 || in->audio_ids[i] >= c->audio_vocab || in->audio_tgt[i] < -1 ||
            in->audio_tgt[i] >= c->audio_vocab || in->audio_pos[i] < 0 ||
            in->audio_pos[i] >= c->max_audio) {
            return pxt_error(PXT_ERR_VALUE, "_step: audio id, target or position out of range");
        }
    }
    if (!(in->loss_scale > 0.0) || !isfinite(in->loss_scale)) {
        return pxt_error(PXT_ERR_VALUE, "loss_scale: must be a finite number > 0, got %g",
                         in->loss_scale);
    }
    return PXT_OK;
}

int pxt_gpt_reserve(pxt_gpt *m, pxt_plan *p, int keep_larger) {
    if (m->arena && pxt_plan_same(&m->plan, p)) {
        pxt_plan_free(p);
        return PXT_OK;
    }
    if (m->arena && keep_larger && m->arena->nbytes >= p->arena_bytes) {
        pxt_plan_free(&m->plan); /* p's offsets, in the arena there is */
        m->plan = *p;
        memset(p, 0, sizeof *p);
        return PXT_OK;
    }
    pxt_gpt_free_graphs(m); /* they hold the old arena's addresses */
    pxt_storage_clear(&m->arena);
    pxt_plan_free(&m->plan);
    int rc = pxt_storage_new(m->flat.device, p->arena_bytes, &m->arena);
    if (rc != PXT_OK) {
        pxt_plan_free(p);
        return rc;
    }
    m->plan = *p; /* arrays move over */
    memset(p, 0, sizeof *p);
    return PXT_OK;
}

int pxt_gpt_plan_arena(const pxt_gpt *m, pxt_allocator *plan, const pxt_plan *p, size_t *out) {
    if (m->arena && pxt_plan_same(&m->plan, p)) {
        *out = pxt_block_size(m->arena->block);
        return PXT_OK;
    }
    if (m->arena) {
        pxt_alloc_plan_release(plan, m->arena->block);
    }
    return pxt_alloc_plan_take(plan, p->arena_bytes, out);
}

size_t pxt_gpt_release_arena(pxt_gpt *m) {
    size_t n = m->arena ? m->arena->nbytes : 0;
    pxt_gpt_free_graphs(m);
    pxt_storage_clear(&m->arena);
    pxt_plan_free(&m->plan);
    return n;
}

/* ---- the step ----------------------------------------------------------------------- */

static pxt_copy_kind host_copy(const pxt_gpt *m) {
    return m->flat.device.type == PXT_CPU ? PXT_COPY_D2D : PXT_COPY_H2D;
}

static void block_views(const pxt_gpt *m, int layer, pxt_block_params *p, pxt_block_grads *g) {
    int first = m->flat.layout.block0 + layer * PXT_BLOCK_TENSORS;
    for (int j = 0; j < PXT_BLOCK_TENSORS; j++) {
        p->w[j] = pxt_flat_param(&m->flat, first + j);
        g->g[j] = pxt_flat_grad(&m->flat, first + j);
    }
}

/* Block l's activations: where its policy saves them, else in the work area
 * (recomputed there in backward). l < 0: everything in the work area. */
static pxt_block_acts block_acts(char *base, const pxt_plan *p, int l) {
    if (l < 0) {
        return pxt_plan_block_acts(base, &p->work, &p->work, PXT_CKPT_FULL, 0);
    }
    return pxt_plan_block_acts(base, &p->blocks[l], &p->work, p->policy[l], 0);
}

/* ---- dropout -------------------------------------------------------------------------- */

enum { SITE_EMBED = 0, SITE_ATTN = 1, SITE_ATTN_OUT = 2, SITE_MLP_OUT = 3 }; /* + 3 l */

/* The masks of one site of this step over the sequence's rows: p = 0 in
 * evaluation; positions count from 0 in each segment (cond | text | audio). */
static pxt_dropout site_dropout(const pxt_gpt *m, const pxt_plan *p, const char *base,
                                uint32_t site) {
    float prob = p->train ? m->cfg.dropout : 0.0f;
    /* the key and first sample are read by the kernels from the arena (upload wrote
     * them): the step's launches do not depend on them */
    return pxt_dropout_make_live(prob, (const uint64_t *)(base + p->live), site, p->T, p->Nc,
                                 p->Nc + p->Lt);
}

/* The step's context for block l: its three dropout sites. */
static pxt_ctx layer_ctx(const pxt_gpt *m, const pxt_plan *p, const char *base, const pxt_ctx *x,
                         int l) {
    pxt_ctx xl = *x;
    if (p->train && m->cfg.dropout > 0.0f) {
        uint32_t site = 3 * (uint32_t)l;
        xl.drop_attn = site_dropout(m, p, base, site + SITE_ATTN);
        xl.drop_attn_out = site_dropout(m, p, base, site + SITE_ATTN_OUT);
        xl.drop_mlp_out = site_dropout(m, p, base, site + SITE_MLP_OUT);
    }
    return xl;
}

/* ---- the conditioning path inside the step --------------------------------------------- */

static pxt_cond_ctx cond_ctx(const pxt_gpt *m, const pxt_plan *p, char *base) {
    pxt_cond_ctx x = p->cond.shape;
    x.be = m->flat.be;
    x.dev = m->flat.device.index;
    x.attn_ws = base + p->cond.attn_ws;
    x.gemm_ws = base + p->cond.gemm_ws;
    x.reduce_ws = base + p->cond.reduce_ws;
    return x;
}

static pxt_enc_acts enc_acts(char *base, const pxt_cond_plan *q, int k) {
    pxt_enc_acts a;
    for (int i = 0; i < PXT_ENC_ACTS; i++) {
        int saved = k >= 0 && pxt_enc_saves(q->policy, i);
        a.a[i] = base + (saved ? q->enc[k][i] : q->enc_work[i]);
    }
    return a;
}

static pxt_perc_acts perc_acts(char *base, const pxt_cond_plan *q, int l) {
    pxt_perc_acts a;
    for (int i = 0; i < PXT_PERC_ACTS; i++) {
        int saved = l >= 0 && pxt_perc_saves(q->policy, i);
        a.a[i] = base + (saved ? q->perc[l][i] : q->perc_work[i]);
    }
    return a;
}

/* Slot i of a stream of (rows, C) buffers: every slot in training, two that
 * take turns in evaluation. */
static char *slot(const pxt_plan *p, char *first, int i, size_t rows) {
    size_t bytes = rows * (size_t)p->C * pxt_dtype_size(p->dt);
    return first + (size_t)(p->train ? i : i % 2) * bytes;
}

/* x0's conditioning rows (B, Nl of T, C) from the mels: encoder, perceiver, RMS norm. */
static int cond_forward(const pxt_gpt *m, const pxt_plan *p, char *base, char *x0) {
    const pxt_cond_plan *q = &p->cond;
    const pxt_backend *be = m->flat.be;
    pxt_cond_ctx x = cond_ctx(m, p, base);
    pxt_cond_params w;
    pxt_cond_grads g;
    pxt_cond_views(&m->flat, &w, &g);
    int d = x.dev, C = p->C, Nl = x.Nl;
    size_t NS = (size_t)p->B * x.S, Nn = (size_t)p->B * Nl, row = (size_t)C * pxt_dtype_size(p->dt);
    char *hs = base + q->hs, *lats = base + q->lats;
    PXT_TRY(pxt_cond_init_forward(&x, &w, base + q->mel, slot(p, hs, 0, NS)));
    for (int k = 0; k < PXT_COND_BLOCKS; k++) {
        pxt_enc_acts a = enc_acts(base, q, p->train ? k : -1);
        PXT_TRY(pxt_enc_forward(&x, &w, k, &a, slot(p, hs, k, NS), slot(p, hs, k + 1, NS)));
    }
    const char *context = slot(p, hs, PXT_COND_BLOCKS, NS); /* (B*S, C) */
    for (int b = 0; b < p->B; b++) { /* every sample starts from the same latents */
        PXT_TRY(be->copy(d, lats + (size_t)b * Nl * row, w.w[PXT_CE_LATENTS], (size_t)Nl * row,
                         PXT_COPY_D2D));
    }
    for (int l = 0; l < PXT_PERC_LAYERS; l++) {
        pxt_perc_acts a = perc_acts(base, q, p->train ? l : -1);
        PXT_TRY(pxt_perc_forward(&x, &w, l, &a, slot(p, lats, l, Nn), context,
                                 slot(p, lats, l + 1, Nn)));
    }
    char *out = base + q->out; /* (B*Nl, C) */
    PXT_TRY(be->rmsnorm_forward(d, out, (float *)(base + q->rnorm),
                                slot(p, lats, PXT_PERC_LAYERS, Nn), w.w[PXT_CP_GAMMA], (int)Nn, C,
                                sqrtf((float)C), PXT_RMSNORM_EPS, p->dt));
    for (int b = 0; b < p->B; b++) {
        PXT_TRY(be->copy(d, x0 + (size_t)b * p->T * row, out + (size_t)b * Nl * row,
                         (size_t)Nl * row, PXT_COPY_D2D));
    }
    return PXT_OK;
}

/* The conditioning path's gradients from dx0's conditioning rows (in dres). */
static int cond_backward(const pxt_gpt *m, const pxt_plan *p, char *base, const char *dx0) {
    const pxt_cond_plan *q = &p->cond;
    const pxt_backend *be = m->flat.be;
    pxt_cond_ctx x = cond_ctx(m, p, base);
    pxt_cond_params w;
    pxt_cond_grads g;
    pxt_cond_views(&m->flat, &w, &g);
    int d = x.dev, C = p->C, Nl = x.Nl;
    size_t es = pxt_dtype_size(p->dt), NS = (size_t)p->B * x.S, Nn = (size_t)p->B * Nl;
    size_t row = (size_t)C * es;
    char *hs = base + q->hs, *lats = base + q->lats, *dcond = base + q->dcond;
    for (int b = 0; b < p->B; b++) { /* dcond (B*Nl, C): the rows the perceiver wrote */
        PXT_TRY(be->copy(d, dcond + (size_t)b * Nl * row, dx0 + (size_t)b * p->T * row,
                         (size_t)Nl * row, PXT_COPY_D2D));
    }
    /* RMS norm, then the perceiver's layers top-down; d1 gathers the context's gradient */
    char *dl = base + q->dl, *d1 = base + q->d1, *d2 = base + q->d2;
    PXT_TRY(be->memset_zero(d, dl, Nn * row));
    PXT_TRY(be->rmsnorm_backward(d, dl, g.g[PXT_CP_GAMMA], dcond,
                                 slot(p, lats, PXT_PERC_LAYERS, Nn), w.w[PXT_CP_GAMMA],
                                 (const float *)(base + q->rnorm), (int)Nn, C, sqrtf((float)C),
                                 PXT_RMSNORM_EPS, p->dt, x.reduce_ws));
    PXT_TRY(be->memset_zero(d, d1, NS * row));
    const char *context = slot(p, hs, PXT_COND_BLOCKS, NS);
    pxt_perc_acts pwork = perc_acts(base, q, -1);
    pxt_perc_scratch ps = {base + q->dg, base + q->du, base + q->pdatt, base + q->dq,
                           base + q->dkv};
    for (int l = PXT_PERC_LAYERS - 1; l >= 0; l--) {
        pxt_perc_acts saved = perc_acts(base, q, l);
        PXT_TRY(pxt_perc_backward(&x, &w, &g, l, &saved, &pwork, q->policy, slot(p, lats, l, Nn),
                                  context, dl, d1, &ps));
    }
    /* the latents, shared by every sample: dlatents (Nl, C) += sum over samples */
    PXT_TRY(
        be->bias_backward(d, g.g[PXT_CE_LATENTS], dl, p->B, Nl * C, Nl * C, p->dt, x.reduce_ws));
    /* the encoder's blocks top-down: dy is overwritten, dh gathers the input's gradient */
    pxt_enc_acts ework = enc_acts(base, q, -1);
    char *dy = d1, *dh = d2;
    for (int k = PXT_COND_BLOCKS - 1; k >= 0; k--) {
        pxt_enc_acts saved = enc_acts(base, q, k);
        PXT_TRY(be->memset_zero(d, dh, NS * row));
        PXT_TRY(pxt_enc_backward(&x, &w, &g, k, &saved, &ework, q->policy, slot(p, hs, k, NS), dy,
                                 dh, base + q->datt, base + q->dqkv));
        char *t = dy;
        dy = dh;
        dh = t;
    }
    return pxt_cond_init_backward(&x, &w, &g, base + q->mel, dy);
}

/* ---- upload, embeddings, heads ------------------------------------------------------ */

/* Copies the batch into the arena's input region. */
static int upload(const pxt_gpt *m, const pxt_plan *p, char *base, const pxt_gpt_batch *in) {
    const pxt_backend *be = m->flat.be;
    int d = m->flat.device.index;
    pxt_copy_kind k = host_copy(m);
    size_t bt = (size_t)p->B * p->Lt * 4, ba = (size_t)p->B * p->La * 4;
    PXT_TRY(be->copy(d, base + p->text_ids, in->text_ids, bt, k));
    PXT_TRY(be->copy(d, base + p->audio_ids, in->audio_ids, ba, k));
    PXT_TRY(be->copy(d, base + p->text_tgt, in->text_tgt, bt, k));
    PXT_TRY(be->copy(d, base + p->audio_tgt, in->audio_tgt, ba, k));
    PXT_TRY(be->copy(d, base + p->text_pos, in->text_pos, bt, k));
    PXT_TRY(be->copy(d, base + p->audio_pos, in->audio_pos, ba, k));
    PXT_TRY(be->copy(d, base + p->key_mask, in->key_mask, (size_t)p->N, k));
    if (p->Nc && in->cond) { /* fixed latents: x0's conditioning rows, per sample */
        size_t row = (size_t)p->C * pxt_dtype_size(p->dt);
        for (int b = 0; b < p->B; b++) {
            PXT_TRY(be->copy(d, base + p->resid + (size_t)b * p->T * row,
                             in->cond + (size_t)b * p->Nc * row, (size_t)p->Nc * row, k));
        }
    }
    const uint64_t live[3] = {in->dropout_seed, in->dropout_step, in->sample0};
    PXT_TRY(be->copy(d, base + p->live, live, sizeof live, k)); /* src reusable on return */
    if (p->cond.S) {
        PXT_TRY(be->copy(d, base + p->cond.mel, in->mels,
                         (size_t)p->B * PXT_MEL_CHANNELS * p->cond.S * pxt_dtype_size(p->dt), k));
    }
    return be->memset_zero(d, base + p->losses, (size_t)p->B * (p->Lt + p->La) * sizeof(float));
}

/* x0 (N, C) = [cond | text emb + text pos | audio emb + audio pos] per sample;
 * the conditioning rows are left as upload (fixed latents) or the conditioning
 * path wrote them. */
static int embed_forward(const pxt_gpt *m, const pxt_plan *p, char *base, char *x0) {
    const pxt_backend *be = m->flat.be;
    const pxt_param_layout *l = &m->flat.layout;
    int d = m->flat.device.index, C = p->C, T = p->T;
    size_t row = (size_t)C * pxt_dtype_size(p->dt);
    for (int b = 0; b < p->B; b++) {
        char *xb = x0 + (size_t)b * T * row;
        char *xt = xb + (size_t)p->Nc * row, *xa = xt + (size_t)p->Lt * row;
        const int32_t *ti = (const int32_t *)(base + p->text_ids) + (size_t)b * p->Lt;
        const int32_t *tp = (const int32_t *)(base + p->text_pos) + (size_t)b * p->Lt;
        const int32_t *ai = (const int32_t *)(base + p->audio_ids) + (size_t)b * p->La;
        const int32_t *ap = (const int32_t *)(base + p->audio_pos) + (size_t)b * p->La;
        PXT_TRY(be->embedding_forward(d, xt, ti, pxt_flat_param(&m->flat, l->text_emb), p->Lt, C, 0,
                                      p->dt));
        PXT_TRY(be->embedding_forward(d, xt, tp, pxt_flat_param(&m->flat, l->text_pos), p->Lt, C, 1,
                                      p->dt));
        PXT_TRY(be->embedding_forward(d, xa, ai, pxt_flat_param(&m->flat, l->mel_emb), p->La, C, 0,
                                      p->dt));
        PXT_TRY(be->embedding_forward(d, xa, ap, pxt_flat_param(&m->flat, l->mel_pos), p->La, C, 1,
                                      p->dt));
    }
    return PXT_OK;
}

/* The tables' gradients += scatter of dx0 (N, C), the conditioning rows left out. */
static int embed_backward(const pxt_gpt *m, const pxt_plan *p, char *base, const char *dx0) {
    const pxt_backend *be = m->flat.be;
    const pxt_param_layout *l = &m->flat.layout;
    int d = m->flat.device.index, C = p->C, T = p->T;
    const pxt_gpt_config *c = &m->cfg;
    size_t row = (size_t)C * pxt_dtype_size(p->dt);
    void *ws = base + p->reduce_ws; /* (embedding_workspace bytes) */
    for (int b = 0; b < p->B; b++) {
        const char *dt_ = dx0 + ((size_t)b * T + p->Nc) * row, *da = dt_ + (size_t)p->Lt * row;
        const int32_t *ti = (const int32_t *)(base + p->text_ids) + (size_t)b * p->Lt;
        const int32_t *tp = (const int32_t *)(base + p->text_pos) + (size_t)b * p->Lt;
        const int32_t *ai = (const int32_t *)(base + p->audio_ids) + (size_t)b * p->La;
        const int32_t *ap = (const int32_t *)(base + p->audio_pos) + (size_t)b * p->La;
        PXT_TRY(be->embedding_backward(d, pxt_flat_grad(&m->flat, l->text_emb), dt_, ti, p->Lt, C,
                                       c->text_vocab, p->dt, ws));
        PXT_TRY(be->embedding_backward(d, pxt_flat_grad(&m->flat, l->text_pos), dt_, tp, p->Lt, C,
                                       c->max_text, p->dt, ws));
        PXT_TRY(be->embedding_backward(d, pxt_flat_grad(&m->flat, l->mel_emb), da, ai, p->La, C,
                                       c->audio_vocab, p->dt, ws));
        PXT_TRY(be->embedding_backward(d, pxt_flat_grad(&m->flat, l->mel_pos), da, ap, p->La, C,
                                       c->max_audio, p->dt, ws));
    }
    return PXT_OK;
}

/* One gathered segment: n rows from sample b, position t, at chunk row at. A
 * chunk holds at most PXT_HEAD_SEGS segments (samples shorter than a chunk / 64
 * rows end a chunk early rather than overflow the list). */
#define PXT_HEAD_SEGS 64

typedef struct {
    int b, t, at, n;
} head_seg;

/* One head: rows off.. of each sample, L of them, lens[b] valid. */
typedef struct {
    int head_w, head_b, V, off, L;
    const int32_t *lens; /* (B) host */
    const int32_t *tgt;  /* (B, L) device */
    float *losses;       /* (B, L) device */
    const float *bias32; /* (V) fp32 copy of the bias (16-bit models), else NULL */
    float scale;         /* of the loss gradient */
} head_spec;

/* One chunk of gathered rows: the h2 rows and targets copied together, logits,
 * cross-entropy and (train) dh2 rows, dW, db; the losses and dh2 rows copied
 * back to their samples. */
static int head_chunk(const pxt_gpt *m, const pxt_plan *p, char *base, const pxt_ctx *x,
                      const head_spec *h, const head_seg *segs, int nseg, int n) {
    const pxt_backend *be = m->flat.be;
    int d = m->flat.device.index, C = p->C, V = h->V;
    pxt_dtype dt = p->dt;
    size_t es = pxt_dtype_size(dt), row = (size_t)C * es;
    const int ld = pxt_head_ld(V);                       /* logits rows, aligned */
    float *logits = (float *)(base + p->logits);         /* (n, V) fp32, rows ld apart */
    char *rows = base + p->head_rows;                    /* (n, C) */
    int32_t *tgt = (int32_t *)(base + p->head_tgt);      /* (n) */
    float *loss = (float *)(base + p->head_loss);        /* (n) */
    const char *W = pxt_flat_param(&m->flat, h->head_w); /* (V, C) */
    int wide = dt == PXT_FLOAT32;
    for (int s = 0; s < nseg; s++) { /* gather */
        size_t src = (size_t)segs[s].b * p->T + (size_t)h->off + (size_t)segs[s].t;
        PXT_TRY(be->copy(d, rows + (size_t)segs[s].at * row, base + p->h2 + src * row,
                         (size_t)segs[s].n * row, PXT_COPY_D2D));
        PXT_TRY(be->copy(d, tgt + segs[s].at, h->tgt + (size_t)segs[s].b * h->L + segs[s].t,
                         (size_t)segs[s].n * sizeof(int32_t), PXT_COPY_D2D));
    }
    PXT_TRY(be->gemm_ld(d, 0, 1, n, V, C, 1.0f, rows, C, W, C, 0.0f, logits, ld, dt, PXT_FLOAT32,
                        x->gemm_ws));
    /* the bias is added inside the cross-entropy: one pass over the logits less */
    const float *bias32 = wide ? (const float *)pxt_flat_param(&m->flat, h->head_b) : h->bias32;
    PXT_TRY(be->softmax_xent(d, logits, ld, bias32, loss, tgt, n, V, h->scale, p->train));
    for (int s = 0; s < nseg; s++) { /* the losses back to their (b, t) */
        PXT_TRY(be->copy(d, h->losses + (size_t)segs[s].b * h->L + segs[s].t, loss + segs[s].at,
                         (size_t)segs[s].n * sizeof(float), PXT_COPY_D2D));
    }
    if (!p->train) {
        return PXT_OK;
    }
    /* the gemms' A and B share one dtype: a 16-bit model feeds them a dt copy of
     * dlogits (the fp32 logits chunk stays for the bias gradient); the copy is of
     * whole rows, the zeros between them included */
    void *dlog = wide ? (void *)logits : (void *)(base + p->dlogits16); /* (n, V), rows ld apart */
    if (!wide) {
        PXT_TRY(be->cast(d, dlog, dt, logits, PXT_FLOAT32, (size_t)n * ld));
    }
    char *dh = base + p->head_dh; /* (n, C) */
    PXT_TRY(be->gemm_ld(d, 0, 0, n, C, V, 1.0f, dlog, ld, W, C, 0.0f, dh, C, dt, dt, x->gemm_ws));
    PXT_TRY(be->gemm_ld(d, 1, 0, V, C, n, 1.0f, dlog, ld, rows, C, 1.0f,
                        pxt_flat_grad(&m->flat, h->head_w), C, dt, PXT_FLOAT32, x->gemm_ws));
    PXT_TRY(be->bias_backward(d, pxt_flat_grad(&m->flat, h->head_b), logits, n, V, ld, PXT_FLOAT32,
                              x->reduce_ws));
    for (int s = 0; s < nseg; s++) { /* dh2 rows back into dB (N, C) */
        size_t dst = (size_t)segs[s].b * p->T + (size_t)h->off + (size_t)segs[s].t;
        PXT_TRY(be->copy(d, base + p->dB + dst * row, dh + (size_t)segs[s].at * row,
                         (size_t)segs[s].n * row, PXT_COPY_D2D));
    }
    return PXT_OK;
}

/* One head over the valid rows of every sample, in chunks of logits_rows rows
 * gathered across samples: products of M = logits_rows rows instead of one per
 * sample. Padding rows are never computed: they keep loss 0 and dh2 0. */
static int head_all(const pxt_gpt *m, const pxt_plan *p, char *base, const pxt_ctx *x,
                    const head_spec *h) {
    head_seg segs[PXT_HEAD_SEGS];
    int nseg = 0, n = 0;
    for (int b = 0; b < p->B; b++) {
        for (int t = 0; t < h->lens[b];) {
            int take = h->lens[b] - t < p->logits_rows - n ? h->lens[b] - t : p->logits_rows - n;
            segs[nseg++] = (head_seg){b, t, n, take};
            n += take;
            t += take;
            if (n == p->logits_rows || nseg == PXT_HEAD_SEGS) { /* a full chunk */
                PXT_TRY(head_chunk(m, p, base, x, h, segs, nseg, n));
                nseg = n = 0;
            }
        }
    }
    return n ? head_chunk(m, p, base, x, h, segs, nseg, n) : PXT_OK;
}

/* Both heads over every sample's valid rows; the padding rows keep loss 0 and dh2 0.
 * The per-row losses stay on the device (losses_sum reads them back). */
static int heads(const pxt_gpt *m, const pxt_plan *p, char *base, const pxt_ctx *x,
                 const pxt_gpt_batch *in) {
    const pxt_backend *be = m->flat.be;
    const pxt_param_layout *l = &m->flat.layout;
    int d = m->flat.device.index;
    if (p->train) {
        PXT_TRY(be->memset_zero(d, base + p->dB, (size_t)p->N * p->C * pxt_dtype_size(p->dt)));
    }
    float *tl = (float *)(base + p->losses), *al = tl + (size_t)p->B * p->Lt;
    /* loss_scale (fp16 training) scales only the gradient; the losses stay unscaled */
    float ts = in->n_text > 0 ? (float)(m->cfg.text_w * in->loss_scale / in->n_text) : 0.0f;
    float as = in->n_audio > 0 ? (float)(m->cfg.audio_w * in->loss_scale / in->n_audio) : 0.0f;
    float *tb32 = NULL, *ab32 = NULL;
    if (p->dt != PXT_FLOAT32) { /* add_bias takes out and bias of one dtype: fp32 biases */
        tb32 = (float *)(base + p->head_bias32);
        ab32 = tb32 + p->text_vocab;
        PXT_TRY(be->cast(d, tb32, PXT_FLOAT32, pxt_flat_param(&m->flat, l->text_head_b), p->dt,
                         (size_t)p->text_vocab));
        PXT_TRY(be->cast(d, ab32, PXT_FLOAT32, pxt_flat_param(&m->flat, l->mel_head_b), p->dt,
                         (size_t)p->audio_vocab));
    }
    const int32_t *ttgt = (const int32_t *)(base + p->text_tgt);
    const int32_t *atgt = (const int32_t *)(base + p->audio_tgt);
    head_spec th = {l->text_head_w, l->text_head_b,
                    p->text_vocab,  p->Nc,
                    p->Lt,          in->text_len,
                    ttgt,           tl,
                    tb32,           ts};
    head_spec ah = {l->mel_head_w,  l->mel_head_b,
                    p->audio_vocab, p->Nc + p->Lt,
                    p->La,          in->audio_len,
                    atgt,           al,
                    ab32,           as};
    PXT_TRY(head_all(m, p, base, x, &th));
    PXT_TRY(head_all(m, p, base, x, &ah));
    return PXT_OK;
}

/* The loss sums, read back to the host: the step's one wait for the device. */
static int losses_sum(const pxt_gpt *m, const pxt_plan *p, char *base, pxt_gpt_losses *out) {
    const pxt_backend *be = m->flat.be;
    int d = m->flat.device.index;
    const float *tl = (const float *)(base + p->losses), *al = tl + (size_t)p->B * p->Lt;
    PXT_TRY(be->sum(d, &out->text_sum, tl, (size_t)p->B * p->Lt));
    return be->sum(d, &out->audio_sum, al, (size_t)p->B * p->La);
}

/* The stack's output: resid[L] in training, the last of the two in evaluation. */
static char *stack_top(const pxt_plan *p, char *base) {
    size_t NC = (size_t)p->N * p->C * pxt_dtype_size(p->dt);
    return base + p->resid + (p->train ? (size_t)p->L : (size_t)(p->L % 2)) * NC;
}

/* forward: block l reads resid[l], writes resid[l + 1] (evaluation ping-pongs
 * two); then ln_f and final_norm. x0 = resid[0] holds the conditioning rows on
 * entry. */
static int gpt_forward(const pxt_gpt *m, const pxt_plan *p, char *base, const pxt_ctx *x) {
    const pxt_backend *be = m->flat.be;
    const pxt_param_layout *l = &m->flat.layout;
    int d = m->flat.device.index, L = p->L, N = p->N, C = p->C;
    size_t NC = (size_t)N * C * pxt_dtype_size(p->dt);
    char *resid = base + p->resid; /* (L + 1, N, C), or (2, N, C) in evaluation */
    PXT_TRY(embed_forward(m, p, base, resid));
    pxt_dropout embd = site_dropout(m, p, base, SITE_EMBED);
    if (embd.p > 0.0f) {
        PXT_TRY(be->dropout_forward(d, resid, NULL, N, C, &embd, p->dt));
    }
    for (int i = 0; i < L; i++) {
        pxt_block_params bp;
        pxt_block_grads bg;
        block_views(m, i, &bp, &bg);
        pxt_block_acts a = block_acts(base, p, i);
        size_t in_slot = p->train ? (size_t)i : (size_t)(i % 2);
        size_t out_slot = p->train ? (size_t)i + 1 : (size_t)((i + 1) % 2);
        pxt_ctx xl = layer_ctx(m, p, base, x, i);
        xl.gelu_apart = p->train && p->policy[i] == PXT_CKPT_SELECTIVE; /* as backward recomputes */
        PXT_TRY(pxt_block_forward(&xl, &bp, &a, resid + in_slot * NC, resid + out_slot * NC));
    }
    PXT_TRY(be->layernorm_forward(d, base + p->hf, (float *)(base + p->hf_mean),
                                  (float *)(base + p->hf_rstd), stack_top(p, base),
                                  pxt_flat_param(&m->flat, l->ln_f_w),
                                  pxt_flat_param(&m->flat, l->ln_f_b), N, C, m->cfg.eps, p->dt));
    return be->layernorm_forward(d, base + p->h2, (float *)(base + p->h2_mean),
                                 (float *)(base + p->h2_rstd), base + p->hf,
                                 pxt_flat_param(&m->flat, l->fnorm_w),
                                 pxt_flat_param(&m->flat, l->fnorm_b), N, C, m->cfg.eps, p->dt);
}

/* Tells the caller (in->grads_done) that tensors first..last of the layout, one
 * run in the flat buffer, hold all of this step's gradient additions. */
static int grads_done(const pxt_gpt *m, const pxt_gpt_batch *in, int first, int last) {
    if (!in->grads_done) {
        return PXT_OK;
    }
    const pxt_param_info *a = &m->flat.layout.params[first], *b = &m->flat.layout.params[last];
    return in->grads_done(in->grads_done_ctx, a->offset, b->offset + b->numel - a->offset);
}

/* backward from dh2 (in dB, from the heads): final_norm, ln_f, then the blocks
 * top-down with dres carrying dx, then the embeddings' dropout and tables; dres
 * holds dx0 at the end. */
static int gpt_backward(const pxt_gpt *m, const pxt_plan *p, char *base, const pxt_ctx *x,
                        const pxt_gpt_batch *in, const char *top) {
    const pxt_backend *be = m->flat.be;
    const pxt_param_layout *l = &m->flat.layout;
    int d = m->flat.device.index, L = p->L, N = p->N, C = p->C;
    size_t NC = (size_t)N * C * pxt_dtype_size(p->dt);
    char *resid = base + p->resid;
    char *dres = base + p->dres, *dA = base + p->dA, *dB = base + p->dB; /* (N,C) (N,4C) (N,C) */
    PXT_TRY(be->memset_zero(d, dA, NC));
    PXT_TRY(be->layernorm_backward(
        d, dA, pxt_flat_grad(&m->flat, l->fnorm_w), pxt_flat_grad(&m->flat, l->fnorm_b), dB,
        base + p->hf, pxt_flat_param(&m->flat, l->fnorm_w), (float *)(base + p->h2_mean),
        (float *)(base + p->h2_rstd), N, C, p->dt, x->reduce_ws));
    PXT_TRY(be->memset_zero(d, dres, NC));
    PXT_TRY(be->layernorm_backward(
        d, dres, pxt_flat_grad(&m->flat, l->ln_f_w), pxt_flat_grad(&m->flat, l->ln_f_b), dA, top,
        pxt_flat_param(&m->flat, l->ln_f_w), (float *)(base + p->hf_mean),
        (float *)(base + p->hf_rstd), N, C, p->dt, x->reduce_ws));
    PXT_TRY(grads_done(m, in, l->ln_f_w, l->mel_head_b)); /* the heads' ran in heads() */
    pxt_block_acts work = block_acts(base, p, -1);
    for (int i = L - 1; i >= 0; i--) {
        pxt_block_params bp;
        pxt_block_grads bg;
        block_views(m, i, &bp, &bg);
        pxt_block_acts saved = block_acts(base, p, i);
        pxt_ctx xl = layer_ctx(m, p, base, x, i);
        xl.gelu_apart = p->policy[i] == PXT_CKPT_SELECTIVE; /* "full": fused as it ran */
        PXT_TRY(pxt_block_backward(&xl, &bp, &bg, &saved, &work, p->policy[i],
                                   resid + (size_t)i * NC, dres, dA, dB));
        int t0 = l->block0 + i * PXT_BLOCK_TENSORS;
        PXT_TRY(grads_done(m, in, t0, t0 + PXT_BLOCK_TENSORS - 1));
    }
    pxt_dropout embd = site_dropout(m, p, base, SITE_EMBED);
    if (embd.p > 0.0f) {
        PXT_TRY(be->dropout_backward(d, dres, dres, N, C, &embd, p->dt));
    }
    PXT_TRY(embed_backward(m, p, base, dres));
    return grads_done(m, in, l->text_emb, l->mel_pos);
}

/* 1 when some sample has a masked key before an unmasked one: padding in the
 * middle (a text shorter than Lt before the audio), which causal attention
 * alone would let the valid queries after it see. Padding only at a sample's
 * end needs no mask: no valid query sees a later key, and the padding queries'
 * outputs are never used (their targets are ignored, their gradients zero). So
 * the mask is passed only when it changes a valid row: attention then skips its
 * masked path (on the GPU, every tile of it). */
static int key_mask_needed(const uint8_t *key_mask, int B, int T) {
    for (int b = 0; b < B; b++) {
        const uint8_t *k = key_mask + (size_t)b * T; /* (T) */
        int padding = 0;
        for (int t = 0; t < T; t++) {
            if (!k[t]) {
                padding = 1;
            } else if (padding) {
                return 1;
            }
        }
    }
    return 0;
}

/* ---- graphs: the two phases recorded once per shape, replayed ------------------------- */

enum { PHASE_FORWARD = 0, PHASE_BACKWARD = 1 };

typedef struct {
    const pxt_gpt *m;
    const pxt_plan *p;
    char *base;
    const pxt_ctx *x;
    const pxt_gpt_batch *in;
} step_args;

/* The conditioning path (with mels), the embeddings, the blocks, the final norms. */
static int phase_forward(const step_args *s) {
    if (s->p->cond.S) { /* the latents the GPT sees first, into x0's conditioning rows */
        PXT_TRY(cond_forward(s->m, s->p, s->base, s->base + s->p->resid));
    }
    return gpt_forward(s->m, s->p, s->base, s->x);
}

/* From dh2 (the heads left it in dB) down to the embeddings and the conditioning path. */
static int phase_backward(const step_args *s) {
    PXT_TRY(gpt_backward(s->m, s->p, s->base, s->x, s->in, stack_top(s->p, s->base)));
    if (s->p->cond.S) {
        PXT_TRY(cond_backward(s->m, s->p, s->base, s->base + s->p->dres));
    }
    return PXT_OK;
}

static uint64_t policy_hash(const pxt_plan *p) {
    uint64_t h = 0x9e3779b97f4a7c15ull;
    for (int l = 0; p->policy && l < p->L; l++) {
        h = pxt_mix64(h ^ (uint64_t)p->policy[l]);
    }
    return pxt_mix64(h ^ (p->cond.S ? (uint64_t)p->cond.policy + 1u : 0u));
}

/* What phase `phase` of this step records: see pxt_gpt_graph. */
static pxt_gpt_graph graph_key(const pxt_gpt *m, const pxt_plan *p, const pxt_ctx *x, int phase) {
    pxt_gpt_graph k;
    memset(&k, 0, sizeof k);
    k.phase = phase;
    k.B = p->B, k.Lt = p->Lt, k.La = p->La, k.Nc = p->Nc, k.S = p->cond.S;
    k.train = p->train;
    k.key_mask = x->key_mask != NULL;
    k.dropout = m->cfg.dropout;
    k.policy = policy_hash(p);
    return k;
}

static int graph_same(const pxt_gpt_graph *a, const pxt_gpt_graph *b) {
    return a->phase == b->phase && a->B == b->B && a->Lt == b->Lt && a->La == b->La &&
           a->Nc == b->Nc && a->S == b->S && a->train == b->train && a->key_mask == b->key_mask &&
           a->dropout == b->dropout && a->policy == b->policy;
}

/* A slot for a new graph: a free one, else the least recently launched (freed). */
static pxt_gpt_graph *graph_slot(pxt_gpt *m) {
    pxt_gpt_graph *old = &m->graph[0];
    for (int i = 0; i < PXT_GPT_GRAPHS; i++) {
        if (!m->graph[i].graph) {
            return &m->graph[i];
        }
        if (m->graph[i].used < old->used) {
            old = &m->graph[i];
        }
    }
    m->flat.be->graph_free(m->flat.device.index, old->graph);
    old->graph = NULL;
    m->graph_stats.evicted++;
    return old;
}

/* Runs one phase: replays its graph; or records it (nothing runs while it is
 * recorded), keeps the graph and launches it; or, without graphs, runs it as it
 * comes. A record that fails turns graphs off for this model (the reason in
 * graph_stats.error) and the phase runs as it comes: a call the record refused
 * runs, a real error is raised by running it. */
static int run_phase(pxt_gpt *m, const step_args *s, int phase, int (*fn)(const step_args *)) {
    const pxt_backend *be = m->flat.be;
    int d = m->flat.device.index;
    if (!m->graphs || !be->graph_begin || (phase == PHASE_BACKWARD && s->in->grads_done)) {
        return fn(s); /* the backward's callbacks are host calls: a replay would skip them */
    }
    pxt_gpt_graph k = graph_key(m, s->p, s->x, phase);
    pxt_gpt_graph *g = NULL;
    for (int i = 0; i < PXT_GPT_GRAPHS && !g; i++) {
        g = m->graph[i].graph && graph_same(&m->graph[i], &k) ? &m->graph[i] : NULL;
    }
    if (g) {
        m->graph_stats.replayed++;
    } else {
        void *graph = NULL;
        int rc = be->graph_begin(d);
        if (rc == PXT_OK) {
            rc = fn(s);
            if (rc == PXT_OK) {
                rc = be->graph_end(d, &graph);
            }
            if (rc != PXT_OK) { /* a record graph_end could not close is closed here */
                be->graph_abort(d);
            }
        }
        if (rc != PXT_OK) {
            m->graphs = 0;
            m->graph_stats.failed++;
            snprintf(m->graph_stats.error, sizeof m->graph_stats.error, "%s", pxt_error_message());
            return fn(s);
        }
        g = graph_slot(m);
        *g = k;
        g->graph = graph;
        m->graph_stats.recorded++;
    }
    g->used = ++m->graph_clock;
    return be->graph_launch(d, g->graph);
}

int pxt_gpt_step(pxt_gpt *m, const pxt_gpt_batch *in, pxt_gpt_losses *out) {
    const pxt_plan *p = &m->plan;
    char *base = m->arena->data;
    pxt_ctx x = {
        .be = m->flat.be,
        .dev = m->flat.device.index,
        .dt = p->dt,
        .B = p->B,
        .T = p->T,
        .C = p->C,
        .H = p->H,
        .eps = m->cfg.eps,
        .key_mask = key_mask_needed(in->key_mask, p->B, p->T)
                        ? (const uint8_t *)(base + p->key_mask)
                        : NULL,
        .attn_ws = base + p->attn_ws,
        .gemm_ws = base + p->gemm_ws,
        .reduce_ws = base + p->reduce_ws,
    };
    const step_args s = {m, p, base, &x, in};
    PXT_TRY(upload(m, p, base, in));
    PXT_TRY(run_phase(m, &s, PHASE_FORWARD, phase_forward));
    PXT_TRY(heads(m, p, base, &x, in)); /* gathers decided by the lengths: as they come */
    if (p->train) {
        PXT_TRY(run_phase(m, &s, PHASE_BACKWARD, phase_backward));
        const pxt_param_layout *l = &m->flat.layout;
        if (p->cond.S) {
            m->flat.cond_grads = 1;
        }
        if (l->cond0 < l->count) { /* done, or untouched by a step without mels */
            PXT_TRY(grads_done(m, in, l->cond0, l->count - 1));
        }
    }
    return losses_sum(m, p, base, out); /* last: nothing before it waits for the device */
}

#undef PXT_HEAD_SEGS
