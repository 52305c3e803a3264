/* cast.cu: element type conversion on the GPU, bit for bit the CPU's
 * (csrc/cpu/cast.c is the reference; its comment states the rules).
 *
 * Floats convert through float32 and round to nearest even. NaN keeps the
 * CPU's bits (sign and top payload bits, quiet bit set) rather than the
 * hardware's canonical NaN, so results compare equal as bytes. Float to
 * integer goes through double exactly as the CPU does: truncate, saturate,
 * NaN -> 0. Build without -ftz=true / --use_fast_math: they flush float32
 * subnormals, which the CPU keeps. */
#include <stdint.h>

#include "elem.cuh"

/* float32 <-> float16 / bfloat16 conversions: elem.cuh (shared with the kernels) */

/* ---- the generic path: load as float or int64, store as the destination ------ */
__device__ static float load_float(const void *src, pxt_dtype t, size_t i) {
    switch (t) {
    case PXT_FLOAT32: return ((const float *)src)[i];
    case PXT_FLOAT16: return pxt_d_f16_to_f32(((const uint16_t *)src)[i]);
    case PXT_BFLOAT16: return pxt_d_bf16_to_f32(((const uint16_t *)src)[i]);
    default: return 0.0f;
    }
}

__device__ static int64_t load_int(const void *src, pxt_dtype t, size_t i) {
    switch (t) {
    case PXT_INT32: return ((const int32_t *)src)[i];
    case PXT_INT64: return ((const int64_t *)src)[i];
    case PXT_UINT8: return ((const uint8_t *)src)[i];
    case PXT_BOOL: return ((const uint8_t *)src)[i] != 0;
    default: return 0;
    }
}

/* double, as on the CPU, so the bounds compare exactly the same way */
/* saturate at the integer's own bounds (inf -> INT64_MAX), NaN -> 0: as cast.c */
__device__ static int64_t float_to_int64_sat(double v, int64_t lo, int64_t hi, double hi_plus_1) {
    if (isnan(v)) {
        return 0;
    }
    if (v <= (double)lo) {
        return lo;
    }
    if (v >= hi_plus_1) {
        return hi;
    }
    return (int64_t)v; /* truncates toward zero; in range here */
}

__device__ static void store_float(void *dst, pxt_dtype t, size_t i, float v) {
    switch (t) {
    case PXT_FLOAT32: ((float *)dst)[i] = v; break;
    case PXT_FLOAT16: ((uint16_t *)dst)[i] = pxt_d_f32_to_f16(v); break;
    case PXT_BFLOAT16: ((uint16_t *)dst)[i] = pxt_d_f32_to_bf16(v); break;
    /* the CPU's bounds; int64's top is the largest double below 2^63 */
    case PXT_INT32:
        ((int32_t *)dst)[i] = (int32_t)float_to_int64_sat(v, INT32_MIN, INT32_MAX, 2147483648.0);
        break;
    case PXT_INT64:
        ((int64_t *)dst)[i] = float_to_int64_sat(v, INT64_MIN, INT64_MAX, 9223372036854775808.0);
        break;
    case PXT_UINT8:
        ((uint8_t *)dst)[i] = (uint8_t)float_to_int64_sat(v, 0, UINT8_MAX, 256.0);
        break;
    case PXT_BOOL: ((uint8_t *)dst)[i] = (uint8_t)(v != 0.0f); break; /* NaN != 0: true */
    default: break;
    }
}

__device__ static void store_int(void *dst, pxt_dtype t, size_t i, int64_t v) {
    switch (t) {
    case PXT_FLOAT32: ((float *)dst)[i] = (float)v; break;
    case PXT_FLOAT16:
        ((uint16_t *)dst)[i] = pxt_d_f32_to_f16((float)v);
        break; /* via float32, as the CPU */
    case PXT_BFLOAT16: ((uint16_t *)dst)[i] = pxt_d_f32_to_bf16((float)v); break;
    case PXT_INT32: ((int32_t *)dst)[i] = (int32_t)(uint32_t)(uint64_t)v; break; /* wraps */
    case PXT_INT64: ((int64_t *)dst)[i] = v; break;
    case PXT_UINT8: ((uint8_t *)dst)[i] = (uint8_t)(uint64_t)v; break; /* wraps */
    case PXT_BOOL: ((uint8_t *)dst)[i] = (uint8_t)(v != 0); break;
    default: break;
    }
}

/* ---- kernels: grid-stride loops over n elements -------------------------------- */
/* dt/st are the same for every thread, so the switches do not diverge */
__global__ static void cast_kernel(void *dst, pxt_dtype dt, const void *src, pxt_dtype st,
                                   int src_is_float, size_t n) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        if (src_is_float) {
            store_float(dst, dt, i, load_float(src, st, i));
        } else {
            store_int(dst, dt, i, load_int(src, st, i));
        }
    }
}

/* the hot pairs of mixed precision get their own kernel, as on the CPU */
template <typename S, typename D, D (*CONV)(S)>
__global__ static void map_kernel(D *dst, const S *src, size_t n) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        dst[i] = CONV(src[i]);
    }
}

/* ---- host entry -------------------------------------------------------------------- */
#define CAST_BLOCK 256
#define CAST_MAX_GRID 65536 /* more blocks than any GPU holds at once; the loop does the rest */

int pxt_cuda_cast(int index, void *dst, pxt_dtype dt, const void *src, pxt_dtype st, size_t n) {
    if (n == 0) {
        return PXT_OK; /* a grid of 0 blocks is a launch error */
    }
    PXT_CUDA_ENTER(index);
    cudaStream_t stream = pxt_cuda_stream(index);
    if (dt == st) {
        PXT_CUDA_CHECK(
            cudaMemcpyAsync(dst, src, n * pxt_dtype_size(dt), cudaMemcpyDeviceToDevice, stream));
        return PXT_OK;
    }
    size_t blocks = (n + CAST_BLOCK - 1) / CAST_BLOCK;
    unsigned int grid = (unsigned int)(blocks < CAST_MAX_GRID ? blocks : CAST_MAX_GRID);
    if (st == PXT_FLOAT32 && dt == PXT_BFLOAT16) {
        map_kernel<float, uint16_t, pxt_d_f32_to_bf16>
            <<<grid, CAST_BLOCK, 0, stream>>>((uint16_t *)dst, (const float *)src, n);
    } else if (st == PXT_BFLOAT16 && dt == PXT_FLOAT32) {
        map_kernel<uint16_t, float, pxt_d_bf16_to_f32>
            <<<grid, CAST_BLOCK, 0, stream>>>((float *)dst, (const uint16_t *)src, n);
    } else if (st == PXT_FLOAT32 && dt == PXT_FLOAT16) {
        map_kernel<float, uint16_t, pxt_d_f32_to_f16>
            <<<grid, CAST_BLOCK, 0, stream>>>((uint16_t *)dst, (const float *)src, n);
    } else if (st == PXT_FLOAT16 && dt == PXT_FLOAT32) {
        map_kernel<uint16_t, float, pxt_d_f16_to_f32>
            <<<grid, CAST_BLOCK, 0, stream>>>((float *)dst, (const uint16_t *)src, n);
    } else {
        cast_kernel<<<grid, CAST_BLOCK, 0, stream>>>(dst, dt, src, st, pxt_dtype_is_float(st), n);
    }
    PXT_CUDA_CHECK_LAUNCH("cast");
    return PXT_OK; /* queued: ordered before the device's next work */
}

#undef CAST_BLOCK
#undef CAST_MAX_GRID
