/* convert.c: argument converters and tensor checks (see convert.h). */
#include "convert.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define NO_IMPORT_ARRAY
#define PY_ARRAY_UNIQUE_SYMBOL pxt_ARRAY_API
#define NPY_NO_DEPRECATED_API NPY_2_0_API_VERSION
#include <numpy/arrayobject.h>

/* None for an optional argument: nothing to convert, the default stays. */
static int none_for(pxt_py_arg *a, PyObject *obj) {
    a->given = obj != Py_None;
    return obj == Py_None && a->optional;
}

/* ---- numbers ---------------------------------------------------------------------- */

/* obj's __index__ as a new int reference; where __index__ itself refuses (a NumPy array
 * has one, which refuses every array but a 0-d integer one), a TypeError naming `what`
 * and the value instead of NumPy's nameless one. */
static PyObject *index_of(PyObject *obj, const char *what) {
    PyObject *v = PyNumber_Index(obj);
    if (!v && PyErr_ExceptionMatches(PyExc_TypeError)) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s: expected an integer, got %.100R", what, obj);
    }
    return v;
}

/* An integer argument (int or __index__, not bool) as a new int reference, or
 * NULL with TypeError naming it. */
static PyObject *integer_of(PyObject *obj, const char *name) {
    if (PyBool_Check(obj) || !PyIndex_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s: expected an integer, got %.100s", name,
                     Py_TYPE(obj)->tp_name);
        return NULL;
    }
    return index_of(obj, name);
}

/* "name: expected an integer <want>, got <v>"; 0. */
static int integer_out_of_range(const char *name, const char *want, PyObject *v) {
    PyErr_Format(PyExc_ValueError, "%s: expected an integer %s, got %R", name, want, v);
    Py_DECREF(v);
    return 0;
}

int pxt_py_bool_converter(PyObject *obj, void *arg) {
    pxt_py_bool *p = arg;
    if (none_for(&p->a, obj)) {
        return 1;
    }
    if (!PyBool_Check(obj) && !PyArray_IsScalar(obj, Bool)) {
        PyErr_Format(PyExc_TypeError, "%s: expected a bool, got %.100s", p->a.name,
                     Py_TYPE(obj)->tp_name);
        return 0;
    }
    p->value = PyObject_IsTrue(obj);
    return p->value >= 0;
}

int pxt_py_int_converter(PyObject *obj, void *arg) {
    pxt_py_int *p = arg;
    if (none_for(&p->a, obj)) {
        return 1;
    }
    PyObject *v = integer_of(obj, p->a.name);
    if (!v) {
        return 0;
    }
    int overflow = 0;
    long long n = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (n == -1 && PyErr_Occurred()) {
        Py_DECREF(v);
        return 0;
    }
    if (overflow || n < p->lo || n > p->hi) {
        char want[96];
        if (p->lo == LLONG_MIN && p->hi == LLONG_MAX) {
            snprintf(want, sizeof want, "that fits in 64 bits");
        } else if (p->hi == LLONG_MAX) { /* no upper bound worth naming */
            snprintf(want, sizeof want, ">= %lld", p->lo);
        } else {
            snprintf(want, sizeof want, "in [%lld, %lld]", p->lo, p->hi);
        }
        return integer_out_of_range(p->a.name, want, v);
    }
    Py_DECREF(v);
    p->value = n;
    return 1;
}

int pxt_py_u64_converter(PyObject *obj, void *arg) {
    pxt_py_u64 *p = arg;
    if (none_for(&p->a, obj)) {
        return 1;
    }
    PyObject *v = integer_of(obj, p->a.name);
    if (!v) {
        return 0;
    }
    unsigned long long n = PyLong_AsUnsignedLongLong(v); /* OverflowError when < 0 or too big */
    if (n == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        return integer_out_of_range(p->a.name, "in [0, 2**64)", v);
    }
    Py_DECREF(v);
    p->value = n;
    return 1;
}

int pxt_py_bytes_converter(PyObject *obj, void *arg) {
    pxt_py_bytes *p = arg;
    if (none_for(&p->a, obj)) {
        return 1;
    }
    if (PyBool_Check(obj) || !PyLong_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s: expected an int or None, got %.100s", p->a.name,
                     Py_TYPE(obj)->tp_name);
        return 0;
    }
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (v == -1 && PyErr_Occurred()) {
        return 0;
    }
    if (overflow < 0 || (!overflow && v < 0)) {
        PyErr_Format(PyExc_ValueError, "%s: must be >= 0 or None, got %R", p->a.name, obj);
        return 0;
    }
    /* past 2**63 bytes limits nothing: no limit, not OverflowError */
    p->value = overflow > 0 ? (size_t)-1 : (size_t)v;
    return 1;
}

/* A real number: an int (not a bool), a float, a NumPy integer or floating scalar, a 0-d
 * array of those, or another integer type (__index__). Not anything with __float__: a
 * NumPy complex converts to its real part with a mere warning, and an array of one
 * element or of bools converts too. */
static int is_real_number(PyObject *obj) {
    if (PyBool_Check(obj) || PyArray_IsScalar(obj, Bool)) {
        return 0;
    }
    if (PyLong_Check(obj) || PyFloat_Check(obj) || PyArray_IsScalar(obj, Integer) ||
        PyArray_IsScalar(obj, Floating)) {
        return 1;
    }
    if (PyArray_IsZeroDim(obj)) {
        char kind = PyArray_DESCR((PyArrayObject *)obj)->kind;
        return kind == 'i' || kind == 'u' || kind == 'f';
    }
    return !PyArray_Check(obj) && PyIndex_Check(obj); /* complex has no __index__ */
}

int pxt_py_real_converter(PyObject *obj, void *arg) {
    pxt_py_real *p = arg;
    if (none_for(&p->a, obj)) {
        return 1;
    }
    int real = is_real_number(obj);
    double v = real ? PyFloat_AsDouble(obj) : 0.0;
    if (real && v == -1.0 && PyErr_Occurred()) {
        int too_big = PyErr_ExceptionMatches(PyExc_OverflowError); /* an int past double */
        PyErr_Clear();
        if (too_big) {
            PyErr_Format(PyExc_ValueError, "%s: must be %s, got %R", p->a.name,
                         p->rule ? p->rule : "a number in double's range", obj);
            return 0;
        }
        real = 0;
    }
    if (!real) {
        PyErr_Format(PyExc_TypeError, "%s: expected a real number, got %.100s", p->a.name,
                     Py_TYPE(obj)->tp_name);
        return 0;
    }
    int ok = !p->rule || (isfinite(v) && (p->lo_open ? v > p->lo : v >= p->lo) &&
                          (p->hi_open ? v < p->hi : v <= p->hi) && (!p->f32 || isfinite((float)v)));
    if (!ok) {
        PyObject *f = PyFloat_FromDouble(v);
        if (f) {
            PyErr_Format(PyExc_ValueError, "%s: must be %s, got %R", p->a.name, p->rule, f);
            Py_DECREF(f);
        }
        return 0;
    }
    p->value = v;
    return 1;
}

/* ---- strings ------------------------------------------------------------------------ */

/* The UTF-8 of a str without NUL; NULL with ValueError naming `name` (what = the
 * expectation in words) otherwise. */
static const char *utf8_of(PyObject *obj, const char *name, const char *what) {
    Py_ssize_t len = 0;
    const char *s = PyUnicode_AsUTF8AndSize(obj, &len);
    if (!s) { /* lone surrogates have no UTF-8 */
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s: expected %s, got %R (not encodable as UTF-8)", name,
                     what, obj);
        return NULL;
    }
    if ((size_t)len != strlen(s)) { /* "full\0junk" must not pass as "full" */
        PyErr_Format(PyExc_ValueError, "%s: expected %s, got %R (with a NUL character)", name, what,
                     obj);
        return NULL;
    }
    return s;
}

int pxt_py_str_converter(PyObject *obj, void *arg) {
    pxt_py_str *p = arg;
    if (none_for(&p->a, obj)) {
        return 1;
    }
    if (!PyUnicode_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s: expected a string, got %.100s", p->a.name,
                     Py_TYPE(obj)->tp_name);
        return 0;
    }
    const char *s = utf8_of(obj, p->a.name, "a string");
    if (!s) {
        return 0;
    }
    p->value = s;
    return 1;
}

const char *const pxt_py_ckpt_names[] = {"none", "selective", "full", "auto", NULL};
const char *const pxt_py_block_ckpt_names[] = {"none", "selective", "full", NULL};
const char *const pxt_py_precision_names[] = {"fp32", "bf16", "fp16", NULL};

pxt_dtype pxt_py_precision_dtype(int i) {
    static const pxt_dtype dt[] = {PXT_FLOAT32, PXT_BFLOAT16, PXT_FLOAT16};
    return dt[i];
}

const char *pxt_py_precision_name(pxt_dtype dt) {
    return dt == PXT_BFLOAT16 ? "bf16" : dt == PXT_FLOAT16 ? "fp16" : "fp32";
}

int pxt_py_choice_converter(PyObject *obj, void *arg) {
    pxt_py_choice *p = arg;
    if (none_for(&p->a, obj)) {
        return 1;
    }
    char want[160] = "one of ";
    for (int i = 0; p->choices[i]; i++) {
        size_t n = strlen(want);
        snprintf(want + n, sizeof want - n, "%s'%s'", i ? ", " : "", p->choices[i]);
    }
    if (!PyUnicode_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s: expected %s, got %.100s", p->a.name, want,
                     Py_TYPE(obj)->tp_name);
        return 0;
    }
    const char *s = utf8_of(obj, p->a.name, want);
    if (!s) {
        return 0;
    }
    for (int i = 0; p->choices[i]; i++) {
        if (!strcmp(s, p->choices[i])) {
            p->index = i;
            return 1;
        }
    }
    PyErr_Format(PyExc_ValueError, "%s: expected %s, got %R", p->a.name, want, obj);
    return 0;
}

/* ---- devices ------------------------------------------------------------------------ */

static int cuda_count(void) {
    const pxt_backend *be = pxt_backend_for(PXT_CUDA);
    return be ? be->device_count() : 0;
}

pxt_device pxt_py_default_device(void) {
    return cuda_count() > 0 ? (pxt_device){PXT_CUDA, 0} : (pxt_device){PXT_CPU, 0};
}

PyObject *pxt_py_device_str(pxt_device d) {
    char buf[32];
    return PyUnicode_FromString(pxt_device_str(d, buf, sizeof buf));
}

/* "cpu", "cpu:0", "cuda", "cuda:N" into *out; 0 when s is none of them. */
static int device_of_name(const char *s, pxt_device *out) {
    if (!strcmp(s, "cpu") || !strcmp(s, "cpu:0")) {
        *out = (pxt_device){PXT_CPU, 0};
        return 1;
    }
    if (!strcmp(s, "cuda")) {
        *out = (pxt_device){PXT_CUDA, 0};
        return 1;
    }
    char *end = NULL;
    if (strncmp(s, "cuda:", 5) || s[5] < '0' || s[5] > '9') {
        return 0;
    }
    long i = strtol(s + 5, &end, 10);
    if (*end != '\0' || i >= PXT_MAX_DEVICES) {
        return 0;
    }
    *out = (pxt_device){PXT_CUDA, (int)i};
    return 1;
}

int pxt_py_device_converter(PyObject *obj, void *arg) {
    pxt_py_device *p = arg;
    const char *name = p->a.name;
    if (none_for(&p->a, obj)) {
        return 1;
    }
    pxt_device dev;
    if (PyLong_Check(obj) && !PyBool_Check(obj)) { /* an int N means cuda:N, as in torch */
        int overflow = 0;
        long long i = PyLong_AsLongLongAndOverflow(obj, &overflow);
        if (i == -1 && PyErr_Occurred()) {
            return 0;
        }
        if (overflow || i < 0 || i >= PXT_MAX_DEVICES) {
            PyErr_Format(PyExc_ValueError, "%s: device index must be in [0, %d), got %R", name,
                         PXT_MAX_DEVICES, obj);
            return 0;
        }
        dev = (pxt_device){PXT_CUDA, (int)i};
    } else {
        PyObject *str = NULL;
        if (PyUnicode_Check(obj)) {
            str = Py_NewRef(obj);
        } else if (!PyBool_Check(obj) && PyObject_HasAttrString(obj, "type") &&
                   PyObject_HasAttrString(obj, "index")) {
            str = PyObject_Str(obj); /* torch.device('cuda:0') */
            if (!str) {
                return 0;
            }
        } else {
            PyErr_Format(PyExc_TypeError, "%s: expected 'cpu', 'cuda' or 'cuda:N', got %.100s",
                         name, Py_TYPE(obj)->tp_name);
            return 0;
        }
        const char *s =
            PyUnicode_Check(str) ? utf8_of(str, name, "'cpu', 'cuda' or 'cuda:N'") : NULL;
        int ok = s && device_of_name(s, &dev);
        if (s && !ok) {
            PyErr_Format(PyExc_ValueError, "%s: expected 'cpu', 'cuda' or 'cuda:N', got %R", name,
                         obj);
        }
        Py_DECREF(str);
        if (!ok) {
            return 0;
        }
    }
    if (p->must_exist && pxt_py_check_device_exists(dev, name) < 0) {
        return 0;
    }
    p->value = dev;
    return 1;
}

int pxt_py_check_device_exists(pxt_device dev, const char *name) {
    if (!pxt_allocator_get(dev)) {
        PyErr_Format(PyExc_ValueError, "%s: %s", name, pxt_error_message());
        return -1;
    }
    return 0;
}

/* ---- dtypes ---------------------------------------------------------------------------- */

static const struct {
    const char *alias;
    pxt_dtype t;
} dtype_aliases[] = {
    {"float32", PXT_FLOAT32},   {"fp32", PXT_FLOAT32},  {"float", PXT_FLOAT32},
    {"float16", PXT_FLOAT16},   {"fp16", PXT_FLOAT16},  {"half", PXT_FLOAT16},
    {"bfloat16", PXT_BFLOAT16}, {"bf16", PXT_BFLOAT16}, {"int32", PXT_INT32},
    {"int64", PXT_INT64},       {"long", PXT_INT64},    {"uint8", PXT_UINT8},
    {"bool", PXT_BOOL},
};

#define DTYPE_NAMES "float32, float16, bfloat16, int32, int64, uint8, bool"

static int dtype_of_name(PyObject *obj, const char *name, pxt_dtype *out) {
    const char *s = utf8_of(obj, name, "one of " DTYPE_NAMES);
    if (!s) {
        return 0;
    }
    if (!strncmp(s, "torch.", 6)) { /* str(torch.bfloat16) */
        s += 6;
    }
    for (size_t i = 0; i < sizeof dtype_aliases / sizeof dtype_aliases[0]; i++) {
        if (!strcmp(s, dtype_aliases[i].alias)) {
            *out = dtype_aliases[i].t;
            return 1;
        }
    }
    PyErr_Format(PyExc_ValueError, "%s: expected one of " DTYPE_NAMES ", got %R", name, obj);
    return 0;
}

int pxt_py_dtype_converter(PyObject *obj, void *arg) {
    pxt_py_dtype *p = arg;
    const char *name = p->a.name;
    if (none_for(&p->a, obj)) {
        return 1;
    }
    if (pxt_dtype_object_value(obj, &p->value)) {
        return 1;
    }
    if (PyUnicode_Check(obj)) {
        return dtype_of_name(obj, name, &p->value);
    }
    /* torch.dtype: go by its name */
    PyObject *type_mod = PyObject_GetAttrString((PyObject *)Py_TYPE(obj), "__module__");
    if (!type_mod) {
        PyErr_Clear();
    }
    int is_torch = type_mod && PyUnicode_Check(type_mod) &&
                   PyUnicode_CompareWithASCIIString(type_mod, "torch") == 0;
    Py_XDECREF(type_mod);
    if (is_torch) {
        PyObject *s = PyObject_Str(obj);
        if (!s) {
            return 0;
        }
        int ok = dtype_of_name(s, name, &p->value);
        Py_DECREF(s);
        return ok;
    }
    /* anything NumPy understands as a dtype: np.float32, np.dtype('<f2'), ... but not a
     * value: NumPy takes an array's or a scalar's dtype attribute, so np.int32(0) would be
     * int32 (and t.to(np.int32(0)) a cast where t.to(0) names a device) */
    PyArray_Descr *d = NULL;
    if (PyArray_Check(obj) || PyArray_IsScalar(obj, Generic) || !PyArray_DescrConverter2(obj, &d) ||
        !d) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError,
                     "%s: expected a pyxtts dtype, a dtype name or a NumPy dtype, got %R", name,
                     obj);
        Py_XDECREF(d);
        return 0;
    }
    int found = pxt_dtype_from_descr((PyObject *)d, &p->value);
    if (found == 0) {
        PyErr_Format(PyExc_TypeError,
                     "%s: NumPy dtype %R has no pyxtts equivalent (" DTYPE_NAMES ")", name,
                     (PyObject *)d);
    }
    Py_DECREF(d);
    return found == 1;
}

#undef DTYPE_NAMES

/* ---- shapes --------------------------------------------------------------------------------- */

/* One size of a shape: an int or anything with __index__ (NumPy integers). */
static int shape_entry(PyObject *it, const char *name, int dim, int64_t *out) {
    if (!PyIndex_Check(it) || PyBool_Check(it)) {
        PyErr_Format(PyExc_TypeError, "%s: expected ints, got %.100s at dim %d", name,
                     Py_TYPE(it)->tp_name, dim);
        return 0;
    }
    char what[128];
    snprintf(what, sizeof what, "%s at dim %d", name, dim);
    PyObject *v = index_of(it, what);
    if (!v) {
        return 0;
    }
    int overflow = 0;
    long long n = PyLong_AsLongLongAndOverflow(v, &overflow);
    Py_DECREF(v);
    if (overflow || (n == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s: size at dim %d does not fit in 64 bits", name, dim);
        return 0;
    }
    *out = n;
    return 1;
}

int pxt_py_shape_converter(PyObject *obj, void *arg) {
    pxt_py_shape *p = arg;
    const char *name = p->a.name;
    if (none_for(&p->a, obj)) {
        return 1;
    }
    if (PyIndex_Check(obj) && !PySequence_Check(obj)) { /* an int, or a NumPy integer */
        p->ndim = 1;
        return shape_entry(obj, name, 0, &p->shape[0]);
    }
    PyObject *seq = PySequence_Fast(obj, "shape");
    if (!seq) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s: expected an int or a sequence of ints, got %.100s", name,
                     Py_TYPE(obj)->tp_name);
        return 0;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n > PXT_MAX_DIMS) {
        Py_DECREF(seq);
        PyErr_Format(PyExc_ValueError, "%s: at most %d dimensions, got %zd", name, PXT_MAX_DIMS, n);
        return 0;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!shape_entry(PySequence_Fast_GET_ITEM(seq, i), name, (int)i, &p->shape[i])) {
            Py_DECREF(seq);
            return 0;
        }
    }
    p->ndim = (int)n;
    Py_DECREF(seq);
    return 1;
}

/* ---- tensors ------------------------------------------------------------------------------------ */

PyObject *pxt_py_tensor_arg(PyObject *obj, const char *name, const pxt_tensor *like) {
    if (pxt_tensor_check(obj)) {
        return Py_NewRef(obj);
    }
    PyObject *dev = like ? pxt_py_device_str(like->device) : NULL;
    if (like && !dev) {
        return NULL;
    }
    PyObject *t = pxt_tensor_from_data(obj, NULL, dev);
    Py_XDECREF(dev);
    if (!t && PyErr_ExceptionMatches(PyExc_TypeError)) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s: expected a pyxtts.Tensor or an array, got %.100s", name,
                     Py_TYPE(obj)->tp_name);
    }
    return t;
}

int pxt_py_check_dtype(const pxt_tensor *t, const char *name, pxt_dtype want) {
    if (t->dtype == want) {
        return 0;
    }
    PyErr_Format(PyExc_TypeError, "%s: expected dtype %s, got %s", name, pxt_dtype_name(want),
                 pxt_dtype_name(t->dtype));
    return -1;
}

int pxt_py_check_float(const pxt_tensor *t, const char *name) {
    if (pxt_dtype_is_float(t->dtype)) {
        return 0;
    }
    PyErr_Format(PyExc_TypeError, "%s: expected dtype float32, float16 or bfloat16, got %s", name,
                 pxt_dtype_name(t->dtype));
    return -1;
}

int pxt_py_check_dims(const char *name, int ndim, const int64_t *shape, int want_ndim,
                      const int64_t *want) {
    int ok = ndim == want_ndim;
    for (int i = 0; ok && i < ndim; i++) {
        ok = want[i] < 0 || want[i] == shape[i];
    }
    if (ok) {
        return 0;
    }
    char w[160] = "(", g[160] = "(";
    for (int i = 0; i < want_ndim; i++) {
        size_t n = strlen(w);
        if (want[i] < 0) {
            snprintf(w + n, sizeof w - n, "%s*", i ? ", " : "");
        } else {
            snprintf(w + n, sizeof w - n, "%s%lld", i ? ", " : "", (long long)want[i]);
        }
    }
    for (int i = 0; i < ndim; i++) {
        size_t n = strlen(g);
        snprintf(g + n, sizeof g - n, "%s%lld", i ? ", " : "", (long long)shape[i]);
    }
    strncat(w, ")", sizeof w - strlen(w) - 1);
    strncat(g, ")", sizeof g - strlen(g) - 1);
    PyErr_Format(PyExc_ValueError, "%s: expected shape %s, got %s", name, w, g);
    return -1;
}

int pxt_py_check_shape(const pxt_tensor *t, const char *name, int ndim, const int64_t *dims) {
    return pxt_py_check_dims(name, t->ndim, t->shape, ndim, dims);
}

int pxt_py_check_device(const pxt_tensor *t, const char *name, pxt_device want) {
    if (t->device.type == want.type && t->device.index == want.index) {
        return 0;
    }
    char a[32], b[32];
    PyErr_Format(PyExc_ValueError, "%s: expected a tensor on %s, got one on %s", name,
                 pxt_device_str(want, a, sizeof a), pxt_device_str(t->device, b, sizeof b));
    return -1;
}

int pxt_py_check_writable(const pxt_tensor *t, const char *name) {
    if (!t->readonly) {
        return 0;
    }
    PyErr_Format(PyExc_ValueError,
                 "%s: the tensor is read-only (imported from a read-only DLPack producer)", name);
    return -1;
}

const pxt_backend *pxt_py_backend_with(pxt_device dev, const void *op, const char *op_name) {
    const pxt_backend *be = pxt_backend_for(dev.type);
    if (be && op) {
        return be;
    }
    char d[32];
    PyErr_Format(PyExc_NotImplementedError, "%s is not available on %s in this version of pyxtts",
                 op_name, pxt_device_str(dev, d, sizeof d));
    return NULL;
}
