/* tensor.h: pyxtts.Tensor, a contiguous n-d array in a device's memory.
 *
 * A tensor holds a reference to an engine storage (memory of its own, or a view
 * into an engine object's buffer: a named parameter, an arena slot), or borrows
 * memory kept alive by `base`: another tensor, or the owner of memory imported
 * through DLPack. */
#ifndef PXT_TENSOR_H
#define PXT_TENSOR_H

#include "errors.h" /* Python.h first */

#include "engine/layout.h"
#include "engine/storage.h"

typedef struct {
    PyObject_HEAD
    char *data;           /* device pointer to element 0; NULL when nbytes == 0 */
    pxt_storage *storage; /* engine memory this tensor holds a reference to, or NULL */
    PyObject *base;       /* keeps borrowed memory alive, or NULL */
    pxt_device device;
    pxt_dtype dtype;
    int ndim;
    int readonly; /* imported read-only memory (DLPack flag) */
    int64_t shape[PXT_MAX_DIMS];
    int64_t numel;
    size_t nbytes;
    PyObject *weakreflist;
} pxt_tensor;

extern PyTypeObject pxt_tensor_type;
#define pxt_tensor_check(o) PyObject_TypeCheck((o), &pxt_tensor_type)

/* ---- dtypes (dtype.c) ------------------------------------------------------ */
int pxt_dtype_init(PyObject *module);
PyObject *pxt_dtype_object(pxt_dtype t); /* borrowed */
/* 1 with *out set when obj is a pyxtts.dtype, else 0. */
int pxt_dtype_object_value(PyObject *obj, pxt_dtype *out);
/* NumPy descriptor of a dtype (new reference); bfloat16 from ml_dtypes. */
PyObject *pxt_dtype_to_descr(pxt_dtype t);
/* The pyxtts dtype of a NumPy descriptor: 1 found, 0 not one of ours, -1 error. */
int pxt_dtype_from_descr(PyObject *descr, pxt_dtype *out);

/* ---- tensors (tensor.c) ---------------------------------------------------- */
int pxt_tensor_init_type(PyObject *module);
/* The elements of a tensor of this shape, or -1 with ValueError naming `name`
 * ("name: ..."): sizes must be >= 0 and their product at most 2**59 - 1, so
 * that its bytes fit in int64_t at any dtype (sizes after a 0 are not
 * multiplied: the tensor is empty). */
int pxt_tensor_shape_numel(const char *name, int ndim, const int64_t *shape, int64_t *numel);
/* A new uninitialised tensor (new reference, or NULL with an exception). */
PyObject *pxt_tensor_empty(pxt_device dev, pxt_dtype dt, int ndim, const int64_t *shape);
/* A view of engine memory: bytes from `offset` of storage s (a new reference
 * to s is taken). */
PyObject *pxt_tensor_view(pxt_storage *s, size_t offset, pxt_dtype dt, int ndim,
                          const int64_t *shape);
/* A tensor over memory owned by `base` (a view); steals nothing. */
PyObject *pxt_tensor_borrow(PyObject *base, char *data, pxt_device dev, pxt_dtype dt, int ndim,
                            const int64_t *shape, int readonly);
/* name -> Tensor view of each tensor of layout l inside flat, of dtype dt
 * (a model's parameters or gradients); the views keep the storage alive. */
PyObject *pxt_tensor_flat_views(const pxt_param_layout *l, pxt_storage *flat, pxt_dtype dt);
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
