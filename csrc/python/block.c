/* block.c: pyxtts.Block, the type object over the engine's standalone block
 * (engine/block_model.h): one pre-LayerNorm GPT-2 block, optionally with
 * cross-attention, on the same block.c code as the model.
 *
 * forward() returns y as a view of the arena's output slot and backward() dx
 * (and dcontext) as views of its gradient slots: they stay valid until this
 * block's next forward (y) or backward (dx, dcontext), like the activations of
 * any arena; copy them (.numpy(), .to()) to keep them.
 *
 * Every argument is checked before any work; an out-of-memory error can only
 * come from reserving the arena, before anything else changed. */
#include "module.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#define NO_IMPORT_ARRAY
#define PY_ARRAY_UNIQUE_SYMBOL pxt_ARRAY_API
#define NPY_NO_DEPRECATED_API NPY_2_0_API_VERSION
#include <numpy/arrayobject.h>

#include "engine/block_model.h"

typedef struct {
    PyObject_HEAD
    pxt_block_model m;
    int ready; /* __init__ succeeded */
    int busy;  /* a forward/backward runs with the GIL released */
} pxt_py_block;

static PyTypeObject block_type;

/* ---- init ----------------------------------------------------------------------- */

static int block_init(PyObject *op, PyObject *args, PyObject *kwargs) {
    pxt_py_block *o = (pxt_py_block *)op;
    static char *kw[] = {"d_model", "n_heads", "cross_attention", "checkpointing",
                         "device",  "seed",    "layer_norm_eps",  NULL};
    pxt_py_int C = PXT_PY_INT("d_model", 1, 1 << 24), H = PXT_PY_INT("n_heads", 1, INT_MAX);
    pxt_py_choice ckpt = PXT_PY_CHOICE("checkpointing", pxt_py_block_ckpt_names);
    pxt_py_device dev = PXT_PY_DEVICE_OPT("device", 1);
    pxt_py_u64 seed = PXT_PY_U64_OPT("seed", 0);
    pxt_py_real eps =
        PXT_PY_REAL("layer_norm_eps", 0.0, 1, INFINITY, 1, "a finite number > 0 (in float32)");
    eps.f32 = 1;
    eps.value = 1e-5;
    pxt_py_bool cross = PXT_PY_BOOL("cross_attention");
    if (o->ready) {
        PyErr_SetString(PyExc_RuntimeError, "Block.__init__ called twice");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O&O&|O&O&O&O&O&:Block", kw,
                                     pxt_py_int_converter, &C, pxt_py_int_converter, &H,
                                     pxt_py_bool_converter, &cross, pxt_py_choice_converter, &ckpt,
                                     pxt_py_device_converter, &dev, pxt_py_u64_converter, &seed,
                                     pxt_py_real_converter, &eps)) {
        return -1;
    }
    if (C.value % H.value != 0) {
        PyErr_Format(PyExc_ValueError,
                     "n_heads: expected a positive divisor of d_model (%lld), "
                     "got %lld",
                     C.value, H.value);
        return -1;
    }
    if (!((float)eps.value > 0.0f)) {
        char msg[96]; /* PyErr_Format has no %g */
        snprintf(msg, sizeof msg,
                 "layer_norm_eps: expected a finite number > 0 (in float32), got %g", eps.value);
        PyErr_SetString(PyExc_ValueError, msg);
        return -1;
    }
    int rc = pxt_block_model_init(&o->m, (int)C.value, (int)H.value, cross.value, (float)eps.value,
                                  dev.value, (pxt_ckpt)ckpt.index, seed.value);
    if (rc != PXT_OK) {
        return pxt_raise_int(rc);
    }
    o->ready = 1;
    return 0;
}

static void block_dealloc(PyObject *op) {
    pxt_py_block *o = (pxt_py_block *)op;
    pxt_block_model_free(&o->m);
    Py_TYPE(op)->tp_free(op);
}

/* The engine block of an initialised Block, else NULL with RuntimeError. */
static pxt_block_model *ready(PyObject *op) {
    pxt_py_block *o = (pxt_py_block *)op;
    if (o->ready) {
        return &o->m;
    }
    PyErr_SetString(PyExc_RuntimeError, "this Block is not initialised (__init__ failed or was "
                                        "not called)");
    return NULL;
}

/* An initialised Block with no call running, else NULL with RuntimeError. */
static pxt_block_model *idle(PyObject *op, const char *what) {
    pxt_block_model *m = ready(op);
    if (m && ((pxt_py_block *)op)->busy) {
        PyErr_Format(PyExc_RuntimeError,
                     "%s: this Block is running a forward or backward (in "
                     "another thread); calls on one block must not overlap",
                     what);
        return NULL;
    }
    return m;
}

/* ---- views ---------------------------------------------------------------------- */

static PyObject *block_parameters(PyObject *op, PyObject *unused) {
    (void)unused;
    pxt_block_model *m = ready(op);
    return m ? pxt_tensor_flat_views(&m->flat.layout, m->flat.params, m->flat.dt) : NULL;
}

static PyObject *block_gradients(PyObject *op, PyObject *unused) {
    (void)unused;
    pxt_block_model *m = ready(op);
    return m ? pxt_tensor_flat_views(&m->flat.layout, m->flat.grads, PXT_FLOAT32) : NULL;
}

static PyObject *block_zero_grad(PyObject *op, PyObject *unused) {
    (void)unused;
    pxt_block_model *m = idle(op, "zero_grad");
    if (!m) {
        return NULL;
    }
    int rc = pxt_flat_zero_grad(&m->flat);
    if (rc != PXT_OK) {
        return pxt_raise(rc);
    }
    Py_RETURN_NONE;
}

/* ---- arguments ------------------------------------------------------------------ */

/* A float32 input: a Tensor on the block's device, or host data NumPy can view
 * (copied to the device with the rest of the inputs). */
typedef struct {
    PyObject *owner; /* keeps data alive: the Tensor or a C-contiguous ndarray */
    const char *data;
    int host; /* data is host memory */
    int ndim;
    int64_t shape[PXT_MAX_DIMS];
} float_input;

static void float_input_free(float_input *in) { Py_CLEAR(in->owner); }

static int get_float_input(const pxt_block_model *m, PyObject *obj, const char *name,
                           const char *dims, float_input *in) {
    memset(in, 0, sizeof *in);
    if (obj == Py_None) {
        PyErr_Format(PyExc_TypeError,
                     "%s: expected a float32 pyxtts.Tensor or array of shape "
                     "%s, got None",
                     name, dims);
        return -1;
    }
    if (pxt_tensor_check(obj)) {
        pxt_tensor *t = (pxt_tensor *)obj;
        if (pxt_py_check_device(t, name, m->flat.device) < 0 ||
            pxt_py_check_dtype(t, name, PXT_FLOAT32) < 0) {
            return -1;
        }
        in->owner = Py_NewRef(obj);
        in->data = t->data;
        in->host = t->device.type == PXT_CPU;
        in->ndim = t->ndim;
        memcpy(in->shape, t->shape, sizeof in->shape);
        return 0;
    }
    PyArrayObject *arr = (PyArrayObject *)PyArray_FromAny(obj, NULL, 0, 0, 0, NULL);
    if (!arr) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError,
                     "%s: expected a float32 pyxtts.Tensor or array of shape "
                     "%s, got %.100s",
                     name, dims, Py_TYPE(obj)->tp_name);
        return -1;
    }
    if (PyArray_TYPE(arr) != NPY_FLOAT32) {
        PyErr_Format(PyExc_TypeError, "%s: expected dtype float32, got %R (%.100s)", name,
                     (PyObject *)PyArray_DESCR(arr), Py_TYPE(obj)->tp_name);
        Py_DECREF(arr);
        return -1;
    }
    if (PyArray_NDIM(arr) > PXT_MAX_DIMS) {
        PyErr_Format(PyExc_ValueError, "%s: expected shape %s, got %d dimensions", name, dims,
                     PyArray_NDIM(arr));
        Py_DECREF(arr);
        return -1;
    }
    in->owner = (PyObject *)arr; /* data comes with float_input_data, once sizes are checked */
    in->host = 1;
    in->ndim = PyArray_NDIM(arr);
    for (int i = 0; i < in->ndim; i++) {
        in->shape[i] = PyArray_DIM(arr, i);
    }
    return 0;
}

/* The data pointer, after the shape checks: an array becomes native C order
 * (a no-op for the usual array; a copy for strided or byte-swapped ones). */
static int float_input_data(float_input *in) {
    if (in->data) {
        return 0;
    }
    PyArrayObject *c = (PyArrayObject *)PyArray_FromAny(
        in->owner, PyArray_DescrFromType(NPY_FLOAT32), 0, 0, NPY_ARRAY_IN_ARRAY, NULL);
    if (!c) {
        return -1;
    }
    Py_SETREF(in->owner, (PyObject *)c);
    in->data = PyArray_DATA(c);
    return 0;
}

/* NaN or infinity anywhere in n floats: on the host a scan, on a device its sum. */
static int check_finite(const pxt_block_model *m, const float_input *in, size_t n,
                        const char *name) {
    int bad = 0;
    if (in->host) {
        const float *f = (const float *)in->data;
        for (size_t i = 0; i < n && !bad; i++) {
            bad = !isfinite(f[i]);
        }
    } else {
        double s = 0.0;
        int rc = m->flat.be->sum(m->flat.device.index, &s, (const float *)in->data, n);
        if (rc != PXT_OK) {
            pxt_raise(rc);
            return -1;
        }
        bad = !isfinite(s);
    }
    if (!bad) {
        return 0;
    }
    PyErr_Format(PyExc_ValueError, "%s: expected finite values, got NaN or infinity", name);
    return -1;
}

/* An optional (B, L) key mask: bool or integers (0 = padding), as a host
 * C-contiguous bool array (new reference), or NULL for None (*out NULL). */
static int get_mask(PyObject *obj, const char *name, int B, int L, PyArrayObject **out) {
    *out = NULL;
    if (obj == Py_None) {
        return 0;
    }
    PyArrayObject *arr = (PyArrayObject *)PyArray_FromAny(obj, NULL, 0, 0, 0, NULL);
    if (!arr) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError,
                     "%s: expected a bool or integer array of shape (%d, %d) "
                     "or None, got %.100s",
                     name, B, L, Py_TYPE(obj)->tp_name);
        return -1;
    }
    char kind = PyArray_DESCR(arr)->kind;
    if (kind != 'b' && kind != 'i' && kind != 'u') {
        PyErr_Format(PyExc_TypeError, "%s: expected a bool or integer dtype (0 = padding), got %R",
                     name, (PyObject *)PyArray_DESCR(arr));
        Py_DECREF(arr);
        return -1;
    }
    int64_t shape[PXT_MAX_DIMS] = {0}, want[2] = {B, L};
    int nd = PyArray_NDIM(arr) < PXT_MAX_DIMS ? PyArray_NDIM(arr) : PXT_MAX_DIMS;
    for (int i = 0; i < nd; i++) {
        shape[i] = PyArray_DIM(arr, i);
    }
    if (pxt_py_check_dims(name, PyArray_NDIM(arr), shape, 2, want) < 0) {
        Py_DECREF(arr);
        return -1;
    }
    /* nonzero -> 1 */
    PyArrayObject *b =
        (PyArrayObject *)PyArray_FromAny((PyObject *)arr, PyArray_DescrFromType(NPY_BOOL), 2, 2,
                                         NPY_ARRAY_IN_ARRAY | NPY_ARRAY_FORCECAST, NULL);
    Py_DECREF(arr);
    if (!b) {
        return -1;
    }
    *out = b;
    return 0;
}

/* B*T*width*d_model within int (what the kernels index with), computed without
 * overflowing: B and T are the caller's, any int for estimate_memory. */
static int check_rows(const char *name, const char *t_name, int64_t B, int64_t T, int width,
                      int C) {
    size_t n;
    if (pxt_mul_ok((size_t)B, (size_t)T, &n) && pxt_mul_ok(n, (size_t)width * (size_t)C, &n) &&
        n <= INT32_MAX) {
        return 0;
    }
    PyErr_Format(PyExc_ValueError,
                 "%s: batch %lld x %s %lld at d_model %d is too large for one block call: "
                 "B*%s*%d*d_model must stay below 2**31",
                 name, (long long)B, t_name, (long long)T, C, t_name, width);
    return -1;
}

/* Sizes the kernels index with int: rows x widest row, B*T*4C (the MLP's) and
 * B*Tc*2C (the context's keys and values). name is the argument of B and T,
 * ctx_name Tc's. */
static int check_sizes(const char *name, const char *ctx_name, int64_t B, int64_t T, int64_t Tc,
                       int C) {
    return check_rows(name, "T", B, T, 4, C) < 0 || check_rows(ctx_name, "Tc", B, Tc, 2, C) < 0 ? -1
                                                                                                : 0;
}

/* ---- forward -------------------------------------------------------------------- */

typedef struct {
    float_input x, ctx;
    PyArrayObject *key_mask, *ctx_mask;
} fwd_inputs;

static void fwd_inputs_free(fwd_inputs *in) {
    float_input_free(&in->x);
    float_input_free(&in->ctx);
    Py_CLEAR(in->key_mask);
    Py_CLEAR(in->ctx_mask);
}

/* A (B, T, C) view of the arena at offset: the block's output or an input gradient. */
static PyObject *arena_view(pxt_block_model *m, size_t offset, int B, int T) {
    int64_t shape[3] = {B, T, m->C};
    return pxt_tensor_view(m->arena, offset, m->flat.dt, 3, shape);
}

/* forward(x, key_mask=None, causal=True, context=None, context_mask=None) -> y */
static PyObject *block_forward(PyObject *op, PyObject *args, PyObject *kwargs) {
    static char *kw[] = {"x", "key_mask", "causal", "context", "context_mask", NULL};
    PyObject *x_arg, *km_arg = Py_None, *ctx_arg = Py_None, *cm_arg = Py_None;
    pxt_py_bool causal = PXT_PY_BOOL_DFLT("causal", 1);
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|OO&OO:forward", kw, &x_arg, &km_arg,
                                     pxt_py_bool_converter, &causal, &ctx_arg, &cm_arg)) {
        return NULL;
    }
    pxt_block_model *m = idle(op, "forward");
    if (!m) {
        return NULL;
    }
    /* context presence before anything else: the clearest message for a mix-up */
    if (m->cross && ctx_arg == Py_None) {
        return PyErr_Format(PyExc_ValueError,
                            "context: this Block has cross-attention "
                            "(cross_attention=True) and needs a context of shape (B, Tc, %d), "
                            "got None",
                            m->C);
    }
    if (!m->cross && ctx_arg != Py_None) {
        return PyErr_Format(PyExc_ValueError,
                            "context: this Block has no cross-attention "
                            "(cross_attention=False), so context must be None, got %.100s",
                            Py_TYPE(ctx_arg)->tp_name);
    }
    if (!m->cross && cm_arg != Py_None) {
        return PyErr_Format(PyExc_ValueError,
                            "context_mask: this Block has no cross-attention "
                            "(cross_attention=False), so context_mask must be None, got %.100s",
                            Py_TYPE(cm_arg)->tp_name);
    }
    fwd_inputs in;
    memset(&in, 0, sizeof in);
    PyObject *result = NULL;
    if (get_float_input(m, x_arg, "x", "(B, T, d_model)", &in.x) < 0) {
        goto done;
    }
    int64_t want_x[3] = {-1, -1, m->C};
    if (pxt_py_check_dims("x", in.x.ndim, in.x.shape, 3, want_x) < 0) {
        goto done;
    }
    int64_t B = in.x.shape[0], T = in.x.shape[1], Tc = 0;
    if (B < 1 || T < 1) {
        PyErr_Format(PyExc_ValueError,
                     "x: expected shape (B, T, %d) with B >= 1 and T >= 1, got "
                     "(%lld, %lld, %d)",
                     m->C, (long long)B, (long long)T, m->C);
        goto done;
    }
    if (m->cross) {
        if (get_float_input(m, ctx_arg, "context", "(B, Tc, d_model)", &in.ctx) < 0) {
            goto done;
        }
        int64_t want_c[3] = {B, -1, m->C};
        if (pxt_py_check_dims("context", in.ctx.ndim, in.ctx.shape, 3, want_c) < 0) {
            goto done;
        }
        Tc = in.ctx.shape[1];
        if (Tc < 1) {
            PyErr_Format(PyExc_ValueError,
                         "context: expected shape (%lld, Tc, %d) with Tc >= 1, "
                         "got (%lld, 0, %d)",
                         (long long)B, m->C, (long long)B, m->C);
            goto done;
        }
    }
    if (check_sizes("x", "context", B, T, Tc, m->C) < 0) {
        goto done;
    }
    if (get_mask(km_arg, "key_mask", (int)B, (int)T, &in.key_mask) < 0) {
        goto done;
    }
    if (m->cross && get_mask(cm_arg, "context_mask", (int)B, (int)Tc, &in.ctx_mask) < 0) {
        goto done;
    }
    if (float_input_data(&in.x) < 0 || check_finite(m, &in.x, (size_t)(B * T * m->C), "x") < 0) {
        goto done;
    }
    if (m->cross && (float_input_data(&in.ctx) < 0 ||
                     check_finite(m, &in.ctx, (size_t)(B * Tc * m->C), "context") < 0)) {
        goto done;
    }
    /* everything checked: reserve (or reuse) the arena, then run */
    pxt_block_plan p;
    pxt_block_plan_make(&p, m->flat.be, (int)B, (int)T, (int)Tc, m->C, m->H, m->cross, m->ckpt,
                        m->flat.dt);
    int rc = pxt_block_model_reserve(m, &p);
    if (rc != PXT_OK) {
        pxt_raise(rc);
        goto done;
    }
    pxt_block_inputs bin = {
        .x = in.x.data,
        .x_host = in.x.host,
        .key_mask = in.key_mask ? (const uint8_t *)PyArray_DATA(in.key_mask) : NULL,
        .context = in.ctx.data,
        .context_host = in.ctx.host,
        .context_mask = in.ctx_mask ? (const uint8_t *)PyArray_DATA(in.ctx_mask) : NULL,
        .causal = causal.value,
    };
    pxt_py_block *o = (pxt_py_block *)op;
    o->busy = 1;
    Py_BEGIN_ALLOW_THREADS
    rc = pxt_block_model_forward(m, &bin);
    Py_END_ALLOW_THREADS
    o->busy = 0;
    if (rc != PXT_OK) {
        pxt_raise(rc);
        goto done;
    }
    result = arena_view(m, m->plan.y, (int)B, (int)T);
done:
    fwd_inputs_free(&in);
    return result;
}

/* ---- backward ------------------------------------------------------------------- */

/* backward(dy) -> dx, or (dx, dcontext) with cross-attention */
static PyObject *block_backward(PyObject *op, PyObject *args, PyObject *kwargs) {
    static char *kw[] = {"dy", NULL};
    PyObject *dy_arg;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O:backward", kw, &dy_arg)) {
        return NULL;
    }
    pxt_block_model *m = idle(op, "backward");
    if (!m) {
        return NULL;
    }
    if (!m->pending || !m->arena) {
        return PyErr_Format(PyExc_RuntimeError,
                            "backward: no forward to differentiate: call "
                            "forward(x) first (each forward allows one backward)");
    }
    const pxt_block_plan *p = &m->plan;
    float_input dy;
    if (get_float_input(m, dy_arg, "dy", "(B, T, d_model)", &dy) < 0) {
        return NULL;
    }
    int64_t want[3] = {p->B, p->T, m->C};
    if (pxt_py_check_dims("dy", dy.ndim, dy.shape, 3, want) < 0 || float_input_data(&dy) < 0) {
        float_input_free(&dy);
        return NULL;
    }
    pxt_py_block *o = (pxt_py_block *)op;
    o->busy = 1;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = pxt_block_model_backward(m, dy.data, dy.host);
    Py_END_ALLOW_THREADS
    o->busy = 0;
    float_input_free(&dy);
    if (rc != PXT_OK) {
        return pxt_raise(rc);
    }
    PyObject *dx = arena_view(m, p->dres, p->B, p->T);
    if (!dx || !p->cross) {
        return dx;
    }
    PyObject *dctx = arena_view(m, p->dcontext, p->B, p->Tc);
    if (!dctx) {
        Py_DECREF(dx);
        return NULL;
    }
    PyObject *t = PyTuple_Pack(2, dx, dctx);
    Py_DECREF(dx);
    Py_DECREF(dctx);
    return t;
}

/* ---- the plan as a dict ------------------------------------------------------------ */

/* estimate_memory(batch, T, Tc=0, checkpointing=None) -> dict (bytes) */
static PyObject *block_estimate(PyObject *op, PyObject *args, PyObject *kwargs) {
    static char *kw[] = {"batch", "T", "Tc", "checkpointing", NULL};
    pxt_py_int Bi = PXT_PY_INT("batch", LLONG_MIN, LLONG_MAX),
               Ti = PXT_PY_INT("T", LLONG_MIN, LLONG_MAX);
    pxt_py_int Tci = PXT_PY_INT_OPT("Tc", LLONG_MIN, LLONG_MAX, 0);
    pxt_py_choice ckpt = PXT_PY_CHOICE_OPT("checkpointing", pxt_py_block_ckpt_names, 0);
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O&O&|O&O&:estimate_memory", kw,
                                     pxt_py_int_converter, &Bi, pxt_py_int_converter, &Ti,
                                     pxt_py_int_converter, &Tci, pxt_py_choice_converter, &ckpt)) {
        return NULL;
    }
    pxt_block_model *m = ready(op);
    if (!m) {
        return NULL;
    }
    long long B = Bi.value, T = Ti.value, Tc = Tci.value;
    if (B < 1) {
        return PyErr_Format(PyExc_ValueError, "batch: expected >= 1, got %lld", B);
    }
    if (T < 1) {
        return PyErr_Format(PyExc_ValueError, "T: expected >= 1, got %lld", T);
    }
    if (m->cross && Tc < 1) {
        return PyErr_Format(PyExc_ValueError,
                            "Tc: this Block has cross-attention; expected a "
                            "context length >= 1, got %lld",
                            Tc);
    }
    if (!m->cross && Tc != 0) {
        return PyErr_Format(PyExc_ValueError,
                            "Tc: this Block has no cross-attention; expected 0, "
                            "got %lld",
                            Tc);
    }
    if (check_sizes("batch", "Tc", B, T, Tc, m->C) < 0) {
        return NULL;
    }
    pxt_ckpt policy = ckpt.a.given ? (pxt_ckpt)ckpt.index : m->ckpt;
    pxt_block_plan p;
    pxt_block_plan_make(&p, m->flat.be, (int)B, (int)T, (int)Tc, m->C, m->H, m->cross, policy,
                        m->flat.dt);
    size_t pb = m->flat.layout.numel * pxt_dtype_size(m->flat.dt);
    size_t gb = m->flat.layout.numel * sizeof(float);
    /* what the allocator counts: the buffers' blocks, and the arena's replayed
     * through a copy of the allocator it would come from */
    size_t arena = 0;
    pxt_allocator *plan = pxt_alloc_plan_new(pxt_allocator_get(m->flat.device));
    int rc = plan ? pxt_block_model_plan_arena(m, plan, &p, &arena) : PXT_ERR_OOM;
    pxt_alloc_plan_free(plan);
    if (rc != PXT_OK) {
        return pxt_raise(rc);
    }
    size_t total =
        pxt_block_size(m->flat.params->block) + pxt_block_size(m->flat.grads->block) + arena;
    return Py_BuildValue(
        "{s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:s,s:L,s:L,s:L}", "parameters",
        (Py_ssize_t)pb, "gradients", (Py_ssize_t)gb, "inputs", (Py_ssize_t)p.inputs_bytes, "output",
        (Py_ssize_t)p.output_bytes, "saved", (Py_ssize_t)p.saved_bytes, "activation_gradients",
        (Py_ssize_t)p.grad_bytes, "work", (Py_ssize_t)p.work_bytes, "attention_workspace",
        (Py_ssize_t)p.attn_ws_bytes, "gemm_workspace", (Py_ssize_t)p.gemm_ws_bytes,
        "reduce_workspace", (Py_ssize_t)p.reduce_ws_bytes, "arena", (Py_ssize_t)p.arena_bytes,
        "total", (Py_ssize_t)total, "allocator_rounding",
        (Py_ssize_t)(total - pb - gb - p.arena_bytes), "checkpointing",
        pxt_py_block_ckpt_names[policy], "batch_size", B, "sequence_length", T, "context_length",
        Tc);
}

static PyObject *block_release_arena(PyObject *op, PyObject *unused) {
    (void)unused;
    pxt_block_model *m = idle(op, "release_arena");
    return m ? PyLong_FromSize_t(pxt_block_model_release_arena(m)) : NULL;
}

/* ---- attributes ----------------------------------------------------------------- */

static const pxt_block_model *model_of(PyObject *op) { return &((pxt_py_block *)op)->m; }

static PyObject *get_ckpt(PyObject *op, void *c) {
    (void)c;
    return PyUnicode_FromString(pxt_py_block_ckpt_names[model_of(op)->ckpt]);
}

/* The policy of the next forward; a pending backward keeps the one it ran with. */
static int set_ckpt(PyObject *op, PyObject *v, void *c) {
    (void)c;
    if (!v) {
        PyErr_SetString(PyExc_TypeError, "checkpointing: cannot be deleted");
        return -1;
    }
    pxt_py_choice ckpt = PXT_PY_CHOICE("checkpointing", pxt_py_block_ckpt_names);
    if (!pxt_py_choice_converter(v, &ckpt)) {
        return -1;
    }
    ((pxt_py_block *)op)->m.ckpt = (pxt_ckpt)ckpt.index;
    return 0;
}

static PyObject *get_d_model(PyObject *op, void *c) {
    (void)c;
    return PyLong_FromLong(model_of(op)->C);
}

static PyObject *get_n_heads(PyObject *op, void *c) {
    (void)c;
    return PyLong_FromLong(model_of(op)->H);
}

static PyObject *get_cross(PyObject *op, void *c) {
    (void)c;
    return PyBool_FromLong(model_of(op)->cross);
}

static PyObject *get_eps(PyObject *op, void *c) {
    (void)c;
    return PyFloat_FromDouble(model_of(op)->eps);
}

static PyObject *get_device(PyObject *op, void *c) {
    (void)c;
    return pxt_py_device_str(model_of(op)->flat.device);
}

static PyObject *get_dtype(PyObject *op, void *c) {
    (void)c;
    return Py_NewRef(pxt_dtype_object(model_of(op)->flat.dt));
}

static PyObject *get_num_parameters(PyObject *op, void *c) {
    (void)c;
    return PyLong_FromSize_t(pxt_flat_num_parameters(&model_of(op)->flat));
}

static PyObject *get_arena_bytes(PyObject *op, void *c) {
    (void)c;
    const pxt_block_model *m = model_of(op);
    return PyLong_FromSize_t(m->arena ? m->arena->nbytes : 0);
}

static PyObject *block_repr(PyObject *op) {
    const pxt_block_model *m = model_of(op);
    char dname[32];
    return PyUnicode_FromFormat("Block(d_model=%d, n_heads=%d, cross_attention=%s, "
                                "checkpointing='%s', device='%s')",
                                m->C, m->H, m->cross ? "True" : "False",
                                pxt_py_block_ckpt_names[m->ckpt],
                                pxt_device_str(m->flat.device, dname, sizeof dname));
}

static PyGetSetDef block_getset[] = {
    {"checkpointing", get_ckpt, set_ckpt,
     "'none', 'selective' or 'full': what the next forward saves for backward", NULL},
    {"d_model", get_d_model, NULL, "width C", NULL},
    {"n_heads", get_n_heads, NULL, "attention heads", NULL},
    {"cross_attention", get_cross, NULL, "True when the block has a cross-attention sublayer",
     NULL},
    {"layer_norm_eps", get_eps, NULL, "layernorm epsilon", NULL},
    {"device", get_device, NULL, "'cpu' or 'cuda:N'", NULL},
    {"dtype", get_dtype, NULL, "dtype of parameters and activations", NULL},
    {"num_parameters", get_num_parameters, NULL, "number of parameters", NULL},
    {"arena_bytes", get_arena_bytes, NULL, "bytes of the cached arena (0 before a forward)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef block_methods[] = {
    {"parameters", block_parameters, METH_NOARGS,
     "parameters() -> dict: name -> Tensor view of the flat parameter buffer"},
    {"gradients", block_gradients, METH_NOARGS,
     "gradients() -> dict: name -> Tensor view of the flat fp32 gradient buffer"},
    {"zero_grad", block_zero_grad, METH_NOARGS, "zero_grad(): every gradient := 0"},
    {"forward", PXT_PY_KW(block_forward),
     "forward(x, key_mask=None, causal=True, context=None, context_mask=None) -> y\n\n"
     "x: (B, T, d_model) float32 Tensor or array. key_mask (B, T) and context_mask (B, Tc):\n"
     "0 = padding, never attended (a query with no visible key gets a zero attention row).\n"
     "context (B, Tc, d_model): required with cross-attention, refused without.\n"
     "Saves what the checkpoint policy says in the block's arena. y is a view of the\n"
     "arena's output slot, valid until this block's next forward."},
    {"backward", PXT_PY_KW(block_backward),
     "backward(dy) -> dx, or (dx, dcontext) with cross-attention\n\n"
     "dy: (B, T, d_model) like forward's x. Adds into the parameter gradients. Needs a\n"
     "preceding forward (one backward per forward). dx and dcontext are views of the\n"
     "arena, valid until this block's next backward."},
    {"estimate_memory", PXT_PY_KW(block_estimate),
     "estimate_memory(batch, T, Tc=0, checkpointing=None) -> dict of bytes by component"},
    {"release_arena", block_release_arena, METH_NOARGS,
     "release_arena() -> bytes: drop the cached arena (the next forward reserves a new one)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject block_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "pyxtts.Block",
    .tp_basicsize = sizeof(pxt_py_block),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Block(d_model, n_heads, cross_attention=False, checkpointing='none', "
              "device='cpu', seed=0, layer_norm_eps=1e-5)\n\n"
              "One pre-LayerNorm GPT-2 block (ln_1, causal self-attention, residual; with\n"
              "cross_attention a LayerNorm + attention over a context, residual; ln_2, MLP\n"
              "with tanh GELU, residual), the unit of pyxtts.XTTSGPT, usable alone.",
    .tp_new = PyType_GenericNew,
    .tp_init = block_init,
    .tp_dealloc = block_dealloc,
    .tp_repr = block_repr,
    .tp_methods = block_methods,
    .tp_getset = block_getset,
};

int pxt_py_block_init_type(PyObject *module) {
    return PyModule_AddType(module, &block_type); /* readies it; the name after the last dot */
}
