/* elem.cuh: element access shared by the CUDA kernels, the GPU twin of
 * csrc/cpu/elem.h.
 *
 * Activations and parameters are float32, float16 or bfloat16 in memory; a
 * kernel loads every element to float, computes in float (double for long
 * reductions) and stores once, rounded to nearest even. The 16-bit types are
 * tag structs around their bits so that a kernel is a template over its
 * storage type T and `ldf` / `stf<T>` do the conversions; NaNs keep the CPU's
 * bits (see cast.cu). Host code picks T from a pxt_dtype with pxt_cuda_dispatch.
 *
 * Arithmetic: the build passes -fmad=false so that a * b + c is two roundings
 * as in the CPU's C11 code (elementwise kernels and AdamW then give the CPU's
 * bits); hot loops that do not need that call fmaf() explicitly. */
#ifndef PXT_CUDA_ELEM_CUH
#define PXT_CUDA_ELEM_CUH

#include <stdint.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda_common.h"

struct pxt_f16 {
    uint16_t bits;
}; /* IEEE binary16 storage */
struct pxt_bf16 {
    uint16_t bits;
}; /* bfloat16 storage */

/* ---- float32 <-> float16 / bfloat16, round to nearest even, CPU NaN bits ---- */
__device__ static inline uint16_t pxt_d_f32_to_f16(float f) {
    if (isnan(f)) { /* as csrc/half.c: sign | 0x7c00 | quiet | top 9 payload bits */
        uint32_t u = __float_as_uint(f);
        return (uint16_t)(((u >> 16) & 0x8000u) | 0x7e00u | ((u >> 13) & 0x3ffu));
    }
    return __half_as_ushort(__float2half_rn(f));
}

__device__ static inline float pxt_d_f16_to_f32(uint16_t h) {
    if ((h & 0x7c00u) == 0x7c00u) { /* inf / NaN: keep the payload, as the CPU does */
        return __uint_as_float(((uint32_t)(h & 0x8000u) << 16) | 0x7f800000u |
                               ((uint32_t)(h & 0x3ffu) << 13));
    }
    return __half2float(__ushort_as_half(h)); /* exact, subnormals included */
}

__device__ static inline uint16_t pxt_d_f32_to_bf16(float f) {
    if (isnan(f)) { /* keep sign and payload, force the quiet bit */
        return (uint16_t)((__float_as_uint(f) >> 16) | 0x0040u);
    }
    return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}

__device__ static inline float pxt_d_bf16_to_f32(uint16_t h) {
    return __uint_as_float((uint32_t)h << 16);
}

/* ---- typed load / store ------------------------------------------------------ */
__device__ static inline float ldf(float x) { return x; }
__device__ static inline float ldf(pxt_f16 x) { return pxt_d_f16_to_f32(x.bits); }
__device__ static inline float ldf(pxt_bf16 x) { return pxt_d_bf16_to_f32(x.bits); }

template <typename T> __device__ static inline T stf(float v);
template <> __device__ inline float stf<float>(float v) { return v; }
template <> __device__ inline pxt_f16 stf<pxt_f16>(float v) { return pxt_f16{pxt_d_f32_to_f16(v)}; }
template <> __device__ inline pxt_bf16 stf<pxt_bf16>(float v) {
    return pxt_bf16{pxt_d_f32_to_bf16(v)};
}

/* ---- host side ------------------------------------------------------------------ */
/* Calls f(T{}) with T the storage type of an activation dtype, so one generic
 * lambda launches the right template instance; PXT_ERR_TYPE naming `op` else. */
template <typename F> static inline int pxt_cuda_dispatch(pxt_dtype dt, const char *op, F &&f) {
    switch (dt) {
    case PXT_FLOAT32: f(float{}); return PXT_OK;
    case PXT_FLOAT16: f(pxt_f16{}); return PXT_OK;
    case PXT_BFLOAT16: f(pxt_bf16{}); return PXT_OK;
    default:
        return pxt_error(PXT_ERR_TYPE, "%s: dtype must be float32, float16 or bfloat16, got %s", op,
                         pxt_dtype_name(dt));
    }
}

/* Blocks of an elementwise grid-stride kernel over n elements: enough to fill
 * any GPU, capped so the grid stays within limits; the loop does the rest. */
#define PXT_EW_BLOCK 256
static inline unsigned int pxt_ew_grid(size_t n) {
    size_t blocks = (n + PXT_EW_BLOCK - 1) / PXT_EW_BLOCK;
    return (unsigned int)(blocks < 65536 ? (blocks ? blocks : 1) : 65536);
}

#endif
