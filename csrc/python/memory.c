/* memory.c: the allocator's Python face: stats, budgets, cache, fault hook. */
#include "module.h"

#include <limits.h>

/* The allocator named by an optional `device` argument (default device if None):
 * "host" names the host pool (an offloaded optimizer's state), made through the
 * default device when nothing has used it yet. */
static pxt_allocator *arg_allocator(PyObject *dev_arg) {
    pxt_py_device dev = PXT_PY_DEVICE_OPT("device", 1);
    dev.value = pxt_py_default_device();
    int host = dev_arg && PyUnicode_Check(dev_arg) &&
               PyUnicode_CompareWithASCIIString(dev_arg, "host") == 0;
    if (dev_arg && !host && !pxt_py_device_converter(dev_arg, &dev)) {
        return NULL;
    }
    pxt_allocator *a = host ? pxt_host_pool(dev.value) : pxt_allocator_get(dev.value);
    if (!a) {
        pxt_raise(PXT_ERR_VALUE);
    }
    return a;
}

static pxt_allocator *parse_device_only(PyObject *args, PyObject *kwargs, const char *fmt) {
    static char *kw[] = {"device", NULL};
    PyObject *dev = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, fmt, kw, &dev)) {
        return NULL;
    }
    return arg_allocator(dev);
}

static PyObject *limit_obj(size_t limit) {
    if (limit == PXT_NO_LIMIT) {
        Py_RETURN_NONE;
    }
    return PyLong_FromSize_t(limit);
}

PyObject *pxt_py_memory_stats(PyObject *m, PyObject *args, PyObject *kwargs) {
    (void)m;
    pxt_allocator *a = parse_device_only(args, kwargs, "|O:memory_stats");
    if (!a) {
        return NULL;
    }
    pxt_alloc_stats s;
    pxt_get_stats(a, &s);
    PyObject *dev =
        s.host ? PyUnicode_FromString("host") : pxt_py_device_str(pxt_allocator_device(a));
    if (!dev) {
        return NULL;
    }
    return Py_BuildValue(
        "{s:N,s:K,s:K,s:K,s:K,s:K,s:N,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:O}", "device",
        dev, "allocated_bytes", (unsigned long long)s.allocated_bytes, "requested_bytes",
        (unsigned long long)s.requested_bytes, "reserved_bytes",
        (unsigned long long)s.reserved_bytes, "peak_allocated_bytes",
        (unsigned long long)s.peak_allocated_bytes, "peak_reserved_bytes",
        (unsigned long long)s.peak_reserved_bytes, "limit_bytes", limit_obj(s.limit_bytes),
        "inactive_split_bytes", (unsigned long long)s.inactive_split_bytes, "cached_bytes",
        (unsigned long long)s.cached_bytes, "num_allocs", (unsigned long long)s.num_allocs,
        "num_frees", (unsigned long long)s.num_frees, "num_ooms", (unsigned long long)s.num_ooms,
        "num_alloc_retries", (unsigned long long)s.num_alloc_retries, "num_raw_allocs",
        (unsigned long long)s.num_raw_allocs, "num_raw_frees", (unsigned long long)s.num_raw_frees,
        "num_segments", (unsigned long long)s.num_segments, "num_active_blocks",
        (unsigned long long)s.num_active_blocks, "device_total_bytes",
        (unsigned long long)pxt_allocator_device_total(a), "pinned", s.pinned ? Py_True : Py_False);
}

#define STAT_GETTER(fn, field, fmt)                                                                \
    PyObject *fn(PyObject *m, PyObject *args, PyObject *kwargs) {                                  \
        (void)m;                                                                                   \
        pxt_allocator *a = parse_device_only(args, kwargs, fmt);                                   \
        if (!a)                                                                                    \
            return NULL;                                                                           \
        pxt_alloc_stats s;                                                                         \
        pxt_get_stats(a, &s);                                                                      \
        return PyLong_FromSize_t(s.field);                                                         \
    }

STAT_GETTER(pxt_py_memory_allocated, allocated_bytes, "|O:memory_allocated")
STAT_GETTER(pxt_py_memory_reserved, reserved_bytes, "|O:memory_reserved")
STAT_GETTER(pxt_py_max_memory_allocated, peak_allocated_bytes, "|O:max_memory_allocated")
STAT_GETTER(pxt_py_max_memory_reserved, peak_reserved_bytes, "|O:max_memory_reserved")

PyObject *pxt_py_reset_peak_memory_stats(PyObject *m, PyObject *args, PyObject *kwargs) {
    (void)m;
    pxt_allocator *a = parse_device_only(args, kwargs, "|O:reset_peak_memory_stats");
    if (!a) {
        return NULL;
    }
    pxt_reset_peak(a);
    Py_RETURN_NONE;
}

PyObject *pxt_py_empty_cache(PyObject *m, PyObject *args, PyObject *kwargs) {
    (void)m;
    pxt_allocator *a = parse_device_only(args, kwargs, "|O:empty_cache");
    if (!a) {
        return NULL;
    }
    size_t released;
    Py_BEGIN_ALLOW_THREADS
    released = pxt_empty_cache(a);
    Py_END_ALLOW_THREADS
    return PyLong_FromSize_t(released);
}

/* set_memory_limit(nbytes, device=None): None removes the limit. */
PyObject *pxt_py_set_memory_limit(PyObject *m, PyObject *args, PyObject *kwargs) {
    (void)m;
    static char *kw[] = {"nbytes", "device", NULL};
    pxt_py_bytes nbytes = PXT_PY_BYTES_OPT("nbytes", PXT_NO_LIMIT);
    PyObject *dev = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O&|O:set_memory_limit", kw,
                                     pxt_py_bytes_converter, &nbytes, &dev)) {
        return NULL;
    }
    pxt_allocator *a = arg_allocator(dev);
    if (!a) {
        return NULL;
    }
    pxt_set_limit(a, nbytes.value);
    Py_RETURN_NONE;
}

/* set_memory_fraction(fraction, device=None): limit = fraction x device total
 * (physical RAM on the CPU). */
PyObject *pxt_py_set_memory_fraction(PyObject *m, PyObject *args, PyObject *kwargs) {
    (void)m;
    static char *kw[] = {"fraction", "device", NULL};
    pxt_py_real fraction = PXT_PY_REAL("fraction", 0.0, 1, 1.0, 0, "in (0, 1]");
    PyObject *dev = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O&|O:set_memory_fraction", kw,
                                     pxt_py_real_converter, &fraction, &dev)) {
        return NULL;
    }
    double f = fraction.value;
    pxt_allocator *a = arg_allocator(dev);
    if (!a) {
        return NULL;
    }
    size_t total = pxt_allocator_device_total(a);
    if (!total) {
        return PyErr_Format(PyExc_RuntimeError, "the device's total memory is unknown");
    }
    pxt_set_limit(a, (size_t)(f * (double)total));
    Py_RETURN_NONE;
}

/* _inject_oom(after, device="cpu", raw=False): see pyxtts.testing.inject_oom. */
PyObject *pxt_py_inject_oom(PyObject *m, PyObject *args, PyObject *kwargs) {
    (void)m;
    static char *kw[] = {"after", "device", "raw", NULL};
    pxt_py_int after = PXT_PY_INT_OPT("after", 0, LLONG_MAX, -1);
    PyObject *dev = Py_None;
    int raw = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O&|Op:inject_oom", kw, pxt_py_int_converter,
                                     &after, &dev, &raw)) {
        return NULL;
    }
    pxt_allocator *a = arg_allocator(dev);
    if (!a) {
        return NULL;
    }
    pxt_inject_oom(a, after.value, raw);
    Py_RETURN_NONE;
}

#undef STAT_GETTER
