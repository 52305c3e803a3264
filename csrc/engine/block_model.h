/* block_model.h: one pre-LayerNorm GPT-2 block (optionally with
 * cross-attention) with parameters and an arena of its own: the engine of
 * pyxtts.Block, on the same block.c code as the GPT.
 *
 * The arena (plan.h's standalone block) is reserved through the caching
 * allocator when the shape or policy changes and reused otherwise, so a
 * forward/backward of a known shape allocates nothing. The output y and the
 * input gradients dx, dcontext live in the arena: they stay valid until the
 * next forward (y) or backward (dx, dcontext), like any arena's activations. */
#ifndef PXT_BLOCK_MODEL_H
#define PXT_BLOCK_MODEL_H

#include "flat.h"
#include "plan.h"

typedef struct {
    int C, H, cross;
    float eps;
    pxt_flat flat;       /* params[j] is tensor j of layout.h's enums; fp32 */
    pxt_ckpt ckpt;       /* policy of the next forward */
    pxt_storage *arena;  /* plan.arena_bytes, NULL before the first forward */
    pxt_block_plan plan; /* the arena's layout */
    /* the forward whose activations the arena holds (backward repeats its ctx) */
    int pending, causal, has_key_mask, has_context_mask;
} pxt_block_model;

/* The inputs of a forward: x (B, T, C) and, with cross-attention, the context
 * (B, Tc, C), each host or device memory of the block's device; the masks
 * (0 = padding) host bytes or NULL. */
typedef struct {
    const void *x;
    int x_host;
    const uint8_t *key_mask; /* (B, T) */
    const void *context;
    int context_host;
    const uint8_t *context_mask; /* (B, Tc) */
    int causal;
} pxt_block_inputs;

/* GPT-2 init from one seeded stream in layout order, so the plain part of a
 * cross-attention block equals the plain block of the same seed (no 1/sqrt(2L):
 * one block). PXT_ERR_* with *m left empty. */
int pxt_block_model_init(pxt_block_model *m, int C, int H, int cross, float eps, pxt_device dev,
                         pxt_ckpt ckpt, uint64_t seed);
void pxt_block_model_free(pxt_block_model *m);

/* Makes the arena match p. The new arena is reserved while the old one is
 * still held; when that runs out of memory the old one (a cache) is handed back
 * and the request tried once more. On failure only that cache has changed. */
int pxt_block_model_reserve(pxt_block_model *m, const pxt_block_plan *p);
/* The block of p's arena in `plan`, a plan allocator copied from m's device's
 * allocator (alloc.h), as pxt_block_model_reserve takes it when memory suffices:
 * m's arena when p is its plan, else p's, reserved while m's is still held. */
int pxt_block_model_plan_arena(const pxt_block_model *m, pxt_allocator *plan,
                               const pxt_block_plan *p, size_t *out);
/* y (in the arena at plan.y) = block(x); the arena must be planned for the shape. */
int pxt_block_model_forward(pxt_block_model *m, const pxt_block_inputs *in);
/* dx (at plan.dres), and dcontext (at plan.dcontext) with cross-attention,
 * from dy (B, T, C) host or device memory; gradients accumulate. */
int pxt_block_model_backward(pxt_block_model *m, const void *dy, int dy_host);
/* Frees the arena; its bytes. */
size_t pxt_block_model_release_arena(pxt_block_model *m);

#endif /* PXT_BLOCK_MODEL_H */
