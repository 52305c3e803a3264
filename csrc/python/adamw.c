/* adamw.c: pyxtts._C.AdamW, the type object over the engine's AdamW (engine/adamw.h).
 *
 * Holds the handle of the flat state it steps (a model's `_flat`, which keeps
 * the model alive); converts the hyper-parameters, runs the step with the GIL
 * released, and moves the state to and from NumPy. */
#include "module.h"

#include <float.h>
#include <math.h>
#include <string.h>

#define NO_IMPORT_ARRAY
#define PY_ARRAY_UNIQUE_SYMBOL pxt_ARRAY_API
#define NPY_NO_DEPRECATED_API NPY_2_0_API_VERSION
#include <numpy/arrayobject.h>

#include "engine/adamw.h"

typedef struct {
    PyObject_HEAD
    PyObject *model; /* the handle of the model's flat state (pxt_py_flat_handle): keeps
                        opt.flat alive */
    pxt_adamw opt;
    int busy;
} pxt_py_adamw;

static PyTypeObject adamw_type;

/* ---- hyper-parameters (ValueError/TypeError naming the argument) --------------------------- */

/* A real by the rule: [lo, ...) or (lo, ...), below hi or up to it. */
static int real_arg(PyObject *obj, const char *name, double *out, double lo, int lo_open, double hi,
                    int hi_open, const char *rule) {
    pxt_py_real r = PXT_PY_REAL(name, lo, lo_open, hi, hi_open, rule);
    if (!pxt_py_real_converter(obj, &r)) {
        return -1;
    }
    *out = r.value;
    return 0;
}

static int parse_lr(PyObject *obj, const char *name, double *out) {
    return real_arg(obj, name, out, 0.0, 0, INFINITY, 1, "a finite number >= 0");
}

static int parse_betas(PyObject *obj, double *b1, double *b2) {
    if (!PySequence_Check(obj) || PyUnicode_Check(obj) || PySequence_Size(obj) != 2) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "betas: expected a pair (beta1, beta2), got %.100s",
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    double b[2];
    for (int i = 0; i < 2; i++) {
        PyObject *it = PySequence_GetItem(obj, i);
        if (!it) {
            return -1;
        }
        int rc = real_arg(it, i ? "betas[1]" : "betas[0]", &b[i], 0.0, 0, 1.0, 1, "in [0, 1)");
        Py_DECREF(it);
        if (rc < 0) {
            return -1;
        }
    }
    *b1 = b[0];
    *b2 = b[1];
    return 0;
}

/* None or a real in [0, inf): 0 (and None) turn clipping off. */
static int parse_clip(PyObject *obj, double *out) {
    *out = 0.0;
    return obj == Py_None ? 0
                          : real_arg(obj, "grad_clip", out, 0.0, 0, INFINITY, 1,
                                     "None or a finite number >= 0");
}

static int parse_loss_scale(PyObject *obj, int *on, double *scale) {
    *on = obj != Py_None;
    return !*on ? 0
                : real_arg(obj, "loss_scale", scale, 0.0, 1, PXT_MAX_LOSS_SCALE, 0,
                           "None or a number in (0, 2**24]");
}

static int parse_ema(PyObject *obj, int *on, double *d) {
    *on = obj != Py_None;
    return !*on ? 0 : real_arg(obj, "ema_decay", d, 0.0, 0, 1.0, 1, "None or a number in [0, 1)");
}

static int parse_count(PyObject *obj, const char *name, long long *out, long long lo) {
    pxt_py_int n = PXT_PY_INT(name, lo, LLONG_MAX);
    if (!pxt_py_int_converter(obj, &n)) {
        return -1;
    }
    *out = n.value;
    return 0;
}

/* The engine's rules for one step (pxt_adamw_check_hparams) as a ValueError. */
static int check_update_bound(const pxt_adamw_hparams *h, pxt_dtype dt, const char *name) {
    return pxt_adamw_check_hparams(h, dt, name) == PXT_OK ? 0 : pxt_raise_int(PXT_ERR_VALUE);
}

/* ---- construction ---------------------------------------------------------------------- */

static int check_idle(pxt_py_adamw *o, const char *what) {
    if (o->busy || o->opt.flat->busy) {
        PyErr_Format(PyExc_RuntimeError,
                     "%s: a step of this model or optimizer is running (in "
                     "another thread)",
                     what);
        return -1;
    }
    return 0;
}

static int check_unswapped(pxt_py_adamw *o, const char *what) {
    if (o->opt.swapped) {
        PyErr_Format(PyExc_RuntimeError,
                     "%s: the model holds the EMA weights; call swap_ema() "
                     "again to swap the training weights back first",
                     what);
        return -1;
    }
    return 0;
}

static int check_init(pxt_py_adamw *o) {
    if (!o->model) {
        PyErr_SetString(PyExc_RuntimeError, "AdamW: not initialised (call AdamW(model, ...))");
        return -1;
    }
    return 0;
}

/* state_device: None (beside the parameters) or "cpu" (the host pool: offloaded). */
static int parse_state_device(PyObject *obj, int *offload) {
    *offload = 0;
    if (obj == Py_None) {
        return 0;
    }
    if (!PyUnicode_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "state_device: expected None or 'cpu', got %.100s",
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    if (PyUnicode_CompareWithASCIIString(obj, "cpu") != 0) {
        PyErr_Format(PyExc_ValueError,
                     "state_device: expected None (the state beside the parameters, on the "
                     "model's device) or 'cpu' (host memory: the state offloaded), got %R",
                     obj);
        return -1;
    }
    *offload = 1;
    return 0;
}

/* decay: None, the layout's choice (out = NULL); else an iterable of parameter
 * names, each decayed and every other tensor not (*out: L->count flags, to
 * PyMem_RawFree). */
static int parse_decay(PyObject *obj, const pxt_param_layout *L, unsigned char **out) {
    *out = NULL;
    if (obj == Py_None) {
        return 0;
    }
    if (PyUnicode_Check(obj)) {
        PyErr_SetString(PyExc_TypeError, "decay: expected None or an iterable of parameter "
                                         "names, got a str (wrap a single name in a list)");
        return -1;
    }
    PyObject *it = PyObject_GetIter(obj);
    if (!it) {
        PyErr_Format(PyExc_TypeError,
                     "decay: expected None or an iterable of parameter names, got %.100s",
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    unsigned char *flags = PyMem_RawCalloc(L->count ? (size_t)L->count : 1, 1);
    if (!flags) {
        Py_DECREF(it);
        PyErr_NoMemory();
        return -1;
    }
    PyObject *item;
    while ((item = PyIter_Next(it))) {
        int found = -1;
        if (!PyUnicode_Check(item)) {
            PyErr_Format(PyExc_TypeError, "decay: expected parameter names (str), got %.100s",
                         Py_TYPE(item)->tp_name);
        } else {
            Py_ssize_t len;
            const char *name = PyUnicode_AsUTF8AndSize(item, &len);
            for (int i = 0; name && i < L->count && found < 0; i++) {
                if ((size_t)len == strlen(L->params[i].name) &&
                    memcmp(L->params[i].name, name, (size_t)len) == 0) {
                    found = i;
                }
            }
            if (name && found < 0) {
                PyErr_Format(PyExc_ValueError,
                             "decay: expected names of this model's "
                             "parameters, got %R",
                             item);
            }
        }
        Py_DECREF(item);
        if (found < 0) {
            break;
        }
        flags[found] = 1;
    }
    Py_DECREF(it);
    if (PyErr_Occurred()) {
        PyMem_RawFree(flags);
        return -1;
    }
    *out = flags;
    return 0;
}

static int adamw_init(PyObject *op, PyObject *args, PyObject *kwargs) {
    pxt_py_adamw *o = (pxt_py_adamw *)op;
    static char *kw[] = {
        "model",      "lr",        "betas",           "eps",   "weight_decay", "grad_clip",
        "loss_scale", "ema_decay", "growth_interval", "decay", "state_device", "offload_chunk",
        NULL};
    PyObject *model, *lr = NULL, *betas = NULL, *eps = NULL, *wd = NULL, *clip = NULL;
    PyObject *ls = Py_None, *ema = Py_None, *gi = NULL, *decay = Py_None, *sdev = Py_None;
    pxt_py_int chunk = PXT_PY_INT_OPT("offload_chunk", 1, (long long)1 << 40, 0);
    if (o->model) {
        PyErr_SetString(PyExc_RuntimeError, "AdamW.__init__ called twice");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|OOOOOOOOOOO&:AdamW", kw, &model, &lr, &betas,
                                     &eps, &wd, &clip, &ls, &ema, &gi, &decay, &sdev,
                                     pxt_py_int_converter, &chunk)) {
        return -1;
    }
    /* every argument checked before anything is allocated */
    pxt_adamw_hparams h = {.lr = 1e-4,
                           .beta1 = 0.9,
                           .beta2 = 0.96,
                           .eps = 1e-8,
                           .weight_decay = 0.01,
                           .grad_clip = 1.0,
                           .growth_interval = 2000};
    int has_ema = 0;
    if ((lr && parse_lr(lr, "lr", &h.lr) < 0) ||
        (betas && parse_betas(betas, &h.beta1, &h.beta2) < 0) ||
        (eps && real_arg(eps, "eps", &h.eps, 0.0, 1, INFINITY, 1, "a finite number > 0") < 0) ||
        (wd && real_arg(wd, "weight_decay", &h.weight_decay, 0.0, 0, INFINITY, 1,
                        "a finite number >= 0") < 0) ||
        (clip && parse_clip(clip, &h.grad_clip) < 0) ||
        parse_loss_scale(ls, &h.scaling, &h.scale) < 0 ||
        parse_ema(ema, &has_ema, &h.ema_decay) < 0 ||
        (gi && parse_count(gi, "growth_interval", &h.growth_interval, 1) < 0)) {
        return -1;
    }
    pxt_adamw_placement where = {.chunk = (size_t)chunk.value};
    if (parse_state_device(sdev, &where.offload) < 0) {
        return -1;
    }
    if (chunk.a.given && !where.offload) {
        PyErr_Format(PyExc_ValueError, "offload_chunk: only with state_device='cpu' (the state "
                                       "offloaded), got state_device=None");
        return -1;
    }
    /* the model: what has a flat state (pyxtts._C.GPT), or holds one as _core
     * (pyxtts.XTTSGPT) */
    pxt_flat *flat = NULL;
    PyObject *core = pxt_py_flat_handle_of(model, &flat);
    if (!core) {
        PyErr_Format(PyExc_TypeError, "model: expected a pyxtts.XTTSGPT, got %.100s",
                     Py_TYPE(model)->tp_name);
        return -1;
    }
    if (flat->busy) {
        Py_DECREF(core);
        PyErr_SetString(PyExc_RuntimeError,
                        "model: a step of this model is running (in another thread)");
        return -1;
    }
    if (check_update_bound(&h, flat->dt, "lr") < 0) {
        Py_DECREF(core);
        return -1;
    }
    unsigned char *flags = NULL;
    if (parse_decay(decay, &flat->layout, &flags) < 0) {
        Py_DECREF(core);
        return -1;
    }
    /* a large state takes a while to fill and to page-lock: without the GIL, the model
     * marked busy meanwhile so that nothing writes the parameters it copies */
    int rc;
    pxt_flat_set_busy(flat, 1);
    Py_BEGIN_ALLOW_THREADS
    rc = pxt_adamw_init(&o->opt, flat, &h, has_ema, flags, &where);
    Py_END_ALLOW_THREADS
    pxt_flat_set_busy(flat, 0);
    PyMem_RawFree(flags);
    if (rc != PXT_OK) {
        Py_DECREF(core);
        return pxt_raise_int(rc);
    }
    o->model = core;
    return 0;
}

static void adamw_dealloc(PyObject *op) {
    pxt_py_adamw *o = (pxt_py_adamw *)op;
    pxt_adamw_free(&o->opt); /* before the model, whose flat state it points into */
    Py_CLEAR(o->model);
    Py_TYPE(op)->tp_free(op);
}

/* ---- the step ------------------------------------------------------------------------ */

static PyObject *adamw_step(PyObject *op, PyObject *unused) {
    (void)unused;
    pxt_py_adamw *o = (pxt_py_adamw *)op;
    if (check_init(o) < 0 || check_idle(o, "step") < 0 || check_unswapped(o, "step") < 0) {
        return NULL;
    }
    pxt_adamw_result r;
    int rc;
    o->busy = 1;
    pxt_flat_set_busy(o->opt.flat, 1);
    Py_BEGIN_ALLOW_THREADS
    rc = pxt_adamw_run(&o->opt, &r);
    Py_END_ALLOW_THREADS
    o->busy = 0;
    pxt_flat_set_busy(o->opt.flat, 0);
    if (rc != PXT_OK) {
        return pxt_raise(rc);
    }
    pxt_adamw_account(&o->opt, &r);
    const pxt_adamw_hparams *h = &o->opt.h;
    PyObject *scale = h->scaling ? PyFloat_FromDouble(h->scale) : Py_NewRef(Py_None);
    if (!scale) {
        return NULL;
    }
    return Py_BuildValue("{s:O,s:d,s:N,s:d,s:L}", "skipped", r.applied ? Py_False : Py_True,
                         "grad_norm", r.grad_norm, "loss_scale", scale, "lr", h->lr, "step",
                         o->opt.step);
}

static PyObject *adamw_zero_grad(PyObject *op, PyObject *unused) {
    (void)unused;
    pxt_py_adamw *o = (pxt_py_adamw *)op;
    if (check_init(o) < 0 || check_idle(o, "zero_grad") < 0) {
        return NULL;
    }
    int rc = pxt_flat_zero_grad(o->opt.flat);
    if (rc != PXT_OK) {
        return pxt_raise(rc);
    }
    Py_RETURN_NONE;
}

/* Exchanges the model's parameters and the EMA; again to swap back. */
static PyObject *adamw_swap_ema(PyObject *op, PyObject *unused) {
    (void)unused;
    pxt_py_adamw *o = (pxt_py_adamw *)op;
    if (check_init(o) < 0 || check_idle(o, "swap_ema") < 0) {
        return NULL;
    }
    if (!o->opt.ema) {
        return PyErr_Format(PyExc_RuntimeError, "swap_ema: this optimizer keeps no EMA "
                                                "(construct it with ema_decay=...)");
    }
    int rc = pxt_adamw_swap_ema(&o->opt);
    if (rc != PXT_OK) {
        return pxt_raise(rc);
    }
    return PyBool_FromLong(o->opt.swapped);
}

/* ---- state ------------------------------------------------------------------------------ */

/* A flat storage of n floats as a NumPy array (a copy). */
static PyObject *flat_numpy(pxt_storage *s, size_t n) {
    int64_t shape = (int64_t)n;
    PyObject *t = pxt_tensor_view(s, 0, PXT_FLOAT32, 1, &shape);
    if (!t) {
        return NULL;
    }
    PyObject *a = PyObject_CallMethod(t, "numpy", NULL);
    Py_DECREF(t);
    return a;
}

static PyObject *adamw_state_dict(PyObject *op, PyObject *unused) {
    (void)unused;
    pxt_py_adamw *o = (pxt_py_adamw *)op;
    if (check_init(o) < 0 || check_idle(o, "state_dict") < 0 ||
        check_unswapped(o, "state_dict") < 0) {
        return NULL;
    }
    const pxt_adamw *a = &o->opt;
    const pxt_adamw_hparams *h = &a->h;
    PyObject *m = flat_numpy(a->m, a->n), *v = NULL, *master = NULL, *ema = NULL;
    if (!m || !(v = flat_numpy(a->v, a->n))) {
        goto fail;
    }
    master = flat_numpy(a->master ? a->master : a->flat->params, a->n);
    if (!master) {
        goto fail;
    }
    ema = a->ema ? flat_numpy(a->ema, a->n) : Py_NewRef(Py_None);
    if (!ema) {
        goto fail;
    }
    PyObject *ls = h->scaling ? PyFloat_FromDouble(h->scale) : Py_NewRef(Py_None);
    PyObject *ed = a->ema ? PyFloat_FromDouble(h->ema_decay) : Py_NewRef(Py_None);
    PyObject *gc = h->grad_clip > 0 ? PyFloat_FromDouble(h->grad_clip) : Py_NewRef(Py_None);
    return Py_BuildValue("{s:L,s:N,s:N,s:N,s:N,s:d,s:(dd),s:d,s:d,s:N,s:N,s:L,s:L,s:N,s:n}", "step",
                         a->step, "m", m, "v", v, "master", master, "ema", ema, "lr", h->lr,
                         "betas", h->beta1, h->beta2, "eps", h->eps, "weight_decay",
                         h->weight_decay, "grad_clip", gc, "loss_scale", ls, "growth_interval",
                         h->growth_interval, "good_steps", a->good_steps, "ema_decay", ed,
                         "num_elements", (Py_ssize_t)a->n);
fail:
    Py_XDECREF(m);
    Py_XDECREF(v);
    Py_XDECREF(master);
    Py_XDECREF(ema);
    return NULL;
}

static PyObject *get_key(PyObject *d, const char *key) {
    PyObject *v = PyMapping_GetItemString(d, key);
    if (!v && PyErr_ExceptionMatches(PyExc_KeyError)) {
        PyErr_Clear();
        PyErr_Format(PyExc_KeyError,
                     "state: missing key '%s' (pass what AdamW.state_dict() "
                     "returned)",
                     key);
    }
    return v;
}

/* A contiguous float32 (n) array of finite values (new reference), else NULL. */
static PyArrayObject *flat_arg(PyObject *obj, const char *key, size_t n) {
    if (!PyArray_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "state['%s']: expected a NumPy array, got %.100s", key,
                     Py_TYPE(obj)->tp_name);
        return NULL;
    }
    PyArrayObject *a = (PyArrayObject *)obj;
    if (PyArray_TYPE(a) != NPY_FLOAT32) {
        PyErr_Format(PyExc_TypeError, "state['%s']: expected dtype float32, got %R", key,
                     (PyObject *)PyArray_DESCR(a));
        return NULL;
    }
    if (PyArray_NDIM(a) != 1 || (size_t)PyArray_DIM(a, 0) != n) {
        PyErr_Format(PyExc_ValueError,
                     "state['%s']: expected shape (%zu,) (this model's flat "
                     "buffer), got %d dimensions of %zd elements",
                     key, n, PyArray_NDIM(a), (Py_ssize_t)PyArray_SIZE(a));
        return NULL;
    }
    PyArrayObject *c = (PyArrayObject *)PyArray_FROM_OTF(
        obj, NPY_FLOAT32, NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED);
    if (!c) {
        return NULL;
    }
    const float *x = PyArray_DATA(c);
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(x[i])) {
            Py_DECREF(c);
            PyErr_Format(PyExc_ValueError, "state['%s']: NaN or infinity at index %zu", key, i);
            return NULL;
        }
    }
    return c;
}

static const void *data_or_null(PyArrayObject *a) { return a ? PyArray_DATA(a) : NULL; }

/* state['num_elements'], where present (state dicts of older versions lack it), names the
 * size of the flat buffer the state belongs to: another model's state is refused by name
 * rather than by the first array whose shape differs. */
static int check_num_elements(PyObject *state, size_t n) {
    PyObject *v = PyMapping_GetItemString(state, "num_elements");
    if (!v) {
        if (!PyErr_ExceptionMatches(PyExc_KeyError)) {
            return -1;
        }
        PyErr_Clear();
        return 0;
    }
    long long got;
    int rc = parse_count(v, "state['num_elements']", &got, 0);
    Py_DECREF(v);
    if (rc < 0) {
        return -1;
    }
    if ((unsigned long long)got != (unsigned long long)n) {
        PyErr_Format(PyExc_ValueError,
                     "state['num_elements']: expected %zu (this optimizer's model), got %lld (the "
                     "state of another model?)",
                     n, got);
        return -1;
    }
    return 0;
}

/* load_state_dict(state): everything checked, then everything written. */
static PyObject *adamw_load_state_dict(PyObject *op, PyObject *state) {
    pxt_py_adamw *o = (pxt_py_adamw *)op;
    if (check_init(o) < 0 || check_idle(o, "load_state_dict") < 0 ||
        check_unswapped(o, "load_state_dict") < 0) {
        return NULL;
    }
    if (!PyMapping_Check(state) || !PyObject_HasAttrString(state, "keys")) {
        return PyErr_Format(PyExc_TypeError,
                            "state: expected a dict (from AdamW.state_dict()), "
                            "got %.100s",
                            Py_TYPE(state)->tp_name);
    }
    static const char *keys[] = {"step",         "m",         "v",          "master",
                                 "ema",          "lr",        "betas",      "eps",
                                 "weight_decay", "grad_clip", "loss_scale", "growth_interval",
                                 "good_steps",   "ema_decay"};
    enum {
        K_STEP,
        K_M,
        K_V,
        K_MASTER,
        K_EMA,
        K_LR,
        K_BETAS,
        K_EPS,
        K_WD,
        K_CLIP,
        K_LS,
        K_GI,
        K_GOOD,
        K_EMAD,
        NK
    };
    pxt_adamw *a = &o->opt;
    PyObject *val[NK] = {0};
    PyArrayObject *arr[4] = {0}; /* m, v, master, ema */
    PyObject *result = NULL;
    for (int k = 0; k < NK; k++) {
        if (!(val[k] = get_key(state, keys[k]))) {
            goto done;
        }
    }
    long long step, good;
    pxt_adamw_hparams h = a->h;
    int scaling, has_ema;
    double scale = 0.0, emad = 0.0;
    if (parse_count(val[K_STEP], "state['step']", &step, 0) < 0 ||
        parse_lr(val[K_LR], "state['lr']", &h.lr) < 0 ||
        parse_betas(val[K_BETAS], &h.beta1, &h.beta2) < 0 ||
        real_arg(val[K_EPS], "state['eps']", &h.eps, 0.0, 1, INFINITY, 1, "a finite number > 0") <
            0 ||
        real_arg(val[K_WD], "state['weight_decay']", &h.weight_decay, 0.0, 0, INFINITY, 1,
                 "a finite number >= 0") < 0 ||
        parse_clip(val[K_CLIP], &h.grad_clip) < 0 ||
        parse_loss_scale(val[K_LS], &scaling, &scale) < 0 ||
        parse_count(val[K_GI], "state['growth_interval']", &h.growth_interval, 1) < 0 ||
        parse_count(val[K_GOOD], "state['good_steps']", &good, 0) < 0 ||
        parse_ema(val[K_EMAD], &has_ema, &emad) < 0) {
        goto done;
    }
    if (check_update_bound(&h, a->flat->dt, "state['lr']") < 0 ||
        check_num_elements(state, a->n) < 0) {
        goto done;
    }
    if (scaling != a->h.scaling) {
        PyErr_Format(PyExc_ValueError,
                     "state['loss_scale']: this optimizer %s loss scaling but "
                     "the state %s",
                     a->h.scaling ? "uses" : "has no", scaling ? "has" : "has none");
        goto done;
    }
    if (has_ema != (a->ema != NULL) || (val[K_EMA] == Py_None) != !has_ema) {
        PyErr_Format(PyExc_ValueError, "state['ema']: this optimizer %s an EMA but the state %s",
                     a->ema ? "keeps" : "keeps no", val[K_EMA] == Py_None ? "has none" : "has one");
        goto done;
    }
    if (!(arr[0] = flat_arg(val[K_M], "m", a->n)) || !(arr[1] = flat_arg(val[K_V], "v", a->n)) ||
        !(arr[2] = flat_arg(val[K_MASTER], "master", a->n)) ||
        (has_ema && !(arr[3] = flat_arg(val[K_EMA], "ema", a->n))) ||
        pxt_adamw_check_moments(PyArray_DATA(arr[0]), PyArray_DATA(arr[1]), a->n, h.beta1,
                                h.beta2) != PXT_OK) {
        if (!PyErr_Occurred()) {
            pxt_raise(PXT_ERR_VALUE);
        }
        goto done;
    }
    /* all checked: now write */
    int rc = pxt_adamw_load(a, data_or_null(arr[0]), data_or_null(arr[1]), data_or_null(arr[2]),
                            data_or_null(arr[3]));
    if (rc != PXT_OK) {
        pxt_raise(rc);
        goto done;
    }
    if (scaling) {
        h.scale = scale;
    }
    if (has_ema) {
        h.ema_decay = emad;
    }
    a->h = h;
    a->step = step;
    a->good_steps = good;
    result = Py_NewRef(Py_None);
done:
    for (int k = 0; k < NK; k++) {
        Py_XDECREF(val[k]);
    }
    for (int i = 0; i < 4; i++) {
        Py_XDECREF(arr[i]);
    }
    return result;
}

/* ---- attributes -------------------------------------------------------------------------- */

static const pxt_adamw_hparams *hp(PyObject *op) { return &((pxt_py_adamw *)op)->opt.h; }

static PyObject *get_lr(PyObject *op, void *c) {
    (void)c;
    return PyFloat_FromDouble(hp(op)->lr);
}

static int set_lr(PyObject *op, PyObject *v, void *c) {
    (void)c;
    pxt_py_adamw *o = (pxt_py_adamw *)op;
    if (!v) {
        PyErr_SetString(PyExc_AttributeError, "lr: cannot be deleted");
        return -1;
    }
    double x;
    if (parse_lr(v, "lr", &x) < 0) {
        return -1;
    }
    if (o->model && check_idle(o, "lr") < 0) {
        return -1;
    }
    pxt_adamw_hparams h = o->opt.h;
    h.lr = x;
    if (o->model && check_update_bound(&h, o->opt.flat->dt, "lr") < 0) {
        return -1;
    }
    o->opt.h.lr = x;
    return 0;
}

static PyObject *get_betas(PyObject *op, void *c) {
    (void)c;
    return Py_BuildValue("(dd)", hp(op)->beta1, hp(op)->beta2);
}
static PyObject *get_eps(PyObject *op, void *c) {
    (void)c;
    return PyFloat_FromDouble(hp(op)->eps);
}
static PyObject *get_wd(PyObject *op, void *c) {
    (void)c;
    return PyFloat_FromDouble(hp(op)->weight_decay);
}
static PyObject *get_clip(PyObject *op, void *c) {
    (void)c;
    return hp(op)->grad_clip > 0 ? PyFloat_FromDouble(hp(op)->grad_clip) : Py_NewRef(Py_None);
}
static PyObject *get_scale(PyObject *op, void *c) {
    (void)c;
    return hp(op)->scaling ? PyFloat_FromDouble(hp(op)->scale) : Py_NewRef(Py_None);
}
static PyObject *get_ema_decay(PyObject *op, void *c) {
    (void)c;
    return ((pxt_py_adamw *)op)->opt.ema ? PyFloat_FromDouble(hp(op)->ema_decay)
                                         : Py_NewRef(Py_None);
}
static PyObject *get_step_count(PyObject *op, void *c) {
    (void)c;
    return PyLong_FromLongLong(((pxt_py_adamw *)op)->opt.step);
}
static PyObject *get_state_bytes(PyObject *op, void *c) {
    (void)c;
    return PyLong_FromSize_t(((pxt_py_adamw *)op)->opt.state_bytes);
}
static PyObject *get_host_state_bytes(PyObject *op, void *c) {
    (void)c;
    return PyLong_FromSize_t(((pxt_py_adamw *)op)->opt.host_bytes);
}
static PyObject *get_state_device(PyObject *op, void *c) {
    (void)c;
    pxt_py_adamw *o = (pxt_py_adamw *)op;
    if (check_init(o) < 0) {
        return NULL;
    }
    return o->opt.offload ? PyUnicode_FromString("cpu") : Py_NewRef(Py_None);
}
static PyObject *get_offload_chunk(PyObject *op, void *c) {
    (void)c;
    pxt_py_adamw *o = (pxt_py_adamw *)op;
    return o->opt.offload ? PyLong_FromSize_t(o->opt.chunk) : Py_NewRef(Py_None);
}
static PyObject *get_decay(PyObject *op, void *c) {
    (void)c;
    pxt_py_adamw *o = (pxt_py_adamw *)op;
    if (check_init(o) < 0) {
        return NULL;
    }
    PyObject *out = PyList_New(0);
    for (int i = 0; out && i < o->opt.n_segments; i++) {
        if (!o->opt.decay[i]) {
            continue;
        }
        PyObject *name = PyUnicode_FromString(o->opt.flat->layout.params[i].name);
        if (!name || PyList_Append(out, name) < 0) {
            Py_CLEAR(out);
        }
        Py_XDECREF(name);
    }
    return out;
}
static PyObject *get_swapped(PyObject *op, void *c) {
    (void)c;
    return PyBool_FromLong(((pxt_py_adamw *)op)->opt.swapped);
}

static PyGetSetDef adamw_getset[] = {
    {"lr", get_lr, set_lr, "learning rate (settable between steps; finite, >= 0)", NULL},
    {"betas", get_betas, NULL, "(beta1, beta2)", NULL},
    {"eps", get_eps, NULL, "added to the denominator", NULL},
    {"weight_decay", get_wd, NULL, "decoupled weight decay (on the tensors named by decay)", NULL},
    {"decay", get_decay, NULL, "names of the tensors weight decay applies to (a new list)", NULL},
    {"grad_clip", get_clip, NULL, "max global gradient norm, or None", NULL},
    {"loss_scale", get_scale, NULL, "current dynamic loss scale, or None", NULL},
    {"ema_decay", get_ema_decay, NULL, "EMA decay, or None", NULL},
    {"step_count", get_step_count, NULL, "updates applied (skipped steps not counted)", NULL},
    {"state_bytes", get_state_bytes, NULL,
     "allocator bytes of the optimizer state on the model's device", NULL},
    {"host_state_bytes", get_host_state_bytes, NULL,
     "allocator bytes of the optimizer state in the host pool (offloaded; else 0)", NULL},
    {"state_device", get_state_device, NULL,
     "'cpu' when the state is offloaded to host memory, None when it is on the model's device",
     NULL},
    {"offload_chunk", get_offload_chunk, NULL,
     "elements per staged transfer of an offloaded step, or None", NULL},
    {"ema_swapped", get_swapped, NULL, "whether the model holds the EMA weights now", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

/* whether this optimizer updates `model`'s parameters: a step of one model with another's
 * optimizer would update the other and leave this one as it was, without an error */
static PyObject *adamw_steps(PyObject *op, PyObject *model) {
    pxt_py_adamw *o = (pxt_py_adamw *)op;
    if (check_init(o) < 0) {
        return NULL;
    }
    pxt_flat *flat = NULL;
    PyObject *core = pxt_py_flat_handle_of(model, &flat);
    if (!core) {
        PyErr_Format(PyExc_TypeError, "model: expected a pyxtts.XTTSGPT, got %.100s",
                     Py_TYPE(model)->tp_name);
        return NULL;
    }
    int same = flat == o->opt.flat;
    Py_DECREF(core);
    return PyBool_FromLong(same);
}

static PyMethodDef adamw_methods[] = {
    {"step", adamw_step, METH_NOARGS,
     "step() -> dict(skipped, grad_norm, loss_scale, lr, step): one update from the gradients"},
    {"zero_grad", adamw_zero_grad, METH_NOARGS, "set the model's gradients to 0"},
    {"steps", adamw_steps, METH_O, "steps(model) -> bool: whether this optimizer updates model"},
    {"swap_ema", adamw_swap_ema, METH_NOARGS,
     "exchange the model's parameters and the EMA (again to swap back); returns ema_swapped"},
    {"state_dict", adamw_state_dict, METH_NOARGS,
     "step count, m, v, master (and ema) as flat float32 arrays, hyper-parameters"},
    {"load_state_dict", adamw_load_state_dict, METH_O,
     "load a state_dict(); validated in full before anything changes"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject adamw_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "pyxtts.AdamW",
    .tp_basicsize = sizeof(pxt_py_adamw),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "AdamW(model, lr=1e-4, betas=(0.9, 0.96), eps=1e-8, weight_decay=0.01, "
              "grad_clip=1.0, loss_scale=None, ema_decay=None, growth_interval=2000, "
              "decay=None, state_device=None, offload_chunk=None)\n\n"
              "torch.optim.AdamW over the model's flat buffers, with global-norm clipping "
              "(grad_clip None or 0: off), weight decay on the tensors named by decay (None: "
              "those of 2+ dims), optional "
              "dynamic loss scaling (loss_scale: the start scale; x2 after growth_interval clean "
              "steps, x0.5 and the step skipped on inf/NaN) and an optional EMA of the weights.\n"
              "state_device='cpu' keeps the moments, the fp32 master and the EMA in host memory "
              "(the host pool, page-locked beside a GPU): the device keeps the parameters and "
              "gradients, and step() moves the gradients down and the parameters up in chunks of "
              "offload_chunk elements (default 1Mi) around the CPU's update, with the same bits.",
    .tp_new = PyType_GenericNew,
    .tp_init = adamw_init,
    .tp_dealloc = adamw_dealloc,
    .tp_methods = adamw_methods,
    .tp_getset = adamw_getset,
};

int pxt_py_adamw_init_type(PyObject *module) {
    return PyModule_AddType(module, &adamw_type); /* readies it; the name after the last dot */
}
