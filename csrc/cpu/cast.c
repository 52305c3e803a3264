/* cast.c: element type conversion on the CPU (the reference for every backend).
 *
 * Floats convert through float32 and round to nearest even. Float to integer
 * truncates toward zero and saturates at the integer's range; NaN becomes 0
 * (C leaves both undefined, so they are spelled out). Anything to bool is
 * "!= 0". Integers convert exactly where the value fits, else wrap (int64 to
 * int32 keeps the low 32 bits, as NumPy does). */
#include <math.h>
#include <string.h>

#include "engine/pxt.h"
#include "cpu.h"

static float load_float(const void *src, pxt_dtype t, size_t i) {
    switch (t) {
    case PXT_FLOAT32: return ((const float *)src)[i];
    case PXT_FLOAT16: return pxt_f16_to_f32(((const uint16_t *)src)[i]);
    case PXT_BFLOAT16: return pxt_bf16_to_f32(((const uint16_t *)src)[i]);
    default: return 0.0f;
    }
}

static int64_t load_int(const void *src, pxt_dtype t, size_t i) {
    switch (t) {
    case PXT_INT32: return ((const int32_t *)src)[i];
    case PXT_INT64: return ((const int64_t *)src)[i];
    case PXT_UINT8: return ((const uint8_t *)src)[i];
    case PXT_BOOL: return ((const uint8_t *)src)[i] != 0;
    default: return 0;
    }
}

static void store_float(void *dst, pxt_dtype t, size_t i, float v) {
    switch (t) {
    case PXT_FLOAT32: ((float *)dst)[i] = v; break;
    case PXT_FLOAT16: ((uint16_t *)dst)[i] = pxt_f32_to_f16(v); break;
    case PXT_BFLOAT16: ((uint16_t *)dst)[i] = pxt_f32_to_bf16(v); break;
    default: pxt_store_int_sat(dst, t, i, v); break;
    }
}

static void store_int(void *dst, pxt_dtype t, size_t i, int64_t v) {
    switch (t) {
    case PXT_FLOAT32: ((float *)dst)[i] = (float)v; break;
    case PXT_FLOAT16: ((uint16_t *)dst)[i] = pxt_f32_to_f16((float)v); break;
    case PXT_BFLOAT16: ((uint16_t *)dst)[i] = pxt_f32_to_bf16((float)v); break;
    case PXT_INT32: ((int32_t *)dst)[i] = (int32_t)(uint32_t)(uint64_t)v; break; /* wraps */
    case PXT_INT64: ((int64_t *)dst)[i] = v; break;
    case PXT_UINT8: ((uint8_t *)dst)[i] = (uint8_t)(uint64_t)v; break; /* wraps */
    case PXT_BOOL: ((uint8_t *)dst)[i] = (uint8_t)(v != 0); break;
    default: break;
    }
}

int pxt_cpu_cast(int index, void *dst, pxt_dtype dt, const void *src, pxt_dtype st, size_t n) {
    (void)index;
    if (dt == st) {
        memcpy(dst, src, n * pxt_dtype_size(dt));
        return PXT_OK;
    }
    /* the hot pairs of mixed precision get their own loops */
    if (st == PXT_FLOAT32 && dt == PXT_BFLOAT16) {
        const float *s = src;
        uint16_t *d = dst;
        for (size_t i = 0; i < n; i++) {
            d[i] = pxt_f32_to_bf16(s[i]);
        }
        return PXT_OK;
    }
    if (st == PXT_BFLOAT16 && dt == PXT_FLOAT32) {
        const uint16_t *s = src;
        float *d = dst;
        for (size_t i = 0; i < n; i++) {
            d[i] = pxt_bf16_to_f32(s[i]);
        }
        return PXT_OK;
    }
    if (st == PXT_FLOAT32 && dt == PXT_FLOAT16) {
        const float *s = src;
        uint16_t *d = dst;
        for (size_t i = 0; i < n; i++) {
            d[i] = pxt_f32_to_f16(s[i]);
        }
        return PXT_OK;
    }
    if (st == PXT_FLOAT16 && dt == PXT_FLOAT32) {
        const uint16_t *s = src;
        float *d = dst;
        for (size_t i = 0; i < n; i++) {
            d[i] = pxt_f16_to_f32(s[i]);
        }
        return PXT_OK;
    }
    if (pxt_dtype_is_float(st)) {
        for (size_t i = 0; i < n; i++) {
            store_float(dst, dt, i, load_float(src, st, i));
        }
    } else {
        for (size_t i = 0; i < n; i++) {
            store_int(dst, dt, i, load_int(src, st, i));
        }
    }
    return PXT_OK;
}
