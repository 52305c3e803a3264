/* ops_cond.c: Python bindings of the conditioning path's kernels and of dropout
 * (_op_groupnorm_*, _op_rmsnorm_*, _op_geglu_*, _op_dropout_*, dropout_key), so
 * the tests can check each against float64 NumPy, finite differences and an
 * independent Philox. Same conventions as ops.c: arguments checked before any
 * work, outputs allocated, the kernel run with the GIL released, every path
 * through `done`. */
#include "ops.h" /* Python.h first */

#include <limits.h>
#include <math.h>
#include <string.h>

#include "engine/dropout.h"

/* weight-like (C) argument of x's dtype and device. */
static pxt_tensor *vec_arg(PyObject *obj, const char *name, const pxt_tensor *x, int64_t C,
                           PyObject **hold) {
    pxt_tensor *t = pxt_op_arg(obj, name, x, hold);
    if (!t || pxt_op_check_like(t, name, x) < 0 || pxt_py_check_shape(t, name, 1, &C) < 0) {
        return NULL;
    }
    return t;
}

/* fp32 statistics argument of the given shape on x's device. */
static pxt_tensor *stat_arg(PyObject *obj, const char *name, const pxt_tensor *x, int ndim,
                            const int64_t *shape, PyObject **hold) {
    pxt_tensor *t = pxt_op_arg(obj, name, x, hold);
    if (!t || pxt_py_check_device(t, name, x->device) < 0 ||
        pxt_py_check_dtype(t, name, PXT_FLOAT32) < 0 ||
        pxt_py_check_shape(t, name, ndim, shape) < 0) {
        return NULL;
    }
    return t;
}

/* An accumulator argument, or zeros when None. */
static pxt_tensor *acc_arg(PyObject *obj, const char *name, const pxt_tensor *like, pxt_dtype dt,
                           int ndim, const int64_t *shape, PyObject **hold) {
    int bad = 0;
    pxt_tensor *t = pxt_op_opt_out(obj, name, like, dt, ndim, shape, hold, &bad);
    if (bad) {
        return NULL;
    }
    if (!t && (*hold = pxt_op_new_zeros(like->device, dt, ndim, shape))) {
        t = (pxt_tensor *)*hold;
    }
    return t;
}

/* ---- GroupNorm ------------------------------------------------------------------ */

/* x (B, S, C) float with `groups` dividing C: B, S, C, G as ints. */
static int groupnorm_shape(const pxt_tensor *x, long long groups, int *B, int *S, int *C, int *G) {
    if (pxt_py_check_float(x, "x") < 0 ||
        pxt_py_check_shape(x, "x", 3, (int64_t[]){-1, -1, -1}) < 0 ||
        pxt_op_to_int(x->shape[0], "x", B) < 0 || pxt_op_to_int(x->shape[1], "x", S) < 0 ||
        pxt_op_to_int(x->shape[2], "x", C) < 0) {
        return -1;
    }
    if (*S < 1 || *C < 1 || groups < 1 || groups > *C || *C % groups) {
        PyErr_Format(PyExc_ValueError,
                     "groups: expected a divisor of the channels C=%d (and S >= 1), got %lld", *C,
                     groups);
        return -1;
    }
    *G = (int)groups;
    return 0;
}

static PyObject *op_groupnorm_forward(PyObject *m, PyObject *args, PyObject *kwargs) {
    (void)m;
    static char *kw[] = {"x", "weight", "bias", "groups", "eps", NULL};
    PyObject *x_obj, *w_obj, *b_obj;
    pxt_py_int groups = PXT_PY_INT("groups", 1, INT_MAX);
    pxt_py_real eps = PXT_PY_REAL_OPT("eps", 0.0, 0, 1.0, 0, "a number in [0, 1]", 1e-5);
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOO&|O&:_op_groupnorm_forward", kw, &x_obj,
                                     &w_obj, &b_obj, pxt_py_int_converter, &groups,
                                     pxt_py_real_converter, &eps)) {
        return NULL;
    }
    PyObject *xh = NULL, *wh = NULL, *bh = NULL, *oh = NULL, *mh = NULL, *rh = NULL;
    PyObject *result = NULL;
    int B, S, C, G;
    pxt_tensor *x = pxt_op_arg(x_obj, "x", NULL, &xh), *w, *b;
    if (!x || groupnorm_shape(x, groups.value, &B, &S, &C, &G) < 0 ||
        !(w = vec_arg(w_obj, "weight", x, C, &wh)) || !(b = vec_arg(b_obj, "bias", x, C, &bh))) {
        goto done;
    }
    const pxt_backend *be = PXT_BACKEND_OP(x->device, groupnorm_forward);
    int64_t stats[2] = {B, G};
    if (!be || !(oh = pxt_tensor_empty(x->device, x->dtype, 3, x->shape)) ||
        !(mh = pxt_tensor_empty(x->device, PXT_FLOAT32, 2, stats)) ||
        !(rh = pxt_tensor_empty(x->device, PXT_FLOAT32, 2, stats))) {
        goto done;
    }
    int rc;
    RUN_NOGIL(rc, be->groupnorm_forward(x->device.index, ((pxt_tensor *)oh)->data,
                                        (float *)((pxt_tensor *)mh)->data,
                                        (float *)((pxt_tensor *)rh)->data, x->data, w->data,
                                        b->data, B, S, C, G, (float)eps.value, x->dtype));
    if (pxt_op_status(rc) == 0) {
        result = PyTuple_Pack(3, oh, mh, rh);
    }
done:
    Py_XDECREF(xh);
    Py_XDECREF(wh);
    Py_XDECREF(bh);
    Py_XDECREF(oh);
    Py_XDECREF(mh);
    Py_XDECREF(rh);
    return result;
}

static PyObject *op_groupnorm_backward(PyObject *m, PyObject *args, PyObject *kwargs) {
    (void)m;
    static char *kw[] = {"dout",   "x",    "weight",  "mean",  "rstd",
                         "groups", "dinp", "dweight", "dbias", NULL};
    PyObject *d_obj, *x_obj, *w_obj, *m_obj, *r_obj;
    PyObject *di_obj = Py_None, *dw_obj = Py_None, *db_obj = Py_None;
    pxt_py_int groups = PXT_PY_INT("groups", 1, INT_MAX);
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOO&|OOO:_op_groupnorm_backward", kw, &d_obj,
                                     &x_obj, &w_obj, &m_obj, &r_obj, pxt_py_int_converter, &groups,
                                     &di_obj, &dw_obj, &db_obj)) {
        return NULL;
    }
    PyObject *dh = NULL, *xh = NULL, *wh = NULL, *mh = NULL, *rh = NULL;
    PyObject *dih = NULL, *dwh = NULL, *dbh = NULL, *ws = NULL, *result = NULL;
    int B, S, C, G;
    pxt_tensor *dout = pxt_op_arg(d_obj, "dout", NULL, &dh), *x, *w, *mean, *rstd, *di, *dw, *db;
    if (!dout || groupnorm_shape(dout, groups.value, &B, &S, &C, &G) < 0) {
        goto done;
    }
    int64_t stats[2] = {B, G}, c64 = C;
    if (!(x = pxt_op_arg(x_obj, "x", dout, &xh)) || pxt_op_check_like(x, "x", dout) < 0 ||
        pxt_py_check_shape(x, "x", 3, dout->shape) < 0 ||
        !(w = vec_arg(w_obj, "weight", dout, C, &wh)) ||
        !(mean = stat_arg(m_obj, "mean", dout, 2, stats, &mh)) ||
        !(rstd = stat_arg(r_obj, "rstd", dout, 2, stats, &rh)) ||
        !(di = acc_arg(di_obj, "dinp", dout, dout->dtype, 3, dout->shape, &dih)) ||
        !(dw = acc_arg(dw_obj, "dweight", dout, PXT_FLOAT32, 1, &c64, &dwh)) ||
        !(db = acc_arg(db_obj, "dbias", dout, PXT_FLOAT32, 1, &c64, &dbh))) {
        goto done;
    }
    const pxt_backend *be = PXT_BACKEND_OP(dout->device, groupnorm_backward);
    void *wsp;
    if (!be || pxt_op_scratch(dout->device, be->colsum_workspace(B * S, C), &ws, &wsp) < 0) {
        goto done;
    }
    int rc;
    RUN_NOGIL(rc, be->groupnorm_backward(dout->device.index, di->data, (float *)dw->data,
                                         (float *)db->data, dout->data, x->data, w->data,
                                         (const float *)mean->data, (const float *)rstd->data, B, S,
                                         C, G, dout->dtype, wsp));
    if (pxt_op_status(rc) == 0) {
        result = PyTuple_Pack(3, (PyObject *)di, (PyObject *)dw, (PyObject *)db);
    }
done:
    Py_XDECREF(dh);
    Py_XDECREF(xh);
    Py_XDECREF(wh);
    Py_XDECREF(mh);
    Py_XDECREF(rh);
    Py_XDECREF(dih);
    Py_XDECREF(dwh);
    Py_XDECREF(dbh);
    Py_XDECREF(ws);
    return result;
}

/* ---- RMS norm ---------------------------------------------------------------------- */

static PyObject *op_rmsnorm_forward(PyObject *m, PyObject *args, PyObject *kwargs) {
    (void)m;
    static char *kw[] = {"x", "gamma", "scale", "eps", NULL};
    PyObject *x_obj, *g_obj;
    pxt_py_real scale = PXT_PY_REAL("scale", 0.0, 1, 1e30, 0, "a finite number > 0");
    pxt_py_real eps = PXT_PY_REAL_OPT("eps", 0.0, 1, 1.0, 0, "a number in (0, 1]", 1e-12);
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO&|O&:_op_rmsnorm_forward", kw, &x_obj,
                                     &g_obj, pxt_py_real_converter, &scale, pxt_py_real_converter,
                                     &eps)) {
        return NULL;
    }
    PyObject *xh = NULL, *gh = NULL, *oh = NULL, *nh = NULL, *result = NULL;
    int N = 0, C = 0;
    pxt_tensor *x = pxt_op_arg(x_obj, "x", NULL, &xh), *g;
    if (!x || pxt_py_check_float(x, "x") < 0 || pxt_op_rows_cols(x, "x", &N, &C) < 0 ||
        !(g = vec_arg(g_obj, "gamma", x, C, &gh))) {
        goto done;
    }
    const pxt_backend *be = PXT_BACKEND_OP(x->device, rmsnorm_forward);
    if (!be || !(oh = pxt_tensor_empty(x->device, x->dtype, x->ndim, x->shape)) ||
        !(nh = pxt_tensor_empty(x->device, PXT_FLOAT32, x->ndim - 1, x->shape))) {
        goto done;
    }
    int rc;
    RUN_NOGIL(rc, be->rmsnorm_forward(x->device.index, ((pxt_tensor *)oh)->data,
                                      (float *)((pxt_tensor *)nh)->data, x->data, g->data, N, C,
                                      (float)scale.value, (float)eps.value, x->dtype));
    if (pxt_op_status(rc) == 0) {
        result = PyTuple_Pack(2, oh, nh);
    }
done:
    Py_XDECREF(xh);
    Py_XDECREF(gh);
    Py_XDECREF(oh);
    Py_XDECREF(nh);
    return result;
}

static PyObject *op_rmsnorm_backward(PyObject *m, PyObject *args, PyObject *kwargs) {
    (void)m;
    static char *kw[] = {"dout", "x", "gamma", "norm", "scale", "eps", "dinp", "dgamma", NULL};
    PyObject *d_obj, *x_obj, *g_obj, *n_obj, *di_obj = Py_None, *dg_obj = Py_None;
    pxt_py_real scale = PXT_PY_REAL("scale", 0.0, 1, 1e30, 0, "a finite number > 0");
    pxt_py_real eps = PXT_PY_REAL_OPT("eps", 0.0, 1, 1.0, 0, "a number in (0, 1]", 1e-12);
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOO&|O&OO:_op_rmsnorm_backward", kw, &d_obj,
                                     &x_obj, &g_obj, &n_obj, pxt_py_real_converter, &scale,
                                     pxt_py_real_converter, &eps, &di_obj, &dg_obj)) {
        return NULL;
    }
    PyObject *dh = NULL, *xh = NULL, *gh = NULL, *nh = NULL, *dih = NULL, *dgh = NULL;
    PyObject *ws = NULL, *result = NULL;
    int N = 0, C = 0;
    pxt_tensor *dout = pxt_op_arg(d_obj, "dout", NULL, &dh), *x, *g, *norm, *di, *dg;
    if (!dout || pxt_py_check_float(dout, "dout") < 0 ||
        pxt_op_rows_cols(dout, "dout", &N, &C) < 0) {
        goto done;
    }
    int64_t c64 = C;
    if (!(x = pxt_op_arg(x_obj, "x", dout, &xh)) || pxt_op_check_like(x, "x", dout) < 0 ||
        pxt_py_check_shape(x, "x", dout->ndim, dout->shape) < 0 ||
        !(g = vec_arg(g_obj, "gamma", dout, C, &gh)) ||
        !(norm = stat_arg(n_obj, "norm", dout, dout->ndim - 1, dout->shape, &nh)) ||
        !(di = acc_arg(di_obj, "dinp", dout, dout->dtype, dout->ndim, dout->shape, &dih)) ||
        !(dg = acc_arg(dg_obj, "dgamma", dout, PXT_FLOAT32, 1, &c64, &dgh))) {
        goto done;
    }
    const pxt_backend *be = PXT_BACKEND_OP(dout->device, rmsnorm_backward);
    void *wsp;
    if (!be || pxt_op_scratch(dout->device, be->colsum_workspace(N, C), &ws, &wsp) < 0) {
        goto done;
    }
    int rc;
    RUN_NOGIL(rc, be->rmsnorm_backward(dout->device.index, di->data, (float *)dg->data, dout->data,
                                       x->data, g->data, (const float *)norm->data, N, C,
                                       (float)scale.value, (float)eps.value, dout->dtype, wsp));
    if (pxt_op_status(rc) == 0) {
        result = PyTuple_Pack(2, (PyObject *)di, (PyObject *)dg);
    }
done:
    Py_XDECREF(dh);
    Py_XDECREF(xh);
    Py_XDECREF(gh);
    Py_XDECREF(nh);
    Py_XDECREF(dih);
    Py_XDECREF(dgh);
    Py_XDECREF(ws);
    return result;
}

/* ---- GEGLU ---------------------------------------------------------------------------- */

/* x (..., 2F) float: N rows, F > 0 as ints. */
static int geglu_shape(const pxt_tensor *x, int *N, int *F) {
    int W = 0;
    if (pxt_py_check_float(x, "x") < 0 || pxt_op_rows_cols(x, "x", N, &W) < 0) {
        return -1;
    }
    if (W % 2) {
        PyErr_Format(PyExc_ValueError, "x: the last dimension must be even ([a | gate]), got %d",
                     W);
        return -1;
    }
    *F = W / 2;
    return 0;
}

static PyObject *op_geglu_forward(PyObject *m, PyObject *args, PyObject *kwargs) {
    (void)m;
    static char *kw[] = {"x", NULL};
    PyObject *x_obj;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O:_op_geglu_forward", kw, &x_obj)) {
        return NULL;
    }
    PyObject *xh = NULL, *oh = NULL, *result = NULL;
    int N = 0, F = 0;
    pxt_tensor *x = pxt_op_arg(x_obj, "x", NULL, &xh);
    if (!x || geglu_shape(x, &N, &F) < 0) {
        goto done;
    }
    int64_t shape[PXT_MAX_DIMS];
    memcpy(shape, x->shape, sizeof(int64_t) * (size_t)x->ndim);
    shape[x->ndim - 1] = F;
    const pxt_backend *be = PXT_BACKEND_OP(x->device, geglu_forward);
    if (!be || !(oh = pxt_tensor_empty(x->device, x->dtype, x->ndim, shape))) {
        goto done;
    }
    int rc;
    RUN_NOGIL(
        rc, be->geglu_forward(x->device.index, ((pxt_tensor *)oh)->data, x->data, N, F, x->dtype));
    if (pxt_op_status(rc) == 0) {
        result = oh;
        oh = NULL;
    }
done:
    Py_XDECREF(xh);
    Py_XDECREF(oh);
    return result;
}

static PyObject *op_geglu_backward(PyObject *m, PyObject *args, PyObject *kwargs) {
    (void)m;
    static char *kw[] = {"x", "dout", NULL};
    PyObject *x_obj, *d_obj;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO:_op_geglu_backward", kw, &x_obj, &d_obj)) {
        return NULL;
    }
    PyObject *xh = NULL, *dh = NULL, *oh = NULL, *result = NULL;
    int N = 0, F = 0;
    pxt_tensor *x = pxt_op_arg(x_obj, "x", NULL, &xh), *dout;
    if (!x || geglu_shape(x, &N, &F) < 0) {
        goto done;
    }
    int64_t shape[PXT_MAX_DIMS];
    memcpy(shape, x->shape, sizeof(int64_t) * (size_t)x->ndim);
    shape[x->ndim - 1] = F;
    if (!(dout = pxt_op_arg(d_obj, "dout", x, &dh)) || pxt_op_check_like(dout, "dout", x) < 0 ||
        pxt_py_check_shape(dout, "dout", x->ndim, shape) < 0) {
        goto done;
    }
    const pxt_backend *be = PXT_BACKEND_OP(x->device, geglu_backward);
    if (!be || !(oh = pxt_tensor_empty(x->device, x->dtype, x->ndim, x->shape))) {
        goto done;
    }
    int rc;
    RUN_NOGIL(rc, be->geglu_backward(x->device.index, ((pxt_tensor *)oh)->data, x->data, dout->data,
                                     N, F, x->dtype));
    if (pxt_op_status(rc) == 0) {
        result = oh;
        oh = NULL;
    }
done:
    Py_XDECREF(xh);
    Py_XDECREF(dh);
    Py_XDECREF(oh);
    return result;
}

/* ---- dropout ----------------------------------------------------------------------------- */

/* The masks' arguments: p in [0, 1), the key, rows per sample T (default: all
 * rows), segment starts seg1 <= seg2 (default T), the first sample's number. */
typedef struct {
    pxt_py_real p;
    pxt_py_u64 key;
    pxt_py_int T, seg1, seg2, sample0;
} dropout_args;

static dropout_args dropout_args_make(void) {
    dropout_args d = {
        .p = PXT_PY_REAL("p", 0.0, 0, 1.0, 1, "a number in [0, 1)"),
        .key = PXT_PY_U64("key"),
        .T = PXT_PY_INT_OPT("rows_per_sample", 1, INT_MAX, 0),
        .seg1 = PXT_PY_INT_OPT("seg1", 0, INT_MAX, -1),
        .seg2 = PXT_PY_INT_OPT("seg2", 0, INT_MAX, -1),
        .sample0 = PXT_PY_INT_OPT("sample0", 0, UINT32_MAX, 0),
    };
    return d;
}

/* The kernel's pxt_dropout for N rows. */
static int dropout_of(const dropout_args *a, int N, pxt_dropout *out) {
    int T = a->T.a.given ? (int)a->T.value : (N > 0 ? N : 1);
    int s1 = a->seg1.a.given ? (int)a->seg1.value : T;
    int s2 = a->seg2.a.given ? (int)a->seg2.value : T;
    if (s1 > s2) {
        PyErr_Format(PyExc_ValueError, "seg2: must be >= seg1=%d, got %d", s1, s2);
        return -1;
    }
    *out = pxt_dropout_make((float)a->p.value, a->key.value, T, s1, s2, (uint32_t)a->sample0.value);
    return 0;
}

#define DROPOUT_KW "p", "key", "rows_per_sample", "seg1", "seg2", "sample0"
#define DROPOUT_FMT "O&O&|O&O&O&O&"
#define DROPOUT_ARGS(d)                                                                            \
    pxt_py_real_converter, &(d).p, pxt_py_u64_converter, &(d).key, pxt_py_int_converter, &(d).T,   \
        pxt_py_int_converter, &(d).seg1, pxt_py_int_converter, &(d).seg2, pxt_py_int_converter,    \
        &(d).sample0

/* _op_dropout_forward(x, p, key, ..., resid=None) -> resid + x * mask (x unchanged). */
static PyObject *op_dropout_forward(PyObject *m, PyObject *args, PyObject *kwargs) {
    (void)m;
    static char *kw[] = {"x", DROPOUT_KW, "resid", NULL};
    PyObject *x_obj, *r_obj = Py_None;
    dropout_args da = dropout_args_make();
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O" DROPOUT_FMT "O:_op_dropout_forward", kw,
                                     &x_obj, DROPOUT_ARGS(da), &r_obj)) {
        return NULL;
    }
    PyObject *xh = NULL, *rh = NULL, *oh = NULL, *result = NULL;
    int N = 0, C = 0;
    pxt_dropout d;
    pxt_tensor *x = pxt_op_arg(x_obj, "x", NULL, &xh), *resid = NULL;
    if (!x || pxt_py_check_float(x, "x") < 0 || pxt_op_rows_cols(x, "x", &N, &C) < 0 ||
        dropout_of(&da, N, &d) < 0) {
        goto done;
    }
    if (r_obj != Py_None && (!(resid = pxt_op_arg(r_obj, "resid", x, &rh)) ||
                             pxt_op_check_like(resid, "resid", x) < 0 ||
                             pxt_py_check_shape(resid, "resid", x->ndim, x->shape) < 0)) {
        goto done;
    }
    const pxt_backend *be = PXT_BACKEND_OP(x->device, dropout_forward);
    if (!be || !(oh = pxt_tensor_convert(x, x->device, x->dtype))) { /* a copy of x */
        goto done;
    }
    int rc;
    RUN_NOGIL(rc, be->dropout_forward(x->device.index, ((pxt_tensor *)oh)->data,
                                      resid ? resid->data : NULL, N, C, &d, x->dtype));
    if (pxt_op_status(rc) == 0) {
        result = oh;
        oh = NULL;
    }
done:
    Py_XDECREF(xh);
    Py_XDECREF(rh);
    Py_XDECREF(oh);
    return result;
}

/* _op_dropout_backward(dy, p, key, ...) -> dy * mask. */
static PyObject *op_dropout_backward(PyObject *m, PyObject *args, PyObject *kwargs) {
    (void)m;
    static char *kw[] = {"dy", DROPOUT_KW, NULL};
    PyObject *d_obj;
    dropout_args da = dropout_args_make();
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O" DROPOUT_FMT ":_op_dropout_backward", kw,
                                     &d_obj, DROPOUT_ARGS(da))) {
        return NULL;
    }
    PyObject *dh = NULL, *oh = NULL, *result = NULL;
    int N = 0, C = 0;
    pxt_dropout d;
    pxt_tensor *dy = pxt_op_arg(d_obj, "dy", NULL, &dh);
    if (!dy || pxt_py_check_float(dy, "dy") < 0 || pxt_op_rows_cols(dy, "dy", &N, &C) < 0 ||
        dropout_of(&da, N, &d) < 0) {
        goto done;
    }
    const pxt_backend *be = PXT_BACKEND_OP(dy->device, dropout_backward);
    if (!be || !(oh = pxt_tensor_empty(dy->device, dy->dtype, dy->ndim, dy->shape))) {
        goto done;
    }
    int rc;
    RUN_NOGIL(rc, be->dropout_backward(dy->device.index, ((pxt_tensor *)oh)->data, dy->data, N, C,
                                       &d, dy->dtype));
    if (pxt_op_status(rc) == 0) {
        result = oh;
        oh = NULL;
    }
done:
    Py_XDECREF(dh);
    Py_XDECREF(oh);
    return result;
}

/* dropout_key(seed, step, site) -> the Philox key of one site of one step. */
static PyObject *py_dropout_key(PyObject *m, PyObject *args, PyObject *kwargs) {
    (void)m;
    static char *kw[] = {"seed", "step", "site", NULL};
    pxt_py_u64 seed = PXT_PY_U64("seed"), step = PXT_PY_U64("step");
    pxt_py_int site = PXT_PY_INT("site", 0, UINT32_MAX);
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O&O&O&:dropout_key", kw, pxt_py_u64_converter,
                                     &seed, pxt_py_u64_converter, &step, pxt_py_int_converter,
                                     &site)) {
        return NULL;
    }
    return PyLong_FromUnsignedLongLong(
        pxt_dropout_key(seed.value, step.value, (uint32_t)site.value));
}

PyMethodDef pxt_py_ops_cond_methods[] = {
    {"_op_groupnorm_forward", PXT_PY_KW(op_groupnorm_forward),
     "_op_groupnorm_forward(x (B, S, C), weight, bias, groups, eps=1e-5) -> (out, mean, rstd)."},
    {"_op_groupnorm_backward", PXT_PY_KW(op_groupnorm_backward),
     "_op_groupnorm_backward(dout, x, weight, mean, rstd, groups, dinp=None, dweight=None, "
     "dbias=None) -> (dinp, dweight, dbias), accumulated into the given ones."},
    {"_op_rmsnorm_forward", PXT_PY_KW(op_rmsnorm_forward),
     "_op_rmsnorm_forward(x (..., C), gamma, scale, eps=1e-12) -> (out, norm)."},
    {"_op_rmsnorm_backward", PXT_PY_KW(op_rmsnorm_backward),
     "_op_rmsnorm_backward(dout, x, gamma, norm, scale, eps=1e-12, dinp=None, dgamma=None) -> "
     "(dinp, dgamma), accumulated into the given ones."},
    {"_op_geglu_forward", PXT_PY_KW(op_geglu_forward),
     "_op_geglu_forward(x (..., 2F)) -> a * gelu(gate) (..., F)."},
    {"_op_geglu_backward", PXT_PY_KW(op_geglu_backward),
     "_op_geglu_backward(x (..., 2F), dout (..., F)) -> dx (..., 2F)."},
    {"_op_dropout_forward", PXT_PY_KW(op_dropout_forward),
     "_op_dropout_forward(x (..., C), p, key, rows_per_sample=None, seg1=None, seg2=None, "
     "sample0=0, resid=None) -> resid + x * mask."},
    {"_op_dropout_backward", PXT_PY_KW(op_dropout_backward),
     "_op_dropout_backward(dy, p, key, rows_per_sample=None, seg1=None, seg2=None, sample0=0) -> "
     "dy * mask."},
    {"dropout_key", PXT_PY_KW(py_dropout_key),
     "dropout_key(seed, step, site) -> the Philox key of a dropout site at a training step."},
    {NULL, NULL, 0, NULL},
};

#undef DROPOUT_KW
#undef DROPOUT_FMT
#undef DROPOUT_ARGS
