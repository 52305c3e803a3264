/* flat.c: flat parameters and gradients, GPT-2 initialisation (see flat.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "flat.h"
#include "rng.h"

/* Draws every tensor of l into host (l->numel floats, zeroed by the caller),
 * one stream in layout order (the GPT's draws do not depend on what follows it). */
static void init_params(const pxt_param_layout *l, float *host, uint64_t seed, float resid_std) {
    pxt_rng rng;
    pxt_rng_seed(&rng, seed);
    for (int i = 0; i < l->count; i++) {
        const pxt_param_info *p = &l->params[i];
        float *dst = host + p->offset;
        switch (p->init) {
        case PXT_INIT_NORMAL: pxt_rng_normal(&rng, dst, p->numel, 0.02f); break;
        case PXT_INIT_RESID: pxt_rng_normal(&rng, dst, p->numel, resid_std); break;
        case PXT_INIT_ONES:
            for (size_t k = 0; k < p->numel; k++) {
                dst[k] = 1.0f;
            }
            break;
        case PXT_INIT_FANIN: {
            float bound = (float)(1.0 / sqrt((double)(p->fan_in > 0 ? p->fan_in : 1)));
            pxt_rng_uniform(&rng, dst, p->numel, -bound, bound);
            break;
        }
        default: break; /* zeros */
        }
    }
}

/* Host floats (n) into the device's parameters of dtype dt. Host-side casts go
 * through the CPU device's table: host memory is that device's memory. */
static int upload(pxt_flat *f, float *host, size_t n) {
    const pxt_backend *be = f->be, *host_be = pxt_backend_for(PXT_CPU);
    int d = f->device.index;
    char *dst = f->params->data;
    if (f->device.type == PXT_CPU) {
        return f->dt == PXT_FLOAT32 ? be->copy(d, dst, host, n * sizeof(float), PXT_COPY_D2D)
                                    : be->cast(d, dst, f->dt, host, PXT_FLOAT32, n);
    }
    if (f->dt == PXT_FLOAT32) {
        return be->copy(d, dst, host, n * sizeof(float), PXT_COPY_H2D);
    }
    void *h16 = malloc(n * pxt_dtype_size(f->dt) + 1);
    if (!h16) {
        return pxt_error(PXT_ERR_OOM, "out of host memory for the initial parameters");
    }
    int rc = host_be->cast(0, h16, f->dt, host, PXT_FLOAT32, n);
    if (rc == PXT_OK) {
        rc = be->copy(d, dst, h16, n * pxt_dtype_size(f->dt), PXT_COPY_H2D);
    }
    free(h16);
    return rc;
}

/* The requests of the two buffers, in the order pxt_flat_init makes them. */
static size_t params_bytes(size_t n, pxt_dtype dt) { return n * pxt_dtype_size(dt); }
static size_t grads_bytes(size_t n) { return n * sizeof(float); }

int pxt_flat_plan(pxt_allocator *dev, size_t numel, pxt_dtype dt, size_t *params, size_t *grads) {
    *params = *grads = 0;
    PXT_TRY(pxt_alloc_plan_take(dev, params_bytes(numel, dt), params));
    return pxt_alloc_plan_take(dev, grads_bytes(numel), grads);
}

int pxt_flat_init(pxt_flat *f, pxt_param_layout *layout, pxt_device dev, pxt_dtype dt,
                  uint64_t seed, float resid_std) {
    memset(f, 0, sizeof *f);
    f->layout = *layout;
    memset(layout, 0, sizeof *layout);
    f->device = dev;
    f->be = pxt_backend_for(dev.type);
    f->dt = dt;
    size_t n = f->layout.numel;
    int rc = f->be ? PXT_OK : pxt_error(PXT_ERR_VALUE, "this build has no backend for the device");
    if (rc == PXT_OK) {
        rc = pxt_storage_new(dev, params_bytes(n, dt), &f->params);
    }
    if (rc == PXT_OK) {
        rc = pxt_storage_new(dev, grads_bytes(n), &f->grads);
    }
    if (rc == PXT_OK) {
        rc = pxt_flat_zero_grad(f);
    }
    float *host = NULL;
    if (rc == PXT_OK && !(host = calloc(n ? n : 1, sizeof(float)))) {
        rc = pxt_error(PXT_ERR_OOM, "out of host memory for the initial parameters");
    }
    if (rc == PXT_OK) {
        init_params(&f->layout, host, seed, resid_std);
        rc = upload(f, host, n);
    }
    free(host);
    if (rc != PXT_OK) {
        pxt_flat_free(f);
    }
    return rc;
}

void pxt_flat_free(pxt_flat *f) {
    pxt_storage_clear(&f->params);
    pxt_storage_clear(&f->grads);
    pxt_param_layout_free(&f->layout);
}

int pxt_flat_zero_grad(pxt_flat *f) {
    PXT_TRY(f->be->memset_zero(f->device.index, f->grads->data, f->grads->nbytes));
    f->cond_grads = 0;
    return PXT_OK;
}

void pxt_flat_set_busy(pxt_flat *f, int busy) { f->busy = f->params->busy = f->grads->busy = busy; }

char *pxt_flat_param(const pxt_flat *f, int i) {
    return f->params->data + f->layout.params[i].offset * pxt_dtype_size(f->dt);
}

float *pxt_flat_grad(const pxt_flat *f, int i) {
    return (float *)f->grads->data + f->layout.params[i].offset;
}

size_t pxt_flat_num_parameters(const pxt_flat *f) {
    size_t n = 0;
    for (int i = 0; i < f->layout.count; i++) {
        n += f->layout.params[i].numel;
    }
    return n;
}
