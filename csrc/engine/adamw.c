/* adamw.c: AdamW's state and the scalars of its step (see adamw.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "adamw.h"

size_t pxt_adamw_state_bytes(size_t numel, int n_tensors, pxt_dtype dt, int ema) {
    size_t flat = pxt_alloc_block_size(numel * sizeof(float));
    size_t buffers = 2 + (dt != PXT_FLOAT32) + (ema != 0);
    return buffers * flat + pxt_alloc_block_size((size_t)n_tensors * sizeof(pxt_adamw_segment)) +
           pxt_alloc_block_size(PXT_SUMSQ_PARTS * sizeof(double));
}

static float *fdata(pxt_storage *s) { return (float *)s->data; }

static float *master_of(pxt_adamw *o) {
    return o->master ? fdata(o->master) : (float *)o->flat->params->data;
}

static int reserve(pxt_adamw *o, pxt_storage **s, size_t nbytes) {
    PXT_TRY(pxt_storage_new(o->flat->device, nbytes, s));
    o->state_bytes += pxt_alloc_block_size(nbytes);
    return PXT_OK;
}

/* The table of segments, from the layout and the decay flags, onto the device. */
static int upload_segments(pxt_adamw *o) {
    const pxt_param_layout *L = &o->flat->layout;
    pxt_adamw_segment *segs = calloc((size_t)L->count ? (size_t)L->count : 1, sizeof *segs);
    if (!segs) {
        return pxt_error(PXT_ERR_OOM, "out of host memory for the optimizer's segments");
    }
    for (int i = 0; i < L->count; i++) {
        segs[i] = (pxt_adamw_segment){L->params[i].offset, L->params[i].numel, o->decay[i]};
    }
    int rc = o->flat->be->copy(o->flat->device.index, o->segments->data, segs, o->segments->nbytes,
                               PXT_COPY_H2D);
    free(segs);
    return rc;
}

int pxt_adamw_init(pxt_adamw *o, pxt_flat *f, const pxt_adamw_hparams *h, int ema,
                   const unsigned char *decay) {
    memset(o, 0, sizeof *o);
    const pxt_backend *be = f->be;
    if (!be->grad_sumsq || !be->adamw || !be->swap || !be->cast) {
        return pxt_error(PXT_ERR_NOT_IMPLEMENTED,
                         "AdamW: the %s backend has no optimizer kernels yet", be->name);
    }
    o->flat = f;
    o->h = *h;
    o->n = f->layout.numel;
    o->n_segments = f->layout.count;
    size_t fb = o->n * sizeof(float);
    int d = f->device.index;
    o->decay = calloc((size_t)o->n_segments ? (size_t)o->n_segments : 1, 1);
    if (!o->decay) {
        return pxt_error(PXT_ERR_OOM, "out of host memory for the optimizer's decay flags");
    }
    for (int i = 0; i < o->n_segments; i++) {
        o->decay[i] = decay ? decay[i] != 0 : f->layout.params[i].decay != 0;
    }
    int rc = reserve(o, &o->m, fb);
    if (rc == PXT_OK) {
        rc = reserve(o, &o->v, fb);
    }
    if (rc == PXT_OK && f->dt != PXT_FLOAT32) {
        rc = reserve(o, &o->master, fb);
    }
    if (rc == PXT_OK && ema) {
        rc = reserve(o, &o->ema, fb);
    }
    if (rc == PXT_OK) {
        rc = reserve(o, &o->segments, (size_t)o->n_segments * sizeof(pxt_adamw_segment));
    }
    if (rc == PXT_OK) {
        rc = reserve(o, &o->workspace, PXT_SUMSQ_PARTS * sizeof(double));
    }
    if (rc == PXT_OK) {
        rc = upload_segments(o);
    }
    if (rc == PXT_OK) {
        rc = be->memset_zero(d, o->m->data, fb);
    }
    if (rc == PXT_OK) {
        rc = be->memset_zero(d, o->v->data, fb);
    }
    if (rc == PXT_OK && o->master) {
        rc = be->cast(d, o->master->data, PXT_FLOAT32, f->params->data, f->dt, o->n);
    }
    if (rc == PXT_OK && o->ema) {
        rc = be->cast(d, o->ema->data, PXT_FLOAT32, f->params->data, f->dt, o->n);
    }
    if (rc != PXT_OK) {
        pxt_adamw_free(o);
        return rc;
    }
    f->optimizer_bytes += o->state_bytes;
    return PXT_OK;
}

void pxt_adamw_free(pxt_adamw *o) {
    if (o->flat) {
        o->flat->optimizer_bytes -= o->state_bytes;
    }
    pxt_storage_clear(&o->m);
    pxt_storage_clear(&o->v);
    pxt_storage_clear(&o->master);
    pxt_storage_clear(&o->ema);
    pxt_storage_clear(&o->segments);
    pxt_storage_clear(&o->workspace);
    free(o->decay);
    o->decay = NULL;
    o->state_bytes = 0;
    o->flat = NULL;
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
    PXT_TRY(be->adamw(d, &args, master_of(o), fdata(o->m), fdata(o->v),
                      o->ema ? fdata(o->ema) : NULL, o->flat->params->data, grads));
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
    if (!o->master) { /* fp32: the parameters are the master, a true exchange */
        PXT_TRY(be->swap(d, params, o->ema->data, o->n, PXT_FLOAT32));
    } else { /* 16-bit: parameters from the EMA, and back from the master */
        PXT_TRY(be->cast(d, params, o->flat->dt, o->swapped ? o->master->data : o->ema->data,
                         PXT_FLOAT32, o->n));
    }
    o->swapped = !o->swapped;
    return PXT_OK;
}

int pxt_adamw_load(pxt_adamw *o, const float *m, const float *v, const float *master,
                   const float *ema) {
    const pxt_backend *be = o->flat->be;
    int d = o->flat->device.index;
    size_t fb = o->n * sizeof(float);
    pxt_storage *dst[4] = {o->m, o->v, o->master ? o->master : o->flat->params, o->ema};
    const float *src[4] = {m, v, master, ema};
    for (int i = 0; i < 4; i++) {
        if (src[i] && dst[i]) {
            PXT_TRY(be->copy(d, dst[i]->data, src[i], fb, PXT_COPY_H2D));
        }
    }
    if (o->master) {
        PXT_TRY(
            be->cast(d, o->flat->params->data, o->flat->dt, o->master->data, PXT_FLOAT32, o->n));
    }
    return PXT_OK;
}
