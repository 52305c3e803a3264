/* bench.c: timing hooks for tests/bench (not used by the engine).
 *
 * The cost of a cached allocation is a few tens of nanoseconds, far below
 * what a Python-level loop can resolve, so it is timed here in C next to
 * the C library's allocator doing the same work. */
#include "module.h" /* Python.h first: it sets the POSIX feature macros */

#include <stdlib.h>
#include <time.h>

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* _bench_alloc(nbytes, iters, device=None) -> {"cached_ns", "malloc_ns",
 * "posix_memalign_ns"}: nanoseconds per allocate+free pair. */
PyObject *pxt_py_bench_alloc(PyObject *m, PyObject *args, PyObject *kwargs) {
    (void)m;
    static char *kw[] = {"nbytes", "iters", "device", NULL};
    pxt_py_int nb = PXT_PY_INT("nbytes", 1, PY_SSIZE_T_MAX),
               it = PXT_PY_INT("iters", 1, PY_SSIZE_T_MAX);
    pxt_py_device dev = PXT_PY_DEVICE_OPT("device", 1);
    dev.value = pxt_py_default_device();
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O&O&|O&:_bench_alloc", kw, pxt_py_int_converter,
                                     &nb, pxt_py_int_converter, &it, pxt_py_device_converter,
                                     &dev)) {
        return NULL;
    }
    Py_ssize_t nbytes = (Py_ssize_t)nb.value, iters = (Py_ssize_t)it.value;
    pxt_allocator *a = pxt_allocator_get(dev.value);
    if (!a) {
        return pxt_raise(PXT_ERR_VALUE);
    }
    void *volatile sink; /* keeps the compiler from eliding malloc/free pairs */
    pxt_block *b;
    int rc = pxt_alloc(a, (size_t)nbytes, &b); /* warm the cache */
    if (rc != PXT_OK) {
        return pxt_raise(rc);
    }
    pxt_free(a, b);
    double t0 = now_ns();
    for (Py_ssize_t i = 0; i < iters; i++) {
        if ((rc = pxt_alloc(a, (size_t)nbytes, &b)) != PXT_OK) {
            return pxt_raise(rc);
        }
        sink = pxt_block_ptr(b);
        pxt_free(a, b);
    }
    double cached = (now_ns() - t0) / (double)iters;
    t0 = now_ns();
    for (Py_ssize_t i = 0; i < iters; i++) {
        void *p = malloc((size_t)nbytes);
        if (!p) {
            return PyErr_NoMemory();
        }
        ((volatile char *)p)[0] = 1; /* a used block, as a tensor's would be */
        sink = p;
        free(p);
    }
    double mal = (now_ns() - t0) / (double)iters;
    t0 = now_ns();
    for (Py_ssize_t i = 0; i < iters; i++) {
        void *p = NULL;
        if (posix_memalign(&p, 256, (size_t)nbytes) != 0) {
            return PyErr_NoMemory();
        }
        ((volatile char *)p)[0] = 1;
        sink = p;
        free(p);
    }
    double pm = (now_ns() - t0) / (double)iters;
    (void)sink;
    return Py_BuildValue("{s:d,s:d,s:d}", "cached_ns", cached, "malloc_ns", mal,
                         "posix_memalign_ns", pm);
}
