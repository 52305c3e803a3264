/* storage.c: reference-counted device buffers (see storage.h). */
#include <stdlib.h>

#include "storage.h"

int pxt_storage_new(pxt_device dev, size_t nbytes, pxt_storage **out) {
    *out = NULL;
    pxt_allocator *a = pxt_allocator_get(dev);
    if (!a) {
        return PXT_ERR_VALUE;
    }
    return pxt_storage_new_in(a, nbytes, out);
}

int pxt_storage_new_in(pxt_allocator *a, size_t nbytes, pxt_storage **out) {
    *out = NULL;
    pxt_device dev = pxt_allocator_device(a);
    pxt_storage *s = calloc(1, sizeof *s);
    if (!s) {
        return pxt_error(PXT_ERR_OOM, "out of host memory for a storage descriptor");
    }
    s->nbytes = nbytes;
    s->device = dev;
    s->alloc = a;
    if (nbytes) {
        int rc = pxt_alloc(a, nbytes, &s->block);
        if (rc != PXT_OK) {
            free(s);
            return rc;
        }
        s->data = pxt_block_ptr(s->block);
    }
    atomic_init(&s->refs, 1);
    *out = s;
    return PXT_OK;
}

pxt_storage *pxt_storage_ref(pxt_storage *s) {
    atomic_fetch_add_explicit(&s->refs, 1, memory_order_relaxed);
    return s;
}

void pxt_storage_unref(pxt_storage *s) {
    if (!s) {
        return;
    }
    /* acq_rel: whatever a releasing thread wrote is visible to the freeing one */
    if (atomic_fetch_sub_explicit(&s->refs, 1, memory_order_acq_rel) != 1) {
        return;
    }
    if (s->block) {
        pxt_free(s->alloc, s->block);
    }
    free(s);
}

void pxt_storage_clear(pxt_storage **s) {
    pxt_storage *t = *s;
    *s = NULL;
    pxt_storage_unref(t);
}
