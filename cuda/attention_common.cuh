/* attention_common.cuh: what both attention paths (attention.cu, attention_tc.cu)
 * read the same way: per-sample lengths, the key mask, strided rows. */
#ifndef PXT_ATTENTION_COMMON_CUH
#define PXT_ATTENTION_COMMON_CUH

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

#endif /* PXT_ATTENTION_COMMON_CUH */
