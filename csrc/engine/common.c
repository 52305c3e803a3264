/* common.c: the thread's error message, the dtype table, device names. */
#include <stdarg.h>
#include <stdio.h>

#include "pxt.h"

/* ---- errors ----------------------------------------------------------------
 * One message per thread: a kernel running with the GIL released can fail and
 * leave its reason for the thread that turns it into a Python exception. */
static _Thread_local char err_msg[1024];

int pxt_error(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err_msg, sizeof err_msg, fmt, ap);
    va_end(ap);
    return code;
}

const char *pxt_error_message(void) { return err_msg; }

/* ---- dtypes ---------------------------------------------------------------- */
static const struct {
    const char *name;
    size_t size;
    int is_float;
} dtype_table[PXT_NUM_DTYPES] = {
    [PXT_FLOAT32] = {"float32", 4, 1},   [PXT_FLOAT16] = {"float16", 2, 1},
    [PXT_BFLOAT16] = {"bfloat16", 2, 1}, [PXT_INT32] = {"int32", 4, 0},
    [PXT_INT64] = {"int64", 8, 0},       [PXT_UINT8] = {"uint8", 1, 0},
    [PXT_BOOL] = {"bool", 1, 0},
};

size_t pxt_dtype_size(pxt_dtype t) { return dtype_table[t].size; }
const char *pxt_dtype_name(pxt_dtype t) { return dtype_table[t].name; }
int pxt_dtype_is_float(pxt_dtype t) { return dtype_table[t].is_float; }

/* ---- devices --------------------------------------------------------------- */
const char *pxt_device_str(pxt_device d, char *buf, size_t len) {
    if (d.type == PXT_CPU) {
        snprintf(buf, len, "cpu");
    } else {
        snprintf(buf, len, "cuda:%d", d.index);
    }
    return buf;
}
