/* module.c: pyxtts._C: module init, exception types, the method table. */
#include "module.h"
#include "cpu/cpu.h"

#define PY_ARRAY_UNIQUE_SYMBOL pxt_ARRAY_API
#define NPY_NO_DEPRECATED_API NPY_2_0_API_VERSION
#include <numpy/arrayobject.h>

#ifndef PXT_VERSION
#define PXT_VERSION "0.0.0"
#endif
#ifndef PXT_CUDA_ARCHS
#define PXT_CUDA_ARCHS ""
#endif

PyObject *pxt_OutOfMemoryError;

/* ---- errors ---------------------------------------------------------------- */

static int set_size_attr(PyObject *exc, const char *name, size_t v, int none_if_max) {
    PyObject *o = (none_if_max && v == PXT_NO_LIMIT) ? Py_NewRef(Py_None) : PyLong_FromSize_t(v);
    if (!o)
        return -1;
    int rc = PyObject_SetAttrString(exc, name, o);
    Py_DECREF(o);
    return rc;
}

static void raise_oom(void) {
    const pxt_oom_info *info = pxt_last_oom();
    PyObject *exc = PyObject_CallFunction(pxt_OutOfMemoryError, "s", pxt_error_message());
    if (!exc)
        return;
    PyObject *dev = pxt_device_pystr(info->device);
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

/* ---- tensors --------------------------------------------------------------- */

static PyObject *py_tensor(PyObject *m, PyObject *args, PyObject *kwargs) {
    (void)m;
    static char *kw[] = {"data", "dtype", "device", NULL};
    PyObject *data, *dtype = Py_None, *device = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|OO:tensor", kw, &data, &dtype, &device))
        return NULL;
    return pxt_tensor_from_data(data, dtype, device);
}

/* One size of a shape: an int or anything with __index__ (NumPy integers). */
static int shape_entry(PyObject *it, int dim, int64_t *out) {
    if (!PyIndex_Check(it) || PyBool_Check(it)) {
        PyErr_Format(PyExc_TypeError, "shape: expected ints, got %.100s at dim %d",
                     Py_TYPE(it)->tp_name, dim);
        return -1;
    }
    PyObject *v = PyNumber_Index(it);
    if (!v)
        return -1;
    int overflow = 0;
    long long n = PyLong_AsLongLongAndOverflow(v, &overflow);
    Py_DECREF(v);
    if (overflow || (n == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "shape: size at dim %d does not fit in 64 bits", dim);
        return -1;
    }
    *out = n;
    return 0;
}

/* A shape argument: an int or a sequence of ints. */
static int parse_shape(PyObject *obj, int *ndim, int64_t *shape) {
    if (PyIndex_Check(obj) && !PySequence_Check(obj)) { /* an int, or a NumPy integer */
        *ndim = 1;
        return shape_entry(obj, 0, &shape[0]);
    }
    PyObject *seq = PySequence_Fast(obj, "shape: expected an int or a sequence of ints");
    if (!seq) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "shape: expected an int or a sequence of ints, got %.100s",
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n > PXT_MAX_DIMS) {
        Py_DECREF(seq);
        PyErr_Format(PyExc_ValueError, "shape: at most %d dimensions, got %zd", PXT_MAX_DIMS, n);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (shape_entry(PySequence_Fast_GET_ITEM(seq, i), (int)i, &shape[i]) < 0) {
            Py_DECREF(seq);
            return -1;
        }
    }
    *ndim = (int)n;
    Py_DECREF(seq);
    return 0;
}

static PyObject *make_filled(PyObject *args, PyObject *kwargs, const char *fmt, int zero) {
    static char *kw[] = {"shape", "dtype", "device", NULL};
    PyObject *shape_arg, *dtype_arg = Py_None, *dev_arg = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, fmt, kw, &shape_arg, &dtype_arg, &dev_arg))
        return NULL;
    int ndim;
    int64_t shape[PXT_MAX_DIMS];
    pxt_dtype dt = PXT_FLOAT32;
    pxt_device dev = {PXT_CPU, 0};
    if (parse_shape(shape_arg, &ndim, shape) < 0 ||
        (dtype_arg != Py_None && pxt_parse_dtype(dtype_arg, &dt, "dtype") < 0) ||
        (dev_arg != Py_None && pxt_parse_device(dev_arg, &dev, "device", 1) < 0))
        return NULL;
    PyObject *t = pxt_tensor_empty(dev, dt, ndim, shape);
    if (t && zero && ((pxt_tensor *)t)->nbytes) {
        pxt_tensor *tt = (pxt_tensor *)t;
        int rc = pxt_backend_for(dev.type)->memset_zero(dev.index, tt->data, tt->nbytes);
        if (rc != PXT_OK) {
            Py_DECREF(t);
            return pxt_raise(rc);
        }
    }
    return t;
}

static PyObject *py_empty(PyObject *m, PyObject *args, PyObject *kwargs) {
    (void)m;
    return make_filled(args, kwargs, "O|OO:empty", 0);
}

static PyObject *py_zeros(PyObject *m, PyObject *args, PyObject *kwargs) {
    (void)m;
    return make_filled(args, kwargs, "O|OO:zeros", 1);
}

/* ---- build info ------------------------------------------------------------ */

static PyObject *py_build_info(PyObject *m, PyObject *unused) {
    (void)m;
    (void)unused;
    PyObject *archs = PyUnicode_FromString(PXT_CUDA_ARCHS);
    PyObject *arch_list = archs ? PyUnicode_Split(archs, NULL, -1) : NULL;
    Py_XDECREF(archs);
    if (!arch_list)
        return NULL;
#ifdef PXT_WITH_CUDA
    int rt = 0, drv = 0, cublas = 0;
    pxt_cuda_versions(&rt, &drv, &cublas);
    PyObject *cuda_version = PyUnicode_FromFormat("%d.%d", rt / 1000, (rt % 1000) / 10);
    PyObject *driver = drv ? PyUnicode_FromFormat("%d.%d", drv / 1000, (drv % 1000) / 10)
                           : Py_NewRef(Py_None);
    PyObject *cublas_v = PyUnicode_FromFormat("%d.%d.%d", cublas / 10000, (cublas / 100) % 100,
                                              cublas % 100);
    int with_cuda = 1;
#else
    PyObject *cuda_version = Py_NewRef(Py_None), *driver = Py_NewRef(Py_None),
             *cublas_v = Py_NewRef(Py_None);
    int with_cuda = 0;
#endif
    if (!cuda_version || !driver || !cublas_v) {
        Py_DECREF(arch_list);
        Py_XDECREF(cuda_version);
        Py_XDECREF(driver);
        Py_XDECREF(cublas_v);
        return NULL;
    }
    return Py_BuildValue("{s:O,s:N,s:N,s:N,s:N,s:s,s:s,s:s,s:s}", "cuda",
                         with_cuda ? Py_True : Py_False, "cuda_version", cuda_version,
                         "cuda_driver_version", driver, "cublas_version", cublas_v,
                         "cuda_archs", arch_list, "blas", pxt_cpu_blas_config(), "compiler",
#if defined(__clang__)
                         "clang " __clang_version__,
#elif defined(__GNUC__)
                         "gcc " __VERSION__,
#else
                         "unknown",
#endif
                         "c_standard", "C11", "version", PXT_VERSION);
}

/* ---- module ---------------------------------------------------------------- */

#define KW(f) (PyCFunction)(void (*)(void))(f), METH_VARARGS | METH_KEYWORDS

static PyMethodDef methods[] = {
    {"tensor", KW(py_tensor), "tensor(data, dtype=None, device='cpu') -> Tensor (a copy)."},
    {"empty", KW(py_empty), "empty(shape, dtype=float32, device='cpu') -> uninitialised Tensor."},
    {"zeros", KW(py_zeros), "zeros(shape, dtype=float32, device='cpu') -> Tensor of zeros."},
    {"from_dlpack", KW(pxt_from_dlpack), "from_dlpack(obj) -> Tensor sharing obj's memory."},
    {"build_info", py_build_info, METH_NOARGS, "How this module was built."},
    {"cuda_available", pxt_py_cuda_available, METH_NOARGS, "True when a GPU can be used."},
    {"device_count", KW(pxt_py_device_count), "device_count(kind='cuda') -> int."},
    {"device_info", KW(pxt_py_device_info), "device_info(device=None) -> dict."},
    {"synchronize", KW(pxt_py_synchronize), "synchronize(device=None): wait for queued work."},
    {"memory_stats", KW(pxt_py_memory_stats), "memory_stats(device=None) -> dict."},
    {"memory_allocated", KW(pxt_py_memory_allocated), "Bytes in live blocks."},
    {"memory_reserved", KW(pxt_py_memory_reserved), "Bytes held from the device."},
    {"max_memory_allocated", KW(pxt_py_max_memory_allocated), "Peak of memory_allocated."},
    {"max_memory_reserved", KW(pxt_py_max_memory_reserved), "Peak of memory_reserved."},
    {"reset_peak_memory_stats", KW(pxt_py_reset_peak_memory_stats), "Peaks := current."},
    {"empty_cache", KW(pxt_py_empty_cache), "Return unused segments; bytes released."},
    {"set_memory_limit", KW(pxt_py_set_memory_limit), "set_memory_limit(nbytes|None, device=None)."},
    {"set_memory_fraction", KW(pxt_py_set_memory_fraction), "set_memory_fraction(f, device=None)."},
    {"_inject_oom", KW(pxt_py_inject_oom), "Test hook; see pyxtts.testing.inject_oom."},
    {"_bench_alloc", KW(pxt_py_bench_alloc), "Benchmark hook: ns per cached alloc+free vs malloc."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, .m_name = "pyxtts._C",
    .m_doc = "pyxtts native core: tensors, allocator, backends.", .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__C(void) {
    import_array();
    pxt_cpu_init();
    PyObject *m = PyModule_Create(&module_def);
    if (!m)
        return NULL;
    PyObject *bases = PyTuple_Pack(2, PyExc_MemoryError, PyExc_RuntimeError);
    if (!bases)
        goto fail;
    pxt_OutOfMemoryError = PyErr_NewExceptionWithDoc(
        "pyxtts.OutOfMemoryError",
        "A device (or its pyxtts memory limit) could not satisfy an allocation. Attributes: "
        "device, requested_bytes, allocated_bytes, reserved_bytes, limit_bytes (None: no limit).",
        bases, NULL);
    Py_DECREF(bases);
    if (!pxt_OutOfMemoryError)
        goto fail;
    Py_INCREF(pxt_OutOfMemoryError);
    if (PyModule_AddObject(m, "OutOfMemoryError", pxt_OutOfMemoryError) < 0) {
        Py_DECREF(pxt_OutOfMemoryError);
        goto fail;
    }
    if (pxt_dtype_init(m) < 0 || pxt_tensor_init_type(m) < 0 || pxt_gpt_init_type(m) < 0 ||
        pxt_block_init_type(m) < 0 || pxt_adamw_init_type(m) < 0 ||
        PyModule_AddFunctions(m, pxt_ops_methods) < 0 ||
        PyModule_AddFunctions(m, pxt_attention_methods) < 0 ||
        PyModule_AddFunctions(m, pxt_model_methods) < 0)
        goto fail;
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
