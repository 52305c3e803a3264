/* module.h: Python-callable functions defined across files, gathered by module.c. */
#ifndef PXT_MODULE_H
#define PXT_MODULE_H

#include "tensor.h"

extern PyObject *pxt_OutOfMemoryError;

/* device.c */
PyObject *pxt_py_cuda_available(PyObject *m, PyObject *unused);
PyObject *pxt_py_device_count(PyObject *m, PyObject *args, PyObject *kwargs);
PyObject *pxt_py_device_info(PyObject *m, PyObject *args, PyObject *kwargs);
PyObject *pxt_py_synchronize(PyObject *m, PyObject *args, PyObject *kwargs);

/* memory.c */
PyObject *pxt_py_memory_stats(PyObject *m, PyObject *args, PyObject *kwargs);
PyObject *pxt_py_memory_allocated(PyObject *m, PyObject *args, PyObject *kwargs);
PyObject *pxt_py_memory_reserved(PyObject *m, PyObject *args, PyObject *kwargs);
PyObject *pxt_py_max_memory_allocated(PyObject *m, PyObject *args, PyObject *kwargs);
PyObject *pxt_py_max_memory_reserved(PyObject *m, PyObject *args, PyObject *kwargs);
PyObject *pxt_py_reset_peak_memory_stats(PyObject *m, PyObject *args, PyObject *kwargs);
PyObject *pxt_py_empty_cache(PyObject *m, PyObject *args, PyObject *kwargs);
PyObject *pxt_py_set_memory_limit(PyObject *m, PyObject *args, PyObject *kwargs);
PyObject *pxt_py_set_memory_fraction(PyObject *m, PyObject *args, PyObject *kwargs);
PyObject *pxt_py_inject_oom(PyObject *m, PyObject *args, PyObject *kwargs);

/* bench.c */
PyObject *pxt_py_bench_alloc(PyObject *m, PyObject *args, PyObject *kwargs);

#endif
