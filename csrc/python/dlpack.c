/* dlpack.c: DLPack export (__dlpack__) and import (from_dlpack).
 *
 * Zero-copy whenever the devices agree and the producer's memory is
 * C-contiguous; a strided CPU producer is gathered into a fresh tensor. */
#include "convert.h" /* Python.h (through tensor.h) before any system header */

#include <stdlib.h>
#include <string.h>

#include "dlpack.h"

/* ---- export ---------------------------------------------------------------- */

/* Everything a consumer holds: the managed struct (either layout), the shape
 * and strides it points at, and the tensor that owns the memory. */
typedef struct {
    DLManagedTensor legacy;
    DLManagedTensorVersioned versioned;
    int64_t shape[PXT_MAX_DIMS];
    int64_t strides[PXT_MAX_DIMS];
    PyObject *owner;
} export_ctx;

/* Deleters may run on any thread, with or without the GIL. */
static void export_release(export_ctx *ctx) {
    if (Py_IsInitialized()) {
        PyGILState_STATE g = PyGILState_Ensure();
        Py_XDECREF(ctx->owner);
        PyGILState_Release(g);
    }
    free(ctx);
}

static void legacy_deleter(DLManagedTensor *m) { export_release(m->manager_ctx); }
static void versioned_deleter(DLManagedTensorVersioned *m) { export_release(m->manager_ctx); }

/* Capsules nobody consumed free their tensor themselves. */
static void legacy_capsule_destructor(PyObject *cap) {
    if (PyCapsule_IsValid(cap, "dltensor")) {
        DLManagedTensor *m = PyCapsule_GetPointer(cap, "dltensor");
        if (m && m->deleter) {
            m->deleter(m);
        }
    }
}

static void versioned_capsule_destructor(PyObject *cap) {
    if (PyCapsule_IsValid(cap, "dltensor_versioned")) {
        DLManagedTensorVersioned *m = PyCapsule_GetPointer(cap, "dltensor_versioned");
        if (m && m->deleter) {
            m->deleter(m);
        }
    }
}

static DLDataType dl_dtype(pxt_dtype t) {
    DLDataType d = {kDLFloat, 32, 1};
    switch (t) {
    case PXT_FLOAT32:
        d.code = kDLFloat;
        d.bits = 32;
        break;
    case PXT_FLOAT16:
        d.code = kDLFloat;
        d.bits = 16;
        break;
    case PXT_BFLOAT16:
        d.code = kDLBfloat;
        d.bits = 16;
        break;
    case PXT_INT32:
        d.code = kDLInt;
        d.bits = 32;
        break;
    case PXT_INT64:
        d.code = kDLInt;
        d.bits = 64;
        break;
    case PXT_UINT8:
        d.code = kDLUInt;
        d.bits = 8;
        break;
    case PXT_BOOL:
        d.code = kDLBool;
        d.bits = 8;
        break;
    default: break;
    }
    return d;
}

static int parse_dl_device(PyObject *obj, int32_t *type, int32_t *id) {
    if (!PyArg_ParseTuple(obj, "ii", type, id)) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError,
                     "dl_device: expected a (device_type, device_id) tuple, "
                     "got %R",
                     obj);
        return -1;
    }
    return 0;
}

PyObject *pxt_tensor_dlpack(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kw[] = {"stream", "max_version", "dl_device", "copy", NULL};
    PyObject *stream = Py_None, *max_version = Py_None, *dl_device = Py_None, *copy = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|$OOOO:__dlpack__", kw, &stream, &max_version,
                                     &dl_device, &copy)) {
        return NULL;
    }
    pxt_tensor *t = (pxt_tensor *)self;
    int versioned = 0;
    if (max_version != Py_None) {
        int major, minor;
        if (!PyArg_ParseTuple(max_version, "ii", &major, &minor)) {
            PyErr_Clear();
            return PyErr_Format(PyExc_TypeError, "max_version: expected (major, minor), got %R",
                                max_version);
        }
        versioned = major >= 1;
    }
    pxt_device target = t->device;
    if (dl_device != Py_None) {
        int32_t type, id;
        if (parse_dl_device(dl_device, &type, &id) < 0) {
            return NULL;
        }
        if (type == kDLCPU) {
            target = (pxt_device){PXT_CPU, 0};
        } else if (type == kDLCUDA) {
            target = (pxt_device){PXT_CUDA, id};
        } else {
            return PyErr_Format(PyExc_BufferError, "dl_device: device type %d is not supported",
                                (int)type);
        }
    }
    int moves = target.type != t->device.type || target.index != t->device.index;
    /* the legacy capsule cannot say read-only: a consumer would write through it
     * (NumPy refuses the same export) */
    if (t->readonly && !versioned && !moves && copy != Py_True) {
        return PyErr_Format(PyExc_BufferError,
                            "__dlpack__: a read-only tensor cannot be exported without "
                            "max_version >= (1, 0) (the legacy capsule has no read-only flag); "
                            "pass max_version=(1, 0), or copy=True for a writable copy");
    }
    if (moves && copy == Py_False) {
        return PyErr_Format(PyExc_BufferError, "dl_device differs from the tensor's device and "
                                               "copy=False forbids the copy that would need");
    }
    if (moves && pxt_py_check_device_exists(target, "dl_device") < 0) {
        return NULL;
    }
    PyObject *owner;
    if (moves || copy == Py_True) {
        owner = pxt_tensor_convert(t, target, t->dtype);
    } else {
        owner = self;
        Py_INCREF(owner);
    }
    if (!owner) {
        return NULL;
    }
    pxt_tensor *o = (pxt_tensor *)owner;
    /* our queue is the legacy default stream: finishing it makes the data safe
     * for any consumer stream (stream -1 means the consumer will not wait) */
    int no_wait = 0;
    if (PyLong_Check(stream)) {
        long long sv = PyLong_AsLongLong(stream);
        if (sv == -1 && PyErr_Occurred()) {
            PyErr_Clear(); /* a stream handle beyond long long: not -1 */
        } else {
            no_wait = sv == -1;
        }
    }
    if (o->device.type == PXT_CUDA && !no_wait) {
        int rc = pxt_backend_for(PXT_CUDA)->synchronize(o->device.index);
        if (rc != PXT_OK) {
            Py_DECREF(owner);
            return pxt_raise(rc);
        }
    }
    export_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx) {
        Py_DECREF(owner);
        return PyErr_NoMemory();
    }
    ctx->owner = owner;
    int64_t stride = 1;
    for (int i = o->ndim - 1; i >= 0; i--) {
        ctx->shape[i] = o->shape[i];
        ctx->strides[i] = stride;
        stride *= o->shape[i] > 0 ? o->shape[i] : 1;
    }
    DLTensor dl = {
        .data = o->data,
        .device = {o->device.type == PXT_CPU ? kDLCPU : kDLCUDA, o->device.index},
        .ndim = o->ndim,
        .dtype = dl_dtype(o->dtype),
        .shape = ctx->shape,
        .strides = ctx->strides,
        .byte_offset = 0,
    };
    PyObject *cap;
    if (versioned) {
        ctx->versioned.version = (DLPackVersion){DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION};
        ctx->versioned.manager_ctx = ctx;
        ctx->versioned.deleter = versioned_deleter;
        ctx->versioned.flags = (owner != self ? DLPACK_FLAG_BITMASK_IS_COPIED : 0) |
                               (o->readonly ? DLPACK_FLAG_BITMASK_READ_ONLY : 0);
        ctx->versioned.dl_tensor = dl;
        cap = PyCapsule_New(&ctx->versioned, "dltensor_versioned", versioned_capsule_destructor);
    } else {
        ctx->legacy.dl_tensor = dl;
        ctx->legacy.manager_ctx = ctx;
        ctx->legacy.deleter = legacy_deleter;
        cap = PyCapsule_New(&ctx->legacy, "dltensor", legacy_capsule_destructor);
    }
    if (!cap) {
        Py_DECREF(owner);
        free(ctx);
    }
    return cap;
}

PyObject *pxt_tensor_dlpack_device(PyObject *self, PyObject *unused) {
    (void)unused;
    pxt_tensor *t = (pxt_tensor *)self;
    return Py_BuildValue("(ii)", t->device.type == PXT_CPU ? kDLCPU : kDLCUDA, t->device.index);
}

/* ---- import ---------------------------------------------------------------- */

/* Owns a consumed managed tensor; frees it through the producer's deleter. */
typedef struct {
    void *managed;
    int versioned;
} import_ctx;

/* Called with the GIL. The producer's deleter may run Python code (a capsule
 * from Python, a finaliser), which must not see an exception we are raising. */
static void import_release(import_ctx *c) {
    pxt_py_pending pending;
    pxt_py_pending_take(&pending);
    if (c->versioned) {
        DLManagedTensorVersioned *m = c->managed;
        if (m->deleter) {
            m->deleter(m);
        }
    } else {
        DLManagedTensor *m = c->managed;
        if (m->deleter) {
            m->deleter(m);
        }
    }
    free(c);
    pxt_py_pending_restore(&pending);
}

static void owner_destructor(PyObject *cap) {
    import_release(PyCapsule_GetPointer(cap, "pyxtts.dlpack_owner"));
}

static int from_dl_dtype(DLDataType d, pxt_dtype *out) {
    if (d.lanes != 1) {
        goto bad;
    }
    if (d.code == kDLFloat && d.bits == 32) {
        *out = PXT_FLOAT32;
    } else if (d.code == kDLFloat && d.bits == 16) {
        *out = PXT_FLOAT16;
    } else if (d.code == kDLBfloat && d.bits == 16) {
        *out = PXT_BFLOAT16;
    } else if (d.code == kDLInt && d.bits == 32) {
        *out = PXT_INT32;
    } else if (d.code == kDLInt && d.bits == 64) {
        *out = PXT_INT64;
    } else if (d.code == kDLUInt && d.bits == 8) {
        *out = PXT_UINT8;
    } else if (d.code == kDLBool && d.bits == 8) {
        *out = PXT_BOOL;
    } else {
        goto bad;
    }
    return 0;
bad:
    PyErr_Format(PyExc_TypeError,
                 "from_dlpack: DLPack dtype (code %d, bits %d, lanes %d) has "
                 "no pyxtts equivalent",
                 d.code, d.bits, d.lanes);
    return -1;
}

/* Copies a strided host array into contiguous dst, element by element. */
static void gather_strided(char *dst, const char *src, int ndim, const int64_t *shape,
                           const int64_t *strides, size_t item) {
    int64_t idx[PXT_MAX_DIMS] = {0};
    int64_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        numel *= shape[i];
    }
    for (int64_t n = 0; n < numel; n++) {
        int64_t off = 0;
        for (int i = 0; i < ndim; i++) {
            off += idx[i] * strides[i];
        }
        memcpy(dst + (size_t)n * item, src + off * (int64_t)item, item);
        for (int i = ndim - 1; i >= 0; i--) { /* odometer */
            if (++idx[i] < shape[i]) {
                break;
            }
            idx[i] = 0;
        }
    }
}

static PyObject *call_dlpack(PyObject *obj, int32_t dev_type) {
    PyObject *meth = PyObject_GetAttrString(obj, "__dlpack__");
    if (!meth) {
        return NULL;
    }
    PyObject *kwargs = PyDict_New();
    PyObject *empty = PyTuple_New(0);
    PyObject *cap = NULL;
    if (!kwargs || !empty) {
        goto done;
    }
    /* a CUDA producer orders its work before our (legacy default) stream */
    if (dev_type == kDLCUDA) {
        PyObject *one = PyLong_FromLong(1);
        if (!one || PyDict_SetItemString(kwargs, "stream", one) < 0) {
            Py_XDECREF(one);
            goto done;
        }
        Py_DECREF(one);
    }
    PyObject *ver = Py_BuildValue("(ii)", DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION);
    if (!ver || PyDict_SetItemString(kwargs, "max_version", ver) < 0) {
        Py_XDECREF(ver);
        goto done;
    }
    Py_DECREF(ver);
    cap = PyObject_Call(meth, empty, kwargs);
    if (!cap && PyErr_ExceptionMatches(PyExc_TypeError)) { /* a pre-1.0 producer */
        PyErr_Clear();
        if (PyDict_DelItemString(kwargs, "max_version") == 0) {
            cap = PyObject_Call(meth, empty, kwargs);
        }
    }
done:
    Py_XDECREF(kwargs);
    Py_XDECREF(empty);
    Py_DECREF(meth);
    return cap;
}

PyObject *pxt_from_dlpack(PyObject *module, PyObject *args, PyObject *kwargs) {
    (void)module;
    static char *kw[] = {"obj", NULL};
    PyObject *obj;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O:from_dlpack", kw, &obj)) {
        return NULL;
    }
    PyObject *cap;
    if (PyCapsule_CheckExact(obj)) {
        Py_INCREF(obj);
        cap = obj;
    } else {
        if (!PyObject_HasAttrString(obj, "__dlpack__")) {
            return PyErr_Format(PyExc_TypeError,
                                "from_dlpack: obj must implement __dlpack__ "
                                "(a NumPy array, a torch tensor, ...), got %.100s",
                                Py_TYPE(obj)->tp_name);
        }
        int32_t dev_type = kDLCPU, dev_id = 0;
        PyObject *dev = PyObject_CallMethod(obj, "__dlpack_device__", NULL);
        if (!dev) {
            return NULL;
        }
        int ok = parse_dl_device(dev, &dev_type, &dev_id);
        Py_DECREF(dev);
        if (ok < 0) {
            return NULL;
        }
        cap = call_dlpack(obj, dev_type);
        if (!cap) {
            /* the producer's own refusal ("DLPack only supports native byte order.") */
            return PyErr_ExceptionMatches(PyExc_BufferError)
                       ? pxt_reraise_named(PyExc_BufferError,
                                           "from_dlpack: obj's __dlpack__ refused to export it")
                       : NULL;
        }
    }
    int versioned = PyCapsule_IsValid(cap, "dltensor_versioned");
    if (!versioned && !PyCapsule_IsValid(cap, "dltensor")) {
        Py_DECREF(cap);
        return PyErr_Format(PyExc_ValueError, "from_dlpack: not a live DLPack capsule (already "
                                              "consumed, or a foreign object)");
    }
    void *managed = PyCapsule_GetPointer(cap, versioned ? "dltensor_versioned" : "dltensor");
    DLTensor *dl;
    int readonly = 0;
    if (versioned) {
        DLManagedTensorVersioned *m = managed;
        if (m->version.major != DLPACK_MAJOR_VERSION) {
            Py_DECREF(cap);
            return PyErr_Format(PyExc_BufferError,
                                "from_dlpack: DLPack major version %u is not "
                                "supported (pyxtts reads %d)",
                                m->version.major, DLPACK_MAJOR_VERSION);
        }
        dl = &m->dl_tensor;
        readonly = (m->flags & DLPACK_FLAG_BITMASK_READ_ONLY) != 0;
    } else {
        dl = &((DLManagedTensor *)managed)->dl_tensor;
    }
    pxt_device device;
    pxt_dtype dt;
    PyObject *result = NULL;
    if (dl->device.device_type == kDLCPU || dl->device.device_type == kDLCUDAHost) {
        device = (pxt_device){PXT_CPU, 0};
    } else if (dl->device.device_type == kDLCUDA) {
        device = (pxt_device){PXT_CUDA, dl->device.device_id};
    } else {
        PyErr_Format(PyExc_BufferError,
                     "from_dlpack: DLPack device type %d is not supported "
                     "(cpu and cuda are)",
                     (int)dl->device.device_type);
        goto fail;
    }
    if (device.type == PXT_CUDA && !pxt_allocator_get(device)) {
        pxt_raise(PXT_ERR_VALUE);
        goto fail;
    }
    if (from_dl_dtype(dl->dtype, &dt) < 0) {
        goto fail;
    }
    if (dl->ndim < 0 || dl->ndim > PXT_MAX_DIMS) {
        PyErr_Format(PyExc_ValueError, "from_dlpack: at most %d dimensions, got %d", PXT_MAX_DIMS,
                     (int)dl->ndim);
        goto fail;
    }
    /* checked before the capsule is consumed, so a rejected one stays the caller's:
     * sizes >= 0 and not too many elements, the rule of every tensor */
    int64_t numel;
    if (pxt_tensor_shape_numel("from_dlpack: shape", dl->ndim, dl->shape, &numel) < 0) {
        goto fail;
    }
    int contiguous = 1;
    if (dl->strides) {
        /* expect: dim i's stride in C order, the product of the sizes after it. The
         * sizes after a 0 are not bounded (the tensor is empty), so it may pass
         * int64_t (huge): no stride equals it then. */
        size_t expect = 1;
        int huge = 0;
        for (int i = dl->ndim - 1; i >= 0; i--) {
            if (dl->shape[i] != 1 && (huge || dl->strides[i] != (int64_t)expect)) {
                contiguous = 0;
            }
            huge = huge || !pxt_mul_ok(expect, (size_t)dl->shape[i], &expect) || expect > INT64_MAX;
        }
    }
    char *data = (char *)dl->data + dl->byte_offset;
    import_ctx *ic = malloc(sizeof *ic);
    if (!ic) {
        PyErr_NoMemory();
        goto fail;
    }
    /* the capsule is ours now: rename it so its destructor leaves it alone */
    if (PyCapsule_SetName(cap, versioned ? "used_dltensor_versioned" : "used_dltensor") < 0) {
        free(ic);
        goto fail;
    }
    ic->managed = managed;
    ic->versioned = versioned;
    if (contiguous) {
        PyObject *owner = PyCapsule_New(ic, "pyxtts.dlpack_owner", owner_destructor);
        if (!owner) {
            import_release(ic);
            goto done;
        }
        result = pxt_tensor_borrow(owner, data, device, dt, dl->ndim, dl->shape, readonly);
        Py_DECREF(owner); /* the tensor holds it now (or it is released here) */
    } else if (device.type == PXT_CPU) {
        result = pxt_tensor_empty(device, dt, dl->ndim, dl->shape);
        if (result) {
            gather_strided(((pxt_tensor *)result)->data, data, dl->ndim, dl->shape, dl->strides,
                           pxt_dtype_size(dt));
        }
        import_release(ic);
    } else {
        PyErr_SetString(PyExc_ValueError, "from_dlpack: a non-contiguous CUDA tensor cannot be "
                                          "imported; call .contiguous() on it first");
        import_release(ic);
    }
done:
    Py_DECREF(cap);
    return result;
fail:
    Py_DECREF(cap); /* unconsumed: the capsule's destructor frees the producer's tensor */
    return NULL;
}
