/* adamw.c: AdamW's state, its rules and the scalars of its step, on the device
 * or offloaded to the host pool (see adamw.h). */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "adamw.h"

/* ---- sizes ----------------------------------------------------------------------- */

static size_t chunk_of(size_t numel, const pxt_adamw_placement *where) {
    size_t c = where && where->chunk ? where->chunk : PXT_OFFLOAD_CHUNK;
    return c < numel ? c : (numel ? numel : 1);
}

/* Bytes of one staging buffer of gradients, and of parameters, 256-byte aligned. */
static size_t stage_g_bytes(size_t chunk) { return (chunk * sizeof(float) + 255) / 256 * 256; }
static size_t stage_p_bytes(size_t chunk, pxt_dtype dt) {
    return (chunk * pxt_dtype_size(dt) + 255) / 256 * 256;
}

/* The state's buffers, in the order pxt_adamw_init reserves them (the host
 * pool's first when offloaded, then the norm's workspace on the device). A plan
 * replays this same list: a block's size depends on the blocks before it. */
enum { R_M, R_V, R_MASTER, R_EMA, R_SEGMENTS, R_STAGE, R_WORKSPACE, R_COUNT };

typedef struct {
    int want[R_COUNT];     /* reserved at all */
    size_t bytes[R_COUNT]; /* requested */
    int host[R_COUNT];     /* in the host pool */
} state_requests;

static state_requests requests_of(size_t numel, int n_tensors, pxt_dtype dt, int ema,
                                  const pxt_adamw_placement *where) {
    int offload = where && where->offload;
    size_t fb = numel * sizeof(float);
    size_t segs = (size_t)n_tensors * sizeof(pxt_adamw_segment);
    size_t c = chunk_of(numel, where);
    state_requests r;
    memset(&r, 0, sizeof r);
    /* the master always offloaded: the device's parameters are 16-bit or, in fp32,
     * a copy the host cannot update in place */
    int want[R_COUNT] = {1, 1, offload || dt != PXT_FLOAT32, ema != 0, 1, offload, 1};
    size_t bytes[R_COUNT] = {fb,
                             fb,
                             fb,
                             fb,
                             offload ? 2 * segs : segs,
                             2 * stage_g_bytes(c) + 2 * stage_p_bytes(c, dt),
                             PXT_SUMSQ_PARTS * sizeof(double)};
    for (int i = 0; i < R_COUNT; i++) {
        r.want[i] = want[i];
        r.bytes[i] = bytes[i];
        r.host[i] = offload && i != R_WORKSPACE;
    }
    return r;
}

int pxt_adamw_plan(pxt_allocator *dev, pxt_allocator *host, size_t numel, int n_tensors,
                   pxt_dtype dt, int ema, const pxt_adamw_placement *where, pxt_adamw_bytes *out) {
    state_requests r = requests_of(numel, n_tensors, dt, ema, where);
    out->device = out->host = 0;
    for (int i = 0; i < R_COUNT; i++) {
        size_t block = 0;
        if (r.want[i]) {
            PXT_TRY(pxt_alloc_plan_take(r.host[i] ? host : dev, r.bytes[i], &block));
        }
        *(r.host[i] ? &out->host : &out->device) += block;
    }
    return PXT_OK;
}

/* ---- rules ------------------------------------------------------------------------ */

/* For beta1^2 < beta2, U = 1 / sqrt((1 - b2)(1 - b1^2/b2)) bounds |m^ / (sqrt(v^) +
 * eps)| at every step (Cauchy-Schwarz over the two running sums, bias corrections
 * included): lr * U <= half the largest finite value of the parameters' dtype
 * keeps one step's move finite for any finite parameters of a sane size, and
 * lr * weight_decay <= 1 keeps the decay factor in [0, 1], not an amplifier that
 * flips the sign. */
int pxt_adamw_check_hparams(const pxt_adamw_hparams *h, pxt_dtype dt, const char *name) {
    double b1 = h->beta1, b2 = h->beta2;
    double u = b1 * b1 < b2 ? 1.0 / sqrt((1.0 - b2) * (1.0 - b1 * b1 / b2)) : 0.0;
    double limit = (dt == PXT_FLOAT16 ? 65504.0 : 3.4028234663852886e38) / 2.0;
    if (h->lr * h->weight_decay > 1.0) {
        return pxt_error(PXT_ERR_VALUE,
                         "%s: lr * weight_decay must be <= 1, got %g * %g: a larger product "
                         "makes the decay multiply the parameters by a negative factor, and they "
                         "diverge",
                         name, h->lr, h->weight_decay);
    }
    if (h->lr * u > limit) {
        return pxt_error(PXT_ERR_VALUE,
                         "%s: lr = %g is too large for %s parameters: one step could move a "
                         "parameter by up to %g (lr times %g, the bound of Adam's normalised "
                         "update for betas (%g, %g)), past half of the dtype's largest value",
                         name, h->lr, pxt_dtype_name(dt), h->lr * u, u, b1, b2);
    }
    return PXT_OK;
}

/* |m| <= c sqrt(v) + t with c^2 = (1-b1)^2 / ((1-b2)(1-b1^2/b2)) (Cauchy-Schwarz over
 * the two running sums of the same gradients; needs b1^2 < b2, else m is left
 * unchecked), 1% of slack for rounding. t: a gradient g with (1-b2) g^2 below FLT_MIN
 * reaches v as a subnormal or as 0 (it underflows) while m keeps it, and m, an average
 * of gradients, holds at most their size: t = 2 sqrt(FLT_MIN / (1-b2)) (7e-18 at b2 =
 * 0.999). A file with m and v swapped, or a negative v, fails here: its next step
 * would turn every parameter NaN. */
int pxt_adamw_check_moments(const float *m, const float *v, size_t n, double b1, double b2) {
    double c = b1 * b1 < b2 ? (1 - b1) / sqrt((1 - b2) * (1 - b1 * b1 / b2)) * 1.01 : INFINITY;
    double t = 2.0 * sqrt((double)FLT_MIN / (1 - b2));
    for (size_t i = 0; i < n; i++) {
        if (!(v[i] >= 0.0f)) {
            return pxt_error(PXT_ERR_VALUE,
                             "state['v']: the second moments must be >= 0, got %g at index %zu "
                             "(m and v swapped?)",
                             (double)v[i], i);
        }
        if (fabs((double)m[i]) > c * sqrt((double)v[i]) + t) {
            return pxt_error(PXT_ERR_VALUE,
                             "state['m']: |m| = %g at index %zu exceeds what v = %g allows "
                             "with betas (%g, %g) (m and v swapped, or not this optimizer's "
                             "state)",
                             fabs((double)m[i]), i, (double)v[i], b1, b2);
        }
    }
    return PXT_OK;
}

/* ---- state ------------------------------------------------------------------------ */

static float *fdata(pxt_storage *s) { return (float *)s->data; }

static float *master_of(pxt_adamw *o) {
    return o->master ? fdata(o->master) : (float *)o->flat->params->data;
}

static const pxt_backend *host_be(void) { return pxt_backend_for(PXT_CPU); }

/* Staging buffer i (0, 1) of gradients, and of parameters (offload). */
static float *stage_g(const pxt_adamw *o, int i) {
    return (float *)(o->stage->data + (size_t)i * stage_g_bytes(o->chunk));
}
static char *stage_p(const pxt_adamw *o, int i) {
    return o->stage->data + 2 * stage_g_bytes(o->chunk) +
           (size_t)i * stage_p_bytes(o->chunk, o->flat->dt);
}

/* Elements of the chunk that starts at element lo (the last one may be short). */
static size_t chunk_len(const pxt_adamw *o, size_t lo) {
    return o->n - lo < o->chunk ? o->n - lo : o->chunk;
}

/* nbytes on the model's device, or in the host pool when offloaded. */
static int reserve(pxt_adamw *o, pxt_storage **s, size_t nbytes, int host) {
    if (!host) {
        PXT_TRY(pxt_storage_new(o->flat->device, nbytes, s));
        o->state_bytes += pxt_block_size((*s)->block); /* what the allocator counts */
        return PXT_OK;
    }
    pxt_allocator *pool = pxt_host_pool(o->flat->device);
    if (!pool) {
        return PXT_ERR_VALUE;
    }
    PXT_TRY(pxt_storage_new_in(pool, nbytes, s));
    o->host_bytes += pxt_block_size((*s)->block);
    return PXT_OK;
}

/* The table of segments, from the layout and the decay flags: onto the device,
 * or (offload) straight into the host pool. */
static int fill_segments(pxt_adamw *o) {
    const pxt_param_layout *L = &o->flat->layout;
    pxt_adamw_segment *segs = o->offload
                                  ? (pxt_adamw_segment *)o->segments->data
                                  : calloc((size_t)L->count ? (size_t)L->count : 1, sizeof *segs);
    if (!segs) {
        return pxt_error(PXT_ERR_OOM, "out of host memory for the optimizer's segments");
    }
    for (int i = 0; i < L->count; i++) {
        segs[i] = (pxt_adamw_segment){L->params[i].offset, L->params[i].numel, o->decay[i]};
    }
    if (o->offload) {
        return PXT_OK;
    }
    int rc = o->flat->be->copy(o->flat->device.index, o->segments->data, segs, o->segments->nbytes,
                               PXT_COPY_H2D);
    free(segs);
    return rc;
}

/* dst (n) fp32 on the host = the device's parameters, through the parameter staging. */
static int download_params(pxt_adamw *o, float *dst) {
    const pxt_flat *f = o->flat;
    size_t esz = pxt_dtype_size(f->dt);
    char *p = stage_p(o, 0);
    for (size_t lo = 0; lo < o->n; lo += o->chunk) {
        size_t len = chunk_len(o, lo);
        PXT_TRY(
            f->be->copy(f->device.index, p, f->params->data + lo * esz, len * esz, PXT_COPY_D2H));
        PXT_TRY(host_be()->cast(0, dst + lo, PXT_FLOAT32, p, f->dt, len));
    }
    return PXT_OK;
}

int pxt_adamw_init(pxt_adamw *o, pxt_flat *f, const pxt_adamw_hparams *h, int ema,
                   const unsigned char *decay, const pxt_adamw_placement *where) {
    memset(o, 0, sizeof *o);
    const pxt_backend *be = f->be;
    int offload = where && where->offload;
    if (!be->grad_sumsq || !(offload ? host_be()->adamw : be->adamw) || !be->swap || !be->cast ||
        (offload && (!be->copy_async || !be->fence_record || !be->fence_wait))) {
        return pxt_error(PXT_ERR_NOT_IMPLEMENTED,
                         "AdamW: the %s backend has no optimizer kernels yet", be->name);
    }
    o->flat = f;
    o->h = *h;
    o->n = f->layout.numel;
    o->n_segments = f->layout.count;
    o->offload = offload;
    o->chunk = chunk_of(o->n, where);
    size_t fb = o->n * sizeof(float);
    int d = f->device.index;
    o->decay = calloc((size_t)o->n_segments ? (size_t)o->n_segments : 1, 1);
    if (!o->decay) {
        return pxt_error(PXT_ERR_OOM, "out of host memory for the optimizer's decay flags");
    }
    for (int i = 0; i < o->n_segments; i++) {
        o->decay[i] = decay ? decay[i] != 0 : f->layout.params[i].decay != 0;
    }
    state_requests r = requests_of(o->n, o->n_segments, f->dt, ema, where);
    pxt_storage **slot[R_COUNT] = {&o->m,        &o->v,     &o->master,   &o->ema,
                                   &o->segments, &o->stage, &o->workspace};
    int rc = PXT_OK;
    for (int i = 0; i < R_COUNT && rc == PXT_OK; i++) {
        if (r.want[i]) {
            rc = reserve(o, slot[i], r.bytes[i], r.host[i]);
        }
    }
    if (rc == PXT_OK) {
        rc = fill_segments(o);
    }
    const pxt_backend *sb = offload ? host_be() : be; /* the state's backend and device */
    int sd = offload ? 0 : d;
    if (rc == PXT_OK) {
        rc = sb->memset_zero(sd, o->m->data, fb);
    }
    if (rc == PXT_OK) {
        rc = sb->memset_zero(sd, o->v->data, fb);
    }
    if (rc == PXT_OK && o->master) {
        rc = offload ? download_params(o, fdata(o->master))
                     : be->cast(d, o->master->data, PXT_FLOAT32, f->params->data, f->dt, o->n);
    }
    if (rc == PXT_OK && o->ema) { /* the parameters in fp32: the master's bits, or the fp32
                                     parameters themselves */
        rc = sb->copy(sd, o->ema->data, master_of(o), fb, PXT_COPY_D2D);
    }
    if (rc != PXT_OK) { /* f's plans never counted these bytes: nothing to take off them */
        o->state_bytes = o->host_bytes = 0;
        pxt_adamw_free(o);
        return rc;
    }
    f->optimizer_bytes += o->state_bytes;
    f->optimizer_host_bytes += o->host_bytes;
    return PXT_OK;
}

void pxt_adamw_free(pxt_adamw *o) {
    if (o->flat) {
        o->flat->optimizer_bytes -= o->state_bytes;
        o->flat->optimizer_host_bytes -= o->host_bytes;
    }
    pxt_storage_clear(&o->m);
    pxt_storage_clear(&o->v);
    pxt_storage_clear(&o->master);
    pxt_storage_clear(&o->ema);
    pxt_storage_clear(&o->segments);
    pxt_storage_clear(&o->workspace);
    pxt_storage_clear(&o->stage);
    free(o->decay);
    o->decay = NULL;
    o->state_bytes = o->host_bytes = 0;
    o->flat = NULL;
}

/* ---- offload: the update on the host ------------------------------------------------
 * Chunk c of the flat buffers is elements [c * chunk, ...). Gradients come down
 * into g[c % 2], the parameters the CPU computes go up from p[c % 2], each copy
 * queued on the device's stream with a fence after it:
 *   FENCE_G + i   chunk's gradients in g[i] have landed
 *   FENCE_P + i   chunk's parameters from p[i] have left
 * so chunk c + 1's gradients travel while the CPU updates chunk c, and chunk c's
 * parameters while it updates c + 1. On the CPU backend every copy is done when
 * it returns and the fences have nothing to wait for: the same code, in order. */
enum { FENCE_G = 0, FENCE_P = 2 };

/* Queues chunk c's gradients into g[c % 2]. */
static int fetch_grads(pxt_adamw *o, size_t c) {
    const pxt_flat *f = o->flat;
    int d = f->device.index, i = (int)(c & 1);
    size_t lo = c * o->chunk, len = chunk_len(o, lo);
    PXT_TRY(f->be->copy_async(d, stage_g(o, i), (const float *)f->grads->data + lo,
                              len * sizeof(float), PXT_COPY_D2H));
    return f->be->fence_record(d, FENCE_G + i);
}

/* The segments among all[0, n_active) that meet [lo, hi), clipped to it, offsets
 * from lo, into out; returns how many. *first: the first segment that may still
 * meet lo (chunks come in order, so it only moves forward). */
static int clip_segments(const pxt_adamw_segment *all, int n_active, int *first, size_t lo,
                         size_t hi, pxt_adamw_segment *out) {
    while (*first < n_active && all[*first].offset + all[*first].numel <= lo) {
        (*first)++;
    }
    int k = 0;
    for (int s = *first; s < n_active && all[s].offset < hi; s++) {
        size_t a = all[s].offset > lo ? all[s].offset : lo;
        size_t b = all[s].offset + all[s].numel < hi ? all[s].offset + all[s].numel : hi;
        if (a < b) {
            out[k++] = (pxt_adamw_segment){a - lo, b - a, all[s].decay};
        }
    }
    return k;
}

/* Waits for every copy of the staging still in flight: the buffers are free
 * again and a device error surfaces (the first one). */
static int drain(pxt_adamw *o, int rc) {
    const pxt_flat *f = o->flat;
    for (int fence = FENCE_G; fence < FENCE_P + 2; fence++) {
        int r = f->be->fence_wait(f->device.index, fence);
        rc = rc != PXT_OK ? rc : r;
    }
    return rc;
}

static int offload_update(pxt_adamw *o, const pxt_adamw_args *a) {
    const pxt_flat *f = o->flat;
    const pxt_backend *be = f->be;
    int d = f->device.index;
    const pxt_adamw_segment *all = (const pxt_adamw_segment *)o->segments->data;
    /* up to the end of the last tensor this step updates: the conditioning path's tail,
     * left alone under fixed latents, is neither fetched nor sent */
    int last = a->n_segments - 1;
    size_t used = last >= 0 ? all[last].offset + all[last].numel : 0;
    size_t esz = pxt_dtype_size(f->dt), chunks = (used + o->chunk - 1) / o->chunk;
    pxt_adamw_segment *clip = (pxt_adamw_segment *)o->segments->data + o->n_segments;
    float *master = fdata(o->master), *m = fdata(o->m), *v = fdata(o->v);
    float *ema = o->ema ? fdata(o->ema) : NULL;
    int first = 0;
    int rc = chunks ? fetch_grads(o, 0) : PXT_OK;
    for (size_t c = 0; c < chunks && rc == PXT_OK; c++) {
        int i = (int)(c & 1);
        size_t lo = c * o->chunk, len = chunk_len(o, lo);
        if (c + 1 < chunks) { /* into g[1 - i], which chunk c - 1's update has done reading */
            rc = fetch_grads(o, c + 1);
        }
        if (rc == PXT_OK) {
            rc = be->fence_wait(d, FENCE_G + i);
        }
        if (rc == PXT_OK) { /* p[i]'s last chunk (c - 2) has left */
            rc = be->fence_wait(d, FENCE_P + i);
        }
        int k = rc == PXT_OK ? clip_segments(all, a->n_segments, &first, lo, lo + len, clip) : 0;
        if (k == 0) {
            continue; /* padding, or tensors this step leaves alone */
        }
        pxt_adamw_args ca = *a;
        ca.segments = clip;
        ca.n_segments = k;
        char *p = stage_p(o, i);
        rc = host_be()->adamw(0, &ca, master + lo, m + lo, v + lo, ema ? ema + lo : NULL, p,
                              stage_g(o, i));
        /* one copy up from the first segment's start to the last one's end: what lies
         * between them is padding, zero on the device, so zeros go up */
        for (int s = 0; rc == PXT_OK && s + 1 < k; s++) {
            size_t end = clip[s].offset + clip[s].numel;
            memset(p + end * esz, 0, (clip[s + 1].offset - end) * esz);
        }
        size_t a0 = clip[0].offset, a1 = clip[k - 1].offset + clip[k - 1].numel;
        if (rc == PXT_OK) {
            rc = be->copy_async(d, f->params->data + (lo + a0) * esz, p + a0 * esz, (a1 - a0) * esz,
                                PXT_COPY_H2D);
        }
        if (rc == PXT_OK) {
            rc = be->fence_record(d, FENCE_P + i);
        }
    }
    return drain(o, rc);
}

/* The device's parameters = src (n) fp32 on the host, cast to their dtype, through
 * the parameter staging (two buffers in turn, as the step's). */
static int upload_params(pxt_adamw *o, const float *src) {
    const pxt_flat *f = o->flat;
    int d = f->device.index, rc = PXT_OK;
    size_t esz = pxt_dtype_size(f->dt);
    for (size_t c = 0, lo = 0; lo < o->n && rc == PXT_OK; c++, lo += o->chunk) {
        int i = (int)(c & 1);
        size_t len = chunk_len(o, lo);
        rc = f->be->fence_wait(d, FENCE_P + i);
        if (rc == PXT_OK) {
            rc = host_be()->cast(0, stage_p(o, i), f->dt, src + lo, PXT_FLOAT32, len);
        }
        if (rc == PXT_OK) {
            rc = f->be->copy_async(d, f->params->data + lo * esz, stage_p(o, i), len * esz,
                                   PXT_COPY_H2D);
        }
        if (rc == PXT_OK) {
            rc = f->be->fence_record(d, FENCE_P + i);
        }
    }
    return drain(o, rc);
}

/* ---- the step ------------------------------------------------------------------- */

int pxt_adamw_run(pxt_adamw *o, pxt_adamw_result *r) {
    const pxt_backend *be = o->flat->be;
    const pxt_adamw_hparams *h = &o->h;
    int d = o->flat->device.index;
    const float *grads = (const float *)o->flat->grads->data;
    double inv_scale = h->scaling ? 1.0 / h->scale : 1.0;
    memset(r, 0, sizeof *r);
    PXT_TRY(be->grad_sumsq(d, &r->sumsq, &r->nonfinite, grads, o->n, o->workspace->data));
    if (r->nonfinite) {
        r->grad_norm = isnan(r->sumsq) ? NAN : INFINITY;
        return PXT_OK;
    }
    double norm = sqrt(r->sumsq) * inv_scale, coef = 1.0;
    r->grad_norm = norm;
    if (h->grad_clip > 0) { /* torch.nn.utils.clip_grad_norm_: clamp(max / (norm + 1e-6), max=1) */
        coef = h->grad_clip / (norm + 1e-6);
        if (coef > 1.0) {
            coef = 1.0;
        }
    }
    double t = (double)(o->step + 1);
    double bc1 = 1.0 - pow(h->beta1, t), bc2 = 1.0 - pow(h->beta2, t);
    pxt_adamw_args args = {
        .segments = (const pxt_adamw_segment *)o->segments->data,
        /* the conditioning tensors (the layout's tail) only when they got gradients */
        .n_segments = o->flat->cond_grads ? o->n_segments : o->flat->layout.cond0,
        .grad_scale = (float)(inv_scale * coef),
        .decay_factor = (float)(1.0 - h->lr * h->weight_decay),
        .one_minus_beta1 = (float)(1.0 - h->beta1),
        .beta2 = (float)h->beta2,
        .one_minus_beta2 = (float)(1.0 - h->beta2),
        .neg_step_size = (float)(-(h->lr / bc1)),
        .bias_correction2_sqrt = (float)sqrt(bc2),
        .eps = (float)h->eps,
        .ema_decay = (float)h->ema_decay,
        .one_minus_ema_decay = (float)(1.0 - h->ema_decay),
        .dt = o->flat->dt,
    };
    if (o->offload) {
        PXT_TRY(offload_update(o, &args));
    } else {
        PXT_TRY(be->adamw(d, &args, master_of(o), fdata(o->m), fdata(o->v),
                          o->ema ? fdata(o->ema) : NULL, o->flat->params->data, grads));
    }
    r->applied = 1;
    return PXT_OK;
}

void pxt_adamw_account(pxt_adamw *o, pxt_adamw_result *r) {
    pxt_adamw_hparams *h = &o->h;
    if (r->applied) {
        o->step++;
        if (h->scaling && ++o->good_steps >= h->growth_interval) {
            h->scale = h->scale * 2.0 > PXT_MAX_LOSS_SCALE ? PXT_MAX_LOSS_SCALE : h->scale * 2.0;
            o->good_steps = 0;
        }
    } else if (h->scaling) {
        h->scale *= 0.5;
        o->good_steps = 0;
    }
}

int pxt_adamw_swap_ema(pxt_adamw *o) {
    const pxt_backend *be = o->flat->be;
    int d = o->flat->device.index;
    char *params = o->flat->params->data;
    pxt_storage *from = o->swapped ? o->master : o->ema;
    if (o->offload) { /* the parameters from the host's EMA, and back from its master */
        PXT_TRY(upload_params(o, fdata(from)));
    } else if (!o->master) { /* fp32: the parameters are the master, a true exchange */
        PXT_TRY(be->swap(d, params, o->ema->data, o->n, PXT_FLOAT32));
    } else { /* 16-bit: parameters from the EMA, and back from the master */
        PXT_TRY(be->cast(d, params, o->flat->dt, from->data, PXT_FLOAT32, o->n));
    }
    o->swapped = !o->swapped;
    return PXT_OK;
}

int pxt_adamw_load(pxt_adamw *o, const float *m, const float *v, const float *master,
                   const float *ema) {
    const pxt_backend *be = o->offload ? host_be() : o->flat->be;
    int d = o->offload ? 0 : o->flat->device.index;
    pxt_copy_kind kind = o->offload ? PXT_COPY_D2D : PXT_COPY_H2D;
    size_t fb = o->n * sizeof(float);
    pxt_storage *dst[4] = {o->m, o->v, o->master ? o->master : o->flat->params, o->ema};
    const float *src[4] = {m, v, master, ema};
    for (int i = 0; i < 4; i++) {
        if (src[i] && dst[i]) {
            PXT_TRY(be->copy(d, dst[i]->data, src[i], fb, kind));
        }
    }
    if (o->offload) {
        return upload_params(o, fdata(o->master));
    }
    if (o->master) {
        PXT_TRY(
            be->cast(d, o->flat->params->data, o->flat->dt, o->master->data, PXT_FLOAT32, o->n));
    }
    return PXT_OK;
}
