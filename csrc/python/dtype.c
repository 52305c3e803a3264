/* dtype.c: pyxtts.dtype objects (pyxtts.float32, ...) and their NumPy mapping. */
#include "tensor.h"

#define NO_IMPORT_ARRAY
#define PY_ARRAY_UNIQUE_SYMBOL pxt_ARRAY_API
#define NPY_NO_DEPRECATED_API NPY_2_0_API_VERSION
#include <numpy/arrayobject.h>

typedef struct {
    PyObject_HEAD
    pxt_dtype t;
} pxt_dtype_obj;

static PyObject *dtype_objs[PXT_NUM_DTYPES];
static PyObject *bfloat16_descr; /* ml_dtypes.bfloat16, imported on first use */

static PyObject *dtype_repr(PyObject *self) {
    return PyUnicode_FromFormat("pyxtts.%s", pxt_dtype_name(((pxt_dtype_obj *)self)->t));
}

static PyObject *dtype_get_name(PyObject *self, void *c) {
    (void)c;
    return PyUnicode_FromString(pxt_dtype_name(((pxt_dtype_obj *)self)->t));
}

static PyObject *dtype_get_itemsize(PyObject *self, void *c) {
    (void)c;
    return PyLong_FromSize_t(pxt_dtype_size(((pxt_dtype_obj *)self)->t));
}

static PyObject *dtype_get_is_float(PyObject *self, void *c) {
    (void)c;
    return PyBool_FromLong(pxt_dtype_is_float(((pxt_dtype_obj *)self)->t));
}

static PyObject *dtype_get_numpy(PyObject *self, void *c) {
    (void)c;
    return pxt_dtype_to_descr(((pxt_dtype_obj *)self)->t);
}

static PyObject *dtype_reduce(PyObject *self, PyObject *unused) {
    (void)unused; /* pickles as the module attribute of the same name */
    return PyUnicode_FromString(pxt_dtype_name(((pxt_dtype_obj *)self)->t));
}

static PyGetSetDef dtype_getset[] = {
    {"name", dtype_get_name, NULL, "name, e.g. 'bfloat16'", NULL},
    {"itemsize", dtype_get_itemsize, NULL, "bytes per element", NULL},
    {"is_floating_point", dtype_get_is_float, NULL, "True for float32/float16/bfloat16", NULL},
    {"numpy", dtype_get_numpy, NULL, "the NumPy dtype (ml_dtypes.bfloat16 for bfloat16)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef dtype_methods[] = {
    {"__reduce__", dtype_reduce, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject dtype_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "pyxtts.dtype",
    .tp_basicsize = sizeof(pxt_dtype_obj),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "An element type of pyxtts tensors.",
    .tp_repr = dtype_repr,
    .tp_getset = dtype_getset,
    .tp_methods = dtype_methods,
};

int pxt_dtype_init(PyObject *module) {
    if (PyType_Ready(&dtype_type) < 0) {
        return -1;
    }
    for (int t = 0; t < PXT_NUM_DTYPES; t++) {
        pxt_dtype_obj *o = PyObject_New(pxt_dtype_obj, &dtype_type);
        if (!o) {
            return -1;
        }
        o->t = (pxt_dtype)t;
        dtype_objs[t] = (PyObject *)o;
        Py_INCREF(o); /* one reference stays here, one goes to the module */
        if (PyModule_AddObject(module, pxt_dtype_name((pxt_dtype)t), (PyObject *)o) < 0) {
            Py_DECREF(o);
            return -1;
        }
    }
    Py_INCREF(&dtype_type);
    if (PyModule_AddObject(module, "dtype", (PyObject *)&dtype_type) < 0) {
        Py_DECREF(&dtype_type);
        return -1;
    }
    return 0;
}

PyObject *pxt_dtype_object(pxt_dtype t) { return dtype_objs[t]; }

static PyObject *bfloat16(void) {
    if (!bfloat16_descr) {
        PyObject *mod = PyImport_ImportModule("ml_dtypes");
        if (!mod) {
            return NULL;
        }
        PyObject *type = PyObject_GetAttrString(mod, "bfloat16");
        Py_DECREF(mod);
        if (!type) {
            return NULL;
        }
        PyArray_Descr *d = NULL;
        int ok = PyArray_DescrConverter(type, &d);
        Py_DECREF(type);
        if (!ok) {
            return NULL;
        }
        bfloat16_descr = (PyObject *)d;
    }
    return bfloat16_descr;
}

PyObject *pxt_dtype_to_descr(pxt_dtype t) {
    switch (t) {
    case PXT_FLOAT32: return (PyObject *)PyArray_DescrFromType(NPY_FLOAT32);
    case PXT_FLOAT16: return (PyObject *)PyArray_DescrFromType(NPY_FLOAT16);
    case PXT_INT32: return (PyObject *)PyArray_DescrFromType(NPY_INT32);
    case PXT_INT64: return (PyObject *)PyArray_DescrFromType(NPY_INT64);
    case PXT_UINT8: return (PyObject *)PyArray_DescrFromType(NPY_UINT8);
    case PXT_BOOL: return (PyObject *)PyArray_DescrFromType(NPY_BOOL);
    case PXT_BFLOAT16: {
        PyObject *d = bfloat16();
        Py_XINCREF(d);
        return d;
    }
    default: break;
    }
    PyErr_SetString(PyExc_SystemError, "pyxtts: unknown dtype code");
    return NULL;
}

int pxt_dtype_from_descr(PyObject *descr, pxt_dtype *out) {
    PyArray_Descr *d = (PyArray_Descr *)descr;
    npy_intp size = PyDataType_ELSIZE(d);
    switch (d->kind) {
    case 'f':
        if (size == 4) {
            *out = PXT_FLOAT32;
            return 1;
        }
        if (size == 2) {
            *out = PXT_FLOAT16;
            return 1;
        }
        return 0;
    case 'i':
        if (size == 4) {
            *out = PXT_INT32;
            return 1;
        }
        if (size == 8) {
            *out = PXT_INT64;
            return 1;
        }
        return 0;
    case 'u':
        if (size == 1) {
            *out = PXT_UINT8;
            return 1;
        }
        return 0;
    case 'b': *out = PXT_BOOL; return 1;
    case 'V':
    case 'T':
        if (size == 2) { /* ml_dtypes registers bfloat16 as a 2-byte user type */
            PyObject *bf = bfloat16();
            if (!bf) {
                return -1;
            }
            if (((PyArray_Descr *)bf)->typeobj == d->typeobj) {
                *out = PXT_BFLOAT16;
                return 1;
            }
        }
        return 0;
    default: return 0;
    }
}

int pxt_dtype_object_value(PyObject *obj, pxt_dtype *out) {
    if (!Py_IS_TYPE(obj, &dtype_type)) {
        return 0;
    }
    *out = ((pxt_dtype_obj *)obj)->t;
    return 1;
}
