/* device.c: device names ("cpu", "cuda:N"), discovery and properties. */
#include "module.h" /* Python.h before any system header */

#include <stdlib.h>
#include <string.h>

int pxt_parse_device(PyObject *obj, pxt_device *out, const char *arg, int must_exist) {
    PyObject *str = NULL;
    if (PyLong_Check(obj)) { /* an int N means cuda:N, as in torch */
        long idx = PyLong_AsLong(obj);
        if (idx == -1 && PyErr_Occurred())
            return -1;
        if (idx < 0 || idx >= PXT_MAX_DEVICES) {
            PyErr_Format(PyExc_ValueError, "%s: device index must be in [0, %d), got %ld", arg,
                         PXT_MAX_DEVICES, idx);
            return -1;
        }
        *out = (pxt_device){PXT_CUDA, (int)idx};
    } else {
        if (PyUnicode_Check(obj)) {
            str = obj;
            Py_INCREF(str);
        } else if (PyObject_HasAttrString(obj, "type") && PyObject_HasAttrString(obj, "index")) {
            str = PyObject_Str(obj); /* torch.device('cuda:0') */
            if (!str)
                return -1;
        } else {
            PyErr_Format(PyExc_TypeError, "%s: expected 'cpu', 'cuda' or 'cuda:N', got %.100s",
                         arg, Py_TYPE(obj)->tp_name);
            return -1;
        }
        Py_ssize_t len = 0;
        const char *s = PyUnicode_AsUTF8AndSize(str, &len);
        if (!s) {
            Py_DECREF(str);
            return -1;
        }
        char *end = NULL;
        if ((size_t)len != strlen(s)) /* "cpu\0junk" must not pass as "cpu" */
            s = "";
        if (strcmp(s, "cpu") == 0 || strcmp(s, "cpu:0") == 0)
            *out = (pxt_device){PXT_CPU, 0};
        else if (strcmp(s, "cuda") == 0)
            *out = (pxt_device){PXT_CUDA, 0};
        else if (strncmp(s, "cuda:", 5) == 0 && s[5] >= '0' && s[5] <= '9' &&
                 strtol(s + 5, &end, 10) < PXT_MAX_DEVICES && *end == '\0')
            *out = (pxt_device){PXT_CUDA, (int)strtol(s + 5, NULL, 10)};
        else {
            PyErr_Format(PyExc_ValueError, "%s: expected 'cpu', 'cuda' or 'cuda:N', got %R", arg,
                         obj);
            Py_DECREF(str);
            return -1;
        }
        Py_DECREF(str);
    }
    if (must_exist && !pxt_allocator_get(*out)) {
        PyErr_Format(PyExc_ValueError, "%s: %s", arg, pxt_error_message());
        return -1;
    }
    return 0;
}

static int cuda_count(void) {
    const pxt_backend *be = pxt_backend_for(PXT_CUDA);
    return be ? be->device_count() : 0;
}

pxt_device pxt_default_device(void) {
    return cuda_count() > 0 ? (pxt_device){PXT_CUDA, 0} : (pxt_device){PXT_CPU, 0};
}

PyObject *pxt_device_pystr(pxt_device d) {
    char buf[32];
    return PyUnicode_FromString(pxt_device_str(d, buf, sizeof buf));
}

PyObject *pxt_py_cuda_available(PyObject *m, PyObject *unused) {
    (void)m;
    (void)unused;
    return PyBool_FromLong(cuda_count() > 0);
}

/* device_count(kind="cuda"): GPUs (or 1 for "cpu"). */
PyObject *pxt_py_device_count(PyObject *m, PyObject *args, PyObject *kwargs) {
    (void)m;
    static char *kw[] = {"kind", NULL};
    const char *kind = "cuda";
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|s:device_count", kw, &kind))
        return NULL;
    if (strcmp(kind, "cpu") == 0)
        return PyLong_FromLong(1);
    if (strcmp(kind, "cuda") == 0)
        return PyLong_FromLong(cuda_count());
    return PyErr_Format(PyExc_ValueError, "kind: expected 'cuda' or 'cpu', got '%s'", kind);
}

PyObject *pxt_py_device_info(PyObject *m, PyObject *args, PyObject *kwargs) {
    (void)m;
    static char *kw[] = {"device", NULL};
    PyObject *dev_arg = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|O:device_info", kw, &dev_arg))
        return NULL;
    pxt_device dev = pxt_default_device();
    if (dev_arg != Py_None && pxt_parse_device(dev_arg, &dev, "device", 1) < 0)
        return NULL;
    const pxt_backend *be = pxt_backend_for(dev.type);
    pxt_device_props p;
    size_t free_b = 0, total_b = 0;
    int rc = be->device_props(dev.index, &p);
    if (rc == PXT_OK)
        rc = be->mem_info(dev.index, &free_b, &total_b);
    if (rc != PXT_OK)
        return pxt_raise(rc);
    PyObject *name = pxt_device_pystr(dev);
    if (!name)
        return NULL;
    return Py_BuildValue("{s:N,s:s,s:s,s:n,s:n,s:(ii),s:i}", "device", name, "type", be->name,
                         "name", p.name, "total_memory", (Py_ssize_t)p.total_memory,
                         "free_memory", (Py_ssize_t)free_b, "capability", p.major, p.minor,
                         "multiprocessors", p.multiprocessors);
}

/* synchronize(device=None): waits for the device's queued work. */
PyObject *pxt_py_synchronize(PyObject *m, PyObject *args, PyObject *kwargs) {
    (void)m;
    static char *kw[] = {"device", NULL};
    PyObject *dev_arg = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|O:synchronize", kw, &dev_arg))
        return NULL;
    pxt_device dev = pxt_default_device();
    if (dev_arg != Py_None && pxt_parse_device(dev_arg, &dev, "device", 1) < 0)
        return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = pxt_backend_for(dev.type)->synchronize(dev.index);
    Py_END_ALLOW_THREADS
    if (rc != PXT_OK)
        return pxt_raise(rc);
    Py_RETURN_NONE;
}
