/* pxt.h: what every C file of pyxtts shares and nothing more.
 *
 * Status codes and the thread-local error message, dtypes, devices.
 * No Python here: backends (C and CUDA) include this file too. */
#ifndef PXT_H
#define PXT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status codes: every fallible C function returns one ---------------- */
enum {
    PXT_OK = 0,
    PXT_ERR_OOM = 1,             /* -> pyxtts.OutOfMemoryError */
    PXT_ERR_VALUE = 2,           /* -> ValueError */
    PXT_ERR_TYPE = 3,            /* -> TypeError */
    PXT_ERR_DEVICE = 4,          /* a CUDA/cuBLAS/OS call failed -> RuntimeError */
    PXT_ERR_NOT_IMPLEMENTED = 5, /* a backend lacks an op -> NotImplementedError */
};

/* Sets the calling thread's error message (printf-style) and returns code,
 * so a failing function can end with `return pxt_error(PXT_ERR_..., ...)`. */
int pxt_error(int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
const char *pxt_error_message(void);

/* Returns the status of `call` from the enclosing function unless it is PXT_OK. */
#define PXT_TRY(call)                                                                              \
    do {                                                                                           \
        int pxt_rc_ = (call);                                                                      \
        if (pxt_rc_ != PXT_OK)                                                                     \
            return pxt_rc_;                                                                        \
    } while (0)

/* ---- size arithmetic ----------------------------------------------------- */

/* *out = a * b and 1 when the product fits in size_t, else 0 (*out is then
 * unspecified). Sizes that come from a caller (a batch, a sequence length, a
 * shape) can multiply past 64 bits: in int64_t that is undefined behaviour, in
 * size_t it wraps into a small, wrong size that a check or a plan then accepts.
 * So a product that a caller's value reaches, and that no earlier check bounds,
 * goes through here and an overflow is refused by name. Sizes are >= 0: cast
 * them to size_t first. __builtin_mul_overflow is gcc's and clang's (also
 * nvcc's host compilers'). */
static inline int pxt_mul_ok(size_t a, size_t b, size_t *out) {
    return !__builtin_mul_overflow(a, b, out);
}

/* ---- dtypes --------------------------------------------------------------- */
typedef enum {
    PXT_FLOAT32 = 0,
    PXT_FLOAT16 = 1,
    PXT_BFLOAT16 = 2,
    PXT_INT32 = 3,
    PXT_INT64 = 4,
    PXT_UINT8 = 5,
    PXT_BOOL = 6,
    PXT_NUM_DTYPES = 7
} pxt_dtype;

size_t pxt_dtype_size(pxt_dtype t);
const char *pxt_dtype_name(pxt_dtype t);
int pxt_dtype_is_float(pxt_dtype t);

/* ---- devices -------------------------------------------------------------- */
typedef enum { PXT_CPU = 0, PXT_CUDA = 1, PXT_NUM_DEVICE_TYPES = 2 } pxt_device_type;

typedef struct {
    pxt_device_type type;
    int index; /* 0 for the CPU */
} pxt_device;

#define PXT_MAX_DEVICES 64 /* per device type */
#define PXT_MAX_DIMS 8

/* "cpu" or "cuda:N" into buf; returns buf. */
const char *pxt_device_str(pxt_device d, char *buf, size_t len);

/* ---- half-precision conversions (round to nearest even) ------------------ */
uint16_t pxt_f32_to_f16(float f);
float pxt_f16_to_f32(uint16_t h);
uint16_t pxt_f32_to_bf16(float f);
float pxt_bf16_to_f32(uint16_t h);
/* dst[i] (integer dtype t) = v: truncated toward zero, saturated at t's range,
 * NaN -> 0; bool is v != 0 (C leaves the out-of-range cases undefined). */
void pxt_store_int_sat(void *dst, pxt_dtype t, size_t i, double v);

#ifdef __cplusplus
}
#endif
#endif /* PXT_H */
