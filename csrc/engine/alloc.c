/* alloc.c: the caching allocator (see alloc.h).
 *
 * Memory is taken from the device in segments and handed out in blocks.
 *   small pool: requests <= 1 MiB, carved from 2 MiB segments
 *   large pool: requests <  10 MiB get a 20 MiB segment, larger ones a segment
 *               of their size rounded up to 2 MiB
 * Blocks of a segment form an address-ordered list (prev/next) so a freed
 * block merges with free neighbours. Free blocks sit in size-class bins
 * (4 classes per power of two) with a bitmap of non-empty bins, so a lookup is
 * a few instructions. A free block is split when the rest is worth keeping:
 * >= 256 bytes in the small pool, > 1 MiB in the large pool (smaller slivers of
 * large segments only fragment them). A segment returns to the device only
 * through empty_cache, or when a request would exceed the budget.
 *
 * Every stat changes only on success, so a failed request leaves allocated
 * bytes exactly as they were; reserved bytes too, unless the retry released
 * unused segments on the way.
 *
 * A plan allocator (pxt_alloc_plan_new) runs this same code over no memory:
 * its segments take nothing from a device and its blocks have no addresses
 * (NULL, or in a copy of a live allocator the live blocks' own, which nothing
 * dereferences). Where a block lands, whether it splits, and so its size depend
 * on the free blocks before it, which is why planners replay their requests
 * here rather than size each block alone. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"

#define NBINS 224 /* (63 - 8 + 1) powers of two x 4 classes */
#define NPOOLS 2

typedef struct pxt_segment pxt_segment;

struct pxt_block {
    char *ptr;
    size_t size;      /* multiple of PXT_ALIGN */
    size_t requested; /* what the caller asked for (live blocks) */
    pxt_segment *seg;
    pxt_block *prev, *next;   /* address-order neighbours within the segment */
    pxt_block *fprev, *fnext; /* bin list, while free */
    int is_free;
    int bin;
};

struct pxt_segment {
    char *base;
    size_t size;
    int pool;
    pxt_block *first;
    pxt_segment *prev, *next;
};

struct pxt_allocator {
    pthread_mutex_t lock;
    pxt_device device; /* the host pool: the CPU; its backend is its first user's */
    const pxt_backend *backend;
    int host;            /* the host pool: segments from backend->host_alloc */
    int host_index;      /* ... under the context of this device of the backend */
    int pinned;          /* the host pool's segments are page-locked */
    size_t device_total; /* 0 until first asked */
    pxt_block *bins[NPOOLS][NBINS];
    uint64_t bitmap[NPOOLS][(NBINS + 63) / 64];
    pxt_segment *segments;
    pxt_block *spare; /* recycled block structs, linked through next */
    pxt_alloc_stats st;
    long long inject_after; /* -1: off */
    int inject_raw;
    int plan; /* a plan allocator: no memory, no limit, no device */
};

static _Thread_local pxt_oom_info last_oom;

const pxt_oom_info *pxt_last_oom(void) { return &last_oom; }

static size_t round_up(size_t n, size_t m) { return (n + m - 1) / m * m; }

/* ---- bins ------------------------------------------------------------------ */

static int bin_index(size_t size) { /* size >= 256 */
    int fl = 63 - __builtin_clzll((unsigned long long)size);
    int sl = (int)((size >> (fl - 2)) & 3);
    return (fl - 8) * 4 + sl;
}

static void bin_insert(pxt_allocator *a, int pool, pxt_block *b) {
    int i = bin_index(b->size);
    b->bin = i;
    b->is_free = 1;
    b->fprev = NULL;
    b->fnext = a->bins[pool][i];
    if (b->fnext) {
        b->fnext->fprev = b;
    }
    a->bins[pool][i] = b;
    a->bitmap[pool][i / 64] |= 1ull << (i % 64);
}

static void bin_remove(pxt_allocator *a, int pool, pxt_block *b) {
    int i = b->bin;
    if (b->fprev) {
        b->fprev->fnext = b->fnext;
    } else {
        a->bins[pool][i] = b->fnext;
    }
    if (b->fnext) {
        b->fnext->fprev = b->fprev;
    }
    if (!a->bins[pool][i]) {
        a->bitmap[pool][i / 64] &= ~(1ull << (i % 64));
    }
    b->is_free = 0;
    b->fprev = b->fnext = NULL;
}

/* The smallest-class free block that holds size, or NULL. */
static pxt_block *bin_find(pxt_allocator *a, int pool, size_t size) {
    int i = bin_index(size);
    /* its own class spans sizes on both sides of the request: scan for a fit */
    for (pxt_block *b = a->bins[pool][i]; b; b = b->fnext) {
        if (b->size >= size) {
            return b;
        }
    }
    /* any block of a higher class fits: take the lowest non-empty class */
    for (int j = i + 1; j < NBINS;) {
        uint64_t word = a->bitmap[pool][j / 64] >> (j % 64);
        if (word) {
            return a->bins[pool][j + __builtin_ctzll(word)];
        }
        j = (j / 64 + 1) * 64;
    }
    return NULL;
}

/* ---- block structs --------------------------------------------------------- */

static pxt_block *spare_take(pxt_allocator *a) {
    pxt_block *b = a->spare;
    a->spare = b->next;
    memset(b, 0, sizeof *b);
    return b;
}

static void spare_put(pxt_allocator *a, pxt_block *b) {
    b->next = a->spare;
    a->spare = b;
}

/* Makes sure n block structs are at hand, so nothing can fail halfway. */
static int spare_reserve(pxt_allocator *a, int n) {
    int have = 0;
    for (pxt_block *b = a->spare; b && have < n; b = b->next) {
        have++;
    }
    for (; have < n; have++) {
        pxt_block *b = malloc(sizeof *b);
        if (!b) {
            return pxt_error(PXT_ERR_OOM, "out of host memory for allocator bookkeeping");
        }
        spare_put(a, b);
    }
    return PXT_OK;
}

/* ---- segments -------------------------------------------------------------- */

static void segment_release(pxt_allocator *a, pxt_segment *s) {
    bin_remove(a, s->pool, s->first);
    spare_put(a, s->first);
    if (s->prev) {
        s->prev->next = s->next;
    } else {
        a->segments = s->next;
    }
    if (s->next) {
        s->next->prev = s->prev;
    }
    if (a->plan) {
        /* no memory to give back */
    } else if (a->host) {
        a->backend->host_free(a->host_index, s->base);
    } else {
        a->backend->raw_free(a->device.index, s->base);
    }
    a->st.reserved_bytes -= s->size;
    a->st.num_raw_frees++;
    a->st.num_segments--;
    free(s);
}

static size_t release_cached(pxt_allocator *a) {
    size_t released = 0;
    pxt_segment *s = a->segments;
    while (s) {
        pxt_segment *next = s->next;
        if (s->first->is_free && !s->first->next) { /* one free block: unused */
            released += s->size;
            segment_release(a, s);
        }
        s = next;
    }
    return released;
}

/* Takes a segment of seg_size from the device and bins it as one free block.
 * PXT_ERR_OOM when the budget or the device says no. */
static int segment_new(pxt_allocator *a, int pool, size_t seg_size) {
    if (a->st.limit_bytes != PXT_NO_LIMIT &&
        (seg_size > a->st.limit_bytes || a->st.reserved_bytes > a->st.limit_bytes - seg_size)) {
        return pxt_error(PXT_ERR_OOM, "over the memory limit");
    }
    if (a->inject_raw && a->inject_after >= 0 && a->inject_after-- == 0) {
        a->inject_after = -1;
        return pxt_error(PXT_ERR_OOM,
                         "raw allocation failed (injected by pyxtts.testing.inject_oom)");
    }
    if (a->host) { /* the host would give pages it does not have by swapping, or by
                      killing a process once they are touched: refuse them here */
        size_t avail = 0, total = 0;
        if (pxt_backend_for(PXT_CPU)->mem_info(0, &avail, &total) == PXT_OK && seg_size > avail) {
            return pxt_error(PXT_ERR_OOM, "the host has %zu bytes of memory available", avail);
        }
    }
    pxt_segment *s = malloc(sizeof *s);
    if (!s) {
        return pxt_error(PXT_ERR_OOM, "out of host memory for allocator bookkeeping");
    }
    void *base = NULL; /* a plan's segments have no memory */
    int rc = a->plan   ? PXT_OK
             : a->host ? a->backend->host_alloc(a->host_index, seg_size, &base, &a->pinned)
                       : a->backend->raw_alloc(a->device.index, seg_size, &base);
    if (rc != PXT_OK) {
        free(s);
        return rc;
    }
    a->st.num_raw_allocs++;
    s->base = base;
    s->size = seg_size;
    s->pool = pool;
    s->prev = NULL;
    s->next = a->segments;
    if (s->next) {
        s->next->prev = s;
    }
    a->segments = s;
    pxt_block *b = spare_take(a);
    b->ptr = base;
    b->size = seg_size;
    b->seg = s;
    s->first = b;
    bin_insert(a, pool, b);
    a->st.reserved_bytes += seg_size;
    a->st.num_segments++;
    if (a->st.reserved_bytes > a->st.peak_reserved_bytes) {
        a->st.peak_reserved_bytes = a->st.reserved_bytes;
    }
    return PXT_OK;
}

/* Segment sizes to try for a block of size, best first (0 ends the list). */
static void segment_sizes(int pool, size_t size, size_t out[2]) {
    if (pool == 0) {
        out[0] = PXT_SMALL_SEGMENT;
        out[1] = size; /* near the limit: just the block */
    } else if (size < PXT_MID_SIZE) {
        out[0] = PXT_MID_SEGMENT;
        out[1] = round_up(size, PXT_LARGE_ROUND);
    } else {
        out[0] = round_up(size, PXT_LARGE_ROUND);
        out[1] = 0;
    }
    if (out[1] == out[0]) {
        out[1] = 0;
    }
}

/* Whether a free block of block_size splits off the rest after serving size. */
static int splits(int pool, size_t block_size, size_t size) {
    size_t rest = block_size - size;
    return pool == 0 ? rest >= PXT_ALIGN : rest > PXT_SMALL_SIZE;
}

/* A whole segment first. When the budget or the device says no, hand every
 * unused segment back and try again; only then settle for a segment of just
 * the block (near the limit). Trying the small fallback before releasing the
 * cache would pile up tiny segments (one raw allocation per block) while the
 * cache sits on memory that a whole segment could use. */
static int grow(pxt_allocator *a, int pool, size_t size) {
    size_t sizes[2];
    segment_sizes(pool, size, sizes);
    int rc = segment_new(a, pool, sizes[0]);
    if (rc != PXT_ERR_OOM) {
        return rc; /* success, or a device error that is not "full" */
    }
    a->st.num_alloc_retries++;
    release_cached(a);
    for (int i = 0; i < 2 && sizes[i]; i++) {
        rc = segment_new(a, pool, sizes[i]);
        if (rc != PXT_ERR_OOM) {
            return rc;
        }
    }
    return rc;
}

/* ---- public ---------------------------------------------------------------- */

static void fmt_bytes(size_t n, char *buf, size_t len) {
    static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)n;
    int u = 0;
    while (v >= 1024.0 && u < 4) {
        v /= 1024.0;
        u++;
    }
    snprintf(buf, len, u ? "%.2f %s" : "%.0f %s", v, units[u]);
}

/* The device's total once (lock held); the host pool's is the machine's RAM. */
static void read_total(pxt_allocator *a) {
    if (!a->device_total && !a->plan) {
        const pxt_backend *be = a->host ? pxt_backend_for(PXT_CPU) : a->backend;
        pxt_device_props p;
        if (be->device_props(a->host ? 0 : a->device.index, &p) == PXT_OK) {
            a->device_total = p.total_memory;
        }
    }
}

static int fail_oom(pxt_allocator *a, size_t nbytes, const char *why) {
    a->st.num_ooms++;
    last_oom.requested = nbytes;
    last_oom.allocated = a->st.allocated_bytes;
    last_oom.reserved = a->st.reserved_bytes;
    last_oom.limit = a->st.limit_bytes;
    last_oom.device_total = a->device_total;
    last_oom.device = a->device;
    last_oom.host = a->host;
    char dev[48], req[32], al[32], res[32], lim[48], tot[32];
    if (a->host) {
        snprintf(dev, sizeof dev, "the host pool (%s)", a->pinned ? "page-locked" : "host memory");
    } else {
        pxt_device_str(a->device, dev, sizeof dev);
    }
    fmt_bytes(nbytes, req, sizeof req);
    fmt_bytes(a->st.allocated_bytes, al, sizeof al);
    fmt_bytes(a->st.reserved_bytes, res, sizeof res);
    fmt_bytes(a->device_total, tot, sizeof tot);
    if (a->st.limit_bytes == PXT_NO_LIMIT) {
        snprintf(lim, sizeof lim, "none");
    } else {
        char l[32];
        fmt_bytes(a->st.limit_bytes, l, sizeof l);
        snprintf(lim, sizeof lim, "%s (%zu bytes)", l, a->st.limit_bytes);
    }
    return pxt_error(PXT_ERR_OOM,
                     "%s Tried to allocate %s (%zu bytes) on %s (total capacity %s); "
                     "%s (%zu bytes) allocated, %s (%zu bytes) reserved, limit %s. Cause: %s",
                     a->device.type == PXT_CUDA ? "CUDA out of memory." : "Host out of memory.",
                     req, nbytes, dev, tot, al, a->st.allocated_bytes, res, a->st.reserved_bytes,
                     lim, why);
}

int pxt_alloc(pxt_allocator *a, size_t nbytes, pxt_block **out) {
    *out = NULL;
    if (nbytes == 0) {
        return pxt_error(PXT_ERR_VALUE, "pxt_alloc: zero-byte request");
    }
    pthread_mutex_lock(&a->lock);
    read_total(a);
    int rc;
    if (nbytes > ((size_t)1 << 62)) {
        rc = fail_oom(a, nbytes, "the request is larger than any device");
        goto done;
    }
    if (!a->inject_raw && a->inject_after >= 0 && a->inject_after-- == 0) {
        a->inject_after = -1;
        rc = fail_oom(a, nbytes, "injected by pyxtts.testing.inject_oom");
        goto done;
    }
    rc = spare_reserve(a, 2); /* a segment's block and a split's remainder */
    if (rc != PXT_OK) {
        /* through fail_oom: the exception reads this request's numbers, not
         * the last failure's */
        rc = fail_oom(a, nbytes, "out of host memory for allocator bookkeeping");
        goto done;
    }
    size_t size = round_up(nbytes, PXT_ALIGN);
    int pool = size <= PXT_SMALL_SIZE ? 0 : 1;
    pxt_block *b = bin_find(a, pool, size);
    if (!b) {
        rc = grow(a, pool, size);
        if (rc == PXT_ERR_OOM) {
            char why[256];
            snprintf(why, sizeof why, "%s", pxt_error_message());
            rc = fail_oom(a, nbytes, why);
        }
        if (rc != PXT_OK) {
            goto done;
        }
        b = bin_find(a, pool, size);
    }
    bin_remove(a, pool, b);
    size_t rest = b->size - size;
    if (splits(pool, b->size, size)) {
        pxt_block *r = spare_take(a);           /* the tail stays free */
        r->ptr = b->ptr ? b->ptr + size : NULL; /* NULL: a plan's fresh segment */
        r->size = rest;
        r->seg = b->seg;
        r->prev = b;
        r->next = b->next;
        if (r->next) {
            r->next->prev = r;
        }
        b->next = r;
        b->size = size;
        bin_insert(a, pool, r);
    }
    b->requested = nbytes;
    a->st.allocated_bytes += b->size;
    a->st.requested_bytes += nbytes;
    a->st.num_allocs++;
    a->st.num_active_blocks++;
    if (a->st.allocated_bytes > a->st.peak_allocated_bytes) {
        a->st.peak_allocated_bytes = a->st.allocated_bytes;
    }
    *out = b;
done:
    pthread_mutex_unlock(&a->lock);
    return rc;
}

void pxt_free(pxt_allocator *a, pxt_block *b) {
    if (!b) {
        return;
    }
    pthread_mutex_lock(&a->lock);
    int pool = b->seg->pool;
    a->st.allocated_bytes -= b->size;
    a->st.requested_bytes -= b->requested;
    a->st.num_frees++;
    a->st.num_active_blocks--;
    b->requested = 0;
    /* merge with free neighbours so the segment can become whole again */
    pxt_block *p = b->prev;
    if (p && p->is_free) {
        bin_remove(a, pool, p);
        p->size += b->size;
        p->next = b->next;
        if (p->next) {
            p->next->prev = p;
        }
        spare_put(a, b);
        b = p;
    }
    pxt_block *n = b->next;
    if (n && n->is_free) {
        bin_remove(a, pool, n);
        b->size += n->size;
        b->next = n->next;
        if (b->next) {
            b->next->prev = b;
        }
        spare_put(a, n);
    }
    bin_insert(a, pool, b);
    pthread_mutex_unlock(&a->lock);
}

void *pxt_block_ptr(const pxt_block *b) { return b->ptr; }

size_t pxt_block_size(const pxt_block *b) { return b ? b->size : 0; }

size_t pxt_empty_cache(pxt_allocator *a) {
    pthread_mutex_lock(&a->lock);
    size_t released = release_cached(a);
    pthread_mutex_unlock(&a->lock);
    return released;
}

void pxt_set_limit(pxt_allocator *a, size_t limit) {
    pthread_mutex_lock(&a->lock);
    a->st.limit_bytes = limit;
    pthread_mutex_unlock(&a->lock);
}

void pxt_get_stats(pxt_allocator *a, pxt_alloc_stats *s) {
    pthread_mutex_lock(&a->lock);
    *s = a->st;
    s->inactive_split_bytes = 0;
    for (pxt_segment *g = a->segments; g; g = g->next) {
        if (g->first->is_free && !g->first->next) {
            continue; /* wholly free: cached, not split */
        }
        for (pxt_block *b = g->first; b; b = b->next) {
            if (b->is_free) {
                s->inactive_split_bytes += b->size;
            }
        }
    }
    s->cached_bytes = s->reserved_bytes - s->allocated_bytes;
    s->host = a->host;
    s->pinned = a->pinned;
    pthread_mutex_unlock(&a->lock);
}

void pxt_reset_peak(pxt_allocator *a) {
    pthread_mutex_lock(&a->lock);
    a->st.peak_allocated_bytes = a->st.allocated_bytes;
    a->st.peak_reserved_bytes = a->st.reserved_bytes;
    pthread_mutex_unlock(&a->lock);
}

void pxt_inject_oom(pxt_allocator *a, long long after, int raw) {
    pthread_mutex_lock(&a->lock);
    a->inject_after = after < 0 ? -1 : after;
    a->inject_raw = raw;
    pthread_mutex_unlock(&a->lock);
}

pxt_device pxt_allocator_device(const pxt_allocator *a) { return a->device; }

int pxt_allocator_is_host(const pxt_allocator *a) { return a->host; }

size_t pxt_allocator_device_total(pxt_allocator *a) {
    pthread_mutex_lock(&a->lock);
    read_total(a);
    size_t t = a->device_total;
    pthread_mutex_unlock(&a->lock);
    return t;
}

/* ---- registry: one allocator per device, created on first use -------------
 * Allocators live as long as the process: tensors may outlive the module. */
static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static pxt_allocator *registry[PXT_NUM_DEVICE_TYPES][PXT_MAX_DEVICES];

/* A new allocator of dev over be's memory, unlimited; NULL (error set) out of memory. */
static pxt_allocator *allocator_new(pxt_device dev, const pxt_backend *be) {
    pxt_allocator *a = calloc(1, sizeof *a);
    if (!a) {
        pxt_error(PXT_ERR_OOM, "out of host memory creating an allocator");
        return NULL;
    }
    pthread_mutex_init(&a->lock, NULL);
    a->device = dev;
    a->backend = be;
    a->st.limit_bytes = PXT_NO_LIMIT;
    a->inject_after = -1;
    return a;
}

pxt_allocator *pxt_allocator_get(pxt_device dev) {
    const pxt_backend *be = pxt_backend_for(dev.type);
    if (!be) {
        pxt_error(PXT_ERR_VALUE, "this build of pyxtts has no CUDA backend (it was compiled "
                                 "without nvcc); reinstall with the CUDA toolkit present");
        return NULL;
    }
    int count = be->device_count();
    if (dev.index < 0 || dev.index >= count || dev.index >= PXT_MAX_DEVICES) {
        char name[32];
        pxt_device_str(dev, name, sizeof name);
        pxt_error(PXT_ERR_VALUE, "device %s does not exist: this machine has %d %s device%s", name,
                  count, be->name, count == 1 ? "" : "s");
        return NULL;
    }
    pthread_mutex_lock(&registry_lock);
    pxt_allocator *a = registry[dev.type][dev.index];
    if (!a) {
        a = registry[dev.type][dev.index] = allocator_new(dev, be);
    }
    pthread_mutex_unlock(&registry_lock);
    return a;
}

/* The host pool: one per process, made through its first user's backend. */
static pxt_allocator *host_pool;

int pxt_host_pool_pinned(pxt_device user) {
    const pxt_backend *cuda = pxt_backend_for(PXT_CUDA);
    return user.type == PXT_CUDA || (cuda && cuda->device_count() > 0);
}

pxt_allocator *pxt_host_pool(pxt_device user) {
    pthread_mutex_lock(&registry_lock);
    pxt_allocator *a = host_pool;
    if (!a) { /* pinned wherever a GPU is: its copies then need no bounce, whoever asked */
        const pxt_backend *be = pxt_backend_for(pxt_host_pool_pinned(user) ? PXT_CUDA : PXT_CPU);
        if (!be || !be->host_alloc) {
            pthread_mutex_unlock(&registry_lock);
            pxt_error(PXT_ERR_VALUE, "this build has no host memory for the %s backend",
                      be ? be->name : "requested");
            return NULL;
        }
        a = host_pool = allocator_new((pxt_device){PXT_CPU, 0}, be);
        if (a) {
            a->host = 1;
            a->host_index = user.type == PXT_CUDA ? user.index : 0;
        }
    }
    pthread_mutex_unlock(&registry_lock);
    return a;
}

/* ---- plans: the same code over no memory ------------------------------------
 * A copy keeps every segment and block of the live allocator (sizes, order,
 * which are free) and each bin's list in its order: the lookup takes the first
 * fitting block of its class in list order, so the order decides where a
 * request lands. A copied block keeps the live block's address as its
 * identity (plan_twin finds it by it); a plan never dereferences an address. */

/* The block of plan p copied from the live block b, or NULL. */
static pxt_block *plan_twin(pxt_allocator *p, const pxt_block *b) {
    for (pxt_segment *s = p->segments; s; s = s->next) {
        if (s->base != b->seg->base) {
            continue;
        }
        for (pxt_block *c = s->first; c; c = c->next) {
            if (c->ptr == b->ptr) {
                return c;
            }
        }
    }
    return NULL;
}

/* Copies from's segments and blocks into the empty plan p (from's lock held). */
static int plan_copy(pxt_allocator *p, const pxt_allocator *from) {
    pxt_segment *last = NULL;
    for (const pxt_segment *s = from->segments; s; s = s->next) {
        pxt_segment *c = calloc(1, sizeof *c);
        if (!c) {
            return pxt_error(PXT_ERR_OOM, "out of host memory for a memory plan");
        }
        c->base = s->base;
        c->size = s->size;
        c->pool = s->pool;
        c->prev = last;
        if (last) {
            last->next = c;
        } else {
            p->segments = c;
        }
        last = c;
        pxt_block *prev = NULL;
        for (const pxt_block *b = s->first; b; b = b->next) {
            pxt_block *cb = calloc(1, sizeof *cb);
            if (!cb) {
                return pxt_error(PXT_ERR_OOM, "out of host memory for a memory plan");
            }
            cb->ptr = b->ptr;
            cb->size = b->size;
            cb->requested = b->requested;
            cb->seg = c;
            cb->prev = prev;
            if (prev) {
                prev->next = cb;
            } else {
                c->first = cb;
            }
            prev = cb;
        }
    }
    for (int pool = 0; pool < NPOOLS; pool++) {
        for (int i = 0; i < NBINS; i++) {
            const pxt_block *b = from->bins[pool][i];
            while (b && b->fnext) {
                b = b->fnext;
            }
            for (; b; b = b->fprev) { /* tail first: each insert goes to the head */
                bin_insert(p, pool, plan_twin(p, b));
            }
        }
    }
    p->st = from->st;
    p->st.limit_bytes = PXT_NO_LIMIT;
    return PXT_OK;
}

pxt_allocator *pxt_alloc_plan_new(pxt_allocator *from) {
    pxt_allocator *p = allocator_new((pxt_device){PXT_CPU, 0}, NULL);
    if (!p) {
        return NULL;
    }
    p->plan = 1;
    if (from) {
        pthread_mutex_lock(&from->lock);
        int rc = from->plan ? pxt_error(PXT_ERR_VALUE, "pxt_alloc_plan_new: from is a plan")
                            : plan_copy(p, from);
        pthread_mutex_unlock(&from->lock);
        if (rc != PXT_OK) {
            pxt_alloc_plan_free(p);
            return NULL;
        }
    }
    return p;
}

void pxt_alloc_plan_release(pxt_allocator *p, const pxt_block *live) {
    pxt_block *twin = p->plan && live ? plan_twin(p, live) : NULL;
    if (twin && !twin->is_free) {
        pxt_free(p, twin);
    }
}

int pxt_alloc_plan_take(pxt_allocator *p, size_t nbytes, size_t *block) {
    *block = 0;
    if (!p->plan) {
        return pxt_error(PXT_ERR_VALUE, "pxt_alloc_plan_take: not a plan allocator");
    }
    if (!nbytes) {
        return PXT_OK; /* a storage of 0 bytes takes no block */
    }
    pxt_block *b = NULL;
    PXT_TRY(pxt_alloc(p, nbytes, &b));
    *block = b->size;
    return PXT_OK;
}

void pxt_alloc_plan_free(pxt_allocator *p) {
    if (!p || !p->plan) {
        return;
    }
    while (p->segments) {
        pxt_segment *s = p->segments;
        p->segments = s->next;
        for (pxt_block *b = s->first; b;) {
            pxt_block *next = b->next;
            free(b);
            b = next;
        }
        free(s);
    }
    while (p->spare) {
        pxt_block *b = p->spare;
        p->spare = b->next;
        free(b);
    }
    pthread_mutex_destroy(&p->lock);
    free(p);
}

#undef NBINS
#undef NPOOLS
