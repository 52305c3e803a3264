/* module.c: pyxtts._C: module init, the method table, build_info. */
#include "module.h"

#include <string.h>

#define PY_ARRAY_UNIQUE_SYMBOL pxt_ARRAY_API
#define NPY_NO_DEPRECATED_API NPY_2_0_API_VERSION
#include <numpy/arrayobject.h>

#ifndef PXT_VERSION
#define PXT_VERSION "0.0.0"
#endif
#ifndef PXT_CUDA_ARCHS
#define PXT_CUDA_ARCHS ""
#endif

/* ---- tensors --------------------------------------------------------------- */

static PyObject *py_tensor(PyObject *m, PyObject *args, PyObject *kwargs) {
    (void)m;
    static char *kw[] = {"data", "dtype", "device", NULL};
    PyObject *data, *dtype = Py_None, *device = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|OO:tensor", kw, &data, &dtype, &device)) {
        return NULL;
    }
    return pxt_tensor_from_data(data, dtype, device);
}

static PyObject *make_filled(PyObject *args, PyObject *kwargs, const char *fmt, int zero) {
    static char *kw[] = {"shape", "dtype", "device", NULL};
    pxt_py_shape shape = PXT_PY_SHAPE("shape");
    pxt_py_dtype dt = PXT_PY_DTYPE_OPT("dtype", PXT_FLOAT32);
    pxt_py_device dev = PXT_PY_DEVICE_OPT("device", 1);
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, fmt, kw, pxt_py_shape_converter, &shape,
                                     pxt_py_dtype_converter, &dt, pxt_py_device_converter, &dev)) {
        return NULL;
    }
    PyObject *t = pxt_tensor_empty(dev.value, dt.value, shape.ndim, shape.shape);
    if (t && zero && ((pxt_tensor *)t)->nbytes) {
        pxt_tensor *tt = (pxt_tensor *)t;
        int rc =
            pxt_backend_for(dev.value.type)->memset_zero(dev.value.index, tt->data, tt->nbytes);
        if (rc != PXT_OK) {
            Py_DECREF(t);
            return pxt_raise(rc);
        }
    }
    return t;
}

static PyObject *py_empty(PyObject *m, PyObject *args, PyObject *kwargs) {
    (void)m;
    return make_filled(args, kwargs, "O&|O&O&:empty", 0);
}

static PyObject *py_zeros(PyObject *m, PyObject *args, PyObject *kwargs) {
    (void)m;
    return make_filled(args, kwargs, "O&|O&O&:zeros", 1);
}

/* ---- build info ------------------------------------------------------------ */

/* A version string, or None where the backend reported none. */
static PyObject *str_or_none(const char *s) {
    return s[0] ? PyUnicode_FromString(s) : Py_NewRef(Py_None);
}

static PyObject *py_build_info(PyObject *m, PyObject *unused) {
    (void)m;
    (void)unused;
    PyObject *archs = PyUnicode_FromString(PXT_CUDA_ARCHS);
    PyObject *arch_list = archs ? PyUnicode_Split(archs, NULL, -1) : NULL;
    Py_XDECREF(archs);
    if (!arch_list) {
        return NULL;
    }
    pxt_backend_info cpu, cuda;
    memset(&cuda, 0, sizeof cuda);
    pxt_backend_for(PXT_CPU)->info(&cpu);
    const pxt_backend *cuda_be = pxt_backend_for(PXT_CUDA); /* NULL in a CPU-only build */
    if (cuda_be) {
        cuda_be->info(&cuda);
    }
    return Py_BuildValue("{s:O,s:N,s:N,s:N,s:N,s:s,s:s,s:s,s:s}", "cuda",
                         cuda_be ? Py_True : Py_False, "cuda_version", str_or_none(cuda.runtime),
                         "cuda_driver_version", str_or_none(cuda.driver), "cublas_version",
                         str_or_none(cuda.library), "cuda_archs", arch_list, "blas", cpu.library,
                         "compiler",
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

static PyMethodDef methods[] = {
    {"tensor", PXT_PY_KW(py_tensor), "tensor(data, dtype=None, device='cpu') -> Tensor (a copy)."},
    {"empty", PXT_PY_KW(py_empty),
     "empty(shape, dtype=float32, device='cpu') -> uninitialised Tensor."},
    {"zeros", PXT_PY_KW(py_zeros), "zeros(shape, dtype=float32, device='cpu') -> Tensor of zeros."},
    {"from_dlpack", PXT_PY_KW(pxt_from_dlpack), "from_dlpack(obj) -> Tensor sharing obj's memory."},
    {"build_info", py_build_info, METH_NOARGS, "How this module was built."},
    {"cuda_available", pxt_py_cuda_available, METH_NOARGS, "True when a GPU can be used."},
    {"device_count", PXT_PY_KW(pxt_py_device_count), "device_count(kind='cuda') -> int."},
    {"device_info", PXT_PY_KW(pxt_py_device_info), "device_info(device=None) -> dict."},
    {"synchronize", PXT_PY_KW(pxt_py_synchronize),
     "synchronize(device=None): wait for queued work."},
    {"memory_stats", PXT_PY_KW(pxt_py_memory_stats), "memory_stats(device=None) -> dict."},
    {"memory_allocated", PXT_PY_KW(pxt_py_memory_allocated), "Bytes in live blocks."},
    {"memory_reserved", PXT_PY_KW(pxt_py_memory_reserved), "Bytes held from the device."},
    {"max_memory_allocated", PXT_PY_KW(pxt_py_max_memory_allocated), "Peak of memory_allocated."},
    {"max_memory_reserved", PXT_PY_KW(pxt_py_max_memory_reserved), "Peak of memory_reserved."},
    {"reset_peak_memory_stats", PXT_PY_KW(pxt_py_reset_peak_memory_stats), "Peaks := current."},
    {"empty_cache", PXT_PY_KW(pxt_py_empty_cache), "Return unused segments; bytes released."},
    {"set_memory_limit", PXT_PY_KW(pxt_py_set_memory_limit),
     "set_memory_limit(nbytes|None, device=None)."},
    {"set_memory_fraction", PXT_PY_KW(pxt_py_set_memory_fraction),
     "set_memory_fraction(f, device=None)."},
    {"_inject_oom", PXT_PY_KW(pxt_py_inject_oom), "Test hook; see pyxtts.testing.inject_oom."},
    {"_bench_alloc", PXT_PY_KW(pxt_py_bench_alloc),
     "Benchmark hook: ns per cached alloc+free vs malloc."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "pyxtts._C",
    .m_doc = "pyxtts native core: tensors, allocator, backends.",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__C(void) {
    import_array();
    for (int t = 0; t < PXT_NUM_DEVICE_TYPES; t++) {
        const pxt_backend *be = pxt_backend_for((pxt_device_type)t);
        if (be && be->init) {
            be->init();
        }
    }
    PyObject *m = PyModule_Create(&module_def);
    if (!m) {
        return NULL;
    }
    if (pxt_py_errors_init(m) < 0) {
        goto fail;
    }
    if (pxt_dtype_init(m) < 0 || pxt_tensor_init_type(m) < 0 || pxt_py_gpt_init_type(m) < 0 ||
        pxt_py_block_init_type(m) < 0 || pxt_py_adamw_init_type(m) < 0 ||
        PyModule_AddFunctions(m, pxt_py_ops_methods) < 0 ||
        PyModule_AddFunctions(m, pxt_py_ops_cond_methods) < 0 ||
        PyModule_AddFunctions(m, pxt_py_attention_methods) < 0 ||
        PyModule_AddFunctions(m, pxt_py_gpt_methods) < 0) {
        goto fail;
    }
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
