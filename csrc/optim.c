/* optim.c: pyxtts._C.AdamW, the accumulating optimizer step over a GPT's flat
 * buffers (DESIGN.md principle 3).
 *
 * State, allocated at construction through the caching allocator on the
 * model's device and counted in the model's memory plans:
 *   m, v       (n) fp32   first and second moments
 *   master     (n) fp32   master weights; for a float32 model the parameters
 *                         themselves (no copy, so a model.load_state_dict after
 *                         construction is never undone by a stale master)
 *   ema        (n) fp32   optional exponential moving average of the weights
 *   segments   (count)    the tensors of the flat buffers: offset, numel, decay
 *                         (decay: the tensors named by the decay argument; by default
 *                         those of 2+ dims)
 *   workspace  (PXT_SUMSQ_PARTS) double: the partial sums of the norm
 * n is the flat length, padding included: padding is in no segment, so it is
 * never read nor written by the update (and stays zero).
 *
 * A step is two passes through the backend table: grad_sumsq (global norm and
 * the finite check, deterministic), then adamw (unscale, clip, decoupled weight
 * decay on tensors of 2+ dims, bias-corrected moments, master, EMA, the
 * compute-precision parameters). With non-finite gradients the step is skipped
 * before anything changes (and with loss scaling the scale halves). */
#include "module.h"

#include <math.h>
#include <string.h>

#define NO_IMPORT_ARRAY
#define PY_ARRAY_UNIQUE_SYMBOL pxt_ARRAY_API
#define NPY_NO_DEPRECATED_API NPY_2_0_API_VERSION
#include <numpy/arrayobject.h>

typedef struct {
    PyObject_HEAD
    PyObject *core;       /* the model's pyxtts._C.GPT (strong reference) */
    pxt_gpt_view g;       /* its buffers (kept alive by core) */
    size_t n;             /* elements of the flat buffers, padding included */
    pxt_tensor *m, *v;    /* (n) fp32 */
    pxt_tensor *master;   /* (n) fp32, or NULL: the fp32 parameters are the master */
    pxt_tensor *ema;      /* (n) fp32, or NULL without ema_decay */
    pxt_tensor *segments; /* uint8 (n_segments * sizeof(pxt_adamw_segment)) */
    pxt_tensor *workspace;/* uint8 (PXT_SUMSQ_PARTS * sizeof(double)) */
    int n_segments;
    unsigned char *decay; /* (n_segments) host copy: 1 where weight decay applies */
    double lr, beta1, beta2, eps, weight_decay, grad_clip; /* grad_clip 0: off */
    double ema_decay;     /* used when ema != NULL */
    int scaling;          /* dynamic loss scaling on */
    double scale;         /* current loss scale */
    long long growth_interval, good_steps;
    long long step;       /* updates applied (skipped steps do not count) */
    int swapped;          /* the model's parameters hold the EMA (swap_ema) */
    int busy;
    size_t state_bytes;   /* allocator bytes, added to the model's plans */
} pxt_adamw;

static PyTypeObject adamw_type;

static float *fdata(pxt_tensor *t) { return (float *)t->data; }
static float *master_ptr(pxt_adamw *o) {
    return o->master ? fdata(o->master) : (float *)o->g.params->data;
}

size_t pxt_adamw_state_bytes(size_t numel, int n_tensors, pxt_dtype dt, int ema) {
    size_t flat = pxt_alloc_block_size(numel * sizeof(float));
    size_t buffers = 2 + (dt != PXT_FLOAT32) + (ema != 0);
    return buffers * flat + pxt_alloc_block_size((size_t)n_tensors * sizeof(pxt_adamw_segment)) +
           pxt_alloc_block_size(PXT_SUMSQ_PARTS * sizeof(double));
}

/* ---- argument checks (ValueError/TypeError naming the argument) ------------- */

static int parse_real(PyObject *obj, const char *name, double *out) {
    if (PyBool_Check(obj) || !(PyFloat_Check(obj) || PyLong_Check(obj) || PyNumber_Check(obj)) ||
        PyUnicode_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s: expected a real number, got %.100s", name,
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    double v = PyFloat_AsDouble(obj);
    if (v == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s: expected a real number, got %.100s", name,
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    *out = v;
    return 0;
}

/* A real in a range, with the value in the message. */
static int real_arg(PyObject *obj, const char *name, double *out, double lo, int open_lo, double hi,
                    int closed_hi, const char *rule) {
    double v;
    if (parse_real(obj, name, &v) < 0)
        return -1;
    int ok = isfinite(v) && (open_lo ? v > lo : v >= lo) && (closed_hi ? v <= hi : v < hi);
    if (!ok) {
        char buf[64];
        PyOS_snprintf(buf, sizeof buf, "%.17g", v);
        PyErr_Format(PyExc_ValueError, "%s: must be %s, got %s", name, rule, buf);
        return -1;
    }
    *out = v;
    return 0;
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
        if (!it)
            return -1;
        int rc = real_arg(it, i ? "betas[1]" : "betas[0]", &b[i], 0.0, 0, 1.0, 0, "in [0, 1)");
        Py_DECREF(it);
        if (rc < 0)
            return -1;
    }
    *b1 = b[0];
    *b2 = b[1];
    return 0;
}

/* None or a real in [0, inf): 0 (and None) turn clipping off. */
static int parse_clip(PyObject *obj, double *out) {
    if (obj == Py_None) {
        *out = 0.0;
        return 0;
    }
    return real_arg(obj, "grad_clip", out, 0.0, 0, INFINITY, 0, "None or a finite number >= 0");
}

static int parse_loss_scale(PyObject *obj, int *on, double *scale) {
    *on = obj != Py_None;
    if (!*on)
        return 0;
    return real_arg(obj, "loss_scale", scale, 0.0, 1, INFINITY, 0, "None or a finite number > 0");
}

static int parse_ema(PyObject *obj, int *on, double *d) {
    *on = obj != Py_None;
    if (!*on)
        return 0;
    return real_arg(obj, "ema_decay", d, 0.0, 0, 1.0, 0, "None or a number in [0, 1)");
}

/* None: the layout's choice (tensors of 2+ dims); else an iterable of parameter
 * names, each decayed, every other tensor not. */
static int parse_decay(PyObject *obj, const pxt_param_layout *L, unsigned char *out) {
    for (int i = 0; i < L->count; i++)
        out[i] = obj == Py_None ? (unsigned char)L->params[i].decay : 0;
    if (obj == Py_None)
        return 0;
    if (PyUnicode_Check(obj)) {
        PyErr_SetString(PyExc_TypeError, "decay: expected None or an iterable of parameter names, got "
                        "a str (wrap a single name in a list)");
        return -1;
    }
    PyObject *it = PyObject_GetIter(obj);
    if (!it) {
        PyErr_Format(PyExc_TypeError, "decay: expected None or an iterable of parameter names, got "
                     "%.100s", Py_TYPE(obj)->tp_name);
        return -1;
    }
    PyObject *item;
    while ((item = PyIter_Next(it))) {
        const char *name = PyUnicode_Check(item) ? PyUnicode_AsUTF8(item) : NULL;
        int found = -1;
        for (int i = 0; name && i < L->count && found < 0; i++)
            if (strcmp(L->params[i].name, name) == 0)
                found = i;
        if (found < 0) {
            if (!PyErr_Occurred()) {
                if (name)
                    PyErr_Format(PyExc_ValueError, "decay: %R is not a parameter of this model", item);
                else
                    PyErr_Format(PyExc_TypeError, "decay: expected parameter names (str), got %.100s",
                                 Py_TYPE(item)->tp_name);
            }
            Py_DECREF(item);
            Py_DECREF(it);
            return -1;
        }
        out[found] = 1;
        Py_DECREF(item);
    }
    Py_DECREF(it);
    return PyErr_Occurred() ? -1 : 0;
}

static int parse_count(PyObject *obj, const char *name, long long *out, long long lo) {
    if (PyBool_Check(obj) || !PyLong_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s: expected an int, got %.100s", name, Py_TYPE(obj)->tp_name);
        return -1;
    }
    long long v = PyLong_AsLongLong(obj);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (v < lo) {
        PyErr_Format(PyExc_ValueError, "%s: must be >= %lld, got %lld", name, lo, v);
        return -1;
    }
    *out = v;
    return 0;
}

static int check_idle(pxt_adamw *o, const char *what) {
    if (o->busy || *o->g.busy) {
        PyErr_Format(PyExc_RuntimeError, "%s: a step of this model or optimizer is running (in "
                     "another thread)", what);
        return -1;
    }
    return 0;
}

static int check_unswapped(pxt_adamw *o, const char *what) {
    if (o->swapped) {
        PyErr_Format(PyExc_RuntimeError, "%s: the model holds the EMA weights; call swap_ema() "
                     "again to swap the training weights back first", what);
        return -1;
    }
    return 0;
}

/* ---- construction ---------------------------------------------------------- */

static pxt_tensor *new_flat(pxt_adamw *o, pxt_dtype dt, size_t count) {
    int64_t shape = (int64_t)count;
    pxt_tensor *t = (pxt_tensor *)pxt_tensor_empty(o->g.device, dt, 1, &shape);
    if (t)
        o->state_bytes += pxt_alloc_block_size(t->nbytes);
    return t;
}

static int adamw_init(PyObject *op, PyObject *args, PyObject *kwargs) {
    pxt_adamw *o = (pxt_adamw *)op;
    static char *kw[] = {"model", "lr", "betas", "eps", "weight_decay", "grad_clip", "loss_scale",
                         "ema_decay", "growth_interval", "decay", NULL};
    PyObject *model, *lr = NULL, *betas = NULL, *eps = NULL, *wd = NULL, *clip = NULL;
    PyObject *ls = Py_None, *ema = Py_None, *gi = NULL, *decay = Py_None;
    if (o->core) {
        PyErr_SetString(PyExc_RuntimeError, "AdamW.__init__ called twice");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|OOOOOOOOO:AdamW", kw, &model, &lr, &betas,
                                     &eps, &wd, &clip, &ls, &ema, &gi, &decay))
        return -1;
    /* every argument checked before anything is allocated */
    o->lr = 1e-4, o->beta1 = 0.9, o->beta2 = 0.96, o->eps = 1e-8, o->weight_decay = 0.01;
    o->grad_clip = 1.0, o->growth_interval = 2000;
    int has_ema = 0;
    if ((lr && real_arg(lr, "lr", &o->lr, 0.0, 0, INFINITY, 0, "a finite number >= 0") < 0) ||
        (betas && parse_betas(betas, &o->beta1, &o->beta2) < 0) ||
        (eps && real_arg(eps, "eps", &o->eps, 0.0, 1, INFINITY, 0, "a finite number > 0") < 0) ||
        (wd && real_arg(wd, "weight_decay", &o->weight_decay, 0.0, 0, INFINITY, 0,
                        "a finite number >= 0") < 0) ||
        (clip && parse_clip(clip, &o->grad_clip) < 0) ||
        parse_loss_scale(ls, &o->scaling, &o->scale) < 0 || parse_ema(ema, &has_ema, &o->ema_decay) < 0 ||
        (gi && parse_count(gi, "growth_interval", &o->growth_interval, 1) < 0))
        return -1;
    PyObject *core = NULL;
    if (pxt_gpt_view_of(model, &o->g) == 0) {
        core = Py_NewRef(model);
    } else {
        core = PyObject_GetAttrString(model, "_core");
        if (!core)
            PyErr_Clear();
        if (!core || pxt_gpt_view_of(core, &o->g) < 0) {
            Py_XDECREF(core);
            PyErr_Format(PyExc_TypeError, "model: expected a pyxtts.XTTSGPT, got %.100s",
                         Py_TYPE(model)->tp_name);
            return -1;
        }
    }
    if (*o->g.busy) {
        Py_DECREF(core);
        PyErr_SetString(PyExc_RuntimeError, "model: a step of this model is running (in another thread)");
        return -1;
    }
    if (!o->g.be->grad_sumsq || !o->g.be->adamw || !o->g.be->swap || !o->g.be->cast) {
        Py_DECREF(core);
        PyErr_Format(PyExc_NotImplementedError, "AdamW: the %s backend has no optimizer kernels "
                     "yet", o->g.be->name);
        return -1;
    }
    const pxt_param_layout *L = o->g.layout;
    if (!(o->decay = PyMem_RawCalloc((size_t)L->count, 1))) {
        Py_DECREF(core);
        PyErr_NoMemory();
        return -1;
    }
    if (parse_decay(decay, L, o->decay) < 0) {
        Py_DECREF(core);
        PyMem_RawFree(o->decay);
        o->decay = NULL;
        return -1;
    }
    o->core = core;
    const pxt_backend *be = o->g.be;
    int d = o->g.device.index;
    o->n = L->numel;
    o->n_segments = L->count;
    if (!(o->m = new_flat(o, PXT_FLOAT32, o->n)) || !(o->v = new_flat(o, PXT_FLOAT32, o->n)) ||
        (o->g.dt != PXT_FLOAT32 && !(o->master = new_flat(o, PXT_FLOAT32, o->n))) ||
        (has_ema && !(o->ema = new_flat(o, PXT_FLOAT32, o->n))) ||
        !(o->segments = new_flat(o, PXT_UINT8, (size_t)L->count * sizeof(pxt_adamw_segment))) ||
        !(o->workspace = new_flat(o, PXT_UINT8, PXT_SUMSQ_PARTS * sizeof(double))))
        goto fail;
    pxt_adamw_segment *segs = PyMem_RawCalloc((size_t)L->count, sizeof *segs);
    if (!segs) {
        PyErr_NoMemory();
        goto fail;
    }
    for (int i = 0; i < L->count; i++)
        segs[i] = (pxt_adamw_segment){L->params[i].offset, L->params[i].numel, o->decay[i]};
    int rc = be->copy(d, o->segments->data, segs, o->segments->nbytes, PXT_COPY_H2D);
    PyMem_RawFree(segs);
    size_t fb = o->n * sizeof(float);
    if (rc == PXT_OK) rc = be->memset_zero(d, o->m->data, fb);
    if (rc == PXT_OK) rc = be->memset_zero(d, o->v->data, fb);
    if (rc == PXT_OK && o->master)
        rc = be->cast(d, o->master->data, PXT_FLOAT32, o->g.params->data, o->g.dt, o->n);
    if (rc == PXT_OK && o->ema)
        rc = be->cast(d, o->ema->data, PXT_FLOAT32, o->g.params->data, o->g.dt, o->n);
    if (rc != PXT_OK) {
        pxt_raise(rc);
        goto fail;
    }
    pxt_gpt_add_optimizer_bytes(o->core, (Py_ssize_t)o->state_bytes);
    return 0;
fail:
    Py_CLEAR(o->m);
    Py_CLEAR(o->v);
    Py_CLEAR(o->master);
    Py_CLEAR(o->ema);
    Py_CLEAR(o->segments);
    Py_CLEAR(o->workspace);
    Py_CLEAR(o->core);
    PyMem_RawFree(o->decay);
    o->decay = NULL;
    o->state_bytes = 0;
    return -1;
}

static void adamw_dealloc(PyObject *op) {
    pxt_adamw *o = (pxt_adamw *)op;
    if (o->core)
        pxt_gpt_add_optimizer_bytes(o->core, -(Py_ssize_t)o->state_bytes);
    Py_CLEAR(o->m);
    Py_CLEAR(o->v);
    Py_CLEAR(o->master);
    Py_CLEAR(o->ema);
    Py_CLEAR(o->segments);
    Py_CLEAR(o->workspace);
    Py_CLEAR(o->core);
    PyMem_RawFree(o->decay);
    Py_TYPE(op)->tp_free(op);
}

static int check_init(pxt_adamw *o) {
    if (!o->core) {
        PyErr_SetString(PyExc_RuntimeError, "AdamW: not initialised (call AdamW(model, ...))");
        return -1;
    }
    return 0;
}

/* ---- the step -------------------------------------------------------------- */

typedef struct {
    double sumsq;
    int nonfinite, applied;
    pxt_adamw_args args;
} step_work;

/* Runs without the GIL: the norm pass, then (finite) the update. */
static int run_step(pxt_adamw *o, step_work *w, double inv_scale) {
    const pxt_backend *be = o->g.be;
    int d = o->g.device.index;
    const float *grads = (const float *)o->g.grads->data;
    PXT_TRY(be->grad_sumsq(d, &w->sumsq, &w->nonfinite, grads, o->n, o->workspace->data));
    if (w->nonfinite)
        return PXT_OK;
    double norm = sqrt(w->sumsq) * inv_scale, coef = 1.0;
    if (o->grad_clip > 0) { /* torch.nn.utils.clip_grad_norm_: clamp(max / (norm + 1e-6), max=1) */
        coef = o->grad_clip / (norm + 1e-6);
        if (coef > 1.0)
            coef = 1.0;
    }
    double t = (double)(o->step + 1);
    double bc1 = 1.0 - pow(o->beta1, t), bc2 = 1.0 - pow(o->beta2, t);
    w->args = (pxt_adamw_args){
        .segments = (const pxt_adamw_segment *)o->segments->data,
        .n_segments = o->n_segments,
        .grad_scale = (float)(inv_scale * coef),
        .decay_factor = (float)(1.0 - o->lr * o->weight_decay),
        .one_minus_beta1 = (float)(1.0 - o->beta1),
        .beta2 = (float)o->beta2,
        .one_minus_beta2 = (float)(1.0 - o->beta2),
        .neg_step_size = (float)(-(o->lr / bc1)),
        .bias_correction2_sqrt = (float)sqrt(bc2),
        .eps = (float)o->eps,
        .ema_decay = (float)o->ema_decay,
        .one_minus_ema_decay = (float)(1.0 - o->ema_decay),
        .dt = o->g.dt,
    };
    PXT_TRY(be->adamw(d, &w->args, master_ptr(o), fdata(o->m), fdata(o->v),
                      o->ema ? fdata(o->ema) : NULL, o->g.params->data, grads));
    w->applied = 1;
    return PXT_OK;
}

static PyObject *adamw_step(PyObject *op, PyObject *unused) {
    (void)unused;
    pxt_adamw *o = (pxt_adamw *)op;
    if (check_init(o) < 0 || check_idle(o, "step") < 0 || check_unswapped(o, "step") < 0)
        return NULL;
    double inv_scale = o->scaling ? 1.0 / o->scale : 1.0;
    step_work w = {0};
    int rc;
    o->busy = *o->g.busy = 1;
    Py_BEGIN_ALLOW_THREADS rc = run_step(o, &w, inv_scale);
    Py_END_ALLOW_THREADS
    o->busy = *o->g.busy = 0;
    if (rc != PXT_OK)
        return pxt_raise(rc);
    double norm = w.nonfinite ? (isnan(w.sumsq) ? NAN : INFINITY) : sqrt(w.sumsq) * inv_scale;
    if (w.applied) {
        o->step++;
        if (o->scaling && ++o->good_steps >= o->growth_interval) {
            o->scale *= 2.0;
            o->good_steps = 0;
        }
    } else if (o->scaling) {
        o->scale *= 0.5;
        o->good_steps = 0;
    }
    PyObject *scale = o->scaling ? PyFloat_FromDouble(o->scale) : Py_NewRef(Py_None);
    if (!scale)
        return NULL;
    return Py_BuildValue("{s:O,s:d,s:N,s:d,s:L}", "skipped", w.applied ? Py_False : Py_True,
                         "grad_norm", norm, "loss_scale", scale, "lr", o->lr, "step", o->step);
}

static PyObject *adamw_zero_grad(PyObject *op, PyObject *unused) {
    (void)unused;
    pxt_adamw *o = (pxt_adamw *)op;
    if (check_init(o) < 0 || check_idle(o, "zero_grad") < 0)
        return NULL;
    int rc = o->g.be->memset_zero(o->g.device.index, o->g.grads->data, o->g.grads->nbytes);
    if (rc != PXT_OK)
        return pxt_raise(rc);
    Py_RETURN_NONE;
}

/* Exchanges the model's parameters and the EMA; again to swap back. */
static PyObject *adamw_swap_ema(PyObject *op, PyObject *unused) {
    (void)unused;
    pxt_adamw *o = (pxt_adamw *)op;
    if (check_init(o) < 0 || check_idle(o, "swap_ema") < 0)
        return NULL;
    if (!o->ema)
        return PyErr_Format(PyExc_RuntimeError, "swap_ema: this optimizer keeps no EMA "
                            "(construct it with ema_decay=...)");
    const pxt_backend *be = o->g.be;
    int d = o->g.device.index, rc;
    if (!o->master) /* fp32: the parameters are the master, a true exchange */
        rc = be->swap(d, o->g.params->data, o->ema->data, o->n, PXT_FLOAT32);
    else /* 16-bit: parameters from the EMA, and back from the master */
        rc = be->cast(d, o->g.params->data, o->g.dt, o->swapped ? o->master->data : o->ema->data,
                      PXT_FLOAT32, o->n);
    if (rc != PXT_OK)
        return pxt_raise(rc);
    o->swapped = !o->swapped;
    return PyBool_FromLong(o->swapped);
}

/* ---- state ----------------------------------------------------------------- */

static PyObject *flat_numpy(pxt_tensor *t) { return PyObject_CallMethod((PyObject *)t, "numpy", NULL); }

static PyObject *adamw_state_dict(PyObject *op, PyObject *unused) {
    (void)unused;
    pxt_adamw *o = (pxt_adamw *)op;
    if (check_init(o) < 0 || check_idle(o, "state_dict") < 0 || check_unswapped(o, "state_dict") < 0)
        return NULL;
    PyObject *m = flat_numpy(o->m), *v = NULL, *master = NULL, *ema = NULL;
    if (!m || !(v = flat_numpy(o->v)))
        goto fail;
    if (o->master)
        master = flat_numpy(o->master);
    else
        master = flat_numpy(o->g.params);
    if (!master)
        goto fail;
    ema = o->ema ? flat_numpy(o->ema) : Py_NewRef(Py_None);
    if (!ema)
        goto fail;
    PyObject *ls = o->scaling ? PyFloat_FromDouble(o->scale) : Py_NewRef(Py_None);
    PyObject *ed = o->ema ? PyFloat_FromDouble(o->ema_decay) : Py_NewRef(Py_None);
    PyObject *gc = o->grad_clip > 0 ? PyFloat_FromDouble(o->grad_clip) : Py_NewRef(Py_None);
    return Py_BuildValue("{s:L,s:N,s:N,s:N,s:N,s:d,s:(dd),s:d,s:d,s:N,s:N,s:L,s:L,s:N,s:n}",
                         "step", o->step, "m", m, "v", v, "master", master, "ema", ema,
                         "lr", o->lr, "betas", o->beta1, o->beta2, "eps", o->eps,
                         "weight_decay", o->weight_decay, "grad_clip", gc, "loss_scale", ls,
                         "growth_interval", o->growth_interval, "good_steps", o->good_steps,
                         "ema_decay", ed, "num_elements", (Py_ssize_t)o->n);
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
        PyErr_Format(PyExc_KeyError, "state: missing key '%s' (pass what AdamW.state_dict() "
                     "returned)", key);
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
        PyErr_Format(PyExc_ValueError, "state['%s']: expected shape (%zu,) (this model's flat "
                     "buffer), got %d dimensions of %zd elements", key, n, PyArray_NDIM(a),
                     (Py_ssize_t)PyArray_SIZE(a));
        return NULL;
    }
    PyArrayObject *c = (PyArrayObject *)PyArray_FROM_OTF(obj, NPY_FLOAT32,
                                                         NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED);
    if (!c)
        return NULL;
    const float *x = PyArray_DATA(c);
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) {
            Py_DECREF(c);
            PyErr_Format(PyExc_ValueError, "state['%s']: NaN or infinity at index %zu", key, i);
            return NULL;
        }
    return c;
}

/* load_state_dict(state): everything checked, then everything written. */
static PyObject *adamw_load_state_dict(PyObject *op, PyObject *state) {
    pxt_adamw *o = (pxt_adamw *)op;
    if (check_init(o) < 0 || check_idle(o, "load_state_dict") < 0 ||
        check_unswapped(o, "load_state_dict") < 0)
        return NULL;
    if (!PyMapping_Check(state) || !PyObject_HasAttrString(state, "keys"))
        return PyErr_Format(PyExc_TypeError, "state: expected a dict (from AdamW.state_dict()), "
                            "got %.100s", Py_TYPE(state)->tp_name);
    static const char *keys[] = {"step", "m", "v", "master", "ema", "lr", "betas", "eps",
                                 "weight_decay", "grad_clip", "loss_scale", "growth_interval",
                                 "good_steps", "ema_decay"};
    enum { K_STEP, K_M, K_V, K_MASTER, K_EMA, K_LR, K_BETAS, K_EPS, K_WD, K_CLIP, K_LS, K_GI,
           K_GOOD, K_EMAD, NK };
    PyObject *val[NK] = {0};
    PyArrayObject *arr[4] = {0}; /* m, v, master, ema */
    PyObject *result = NULL;
    for (int k = 0; k < NK; k++)
        if (!(val[k] = get_key(state, keys[k])))
            goto done;
    long long step, gi, good;
    double lr, b1, b2, eps, wd, clip, scale = 0.0, emad = 0.0;
    int scaling, has_ema;
    if (parse_count(val[K_STEP], "state['step']", &step, 0) < 0 ||
        real_arg(val[K_LR], "state['lr']", &lr, 0.0, 0, INFINITY, 0, "a finite number >= 0") < 0 ||
        parse_betas(val[K_BETAS], &b1, &b2) < 0 ||
        real_arg(val[K_EPS], "state['eps']", &eps, 0.0, 1, INFINITY, 0, "a finite number > 0") < 0 ||
        real_arg(val[K_WD], "state['weight_decay']", &wd, 0.0, 0, INFINITY, 0,
                 "a finite number >= 0") < 0 ||
        parse_clip(val[K_CLIP], &clip) < 0 || parse_loss_scale(val[K_LS], &scaling, &scale) < 0 ||
        parse_count(val[K_GI], "state['growth_interval']", &gi, 1) < 0 ||
        parse_count(val[K_GOOD], "state['good_steps']", &good, 0) < 0 ||
        parse_ema(val[K_EMAD], &has_ema, &emad) < 0)
        goto done;
    if (scaling != o->scaling) {
        PyErr_Format(PyExc_ValueError, "state['loss_scale']: this optimizer %s loss scaling but "
                     "the state %s", o->scaling ? "uses" : "has no", scaling ? "has" : "has none");
        goto done;
    }
    if (has_ema != (o->ema != NULL) || (val[K_EMA] == Py_None) != !has_ema) {
        PyErr_Format(PyExc_ValueError, "state['ema']: this optimizer %s an EMA but the state %s",
                     o->ema ? "keeps" : "keeps no", val[K_EMA] == Py_None ? "has none" : "has one");
        goto done;
    }
    if (!(arr[0] = flat_arg(val[K_M], "m", o->n)) || !(arr[1] = flat_arg(val[K_V], "v", o->n)) ||
        !(arr[2] = flat_arg(val[K_MASTER], "master", o->n)) ||
        (has_ema && !(arr[3] = flat_arg(val[K_EMA], "ema", o->n))))
        goto done;
    { /* all checked: now write */
        const pxt_backend *be = o->g.be;
        int d = o->g.device.index, rc = PXT_OK;
        size_t fb = o->n * sizeof(float);
        pxt_tensor *dst[4] = {o->m, o->v, o->master ? o->master : o->g.params, o->ema};
        for (int i = 0; i < 4 && rc == PXT_OK; i++)
            if (arr[i])
                rc = be->copy(d, dst[i]->data, PyArray_DATA(arr[i]), fb, PXT_COPY_H2D);
        if (rc == PXT_OK && o->master)
            rc = be->cast(d, o->g.params->data, o->g.dt, o->master->data, PXT_FLOAT32, o->n);
        if (rc != PXT_OK) {
            pxt_raise(rc);
            goto done;
        }
        o->step = step, o->lr = lr, o->beta1 = b1, o->beta2 = b2, o->eps = eps;
        o->weight_decay = wd, o->grad_clip = clip, o->growth_interval = gi, o->good_steps = good;
        if (scaling)
            o->scale = scale;
        if (has_ema)
            o->ema_decay = emad;
    }
    result = Py_NewRef(Py_None);
done:
    for (int k = 0; k < NK; k++)
        Py_XDECREF(val[k]);
    for (int i = 0; i < 4; i++)
        Py_XDECREF(arr[i]);
    return result;
}

/* ---- attributes ------------------------------------------------------------ */

static PyObject *get_lr(PyObject *op, void *c) {
    (void)c;
    return PyFloat_FromDouble(((pxt_adamw *)op)->lr);
}

static int set_lr(PyObject *op, PyObject *v, void *c) {
    (void)c;
    pxt_adamw *o = (pxt_adamw *)op;
    if (!v) {
        PyErr_SetString(PyExc_AttributeError, "lr: cannot be deleted");
        return -1;
    }
    double x;
    if (real_arg(v, "lr", &x, 0.0, 0, INFINITY, 0, "a finite number >= 0") < 0)
        return -1;
    if (o->core && check_idle(o, "lr") < 0)
        return -1;
    o->lr = x;
    return 0;
}

static PyObject *get_betas(PyObject *op, void *c) {
    (void)c;
    return Py_BuildValue("(dd)", ((pxt_adamw *)op)->beta1, ((pxt_adamw *)op)->beta2);
}
static PyObject *get_eps(PyObject *op, void *c) {
    (void)c;
    return PyFloat_FromDouble(((pxt_adamw *)op)->eps);
}
static PyObject *get_wd(PyObject *op, void *c) {
    (void)c;
    return PyFloat_FromDouble(((pxt_adamw *)op)->weight_decay);
}
static PyObject *get_clip(PyObject *op, void *c) {
    (void)c;
    pxt_adamw *o = (pxt_adamw *)op;
    return o->grad_clip > 0 ? PyFloat_FromDouble(o->grad_clip) : Py_NewRef(Py_None);
}
static PyObject *get_scale(PyObject *op, void *c) {
    (void)c;
    pxt_adamw *o = (pxt_adamw *)op;
    return o->scaling ? PyFloat_FromDouble(o->scale) : Py_NewRef(Py_None);
}
static PyObject *get_ema_decay(PyObject *op, void *c) {
    (void)c;
    pxt_adamw *o = (pxt_adamw *)op;
    return o->ema ? PyFloat_FromDouble(o->ema_decay) : Py_NewRef(Py_None);
}
static PyObject *get_step_count(PyObject *op, void *c) {
    (void)c;
    return PyLong_FromLongLong(((pxt_adamw *)op)->step);
}
static PyObject *get_state_bytes(PyObject *op, void *c) {
    (void)c;
    return PyLong_FromSize_t(((pxt_adamw *)op)->state_bytes);
}
static PyObject *get_decay(PyObject *op, void *c) {
    (void)c;
    pxt_adamw *o = (pxt_adamw *)op;
    if (check_init(o) < 0)
        return NULL;
    PyObject *out = PyList_New(0);
    for (int i = 0; out && i < o->n_segments; i++) {
        if (!o->decay[i])
            continue;
        PyObject *name = PyUnicode_FromString(o->g.layout->params[i].name);
        if (!name || PyList_Append(out, name) < 0)
            Py_CLEAR(out);
        Py_XDECREF(name);
    }
    return out;
}
static PyObject *get_swapped(PyObject *op, void *c) {
    (void)c;
    return PyBool_FromLong(((pxt_adamw *)op)->swapped);
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
    {"state_bytes", get_state_bytes, NULL, "allocator bytes of the optimizer state", NULL},
    {"ema_swapped", get_swapped, NULL, "whether the model holds the EMA weights now", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef adamw_methods[] = {
    {"step", adamw_step, METH_NOARGS,
     "step() -> dict(skipped, grad_norm, loss_scale, lr, step): one update from the gradients"},
    {"zero_grad", adamw_zero_grad, METH_NOARGS, "set the model's gradients to 0"},
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
    .tp_basicsize = sizeof(pxt_adamw),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "AdamW(model, lr=1e-4, betas=(0.9, 0.96), eps=1e-8, weight_decay=0.01, "
              "grad_clip=1.0, loss_scale=None, ema_decay=None, growth_interval=2000, decay=None)\n\n"
              "torch.optim.AdamW over the model's flat buffers, with global-norm clipping "
              "(grad_clip None or 0: off), weight decay on the tensors named by decay (None: "
              "those of 2+ dims), optional "
              "dynamic loss scaling (loss_scale: the start scale; x2 after growth_interval clean "
              "steps, x0.5 and the step skipped on inf/NaN) and an optional EMA of the weights.",
    .tp_new = PyType_GenericNew,
    .tp_init = adamw_init,
    .tp_dealloc = adamw_dealloc,
    .tp_methods = adamw_methods,
    .tp_getset = adamw_getset,
};

int pxt_adamw_init_type(PyObject *module) {
    return PyModule_AddType(module, &adamw_type); /* readies it; the name after the last dot */
}
