/* flat.h: a model's flat state: parameters in one buffer, fp32 gradients in
 * another with the same element offsets.
 *
 * What every owner of parameters shares (the GPT, a standalone block, and any
 * further model part): the layout, both buffers, GPT-2 initialisation, and what
 * an optimizer over them needs to know. An optimizer takes a pxt_flat, never
 * the model that owns it, so neither includes the other. */
#ifndef PXT_FLAT_H
#define PXT_FLAT_H

#include "layout.h"
#include "storage.h"

typedef struct {
    pxt_param_layout layout; /* owned */
    pxt_device device;
    const pxt_backend *be;
    pxt_dtype dt;                /* of the parameters */
    pxt_storage *params;         /* (layout.numel) dt */
    pxt_storage *grads;          /* (layout.numel) fp32 */
    int busy;                    /* a step of the owner (or of its optimizer) runs */
    size_t optimizer_bytes;      /* allocator bytes of optimizer state over these buffers */
    size_t optimizer_host_bytes; /* ... and in the host pool (offloaded state) */
    /* tensors [layout.cond0, count) (the conditioning path) got gradients since the
     * last zero_grad: an optimizer step skips them otherwise, as torch's optimizers
     * skip parameters whose .grad is None (no decay of weights nothing used) */
    int cond_grads;
} pxt_flat;

/* Takes over *layout (freed with the state, on failure too), reserves both
 * buffers on dev, zeroes the gradients and initialises the parameters by their
 * PXT_INIT_* kind: GPT-2's N(0, 0.02) for matrices and embeddings, N(0,
 * resid_std) for the residual projections (attn.c_proj, mlp.c_proj), biases 0,
 * layernorm weights 1; torch's defaults for the conditioning path's convs and
 * linears. Drawn in fp32 on the host in layout order from one seeded stream, and
 * for 16-bit parameters rounded to nearest even on the host, so only their
 * bytes travel. On failure *f is left empty (pxt_flat_free is harmless). */
int pxt_flat_init(pxt_flat *f, pxt_param_layout *layout, pxt_device dev, pxt_dtype dt,
                  uint64_t seed, float resid_std);
void pxt_flat_free(pxt_flat *f);
/* Replays pxt_flat_init's requests (the parameters, then the gradients) for
 * numel elements of dtype dt through plan allocator dev (alloc.h): the bytes of
 * their blocks there. */
int pxt_flat_plan(pxt_allocator *dev, size_t numel, pxt_dtype dt, size_t *params, size_t *grads);

int pxt_flat_zero_grad(pxt_flat *f);
/* Marks f, and its parameter and gradient buffers (whose views then refuse writes),
 * as used by a step that runs without its owner's lock, or no longer: one flag
 * that the owner's and its optimizer's bindings both read. */
void pxt_flat_set_busy(pxt_flat *f, int busy);
/* Device pointers of tensor i of the layout. */
char *pxt_flat_param(const pxt_flat *f, int i);
float *pxt_flat_grad(const pxt_flat *f, int i);
/* Parameters, padding excluded. */
size_t pxt_flat_num_parameters(const pxt_flat *f);

#endif /* PXT_FLAT_H */
