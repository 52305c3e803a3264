/* block.c: pyxtts.Block, one pre-LayerNorm GPT-2 block (optionally with
 * cross-attention) usable alone, on the same block.c code as the model.
 *
 * Owns flat parameter and fp32 gradient buffers and one arena per shape. The
 * arena holds the inputs, the output, what the checkpoint policy saves, the
 * backward's activation gradients, the work area of recomputation and the
 * workspaces; it is reserved through the caching allocator when the shape (or
 * policy) changes and reused otherwise, so a forward/backward of a known shape
 * allocates nothing. forward() returns y as a view of the arena's output slot
 * and backward() dx (and dcontext) as views of its gradient slots: they stay
 * valid until this block's next forward (y) or backward (dx, dcontext), like
 * the activations of any arena; copy them (.numpy(), .to()) to keep them.
 *
 * Every argument is checked before any work; an out-of-memory error can only
 * come from reserving the arena, before anything else changed. */
#include "module.h"

#include <math.h>
#include <string.h>

#define NO_IMPORT_ARRAY
#define PY_ARRAY_UNIQUE_SYMBOL pxt_ARRAY_API
#define NPY_NO_DEPRECATED_API NPY_2_0_API_VERSION
#include <numpy/arrayobject.h>

#include "engine/block.h"

#define ARENA_ALIGN 256

/* ---- the arena of one shape ------------------------------------------------------
 *
 *   inputs   x (N, C) | key_mask (B, T) u8 | context (Nc, C) | context_mask (B, Tc) u8
 *   output   y (N, C)
 *   saved    the activations the policy keeps (pxt_block_saves)
 *   grads    dres (N, C): dy -> dx | dA (N, 4C) | dB (N, C) | dkv (Nc, 2C) | dcontext (Nc, C)
 *   work     the activations the policy recomputes
 *   ws       attention workspace (max over self/cross, fwd/bwd) | GEMM workspace
 * N = B T, Nc = B Tc (the context regions only with cross-attention). No region
 * overlaps another, so y survives the backward and dx the next forward. */
typedef struct {
    int B, T, Tc, C, H, cross;
    pxt_ckpt policy;
    pxt_dtype dt;
    size_t x, key_mask, context, context_mask, inputs_bytes;
    size_t y, output_bytes;
    size_t act[PXT_ACT_COUNT]; /* each activation's slot: in saved, or in work */
    size_t saved_bytes;
    size_t dres, dA, dB, dkv, dcontext, grad_bytes;
    size_t work_bytes;
    size_t attn_ws, attn_ws_bytes, gemm_ws, gemm_ws_bytes;
    size_t arena_bytes;
} block_plan;

static size_t align_up(size_t n) { return (n + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN; }

static size_t take(size_t *cursor, size_t bytes) {
    size_t at = *cursor;
    *cursor += align_up(bytes);
    return at;
}

static size_t max_sz(size_t a, size_t b) { return a > b ? a : b; }

static int n_acts(int cross) { return cross ? PXT_ACT_COUNT : PXT_ACT_PLAIN; }

/* The ctx of a shape with no pointers: what the attention calls look like. */
static pxt_ctx shape_ctx(const block_plan *p) {
    pxt_ctx x = {.B = p->B, .T = p->T, .C = p->C, .H = p->H, .Tc = p->cross ? p->Tc : 0,
                 .dt = p->dt};
    return x;
}

static size_t attn_ws_max(const block_plan *p, const pxt_backend *be) {
    if (!be->attention_workspace)
        return 0;
    pxt_ctx x = shape_ctx(p);
    pxt_attn_args s = pxt_block_self_attn_args(&x);
    size_t m = max_sz(be->attention_workspace(&s, 0), be->attention_workspace(&s, 1));
    if (p->cross) {
        pxt_attn_args c = pxt_block_cross_attn_args(&x);
        m = max_sz(m, max_sz(be->attention_workspace(&c, 0), be->attention_workspace(&c, 1)));
    }
    return m;
}

static size_t gemm_ws_max(const block_plan *p, const pxt_backend *be) {
    if (!be->gemm_workspace)
        return 0;
    int N = p->B * p->T, Nc = p->B * p->Tc, C = p->C;
    int shapes[][3] = {
        {N, 3 * C, C}, {N, C, C}, {N, 4 * C, C}, {N, C, 4 * C},                /* forward */
        {N, C, 3 * C}, {C, 3 * C, N}, {C, C, N}, {C, 4 * C, N}, {4 * C, C, N}, /* backward */
        {Nc, 2 * C, C}, {Nc, C, 2 * C}, {C, 2 * C, Nc},                        /* cross */
    };
    int count = p->cross ? 12 : 9;
    size_t m = 0;
    for (int i = 0; i < count; i++)
        m = max_sz(m, be->gemm_workspace(shapes[i][0], shapes[i][1], shapes[i][2], p->dt));
    return m;
}

static void plan_block(block_plan *p, const pxt_backend *be, int B, int T, int Tc, int C, int H,
                       int cross, pxt_ckpt policy, pxt_dtype dt) {
    memset(p, 0, sizeof *p);
    p->B = B, p->T = T, p->Tc = cross ? Tc : 0, p->C = C, p->H = H, p->cross = cross;
    p->policy = policy, p->dt = dt;
    size_t es = pxt_dtype_size(dt), N = (size_t)B * T, Nc = (size_t)B * p->Tc, cur = 0;
    p->x = take(&cur, N * C * es);
    p->key_mask = take(&cur, N);
    if (cross) {
        p->context = take(&cur, Nc * C * es);
        p->context_mask = take(&cur, Nc);
    }
    p->inputs_bytes = cur;
    p->y = take(&cur, N * C * es);
    p->output_bytes = cur - p->y;
    size_t start = cur;
    for (int a = 0; a < n_acts(cross); a++)
        if (pxt_block_saves(policy, a))
            p->act[a] = take(&cur, pxt_block_act_bytes(a, B, T, p->Tc, C, H, dt));
    p->saved_bytes = cur - start;
    start = cur;
    p->dres = take(&cur, N * C * es);
    p->dA = take(&cur, N * 4 * C * es);
    p->dB = take(&cur, N * C * es);
    if (cross) {
        p->dkv = take(&cur, Nc * 2 * C * es);
        p->dcontext = take(&cur, Nc * C * es);
    }
    p->grad_bytes = cur - start;
    start = cur;
    for (int a = 0; a < n_acts(cross); a++)
        if (!pxt_block_saves(policy, a))
            p->act[a] = take(&cur, pxt_block_act_bytes(a, B, T, p->Tc, C, H, dt));
    p->work_bytes = cur - start;
    p->attn_ws_bytes = align_up(attn_ws_max(p, be)); /* bytes as the arena lays them out */
    p->attn_ws = take(&cur, p->attn_ws_bytes);
    p->gemm_ws_bytes = align_up(gemm_ws_max(p, be));
    p->gemm_ws = take(&cur, p->gemm_ws_bytes);
    p->arena_bytes = cur;
}

static int same_plan(const block_plan *a, const block_plan *b) {
    return a->B == b->B && a->T == b->T && a->Tc == b->Tc && a->cross == b->cross &&
           a->policy == b->policy && a->arena_bytes == b->arena_bytes;
}

/* ---- the object ----------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    int C, H, cross;
    float eps;
    pxt_device device;
    const pxt_backend *be;
    pxt_dtype dt;
    pxt_ckpt ckpt;            /* policy of the next forward */
    pxt_param_layout layout;  /* params[j] is tensor j of gpt.h's enums */
    pxt_tensor *params;       /* (layout.numel) dt */
    pxt_tensor *grads;        /* (layout.numel) fp32 */
    pxt_tensor *arena;        /* uint8 (plan.arena_bytes), NULL before the first forward */
    block_plan plan;          /* the arena's layout */
    /* the forward whose activations the arena holds (backward repeats its ctx) */
    int pending, causal, has_key_mask, has_context_mask;
    int busy;                 /* a forward/backward runs with the GIL released */
} pxt_block_obj;

static PyTypeObject block_type;

static const char *ckpt_names[] = {"none", "selective", "full"};

static int parse_ckpt(PyObject *v, pxt_ckpt *out) {
    if (!v || !PyUnicode_Check(v)) {
        PyErr_Format(PyExc_TypeError, "checkpointing: expected 'none', 'selective' or 'full', "
                     "got %.100s", v ? Py_TYPE(v)->tp_name : "nothing");
        return -1;
    }
    const char *s = PyUnicode_AsUTF8(v);
    if (!s)
        return -1;
    for (int i = 0; i < 3; i++)
        if (!strcmp(s, ckpt_names[i])) {
            *out = (pxt_ckpt)i;
            return 0;
        }
    PyErr_Format(PyExc_ValueError, "checkpointing: expected 'none', 'selective' or 'full', got %R",
                 v);
    return -1;
}

static size_t param_bytes(const pxt_block_obj *m) {
    return m->layout.numel * pxt_dtype_size(m->dt);
}

static void block_views(pxt_block_obj *m, pxt_block_params *p, pxt_block_grads *g) {
    memset(p, 0, sizeof *p);
    memset(g, 0, sizeof *g);
    size_t es = pxt_dtype_size(m->dt);
    for (int j = 0; j < m->layout.count; j++) {
        p->w[j] = m->params->data + m->layout.params[j].offset * es;
        g->g[j] = (float *)m->grads->data + m->layout.params[j].offset;
    }
}

static pxt_block_acts acts_of(const block_plan *p, char *base) {
    pxt_block_acts a;
    memset(&a, 0, sizeof a);
    for (int i = 0; i < n_acts(p->cross); i++)
        pxt_block_acts_set(&a, i, base + p->act[i]);
    return a;
}

static pxt_ctx run_ctx(const pxt_block_obj *m, char *base) {
    const block_plan *p = &m->plan;
    pxt_ctx x = {
        .be = m->be, .dev = m->device.index, .dt = m->dt, .B = p->B, .T = p->T, .C = m->C,
        .H = m->H, .eps = m->eps,
        .key_mask = m->has_key_mask ? (const uint8_t *)(base + p->key_mask) : NULL,
        .attn_ws = base + p->attn_ws, .gemm_ws = base + p->gemm_ws, .non_causal = !m->causal,
    };
    if (p->cross) {
        x.context = base + p->context;
        x.context_mask = m->has_context_mask ? (const uint8_t *)(base + p->context_mask) : NULL;
        x.Tc = p->Tc;
        x.dcontext = base + p->dcontext;
        x.dkv = base + p->dkv;
    }
    return x;
}

/* ---- init ----------------------------------------------------------------------- */

static int block_init(PyObject *op, PyObject *args, PyObject *kwargs) {
    pxt_block_obj *m = (pxt_block_obj *)op;
    static char *kw[] = {"d_model", "n_heads", "cross_attention", "checkpointing", "device",
                         "seed", "layer_norm_eps", NULL};
    int C, H, cross = 0;
    PyObject *ckpt_arg = NULL, *dev_arg = Py_None, *seed_arg = NULL;
    double eps = 1e-5;
    if (m->params) {
        PyErr_SetString(PyExc_RuntimeError, "Block.__init__ called twice");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "ii|pOOOd:Block", kw, &C, &H, &cross,
                                     &ckpt_arg, &dev_arg, &seed_arg, &eps))
        return -1;
    if (C < 1 || C > (1 << 24)) {
        PyErr_Format(PyExc_ValueError, "d_model: expected an int in [1, 2**24], got %d", C);
        return -1;
    }
    if (H < 1 || C % H != 0) {
        PyErr_Format(PyExc_ValueError, "n_heads: expected a positive divisor of d_model (%d), "
                     "got %d", C, H);
        return -1;
    }
    if (!(eps > 0.0) || !isfinite(eps) || !((float)eps > 0.0f)) {
        PyErr_Format(PyExc_ValueError, "layer_norm_eps: expected a finite number > 0 (in float32), "
                     "got %g", eps);
        return -1;
    }
    pxt_ckpt ckpt = PXT_CKPT_NONE;
    if (ckpt_arg && parse_ckpt(ckpt_arg, &ckpt) < 0)
        return -1;
    unsigned long long seed = 0;
    if (seed_arg && seed_arg != Py_None) {
        if (!PyLong_Check(seed_arg) || PyBool_Check(seed_arg)) {
            PyErr_Format(PyExc_TypeError, "seed: expected an int, got %.100s",
                         Py_TYPE(seed_arg)->tp_name);
            return -1;
        }
        seed = PyLong_AsUnsignedLongLong(seed_arg);
        if (seed == (unsigned long long)-1 && PyErr_Occurred()) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError, "seed: expected an int in [0, 2**64), got %R",
                         seed_arg);
            return -1;
        }
    }
    pxt_device dev = {PXT_CPU, 0};
    if (dev_arg != Py_None && pxt_parse_device(dev_arg, &dev, "device", 1) < 0)
        return -1;
    const pxt_backend *be = pxt_backend_for(dev.type);
    char dname[32];
    pxt_device_str(dev, dname, sizeof dname);
    if (!be) {
        PyErr_Format(PyExc_ValueError, "device: this build has no backend for %s", dname);
        return -1;
    }
    int rc = pxt_ctx_check_ops(be, dname);
    if (rc != PXT_OK) {
        pxt_raise(rc);
        return -1;
    }
    m->C = C, m->H = H, m->cross = cross, m->eps = (float)eps;
    m->device = dev, m->be = be, m->dt = PXT_FLOAT32, m->ckpt = ckpt, m->causal = 1;
    if (pxt_block_layout_init(&m->layout, C, cross) != PXT_OK) {
        pxt_raise(PXT_ERR_OOM);
        return -1;
    }
    int64_t n = (int64_t)m->layout.numel;
    m->params = (pxt_tensor *)pxt_tensor_empty(dev, m->dt, 1, &n);
    if (!m->params)
        return -1;
    m->grads = (pxt_tensor *)pxt_tensor_empty(dev, PXT_FLOAT32, 1, &n);
    if (!m->grads)
        return -1;
    rc = be->memset_zero(dev.index, m->grads->data, m->grads->nbytes);
    if (rc != PXT_OK) {
        pxt_raise(rc);
        return -1;
    }
    /* GPT-2 init in layout order from one seeded stream, so the plain part of a
     * cross-attention block equals the plain block of the same seed; no 1/sqrt(2L):
     * one block */
    return pxt_flat_init(&m->layout, m->params, seed, 0.02f);
}

static void block_dealloc(PyObject *op) {
    pxt_block_obj *m = (pxt_block_obj *)op;
    Py_CLEAR(m->params);
    Py_CLEAR(m->grads);
    Py_CLEAR(m->arena);
    pxt_param_layout_free(&m->layout);
    Py_TYPE(op)->tp_free(op);
}

/* Methods other than __init__ on a Block whose __init__ never ran (or failed). */
static int ready(pxt_block_obj *m) {
    if (m->params && m->grads)
        return 0;
    PyErr_SetString(PyExc_RuntimeError, "this Block is not initialised (__init__ failed or was "
                    "not called)");
    return -1;
}

/* ---- views ---------------------------------------------------------------------- */


static PyObject *block_parameters(PyObject *op, PyObject *unused) {
    (void)unused;
    pxt_block_obj *m = (pxt_block_obj *)op;
    return ready(m) < 0 ? NULL : pxt_flat_views(&m->layout, m->params);
}

static PyObject *block_gradients(PyObject *op, PyObject *unused) {
    (void)unused;
    pxt_block_obj *m = (pxt_block_obj *)op;
    return ready(m) < 0 ? NULL : pxt_flat_views(&m->layout, m->grads);
}

static int not_busy(pxt_block_obj *m, const char *what) {
    if (!m->busy)
        return 0;
    PyErr_Format(PyExc_RuntimeError, "%s: this Block is running a forward or backward (in "
                 "another thread); calls on one block must not overlap", what);
    return -1;
}

static PyObject *block_zero_grad(PyObject *op, PyObject *unused) {
    (void)unused;
    pxt_block_obj *m = (pxt_block_obj *)op;
    if (ready(m) < 0 || not_busy(m, "zero_grad") < 0)
        return NULL;
    int rc = m->be->memset_zero(m->device.index, m->grads->data, m->grads->nbytes);
    if (rc != PXT_OK)
        return pxt_raise(rc);
    Py_RETURN_NONE;
}

/* ---- arguments ------------------------------------------------------------------ */

/* A float32 input: a Tensor on the block's device, or host data NumPy can view
 * (copied to the device with the rest of the inputs). */
typedef struct {
    PyObject *owner; /* keeps data alive: the Tensor or a C-contiguous ndarray */
    const char *data;
    int host;        /* data is host memory */
    int ndim;
    int64_t shape[PXT_MAX_DIMS];
} float_input;

static void float_input_free(float_input *in) { Py_CLEAR(in->owner); }

static int get_float_input(pxt_block_obj *m, PyObject *obj, const char *name, const char *dims,
                           float_input *in) {
    memset(in, 0, sizeof *in);
    if (obj == Py_None) {
        PyErr_Format(PyExc_TypeError, "%s: expected a float32 pyxtts.Tensor or array of shape "
                     "%s, got None", name, dims);
        return -1;
    }
    if (pxt_tensor_check(obj)) {
        pxt_tensor *t = (pxt_tensor *)obj;
        if (pxt_check_device(t, name, m->device) < 0 || pxt_check_dtype(t, name, PXT_FLOAT32) < 0)
            return -1;
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
        PyErr_Format(PyExc_TypeError, "%s: expected a float32 pyxtts.Tensor or array of shape "
                     "%s, got %.100s", name, dims, Py_TYPE(obj)->tp_name);
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
    for (int i = 0; i < in->ndim; i++) in->shape[i] = PyArray_DIM(arr, i);
    return 0;
}

/* The data pointer, after the shape checks: an array becomes native C order
 * (a no-op for the usual array; a copy for strided or byte-swapped ones). */
static int float_input_data(float_input *in) {
    if (in->data)
        return 0;
    PyArrayObject *c = (PyArrayObject *)PyArray_FromAny(
        in->owner, PyArray_DescrFromType(NPY_FLOAT32), 0, 0, NPY_ARRAY_IN_ARRAY, NULL);
    if (!c)
        return -1;
    Py_SETREF(in->owner, (PyObject *)c);
    in->data = PyArray_DATA(c);
    return 0;
}


/* NaN or infinity anywhere in n floats: on the host a scan, on a device its sum. */
static int check_finite(pxt_block_obj *m, const float_input *in, size_t n, const char *name) {
    int bad = 0;
    if (in->host) {
        const float *f = (const float *)in->data;
        for (size_t i = 0; i < n && !bad; i++) bad = !isfinite(f[i]);
    } else {
        double s = 0.0;
        int rc = m->be->sum(m->device.index, &s, (const float *)in->data, n);
        if (rc != PXT_OK) {
            pxt_raise(rc);
            return -1;
        }
        bad = !isfinite(s);
    }
    if (!bad)
        return 0;
    PyErr_Format(PyExc_ValueError, "%s: expected finite values, got NaN or infinity", name);
    return -1;
}

/* An optional (B, L) key mask: bool or integers (0 = padding), as a host
 * C-contiguous bool array (new reference), or NULL for None (*out NULL). */
static int get_mask(PyObject *obj, const char *name, int B, int L, PyArrayObject **out) {
    *out = NULL;
    if (obj == Py_None)
        return 0;
    PyArrayObject *arr = (PyArrayObject *)PyArray_FromAny(obj, NULL, 0, 0, 0, NULL);
    if (!arr) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s: expected a bool or integer array of shape (%d, %d) "
                     "or None, got %.100s", name, B, L, Py_TYPE(obj)->tp_name);
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
    for (int i = 0; i < nd; i++) shape[i] = PyArray_DIM(arr, i);
    if (pxt_check_dims(name, PyArray_NDIM(arr), shape, 2, want) < 0) {
        Py_DECREF(arr);
        return -1;
    }
    /* nonzero -> 1 */
    PyArrayObject *b = (PyArrayObject *)PyArray_FromAny(
        (PyObject *)arr, PyArray_DescrFromType(NPY_BOOL), 2, 2,
        NPY_ARRAY_IN_ARRAY | NPY_ARRAY_FORCECAST, NULL);
    Py_DECREF(arr);
    if (!b)
        return -1;
    *out = b;
    return 0;
}

/* ---- the arena ------------------------------------------------------------------ */

/* Makes the arena match p. The new arena is reserved while the old one is still
 * held; when that fails, the old one (a cache) is handed back and the request
 * tried once more. On failure nothing but that cache has changed. */
static int ensure_arena(pxt_block_obj *m, const block_plan *p) {
    if (m->arena && same_plan(&m->plan, p))
        return 0;
    int64_t n = (int64_t)p->arena_bytes;
    PyObject *a = pxt_tensor_empty(m->device, PXT_UINT8, 1, &n);
    if (!a && m->arena && PyErr_ExceptionMatches(pxt_OutOfMemoryError)) {
        PyErr_Clear();
        Py_CLEAR(m->arena);
        m->pending = 0;
        a = pxt_tensor_empty(m->device, PXT_UINT8, 1, &n);
    }
    if (!a)
        return -1;
    Py_XSETREF(m->arena, (pxt_tensor *)a);
    m->plan = *p;
    m->pending = 0;
    return 0;
}

static pxt_copy_kind copy_kind(const pxt_block_obj *m, int host_src) {
    return m->device.type == PXT_CPU || !host_src ? PXT_COPY_D2D : PXT_COPY_H2D;
}


/* Sizes the kernels index with int: rows x widest row (4C; 2C for the context). */
static int check_sizes(const char *name, int64_t B, int64_t T, int64_t Tc, int C) {
    if (B * T * 4 * C <= INT32_MAX && B * Tc * 2 * C <= INT32_MAX)
        return 0;
    PyErr_Format(PyExc_ValueError, "%s: batch %lld x T %lld (x Tc %lld) at d_model %d is too large "
                 "for one block call: B*T*4*d_model and B*Tc*2*d_model must stay below 2**31",
                 name, (long long)B, (long long)T, (long long)Tc, C);
    return -1;
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

static int upload_and_run(pxt_block_obj *m, const fwd_inputs *in) {
    const block_plan *p = &m->plan;
    const pxt_backend *be = m->be;
    int d = m->device.index;
    size_t es = pxt_dtype_size(m->dt), N = (size_t)p->B * p->T, Nc = (size_t)p->B * p->Tc;
    char *base = m->arena->data;
    if (base + p->x != in->x.data)
        PXT_TRY(be->copy(d, base + p->x, in->x.data, N * m->C * es, copy_kind(m, in->x.host)));
    if (in->key_mask)
        PXT_TRY(be->copy(d, base + p->key_mask, PyArray_DATA(in->key_mask), N, copy_kind(m, 1)));
    if (p->cross) {
        if (base + p->context != in->ctx.data)
            PXT_TRY(be->copy(d, base + p->context, in->ctx.data, Nc * m->C * es,
                         copy_kind(m, in->ctx.host)));
        if (in->ctx_mask)
            PXT_TRY(be->copy(d, base + p->context_mask, PyArray_DATA(in->ctx_mask), Nc,
                         copy_kind(m, 1)));
    }
    pxt_block_params bp;
    pxt_block_grads bg;
    block_views(m, &bp, &bg);
    pxt_ctx x = run_ctx(m, base);
    pxt_block_acts a = acts_of(p, base);
    return pxt_block_forward(&x, &bp, &a, base + p->x, base + p->y);
}

static PyObject *arena_view(pxt_block_obj *m, size_t offset, int B, int T) {
    int64_t shape[3] = {B, T, m->C};
    return pxt_tensor_borrow((PyObject *)m->arena, m->arena->data + offset, m->device, m->dt, 3,
                             shape, 0);
}

/* forward(x, key_mask=None, causal=True, context=None, context_mask=None) -> y */
static PyObject *block_forward(PyObject *op, PyObject *args, PyObject *kwargs) {
    pxt_block_obj *m = (pxt_block_obj *)op;
    static char *kw[] = {"x", "key_mask", "causal", "context", "context_mask", NULL};
    PyObject *x_arg, *km_arg = Py_None, *ctx_arg = Py_None, *cm_arg = Py_None;
    int causal = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|OpOO:forward", kw, &x_arg, &km_arg, &causal,
                                     &ctx_arg, &cm_arg))
        return NULL;
    if (ready(m) < 0 || not_busy(m, "forward") < 0)
        return NULL;
    /* context presence before anything else: the clearest message for a mix-up */
    if (m->cross && ctx_arg == Py_None)
        return PyErr_Format(PyExc_ValueError, "context: this Block has cross-attention "
                            "(cross_attention=True) and needs a context of shape (B, Tc, %d), "
                            "got None", m->C);
    if (!m->cross && ctx_arg != Py_None)
        return PyErr_Format(PyExc_ValueError, "context: this Block has no cross-attention "
                            "(cross_attention=False), so context must be None, got %.100s",
                            Py_TYPE(ctx_arg)->tp_name);
    if (!m->cross && cm_arg != Py_None)
        return PyErr_Format(PyExc_ValueError, "context_mask: this Block has no cross-attention "
                            "(cross_attention=False), so context_mask must be None, got %.100s",
                            Py_TYPE(cm_arg)->tp_name);
    fwd_inputs in;
    memset(&in, 0, sizeof in);
    PyObject *result = NULL;
    if (get_float_input(m, x_arg, "x", "(B, T, d_model)", &in.x) < 0)
        goto done;
    int64_t want_x[3] = {-1, -1, m->C};
    if (pxt_check_dims("x", in.x.ndim, in.x.shape, 3, want_x) < 0)
        goto done;
    int64_t B = in.x.shape[0], T = in.x.shape[1], Tc = 0;
    if (B < 1 || T < 1) {
        PyErr_Format(PyExc_ValueError, "x: expected shape (B, T, %d) with B >= 1 and T >= 1, got "
                     "(%lld, %lld, %d)", m->C, (long long)B, (long long)T, m->C);
        goto done;
    }
    if (m->cross) {
        if (get_float_input(m, ctx_arg, "context", "(B, Tc, d_model)", &in.ctx) < 0)
            goto done;
        int64_t want_c[3] = {B, -1, m->C};
        if (pxt_check_dims("context", in.ctx.ndim, in.ctx.shape, 3, want_c) < 0)
            goto done;
        Tc = in.ctx.shape[1];
        if (Tc < 1) {
            PyErr_Format(PyExc_ValueError, "context: expected shape (%lld, Tc, %d) with Tc >= 1, "
                         "got (%lld, 0, %d)", (long long)B, m->C, (long long)B, m->C);
            goto done;
        }
    }
    if (check_sizes("x", B, T, Tc, m->C) < 0)
        goto done;
    if (get_mask(km_arg, "key_mask", (int)B, (int)T, &in.key_mask) < 0)
        goto done;
    if (m->cross && get_mask(cm_arg, "context_mask", (int)B, (int)Tc, &in.ctx_mask) < 0)
        goto done;
    if (float_input_data(&in.x) < 0 || check_finite(m, &in.x, (size_t)(B * T * m->C), "x") < 0)
        goto done;
    if (m->cross && (float_input_data(&in.ctx) < 0 ||
                     check_finite(m, &in.ctx, (size_t)(B * Tc * m->C), "context") < 0))
        goto done;
    /* everything checked: reserve (or reuse) the arena, then run */
    block_plan p;
    plan_block(&p, m->be, (int)B, (int)T, (int)Tc, m->C, m->H, m->cross, m->ckpt, m->dt);
    if (ensure_arena(m, &p) < 0)
        goto done;
    m->pending = 0;
    m->causal = causal;
    m->has_key_mask = in.key_mask != NULL;
    m->has_context_mask = in.ctx_mask != NULL;
    m->busy = 1;
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = upload_and_run(m, &in);
    Py_END_ALLOW_THREADS
    m->busy = 0;
    if (rc != PXT_OK) {
        pxt_raise(rc);
        goto done;
    }
    m->pending = 1;
    result = arena_view(m, m->plan.y, (int)B, (int)T);
done:
    fwd_inputs_free(&in);
    return result;
}

/* ---- backward ------------------------------------------------------------------- */

static int run_backward(pxt_block_obj *m, const float_input *dy) {
    const block_plan *p = &m->plan;
    const pxt_backend *be = m->be;
    int d = m->device.index;
    size_t es = pxt_dtype_size(m->dt), N = (size_t)p->B * p->T, Nc = (size_t)p->B * p->Tc;
    char *base = m->arena->data;
    if (base + p->dres != dy->data)
        PXT_TRY(be->copy(d, base + p->dres, dy->data, N * m->C * es, copy_kind(m, dy->host)));
    if (p->cross)
        PXT_TRY(be->memset_zero(d, base + p->dcontext, Nc * m->C * es));
    pxt_block_params bp;
    pxt_block_grads bg;
    block_views(m, &bp, &bg);
    pxt_ctx x = run_ctx(m, base);
    pxt_block_acts a = acts_of(p, base);
    return pxt_block_backward(&x, &bp, &bg, &a, &a, p->policy, base + p->x, base + p->dres,
                              base + p->dA, base + p->dB);
}

/* backward(dy) -> dx, or (dx, dcontext) with cross-attention */
static PyObject *block_backward(PyObject *op, PyObject *args, PyObject *kwargs) {
    pxt_block_obj *m = (pxt_block_obj *)op;
    static char *kw[] = {"dy", NULL};
    PyObject *dy_arg;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O:backward", kw, &dy_arg))
        return NULL;
    if (ready(m) < 0 || not_busy(m, "backward") < 0)
        return NULL;
    if (!m->pending || !m->arena)
        return PyErr_Format(PyExc_RuntimeError, "backward: no forward to differentiate: call "
                            "forward(x) first (each forward allows one backward)");
    const block_plan *p = &m->plan;
    float_input dy;
    if (get_float_input(m, dy_arg, "dy", "(B, T, d_model)", &dy) < 0)
        return NULL;
    int64_t want[3] = {p->B, p->T, m->C};
    if (pxt_check_dims("dy", dy.ndim, dy.shape, 3, want) < 0 || float_input_data(&dy) < 0) {
        float_input_free(&dy);
        return NULL;
    }
    m->busy = 1;
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = run_backward(m, &dy);
    Py_END_ALLOW_THREADS
    m->busy = 0;
    m->pending = 0;
    float_input_free(&dy);
    if (rc != PXT_OK)
        return pxt_raise(rc);
    PyObject *dx = arena_view(m, p->dres, p->B, p->T);
    if (!dx || !p->cross)
        return dx;
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
    pxt_block_obj *m = (pxt_block_obj *)op;
    static char *kw[] = {"batch", "T", "Tc", "checkpointing", NULL};
    long long B, T, Tc = 0;
    PyObject *ckpt_arg = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "LL|LO:estimate_memory", kw, &B, &T, &Tc,
                                     &ckpt_arg))
        return NULL;
    if (ready(m) < 0)
        return NULL;
    if (B < 1)
        return PyErr_Format(PyExc_ValueError, "batch: expected >= 1, got %lld", B);
    if (T < 1)
        return PyErr_Format(PyExc_ValueError, "T: expected >= 1, got %lld", T);
    if (m->cross && Tc < 1)
        return PyErr_Format(PyExc_ValueError, "Tc: this Block has cross-attention; expected a "
                            "context length >= 1, got %lld", Tc);
    if (!m->cross && Tc != 0)
        return PyErr_Format(PyExc_ValueError, "Tc: this Block has no cross-attention; expected 0, "
                            "got %lld", Tc);
    if (check_sizes("batch", B, T, Tc, m->C) < 0)
        return NULL;
    pxt_ckpt ckpt = m->ckpt;
    if (ckpt_arg != Py_None && parse_ckpt(ckpt_arg, &ckpt) < 0)
        return NULL;
    block_plan p;
    plan_block(&p, m->be, (int)B, (int)T, (int)Tc, m->C, m->H, m->cross, ckpt, m->dt);
    size_t pb = param_bytes(m), gb = m->layout.numel * sizeof(float);
    /* what the allocator will count: each buffer as a block of a fresh segment */
    size_t total = pxt_alloc_block_size(pb) + pxt_alloc_block_size(gb) +
                   pxt_alloc_block_size(p.arena_bytes);
    return Py_BuildValue(
        "{s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:s,s:L,s:L,s:L}",
        "parameters", (Py_ssize_t)pb, "gradients", (Py_ssize_t)gb,
        "inputs", (Py_ssize_t)p.inputs_bytes, "output", (Py_ssize_t)p.output_bytes,
        "saved", (Py_ssize_t)p.saved_bytes, "activation_gradients", (Py_ssize_t)p.grad_bytes,
        "work", (Py_ssize_t)p.work_bytes, "attention_workspace", (Py_ssize_t)p.attn_ws_bytes,
        "gemm_workspace", (Py_ssize_t)p.gemm_ws_bytes, "arena", (Py_ssize_t)p.arena_bytes,
        "total", (Py_ssize_t)total,
        "allocator_rounding", (Py_ssize_t)(total - pb - gb - p.arena_bytes),
        "checkpointing", ckpt_names[ckpt], "batch_size", B, "sequence_length", T,
        "context_length", Tc);
}

static PyObject *block_release_arena(PyObject *op, PyObject *unused) {
    (void)unused;
    pxt_block_obj *m = (pxt_block_obj *)op;
    if (not_busy(m, "release_arena") < 0)
        return NULL;
    size_t n = m->arena ? m->arena->nbytes : 0;
    Py_CLEAR(m->arena);
    m->pending = 0;
    return PyLong_FromSize_t(n);
}

/* ---- attributes ----------------------------------------------------------------- */

static PyObject *get_ckpt(PyObject *op, void *c) {
    (void)c;
    return PyUnicode_FromString(ckpt_names[((pxt_block_obj *)op)->ckpt]);
}

/* The policy of the next forward; a pending backward keeps the one it ran with. */
static int set_ckpt(PyObject *op, PyObject *v, void *c) {
    (void)c;
    if (!v) {
        PyErr_SetString(PyExc_TypeError, "checkpointing: cannot be deleted");
        return -1;
    }
    return parse_ckpt(v, &((pxt_block_obj *)op)->ckpt);
}

static PyObject *get_d_model(PyObject *op, void *c) {
    (void)c;
    return PyLong_FromLong(((pxt_block_obj *)op)->C);
}

static PyObject *get_n_heads(PyObject *op, void *c) {
    (void)c;
    return PyLong_FromLong(((pxt_block_obj *)op)->H);
}

static PyObject *get_cross(PyObject *op, void *c) {
    (void)c;
    return PyBool_FromLong(((pxt_block_obj *)op)->cross);
}

static PyObject *get_eps(PyObject *op, void *c) {
    (void)c;
    return PyFloat_FromDouble(((pxt_block_obj *)op)->eps);
}

static PyObject *get_device(PyObject *op, void *c) {
    (void)c;
    return pxt_device_pystr(((pxt_block_obj *)op)->device);
}

static PyObject *get_dtype(PyObject *op, void *c) {
    (void)c;
    return Py_NewRef(pxt_dtype_object(((pxt_block_obj *)op)->dt));
}

static PyObject *get_num_parameters(PyObject *op, void *c) {
    (void)c;
    pxt_block_obj *m = (pxt_block_obj *)op;
    size_t n = 0;
    for (int i = 0; i < m->layout.count; i++) n += m->layout.params[i].numel;
    return PyLong_FromSize_t(n);
}

static PyObject *get_arena_bytes(PyObject *op, void *c) {
    (void)c;
    pxt_block_obj *m = (pxt_block_obj *)op;
    return PyLong_FromSize_t(m->arena ? m->arena->nbytes : 0);
}

static PyObject *block_repr(PyObject *op) {
    pxt_block_obj *m = (pxt_block_obj *)op;
    char dname[32];
    return PyUnicode_FromFormat("Block(d_model=%d, n_heads=%d, cross_attention=%s, "
                                "checkpointing='%s', device='%s')", m->C, m->H,
                                m->cross ? "True" : "False", ckpt_names[m->ckpt],
                                pxt_device_str(m->device, dname, sizeof dname));
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

#define KW(f) (PyCFunction)(void (*)(void))(f), METH_VARARGS | METH_KEYWORDS

static PyMethodDef block_methods[] = {
    {"parameters", block_parameters, METH_NOARGS,
     "parameters() -> dict: name -> Tensor view of the flat parameter buffer"},
    {"gradients", block_gradients, METH_NOARGS,
     "gradients() -> dict: name -> Tensor view of the flat fp32 gradient buffer"},
    {"zero_grad", block_zero_grad, METH_NOARGS, "zero_grad(): every gradient := 0"},
    {"forward", KW(block_forward),
     "forward(x, key_mask=None, causal=True, context=None, context_mask=None) -> y\n\n"
     "x: (B, T, d_model) float32 Tensor or array. key_mask (B, T) and context_mask (B, Tc):\n"
     "0 = padding, never attended (a query with no visible key gets a zero attention row).\n"
     "context (B, Tc, d_model): required with cross-attention, refused without.\n"
     "Saves what the checkpoint policy says in the block's arena. y is a view of the\n"
     "arena's output slot, valid until this block's next forward."},
    {"backward", KW(block_backward),
     "backward(dy) -> dx, or (dx, dcontext) with cross-attention\n\n"
     "dy: (B, T, d_model) like forward's x. Adds into the parameter gradients. Needs a\n"
     "preceding forward (one backward per forward). dx and dcontext are views of the\n"
     "arena, valid until this block's next backward."},
    {"estimate_memory", KW(block_estimate),
     "estimate_memory(batch, T, Tc=0, checkpointing=None) -> dict of bytes by component"},
    {"release_arena", block_release_arena, METH_NOARGS,
     "release_arena() -> bytes: drop the cached arena (the next forward reserves a new one)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject block_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "pyxtts.Block",
    .tp_basicsize = sizeof(pxt_block_obj),
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

int pxt_block_init_type(PyObject *module) {
    return PyModule_AddType(module, &block_type); /* readies it; the name after the last dot */
}
