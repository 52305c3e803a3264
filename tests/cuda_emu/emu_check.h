/* emu_check.h: what the emulator's test programs (reduce_main, cond_main, step_main)
 * share: a storage type's dtype and name, device buffers filled from a function, bit
 * equality, and one line per case counted into `failures`. Each program includes it once
 * (its definitions are static). */
#pragma once
#include <stdio.h>
#include <string.h>

#include <string>
#include <type_traits>

#include "emu.h"

static int failures;

template <typename T> static pxt_dtype dtype_of() {
    return std::is_same_v<T, float> ? PXT_FLOAT32 : std::is_same_v<T, pxt_bf16> ? PXT_BFLOAT16 : PXT_FLOAT16;
}
template <typename T> static const char *name_of() {
    return std::is_same_v<T, float> ? "f32" : std::is_same_v<T, pxt_bf16> ? "bf16" : "f16";
}

/* a device buffer of n values of T, filled from f(i) (guard page after its end) */
template <typename T, typename F> static T *device(size_t n, F f) {
    T *p = (T *)emu_alloc(n * sizeof(T) + (n == 0));
    for (size_t i = 0; i < n; i++)
        p[i] = f(i);
    return p;
}

static bool same_bits(const void *a, const void *b, size_t n) { return memcmp(a, b, n) == 0; }

static void report(const std::string &what, bool ok) {
    printf("%-72s %s\n", what.c_str(), ok ? "OK" : "FAIL");
    fflush(stdout);
    failures += !ok;
}
