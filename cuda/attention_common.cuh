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
 * words are dropout.h's, the CPU's: counter {kpos / 8, qpos, h + 1, sample}, 16-bit half
 * kpos % 8, so one Philox call serves the keys of one group of eight positions;
 * a group is cut where a segment starts (positions restart there). */
__device__ static inline uint64_t attn_keep_bits(const pxt_dropout &d, int b, int h, int i, int j0,
                                                 int n) {
    const uint32_t qpos = pxt_dropout_pos(&d, i);
    uint64_t bits = 0;
    for (int jj = 0; jj < n;) {
        const int j = j0 + jj;
        const uint32_t kpos = pxt_dropout_pos(&d, j), off = kpos & 7u;
        const int seg_end = j < d.seg1 ? d.seg1 : j < d.seg2 ? d.seg2 : INT_MAX;
        /* keys of this call: the rest of the group, of the range, of the segment */
        const int cnt = min(8 - (int)off, min(n - jj, seg_end - j));
        uint32_t w[4];
        pxt_dropout_attn_words(&d, b, h, qpos, kpos, w);
        const uint32_t byte = pxt_dropout_attn_byte(&d, w);
        bits |= (uint64_t)((byte >> off) & ((1u << cnt) - 1u)) << jj;
        jj += cnt;
    }
    return bits;
}

/* The same bits for N (a multiple of 8) keys. Where they lie in one segment (all but
 * the tiles a segment starts in) they span N / 8 groups, or N / 8 + 1 when the first
 * position is not a group's start; those calls are independent, and unrolled the
 * compiler interleaves them: a Philox call is a chain of ~40 dependent instructions,
 * which one at a time a warp can only wait on. */
template <int N>
__device__ static inline uint64_t attn_keep_bits_n(const pxt_dropout &d, int b, int h, int i,
                                                   int j0) {
    static_assert(N % 8 == 0 && N <= 64, "whole groups, at most 64 bits");
    const uint32_t kpos0 = pxt_dropout_pos(&d, j0), off = kpos0 & 7u;
    const int seg_end = j0 < d.seg1 ? d.seg1 : j0 < d.seg2 ? d.seg2 : INT_MAX;
    if (N > seg_end - j0) {
        return attn_keep_bits(d, b, h, i, j0, N);
    }
    const uint32_t qpos = pxt_dropout_pos(&d, i), base = kpos0 - off;
    uint64_t bits = 0;
#pragma unroll
    for (int g = 0; g <= N / 8; g++) {
        if (g < N / 8 || off != 0) { /* the last group only when the first was cut */
            uint32_t w[4];
            pxt_dropout_attn_words(&d, b, h, qpos, base + 8u * (uint32_t)g, w);
            const uint64_t byte = pxt_dropout_attn_byte(&d, w);
            bits |= g == 0 ? byte >> off : byte << (8 * g - (int)off);
        }
    }
    return N == 64 ? bits : bits & ((1ull << N) - 1ull);
}

#endif /* PXT_ATTENTION_COMMON_CUH */
