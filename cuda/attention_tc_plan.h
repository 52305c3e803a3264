/* attention_tc_plan.h: the tensor-core attention kernels' tile shapes, the shared
 * memory each of them asks for, and the one decision whether a call takes them on a
 * device. attention_tc.cu asks it with the device's own numbers; tests/cuda_emu asks it
 * with those of sm_75, sm_86 and sm_90 cards and runs the path it picks under that
 * card's limit. No CUDA calls here: g++ compiles it for the emulator.
 *
 * Shared memory per block, dynamic (the kernels have no static shared memory; the
 * caller adds what cudaFuncGetAttributes reports anyway), D + TC_PAD elements a row:
 *
 *   kernel    D = 64                     D = 128
 *   forward   55,424 B (128 q + 4x64 kv) 87,168 B (64 q + 4x64 kv)
 *   dK/dV     56,384 B                   70,208 B
 *   dQ        55,424 B                   69,696 B
 *   one pass  93,312 B (128 keys)        75,328 B (64 keys)
 *
 * The per-block opt-in limits (cudaDevAttrMaxSharedMemoryPerBlockOptin): sm_75 64 KiB,
 * sm_80 163 KiB, sm_86 / sm_89 / sm_120 99 KiB, sm_90 227 KiB. The decision reads the
 * device's attribute, never its architecture number: a call whose kernels would not fit
 * takes the general kernels (attention_simple.cuh: at most 43,712 B of static shared
 * memory, under the 48 KiB every GPU grants without opting in) and says why. */
#ifndef PXT_ATTENTION_TC_PLAN_H
#define PXT_ATTENTION_TC_PLAN_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "engine/backend.h"
#include "sizes.h"

#ifdef __CUDACC__
#define PXT_TC_HD __host__ __device__
#else
#define PXT_TC_HD
#endif

#define TC_THREADS 128 /* 4 warps */
#define TC_PAD 8       /* elements of padding per shared-memory row */
#define TC_BQ 64       /* query rows of a dQ CTA (16 per warp); the forward's: fwd_bq */
#define TC_BK 64       /* keys of a forward tile and of a dK/dV CTA (16 per warp) */

/* m-tiles of 16 rows per warp in the forward: with 2, every K / V fragment read from
 * shared memory feeds two mma (the tile loop is bound by ldmatrix otherwise); D = 128
 * keeps 1 (2 would need ~300 registers: O alone is 128) */
template <int D> PXT_TC_HD constexpr int fwd_mt() { return D <= 64 ? 2 : 1; }
template <int D> PXT_TC_HD constexpr int fwd_bq() { return 64 * fwd_mt<D>(); }
/* Q (BQ, SD), K and V double-buffered (2, BK, SD) each, key flags (2, BK) */
template <int D> PXT_TC_HD constexpr int fwd_smem_bytes() {
    return (fwd_bq<D>() + 4 * TC_BK) * (D + TC_PAD) * 2 + 2 * TC_BK;
}
/* the query tile of the dK/dV kernel and the key tile of the dQ kernel (registers) */
template <int D> PXT_TC_HD constexpr int bwd_bq() { return D <= 64 ? 64 : 32; }
/* K, V (BK, SD); Q, dO double-buffered (2, BQ, SD); lse and Di (2, 2, BQ) fp32; flags */
template <int D> PXT_TC_HD constexpr int kv_smem_bytes() {
    return (2 * TC_BK + 4 * bwd_bq<D>()) * (D + TC_PAD) * 2 + 4 * bwd_bq<D>() * 4 + TC_BK;
}
/* Q, dO (BQ, SD); K, V double-buffered (2, BK, SD); key flags (2, BK) */
template <int D> PXT_TC_HD constexpr int q_smem_bytes() {
    return (2 * TC_BQ + 4 * bwd_bq<D>()) * (D + TC_PAD) * 2 + 2 * bwd_bq<D>();
}

/* the one-pass backward's warps, 16 keys each (sizes.h: the plan sizes its splits) */
template <int D> PXT_TC_HD constexpr int bwd1_warps() { return PXT_TC_BWD1_WARPS(D); }
/* its K, V (BK, SD); Q, dO double-buffered (2, BQ, SD); dS^T (BK, BQ + PAD) 16-bit; lse
 * and Di (2, 2, BQ) fp32; key flags (BK) */
template <int D> PXT_TC_HD constexpr int bwd_smem_bytes() {
    return (2 * 16 * bwd1_warps<D>() + 4 * bwd_bq<D>()) * (D + TC_PAD) * 2 +
           16 * bwd1_warps<D>() * (bwd_bq<D>() + TC_PAD) * 2 + 4 * bwd_bq<D>() * 4 +
           16 * bwd1_warps<D>();
}

/* dynamic shared memory per block of the four kernels of head dim D (64 or 128) */
struct pxt_tc_smem {
    int fwd, kv, q, bwd;
};
static inline pxt_tc_smem pxt_tc_smem_of(int D) {
    if (D == 64) {
        return pxt_tc_smem{fwd_smem_bytes<64>(), kv_smem_bytes<64>(), q_smem_bytes<64>(),
                           bwd_smem_bytes<64>()};
    }
    return pxt_tc_smem{fwd_smem_bytes<128>(), kv_smem_bytes<128>(), q_smem_bytes<128>(),
                       bwd_smem_bytes<128>()};
}
/* the most of the kernels a call launches: the one-pass backward's only where it runs */
static inline int pxt_tc_smem_most(int D, int one_pass) {
    const pxt_tc_smem s = pxt_tc_smem_of(D);
    int m = s.fwd > s.kv ? s.fwd : s.kv;
    m = m > s.q ? m : s.q;
    return one_pass && s.bwd > m ? s.bwd : m;
}

/* What the decision needs to know of a device. */
struct pxt_tc_device {
    int sm80;           /* sm_80+, and this binary runs sm_80+ code of the kernels there */
    size_t smem_optin;  /* cudaDevAttrMaxSharedMemoryPerBlockOptin, bytes */
    size_t smem_static; /* the most static shared memory of any of the kernels, bytes */
    int one_pass;       /* the backward is the one-pass kernel (PYXTTS_CUDA_ATTENTION_BWD) */
};

/* NULL when the tensor-core kernels run these arguments on dev; else why not, a
 * constant string or one written into buf (n bytes). ptrs: the call's nptrs operands. */
static inline const char *pxt_tc_why_not(const pxt_attn_args *a, const void *const *ptrs, int nptrs,
                                         const pxt_tc_device *dev, char *buf, size_t n) {
    auto strides8 = [](const pxt_strides &s) {
        return s.b % 8 == 0 && s.h % 8 == 0 && s.t % 8 == 0;
    };
    if (a->dt != PXT_BFLOAT16 && a->dt != PXT_FLOAT16) {
        return "the dtype is not bfloat16 or float16";
    }
    if (a->D != 64 && a->D != 128) {
        return "the head dim is not 64 or 128";
    }
    if (!strides8(a->q) || !strides8(a->k) || !strides8(a->v) || !strides8(a->o)) {
        return "a stride is not a multiple of 8 elements"; /* 16-byte cp.async rows */
    }
    if (!isfinite(a->scale * 1.4426950408889634f)) {
        /* the kernels score in base 2 (TC_LOG2E, attention_tc.cuh): a scale past
         * FLT_MAX / log2 e = 2.36e38 makes scale * log2 e inf, and a score the fallback
         * keeps finite (s * scale in range) would be inf or NaN there */
        return "scale * log2(e) overflows float (scale > 2.36e38)";
    }
    for (int i = 0; i < nptrs; i++) {
        if ((uintptr_t)ptrs[i] % 16) {
            return "a pointer is not 16-byte aligned";
        }
    }
    if (!dev->sm80) {
        return "the device is older than sm_80 (or this build has no sm_80+ code for it)";
    }
    const size_t need = dev->smem_static + (size_t)pxt_tc_smem_most(a->D, dev->one_pass);
    if (need > dev->smem_optin) {
        snprintf(buf, n,
                 "its kernels for D=%d need %zu bytes of shared memory per block and the "
                 "device allows %zu",
                 a->D, need, dev->smem_optin);
        return buf;
    }
    return NULL;
}

#endif /* PXT_ATTENTION_TC_PLAN_H */
