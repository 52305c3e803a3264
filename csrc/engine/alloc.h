/* alloc.h: the caching allocator, one per device, over the backend's raw memory.
 *
 * Device-agnostic: it sees raw_alloc/raw_free of a backend table and nothing
 * else, so the CPU and CUDA allocators are the same code. No Python here. */
#ifndef PXT_ALLOC_H
#define PXT_ALLOC_H

#include "backend.h"

#define PXT_ALIGN 256                       /* every block starts on 256 bytes */
#define PXT_SMALL_SIZE ((size_t)1 << 20)    /* <= 1 MiB: small pool */
#define PXT_SMALL_SEGMENT ((size_t)2 << 20) /* small pool segments: 2 MiB */
#define PXT_MID_SIZE ((size_t)10 << 20)     /* < 10 MiB: 20 MiB segments */
#define PXT_MID_SEGMENT ((size_t)20 << 20)
#define PXT_LARGE_ROUND ((size_t)2 << 20) /* larger: round to 2 MiB */
#define PXT_NO_LIMIT ((size_t)-1)

typedef struct pxt_allocator pxt_allocator;
typedef struct pxt_block pxt_block; /* one live allocation; opaque */

typedef struct {
    size_t allocated_bytes; /* bytes in live blocks (rounded sizes) */
    size_t requested_bytes; /* bytes callers asked for, live */
    size_t reserved_bytes;  /* bytes in segments taken from the device */
    size_t peak_allocated_bytes;
    size_t peak_reserved_bytes;
    size_t limit_bytes;          /* PXT_NO_LIMIT when unlimited */
    size_t inactive_split_bytes; /* free bytes inside partly used segments */
    size_t cached_bytes;         /* free bytes held in the cache */
    uint64_t num_allocs, num_frees, num_ooms, num_alloc_retries;
    uint64_t num_raw_allocs, num_raw_frees;
    uint64_t num_segments, num_active_blocks;
    int host, pinned; /* the host pool; its segments page-locked */
} pxt_alloc_stats;

/* Details of the last failed request of this thread, for the exception. */
typedef struct {
    size_t requested, allocated, reserved, limit, device_total;
    pxt_device device;
    int host; /* the host pool's request (device: the CPU) */
} pxt_oom_info;

/* The allocator of a device, created on first use. NULL (error set) when the
 * device does not exist in this build or on this machine. */
pxt_allocator *pxt_allocator_get(pxt_device dev);
pxt_device pxt_allocator_device(const pxt_allocator *a);

/* The host pool: host memory for state kept off the device (the optimizer's,
 * offloaded), with its own budget and stats beside the devices'. One per
 * process, made on first use: page-locked (portable, so every GPU copies it
 * without a bounce) where the build has CUDA and the machine a GPU, under the
 * context of `user` when it is one (else cuda:0's); plain memory without a GPU.
 * Later users share it. Its blocks are CPU memory (the CPU backend computes on
 * them); pxt_allocator_device says PXT_CPU. */
pxt_allocator *pxt_host_pool(pxt_device user);
/* Whether the host pool is page-locked when made for user (what plans report). */
int pxt_host_pool_pinned(pxt_device user);
int pxt_allocator_is_host(const pxt_allocator *a);

/* A block of at least nbytes (nbytes > 0), 256-byte aligned. On failure
 * returns PXT_ERR_OOM (or PXT_ERR_DEVICE) with *out == NULL and every stat but
 * num_ooms / num_alloc_retries exactly as before, except that unused segments
 * the retry handed back stay released (reserved bytes drop by them). */
int pxt_alloc(pxt_allocator *a, size_t nbytes, pxt_block **out);
void pxt_free(pxt_allocator *a, pxt_block *b);
void *pxt_block_ptr(const pxt_block *b);

/* The bytes b takes (allocated_bytes counts these: the request rounded up to
 * PXT_ALIGN, or the whole free block it came from when the rest was too small
 * to split off). 0 for NULL. */
size_t pxt_block_size(const pxt_block *b);

/* Returns every wholly free segment to the device; the bytes released. */
size_t pxt_empty_cache(pxt_allocator *a);
void pxt_set_limit(pxt_allocator *a, size_t limit);
void pxt_get_stats(pxt_allocator *a, pxt_alloc_stats *s);
void pxt_reset_peak(pxt_allocator *a);

/* Test hook: the (after+1)-th request from now fails as if the device were
 * full (raw = 0), or the (after+1)-th raw segment allocation fails as a full
 * device would, going through the release-and-retry path (raw = 1).
 * after < 0 clears it. One-shot. */
void pxt_inject_oom(pxt_allocator *a, long long after, int raw);

const pxt_oom_info *pxt_last_oom(void);

/* ---- plans -------------------------------------------------------------------
 * A block's size depends on where it lands: a request is served from the
 * smallest free block class that holds it, which may be the free rest of an
 * earlier segment, split there or (a rest too small to keep) taken whole. So a
 * planner cannot size a buffer alone: it replays the requests that will be
 * made, in their order, through a plan allocator, which is this allocator's
 * own code over no memory, and reads the sizes the blocks get. The plan equals
 * what the live allocator will count when the live one starts in the state the
 * plan started in, nothing else allocates or frees there in between, and it
 * takes every segment whole (no limit or full device pushes it to release its
 * cache or take a segment of just the block; a plan has no limit). */

/* A plan allocator: empty (from NULL: a fresh allocator), or a copy of the live
 * allocator from's state. NULL (error set) out of host memory. */
pxt_allocator *pxt_alloc_plan_new(pxt_allocator *from);
/* In plan p, a copy of a live allocator: frees the copy of its block `live`
 * (NULL, or a block p does not hold: nothing), as pxt_free would free it there. */
void pxt_alloc_plan_release(pxt_allocator *p, const pxt_block *live);
/* Replays a request of nbytes in plan p: *block the bytes it takes, 0 for 0
 * bytes (a storage of 0 bytes takes no block). */
int pxt_alloc_plan_take(pxt_allocator *p, size_t nbytes, size_t *block);
/* Frees a plan allocator (NULL, or a live allocator: nothing). */
void pxt_alloc_plan_free(pxt_allocator *p);

/* Total memory of the device, from its backend (cached on first call). */
size_t pxt_allocator_device_total(pxt_allocator *a);

#endif /* PXT_ALLOC_H */
