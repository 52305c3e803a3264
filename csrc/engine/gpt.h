/* gpt.h: the XTTS GPT: its flat state, its step arena and the step itself.
 *
 * llm.c's gpt2_forward / gpt2_backward over the backend table: a step uploads
 * the batch into the arena, runs the conditioning path (cond.h) when the batch
 * carries mels, embeds, runs the blocks, the final norms, the fused heads +
 * cross-entropy (logits chunk by chunk, never all of them) and, when training,
 * the backward down to the embeddings and through the conditioning path,
 * adding into the flat gradients. The arena is planned (plan.h) and reserved
 * before the step runs, so the step itself allocates nothing and cannot run
 * out of memory.
 *
 * Dropout (training, cfg.dropout > 0) where GPT-2 applies it: the summed input
 * embeddings (the conditioning latents' rows included, as GPT2Model's drop
 * sees them), the attention probabilities, both residual branches. Site 0 is
 * the embeddings, block l's are 1 + 3l (probabilities), 2 + 3l (attention
 * branch), 3 + 3l (MLP branch); keys come from (dropout_seed, dropout_step, site). */
#ifndef PXT_GPT_H
#define PXT_GPT_H

#include "flat.h"
#include "plan.h"

/* A model's checkpoint policy: a block's (pxt_ckpt), or auto, the fewest
 * recomputed blocks whose plan fits the memory available. */
enum { PXT_CKPT_AUTO = 3 };

/* A phase of the step recorded as a backend graph (its forward up to the final
 * norms, or its backward after the heads), with everything its launches depend
 * on besides addresses: the shape and policy, the dropout probability and whether
 * attention takes the key mask. The addresses do not change while a graph lives:
 * the flat state's are the model's for its life, and a new arena frees every
 * graph (pxt_gpt_reserve, pxt_gpt_release_arena). What changes between
 * micro-batches of one shape (the batch, the dropout keys) lives in the arena;
 * the heads, which gather each sample's valid rows on the host's word, run
 * between the two phases as they come. */
#define PXT_GPT_GRAPHS 8

typedef struct {
    void *graph; /* the backend's graph; NULL: a free slot */
    int phase, B, Lt, La, Nc, S, train, key_mask;
    float dropout;
    uint64_t policy; /* a hash of the blocks' and conditioning path's policies */
    uint64_t used;   /* the clock at its last launch: the least recent is evicted */
} pxt_gpt_graph;

typedef struct {
    uint64_t recorded, replayed, evicted, failed;
    char error[256]; /* why the last record failed ("" when none did) */
} pxt_gpt_graph_stats;

typedef struct {
    pxt_gpt_config cfg;
    pxt_flat flat;      /* parameters, gradients, device, dtype */
    int ckpt;           /* pxt_ckpt or PXT_CKPT_AUTO: the policy of the next step */
    pxt_storage *arena; /* plan.arena_bytes or more (keep_larger); NULL until the first step */
    pxt_plan plan;      /* the arena's layout */
    /* graphs (backends with graph entries): 1 records the step's two phases per
     * shape and replays them; a failed record turns this back to 0 (the step
     * then runs as it comes), stats.error says why */
    int graphs;
    pxt_gpt_graph graph[PXT_GPT_GRAPHS];
    uint64_t graph_clock;
    pxt_gpt_graph_stats graph_stats;
} pxt_gpt;

/* Told during a training step's backward that elements [offset, offset + count)
 * of the flat gradients hold all of this step's additions: the caller may start
 * reading them (an all-reduce, a copy to the host) while the backward goes on.
 * Groups come in backward order: the final norms with the heads, the blocks from
 * the last, the embedding tables, then the conditioning path when the model has
 * one; together they cover every tensor once. On a device the call comes when
 * the group's work is queued, not done: what the caller queues after it on the
 * legacy default stream runs after that work. Nonzero: the step stops there
 * with that code, the gradients holding part of its additions. */
typedef int (*pxt_grads_done_fn)(void *ctx, size_t offset, size_t count);

/* A batch on the host, validated by the caller's shapes: B samples of Lt text
 * and La audio positions after Nc conditioning latents, which come from cond
 * (fixed latents), from mels through the conditioning path (S > 0), or neither. */
typedef struct {
    int B, Lt, La, Nc, S;
    const int32_t *text_ids, *text_tgt, *text_pos;    /* (B, Lt) */
    const int32_t *audio_ids, *audio_tgt, *audio_pos; /* (B, La) */
    const uint8_t *key_mask;                          /* (B, T): 0 = padding */
    const char *cond;                                 /* (B, Nc, C) model dtype, or NULL */
    const char *mels;                                 /* (B, 80, S) model dtype, or NULL */
    const int32_t *text_len, *audio_len;              /* (B) */
    double n_text, n_audio;                           /* normalisers of the mean losses */
    double loss_scale;                                /* multiplies the loss gradient (1: none) */
    uint64_t dropout_seed, dropout_step;              /* key the dropout masks */
    uint32_t sample0;                                 /* number of the first sample (masks) */
    pxt_grads_done_fn grads_done;                     /* NULL: nobody is told */
    void *grads_done_ctx;
} pxt_gpt_batch;

typedef struct {
    double text_sum, audio_sum; /* sums of -log p over valid targets */
} pxt_gpt_losses;

/* Checks the config, then builds the flat state on dev (GPT-2 init, residual
 * projections scaled by 1/sqrt(2 n_layers)). PXT_ERR_* with *m left empty. */
int pxt_gpt_init(pxt_gpt *m, const pxt_gpt_config *c, pxt_device dev, pxt_dtype dt, int ckpt,
                 uint64_t seed);
void pxt_gpt_free(pxt_gpt *m);

/* Plans a step (S mel frames, 0 without the conditioning path) with a fixed
 * policy, or for auto the fewest recomputed units that fit budget: the
 * conditioning path (with mels) and then the blocks turn selective one by one,
 * then full one by one (when nothing fits the all-full plan stands, and the
 * step reports the shortfall). */
int pxt_gpt_plan(pxt_plan *p, const pxt_gpt_config *c, const pxt_backend *be, pxt_dtype dt, int B,
                 int Lt, int La, int Nc, int S, int ckpt, int train, size_t budget);
/* The allocator bytes of a model's buffers and of a step's arena, each its
 * block's size (what the allocators count): read off the live blocks for what
 * exists, replayed in order through plan allocators (alloc.h) for what does not. */
typedef struct {
    size_t params, grads; /* the flat buffers, on the model's device */
    size_t opt, opt_host; /* optimizer state: on the device, in the host pool */
    size_t arena;         /* the step's arena, on the device */
} pxt_gpt_blocks;

/* Bytes outside the arena a step needs on the device: parameters, gradients
 * when training, and optimizer state. */
size_t pxt_gpt_fixed_bytes(const pxt_gpt_blocks *b, int train);
/* What the device's allocator counts for a step: those and the arena. */
size_t pxt_gpt_total_bytes(const pxt_gpt_blocks *b, int train);
/* The block of a step of plan p's arena in `plan`, a plan allocator copied from
 * m's device's allocator, as pxt_gpt_reserve takes it (keep_larger 0): m's
 * arena when p is its plan, else p's, reserved once m's arena is freed. */
int pxt_gpt_plan_arena(const pxt_gpt *m, pxt_allocator *plan, const pxt_plan *p, size_t *out);
/* Bytes available for this model's arena: the limit (else the device's total)
 * minus what is allocated besides the current arena. */
size_t pxt_gpt_arena_budget(const pxt_gpt *m);

/* The last line of defence before the kernels: lengths, ids, targets and
 * positions in range (PXT_ERR_VALUE naming what is not), and the backend has
 * the ops the step needs (PXT_ERR_NOT_IMPLEMENTED). */
int pxt_gpt_check_batch(const pxt_gpt *m, const pxt_gpt_batch *in, int train);
/* Makes the arena match p (takes p over on success; freed on failure). With
 * keep_larger, a cached arena of at least p's bytes serves p as it is (micro-batches
 * of one step, a row fewer than the first, allocate nothing). On failure the
 * previous arena is gone (it is a cache) and nothing else changed. */
int pxt_gpt_reserve(pxt_gpt *m, pxt_plan *p, int keep_larger);
/* Runs the step the arena is planned for. */
int pxt_gpt_step(pxt_gpt *m, const pxt_gpt_batch *in, pxt_gpt_losses *out);
/* Frees the arena and the recorded graphs; the arena's bytes. */
size_t pxt_gpt_release_arena(pxt_gpt *m);
/* Frees the recorded graphs (they are recorded again when needed). */
void pxt_gpt_free_graphs(pxt_gpt *m);

#endif /* PXT_GPT_H */
