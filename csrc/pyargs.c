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

/* Shape check; a negative entry in `dims` accepts any size there. */
int pxt_check_shape(const pxt_tensor *t, const char *name, int ndim, const int64_t *dims) {
    int ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++)
        ok = dims[i] < 0 || dims[i] == t->shape[i];
    if (ok)
        return 0;
    char want[160] = "(", got[160] = "(";
    for (int i = 0; i < ndim; i++) {
        size_t n = strlen(want);
        if (dims[i] < 0)
            snprintf(want + n, sizeof want - n, "%s*", i ? ", " : "");
        else
            snprintf(want + n, sizeof want - n, "%s%lld", i ? ", " : "", (long long)dims[i]);
    }
    for (int i = 0; i < t->ndim; i++) {
        size_t n = strlen(got);
        snprintf(got + n, sizeof got - n, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    }
    strncat(want, ")", sizeof want - strlen(want) - 1);
    strncat(got, ")", sizeof got - strlen(got) - 1);
    PyErr_Format(PyExc_ValueError, "%s: expected shape %s, got %s", name, want, got);
    return -1;
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
