/* flat_state.c: what every owner of flat parameter buffers shares (the model,
 * a standalone Block): GPT-2 initialisation and the named views. */
#include "module.h"

#include <string.h>

#include "engine/rng.h"

/* GPT-2 initialisation of params (a flat tensor laid out by l): N(0, 0.02) for
 * matrices and embeddings, N(0, resid_std) for the residual projections
 * (attn.c_proj, mlp.c_proj), biases 0, layernorm weights 1. Drawn in fp32 on
 * the host in layout order; a 16-bit copy is rounded to nearest even on the host
 * first, so only its bytes travel to a device. -1 with an exception. */
int pxt_flat_init(const pxt_param_layout *l, pxt_tensor *params, uint64_t seed,
                  float resid_std) {
    size_t n = l->numel;
    pxt_dtype dt = params->dtype;
    const pxt_backend *be = pxt_backend_for(params->device.type);
    int dev = params->device.index;
    float *host = PyMem_RawCalloc(n ? n : 1, sizeof(float));
    if (!host) {
        PyErr_NoMemory();
        return -1;
    }
    pxt_rng rng;
    pxt_rng_seed(&rng, seed);
    for (int i = 0; i < l->count; i++) {
        const pxt_param_info *p = &l->params[i];
        float *dst = host + p->offset;
        size_t len = strlen(p->name);
        if (p->ndim == 2) {
            int resid = strstr(p->name, "attn.c_proj.weight") || strstr(p->name, "mlp.c_proj.weight");
            pxt_rng_normal(&rng, dst, p->numel, resid ? resid_std : 0.02f);
        } else if (len > 7 && !strcmp(p->name + len - 7, ".weight")) {
            for (size_t k = 0; k < p->numel; k++) dst[k] = 1.0f; /* layernorm gains */
        } /* biases stay 0 */
    }
    int rc = PXT_OK;
    void *src = host;
    if (dt != PXT_FLOAT32) {
        if (params->device.type == PXT_CPU) {
            rc = be->cast(dev, params->data, dt, host, PXT_FLOAT32, n);
            src = NULL;
        } else {
            void *h16 = PyMem_RawMalloc(n * pxt_dtype_size(dt) + 1);
            if (!h16) {
                PyMem_RawFree(host);
                PyErr_NoMemory();
                return -1;
            }
            rc = pxt_cpu_backend()->cast(0, h16, dt, host, PXT_FLOAT32, n);
            PyMem_RawFree(host);
            host = src = h16;
        }
    }
    if (rc == PXT_OK && src)
        rc = be->copy(dev, params->data, src, n * pxt_dtype_size(dt),
                      params->device.type == PXT_CPU ? PXT_COPY_D2D : PXT_COPY_H2D);
    PyMem_RawFree(host);
    if (rc != PXT_OK) {
        pxt_raise(rc);
        return -1;
    }
    return 0;
}

/* name -> Tensor view of each tensor of the layout inside flat (its device and
 * dtype); the views keep flat alive. */
PyObject *pxt_flat_views(const pxt_param_layout *l, pxt_tensor *flat) {
    PyObject *d = PyDict_New();
    if (!d)
        return NULL;
    size_t es = pxt_dtype_size(flat->dtype);
    for (int i = 0; i < l->count; i++) {
        const pxt_param_info *p = &l->params[i];
        PyObject *v = pxt_tensor_borrow((PyObject *)flat, flat->data + p->offset * es,
                                        flat->device, flat->dtype, p->ndim, p->shape, 0);
        if (!v || PyDict_SetItemString(d, p->name, v) < 0) {
            Py_XDECREF(v);
            Py_DECREF(d);
            return NULL;
        }
        Py_DECREF(v);
    }
    return d;
}
