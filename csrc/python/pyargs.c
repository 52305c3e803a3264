/* pyargs.c: checks of tensor arguments shared by every Python entry point.
 *
 * Each check names the argument, what was expected and what came, and leaves
 * a ValueError/TypeError set on failure (returning -1), so entry points
 * validate everything before any work starts. */
#include "module.h"

/* A Tensor argument, or anything NumPy can view (copied to a CPU tensor, or to
 * `like`'s device when like is given). Returns a new reference or NULL. */
PyObject *pxt_arg_tensor(PyObject *obj, const char *name, const pxt_tensor *like) {
    if (pxt_tensor_check(obj)) {
        Py_INCREF(obj);
        return obj;
    }
    PyObject *dev = like ? pxt_device_pystr(like->device) : NULL;
    if (like && !dev)
        return NULL;
    PyObject *t = pxt_tensor_from_data(obj, NULL, dev);
    Py_XDECREF(dev);
    if (!t && PyErr_ExceptionMatches(PyExc_TypeError)) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s: expected a pyxtts.Tensor or an array, got %.100s", name,
                     Py_TYPE(obj)->tp_name);
    }
    return t;
}

int pxt_check_dtype(const pxt_tensor *t, const char *name, pxt_dtype want) {
    if (t->dtype == want)
        return 0;
    PyErr_Format(PyExc_TypeError, "%s: expected dtype %s, got %s", name, pxt_dtype_name(want),
                 pxt_dtype_name(t->dtype));
    return -1;
}

/* "name: expected shape (B, *, C), got (...)"; a negative entry in `want` accepts any
 * size there. Works on raw shapes, so NumPy arrays are checked the same way. */
int pxt_check_dims(const char *name, int ndim, const int64_t *shape, int want_ndim,
                   const int64_t *want) {
    int ok = ndim == want_ndim;
    for (int i = 0; ok && i < ndim; i++)
        ok = want[i] < 0 || want[i] == shape[i];
    if (ok)
        return 0;
    char w[160] = "(", g[160] = "(";
    for (int i = 0; i < want_ndim; i++) {
        size_t n = strlen(w);
        if (want[i] < 0)
            snprintf(w + n, sizeof w - n, "%s*", i ? ", " : "");
        else
            snprintf(w + n, sizeof w - n, "%s%lld", i ? ", " : "", (long long)want[i]);
    }
    for (int i = 0; i < ndim; i++) {
        size_t n = strlen(g);
        snprintf(g + n, sizeof g - n, "%s%lld", i ? ", " : "", (long long)shape[i]);
    }
    strncat(w, ")", sizeof w - strlen(w) - 1);
    strncat(g, ")", sizeof g - strlen(g) - 1);
    PyErr_Format(PyExc_ValueError, "%s: expected shape %s, got %s", name, w, g);
    return -1;
}

int pxt_check_shape(const pxt_tensor *t, const char *name, int ndim, const int64_t *dims) {
    return pxt_check_dims(name, t->ndim, t->shape, ndim, dims);
}

int pxt_check_device(const pxt_tensor *t, const char *name, pxt_device want) {
    if (t->device.type == want.type && t->device.index == want.index)
        return 0;
    char a[32], b[32];
    PyErr_Format(PyExc_ValueError, "%s: expected a tensor on %s, got one on %s", name,
                 pxt_device_str(want, a, sizeof a), pxt_device_str(t->device, b, sizeof b));
    return -1;
}

int pxt_check_writable(const pxt_tensor *t, const char *name) {
    if (!t->readonly)
        return 0;
    PyErr_Format(PyExc_ValueError, "%s: the tensor is read-only (imported from a read-only "
                 "DLPack producer)", name);
    return -1;
}

/* The backend of a device, with the op present; else NotImplementedError. */
const pxt_backend *pxt_backend_with(pxt_device dev, const void *op, const char *op_name) {
    const pxt_backend *be = pxt_backend_for(dev.type);
    if (be && op)
        return be;
    char d[32];
    PyErr_Format(PyExc_NotImplementedError, "%s is not available on %s in this version of pyxtts",
                 op_name, pxt_device_str(dev, d, sizeof d));
    return NULL;
}
