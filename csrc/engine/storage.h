/* storage.h: device memory the engine owns, reference-counted.
 *
 * One caching-allocator block on one device. The engine's objects hold their
 * buffers as storages (a model's flat parameters and gradients, a step's arena,
 * an optimizer's state); the Python Tensor type takes a reference when it views
 * one, so memory stays valid while anything points into it, and goes back to
 * the allocator with the last reference. Counts are C11 atomics: a reference
 * may be dropped on any thread. A storage of 0 bytes has no block (data NULL). */
#ifndef PXT_STORAGE_H
#define PXT_STORAGE_H

#include <stdatomic.h>

#include "alloc.h"

typedef struct pxt_storage {
    char *data;    /* device pointer to byte 0; NULL when nbytes == 0 */
    size_t nbytes; /* as requested */
    pxt_device device;
    pxt_allocator *alloc;
    pxt_block *block; /* NULL when nbytes == 0 */
    atomic_long refs;
    int busy; /* a step uses it with the GIL released: Python must not write it (set,
                 cleared and read with the GIL held) */
} pxt_storage;

/* A new storage of nbytes on dev with one reference. PXT_ERR_OOM (the
 * allocator's details in pxt_last_oom) or PXT_ERR_VALUE (no such device);
 * *out is NULL then and nothing was allocated. */
int pxt_storage_new(pxt_device dev, size_t nbytes, pxt_storage **out);
/* The same from a given allocator (the host pool's storages are CPU memory). */
int pxt_storage_new_in(pxt_allocator *a, size_t nbytes, pxt_storage **out);
/* Takes a reference; returns s. */
pxt_storage *pxt_storage_ref(pxt_storage *s);
/* Drops a reference (NULL: nothing); the last one frees the memory. */
void pxt_storage_unref(pxt_storage *s);
/* Drops *s's reference and sets *s to NULL. */
void pxt_storage_clear(pxt_storage **s);

#endif /* PXT_STORAGE_H */
