/* ops.h: what the bindings of single kernels (_op_*, for the tests) share:
 * argument fetching and checks, outputs, status to exception (ops.c). */
#ifndef PXT_PY_OPS_H
#define PXT_PY_OPS_H

#include "module.h" /* Python.h first */

/* The tensor of argument `name` (a new reference parked in *hold), or NULL. */
pxt_tensor *pxt_op_arg(PyObject *obj, const char *name, const pxt_tensor *like, PyObject **hold);
/* Same dtype and device as `ref` (the op's first tensor). */
int pxt_op_check_like(const pxt_tensor *t, const char *name, const pxt_tensor *ref);
/* At least `min_ndim` dimensions, at most `max_ndim`. */
int pxt_op_check_ndim(const pxt_tensor *t, const char *name, int min_ndim, int max_ndim);
/* A size the kernels take as int. */
int pxt_op_to_int(int64_t v, const char *name, int *out);
/* x (..., C): N rows of C > 0 as ints. */
int pxt_op_rows_cols(const pxt_tensor *x, const char *name, int *N, int *C);
/* A new tensor of zeros (new reference) or NULL. */
PyObject *pxt_op_new_zeros(pxt_device dev, pxt_dtype dt, int ndim, const int64_t *shape);
/* A given output/accumulator argument, or NULL when absent (None): checked
 * against dtype, shape and device, and writable. *bad is set on failure. */
pxt_tensor *pxt_op_opt_out(PyObject *obj, const char *name, const pxt_tensor *like, pxt_dtype dt,
                           int ndim, const int64_t *shape, PyObject **hold, int *bad);
/* A uint8 scratch tensor of nbytes on dev for a kernel's workspace (a new
 * reference in *hold; none for 0 bytes): *data is its memory or NULL. -1 on
 * failure (out of memory raised). */
int pxt_op_scratch(pxt_device dev, size_t nbytes, PyObject **hold, void **data);
/* Kernel status to an exception: 0 or -1. */
int pxt_op_status(int rc);

/* Runs a kernel call with the GIL released; its status lands in rc. */
#define RUN_NOGIL(rc, call)                                                                        \
    do {                                                                                           \
        Py_BEGIN_ALLOW_THREADS(rc)                                                                 \
        = (call);                                                                                  \
        Py_END_ALLOW_THREADS                                                                       \
    } while (0)

#endif /* PXT_PY_OPS_H */
