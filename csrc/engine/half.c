/* half.c: element conversions: float32 <-> float16 / bfloat16 (rounding to
 * nearest even), and float -> integer by pyxtts's rule.
 *
 * Bit-level so the result is the same on every compiler and CPU (NumPy and
 * ml_dtypes round the same way; the tests compare against them). NaN stays
 * NaN (quiet), infinities and signed zeros are kept, float16 overflow gives
 * infinity and underflow gives subnormals. */
#include <math.h>
#include <string.h>

#include "pxt.h"

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t pxt_f32_to_bf16(float f) {
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) { /* NaN: keep sign, force quiet bit */
        return (uint16_t)((u >> 16) | 0x0040u);
    }
    uint32_t lsb = (u >> 16) & 1u;
    u += 0x7fffu + lsb; /* ties go to the even neighbour */
    return (uint16_t)(u >> 16);
}

float pxt_bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

uint16_t pxt_f32_to_f16(float f) {
    uint32_t u = f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a >= 0x7f800000u) { /* inf or NaN */
        return (uint16_t)(sign | 0x7c00u | (a > 0x7f800000u ? 0x0200u | ((a >> 13) & 0x3ffu) : 0u));
    }
    if (a >= 0x477ff000u) { /* rounds to >= 65520: overflow to infinity */
        return (uint16_t)(sign | 0x7c00u);
    }
    if (a < 0x38800000u) {     /* below 2^-14: result is subnormal or zero */
        if (a < 0x33000000u) { /* below 2^-25: rounds to zero */
            return sign;
        }
        uint32_t exp = a >> 23; /* 102..112 */
        uint32_t mant = (a & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - exp; /* 14..24: bits dropped */
        uint32_t half = 1u << (shift - 1);
        uint32_t res = mant >> shift;
        uint32_t rem = mant & ((1u << shift) - 1u);
        if (rem > half || (rem == half && (res & 1u))) {
            res++;
        }
        return (uint16_t)(sign | res);
    }
    /* normal: rebias exponent (127 -> 15) and round the 13 dropped bits */
    uint32_t res = (a - 0x38000000u) >> 13;
    uint32_t rem = a & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (res & 1u))) {
        res++; /* a carry into the exponent is the correct rounding */
    }
    return (uint16_t)(sign | res);
}

float pxt_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0x1f) { /* inf / NaN */
        return bits_f32(sign | 0x7f800000u | (mant << 13));
    }
    if (exp == 0) {
        if (mant == 0) {
            return bits_f32(sign);
        }
        /* subnormal: value = mant * 2^-24, exact in float32 */
        float v = (float)mant * 5.9604644775390625e-08f;
        return sign ? -v : v;
    }
    return bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

/* lo and hi are the integer's bounds; v >= hi + 1 (the next power of two for
 * int64, where hi itself is not a double) saturates to hi. */
static int64_t float_to_int64_sat(double v, int64_t lo, int64_t hi, double hi_plus_1) {
    if (isnan(v)) {
        return 0;
    }
    if (v <= (double)lo) { /* lo is a power of two (or 0): exact as a double */
        return lo;
    }
    if (v >= hi_plus_1) {
        return hi;
    }
    return (int64_t)v; /* truncates toward zero; in range, so defined */
}

void pxt_store_int_sat(void *dst, pxt_dtype t, size_t i, double v) {
    switch (t) {
    case PXT_INT32:
        ((int32_t *)dst)[i] = (int32_t)float_to_int64_sat(v, INT32_MIN, INT32_MAX, 2147483648.0);
        break;
    case PXT_INT64:
        ((int64_t *)dst)[i] = float_to_int64_sat(v, INT64_MIN, INT64_MAX, 9223372036854775808.0);
        break;
    case PXT_UINT8:
        ((uint8_t *)dst)[i] = (uint8_t)float_to_int64_sat(v, 0, UINT8_MAX, 256.0);
        break;
    case PXT_BOOL: ((uint8_t *)dst)[i] = (uint8_t)(v != 0.0); break; /* NaN != 0: true */
    default: break;
    }
}
