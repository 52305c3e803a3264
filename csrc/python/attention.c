/* attention.c: the guarded attention API (attention_forward/backward/attention).
 *
 * Every argument is checked before any work: a ValueError/TypeError names the
 * argument, what was expected and what came. Then the outputs and the kernel's
 * workspace (attention_workspace bytes, a uint8 tensor freed on return) are
 * allocated and the device's backend runs with the GIL released.
 *
 *   attention_forward(q, k, v, causal=True, q_lengths=None, k_lengths=None,
 *                     key_mask=None, scale=None, max_sequence_length=None)
 *       -> (out (B, H, Tq, D), lse (B, H, Tq) float32)
 *   attention_backward(dout, q, k, v, out, lse, causal=True, q_lengths=None,
 *                      k_lengths=None, key_mask=None, scale=None) -> (dq, dk, dv)
 *   attention(q, k, v, ...) -> out
 *
 * Private, for tests and benchmarks: _attention_qkv_forward/_backward run the
 * same kernels on the model's layout, q, k, v as strided views into one
 * (B, T, 3C) buffer and out (B, T, C); _attention_cpu_isa picks the CPU tiles. */
#include "module.h" /* Python.h first */

#include <limits.h>
#include <math.h>

/* Owned references of one call, released together on every path. */
typedef struct {
    PyObject *o[32]; /* at most ~24 in a call: operands, converted lengths/mask, outputs */
    int n;
} refs;

static PyObject *keep(refs *r, PyObject *o) {
    if (o && r->n == (int)(sizeof r->o / sizeof r->o[0])) { /* cannot happen; stay exact */
        Py_DECREF(o);
        PyErr_SetString(PyExc_RuntimeError, "attention: too many temporaries");
        return NULL;
    }
    if (o) {
        r->o[r->n++] = o;
    }
    return o;
}

static void release(refs *r) {
    for (int i = 0; i < r->n; i++) {
        Py_DECREF(r->o[i]);
    }
    r->n = 0;
}

static void shape_str(const pxt_tensor *t, char *buf, size_t len) {
    size_t n = (size_t)snprintf(buf, len, "(");
    for (int i = 0; i < t->ndim && n < len; i++) {
        n += (size_t)snprintf(buf + n, len - n, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    }
    if (t->ndim == 1 && n < len) {
        n += (size_t)snprintf(buf + n, len - n, ",");
    }
    if (n < len) {
        snprintf(buf + n, len - n, ")");
    }
}

/* A tensor argument (arrays go to like's device, or the CPU), kept in r. */
static pxt_tensor *tensor_arg(refs *r, PyObject *obj, const char *name, const pxt_tensor *like) {
    if (obj == Py_None) {
        PyErr_Format(PyExc_TypeError, "%s: expected a pyxtts.Tensor or an array, got None", name);
        return NULL;
    }
    return (pxt_tensor *)keep(r, pxt_py_tensor_arg(obj, name, like));
}

/* q, k or v: 4-d (B, H, T, D) of a float dtype, like q in dtype, device, B, H, D. */
static int check_qkv(const pxt_tensor *t, const char *name, const pxt_tensor *q) {
    char s[160];
    if (!q) {
        if (pxt_py_check_float(t, name) < 0) {
            return -1;
        }
        if (t->ndim != 4) {
            shape_str(t, s, sizeof s);
            PyErr_Format(PyExc_ValueError, "%s: expected a 4-d tensor (B, H, T, D), got shape %s",
                         name, s);
            return -1;
        }
        if (t->shape[3] < 1) {
            shape_str(t, s, sizeof s);
            PyErr_Format(PyExc_ValueError, "%s: expected head dim D >= 1, got shape %s", name, s);
            return -1;
        }
        for (int i = 0; i < 4; i++) {
            if (t->shape[i] > INT_MAX) {
                shape_str(t, s, sizeof s);
                PyErr_Format(PyExc_ValueError, "%s: expected every size <= %d, got shape %s", name,
                             INT_MAX, s);
                return -1;
            }
        }
        return 0;
    }
    if (t->dtype != q->dtype) {
        PyErr_Format(PyExc_TypeError, "%s: expected dtype %s (the dtype of q), got %s", name,
                     pxt_dtype_name(q->dtype), pxt_dtype_name(t->dtype));
        return -1;
    }
    if (pxt_py_check_device(t, name, q->device) < 0) {
        return -1;
    }
    if (t->ndim != 4) {
        shape_str(t, s, sizeof s);
        PyErr_Format(PyExc_ValueError, "%s: expected a 4-d tensor (B, H, T, D), got shape %s", name,
                     s);
        return -1;
    }
    int64_t want[4] = {q->shape[0], q->shape[1], -1, q->shape[3]};
    if (pxt_py_check_shape(t, name, 4, want) < 0) {
        return -1;
    }
    if (t->shape[2] > INT_MAX) {
        PyErr_Format(PyExc_ValueError, "%s: expected T <= %d, got %lld", name, INT_MAX,
                     (long long)t->shape[2]);
        return -1;
    }
    return 0;
}

/* Per-sample lengths: int32/int64 of shape (B,) with values in [0, T]; returns
 * an int32 tensor on dev (kept in r), or NULL with an exception. */
static pxt_tensor *lengths_arg(refs *r, PyObject *obj, const char *name, int64_t B, int64_t T,
                               const char *tname, pxt_device dev) {
    pxt_tensor *t = tensor_arg(r, obj, name, NULL);
    if (!t) {
        return NULL;
    }
    if (t->dtype != PXT_INT32 && t->dtype != PXT_INT64) {
        PyErr_Format(PyExc_TypeError, "%s: expected dtype int32 or int64, got %s", name,
                     pxt_dtype_name(t->dtype));
        return NULL;
    }
    int64_t want[1] = {B};
    if (pxt_py_check_shape(t, name, 1, want) < 0) {
        return NULL;
    }
    pxt_device cpu = {PXT_CPU, 0};
    pxt_tensor *host = t;
    if (t->device.type != PXT_CPU) {
        host = (pxt_tensor *)keep(r, pxt_tensor_convert(t, cpu, t->dtype));
        if (!host) {
            return NULL;
        }
    }
    for (int64_t i = 0; i < B; i++) {
        int64_t v = host->dtype == PXT_INT32 ? ((const int32_t *)host->data)[i]
                                             : ((const int64_t *)host->data)[i];
        if (v < 0 || v > T) {
            PyErr_Format(PyExc_ValueError,
                         "%s: expected values in [0, %s=%lld], got %lld at index "
                         "%lld",
                         name, tname, (long long)T, (long long)v, (long long)i);
            return NULL;
        }
    }
    if (t->dtype == PXT_INT32 && t->device.type == dev.type && t->device.index == dev.index) {
        return t;
    }
    int64_t shape[1] = {B};
    pxt_tensor *i32 = (pxt_tensor *)keep(r, pxt_tensor_empty(cpu, PXT_INT32, 1, shape));
    if (!i32) {
        return NULL;
    }
    int32_t *dst = (int32_t *)i32->data;
    for (int64_t i = 0; i < B; i++) { /* values checked above: they fit */
        dst[i] = host->dtype == PXT_INT32 ? ((const int32_t *)host->data)[i]
                                          : (int32_t)((const int64_t *)host->data)[i];
    }
    if (dev.type == PXT_CPU) {
        return i32;
    }
    return (pxt_tensor *)keep(r, pxt_tensor_convert(i32, dev, PXT_INT32));
}

/* key_mask: bool/uint8 (B, Tk), nonzero = a valid key; on dev (kept in r). */
static pxt_tensor *key_mask_arg(refs *r, PyObject *obj, int64_t B, int64_t Tk, pxt_device dev) {
    pxt_tensor *t = tensor_arg(r, obj, "key_mask", NULL);
    if (!t) {
        return NULL;
    }
    if (t->dtype != PXT_BOOL && t->dtype != PXT_UINT8) {
        PyErr_Format(PyExc_TypeError, "key_mask: expected dtype bool or uint8, got %s",
                     pxt_dtype_name(t->dtype));
        return NULL;
    }
    int64_t want[2] = {B, Tk};
    if (pxt_py_check_shape(t, "key_mask", 2, want) < 0) {
        return NULL;
    }
    if (t->device.type == dev.type && t->device.index == dev.index) {
        return t;
    }
    return (pxt_tensor *)keep(r, pxt_tensor_convert(t, dev, t->dtype));
}

/* The options every entry shares, into a (already holding B, H, Tq, Tk, D). */
static int options(refs *r, pxt_attn_args *a, pxt_device dev, int causal, PyObject *q_lengths,
                   PyObject *k_lengths, PyObject *key_mask, PyObject *scale) {
    a->causal = causal;
    pxt_py_real s = PXT_PY_REAL_OPT("scale", 0.0, 1, INFINITY, 1, "None or a finite number > 0",
                                    1.0 / sqrt((double)a->D));
    s.f32 = 1;
    if (!pxt_py_real_converter(scale, &s)) {
        return -1;
    }
    a->scale = s.a.given ? (float)s.value : 1.0f / sqrtf((float)a->D);
    if (q_lengths != Py_None) {
        pxt_tensor *t = lengths_arg(r, q_lengths, "q_lengths", a->B, a->Tq, "Tq", dev);
        if (!t) {
            return -1;
        }
        a->q_lengths = (const int32_t *)t->data;
    }
    if (k_lengths != Py_None) {
        pxt_tensor *t = lengths_arg(r, k_lengths, "k_lengths", a->B, a->Tk, "Tk", dev);
        if (!t) {
            return -1;
        }
        a->k_lengths = (const int32_t *)t->data;
    }
    if (key_mask != Py_None) {
        pxt_tensor *t = key_mask_arg(r, key_mask, a->B, a->Tk, dev);
        if (!t) {
            return -1;
        }
        a->key_mask = (const uint8_t *)t->data;
    }
    return 0;
}

/* q (B, H, Tq, D), k and v (B, H, Tk, D): converted, checked alike; 0 or -1. */
static int qkv_args(refs *r, PyObject *qo, PyObject *ko, PyObject *vo, pxt_tensor **q,
                    pxt_tensor **k, pxt_tensor **v) {
    if (!(*q = tensor_arg(r, qo, "q", NULL)) || check_qkv(*q, "q", NULL) < 0 ||
        !(*k = tensor_arg(r, ko, "k", *q)) || check_qkv(*k, "k", *q) < 0 ||
        !(*v = tensor_arg(r, vo, "v", *q)) || check_qkv(*v, "v", *q) < 0) {
        return -1;
    }
    if ((*v)->shape[2] != (*k)->shape[2]) {
        PyErr_Format(PyExc_ValueError, "v: expected Tk=%lld keys (as k), got %lld",
                     (long long)(*k)->shape[2], (long long)(*v)->shape[2]);
        return -1;
    }
    return 0;
}

/* max_sequence_length: None or an int >= 1 that neither Tq nor Tk exceeds. */
static int check_max_len(PyObject *obj, int64_t Tq, int64_t Tk) {
    pxt_py_int m = PXT_PY_INT_OPT("max_sequence_length", 1, LLONG_MAX, 0);
    if (!pxt_py_int_converter(obj, &m)) {
        return -1;
    }
    if (m.a.given && (Tq > m.value || Tk > m.value)) {
        PyErr_Format(PyExc_ValueError,
                     "the sequence is longer than the configured maximum: Tq=%lld, Tk=%lld but "
                     "max_sequence_length=%lld; pyxtts never truncates a sequence, so shorten it "
                     "or raise the maximum",
                     (long long)Tq, (long long)Tk, m.value);
        return -1;
    }
    return 0;
}

/* (B, H, T, D) contiguous. */
static pxt_strides dense(const pxt_tensor *t) {
    return (pxt_strides){t->shape[1] * t->shape[2] * t->shape[3], t->shape[2] * t->shape[3],
                         t->shape[3]};
}

static pxt_tensor *new_tensor(refs *r, pxt_device dev, pxt_dtype dt, int ndim,
                              const int64_t *shape) {
    return (pxt_tensor *)keep(r, pxt_tensor_empty(dev, dt, ndim, shape));
}

/* A uint8 workspace tensor of nbytes (kept in r); *data is its pointer. */
static int workspace(refs *r, pxt_device dev, size_t nbytes, void **data) {
    int64_t shape[1] = {(int64_t)nbytes};
    pxt_tensor *w = new_tensor(r, dev, PXT_UINT8, 1, shape);
    if (!w) {
        return -1;
    }
    *data = w->data;
    return 0;
}

/* ---- forward ----------------------------------------------------------------- */

/* Runs the kernel: out and lse must be allocated. */
static int run_forward(const pxt_backend *be, pxt_device dev, refs *r, const pxt_attn_args *a,
                       void *out, float *lse, const void *q, const void *k, const void *v) {
    void *ws;
    if (workspace(r, dev, be->attention_workspace(a, 0), &ws) < 0) {
        return -1;
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = be->attention_forward(dev.index, a, out, lse, q, k, v, ws);
    Py_END_ALLOW_THREADS
    if (rc != PXT_OK) {
        pxt_raise(rc);
        return -1;
    }
    return 0;
}

static const pxt_backend *attention_backend(pxt_device dev, int backward) {
    const pxt_backend *be =
        backward ? PXT_BACKEND_OP(dev, attention_backward) : PXT_BACKEND_OP(dev, attention_forward);
    if (be && !be->attention_workspace) {
        return PXT_BACKEND_OP(dev, attention_workspace);
    }
    return be;
}

/* Dropout of the probabilities: p in [0, 1) and the Philox key (dropout.h); the
 * positions are the query and key indices, the samples numbered from 0. */
#define DROPOUT_P() PXT_PY_REAL_OPT("dropout_p", 0.0, 0, 1.0, 1, "a number in [0, 1)", 0.0)
#define DROPOUT_KEY() PXT_PY_U64_OPT("dropout_key", 0)
static pxt_dropout dropout_of(const pxt_attn_args *a, const pxt_py_real *p, const pxt_py_u64 *key) {
    return pxt_dropout_make((float)p->value, key->value, a->Tq, a->Tq, a->Tq, 0);
}

/* Both public forwards; want_lse picks (out, lse) or out. */
static PyObject *forward(PyObject *args, PyObject *kwargs, const char *fmt, int want_lse) {
    static char *kw[] = {"q",         "k",           "v",
                         "causal",    "q_lengths",   "k_lengths",
                         "key_mask",  "scale",       "max_sequence_length",
                         "dropout_p", "dropout_key", NULL};
    PyObject *qo, *ko, *vo, *ql = Py_None, *kl = Py_None, *km = Py_None, *sc = Py_None,
                            *maxlen = Py_None;
    pxt_py_real drop_p = DROPOUT_P();
    pxt_py_u64 drop_key = DROPOUT_KEY();
    pxt_py_bool causal = PXT_PY_BOOL_DFLT("causal", 1);
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, fmt, kw, &qo, &ko, &vo, pxt_py_bool_converter,
                                     &causal, &ql, &kl, &km, &sc, &maxlen, pxt_py_real_converter,
                                     &drop_p, pxt_py_u64_converter, &drop_key)) {
        return NULL;
    }
    refs r = {.n = 0};
    PyObject *result = NULL;
    pxt_tensor *q, *k, *v;
    if (qkv_args(&r, qo, ko, vo, &q, &k, &v) < 0) {
        goto done;
    }
    if (check_max_len(maxlen, q->shape[2], k->shape[2]) < 0) {
        goto done;
    }
    pxt_attn_args a = {.B = (int)q->shape[0],
                       .H = (int)q->shape[1],
                       .Tq = (int)q->shape[2],
                       .Tk = (int)k->shape[2],
                       .D = (int)q->shape[3],
                       .dt = q->dtype,
                       .q = dense(q),
                       .k = dense(k),
                       .v = dense(v),
                       .o = dense(q)};
    if (options(&r, &a, q->device, causal.value, ql, kl, km, sc) < 0) {
        goto done;
    }
    a.drop = dropout_of(&a, &drop_p, &drop_key);
    const pxt_backend *be = attention_backend(q->device, 0);
    if (!be) {
        goto done;
    }
    int64_t lse_shape[3] = {a.B, a.H, a.Tq};
    pxt_tensor *out = new_tensor(&r, q->device, q->dtype, 4, q->shape);
    pxt_tensor *lse = out ? new_tensor(&r, q->device, PXT_FLOAT32, 3, lse_shape) : NULL;
    if (!lse || run_forward(be, q->device, &r, &a, out->data, (float *)lse->data, q->data, k->data,
                            v->data) < 0) {
        goto done;
    }
    result = want_lse ? PyTuple_Pack(2, (PyObject *)out, (PyObject *)lse) : Py_NewRef(out);
done:
    release(&r);
    return result;
}

static PyObject *py_attention_forward(PyObject *m, PyObject *args, PyObject *kwargs) {
    (void)m;
    return forward(args, kwargs, "OOO|O&OOOOOO&O&:attention_forward", 1);
}

static PyObject *py_attention(PyObject *m, PyObject *args, PyObject *kwargs) {
    (void)m;
    return forward(args, kwargs, "OOO|O&OOOOOO&O&:attention", 0);
}

/* ---- backward ---------------------------------------------------------------- */

static int run_backward(const pxt_backend *be, pxt_device dev, refs *r, const pxt_attn_args *a,
                        void *dq, void *dk, void *dv, const void *dout, const void *q,
                        const void *k, const void *v, const void *out, const float *lse) {
    void *ws;
    if (workspace(r, dev, be->attention_workspace(a, 1), &ws) < 0) {
        return -1;
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = be->attention_backward(dev.index, a, dq, dk, dv, dout, q, k, v, out, lse, ws);
    Py_END_ALLOW_THREADS
    if (rc != PXT_OK) {
        pxt_raise(rc);
        return -1;
    }
    return 0;
}

/* lse: float32 (B, H, Tq) on dev. */
static int check_lse(const pxt_tensor *lse, const pxt_attn_args *a, pxt_device dev) {
    int64_t want[3] = {a->B, a->H, a->Tq};
    if (pxt_py_check_dtype(lse, "lse", PXT_FLOAT32) < 0 ||
        pxt_py_check_device(lse, "lse", dev) < 0 || pxt_py_check_shape(lse, "lse", 3, want) < 0) {
        return -1;
    }
    return 0;
}

static PyObject *py_attention_backward(PyObject *m, PyObject *args, PyObject *kwargs) {
    (void)m;
    static char *kw[] = {"dout",  "q",         "k",           "v",         "out",
                         "lse",   "causal",    "q_lengths",   "k_lengths", "key_mask",
                         "scale", "dropout_p", "dropout_key", NULL};
    PyObject *doo, *qo, *ko, *vo, *oo, *lo, *ql = Py_None, *kl = Py_None, *km = Py_None,
                                            *sc = Py_None;
    pxt_py_real drop_p = DROPOUT_P();
    pxt_py_u64 drop_key = DROPOUT_KEY();
    pxt_py_bool causal = PXT_PY_BOOL_DFLT("causal", 1);
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOO|O&OOOOO&O&:attention_backward", kw, &doo,
                                     &qo, &ko, &vo, &oo, &lo, pxt_py_bool_converter, &causal, &ql,
                                     &kl, &km, &sc, pxt_py_real_converter, &drop_p,
                                     pxt_py_u64_converter, &drop_key)) {
        return NULL;
    }
    refs r = {.n = 0};
    PyObject *result = NULL;
    pxt_tensor *q, *k, *v, *out, *dout, *lse;
    if (qkv_args(&r, qo, ko, vo, &q, &k, &v) < 0) {
        goto done;
    }
    if (!(out = tensor_arg(&r, oo, "out", q)) || check_qkv(out, "out", q) < 0 ||
        pxt_py_check_shape(out, "out", 4, q->shape) < 0 ||
        !(dout = tensor_arg(&r, doo, "dout", q)) || check_qkv(dout, "dout", q) < 0 ||
        pxt_py_check_shape(dout, "dout", 4, out->shape) < 0 ||
        !(lse = tensor_arg(&r, lo, "lse", q))) {
        goto done;
    }
    pxt_attn_args a = {.B = (int)q->shape[0],
                       .H = (int)q->shape[1],
                       .Tq = (int)q->shape[2],
                       .Tk = (int)k->shape[2],
                       .D = (int)q->shape[3],
                       .dt = q->dtype,
                       .q = dense(q),
                       .k = dense(k),
                       .v = dense(v),
                       .o = dense(q)};
    if (check_lse(lse, &a, q->device) < 0 ||
        options(&r, &a, q->device, causal.value, ql, kl, km, sc) < 0) {
        goto done;
    }
    a.drop = dropout_of(&a, &drop_p, &drop_key);
    const pxt_backend *be = attention_backend(q->device, 1);
    if (!be) {
        goto done;
    }
    pxt_tensor *dq = new_tensor(&r, q->device, q->dtype, 4, q->shape);
    pxt_tensor *dk = dq ? new_tensor(&r, q->device, q->dtype, 4, k->shape) : NULL;
    pxt_tensor *dv = dk ? new_tensor(&r, q->device, q->dtype, 4, v->shape) : NULL;
    if (!dv || run_backward(be, q->device, &r, &a, dq->data, dk->data, dv->data, dout->data,
                            q->data, k->data, v->data, out->data, (const float *)lse->data) < 0) {
        goto done;
    }
    result = PyTuple_Pack(3, (PyObject *)dq, (PyObject *)dk, (PyObject *)dv);
done:
    release(&r);
    return result;
}

/* ---- the model's layout: q, k, v as views into (B, T, 3C) ---------------------- */

/* qkv (B, T, 3C) float with C = n_heads * D: fills a (strides of the three views,
 * out (B, T, C) strides). */
static int qkv_layout(refs *r, PyObject *qkv_obj, int n_heads, pxt_tensor **qkv, pxt_attn_args *a) {
    pxt_tensor *t = tensor_arg(r, qkv_obj, "qkv", NULL);
    if (!t) {
        return -1;
    }
    if (pxt_py_check_float(t, "qkv") < 0) {
        return -1;
    }
    char s[160];
    shape_str(t, s, sizeof s);
    if (t->ndim != 3 || t->shape[2] % 3 || n_heads < 1 || (t->shape[2] / 3) % n_heads ||
        t->shape[2] / 3 / n_heads < 1 || t->shape[0] > INT_MAX || t->shape[1] > INT_MAX) {
        PyErr_Format(PyExc_ValueError,
                     "qkv: expected shape (B, T, 3C) with C a multiple of "
                     "n_heads=%d, got %s",
                     n_heads, s);
        return -1;
    }
    int64_t B = t->shape[0], T = t->shape[1], C = t->shape[2] / 3, D = C / n_heads;
    *a = (pxt_attn_args){
        .B = (int)B, .H = n_heads, .Tq = (int)T, .Tk = (int)T, .D = (int)D, .dt = t->dtype};
    a->q = a->k = a->v = (pxt_strides){T * 3 * C, D, 3 * C};
    a->o = (pxt_strides){T * C, D, C};
    *qkv = t;
    return 0;
}

static PyObject *py_qkv_forward(PyObject *m, PyObject *args, PyObject *kwargs) {
    (void)m;
    static char *kw[] = {"qkv",       "n_heads",  "causal", "q_lengths",
                         "k_lengths", "key_mask", "scale",  NULL};
    PyObject *qo, *ql = Py_None, *kl = Py_None, *km = Py_None, *sc = Py_None;
    pxt_py_int heads = PXT_PY_INT("n_heads", 1, INT_MAX);
    pxt_py_bool causal = PXT_PY_BOOL_DFLT("causal", 1);
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO&|O&OOOO:_attention_qkv_forward", kw, &qo,
                                     pxt_py_int_converter, &heads, pxt_py_bool_converter, &causal,
                                     &ql, &kl, &km, &sc)) {
        return NULL;
    }
    int n_heads = (int)heads.value;
    refs r = {.n = 0};
    PyObject *result = NULL;
    pxt_tensor *qkv;
    pxt_attn_args a;
    if (qkv_layout(&r, qo, n_heads, &qkv, &a) < 0 ||
        options(&r, &a, qkv->device, causal.value, ql, kl, km, sc) < 0) {
        goto done;
    }
    const pxt_backend *be = attention_backend(qkv->device, 0);
    if (!be) {
        goto done;
    }
    int64_t C = (int64_t)a.H * a.D, out_shape[3] = {a.B, a.Tq, C}, lse_shape[3] = {a.B, a.H, a.Tq};
    size_t esz = pxt_dtype_size(a.dt);
    pxt_tensor *out = new_tensor(&r, qkv->device, a.dt, 3, out_shape);
    pxt_tensor *lse = out ? new_tensor(&r, qkv->device, PXT_FLOAT32, 3, lse_shape) : NULL;
    if (!lse || run_forward(be, qkv->device, &r, &a, out->data, (float *)lse->data, qkv->data,
                            qkv->data + C * esz, qkv->data + 2 * C * esz) < 0) {
        goto done;
    }
    result = PyTuple_Pack(2, (PyObject *)out, (PyObject *)lse);
done:
    release(&r);
    return result;
}

static PyObject *py_qkv_backward(PyObject *m, PyObject *args, PyObject *kwargs) {
    (void)m;
    static char *kw[] = {"dout",      "qkv",       "out",      "lse",   "n_heads", "causal",
                         "q_lengths", "k_lengths", "key_mask", "scale", NULL};
    PyObject *doo, *qo, *oo, *lo, *ql = Py_None, *kl = Py_None, *km = Py_None, *sc = Py_None;
    pxt_py_int heads = PXT_PY_INT("n_heads", 1, INT_MAX);
    pxt_py_bool causal = PXT_PY_BOOL_DFLT("causal", 1);
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOO&|O&OOOO:_attention_qkv_backward", kw,
                                     &doo, &qo, &oo, &lo, pxt_py_int_converter, &heads,
                                     pxt_py_bool_converter, &causal, &ql, &kl, &km, &sc)) {
        return NULL;
    }
    int n_heads = (int)heads.value;
    refs r = {.n = 0};
    PyObject *result = NULL;
    pxt_tensor *qkv, *out, *dout, *lse;
    pxt_attn_args a;
    if (qkv_layout(&r, qo, n_heads, &qkv, &a) < 0) {
        goto done;
    }
    int64_t C = (int64_t)a.H * a.D, out_shape[3] = {a.B, a.Tq, C};
    if (!(out = tensor_arg(&r, oo, "out", qkv)) || pxt_py_check_dtype(out, "out", a.dt) < 0 ||
        pxt_py_check_device(out, "out", qkv->device) < 0 ||
        pxt_py_check_shape(out, "out", 3, out_shape) < 0 ||
        !(dout = tensor_arg(&r, doo, "dout", qkv)) || pxt_py_check_dtype(dout, "dout", a.dt) < 0 ||
        pxt_py_check_device(dout, "dout", qkv->device) < 0 ||
        pxt_py_check_shape(dout, "dout", 3, out_shape) < 0 ||
        !(lse = tensor_arg(&r, lo, "lse", qkv)) || check_lse(lse, &a, qkv->device) < 0 ||
        options(&r, &a, qkv->device, causal.value, ql, kl, km, sc) < 0) {
        goto done;
    }
    const pxt_backend *be = attention_backend(qkv->device, 1);
    if (!be) {
        goto done;
    }
    size_t esz = pxt_dtype_size(a.dt);
    pxt_tensor *dqkv = new_tensor(&r, qkv->device, a.dt, 3, qkv->shape);
    if (!dqkv || run_backward(be, qkv->device, &r, &a, dqkv->data, dqkv->data + C * esz,
                              dqkv->data + 2 * C * esz, dout->data, qkv->data, qkv->data + C * esz,
                              qkv->data + 2 * C * esz, out->data, (const float *)lse->data) < 0) {
        goto done;
    }
    result = Py_NewRef(dqkv);
done:
    release(&r);
    return result;
}

static PyObject *py_cpu_isa(PyObject *m, PyObject *args, PyObject *kwargs) {
    (void)m;
    static char *kw[] = {"name", NULL};
    pxt_py_str name = PXT_PY_STR_OPT("name", NULL);
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|O&:_attention_cpu_isa", kw,
                                     pxt_py_str_converter, &name)) {
        return NULL;
    }
    const pxt_backend *be = pxt_backend_for(PXT_CPU);
    const char *active = NULL;
    int rc = be->kernel_isa(name.value, &active);
    if (rc != PXT_OK) {
        return pxt_raise(rc);
    }
    return PyUnicode_FromString(active);
}

PyMethodDef pxt_py_attention_methods[] = {
    {"attention_forward", PXT_PY_KW(py_attention_forward),
     "attention_forward(q, k, v, causal=True, q_lengths=None, k_lengths=None, key_mask=None, "
     "scale=None, max_sequence_length=None) -> (out, lse)\n\n"
     "Exact tiled attention (online softmax). q (B, H, Tq, D), k and v (B, H, Tk, D), one "
     "float dtype. causal: query i sees keys j <= i. q_lengths / k_lengths (B,) int: rows past "
     "a length are zeros, keys past it are masked; key_mask (B, Tk) bool/uint8, 0 masks a key. "
     "scale defaults to 1/sqrt(D). lse (B, H, Tq) float32 is -inf for a row with no valid key "
     "(its output is zeros). A sequence longer than max_sequence_length is a ValueError."},
    {"attention_backward", PXT_PY_KW(py_attention_backward),
     "attention_backward(dout, q, k, v, out, lse, causal=True, q_lengths=None, k_lengths=None, "
     "key_mask=None, scale=None) -> (dq, dk, dv)\n\n"
     "Gradients of attention_forward (same options); recomputes the scores tile by tile from "
     "lse. Deterministic."},
    {"attention", PXT_PY_KW(py_attention),
     "attention(q, k, v, causal=True, q_lengths=None, k_lengths=None, key_mask=None, "
     "scale=None, max_sequence_length=None) -> out\n\nattention_forward without lse."},
    {"_attention_qkv_forward", PXT_PY_KW(py_qkv_forward),
     "_attention_qkv_forward(qkv, n_heads, causal=True, q_lengths=None, k_lengths=None, "
     "key_mask=None, scale=None) -> (out (B, T, C), lse): q, k, v as strided views of "
     "qkv (B, T, 3C)."},
    {"_attention_qkv_backward", PXT_PY_KW(py_qkv_backward),
     "_attention_qkv_backward(dout, qkv, out, lse, n_heads, causal=True, ...) -> dqkv "
     "(B, T, 3C)."},
    {"_attention_cpu_isa", PXT_PY_KW(py_cpu_isa),
     "_attention_cpu_isa(name=None) -> str: the CPU attention tiles' instruction set "
     "('generic', 'avx2', 'avx512'); name sets it ('auto': the best available)."},
    {NULL, NULL, 0, NULL},
};

#undef DROPOUT_P
#undef DROPOUT_KEY
