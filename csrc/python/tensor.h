/* tensor.h: pyxtts.Tensor, a contiguous n-d array in a device's memory.
 *
 * A tensor either owns one allocator block (block != NULL) or borrows memory
 * kept alive by `base`: another tensor (a view into a flat buffer) or the
 * owner of memory imported through DLPack. */
#ifndef PXT_TENSOR_H
#define PXT_TENSOR_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "engine/alloc.h"

typedef struct {
    PyObject_HEAD
    char *data;              /* device pointer to element 0; NULL when nbytes == 0 */
    pxt_block *block;        /* owned allocation, or NULL */
    pxt_allocator *alloc;    /* allocator of `block` */
    PyObject *base;          /* keeps borrowed memory alive, or NULL */
    pxt_device device;
    pxt_dtype dtype;
    int ndim;
    int readonly;            /* imported read-only memory (DLPack flag) */
    int64_t shape[PXT_MAX_DIMS];
    int64_t numel;
    size_t nbytes;
    PyObject *weakreflist;
} pxt_tensor;

extern PyTypeObject pxt_tensor_type;
#define pxt_tensor_check(o) PyObject_TypeCheck((o), &pxt_tensor_type)

/* ---- module-wide helpers (module.c) ---------------------------------------- */
/* Turns a PXT_* status and the thread's message into a Python exception. */
PyObject *pxt_raise(int code);
/* Parses "cpu", "cuda", "cuda:N", an int N or a torch.device; when must_exist,
 * also checks the device is there. -1 with ValueError/TypeError naming arg. */
int pxt_parse_device(PyObject *obj, pxt_device *out, const char *arg, int must_exist);
/* The device functions default to: cuda:0 when a GPU is present, else cpu. */
pxt_device pxt_default_device(void);
PyObject *pxt_device_pystr(pxt_device d);

/* ---- dtypes (dtype.c) ------------------------------------------------------ */
int pxt_dtype_init(PyObject *module);
PyObject *pxt_dtype_object(pxt_dtype t); /* borrowed */
int pxt_parse_dtype(PyObject *obj, pxt_dtype *out, const char *arg);
/* NumPy descriptor of a dtype (new reference); bfloat16 from ml_dtypes. */
PyObject *pxt_dtype_to_descr(pxt_dtype t);
/* The pyxtts dtype of a NumPy descriptor: 1 found, 0 not one of ours, -1 error. */
int pxt_dtype_from_descr(PyObject *descr, pxt_dtype *out);

/* ---- tensors (tensor.c) ---------------------------------------------------- */
int pxt_tensor_init_type(PyObject *module);
/* A new uninitialised tensor (new reference, or NULL with an exception). */
PyObject *pxt_tensor_empty(pxt_device dev, pxt_dtype dt, int ndim, const int64_t *shape);
/* A tensor over memory owned by `base` (a view); steals nothing. */
PyObject *pxt_tensor_borrow(PyObject *base, char *data, pxt_device dev, pxt_dtype dt, int ndim,
                            const int64_t *shape, int readonly);
/* pyxtts.tensor(data, dtype, device): a copy of anything NumPy can view. */
PyObject *pxt_tensor_from_data(PyObject *data, PyObject *dtype_arg, PyObject *device_arg);
/* Copy of src converted to dev/dt (new reference). */
PyObject *pxt_tensor_convert(pxt_tensor *src, pxt_device dev, pxt_dtype dt);

/* ---- DLPack (tensor_dlpack.c) ---------------------------------------------- */
PyObject *pxt_tensor_dlpack(PyObject *self, PyObject *args, PyObject *kwargs);
PyObject *pxt_tensor_dlpack_device(PyObject *self, PyObject *unused);
PyObject *pxt_from_dlpack(PyObject *module, PyObject *args, PyObject *kwargs);

/* Bytes at or above which copies run with the GIL released. */
#define PXT_NOGIL_BYTES ((size_t)1 << 16)

#endif /* PXT_TENSOR_H */
