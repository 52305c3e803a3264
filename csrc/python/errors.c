/* errors.c: pyxtts.OutOfMemoryError and pxt_raise (see errors.h). */
#include "errors.h"

#include "engine/alloc.h"

PyObject *pxt_OutOfMemoryError;

static int set_size_attr(PyObject *exc, const char *name, size_t v, int none_if_max) {
    PyObject *o = (none_if_max && v == PXT_NO_LIMIT) ? Py_NewRef(Py_None) : PyLong_FromSize_t(v);
    if (!o) {
        return -1;
    }
    int rc = PyObject_SetAttrString(exc, name, o);
    Py_DECREF(o);
    return rc;
}

static void raise_oom(void) {
    const pxt_oom_info *info = pxt_last_oom();
    PyObject *exc = PyObject_CallFunction(pxt_OutOfMemoryError, "s", pxt_error_message());
    if (!exc) {
        return;
    }
    char buf[32];
    PyObject *dev =
        PyUnicode_FromString(info->host ? "host" : pxt_device_str(info->device, buf, sizeof buf));
    if (!dev || PyObject_SetAttrString(exc, "device", dev) < 0 ||
        set_size_attr(exc, "requested_bytes", info->requested, 0) < 0 ||
        set_size_attr(exc, "allocated_bytes", info->allocated, 0) < 0 ||
        set_size_attr(exc, "reserved_bytes", info->reserved, 0) < 0 ||
        set_size_attr(exc, "limit_bytes", info->limit, 1) < 0) {
        Py_XDECREF(dev);
        Py_DECREF(exc);
        return;
    }
    Py_DECREF(dev);
    PyErr_SetObject(pxt_OutOfMemoryError, exc);
    Py_DECREF(exc);
}

PyObject *pxt_raise(int code) {
    switch (code) {
    case PXT_ERR_OOM: raise_oom(); break;
    case PXT_ERR_VALUE: PyErr_SetString(PyExc_ValueError, pxt_error_message()); break;
    case PXT_ERR_TYPE: PyErr_SetString(PyExc_TypeError, pxt_error_message()); break;
    case PXT_ERR_NOT_IMPLEMENTED:
        PyErr_SetString(PyExc_NotImplementedError, pxt_error_message());
        break;
    default: PyErr_SetString(PyExc_RuntimeError, pxt_error_message()); break;
    }
    return NULL;
}

int pxt_raise_int(int code) {
    pxt_raise(code);
    return -1;
}

int pxt_py_errors_init(PyObject *module) {
    PyObject *bases = PyTuple_Pack(2, PyExc_MemoryError, PyExc_RuntimeError);
    if (!bases) {
        return -1;
    }
    pxt_OutOfMemoryError = PyErr_NewExceptionWithDoc(
        "pyxtts.OutOfMemoryError",
        "A device (or its pyxtts memory limit) could not satisfy an allocation. Attributes: "
        "device, requested_bytes, allocated_bytes, reserved_bytes, limit_bytes (None: no limit).",
        bases, NULL);
    Py_DECREF(bases);
    if (!pxt_OutOfMemoryError) {
        return -1;
    }
    Py_INCREF(pxt_OutOfMemoryError); /* one reference stays here, one goes to the module */
    if (PyModule_AddObject(module, "OutOfMemoryError", pxt_OutOfMemoryError) < 0) {
        Py_DECREF(pxt_OutOfMemoryError);
        return -1;
    }
    return 0;
}

PyObject *pxt_reraise_named(PyObject *type, const char *prefix) {
#if PY_VERSION_HEX >= 0x030C0000 /* PyErr_Fetch is deprecated there */
    PyObject *etype = NULL, *value = PyErr_GetRaisedException(), *tb = NULL;
#else
    PyObject *etype, *value, *tb;
    PyErr_Fetch(&etype, &value, &tb);
    /* an error set in C may be held unnormalised, its value only the argument (KeyError's
     * key in a tuple, or NULL): as from 3.12, %S below formats the exception itself */
    PyErr_NormalizeException(&etype, &value, &tb);
#endif
    PyErr_Format(type, "%s: %S", prefix, value ? value : Py_None);
    Py_XDECREF(etype);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    return NULL;
}

void pxt_py_pending_take(pxt_py_pending *p) {
#if PY_VERSION_HEX >= 0x030C0000 /* PyErr_Fetch is deprecated there */
    p->type = p->tb = NULL;
    p->value = PyErr_GetRaisedException();
#else
    PyErr_Fetch(&p->type, &p->value, &p->tb);
#endif
}

void pxt_py_pending_restore(pxt_py_pending *p) {
#if PY_VERSION_HEX >= 0x030C0000
    PyErr_SetRaisedException(p->value);
#else
    PyErr_Restore(p->type, p->value, p->tb);
#endif
    p->type = p->value = p->tb = NULL;
}
