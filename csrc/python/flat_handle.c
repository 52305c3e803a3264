/* flat_handle.c: the handle of a model's flat state (module.h), by which an
 * optimizer's binding finds the buffers it steps without knowing the model's
 * type: a capsule over the engine's pxt_flat whose context holds a reference
 * to the owner, so that whoever keeps the handle keeps the buffers. */
#include "module.h"

#define FLAT_CAPSULE "pyxtts._C.flat"

static void handle_free(PyObject *cap) { Py_XDECREF((PyObject *)PyCapsule_GetContext(cap)); }

PyObject *pxt_py_flat_handle(PyObject *owner, pxt_flat *f) {
    PyObject *cap = PyCapsule_New(f, FLAT_CAPSULE, handle_free);
    if (!cap) {
        return NULL;
    }
    if (PyCapsule_SetContext(cap, Py_NewRef(owner)) < 0) {
        Py_DECREF(owner);
        Py_DECREF(cap);
        return NULL;
    }
    return cap;
}

/* obj._flat when it is a handle (new reference), else NULL with no exception. */
static PyObject *handle_attr(PyObject *obj) {
    PyObject *h = PyObject_GetAttrString(obj, "_flat");
    if (h && PyCapsule_IsValid(h, FLAT_CAPSULE)) {
        return h;
    }
    Py_XDECREF(h);
    PyErr_Clear();
    return NULL;
}

PyObject *pxt_py_flat_handle_of(PyObject *obj, pxt_flat **out) {
    PyObject *h = handle_attr(obj);
    if (!h) { /* a Python model that holds the native one as _core */
        PyObject *core = PyObject_GetAttrString(obj, "_core");
        if (!core) {
            PyErr_Clear();
            return NULL;
        }
        h = handle_attr(core);
        Py_DECREF(core);
        if (!h) {
            return NULL;
        }
    }
    *out = PyCapsule_GetPointer(h, FLAT_CAPSULE);
    return h;
}
