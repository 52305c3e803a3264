/* block_model.c: a standalone block's forward and backward (see block_model.h). */
#include <string.h>

#include "block_model.h"

int pxt_block_model_init(pxt_block_model *m, int C, int H, int cross, float eps, pxt_device dev,
                         pxt_ckpt ckpt, uint64_t seed) {
    memset(m, 0, sizeof *m);
    const pxt_backend *be = pxt_backend_for(dev.type);
    char dname[32];
    pxt_device_str(dev, dname, sizeof dname);
    if (!be) {
        return pxt_error(PXT_ERR_VALUE, "device: this build has no backend for %s", dname);
    }
    PXT_TRY(pxt_ctx_check_ops(be, dname));
    pxt_param_layout layout;
    PXT_TRY(pxt_block_layout_init(&layout, C, cross));
    m->C = C, m->H = H, m->cross = cross, m->eps = eps, m->ckpt = ckpt, m->causal = 1;
    return pxt_flat_init(&m->flat, &layout, dev, PXT_FLOAT32, seed, 0.02f);
}

void pxt_block_model_free(pxt_block_model *m) {
    pxt_storage_clear(&m->arena);
    pxt_flat_free(&m->flat);
}

int pxt_block_model_reserve(pxt_block_model *m, const pxt_block_plan *p) {
    if (m->arena && pxt_block_plan_same(&m->plan, p)) {
        return PXT_OK;
    }
    pxt_storage *a = NULL;
    int rc = pxt_storage_new(m->flat.device, p->arena_bytes, &a);
    if (rc == PXT_ERR_OOM && m->arena) {
        pxt_storage_clear(&m->arena);
        m->pending = 0;
        rc = pxt_storage_new(m->flat.device, p->arena_bytes, &a);
    }
    if (rc != PXT_OK) {
        return rc;
    }
    pxt_storage_clear(&m->arena);
    m->arena = a;
    m->plan = *p;
    m->pending = 0;
    return PXT_OK;
}

int pxt_block_model_plan_arena(const pxt_block_model *m, pxt_allocator *plan,
                               const pxt_block_plan *p, size_t *out) {
    if (m->arena && pxt_block_plan_same(&m->plan, p)) {
        *out = pxt_block_size(m->arena->block);
        return PXT_OK;
    }
    return pxt_alloc_plan_take(plan, p->arena_bytes, out);
}

size_t pxt_block_model_release_arena(pxt_block_model *m) {
    size_t n = m->arena ? m->arena->nbytes : 0;
    pxt_storage_clear(&m->arena);
    m->pending = 0;
    return n;
}

static pxt_copy_kind copy_kind(const pxt_block_model *m, int host_src) {
    return m->flat.device.type == PXT_CPU || !host_src ? PXT_COPY_D2D : PXT_COPY_H2D;
}

static void block_views(const pxt_block_model *m, pxt_block_params *p, pxt_block_grads *g) {
    memset(p, 0, sizeof *p);
    memset(g, 0, sizeof *g);
    for (int j = 0; j < m->flat.layout.count; j++) {
        p->w[j] = pxt_flat_param(&m->flat, j);
        g->g[j] = pxt_flat_grad(&m->flat, j);
    }
}

/* The ctx of the forward the arena holds. */
static pxt_ctx run_ctx(const pxt_block_model *m, char *base) {
    const pxt_block_plan *p = &m->plan;
    pxt_ctx x = {
        .be = m->flat.be,
        .dev = m->flat.device.index,
        .dt = m->flat.dt,
        .B = p->B,
        .T = p->T,
        .C = m->C,
        .H = m->H,
        .eps = m->eps,
        .key_mask = m->has_key_mask ? (const uint8_t *)(base + p->key_mask) : NULL,
        .attn_ws = base + p->attn_ws,
        .gemm_ws = base + p->gemm_ws,
        .reduce_ws = base + p->reduce_ws,
        .non_causal = !m->causal,
        .gelu_apart = p->policy == PXT_CKPT_SELECTIVE, /* recompute's GELU, bit for bit */
    };
    if (p->cross) {
        x.context = base + p->context;
        x.context_mask = m->has_context_mask ? (const uint8_t *)(base + p->context_mask) : NULL;
        x.Tc = p->Tc;
        x.dcontext = base + p->dcontext;
        x.dkv = base + p->dkv;
    }
    return x;
}

int pxt_block_model_forward(pxt_block_model *m, const pxt_block_inputs *in) {
    const pxt_block_plan *p = &m->plan;
    const pxt_backend *be = m->flat.be;
    int d = m->flat.device.index;
    size_t es = pxt_dtype_size(m->flat.dt), N = (size_t)p->B * p->T, Nc = (size_t)p->B * p->Tc;
    char *base = m->arena->data;
    m->pending = 0;
    m->causal = in->causal;
    m->has_key_mask = in->key_mask != NULL;
    m->has_context_mask = in->context_mask != NULL;
    if (base + p->x != in->x) { /* x (N, C) */
        PXT_TRY(be->copy(d, base + p->x, in->x, N * m->C * es, copy_kind(m, in->x_host)));
    }
    if (in->key_mask) { /* (B, T) */
        PXT_TRY(be->copy(d, base + p->key_mask, in->key_mask, N, copy_kind(m, 1)));
    }
    if (p->cross) {
        if (base + p->context != in->context) { /* (Nc, C) */
            PXT_TRY(be->copy(d, base + p->context, in->context, Nc * m->C * es,
                             copy_kind(m, in->context_host)));
        }
        if (in->context_mask) { /* (B, Tc) */
            PXT_TRY(be->copy(d, base + p->context_mask, in->context_mask, Nc, copy_kind(m, 1)));
        }
    }
    pxt_block_params bp;
    pxt_block_grads bg;
    block_views(m, &bp, &bg);
    pxt_ctx x = run_ctx(m, base);
    pxt_block_acts a = pxt_plan_block_acts(base, &p->saved, &p->work, p->policy, p->cross);
    PXT_TRY(pxt_block_forward(&x, &bp, &a, base + p->x, base + p->y));
    m->pending = 1;
    return PXT_OK;
}

int pxt_block_model_backward(pxt_block_model *m, const void *dy, int dy_host) {
    const pxt_block_plan *p = &m->plan;
    const pxt_backend *be = m->flat.be;
    int d = m->flat.device.index;
    size_t es = pxt_dtype_size(m->flat.dt), N = (size_t)p->B * p->T, Nc = (size_t)p->B * p->Tc;
    char *base = m->arena->data;
    m->pending = 0;             /* one backward per forward, whatever happens */
    if (base + p->dres != dy) { /* dres (N, C): dy -> dx */
        PXT_TRY(be->copy(d, base + p->dres, dy, N * m->C * es, copy_kind(m, dy_host)));
    }
    if (p->cross) { /* dcontext (Nc, C) */
        PXT_TRY(be->memset_zero(d, base + p->dcontext, Nc * m->C * es));
    }
    pxt_block_params bp;
    pxt_block_grads bg;
    block_views(m, &bp, &bg);
    pxt_ctx x = run_ctx(m, base);
    pxt_block_acts a = pxt_plan_block_acts(base, &p->saved, &p->work, p->policy, p->cross);
    return pxt_block_backward(&x, &bp, &bg, &a, &a, p->policy, base + p->x, base + p->dres,
                              base + p->dA, base + p->dB);
}
