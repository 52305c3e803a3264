/* emu.h: a host emulation of one CUDA thread block, enough to run the
 * project's own kernel source (the .cuh files of cuda/) on a machine without a GPU.
 *
 *  - a block is blockDim cooperative fibers (ucontext stacks), each run until it
 *    reaches a collective or ends; blocks of a grid run one after another;
 *  - __syncthreads and the warp collectives (__shfl_xor_sync, __ballot_sync,
 *    ldmatrix, mma.m16n8k16) resolve when every participant has arrived; a
 *    warp whose lanes meet different collectives, or a deadlock, is reported;
 *  - ldmatrix and mma follow the PTX ISA's fragment tables; cp.async lands at
 *    issue (EARLY) or at the issuing thread's wait_group (LATE, the latest the
 *    ISA allows);
 *  - dynamic shared memory is poisoned with 0xFF (NaN in every float format)
 *    per block and accesses are checked against the launch's size; a launch
 *    asking more than emu_smem_limit (a card's per-block opt-in limit) fails,
 *    as on that card, and runs nothing; device
 *    buffers come from emu_alloc: poisoned, with an inaccessible page right
 *    after their last byte, so a read or write past the end stops the program.
 *
 * It proves index math, masking, tails and the order of floating-point
 * operations; it says nothing about speed. */
#pragma once
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <setjmp.h>
#include <ucontext.h>

#include <functional>
#include <type_traits>
#include <vector>

extern "C" {
#include "engine/pxt.h"
}

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
#define __shared__ static

struct alignas(8) float2 {
    float x, y;
};
static inline float2 make_float2(float x, float y) { return float2{x, y}; }

static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }

struct emu_dim3 {
    unsigned x = 1, y = 1, z = 1;
};

/* ---- 16-bit storage, the CPU's conversions (csrc/half.c) ------------------------ */
struct pxt_f16 { uint16_t bits; };
struct pxt_bf16 { uint16_t bits; };
static inline float ldf(float x) { return x; }
static inline float ldf(pxt_f16 x) { return pxt_f16_to_f32(x.bits); }
static inline float ldf(pxt_bf16 x) { return pxt_bf16_to_f32(x.bits); }
template <typename T> static inline T stf(float v);
template <> inline float stf<float>(float v) { return v; }
template <> inline pxt_f16 stf<pxt_f16>(float v) { return pxt_f16{pxt_f32_to_f16(v)}; }
template <> inline pxt_bf16 stf<pxt_bf16>(float v) { return pxt_bf16{pxt_f32_to_bf16(v)}; }

/* ---- fibers -------------------------------------------------------------------- */
enum emu_kind { K_RUN = 0, K_BAR, K_SHFL, K_SHFL_IDX, K_BALLOT, K_LDSM, K_LDSMT, K_MMA_BF, K_MMA_H, K_DONE };
struct emu_slot {
    uint64_t word;                      /* shfl: the value's bits */
    int imm;                            /* shfl: the lane mask (xor) or the source lane (idx) */
    uint32_t addr;                      /* ldmatrix */
    uint32_t a[4], b0, b1;              /* mma */
    float c[4];
    uint64_t rword;                     /* results */
    uint32_t ru[4];
    float rc[4];
};
struct emu_copy {
    uint32_t dst;
    const void *src;
    int bytes;
};
struct emu_fiber {
    ucontext_t ctx; /* the first start */
    jmp_buf jb;     /* where it blocked */
    int started;
    emu_dim3 tid;
    int kind;
    emu_slot s;
    std::vector<std::vector<emu_copy>> groups; /* committed cp.async groups, oldest first */
    std::vector<emu_copy> open;
};
#define EMU_MAX_THREADS 1024
extern emu_fiber emu_fib[EMU_MAX_THREADS];
extern int emu_cur;
extern emu_dim3 emu_block_idx, emu_grid_dim, emu_block_dim;
extern unsigned char emu_smem[];
extern size_t emu_smem_size; /* the dynamic size the launch asked for */
extern size_t emu_smem_limit; /* the device's per-block limit (0: none): a launch over it fails */
extern int emu_late;         /* cp.async lands at wait (1) or at issue (0) */
extern long emu_errors;
extern long emu_bank_conflicts;
#define threadIdx (emu_fib[emu_cur].tid)
#define blockIdx emu_block_idx
#define gridDim emu_grid_dim
#define blockDim emu_block_dim

void emu_block(int kind);
void emu_error(const char *fmt, ...);

/* vec.cuh's vector loads and stores: a GPU faults on a misaligned one */
#define PXT_VEC_CHECK_ALIGNED(p, bytes)                                                            \
    ((uintptr_t)(p) % (bytes) ? emu_error("vector access of %d bytes at misaligned %p", (int)(bytes), \
                                          (const void *)(p))                                        \
                              : (void)0)

static inline void __syncthreads() { emu_block(K_BAR); }

template <typename T> static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask) {
    static_assert(sizeof(T) <= 8, "shfl of at most 8 bytes");
    if (mask != 0xffffffffu)
        emu_error("shfl: partial mask %08x", mask);
    emu_slot &s = emu_fib[emu_cur].s;
    s.word = 0;
    memcpy(&s.word, &v, sizeof v);
    s.imm = lane_mask;
    emu_block(K_SHFL);
    T r;
    memcpy(&r, &emu_fib[emu_cur].s.rword, sizeof r);
    return r;
}

/* the value of lane src (src taken mod 32, as the hardware does for a full warp) */
template <typename T> static inline T __shfl_sync(unsigned mask, T v, int src) {
    static_assert(sizeof(T) <= 8, "shfl of at most 8 bytes");
    if (mask != 0xffffffffu)
        emu_error("shfl: partial mask %08x", mask);
    emu_slot &s = emu_fib[emu_cur].s;
    s.word = 0;
    memcpy(&s.word, &v, sizeof v);
    s.imm = src & 31;
    emu_block(K_SHFL_IDX);
    T r;
    memcpy(&r, &emu_fib[emu_cur].s.rword, sizeof r);
    return r;
}

static inline unsigned __ballot_sync(unsigned mask, int pred) {
    if (mask != 0xffffffffu)
        emu_error("ballot: partial mask %08x", mask);
    emu_fib[emu_cur].s.word = pred != 0;
    emu_block(K_BALLOT);
    return (unsigned)emu_fib[emu_cur].s.rword;
}

static inline int __ffs(unsigned x) { return __builtin_ffs((int)x); }

/* ---- the PTX wrappers of cuda/attention_tc.cu, emulated -------------------------- */
static inline uint32_t smem_u32(const void *p) {
    return (uint32_t)((const unsigned char *)p - emu_smem);
}
void emu_do_copy(const emu_copy &c);
static inline void cp_async16(uint32_t dst, const void *src, int src_bytes) {
    if (dst % 16 || dst + 16 > emu_smem_size) {
        emu_error("cp.async: destination %u bad (shared size %zu)", dst, emu_smem_size);
        return;
    }
    if (src_bytes && (uintptr_t)src % 16)
        emu_error("cp.async: source not 16-byte aligned");
    emu_copy c{dst, src, src_bytes};
    if (emu_late)
        emu_fib[emu_cur].open.push_back(c);
    else
        emu_do_copy(c);
}
static inline void cp_async_commit() {
    emu_fiber &f = emu_fib[emu_cur];
    f.groups.push_back(f.open);
    f.open.clear();
}
template <int N> static inline void cp_async_wait() {
    emu_fiber &f = emu_fib[emu_cur];
    while ((int)f.groups.size() > N) {
        for (auto &c : f.groups.front())
            emu_do_copy(c);
        f.groups.erase(f.groups.begin());
    }
}
static inline void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
    emu_fib[emu_cur].s.addr = addr;
    emu_block(K_LDSM);
    for (int i = 0; i < 4; i++)
        r[i] = emu_fib[emu_cur].s.ru[i];
}
static inline void ldsm_x4_t(uint32_t (&r)[4], uint32_t addr) {
    emu_fib[emu_cur].s.addr = addr;
    emu_block(K_LDSMT);
    for (int i = 0; i < 4; i++)
        r[i] = emu_fib[emu_cur].s.ru[i];
}
template <typename T>
static inline void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    emu_slot &s = emu_fib[emu_cur].s;
    for (int i = 0; i < 4; i++) {
        s.a[i] = a[i];
        s.c[i] = c[i];
    }
    s.b0 = b0;
    s.b1 = b1;
    emu_block(std::is_same_v<T, pxt_bf16> ? K_MMA_BF : K_MMA_H);
    for (int i = 0; i < 4; i++)
        c[i] = emu_fib[emu_cur].s.rc[i];
}
template <typename T> static inline uint32_t pack2(float lo, float hi) {
    return (uint32_t)stf<T>(lo).bits | ((uint32_t)stf<T>(hi).bits << 16);
}
/* ex2.approx.ftz.f32: exp2f (the device's is within 2^-22 of it), with the device's
 * flushes: a subnormal input is 0, a subnormal result 0 */
static inline float tc_exp2(float x) {
    float y = exp2f(fpclassify(x) == FP_SUBNORMAL ? 0.0f : x);
    return fpclassify(y) == FP_SUBNORMAL ? 0.0f : y;
}

/* ---- launches and device memory ------------------------------------------------------ */
/* Runs body as every thread of every block of grid x block, one block at a time,
 * with `smem` bytes of (poisoned) dynamic shared memory; an error and nothing run
 * when smem is over emu_smem_limit. */
void emu_launch(emu_dim3 grid, emu_dim3 block, size_t smem, std::function<void()> body);

/* Device memory: n bytes (256-byte aligned) filled with 0xFF, the page after
 * the allocation's end made inaccessible. emu_free releases it;
 * emu_tail_intact says whether the slack between n and the guard page is
 * still 0xFF (no write past the end that stayed within it). */
void *emu_alloc(size_t n);
void emu_free(void *p);
int emu_tail_intact(const void *p);
