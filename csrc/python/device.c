/* device.c: device discovery and properties. */
#include "module.h" /* Python.h before any system header */

PyObject *pxt_py_cuda_available(PyObject *m, PyObject *unused) {
    (void)m;
    (void)unused;
    const pxt_backend *be = pxt_backend_for(PXT_CUDA);
    return PyBool_FromLong(be && be->device_count() > 0);
}

/* device_count(kind="cuda"): GPUs (or 1 for "cpu"). */
PyObject *pxt_py_device_count(PyObject *m, PyObject *args, PyObject *kwargs) {
    (void)m;
    static char *kw[] = {"kind", NULL};
    static const char *const kinds[] = {"cuda", "cpu", NULL};
    pxt_py_choice kind = PXT_PY_CHOICE("kind", kinds);
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|O&:device_count", kw, pxt_py_choice_converter,
                                     &kind)) {
        return NULL;
    }
    if (kind.index == 1) {
        return PyLong_FromLong(1);
    }
    const pxt_backend *be = pxt_backend_for(PXT_CUDA);
    return PyLong_FromLong(be ? be->device_count() : 0);
}

PyObject *pxt_py_device_info(PyObject *m, PyObject *args, PyObject *kwargs) {
    (void)m;
    static char *kw[] = {"device", NULL};
    pxt_py_device arg = PXT_PY_DEVICE_OPT("device", 1);
    arg.value = pxt_py_default_device();
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|O&:device_info", kw, pxt_py_device_converter,
                                     &arg)) {
        return NULL;
    }
    pxt_device dev = arg.value;
    const pxt_backend *be = pxt_backend_for(dev.type);
    pxt_device_props p;
    size_t free_b = 0, total_b = 0;
    int rc = be->device_props(dev.index, &p);
    if (rc == PXT_OK) {
        rc = be->mem_info(dev.index, &free_b, &total_b);
    }
    if (rc != PXT_OK) {
        return pxt_raise(rc);
    }
    PyObject *name = pxt_py_device_str(dev);
    if (!name) {
        return NULL;
    }
    return Py_BuildValue("{s:N,s:s,s:s,s:n,s:n,s:(ii),s:i}", "device", name, "type", be->name,
                         "name", p.name, "total_memory", (Py_ssize_t)p.total_memory, "free_memory",
                         (Py_ssize_t)free_b, "capability", p.major, p.minor, "multiprocessors",
                         p.multiprocessors);
}

/* synchronize(device=None): waits for the device's queued work. */
PyObject *pxt_py_synchronize(PyObject *m, PyObject *args, PyObject *kwargs) {
    (void)m;
    static char *kw[] = {"device", NULL};
    pxt_py_device arg = PXT_PY_DEVICE_OPT("device", 1);
    arg.value = pxt_py_default_device();
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|O&:synchronize", kw, pxt_py_device_converter,
                                     &arg)) {
        return NULL;
    }
    pxt_device dev = arg.value;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = pxt_backend_for(dev.type)->synchronize(dev.index);
    Py_END_ALLOW_THREADS
    if (rc != PXT_OK) {
        return pxt_raise(rc);
    }
    Py_RETURN_NONE;
}
