/* ops.c: Python bindings of single backend kernels (_op_*), so the tests can
 * check each op against float64 NumPy and finite differences.
 *
 * Each binding converts its arguments (pxt_py_tensor_arg: NumPy arrays become
 * tensors on the first tensor's device), checks dtypes, shapes, devices and
 * index ranges before any work, finds the op in the device's backend
 * (NotImplementedError when it has none), then allocates outputs and runs the
 * kernel with the GIL released. Every path ends at `done`, which drops each
 * reference taken, so error paths leak nothing. */
#include "ops.h" /* Python.h first */

#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>

/* ---- helpers --------------------------------------------------------------- */

/* The tensor of argument `name` (a new reference parked in *hold), or NULL. */
pxt_tensor *pxt_op_arg(PyObject *obj, const char *name, const pxt_tensor *like, PyObject **hold) {
    *hold = pxt_py_tensor_arg(obj, name, like);
    return (pxt_tensor *)*hold;
}

/* Same dtype and device as `ref` (the op's first tensor). */
int pxt_op_check_like(const pxt_tensor *t, const char *name, const pxt_tensor *ref) {
    return pxt_py_check_device(t, name, ref->device) < 0 ||
                   pxt_py_check_dtype(t, name, ref->dtype) < 0
               ? -1
               : 0;
}

/* At least `min_ndim` dimensions, at most `max_ndim`. */
int pxt_op_check_ndim(const pxt_tensor *t, const char *name, int min_ndim, int max_ndim) {
    if (t->ndim >= min_ndim && t->ndim <= max_ndim) {
        return 0;
    }
    PyErr_Format(PyExc_ValueError, "%s: expected %d to %d dimensions, got %d", name, min_ndim,
                 max_ndim, t->ndim);
    return -1;
}

/* A size the kernels take as int. */
int pxt_op_to_int(int64_t v, const char *name, int *out) {
    if (v > INT_MAX) {
        PyErr_Format(PyExc_ValueError, "%s: size %lld is too large for the kernels (at most %d)",
                     name, (long long)v, INT_MAX);
        return -1;
    }
    *out = (int)v;
    return 0;
}

/* Every element of the int32 tensor ids in [lo, hi), else ValueError naming it. */
static int check_ids(pxt_tensor *ids, const char *name, int lo, int hi) {
    PyObject *host = NULL;
    const int32_t *p = (const int32_t *)ids->data;
    if (ids->device.type != PXT_CPU && ids->numel) { /* read a host copy */
        pxt_device cpu = {PXT_CPU, 0};
        host = pxt_tensor_convert(ids, cpu, PXT_INT32);
        if (!host) {
            return -1;
        }
        p = (const int32_t *)((pxt_tensor *)host)->data;
    }
    int ret = 0;
    for (int64_t i = 0; i < ids->numel; i++) {
        if (p[i] < lo || p[i] >= hi) {
            PyErr_Format(PyExc_ValueError,
                         "%s: expected values in [%d, %d), got %d at flat index %lld", name, lo, hi,
                         (int)p[i], (long long)i);
            ret = -1;
            break;
        }
    }
    Py_XDECREF(host);
    return ret;
}

/* A new tensor of zeros (new reference) or NULL. */
PyObject *pxt_op_new_zeros(pxt_device dev, pxt_dtype dt, int ndim, const int64_t *shape) {
    PyObject *o = pxt_tensor_empty(dev, dt, ndim, shape);
    pxt_tensor *t = (pxt_tensor *)o;
    if (o && t->nbytes) {
        int rc = pxt_backend_for(dev.type)->memset_zero(dev.index, t->data, t->nbytes);
        if (rc != PXT_OK) {
            Py_DECREF(o);
            return pxt_raise(rc);
        }
    }
    return o;
}

/* A given output/accumulator argument, or NULL when absent (None): checked
 * against dtype, shape and device, and writable. *bad is set on failure. */
pxt_tensor *pxt_op_opt_out(PyObject *obj, const char *name, const pxt_tensor *like, pxt_dtype dt,
                           int ndim, const int64_t *shape, PyObject **hold, int *bad) {
    *hold = NULL;
    if (obj == Py_None) {
        return NULL;
    }
    pxt_tensor *t = pxt_op_arg(obj, name, like, hold);
    if (!t || pxt_py_check_device(t, name, like->device) < 0 ||
        pxt_py_check_dtype(t, name, dt) < 0 || pxt_py_check_shape(t, name, ndim, shape) < 0 ||
        pxt_py_check_writable(t, name) < 0) {
        *bad = 1;
        return NULL;
    }
    return t;
}

/* A uint8 scratch tensor of nbytes on dev (a new reference in *hold; none for 0
 * bytes): *data is its memory or NULL. -1 on failure (out of memory raised). */
int pxt_op_scratch(pxt_device dev, size_t nbytes, PyObject **hold, void **data) {
    *hold = NULL;
    *data = NULL;
    if (nbytes == 0) {
        return 0;
    }
    int64_t n = (int64_t)nbytes;
    if (!(*hold = pxt_tensor_empty(dev, PXT_UINT8, 1, &n))) {
        return -1;
    }
    *data = ((pxt_tensor *)*hold)->data;
    return 0;
}

/* Kernel status to an exception: 0 or -1. */
int pxt_op_status(int rc) {
    if (rc == PXT_OK) {
        return 0;
    }
    pxt_raise(rc);
    return -1;
}

static int overlaps(const pxt_tensor *a, const pxt_tensor *b) {
    if (!a->nbytes || !b->nbytes || a->device.type != b->device.type) {
        return 0;
    }
    return a->data < b->data + b->nbytes && b->data < a->data + a->nbytes;
}

/* ---- matmul ---------------------------------------------------------------- */

/* The operands of a product: A (2-d float), B like A with op(A) (M, K) op(B)
 * (K, N), the sizes as ints, alpha and beta finite float32, out_dtype a float
 * dtype (not given: A's, and given = 0). A and B are new references parked in
 * *ah, *bh. With sizes (M, N, K) given (mnk not NULL), the stored A and B may be
 * wider than the product takes: their rows are its rows, their widths at least
 * its widths, and lda, ldb their widths. 0 or -1. */
typedef struct {
    pxt_tensor *A, *B;
    int M, N, K, lda, ldb, given;
    pxt_dtype dt_c;
} gemm_operands;

/* A stored operand: `rows` rows exactly, at least `width` wide: its width, or -1. */
static int64_t operand_ld(const pxt_tensor *t, const char *name, int64_t rows, int64_t width) {
    if (t->shape[0] != rows || t->shape[1] < width) {
        PyErr_Format(PyExc_ValueError,
                     "%s: expected %lld rows of at least %lld elements for sizes, got (%lld, %lld)",
                     name, (long long)rows, (long long)width, (long long)t->shape[0],
                     (long long)t->shape[1]);
        return -1;
    }
    return t->shape[1];
}

static int parse_gemm_operands(PyObject *a_obj, PyObject *b_obj, int ta, int tb, double alpha,
                               double beta, const pxt_py_dtype *dt_arg, const int *mnk,
                               PyObject **ah, PyObject **bh, gemm_operands *g) {
    g->A = pxt_op_arg(a_obj, "A", NULL, ah);
    if (!g->A || pxt_py_check_float(g->A, "A") < 0 ||
        pxt_py_check_shape(g->A, "A", 2, (int64_t[]){-1, -1}) < 0) {
        return -1;
    }
    g->B = pxt_op_arg(b_obj, "B", g->A, bh);
    if (!g->B || pxt_op_check_like(g->B, "B", g->A) < 0) {
        return -1;
    }
    if (mnk) {
        int64_t lda = operand_ld(g->A, "A", ta ? mnk[2] : mnk[0], ta ? mnk[0] : mnk[2]);
        int64_t ldb =
            lda < 0 ? -1 : operand_ld(g->B, "B", tb ? mnk[1] : mnk[2], tb ? mnk[2] : mnk[1]);
        if (ldb < 0 || pxt_op_to_int(lda, "A", &g->lda) < 0 ||
            pxt_op_to_int(ldb, "B", &g->ldb) < 0) {
            return -1;
        }
        g->M = mnk[0], g->N = mnk[1], g->K = mnk[2];
    } else {
        int64_t M = g->A->shape[ta ? 1 : 0], K = g->A->shape[ta ? 0 : 1];
        if (pxt_py_check_shape(g->B, "B", 2, tb ? (int64_t[]){-1, K} : (int64_t[]){K, -1}) < 0) {
            return -1;
        }
        int64_t N = g->B->shape[tb ? 0 : 1];
        if (pxt_op_to_int(M, "A", &g->M) < 0 || pxt_op_to_int(K, "A", &g->K) < 0 ||
            pxt_op_to_int(N, "B", &g->N) < 0) {
            return -1;
        }
        g->lda = ta ? g->M : g->K, g->ldb = tb ? g->K : g->N;
    }
    if (!isfinite(alpha) || !isfinite(beta) || fabs(alpha) > FLT_MAX || fabs(beta) > FLT_MAX) {
        char msg[128]; /* PyErr_Format has no %g */
        snprintf(msg, sizeof msg, "alpha, beta: expected finite float32 values, got %g, %g", alpha,
                 beta);
        PyErr_SetString(PyExc_ValueError, msg);
        return -1;
    }
    g->given = dt_arg->a.given;
    g->dt_c = g->given ? dt_arg->value : g->A->dtype;
    if (g->dt_c != PXT_FLOAT32 && g->dt_c != PXT_FLOAT16 && g->dt_c != PXT_BFLOAT16) {
        PyErr_Format(PyExc_TypeError, "out_dtype: expected float32, float16 or bfloat16, got %s",
                     pxt_dtype_name(g->dt_c));
        return -1;
    }
    return 0;
}

/* sizes: None, or (M, N, K) of ints >= 0 into mnk. 0 or -1. */
static int parse_sizes(PyObject *obj, int mnk[3], int *given) {
    *given = obj != Py_None;
    if (!*given) {
        return 0;
    }
    if (!PyTuple_Check(obj) || PyTuple_GET_SIZE(obj) != 3) {
        PyErr_Format(PyExc_TypeError, "sizes: expected a tuple (M, N, K), got %s",
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    const char *names[3] = {"sizes (M)", "sizes (N)", "sizes (K)"};
    for (int i = 0; i < 3; i++) {
        pxt_py_int v = PXT_PY_INT(names[i], 0, INT_MAX);
        if (!pxt_py_int_converter(PyTuple_GET_ITEM(obj, i), &v)) {
            return -1;
        }
        mnk[i] = (int)v.value;
    }
    return 0;
}

static PyObject *op_gemm(PyObject *m, PyObject *args, PyObject *kwargs) {
    (void)m;
    static char *kw[] = {"A",    "B", "trans_a",   "trans_b", "alpha",
                         "beta", "C", "out_dtype", "sizes",   NULL};
    PyObject *a_obj, *b_obj, *c_obj = Py_None, *sizes_obj = Py_None;
    int ta = 0, tb = 0, mnk[3] = {0, 0, 0}, sized = 0;
    pxt_py_real alpha_arg = PXT_PY_NUMBER("alpha", 1.0), beta_arg = PXT_PY_NUMBER("beta", 0.0);
    pxt_py_dtype dt_arg = PXT_PY_DTYPE_OPT("out_dtype", PXT_FLOAT32);
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|ppO&O&OO&O:_op_gemm", kw, &a_obj, &b_obj,
                                     &ta, &tb, pxt_py_real_converter, &alpha_arg,
                                     pxt_py_real_converter, &beta_arg, &c_obj,
                                     pxt_py_dtype_converter, &dt_arg, &sizes_obj) ||
        parse_sizes(sizes_obj, mnk, &sized) < 0) {
        return NULL;
    }
    double alpha = alpha_arg.value, beta = beta_arg.value;
    PyObject *ah = NULL, *bh = NULL, *ch = NULL, *ws = NULL, *result = NULL;
    pxt_tensor *A, *B, *C = NULL;
    gemm_operands g;
    if (parse_gemm_operands(a_obj, b_obj, ta, tb, alpha, beta, &dt_arg, sized ? mnk : NULL, &ah,
                            &bh, &g) < 0) {
        goto done;
    }
    A = g.A, B = g.B;
    int m_ = g.M, n_ = g.N, k_ = g.K, have_dt = g.given, ldc = g.N;
    int64_t M = m_, N = n_;
    pxt_dtype dt_c = g.dt_c;
    if (c_obj != Py_None) {
        C = pxt_op_arg(c_obj, "C", A, &ch);
        if (!C) {
            goto done;
        }
        if (!have_dt) {
            dt_c = C->dtype;
        }
        if ((have_dt ? pxt_py_check_dtype(C, "C", dt_c) : pxt_py_check_float(C, "C")) < 0 ||
            pxt_py_check_device(C, "C", A->device) < 0 || pxt_py_check_writable(C, "C") < 0) {
            goto done;
        }
        if (sized) { /* C may be wider too: its width is ldc */
            int64_t w = operand_ld(C, "C", M, N);
            if (w < 0 || pxt_op_to_int(w, "C", &ldc) < 0) {
                goto done;
            }
        } else if (pxt_py_check_shape(C, "C", 2, (int64_t[]){M, N}) < 0) {
            goto done;
        }
        if (overlaps(C, A) || overlaps(C, B)) {
            PyErr_SetString(PyExc_ValueError, "C: must not share memory with A or B");
            goto done;
        }
    } else if (beta != 0.0) {
        char msg[96];
        snprintf(msg, sizeof msg, "beta: must be 0 when C is not given, got %g", beta);
        PyErr_SetString(PyExc_ValueError, msg);
        goto done;
    }
    const pxt_backend *be = PXT_BACKEND_OP(A->device, gemm_ld);
    if (!be || !PXT_BACKEND_OP(A->device, gemm_workspace)) {
        goto done;
    }
    if (!C) {
        ch = pxt_tensor_empty(A->device, dt_c, 2, (int64_t[]){M, N});
        if (!ch) {
            goto done;
        }
        C = (pxt_tensor *)ch;
    }
    void *wsp;
    if (pxt_op_scratch(A->device, be->gemm_workspace(m_, n_, k_, A->dtype), &ws, &wsp) < 0) {
        goto done;
    }
    int rc;
    RUN_NOGIL(rc, be->gemm_ld(A->device.index, ta, tb, m_, n_, k_, (float)alpha, A->data, g.lda,
                              B->data, g.ldb, (float)beta, C->data, ldc, A->dtype, dt_c, wsp));
    if (pxt_op_status(rc) < 0) {
        goto done;
    }
    result = ch;
    ch = NULL;
done:
    Py_XDECREF(ah);
    Py_XDECREF(bh);
    Py_XDECREF(ch);
    Py_XDECREF(ws);
    return result;
}

/* the epilogue names of _op_gemm_fused, in pxt_epilogue's order */
static const char *const epilogue_names[] = {"none",        "bias",    "bias_gelu",
                                             "dgelu_bgrad", "bgrad_b", NULL};

/* An optional read-only operand of dtype dt and shape on like's device: NULL
 * (and no error) when obj is None. *bad on failure. */
static pxt_tensor *opt_in(PyObject *obj, const char *name, const pxt_tensor *like, pxt_dtype dt,
                          int ndim, const int64_t *shape, PyObject **hold, int *bad) {
    *hold = NULL;
    if (obj == Py_None) {
        return NULL;
    }
    pxt_tensor *t = pxt_op_arg(obj, name, like, hold);
    if (!t || pxt_py_check_device(t, name, like->device) < 0 ||
        pxt_py_check_dtype(t, name, dt) < 0 || pxt_py_check_shape(t, name, ndim, shape) < 0) {
        *bad = 1;
        return NULL;
    }
    return t;
}

/* No output shares memory with an input (D may be C itself: the accumulation). */
static int check_fused_overlaps(pxt_epilogue epi, const pxt_tensor *A, const pxt_tensor *B,
                                const pxt_tensor *C, const pxt_tensor *D, const pxt_tensor *bias,
                                const pxt_tensor *pre, const pxt_tensor *dbias) {
    const pxt_tensor *ins[] = {A, B, C, bias, epi == PXT_EPI_DGELU_BGRAD ? pre : NULL};
    const pxt_tensor *outs[] = {D, epi == PXT_EPI_BIAS_GELU ? pre : NULL, dbias};
    const char *names[] = {"D", "pre", "dbias"};
    for (int o = 0; o < 3; o++) {
        for (int i = 0; i < 5 && outs[o]; i++) {
            if (ins[i] && overlaps(outs[o], ins[i]) && !(o == 0 && ins[i] == C && C == D)) {
                PyErr_Format(PyExc_ValueError, "%s: must not share memory with the inputs",
                             names[o]);
                return -1;
            }
        }
    }
    return 0;
}

static PyObject *op_gemm_fused(PyObject *m, PyObject *args, PyObject *kwargs) {
    (void)m;
    static char *kw[] = {"A", "B", "epilogue", "trans_a", "trans_b", "alpha",     "beta",
                         "C", "D", "bias",     "pre",     "dbias",   "out_dtype", NULL};
    PyObject *a_obj, *b_obj, *c_obj = Py_None, *d_obj = Py_None, *bias_obj = Py_None;
    PyObject *pre_obj = Py_None, *db_obj = Py_None;
    int ta = 0, tb = 0, bad = 0;
    pxt_py_choice epi_arg = PXT_PY_CHOICE_OPT("epilogue", epilogue_names, PXT_EPI_NONE);
    pxt_py_real alpha_arg = PXT_PY_NUMBER("alpha", 1.0), beta_arg = PXT_PY_NUMBER("beta", 0.0);
    pxt_py_dtype dt_arg = PXT_PY_DTYPE_OPT("out_dtype", PXT_FLOAT32);
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|O&ppO&O&OOOOOO&:_op_gemm_fused", kw, &a_obj,
                                     &b_obj, pxt_py_choice_converter, &epi_arg, &ta, &tb,
                                     pxt_py_real_converter, &alpha_arg, pxt_py_real_converter,
                                     &beta_arg, &c_obj, &d_obj, &bias_obj, &pre_obj, &db_obj,
                                     pxt_py_dtype_converter, &dt_arg)) {
        return NULL;
    }
    pxt_epilogue epi = (pxt_epilogue)epi_arg.index;
    double alpha = alpha_arg.value, beta = beta_arg.value;
    PyObject *ah = NULL, *bh = NULL, *ch = NULL, *dh = NULL, *biash = NULL, *preh = NULL;
    PyObject *dbh = NULL, *ws = NULL, *result = NULL;
    pxt_tensor *C = NULL, *D = NULL, *bias = NULL, *pre = NULL, *dbias = NULL;
    gemm_operands g;
    if (parse_gemm_operands(a_obj, b_obj, ta, tb, alpha, beta, &dt_arg, NULL, &ah, &bh, &g) < 0) {
        goto done;
    }
    int64_t N = g.N, mn[2] = {g.M, g.N};
    C = opt_in(c_obj, "C", g.A, g.dt_c, 2, mn, &ch, &bad);
    D = bad ? NULL : pxt_op_opt_out(d_obj, "D", g.A, g.dt_c, 2, mn, &dh, &bad);
    bias = bad ? NULL : opt_in(bias_obj, "bias", g.A, g.dt_c, 1, &N, &biash, &bad);
    pre = bad ? NULL : pxt_op_opt_out(pre_obj, "pre", g.A, g.dt_c, 2, mn, &preh, &bad);
    dbias = bad ? NULL : pxt_op_opt_out(db_obj, "dbias", g.A, PXT_FLOAT32, 1, &N, &dbh, &bad);
    if (bad) {
        goto done;
    }
    if (beta != 0.0 && !C && !D) {
        char msg[96];
        snprintf(msg, sizeof msg, "beta: must be 0 when neither C nor D is given, got %g", beta);
        PyErr_SetString(PyExc_ValueError, msg);
        goto done;
    }
    if (epi == PXT_EPI_DGELU_BGRAD && !pre) {
        PyErr_SetString(PyExc_ValueError, "pre: the 'dgelu_bgrad' epilogue reads it; got None");
        goto done;
    }
    if (check_fused_overlaps(epi, g.A, g.B, C, D, bias, pre, dbias) < 0) {
        goto done;
    }
    const pxt_backend *be = PXT_BACKEND_OP(g.A->device, gemm_fused);
    if (!be || !PXT_BACKEND_OP(g.A->device, gemm_fused_workspace)) {
        goto done;
    }
    if (!D) {
        if (!(dh = pxt_tensor_empty(g.A->device, g.dt_c, 2, mn))) {
            goto done;
        }
        D = (pxt_tensor *)dh;
    }
    if (epi == PXT_EPI_BIAS_GELU && !pre) {
        if (!(preh = pxt_tensor_empty(g.A->device, g.dt_c, 2, mn))) {
            goto done;
        }
        pre = (pxt_tensor *)preh;
    }
    if ((epi == PXT_EPI_DGELU_BGRAD || epi == PXT_EPI_BGRAD_B) && !dbias) {
        if (!(dbh = pxt_op_new_zeros(g.A->device, PXT_FLOAT32, 1, &N))) {
            goto done;
        }
        dbias = (pxt_tensor *)dbh;
    }
    pxt_gemm_args ga = {.trans_a = ta,
                        .trans_b = tb,
                        .M = g.M,
                        .N = g.N,
                        .K = g.K,
                        .alpha = (float)alpha,
                        .beta = (float)beta,
                        .A = g.A->data,
                        .B = g.B->data,
                        .C = C ? C->data : NULL,
                        .D = D->data,
                        .dt_ab = g.A->dtype,
                        .dt_c = g.dt_c,
                        .epilogue = epi,
                        .bias = bias ? bias->data : NULL,
                        .pre = pre ? pre->data : NULL,
                        .dbias = dbias ? (float *)dbias->data : NULL};
    void *wsp;
    if (pxt_op_scratch(g.A->device, be->gemm_fused_workspace(&ga), &ws, &wsp) < 0) {
        goto done;
    }
    int rc;
    RUN_NOGIL(rc, be->gemm_fused(g.A->device.index, &ga, wsp));
    if (pxt_op_status(rc) < 0) {
        goto done;
    }
    result = PyTuple_Pack(3, (PyObject *)D, pre ? (PyObject *)pre : Py_None,
                          dbias ? (PyObject *)dbias : Py_None);
done:
    Py_XDECREF(ah);
    Py_XDECREF(bh);
    Py_XDECREF(ch);
    Py_XDECREF(dh);
    Py_XDECREF(biash);
    Py_XDECREF(preh);
    Py_XDECREF(dbh);
    Py_XDECREF(ws);
    return result;
}

static PyObject *op_add_bias(PyObject *m, PyObject *args, PyObject *kwargs) {
    (void)m;
    static char *kw[] = {"out", "bias", NULL};
    PyObject *o_obj, *b_obj;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO:_op_add_bias", kw, &o_obj, &b_obj)) {
        return NULL;
    }
    PyObject *oh = NULL, *bh = NULL, *result = NULL;
    pxt_tensor *out = pxt_op_arg(o_obj, "out", NULL, &oh), *bias;
    if (!out || pxt_py_check_float(out, "out") < 0 ||
        pxt_py_check_shape(out, "out", 2, (int64_t[]){-1, -1}) < 0 ||
        pxt_py_check_writable(out, "out") < 0) {
        goto done;
    }
    bias = pxt_op_arg(b_obj, "bias", out, &bh);
    if (!bias || pxt_op_check_like(bias, "bias", out) < 0 ||
        pxt_py_check_shape(bias, "bias", 1, (int64_t[]){out->shape[1]}) < 0) {
        goto done;
    }
    int M = 0, N = 0;
    if (pxt_op_to_int(out->shape[0], "out", &M) < 0 ||
        pxt_op_to_int(out->shape[1], "out", &N) < 0) {
        goto done;
    }
    const pxt_backend *be = PXT_BACKEND_OP(out->device, add_bias);
    if (!be) {
        goto done;
    }
    int rc;
    RUN_NOGIL(rc, be->add_bias(out->device.index, out->data, bias->data, M, N, out->dtype));
    if (pxt_op_status(rc) < 0) {
        goto done;
    }
    Py_INCREF(Py_None);
    result = Py_None;
done:
    Py_XDECREF(oh);
    Py_XDECREF(bh);
    return result;
}

static PyObject *op_bias_backward(PyObject *m, PyObject *args, PyObject *kwargs) {
    (void)m;
    static char *kw[] = {"dout", "dbias", "cols", NULL};
    PyObject *d_obj, *db_obj = Py_None;
    pxt_py_int cols_arg = PXT_PY_INT_OPT("cols", 0, INT_MAX, -1);
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|OO&:_op_bias_backward", kw, &d_obj, &db_obj,
                                     pxt_py_int_converter, &cols_arg)) {
        return NULL;
    }
    PyObject *dh = NULL, *dbh = NULL, *ws = NULL, *result = NULL;
    int bad = 0;
    void *wsp;
    pxt_tensor *dout = pxt_op_arg(d_obj, "dout", NULL, &dh), *dbias;
    if (!dout || pxt_py_check_float(dout, "dout") < 0 ||
        pxt_py_check_shape(dout, "dout", 2, (int64_t[]){-1, -1}) < 0) {
        goto done;
    }
    /* cols: the sums of the leading columns only, the rows dout's width apart */
    int64_t n64 = cols_arg.a.given ? cols_arg.value : dout->shape[1];
    if (n64 > dout->shape[1]) {
        PyErr_Format(PyExc_ValueError, "cols: expected at most dout's %lld columns, got %lld",
                     (long long)dout->shape[1], (long long)n64);
        goto done;
    }
    dbias = pxt_op_opt_out(db_obj, "dbias", dout, PXT_FLOAT32, 1, &n64, &dbh, &bad);
    int M = 0, N = 0, ld = 0;
    if (bad || pxt_op_to_int(dout->shape[0], "dout", &M) < 0 ||
        pxt_op_to_int(n64, "dout", &N) < 0 || pxt_op_to_int(dout->shape[1], "dout", &ld) < 0) {
        goto done;
    }
    const pxt_backend *be = PXT_BACKEND_OP(dout->device, bias_backward);
    if (!be || pxt_op_scratch(dout->device, be->colsum_workspace(M, N), &ws, &wsp) < 0) {
        goto done;
    }
    if (!dbias) {
        if (!(dbh = pxt_op_new_zeros(dout->device, PXT_FLOAT32, 1, &n64))) {
            goto done;
        }
        dbias = (pxt_tensor *)dbh;
    }
    int rc;
    RUN_NOGIL(rc, be->bias_backward(dout->device.index, (float *)dbias->data, dout->data, M, N, ld,
                                    dout->dtype, wsp));
    if (pxt_op_status(rc) < 0) {
        goto done;
    }
    result = dbh;
    dbh = NULL;
done:
    Py_XDECREF(dh);
    Py_XDECREF(dbh);
    Py_XDECREF(ws);
    return result;
}

/* ---- layernorm ------------------------------------------------------------- */

/* x (..., C): N rows of C > 0 as ints. */
int pxt_op_rows_cols(const pxt_tensor *x, const char *name, int *N, int *C) {
    if (pxt_op_check_ndim(x, name, 1, PXT_MAX_DIMS) < 0) {
        return -1;
    }
    int64_t c = x->shape[x->ndim - 1];
    if (c <= 0) {
        PyErr_Format(PyExc_ValueError, "%s: the last dimension must be > 0, got %lld", name,
                     (long long)c);
        return -1;
    }
    return pxt_op_to_int(x->numel / c, name, N) < 0 || pxt_op_to_int(c, name, C) < 0 ? -1 : 0;
}

static PyObject *op_layernorm_forward(PyObject *m, PyObject *args, PyObject *kwargs) {
    (void)m;
    static char *kw[] = {"x", "weight", "bias", "eps", NULL};
    PyObject *x_obj, *w_obj, *b_obj;
    pxt_py_real eps_arg = PXT_PY_NUMBER("eps", 1e-5);
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO|O&:_op_layernorm_forward", kw, &x_obj,
                                     &w_obj, &b_obj, pxt_py_real_converter, &eps_arg)) {
        return NULL;
    }
    double eps = eps_arg.value;
    PyObject *xh = NULL, *wh = NULL, *bh = NULL, *oh = NULL, *mh = NULL, *rh = NULL;
    PyObject *result = NULL;
    int N = 0, C = 0;
    pxt_tensor *x = pxt_op_arg(x_obj, "x", NULL, &xh), *w, *b;
    if (!x || pxt_py_check_float(x, "x") < 0 || pxt_op_rows_cols(x, "x", &N, &C) < 0) {
        goto done;
    }
    int64_t c64 = C;
    w = pxt_op_arg(w_obj, "weight", x, &wh);
    if (!w || pxt_op_check_like(w, "weight", x) < 0 ||
        pxt_py_check_shape(w, "weight", 1, &c64) < 0) {
        goto done;
    }
    b = pxt_op_arg(b_obj, "bias", x, &bh);
    if (!b || pxt_op_check_like(b, "bias", x) < 0 || pxt_py_check_shape(b, "bias", 1, &c64) < 0) {
        goto done;
    }
    if (!(eps >= 0.0 && eps <= FLT_MAX)) {
        char msg[96];
        snprintf(msg, sizeof msg, "eps: expected a finite value >= 0, got %g", eps);
        PyErr_SetString(PyExc_ValueError, msg);
        goto done;
    }
    const pxt_backend *be = PXT_BACKEND_OP(x->device, layernorm_forward);
    if (!be) {
        goto done;
    }
    /* out like x; mean, rstd (...) fp32 */
    if (!(oh = pxt_tensor_empty(x->device, x->dtype, x->ndim, x->shape)) ||
        !(mh = pxt_tensor_empty(x->device, PXT_FLOAT32, x->ndim - 1, x->shape)) ||
        !(rh = pxt_tensor_empty(x->device, PXT_FLOAT32, x->ndim - 1, x->shape))) {
        goto done;
    }
    int rc;
    RUN_NOGIL(rc, be->layernorm_forward(x->device.index, ((pxt_tensor *)oh)->data,
                                        (float *)((pxt_tensor *)mh)->data,
                                        (float *)((pxt_tensor *)rh)->data, x->data, w->data,
                                        b->data, N, C, (float)eps, x->dtype));
    if (pxt_op_status(rc) < 0) {
        goto done;
    }
    result = PyTuple_Pack(3, oh, mh, rh);
done:
    Py_XDECREF(xh);
    Py_XDECREF(wh);
    Py_XDECREF(bh);
    Py_XDECREF(oh);
    Py_XDECREF(mh);
    Py_XDECREF(rh);
    return result;
}

static PyObject *op_layernorm_backward(PyObject *m, PyObject *args, PyObject *kwargs) {
    (void)m;
    static char *kw[] = {"dout", "x", "weight", "mean", "rstd", "dinp", "dweight", "dbias", NULL};
    PyObject *d_obj, *x_obj, *w_obj, *m_obj, *r_obj;
    PyObject *di_obj = Py_None, *dw_obj = Py_None, *db_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOO|OOO:_op_layernorm_backward", kw, &d_obj,
                                     &x_obj, &w_obj, &m_obj, &r_obj, &di_obj, &dw_obj, &db_obj)) {
        return NULL;
    }
    PyObject *dh = NULL, *xh = NULL, *wh = NULL, *mh = NULL, *rh = NULL;
    PyObject *dih = NULL, *dwh = NULL, *dbh = NULL, *ws = NULL, *result = NULL;
    int N = 0, C = 0, bad = 0;
    void *wsp;
    pxt_tensor *dout = pxt_op_arg(d_obj, "dout", NULL, &dh), *x, *w, *mean, *rstd, *dinp, *dw, *db;
    if (!dout || pxt_py_check_float(dout, "dout") < 0 ||
        pxt_op_rows_cols(dout, "dout", &N, &C) < 0) {
        goto done;
    }
    int64_t c64 = C;
    x = pxt_op_arg(x_obj, "x", dout, &xh);
    if (!x || pxt_op_check_like(x, "x", dout) < 0 ||
        pxt_py_check_shape(x, "x", dout->ndim, dout->shape) < 0) {
        goto done;
    }
    w = pxt_op_arg(w_obj, "weight", dout, &wh);
    if (!w || pxt_op_check_like(w, "weight", dout) < 0 ||
        pxt_py_check_shape(w, "weight", 1, &c64) < 0) {
        goto done;
    }
    mean = pxt_op_arg(m_obj, "mean", dout, &mh);
    if (!mean || pxt_py_check_device(mean, "mean", dout->device) < 0 ||
        pxt_py_check_dtype(mean, "mean", PXT_FLOAT32) < 0 ||
        pxt_py_check_shape(mean, "mean", dout->ndim - 1, dout->shape) < 0) {
        goto done;
    }
    rstd = pxt_op_arg(r_obj, "rstd", dout, &rh);
    if (!rstd || pxt_py_check_device(rstd, "rstd", dout->device) < 0 ||
        pxt_py_check_dtype(rstd, "rstd", PXT_FLOAT32) < 0 ||
        pxt_py_check_shape(rstd, "rstd", dout->ndim - 1, dout->shape) < 0) {
        goto done;
    }
    dinp = pxt_op_opt_out(di_obj, "dinp", dout, dout->dtype, dout->ndim, dout->shape, &dih, &bad);
    if (bad) {
        goto done;
    }
    dw = pxt_op_opt_out(dw_obj, "dweight", dout, PXT_FLOAT32, 1, &c64, &dwh, &bad);
    if (bad) {
        goto done;
    }
    db = pxt_op_opt_out(db_obj, "dbias", dout, PXT_FLOAT32, 1, &c64, &dbh, &bad);
    if (bad) {
        goto done;
    }
    const pxt_backend *be = PXT_BACKEND_OP(dout->device, layernorm_backward);
    if (!be || pxt_op_scratch(dout->device, be->colsum_workspace(N, C), &ws, &wsp) < 0) {
        goto done;
    }
    if (!dinp) {
        if (!(dih = pxt_op_new_zeros(dout->device, dout->dtype, dout->ndim, dout->shape))) {
            goto done;
        }
        dinp = (pxt_tensor *)dih;
    }
    if (!dw) {
        if (!(dwh = pxt_op_new_zeros(dout->device, PXT_FLOAT32, 1, &c64))) {
            goto done;
        }
        dw = (pxt_tensor *)dwh;
    }
    if (!db) {
        if (!(dbh = pxt_op_new_zeros(dout->device, PXT_FLOAT32, 1, &c64))) {
            goto done;
        }
        db = (pxt_tensor *)dbh;
    }
    int rc;
    RUN_NOGIL(rc, be->layernorm_backward(dout->device.index, dinp->data, (float *)dw->data,
                                         (float *)db->data, dout->data, x->data, w->data,
                                         (const float *)mean->data, (const float *)rstd->data, N, C,
                                         dout->dtype, wsp));
    if (pxt_op_status(rc) < 0) {
        goto done;
    }
    result = PyTuple_Pack(3, dih, dwh, dbh);
done:
    Py_XDECREF(ws);
    Py_XDECREF(dh);
    Py_XDECREF(xh);
    Py_XDECREF(wh);
    Py_XDECREF(mh);
    Py_XDECREF(rh);
    Py_XDECREF(dih);
    Py_XDECREF(dwh);
    Py_XDECREF(dbh);
    return result;
}

/* ---- gelu, add ------------------------------------------------------------- */

static PyObject *op_gelu_forward(PyObject *m, PyObject *args, PyObject *kwargs) {
    (void)m;
    static char *kw[] = {"x", NULL};
    PyObject *x_obj;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O:_op_gelu_forward", kw, &x_obj)) {
        return NULL;
    }
    PyObject *xh = NULL, *oh = NULL, *result = NULL;
    pxt_tensor *x = pxt_op_arg(x_obj, "x", NULL, &xh);
    if (!x || pxt_py_check_float(x, "x") < 0) {
        goto done;
    }
    const pxt_backend *be = PXT_BACKEND_OP(x->device, gelu_forward);
    if (!be || !(oh = pxt_tensor_empty(x->device, x->dtype, x->ndim, x->shape))) {
        goto done;
    }
    int rc;
    RUN_NOGIL(rc, be->gelu_forward(x->device.index, ((pxt_tensor *)oh)->data, x->data,
                                   (size_t)x->numel, x->dtype));
    if (pxt_op_status(rc) < 0) {
        goto done;
    }
    result = oh;
    oh = NULL;
done:
    Py_XDECREF(xh);
    Py_XDECREF(oh);
    return result;
}

static PyObject *op_gelu_backward(PyObject *m, PyObject *args, PyObject *kwargs) {
    (void)m;
    static char *kw[] = {"x", "dout", NULL};
    PyObject *x_obj, *d_obj;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO:_op_gelu_backward", kw, &x_obj, &d_obj)) {
        return NULL;
    }
    PyObject *xh = NULL, *dh = NULL, *oh = NULL, *result = NULL;
    pxt_tensor *x = pxt_op_arg(x_obj, "x", NULL, &xh), *dout;
    if (!x || pxt_py_check_float(x, "x") < 0) {
        goto done;
    }
    dout = pxt_op_arg(d_obj, "dout", x, &dh);
    if (!dout || pxt_op_check_like(dout, "dout", x) < 0 ||
        pxt_py_check_shape(dout, "dout", x->ndim, x->shape) < 0) {
        goto done;
    }
    const pxt_backend *be = PXT_BACKEND_OP(x->device, gelu_backward);
    if (!be || !(oh = pxt_tensor_empty(x->device, x->dtype, x->ndim, x->shape))) {
        goto done;
    }
    int rc;
    RUN_NOGIL(rc, be->gelu_backward(x->device.index, ((pxt_tensor *)oh)->data, x->data, dout->data,
                                    (size_t)x->numel, x->dtype));
    if (pxt_op_status(rc) < 0) {
        goto done;
    }
    result = oh;
    oh = NULL;
done:
    Py_XDECREF(xh);
    Py_XDECREF(dh);
    Py_XDECREF(oh);
    return result;
}

static PyObject *op_add(PyObject *m, PyObject *args, PyObject *kwargs) {
    (void)m;
    static char *kw[] = {"a", "b", NULL};
    PyObject *a_obj, *b_obj;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO:_op_add", kw, &a_obj, &b_obj)) {
        return NULL;
    }
    PyObject *ah = NULL, *bh = NULL, *oh = NULL, *result = NULL;
    pxt_tensor *a = pxt_op_arg(a_obj, "a", NULL, &ah), *b;
    if (!a || pxt_py_check_float(a, "a") < 0) {
        goto done;
    }
    b = pxt_op_arg(b_obj, "b", a, &bh);
    if (!b || pxt_op_check_like(b, "b", a) < 0 ||
        pxt_py_check_shape(b, "b", a->ndim, a->shape) < 0) {
        goto done;
    }
    const pxt_backend *be = PXT_BACKEND_OP(a->device, add);
    if (!be || !(oh = pxt_tensor_empty(a->device, a->dtype, a->ndim, a->shape))) {
        goto done;
    }
    int rc;
    RUN_NOGIL(rc, be->add(a->device.index, ((pxt_tensor *)oh)->data, a->data, b->data,
                          (size_t)a->numel, a->dtype));
    if (pxt_op_status(rc) < 0) {
        goto done;
    }
    result = oh;
    oh = NULL;
done:
    Py_XDECREF(ah);
    Py_XDECREF(bh);
    Py_XDECREF(oh);
    return result;
}

/* ---- embedding ------------------------------------------------------------- */

/* ids int32 of at most PXT_MAX_DIMS - 1 dims (the output adds C); N as int. */
static int check_id_tensor(const pxt_tensor *ids, const char *name, int *N) {
    if (pxt_py_check_dtype(ids, name, PXT_INT32) < 0 ||
        pxt_op_check_ndim(ids, name, 0, PXT_MAX_DIMS - 1) < 0) {
        return -1;
    }
    return pxt_op_to_int(ids->numel, name, N);
}

static PyObject *op_embedding_forward(PyObject *m, PyObject *args, PyObject *kwargs) {
    (void)m;
    static char *kw[] = {"ids", "table", "out", NULL};
    PyObject *i_obj, *t_obj, *o_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|O:_op_embedding_forward", kw, &i_obj, &t_obj,
                                     &o_obj)) {
        return NULL;
    }
    PyObject *ih = NULL, *th = NULL, *oh = NULL, *result = NULL;
    int N = 0, V = 0, C = 0, bad = 0;
    pxt_tensor *ids = pxt_op_arg(i_obj, "ids", NULL, &ih), *table, *out;
    if (!ids || check_id_tensor(ids, "ids", &N) < 0) {
        goto done;
    }
    table = pxt_op_arg(t_obj, "table", ids, &th);
    if (!table || pxt_py_check_device(table, "table", ids->device) < 0 ||
        pxt_py_check_float(table, "table") < 0 ||
        pxt_py_check_shape(table, "table", 2, (int64_t[]){-1, -1}) < 0 ||
        pxt_op_to_int(table->shape[0], "table", &V) < 0 ||
        pxt_op_to_int(table->shape[1], "table", &C) < 0) {
        goto done;
    }
    int64_t oshape[PXT_MAX_DIMS]; /* ids.shape + (C,) */
    for (int d = 0; d < ids->ndim; d++) {
        oshape[d] = ids->shape[d];
    }
    oshape[ids->ndim] = C;
    out = pxt_op_opt_out(o_obj, "out", table, table->dtype, ids->ndim + 1, oshape, &oh, &bad);
    if (bad) {
        goto done;
    }
    if (out && overlaps(out, table)) {
        PyErr_SetString(PyExc_ValueError, "out: must not share memory with table");
        goto done;
    }
    const pxt_backend *be = PXT_BACKEND_OP(ids->device, embedding_forward);
    if (!be || check_ids(ids, "ids", 0, V) < 0) {
        goto done;
    }
    int accumulate = out != NULL;
    if (!out) {
        if (!(oh = pxt_tensor_empty(ids->device, table->dtype, ids->ndim + 1, oshape))) {
            goto done;
        }
        out = (pxt_tensor *)oh;
    }
    int rc;
    RUN_NOGIL(rc, be->embedding_forward(ids->device.index, out->data, (const int32_t *)ids->data,
                                        table->data, N, C, accumulate, table->dtype));
    if (pxt_op_status(rc) < 0) {
        goto done;
    }
    result = oh;
    oh = NULL;
done:
    Py_XDECREF(ih);
    Py_XDECREF(th);
    Py_XDECREF(oh);
    return result;
}

static PyObject *op_embedding_backward(PyObject *m, PyObject *args, PyObject *kwargs) {
    (void)m;
    static char *kw[] = {"ids", "dout", "V", "dtable", NULL};
    PyObject *i_obj, *d_obj, *dt_obj = Py_None;
    pxt_py_int V_arg = PXT_PY_INT("V", LLONG_MIN, LLONG_MAX);
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO&|O:_op_embedding_backward", kw, &i_obj,
                                     &d_obj, pxt_py_int_converter, &V_arg, &dt_obj)) {
        return NULL;
    }
    long long V = V_arg.value;
    PyObject *ih = NULL, *dh = NULL, *dth = NULL, *ws = NULL, *result = NULL;
    int N = 0, C = 0, v_ = 0, bad = 0;
    void *wsp;
    pxt_tensor *ids = pxt_op_arg(i_obj, "ids", NULL, &ih), *dout, *dtable;
    if (!ids || check_id_tensor(ids, "ids", &N) < 0) {
        goto done;
    }
    dout = pxt_op_arg(d_obj, "dout", ids, &dh);
    int64_t dshape[PXT_MAX_DIMS]; /* ids.shape + (C,) */
    for (int d = 0; d < ids->ndim; d++) {
        dshape[d] = ids->shape[d];
    }
    dshape[ids->ndim] = -1;
    if (!dout || pxt_py_check_device(dout, "dout", ids->device) < 0 ||
        pxt_py_check_float(dout, "dout") < 0 ||
        pxt_py_check_shape(dout, "dout", ids->ndim + 1, dshape) < 0 ||
        pxt_op_to_int(dout->shape[ids->ndim], "dout", &C) < 0) {
        goto done;
    }
    if (V <= 0 || V > INT_MAX) {
        PyErr_Format(PyExc_ValueError, "V: expected a table size in [1, %d], got %lld", INT_MAX, V);
        goto done;
    }
    v_ = (int)V;
    int64_t tshape[2] = {V, C};
    dtable = pxt_op_opt_out(dt_obj, "dtable", ids, PXT_FLOAT32, 2, tshape, &dth, &bad);
    if (bad) {
        goto done;
    }
    if (dtable && overlaps(dtable, dout)) {
        PyErr_SetString(PyExc_ValueError, "dtable: must not share memory with dout");
        goto done;
    }
    const pxt_backend *be = PXT_BACKEND_OP(ids->device, embedding_backward);
    if (!be || check_ids(ids, "ids", 0, v_) < 0 ||
        pxt_op_scratch(ids->device, be->embedding_workspace(N, C, v_), &ws, &wsp) < 0) {
        goto done;
    }
    if (!dtable) {
        if (!(dth = pxt_op_new_zeros(ids->device, PXT_FLOAT32, 2, tshape))) {
            goto done;
        }
        dtable = (pxt_tensor *)dth;
    }
    int rc;
    RUN_NOGIL(rc, be->embedding_backward(ids->device.index, (float *)dtable->data, dout->data,
                                         (const int32_t *)ids->data, N, C, v_, dout->dtype, wsp));
    if (pxt_op_status(rc) < 0) {
        goto done;
    }
    result = dth;
    dth = NULL;
done:
    Py_XDECREF(ws);
    Py_XDECREF(ih);
    Py_XDECREF(dh);
    Py_XDECREF(dth);
    return result;
}

/* ---- cross-entropy, sum ---------------------------------------------------- */

static PyObject *op_softmax_xent(PyObject *m, PyObject *args, PyObject *kwargs) {
    (void)m;
    static char *kw[] = {"logits", "targets", "scale", "backward", "bias", "vocab", NULL};
    PyObject *l_obj, *t_obj, *b_obj = Py_None;
    pxt_py_real scale_arg = PXT_PY_NUMBER("scale", 1.0);
    pxt_py_int vocab_arg = PXT_PY_INT_OPT("vocab", 1, INT_MAX, -1);
    int backward = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|O&pOO&:_op_softmax_xent", kw, &l_obj, &t_obj,
                                     pxt_py_real_converter, &scale_arg, &backward, &b_obj,
                                     pxt_py_int_converter, &vocab_arg)) {
        return NULL;
    }
    double scale = scale_arg.value;
    PyObject *lh = NULL, *th = NULL, *bh = NULL, *gh = NULL, *losses = NULL, *result = NULL;
    int N = 0, V = 0, ld = 0, bad = 0;
    pxt_tensor *logits = pxt_op_arg(l_obj, "logits", NULL, &lh), *targets, *bias;
    if (!logits || pxt_py_check_dtype(logits, "logits", PXT_FLOAT32) < 0 ||
        pxt_op_rows_cols(logits, "logits", &N, &ld) < 0) {
        goto done;
    }
    /* vocab: the classes are the leading columns, the rows the last dimension apart */
    V = vocab_arg.a.given ? (int)vocab_arg.value : ld;
    if (V > ld) {
        PyErr_Format(PyExc_ValueError, "vocab: expected at most logits' %d columns, got %d", ld, V);
        goto done;
    }
    int64_t v64 = V;
    bias = opt_in(b_obj, "bias", logits, PXT_FLOAT32, 1, &v64, &bh, &bad);
    if (bad) {
        goto done;
    }
    targets = pxt_op_arg(t_obj, "targets", logits, &th);
    if (!targets || pxt_py_check_device(targets, "targets", logits->device) < 0 ||
        pxt_py_check_dtype(targets, "targets", PXT_INT32) < 0 ||
        pxt_py_check_shape(targets, "targets", logits->ndim - 1, logits->shape) < 0) {
        goto done;
    }
    if (!(fabs(scale) <= FLT_MAX)) {
        char msg[96];
        snprintf(msg, sizeof msg, "scale: expected a finite float32 value, got %g", scale);
        PyErr_SetString(PyExc_ValueError, msg);
        goto done;
    }
    const pxt_backend *be = PXT_BACKEND_OP(logits->device, softmax_xent);
    if (!be || check_ids(targets, "targets", -1, V) < 0) {
        goto done;
    }
    if (!(losses = pxt_tensor_empty(logits->device, PXT_FLOAT32, targets->ndim, targets->shape))) {
        goto done;
    }
    /* the kernel overwrites logits with the gradient: work on a copy */
    pxt_tensor *work = logits;
    if (backward) {
        if (!(gh = pxt_tensor_convert(logits, logits->device, PXT_FLOAT32))) {
            goto done;
        }
        work = (pxt_tensor *)gh;
    }
    int rc;
    RUN_NOGIL(rc, be->softmax_xent(logits->device.index, (float *)work->data, ld,
                                   bias ? (const float *)bias->data : NULL,
                                   (float *)((pxt_tensor *)losses)->data,
                                   (const int32_t *)targets->data, N, V, (float)scale, backward));
    if (pxt_op_status(rc) < 0) {
        goto done;
    }
    result = PyTuple_Pack(2, losses, gh ? gh : Py_None);
done:
    Py_XDECREF(lh);
    Py_XDECREF(th);
    Py_XDECREF(bh);
    Py_XDECREF(gh);
    Py_XDECREF(losses);
    return result;
}

static PyObject *op_sum(PyObject *m, PyObject *args, PyObject *kwargs) {
    (void)m;
    static char *kw[] = {"x", NULL};
    PyObject *x_obj;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O:_op_sum", kw, &x_obj)) {
        return NULL;
    }
    PyObject *xh = NULL, *result = NULL;
    pxt_tensor *x = pxt_op_arg(x_obj, "x", NULL, &xh);
    if (!x || pxt_py_check_dtype(x, "x", PXT_FLOAT32) < 0) {
        goto done;
    }
    const pxt_backend *be = PXT_BACKEND_OP(x->device, sum);
    if (!be) {
        goto done;
    }
    double total = 0.0;
    int rc;
    RUN_NOGIL(rc, be->sum(x->device.index, &total, (const float *)x->data, (size_t)x->numel));
    if (pxt_op_status(rc) < 0) {
        goto done;
    }
    result = PyFloat_FromDouble(total);
done:
    Py_XDECREF(xh);
    return result;
}

PyMethodDef pxt_py_ops_methods[] = {
    {"_op_gemm", PXT_PY_KW(op_gemm),
     "_op_gemm(A, B, trans_a=False, trans_b=False, alpha=1.0, beta=0.0, C=None, out_dtype=None,"
     " sizes=None) -> C = alpha * op(A) @ op(B) + beta * C (fp32 accumulation); with sizes "
     "(M, N, K), A, B and C may be wider than the product takes (their widths are the rows' "
     "leading dimensions)."},
    {"_op_add_bias", PXT_PY_KW(op_add_bias),
     "_op_add_bias(out, bias): out (M, N) += bias (N), in place."},
    {"_op_gemm_fused", PXT_PY_KW(op_gemm_fused),
     "_op_gemm_fused(A, B, epilogue='none', trans_a=False, trans_b=False, alpha=1.0, beta=0.0,"
     " C=None, D=None, bias=None, pre=None, dbias=None, out_dtype=None) -> (D, pre, dbias):"
     " one product with its epilogue ('none', 'bias', 'bias_gelu', 'dgelu_bgrad', 'bgrad_b')."},
    {"_op_bias_backward", PXT_PY_KW(op_bias_backward),
     "_op_bias_backward(dout, dbias=None, cols=None) -> dbias (N) fp32 += column sums of dout "
     "(M, N); with cols, of its first cols columns only (dout's width apart)."},
    {"_op_layernorm_forward", PXT_PY_KW(op_layernorm_forward),
     "_op_layernorm_forward(x, weight, bias, eps=1e-5) -> (out, mean, rstd)."},
    {"_op_layernorm_backward", PXT_PY_KW(op_layernorm_backward),
     "_op_layernorm_backward(dout, x, weight, mean, rstd, dinp=None, dweight=None, dbias=None)"
     " -> (dinp, dweight, dbias), accumulated into the given tensors or zeros."},
    {"_op_gelu_forward", PXT_PY_KW(op_gelu_forward), "_op_gelu_forward(x) -> gelu_tanh(x)."},
    {"_op_gelu_backward", PXT_PY_KW(op_gelu_backward),
     "_op_gelu_backward(x, dout) -> dout * gelu_tanh'(x)."},
    {"_op_add", PXT_PY_KW(op_add), "_op_add(a, b) -> a + b."},
    {"_op_embedding_forward", PXT_PY_KW(op_embedding_forward),
     "_op_embedding_forward(ids, table, out=None) -> table[ids] (added into out when given)."},
    {"_op_embedding_backward", PXT_PY_KW(op_embedding_backward),
     "_op_embedding_backward(ids, dout, V, dtable=None) -> dtable (V, C) fp32 += scatter of dout."},
    {"_op_softmax_xent", PXT_PY_KW(op_softmax_xent),
     "_op_softmax_xent(logits, targets, scale=1.0, backward=True, bias=None, vocab=None) -> "
     "(losses, dlogits or None); bias (vocab) fp32 is added to the logits first; vocab: the "
     "classes are logits' first vocab columns (dlogits has zeros after them); the caller's "
     "logits are not modified."},
    {"_op_sum", PXT_PY_KW(op_sum),
     "_op_sum(x) -> float: deterministic double sum of a float32 tensor."},
    {NULL, NULL, 0, NULL},
};

#undef RUN_NOGIL
