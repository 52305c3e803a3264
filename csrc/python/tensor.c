/* tensor.c: pyxtts.Tensor: creation, copies between devices and dtypes, NumPy. */
#include "convert.h"

#define NO_IMPORT_ARRAY
#define PY_ARRAY_UNIQUE_SYMBOL pxt_ARRAY_API
#define NPY_NO_DEPRECATED_API NPY_2_0_API_VERSION
#include <numpy/arrayobject.h>

/* ---- construction ---------------------------------------------------------- */

/* At most 2**59 - 1 elements: the bytes of any dtype then fit in int64_t, with room. */
#define MAX_NUMEL (INT64_MAX / 16)

int pxt_tensor_shape_numel(const char *name, int ndim, const int64_t *shape, int64_t *numel) {
    size_t n = 1;
    int zero = 0;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) {
            PyErr_Format(PyExc_ValueError, "%s: sizes must be >= 0, got %lld at dim %d", name,
                         (long long)shape[i], i);
            return -1;
        }
        if (shape[i] == 0) {
            zero = 1;
        } else if (!zero && (!pxt_mul_ok(n, (size_t)shape[i], &n) || n > MAX_NUMEL)) {
            char got[PXT_MAX_DIMS * 22 + 4];
            size_t len = 0;
            for (int j = 0; j < ndim; j++) {
                len += (size_t)snprintf(got + len, sizeof got - len, "%s%lld", j ? ", " : "(",
                                        (long long)shape[j]);
            }
            snprintf(got + len, sizeof got - len, "%s)", ndim == 1 ? "," : "");
            PyErr_Format(PyExc_ValueError,
                         "%s: the number of elements overflows: a tensor holds at most 2**59 - 1 "
                         "elements, got shape %s",
                         name, got);
            return -1;
        }
    }
    *numel = zero ? 0 : (int64_t)n;
    return 0;
}

/* numel and nbytes of a shape, or -1 with ValueError on negative sizes or overflow. */
static int shape_bytes(int ndim, const int64_t *shape, pxt_dtype dt, int64_t *numel,
                       size_t *nbytes) {
    if (pxt_tensor_shape_numel("shape", ndim, shape, numel) < 0) {
        return -1;
    }
    *nbytes = (size_t)*numel * pxt_dtype_size(dt);
    return 0;
}

static pxt_tensor *tensor_alloc_object(pxt_device dev, pxt_dtype dt, int ndim,
                                       const int64_t *shape) {
    pxt_tensor *t = PyObject_GC_New(pxt_tensor, &pxt_tensor_type);
    if (!t) {
        return NULL;
    }
    t->data = NULL;
    t->storage = NULL;
    t->base = NULL;
    t->weakreflist = NULL;
    t->device = dev;
    t->dtype = dt;
    t->ndim = ndim;
    t->readonly = 0;
    for (int i = 0; i < ndim; i++) {
        t->shape[i] = shape[i];
    }
    if (shape_bytes(ndim, shape, dt, &t->numel, &t->nbytes) < 0) {
        t->ndim = 0;
        PyObject_GC_Del(t);
        return NULL;
    }
    PyObject_GC_Track(t);
    return t;
}

PyObject *pxt_tensor_empty(pxt_device dev, pxt_dtype dt, int ndim, const int64_t *shape) {
    if (ndim < 0 || ndim > PXT_MAX_DIMS) {
        return PyErr_Format(PyExc_ValueError, "shape: at most %d dimensions, got %d", PXT_MAX_DIMS,
                            ndim);
    }
    if (!pxt_allocator_get(dev)) {
        return pxt_raise(PXT_ERR_VALUE);
    }
    pxt_tensor *t = tensor_alloc_object(dev, dt, ndim, shape);
    if (!t) {
        return NULL;
    }
    int rc = pxt_storage_new(dev, t->nbytes, &t->storage);
    if (rc != PXT_OK) {
        Py_DECREF(t);
        return pxt_raise(rc);
    }
    t->data = t->storage->data;
    return (PyObject *)t;
}

PyObject *pxt_tensor_view(pxt_storage *s, size_t offset, pxt_dtype dt, int ndim,
                          const int64_t *shape) {
    pxt_tensor *t = tensor_alloc_object(s->device, dt, ndim, shape);
    if (!t) {
        return NULL;
    }
    t->storage = pxt_storage_ref(s);
    t->data = t->nbytes ? s->data + offset : NULL;
    return (PyObject *)t;
}

PyObject *pxt_tensor_flat_views(const pxt_param_layout *l, pxt_storage *flat, pxt_dtype dt) {
    PyObject *d = PyDict_New();
    if (!d) {
        return NULL;
    }
    size_t es = pxt_dtype_size(dt);
    for (int i = 0; i < l->count; i++) {
        const pxt_param_info *p = &l->params[i];
        PyObject *v = pxt_tensor_view(flat, p->offset * es, dt, p->ndim, p->shape);
        if (!v || PyDict_SetItemString(d, p->name, v) < 0) {
            Py_XDECREF(v);
            Py_DECREF(d);
            return NULL;
        }
        Py_DECREF(v);
    }
    return d;
}

PyObject *pxt_tensor_borrow(PyObject *base, char *data, pxt_device dev, pxt_dtype dt, int ndim,
                            const int64_t *shape, int readonly) {
    pxt_tensor *t = tensor_alloc_object(dev, dt, ndim, shape);
    if (!t) {
        return NULL;
    }
    t->data = t->nbytes ? data : NULL;
    t->readonly = readonly;
    Py_INCREF(base);
    t->base = base;
    return (PyObject *)t;
}

static int tensor_traverse(pxt_tensor *self, visitproc visit, void *arg) {
    Py_VISIT(self->base);
    return 0;
}

static int tensor_clear(pxt_tensor *self) {
    Py_CLEAR(self->base);
    return 0;
}

static void tensor_dealloc(pxt_tensor *self) {
    PyObject_GC_UnTrack(self);
    if (self->weakreflist) {
        PyObject_ClearWeakRefs((PyObject *)self);
    }
    pxt_storage_clear(&self->storage);
    tensor_clear(self);
    PyObject_GC_Del(self);
}

/* ---- copies ---------------------------------------------------------------- */

/* Runs a backend copy/cast with the GIL released when it is large. */
static int run_copy(const pxt_backend *be, int index, void *dst, const void *src, size_t nbytes,
                    pxt_copy_kind kind) {
    int rc;
    if (nbytes >= PXT_NOGIL_BYTES) {
        Py_BEGIN_ALLOW_THREADS
        rc = be->copy(index, dst, src, nbytes, kind);
        Py_END_ALLOW_THREADS
    } else {
        rc = be->copy(index, dst, src, nbytes, kind);
    }
    return rc;
}

static int run_cast(const pxt_backend *be, int index, void *dst, pxt_dtype dt, const void *src,
                    pxt_dtype st, size_t n) {
    int rc;
    if (n * pxt_dtype_size(st) >= PXT_NOGIL_BYTES) {
        Py_BEGIN_ALLOW_THREADS
        rc = be->cast(index, dst, dt, src, st, n);
        Py_END_ALLOW_THREADS
    } else {
        rc = be->cast(index, dst, dt, src, st, n);
    }
    return rc;
}

/* Copies host bytes (already in dst's dtype) into the tensor dst. */
static int copy_from_host(pxt_tensor *dst, const void *host) {
    if (!dst->nbytes) {
        return 0;
    }
    const pxt_backend *be = pxt_backend_for(dst->device.type);
    int rc = run_copy(be, dst->device.index, dst->data, host, dst->nbytes,
                      dst->device.type == PXT_CPU ? PXT_COPY_D2D : PXT_COPY_H2D);
    if (rc != PXT_OK) {
        pxt_raise(rc);
        return -1;
    }
    return 0;
}

static int copy_to_host(void *host, pxt_tensor *src) {
    if (!src->nbytes) {
        return 0;
    }
    const pxt_backend *be = pxt_backend_for(src->device.type);
    int rc = run_copy(be, src->device.index, host, src->data, src->nbytes,
                      src->device.type == PXT_CPU ? PXT_COPY_D2D : PXT_COPY_D2H);
    if (rc != PXT_OK) {
        pxt_raise(rc);
        return -1;
    }
    return 0;
}

static int same_device(pxt_device a, pxt_device b) {
    return a.type == b.type && a.index == b.index;
}

PyObject *pxt_tensor_convert(pxt_tensor *src, pxt_device dev, pxt_dtype dt) {
    PyObject *out = pxt_tensor_empty(dev, dt, src->ndim, src->shape);
    if (!out || !src->numel) {
        return out;
    }
    pxt_tensor *dst = (pxt_tensor *)out;
    const pxt_backend *sbe = pxt_backend_for(src->device.type);
    if (same_device(src->device, dev)) { /* one pass on the device itself */
        int rc = dt == src->dtype
                     ? run_copy(sbe, dev.index, dst->data, src->data, src->nbytes, PXT_COPY_D2D)
                     : run_cast(sbe, dev.index, dst->data, dt, src->data, src->dtype,
                                (size_t)src->numel);
        if (rc != PXT_OK) {
            Py_DECREF(out);
            return pxt_raise(rc);
        }
        return out;
    }
    /* across devices: cast where the data is, then move the bytes through the host */
    pxt_tensor *moved = src;
    Py_INCREF(moved);
    if (dt != src->dtype) {
        PyObject *cast = pxt_tensor_convert(src, src->device, dt);
        Py_DECREF(moved);
        if (!cast) {
            Py_DECREF(out);
            return NULL;
        }
        moved = (pxt_tensor *)cast;
    }
    int ok;
    if (moved->device.type == PXT_CPU) {
        ok = copy_from_host(dst, moved->data) == 0;
    } else if (dev.type == PXT_CPU) {
        ok = copy_to_host(dst->data, moved) == 0;
    } else { /* GPU to another GPU: stage through a host tensor */
        pxt_device cpu = {PXT_CPU, 0};
        PyObject *host = pxt_tensor_convert(moved, cpu, dt);
        ok = host && copy_from_host(dst, ((pxt_tensor *)host)->data) == 0;
        Py_XDECREF(host);
    }
    Py_DECREF(moved);
    if (!ok) {
        Py_DECREF(out);
        return NULL;
    }
    return out;
}

/* ---- NumPy in and out ------------------------------------------------------ */

/* The default pyxtts dtype for a NumPy dtype that is not one of ours. */
static int default_dtype(PyArray_Descr *d, pxt_dtype *out) {
    int found = pxt_dtype_from_descr((PyObject *)d, out);
    if (found != 0) {
        return found == 1 ? 0 : -1;
    }
    switch (d->kind) {
    case 'f': *out = PXT_FLOAT32; return 0; /* float64 becomes the engine's float32 */
    case 'i': *out = PyDataType_ELSIZE(d) < 4 ? PXT_INT32 : PXT_INT64; return 0;
    case 'u':
        if (PyDataType_ELSIZE(d) <= 2) {
            *out = PXT_INT32;
            return 0;
        }
        if (PyDataType_ELSIZE(d) == 4) {
            *out = PXT_INT64;
            return 0;
        }
        break;
    default: break;
    }
    PyErr_Format(PyExc_TypeError,
                 "data: arrays of dtype %R cannot become a pyxtts tensor (expected a real "
                 "number or bool dtype)%s",
                 (PyObject *)d,
                 d->kind == 'u' ? "; pass dtype=pyxtts.int64 to convert uint64 explicitly" : "");
    return -1;
}

static int is_numeric_kind(char kind) {
    return kind == 'f' || kind == 'i' || kind == 'u' || kind == 'b';
}

/* float64 data into int32/int64/uint8/bool by pyxtts's rule, straight from the
 * double (pyxtts.tensor(float64_array, dtype=int32): NumPy's own cast is C's,
 * undefined out of range, and float32 first would lose integers > 2^24). */
static void cast_f64_to_int(void *dst, pxt_dtype dt, const double *src, size_t n) {
    for (size_t i = 0; i < n; i++) {
        pxt_store_int_sat(dst, dt, i, src[i]);
    }
}

/* pyxtts.tensor(data, dtype=None, device="cpu"): always a copy. */
PyObject *pxt_tensor_from_data(PyObject *data, PyObject *dtype_arg, PyObject *device_arg) {
    pxt_py_device dev_arg = PXT_PY_DEVICE_OPT("device", 1);
    pxt_py_dtype want_arg = PXT_PY_DTYPE_OPT("dtype", PXT_FLOAT32);
    if ((device_arg && !pxt_py_device_converter(device_arg, &dev_arg)) ||
        (dtype_arg && !pxt_py_dtype_converter(dtype_arg, &want_arg))) {
        return NULL;
    }
    pxt_device dev = dev_arg.value;
    pxt_dtype want = want_arg.value;
    int have_want = want_arg.a.given;
    if (pxt_tensor_check(data)) {
        pxt_tensor *src = (pxt_tensor *)data;
        return pxt_tensor_convert(src, dev, have_want ? want : src->dtype);
    }
    PyArrayObject *arr = (PyArrayObject *)PyArray_FromAny(data, NULL, 0, 0, 0, NULL);
    if (!arr) {
        char prefix[200];
        snprintf(prefix, sizeof prefix,
                 "data: expected something NumPy can view as an array, got %.100s",
                 Py_TYPE(data)->tp_name);
        return pxt_reraise_named(PyExc_TypeError, prefix);
    }
    PyObject *result = NULL;
    PyArray_Descr *d = PyArray_DESCR(arr);
    pxt_dtype src_dt;
    int ours = pxt_dtype_from_descr((PyObject *)d, &src_dt);
    if (ours < 0) {
        goto done;
    }
    if (!ours && !is_numeric_kind(d->kind)) {
        PyErr_Format(PyExc_TypeError,
                     "data: arrays of dtype %R cannot become a pyxtts tensor (expected a real "
                     "number or bool dtype)",
                     (PyObject *)d);
        goto done;
    }
    if (PyArray_NDIM(arr) > PXT_MAX_DIMS) {
        PyErr_Format(PyExc_ValueError, "data: at most %d dimensions, got %d", PXT_MAX_DIMS,
                     PyArray_NDIM(arr));
        goto done;
    }
    pxt_dtype dt;
    if (have_want) {
        dt = want;
    } else if (default_dtype(d, &dt) < 0) {
        goto done;
    }
    /* NumPy brings the data to native byte order and C order; when the source
     * dtype is ours the element conversion is ours too (same rules as .to).
     * Wider floats (float64) into integers also follow our rules (truncate,
     * saturate, NaN -> 0): NumPy would do C's undefined out-of-range cast. */
    pxt_dtype stage_dt = ours ? src_dt : dt;
    int via_f64 = !ours && d->kind == 'f' && !pxt_dtype_is_float(dt) && dt != PXT_BOOL;
    PyObject *stage_descr =
        via_f64 ? (PyObject *)PyArray_DescrFromType(NPY_FLOAT64) : pxt_dtype_to_descr(stage_dt);
    if (!stage_descr) {
        goto done;
    }
    PyArrayObject *c = (PyArrayObject *)PyArray_FromAny(
        (PyObject *)arr, (PyArray_Descr *)stage_descr, 0, 0,
        NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED | NPY_ARRAY_FORCECAST, NULL);
    if (!c) {
        goto done;
    }
    int64_t shape[PXT_MAX_DIMS];
    for (int i = 0; i < PyArray_NDIM(c); i++) {
        shape[i] = PyArray_DIM(c, i);
    }
    pxt_device cpu = {PXT_CPU, 0};
    if (stage_dt == dt && !via_f64) {
        result = pxt_tensor_empty(dev, dt, PyArray_NDIM(c), shape);
        if (result && copy_from_host((pxt_tensor *)result, PyArray_DATA(c)) < 0) {
            Py_CLEAR(result);
        }
    } else { /* cast on the host, then move */
        PyObject *host = pxt_tensor_empty(cpu, dt, PyArray_NDIM(c), shape);
        if (host) {
            pxt_tensor *h = (pxt_tensor *)host;
            int rc = PXT_OK;
            if (via_f64) {
                cast_f64_to_int(h->data, dt, PyArray_DATA(c), (size_t)h->numel);
            } else if (h->numel) {
                rc = run_cast(pxt_backend_for(PXT_CPU), 0, h->data, dt, PyArray_DATA(c), stage_dt,
                              (size_t)h->numel);
            }
            if (rc != PXT_OK) {
                pxt_raise(rc);
            } else if (dev.type == PXT_CPU) {
                result = host;
                host = NULL;
            } else {
                result = pxt_tensor_convert(h, dev, dt);
            }
            Py_XDECREF(host);
        }
    }
    Py_DECREF(c);
done:
    Py_DECREF(arr);
    return result;
}

static PyObject *tensor_numpy(PyObject *op, PyObject *unused) {
    (void)unused;
    pxt_tensor *self = (pxt_tensor *)op;
    PyObject *descr = pxt_dtype_to_descr(self->dtype);
    if (!descr) {
        return NULL;
    }
    npy_intp dims[PXT_MAX_DIMS];
    for (int i = 0; i < self->ndim; i++) {
        dims[i] = (npy_intp)self->shape[i];
    }
    PyObject *arr = PyArray_NewFromDescr(&PyArray_Type, (PyArray_Descr *)descr, self->ndim, dims,
                                         NULL, NULL, 0, NULL); /* steals descr */
    if (!arr) {
        return NULL;
    }
    if (copy_to_host(PyArray_DATA((PyArrayObject *)arr), self) < 0) {
        Py_DECREF(arr);
        return NULL;
    }
    return arr;
}

/* __array__(dtype=None, copy=None): np.asarray(t) works (always a copy). */
static PyObject *tensor_array(PyObject *op, PyObject *args, PyObject *kwargs) {
    static char *kw[] = {"dtype", "copy", NULL};
    PyObject *dtype = Py_None, *copy = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|OO:__array__", kw, &dtype, &copy)) {
        return NULL;
    }
    if (copy == Py_False) {
        PyErr_SetString(PyExc_ValueError,
                        "a pyxtts.Tensor cannot be viewed by NumPy without a copy; use "
                        "numpy.from_dlpack(t) for a zero-copy view of a CPU tensor");
        return NULL;
    }
    PyObject *arr = tensor_numpy(op, NULL);
    if (!arr || dtype == Py_None) {
        return arr;
    }
    PyObject *res = PyObject_CallMethod(arr, "astype", "O", dtype);
    Py_DECREF(arr);
    return res;
}

/* ---- Python methods -------------------------------------------------------- */

static PyObject *tensor_to(PyObject *op, PyObject *args, PyObject *kwargs) {
    static char *kw[] = {"device", "dtype", "copy", NULL};
    PyObject *dev_arg = Py_None, *dt_arg = Py_None;
    pxt_py_bool copy = PXT_PY_BOOL("copy");
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|OO$O&:to", kw, &dev_arg, &dt_arg,
                                     pxt_py_bool_converter, &copy)) {
        return NULL;
    }
    pxt_tensor *self = (pxt_tensor *)op;
    pxt_py_device dev = PXT_PY_DEVICE_OPT("device", 1);
    pxt_py_dtype dt = PXT_PY_DTYPE_OPT("dtype", self->dtype);
    dev.value = self->device;
    if (dev_arg != Py_None) {
        /* t.to(pyxtts.bfloat16) reads like torch: a dtype in first place */
        if (dt_arg == Py_None && !PyUnicode_Check(dev_arg) && !PyLong_Check(dev_arg) &&
            pxt_py_dtype_converter(dev_arg, &dt)) {
            dev_arg = Py_None;
        } else {
            PyErr_Clear();
            if (!pxt_py_device_converter(dev_arg, &dev)) {
                return NULL;
            }
        }
    }
    if (!pxt_py_dtype_converter(dt_arg, &dt)) {
        return NULL;
    }
    if (!copy.value && same_device(dev.value, self->device) && dt.value == self->dtype) {
        Py_INCREF(op);
        return op;
    }
    return pxt_tensor_convert(self, dev.value, dt.value);
}

static PyObject *shape_tuple(pxt_tensor *t);

/* Whether the bytes of a and b (same device) share an address. */
static int overlaps(const pxt_tensor *a, const pxt_tensor *b) {
    uintptr_t a0 = (uintptr_t)a->data, b0 = (uintptr_t)b->data;
    return same_device(a->device, b->device) && a0 < b0 + b->nbytes && b0 < a0 + a->nbytes;
}

/* copy_(src): this tensor's elements := src's (any device, any dtype, same shape).
 * Writes in place, so views (named parameters) see the new values. */
static PyObject *tensor_copy_(PyObject *op, PyObject *arg) {
    pxt_tensor *self = (pxt_tensor *)op;
    if (self->readonly) {
        return PyErr_Format(PyExc_ValueError, "copy_: the tensor is read-only");
    }
    if (self->storage && self->storage->busy) {
        return PyErr_Format(PyExc_RuntimeError,
                            "copy_: this tensor is a view of a model's parameters or gradients, "
                            "and a step of that model is running (in another thread); write it "
                            "between steps");
    }
    PyObject *src = pxt_tensor_check(arg) ? Py_NewRef(arg) : pxt_tensor_from_data(arg, NULL, NULL);
    if (!src) {
        return NULL;
    }
    pxt_tensor *s = (pxt_tensor *)src;
    int same = s->ndim == self->ndim;
    for (int i = 0; same && i < s->ndim; i++) {
        same = s->shape[i] == self->shape[i];
    }
    if (!same) {
        PyObject *a = shape_tuple(self), *b = shape_tuple(s);
        if (a && b) {
            PyErr_Format(PyExc_ValueError, "copy_: expected a source of shape %R, got %R", a, b);
        }
        Py_XDECREF(a);
        Py_XDECREF(b);
        Py_DECREF(src);
        return NULL;
    }
    /* bring the source to our device and dtype, then move the bytes */
    PyObject *conv = (same_device(s->device, self->device) && s->dtype == self->dtype)
                         ? Py_NewRef(src)
                         : pxt_tensor_convert(s, self->device, self->dtype);
    Py_DECREF(src);
    if (!conv) {
        return NULL;
    }
    pxt_tensor *c = (pxt_tensor *)conv;
    if (c->nbytes && overlaps(self, c)) { /* two views of one buffer: copy the source first */
        PyObject *staged = pxt_tensor_convert(c, c->device, c->dtype);
        Py_DECREF(conv);
        if (!staged) {
            return NULL;
        }
        conv = staged;
        c = (pxt_tensor *)conv;
    }
    int rc = c->nbytes ? run_copy(pxt_backend_for(self->device.type), self->device.index,
                                  self->data, c->data, c->nbytes, PXT_COPY_D2D)
                       : PXT_OK;
    Py_DECREF(conv);
    if (rc != PXT_OK) {
        return pxt_raise(rc);
    }
    Py_RETURN_NONE;
}

static PyObject *tensor_data_ptr(PyObject *op, PyObject *unused) {
    (void)unused;
    return PyLong_FromVoidPtr(((pxt_tensor *)op)->data);
}

static PyObject *tensor_numel(PyObject *op, PyObject *unused) {
    (void)unused;
    return PyLong_FromLongLong(((pxt_tensor *)op)->numel);
}

static PyObject *shape_tuple(pxt_tensor *t) {
    PyObject *tup = PyTuple_New(t->ndim);
    if (!tup) {
        return NULL;
    }
    for (int i = 0; i < t->ndim; i++) {
        PyObject *v = PyLong_FromLongLong(t->shape[i]);
        if (!v) {
            Py_DECREF(tup);
            return NULL;
        }
        PyTuple_SET_ITEM(tup, i, v);
    }
    return tup;
}

static PyObject *tensor_get_shape(PyObject *op, void *c) {
    (void)c;
    return shape_tuple((pxt_tensor *)op);
}

static PyObject *tensor_get_dtype(PyObject *op, void *c) {
    (void)c;
    PyObject *d = pxt_dtype_object(((pxt_tensor *)op)->dtype);
    Py_INCREF(d);
    return d;
}

static PyObject *tensor_get_device(PyObject *op, void *c) {
    (void)c;
    return pxt_py_device_str(((pxt_tensor *)op)->device);
}

static PyObject *tensor_get_nbytes(PyObject *op, void *c) {
    (void)c;
    return PyLong_FromSize_t(((pxt_tensor *)op)->nbytes);
}

static PyObject *tensor_get_ndim(PyObject *op, void *c) {
    (void)c;
    return PyLong_FromLong(((pxt_tensor *)op)->ndim);
}

static PyObject *tensor_get_itemsize(PyObject *op, void *c) {
    (void)c;
    return PyLong_FromSize_t(pxt_dtype_size(((pxt_tensor *)op)->dtype));
}

static PyObject *tensor_get_is_cuda(PyObject *op, void *c) {
    (void)c;
    return PyBool_FromLong(((pxt_tensor *)op)->device.type == PXT_CUDA);
}

static Py_ssize_t tensor_len(PyObject *op) {
    pxt_tensor *t = (pxt_tensor *)op;
    if (t->ndim == 0) {
        PyErr_SetString(PyExc_TypeError, "len() of a 0-d tensor");
        return -1;
    }
    return (Py_ssize_t)t->shape[0];
}

#define REPR_MAX_ELEMENTS 100000 /* beyond this NumPy would summarise anyway */

static PyObject *tensor_repr(PyObject *op) {
    pxt_tensor *t = (pxt_tensor *)op;
    PyObject *shape = shape_tuple(t);
    PyObject *dev = pxt_py_device_str(t->device);
    PyObject *values = NULL;
    if (t->numel <= REPR_MAX_ELEMENTS) {
        PyObject *arr = tensor_numpy(op, NULL);
        if (arr) {
            values = PyObject_Str(arr);
            Py_DECREF(arr);
        }
        if (!values) {
            PyErr_Clear(); /* a repr never fails because of the values */
        }
    }
    PyObject *res = NULL;
    if (shape && dev) {
        if (values) {
            res = PyUnicode_FromFormat("pyxtts.Tensor(shape=%R, dtype=%s, device='%U')\n%U", shape,
                                       pxt_dtype_name(t->dtype), dev, values);
        } else {
            res = PyUnicode_FromFormat("pyxtts.Tensor(shape=%R, dtype=%s, device='%U')", shape,
                                       pxt_dtype_name(t->dtype), dev);
        }
    }
    Py_XDECREF(shape);
    Py_XDECREF(dev);
    Py_XDECREF(values);
    return res;
}

static PyMethodDef tensor_methods[] = {
    {"numpy", tensor_numpy, METH_NOARGS,
     "numpy() -> a copy as a NumPy array (bfloat16 as ml_dtypes.bfloat16)."},
    {"to", (PyCFunction)(void (*)(void))tensor_to, METH_VARARGS | METH_KEYWORDS,
     "to(device=None, dtype=None, *, copy=False) -> the tensor on that device and dtype.\n"
     "Returns self when nothing changes (unless copy=True). Floats round to nearest even."},
    {"data_ptr", tensor_data_ptr, METH_NOARGS, "Address of the first element (device pointer)."},
    {"copy_", tensor_copy_, METH_O, "copy_(src): overwrite the elements with src's (converted)."},
    {"numel", tensor_numel, METH_NOARGS, "Number of elements."},
    {"__array__", (PyCFunction)(void (*)(void))tensor_array, METH_VARARGS | METH_KEYWORDS, NULL},
    {"__dlpack__", (PyCFunction)(void (*)(void))pxt_tensor_dlpack, METH_VARARGS | METH_KEYWORDS,
     "__dlpack__(*, stream=None, max_version=None, dl_device=None, copy=None) -> capsule."},
    {"__dlpack_device__", pxt_tensor_dlpack_device, METH_NOARGS,
     "(device_type, device_id) as DLPack numbers them."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef tensor_getset[] = {
    {"shape", tensor_get_shape, NULL, "tuple of sizes", NULL},
    {"dtype", tensor_get_dtype, NULL, "element type (pyxtts.float32, ...)", NULL},
    {"device", tensor_get_device, NULL, "'cpu' or 'cuda:N'", NULL},
    {"nbytes", tensor_get_nbytes, NULL, "bytes of data", NULL},
    {"ndim", tensor_get_ndim, NULL, "number of dimensions", NULL},
    {"itemsize", tensor_get_itemsize, NULL, "bytes per element", NULL},
    {"is_cuda", tensor_get_is_cuda, NULL, "True on a GPU", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods tensor_as_sequence = {.sq_length = tensor_len};

static PyObject *tensor_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    (void)type;
    static char *kw[] = {"data", "dtype", "device", NULL};
    PyObject *data, *dtype = Py_None, *device = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|OO:Tensor", kw, &data, &dtype, &device)) {
        return NULL;
    }
    return pxt_tensor_from_data(data, dtype, device);
}

PyTypeObject pxt_tensor_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "pyxtts.Tensor",
    .tp_basicsize = sizeof(pxt_tensor),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Tensor(data, dtype=None, device='cpu'): a contiguous array in a device's memory.",
    .tp_new = tensor_new,
    .tp_dealloc = (destructor)tensor_dealloc,
    .tp_traverse = (traverseproc)tensor_traverse,
    .tp_clear = (inquiry)tensor_clear,
    .tp_repr = tensor_repr,
    .tp_as_sequence = &tensor_as_sequence,
    .tp_methods = tensor_methods,
    .tp_getset = tensor_getset,
    .tp_weaklistoffset = offsetof(pxt_tensor, weakreflist),
};

int pxt_tensor_init_type(PyObject *module) {
    return PyModule_AddType(module, &pxt_tensor_type); /* readies it; the name after the last dot */
}

#undef REPR_MAX_ELEMENTS
