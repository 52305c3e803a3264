/* attention_common.cuh: what both attention paths (attention.cu, attention_tc.cu)
 * read the same way: per-sample lengths, the key mask, strided rows, the masks of
 * dropout of the probabilities. */
#ifndef PXT_ATTENTION_COMMON_CUH
#define PXT_ATTENTION_COMMON_CUH

#include <limits.h>

#include "engine/backend.h"

__device__ static inline int iclamp(int x, int lo, int hi) { return x < lo ? lo : x > hi ? hi : x; }

/* valid query rows / keys of sample b (lengths clamped to the sequence) */
__device__ static inline int q_len(const pxt_attn_args &a, int b) {
    return a.q_lengths ? iclamp(a.q_lengths[b], 0, a.Tq) : a.Tq;
}
__device__ static inline int k_len(const pxt_attn_args &a, int b) {
    return a.k_lengths ? iclamp(a.k_lengths[b], 0, a.Tk) : a.Tk;
}

/* key j of sample b is attendable: before k_length and not masked */
__device__ static inline bool key_ok(const pxt_attn_args &a, int b, int j, int klen) {
    return j < klen && (!a.key_mask || a.key_mask[(size_t)b * a.Tk + j] != 0);
}

/* row t of head (b, h) of an operand laid out by s */
template <typename T>
__device__ static inline T *row_ptr(T *base, const pxt_strides &s, int b, int h, int t) {
    return base + ((int64_t)b * s.b + (int64_t)h * s.h + (int64_t)t * s.t);
}

/* Dropout of the probabilities (a.drop.p > 0): the keep bits of keys j0 .. j0+n-1
 * (n <= 64) seen by query i of (b, h); bit jj is set when key j0 + jj is kept. The
 * words are dropout.h's, the CPU's: counter {kpos / 4, qpos, h + 1, sample}, word
 * kpos % 4, so one Philox call serves the keys of one group of four positions;
 * a group is cut where a segment starts (positions restart there). */
__device__ static inline uint64_t attn_keep_bits(const pxt_dropout &d, int b, int h, int i, int j0,
                                                 int n) {
    const uint32_t qpos = pxt_dropout_pos(&d, i), th = d.threshold;
    uint64_t bits = 0;
    for (int jj = 0; jj < n;) {
        const int j = j0 + jj;
        const uint32_t kpos = pxt_dropout_pos(&d, j), off = kpos & 3u;
        const int seg_end = j < d.seg1 ? d.seg1 : j < d.seg2 ? d.seg2 : INT_MAX;
        /* keys of this call: the rest of the group, of the range, of the segment */
        const int cnt = min(4 - (int)off, min(n - jj, seg_end - j));
        uint32_t w[4];
        pxt_dropout_attn_words(&d, b, h, qpos, kpos, w);
        const uint32_t nib = (uint32_t)(w[0] >= th) | (uint32_t)(w[1] >= th) << 1 |
                             (uint32_t)(w[2] >= th) << 2 | (uint32_t)(w[3] >= th) << 3;
        bits |= (uint64_t)((nib >> off) & ((1u << cnt) - 1u)) << jj;
        jj += cnt;
    }
    return bits;
}

#endif /* PXT_ATTENTION_COMMON_CUH */
