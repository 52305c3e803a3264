/* dropout.h: the masks of dropout, drawn from a counter-based generator.
 *
 * Philox4x32-10 (Salmon, Moraes, Dror and Shaw, SC'11) is a pure function of a
 * 64-bit key and a 128-bit counter: no state, so any element's draw can be made
 * anywhere, in any order, any number of times. The CPU and the CUDA backends
 * include this header and draw the same bits; recomputation under checkpointing
 * regenerates the forward's masks instead of storing them; resuming a run at
 * step s draws what the run would have drawn.
 *
 * One call (a dropout site of one training step) has its own key, mixed from
 * (seed, step, site). Within it an element is named by where it sits in the
 * data, never by where it sits in the batch's buffers:
 *   rows      (sample, position, channel)        counter {c / 4, pos, 0, sample},
 *             word c % 4 of the four the counter gives;
 *   attention (sample, head, query pos, key pos) counter {kpos / 8, qpos, head + 1, sample},
 *             16-bit half kpos % 8 of the eight (half 2w the low one of word w, 2w + 1 its
 *             high one): one call serves eight keys, as the probabilities are the
 *             attention kernels' hottest draw (FlashAttention-2 takes 8 bits an element;
 *             16 keep p within 2^-17). `sample` is
 * the sample's number in its effective batch (a micro-batch passes the number
 * of its first row) and `pos` a position inside the sample's own segment
 * (conditioning, text, audio), so a sample's masks do not depend on padding,
 * on the micro-batch it lands in, or on the thread that draws them.
 *
 * A row element is kept when its 32-bit word u >= threshold = round(p 2^32): it is
 * dropped with probability p (to 2^-32). An attention element is kept when its 16-bit
 * half u >= threshold16 = round(p 2^16): dropped with probability threshold16 / 2^16,
 * within 2^-17 of p. A kept element is multiplied by scale = 1 / (1 - p), as
 * torch.nn.Dropout does (for attention, an expectation within 2^-17 / (1 - p) of 1). */
#ifndef PXT_DROPOUT_H
#define PXT_DROPOUT_H

#include <stddef.h> /* NULL */
#include <stdint.h>

#ifdef __CUDACC__
#define PXT_HD static inline __host__ __device__
#else
#define PXT_HD static inline
#endif

/* What a kernel needs to draw one site's masks. p = 0 means no dropout. */
typedef struct pxt_dropout {
    float p;              /* probability of dropping an element, in [0, 1) */
    float scale;          /* 1 / (1 - p): what a kept element is multiplied by */
    uint32_t threshold;   /* a word below it drops the element (rows) */
    uint32_t threshold16; /* a 16-bit half below it drops the element (attention) */
    uint64_t key;         /* this site's key: pxt_dropout_key(seed, step, site) */
    int T;                /* rows per sample (row r is index r % T of sample r / T) */
    int seg1, seg2;       /* segment starts: index t is position t in segment 0 (t < seg1),
                           t - seg1 in segment 1 (t < seg2), t - seg2 in segment 2 */
    uint32_t sample0;     /* the number of the first sample */
    /* Keys read at run time, so that a captured step (a CUDA graph) replayed
     * for the next micro-batch draws that micro-batch's masks: when live is not
     * NULL, key and sample0 above are unused; the backend reads live[0] = seed,
     * live[1] = step and live[2] = sample0 from its own memory (written with the
     * batch) and mixes the key of `site` itself (pxt_dropout_resolve). */
    const uint64_t *live; /* (3) device memory, or NULL: key and sample0 as given */
    uint32_t site;        /* the site whose key live's seed and step give */
} pxt_dropout;

/* ---- Philox4x32-10 ---------------------------------------------------------- */

PXT_HD void pxt_philox4x32_10(const uint32_t ctr[4], uint64_t key, uint32_t out[4]) {
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
        k0 += 0x9E3779B9u; /* the key schedule's Weyl increments */
        k1 += 0xBB67AE85u;
    }
    out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

/* splitmix64's finaliser: a bijection that spreads every input bit. */
PXT_HD uint64_t pxt_mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The key of one site of one step. */
PXT_HD uint64_t pxt_dropout_key(uint64_t seed, uint64_t step, uint32_t site) {
    uint64_t k = pxt_mix64(seed + 0x9e3779b97f4a7c15ull);
    k = pxt_mix64(k ^ (step + 0x632be59bd9b4e019ull));
    return pxt_mix64(k ^ ((uint64_t)site + 0x8cb92ba72f3d8dd7ull));
}

/* ---- positions and masks ------------------------------------------------------ */

/* The masks of one site: probability p in [0, 1) (0: none), its key, and the
 * layout of the rows (see pxt_dropout). */
PXT_HD pxt_dropout pxt_dropout_make(float p, uint64_t key, int T, int seg1, int seg2,
                                    uint32_t sample0) {
    double t = (double)p * 4294967296.0 + 0.5; /* round(p 2^32) */
    double t16 = (double)p * 65536.0 + 0.5;    /* round(p 2^16) */
    pxt_dropout d;
    d.p = p;
    d.scale = p > 0.0f ? (float)(1.0 / (1.0 - (double)p)) : 1.0f;
    d.threshold = t >= 4294967295.0 ? 4294967295u : (uint32_t)t;
    d.threshold16 = t16 >= 65535.0 ? 65535u : (uint32_t)t16;
    d.key = key;
    d.T = T;
    d.seg1 = seg1;
    d.seg2 = seg2;
    d.sample0 = sample0;
    d.live = NULL;
    d.site = 0;
    return d;
}

/* The same site with its key and first sample read at run time from live (see
 * pxt_dropout): {seed, step, sample0} in the backend's memory. */
PXT_HD pxt_dropout pxt_dropout_make_live(float p, const uint64_t *live, uint32_t site, int T,
                                         int seg1, int seg2) {
    pxt_dropout d = pxt_dropout_make(p, 0, T, seg1, seg2, 0);
    d.live = live;
    d.site = site;
    return d;
}

/* d with its key and first sample in place: what every backend entry or kernel
 * that draws calls first, where live can be read (host code on the CPU, the
 * kernel itself on a GPU). 3 loads and 3 mixes, once per thread. */
PXT_HD pxt_dropout pxt_dropout_resolve(pxt_dropout d) {
    if (d.live) {
        d.key = pxt_dropout_key(d.live[0], d.live[1], d.site);
        d.sample0 = (uint32_t)d.live[2];
        d.live = NULL;
    }
    return d;
}

/* The position of index t: segment number in the top bits, place inside it below. */
PXT_HD uint32_t pxt_dropout_pos(const pxt_dropout *d, int t) {
    return t < d->seg1   ? (uint32_t)t
           : t < d->seg2 ? (1u << 28) + (uint32_t)(t - d->seg1)
                         : (2u << 28) + (uint32_t)(t - d->seg2);
}

/* The four words of the group of channels c .. c+3 (c a multiple of 4) of row r. */
PXT_HD void pxt_dropout_row_words(const pxt_dropout *d, int r, int c, uint32_t out[4]) {
    uint32_t ctr[4] = {(uint32_t)c >> 2, pxt_dropout_pos(d, r % d->T), 0u,
                       d->sample0 + (uint32_t)(r / d->T)};
    pxt_philox4x32_10(ctr, d->key, out);
}

/* The four words of keys with positions kpos & ~7 .. | 7 seen by query qpos of head h,
 * sample b: eight 16-bit halves. */
PXT_HD void pxt_dropout_attn_words(const pxt_dropout *d, int b, int h, uint32_t qpos, uint32_t kpos,
                                   uint32_t out[4]) {
    uint32_t ctr[4] = {kpos >> 3, qpos, (uint32_t)h + 1u, d->sample0 + (uint32_t)b};
    pxt_philox4x32_10(ctr, d->key, out);
}

/* Whether the key at position kpos is kept, from its group's four words. */
PXT_HD int pxt_dropout_attn_kept(const pxt_dropout *d, const uint32_t w[4], uint32_t kpos) {
    return ((w[(kpos & 7u) >> 1] >> (16u * (kpos & 1u))) & 0xFFFFu) >= d->threshold16;
}

/* The keep bits of the eight keys of a group (bit e: position (kpos & ~7) + e). */
PXT_HD uint32_t pxt_dropout_attn_byte(const pxt_dropout *d, const uint32_t w[4]) {
    uint32_t bits = 0;
    for (uint32_t e = 0; e < 8; e++) {
        bits |= (uint32_t)pxt_dropout_attn_kept(d, w, e) << e;
    }
    return bits;
}

/* What a row element whose word is u is multiplied by: 0 (dropped) or scale. */
PXT_HD float pxt_dropout_factor(const pxt_dropout *d, uint32_t u) {
    return u >= d->threshold ? d->scale : 0.0f;
}

#undef PXT_HD
#endif /* PXT_DROPOUT_H */
