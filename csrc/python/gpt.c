/* gpt.c: pyxtts._C.GPT, the type object over the engine's XTTS GPT (engine/gpt.h).
 *
 * Converts arguments, reserves the step's arena and runs the step with the GIL
 * released. The Python class pyxtts.XTTSGPT validates batches (vectorised
 * NumPy) and calls _step with contiguous int32 arrays; the engine repeats the
 * cheap checks so nothing unchecked reaches a kernel. Also plan_memory (a plan
 * without a model) and check_model_config (the config rules, for ModelConfig). */
#include "module.h"

#include <limits.h>
#include <math.h>
#include <string.h>

#define NO_IMPORT_ARRAY
#define PY_ARRAY_UNIQUE_SYMBOL pxt_ARRAY_API
#define NPY_NO_DEPRECATED_API NPY_2_0_API_VERSION
#include <numpy/arrayobject.h>

#include "engine/adamw.h"
#include "engine/gpt.h"

typedef struct {
    PyObject_HEAD
    pxt_gpt m;
    int ready; /* __init__ succeeded */
} pxt_py_gpt;

static PyTypeObject gpt_type;

/* ---- the config's arguments ----------------------------------------------------------
 * Converted to C types only: the rules are pxt_gpt_config_check's, in one place. */

#define CONFIG_KW                                                                                  \
    "n_layers", "d_model", "n_heads", "text_vocab_size", "audio_vocab_size", "max_text_tokens",    \
        "max_audio_tokens", "n_cond_latents", "layer_norm_eps", "text_loss_weight",                \
        "audio_loss_weight", "max_attention_sequence_length", "dropout", "conditioning",           \
        "max_cond_frames"
#define CONFIG_FMT "O&O&O&O&O&O&O&O&O&O&O&O&O&O&O&"
#define CONFIG_INT(name) PXT_PY_INT("ModelConfig." name, INT_MIN, INT_MAX)
#define CONFIG_ARGS(c)                                                                             \
    pxt_py_int_converter, &(c).ints[0], pxt_py_int_converter, &(c).ints[1], pxt_py_int_converter,  \
        &(c).ints[2], pxt_py_int_converter, &(c).ints[3], pxt_py_int_converter, &(c).ints[4],      \
        pxt_py_int_converter, &(c).ints[5], pxt_py_int_converter, &(c).ints[6],                    \
        pxt_py_int_converter, &(c).ints[7], pxt_py_real_converter, &(c).reals[0],                  \
        pxt_py_real_converter, &(c).reals[1], pxt_py_real_converter, &(c).reals[2],                \
        pxt_py_int_converter, &(c).ints[8], pxt_py_real_converter, &(c).reals[3],                  \
        pxt_py_bool_converter, &(c).conditioning, pxt_py_int_converter, &(c).ints[9]

typedef struct {
    pxt_py_int ints[10];  /* the int fields in CONFIG_KW order: ..., max_seq, max_cond_frames */
    pxt_py_real reals[4]; /* layer_norm_eps, text_loss_weight, audio_loss_weight, dropout */
    pxt_py_bool conditioning;
} config_args;

static config_args config_args_make(void) {
    config_args c = {
        .ints = {CONFIG_INT("n_layers"), CONFIG_INT("d_model"), CONFIG_INT("n_heads"),
                 CONFIG_INT("text_vocab_size"), CONFIG_INT("audio_vocab_size"),
                 CONFIG_INT("max_text_tokens"), CONFIG_INT("max_audio_tokens"),
                 CONFIG_INT("n_cond_latents"), CONFIG_INT("max_attention_sequence_length"),
                 CONFIG_INT("max_cond_frames")},
        .reals = {PXT_PY_NUMBER("ModelConfig.layer_norm_eps", 0.0),
                  PXT_PY_NUMBER("ModelConfig.text_loss_weight", 0.0),
                  PXT_PY_NUMBER("ModelConfig.audio_loss_weight", 0.0),
                  PXT_PY_NUMBER("ModelConfig.dropout", 0.0)},
        .conditioning = PXT_PY_BOOL("ModelConfig.conditioning"),
    };
    return c;
}

static pxt_gpt_config config_of(const config_args *a) {
    pxt_gpt_config c = {
        .n_layers = (int)a->ints[0].value,
        .d_model = (int)a->ints[1].value,
        .n_heads = (int)a->ints[2].value,
        .text_vocab = (int)a->ints[3].value,
        .audio_vocab = (int)a->ints[4].value,
        .max_text = (int)a->ints[5].value,
        .max_audio = (int)a->ints[6].value,
        .n_cond = (int)a->ints[7].value,
        .eps = (float)a->reals[0].value,
        .text_w = (float)a->reals[1].value,
        .audio_w = (float)a->reals[2].value,
        .max_seq = (int)a->ints[8].value,
        .dropout = (float)a->reals[3].value,
        .conditioning = a->conditioning.value,
        .max_cond_frames = (int)a->ints[9].value,
    };
    return c;
}

/* check_model_config(**ModelConfig fields): None, or ValueError naming the field. */
static PyObject *py_check_model_config(PyObject *mod, PyObject *args, PyObject *kwargs) {
    (void)mod;
    static char *kw[] = {CONFIG_KW, NULL};
    config_args ca = config_args_make();
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, CONFIG_FMT ":check_model_config", kw,
                                     CONFIG_ARGS(ca))) {
        return NULL;
    }
    pxt_gpt_config c = config_of(&ca);
    int rc = pxt_gpt_config_check(&c);
    if (rc != PXT_OK) {
        return pxt_raise(rc);
    }
    Py_RETURN_NONE;
}

/* ---- init --------------------------------------------------------------------------- */

static int gpt_init(PyObject *op, PyObject *args, PyObject *kwargs) {
    pxt_py_gpt *g = (pxt_py_gpt *)op;
    static char *kw[] = {CONFIG_KW, "device", "precision", "checkpointing", "seed", NULL};
    config_args ca = config_args_make();
    pxt_py_device dev = PXT_PY_DEVICE_OPT("device", 1);
    pxt_py_choice prec = PXT_PY_CHOICE("precision", pxt_py_precision_names);
    pxt_py_choice ckpt = PXT_PY_CHOICE("checkpointing", pxt_py_ckpt_names);
    pxt_py_u64 seed = PXT_PY_U64("seed"); /* a number: None is a mistake, not a default */
    if (g->ready) {
        PyErr_SetString(PyExc_RuntimeError, "GPT.__init__ called twice");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, CONFIG_FMT "|O&O&O&O&:GPT", kw, CONFIG_ARGS(ca),
                                     pxt_py_device_converter, &dev, pxt_py_choice_converter, &prec,
                                     pxt_py_choice_converter, &ckpt, pxt_py_u64_converter, &seed)) {
        return -1;
    }
    pxt_gpt_config c = config_of(&ca);
    int rc = pxt_gpt_init(&g->m, &c, dev.value, pxt_py_precision_dtype(prec.index), ckpt.index,
                          seed.value);
    if (rc != PXT_OK) {
        return pxt_raise_int(rc);
    }
    g->ready = 1;
    return 0;
}

static void gpt_dealloc(PyObject *op) {
    pxt_py_gpt *g = (pxt_py_gpt *)op;
    pxt_gpt_free(&g->m);
    Py_TYPE(op)->tp_free(op);
}

/* Methods other than __init__ on a GPT whose __init__ never ran (or failed). */
static pxt_gpt *ready(PyObject *op) {
    pxt_py_gpt *g = (pxt_py_gpt *)op;
    if (g->ready) {
        return &g->m;
    }
    PyErr_SetString(PyExc_RuntimeError, "this GPT is not initialised (__init__ failed or was not "
                                        "called)");
    return NULL;
}

static PyObject *gpt_flat_handle(PyObject *op, void *c) {
    (void)c;
    pxt_gpt *m = ready(op);
    return m ? pxt_py_flat_handle(op, &m->flat) : NULL;
}

/* ---- views ------------------------------------------------------------------------- */

static PyObject *gpt_parameters(PyObject *op, PyObject *unused) {
    (void)unused;
    pxt_gpt *m = ready(op);
    return m ? pxt_tensor_flat_views(&m->flat.layout, m->flat.params, m->flat.dt) : NULL;
}

static PyObject *gpt_gradients(PyObject *op, PyObject *unused) {
    (void)unused;
    pxt_gpt *m = ready(op);
    return m ? pxt_tensor_flat_views(&m->flat.layout, m->flat.grads, PXT_FLOAT32) : NULL;
}

/* flat_gradients(): the whole fp32 gradient buffer as one 1-D Tensor view (padding
 * included, always zero), for one collective over every gradient (an all-reduce). */
static PyObject *gpt_flat_gradients(PyObject *op, PyObject *unused) {
    (void)unused;
    pxt_gpt *m = ready(op);
    if (!m) {
        return NULL;
    }
    int64_t n = (int64_t)m->flat.layout.numel;
    return pxt_tensor_view(m->flat.grads, 0, PXT_FLOAT32, 1, &n);
}

static PyObject *gpt_zero_grad(PyObject *op, PyObject *unused) {
    (void)unused;
    pxt_gpt *m = ready(op);
    if (!m) {
        return NULL;
    }
    if (m->flat.busy) {
        return PyErr_Format(PyExc_RuntimeError,
                            "zero_grad: a step of this model is running (in "
                            "another thread); its gradients cannot be zeroed now");
    }
    int rc = pxt_flat_zero_grad(&m->flat);
    if (rc != PXT_OK) {
        return pxt_raise(rc);
    }
    Py_RETURN_NONE;
}

/* _write(which, arrays): arrays[i] (a C-contiguous NumPy array of tensor i's size in
 * the buffer's dtype, or None to keep it) into the parameters (which="parameters")
 * or the gradients. Everything is checked first; then only copies run, and nothing
 * is allocated from a device's allocator, so an out-of-memory error cannot stop it
 * half way: load_state_dict and the restores of find_optimal_batch_size write all
 * tensors or none. */
static const char *const write_targets[] = {"parameters", "gradients", NULL};

static PyObject *gpt_write(PyObject *op, PyObject *args) {
    pxt_gpt *m = ready(op);
    if (!m) {
        return NULL;
    }
    pxt_py_choice which = PXT_PY_CHOICE("which", write_targets);
    PyObject *arrays;
    if (!PyArg_ParseTuple(args, "O&O!:_write", pxt_py_choice_converter, &which, &PyList_Type,
                          &arrays)) {
        return NULL;
    }
    pxt_flat *f = &m->flat;
    if (f->busy) {
        return PyErr_Format(PyExc_RuntimeError,
                            "a step of this model is running (in another "
                            "thread); its %s cannot be written now",
                            which.choices[which.index]);
    }
    const pxt_param_layout *L = &f->layout;
    if (PyList_GET_SIZE(arrays) != L->count) {
        return PyErr_Format(PyExc_ValueError, "_write: expected %d arrays, got %zd", L->count,
                            PyList_GET_SIZE(arrays));
    }
    pxt_dtype dt = which.index == 0 ? f->dt : PXT_FLOAT32;
    PyObject *descr = pxt_dtype_to_descr(dt);
    if (!descr) {
        return NULL;
    }
    for (int i = 0; i < L->count; i++) {
        PyObject *a = PyList_GET_ITEM(arrays, i);
        if (a == Py_None) {
            continue;
        }
        if (!PyArray_Check(a) ||
            !PyArray_EquivTypes(PyArray_DESCR((PyArrayObject *)a), (PyArray_Descr *)descr) ||
            !PyArray_IS_C_CONTIGUOUS((PyArrayObject *)a) ||
            (size_t)PyArray_SIZE((PyArrayObject *)a) != L->params[i].numel) {
            Py_DECREF(descr);
            return PyErr_Format(PyExc_TypeError,
                                "_write: %s must be a C-contiguous %s array of %zu elements",
                                L->params[i].name, pxt_dtype_name(dt), L->params[i].numel);
        }
    }
    Py_DECREF(descr);
    size_t es = pxt_dtype_size(dt);
    pxt_copy_kind kind = f->device.type == PXT_CPU ? PXT_COPY_D2D : PXT_COPY_H2D;
    for (int i = 0; i < L->count; i++) {
        PyObject *a = PyList_GET_ITEM(arrays, i);
        if (a == Py_None || !L->params[i].numel) {
            continue;
        }
        char *dst = which.index == 0 ? pxt_flat_param(f, i) : (char *)pxt_flat_grad(f, i);
        int rc = f->be->copy(f->device.index, dst, PyArray_DATA((PyArrayObject *)a),
                             L->params[i].numel * es, kind);
        if (rc != PXT_OK) { /* a device error, never an allocation */
            return pxt_raise(rc);
        }
    }
    Py_RETURN_NONE;
}

/* ---- plans --------------------------------------------------------------------------- */

/* n_params: elements of the flat buffers (padding included); count: the parameters.
 * b: the blocks the allocators count (the optimizer state's on the device and in the
 * host pool); pinned: the host pool is page-locked (a GPU's). */
static PyObject *plan_dict(size_t n_params, size_t count, pxt_dtype dt, const pxt_plan *p,
                           const pxt_gpt_blocks *b, int pinned) {
    size_t opt_bytes = b->opt, host_bytes = b->opt_host;
    size_t param_bytes = n_params * pxt_dtype_size(dt);
    size_t grad_bytes = p->train ? n_params * sizeof(float) : 0;
    size_t total = pxt_gpt_total_bytes(b, p->train);
    PyObject *blocks = PyList_New(p->L), *policies = PyList_New(p->L);
    if (!blocks || !policies) {
        Py_XDECREF(blocks);
        Py_XDECREF(policies);
        return NULL;
    }
    for (int l = 0; l < p->L; l++) {
        PyObject *b = PyLong_FromSize_t(p->block_saved_bytes[l]);
        PyObject *s = PyUnicode_FromString(pxt_py_ckpt_names[p->policy[l]]);
        if (!b || !s) {
            Py_XDECREF(b);
            Py_XDECREF(s);
            Py_DECREF(blocks);
            Py_DECREF(policies);
            return NULL;
        }
        PyList_SET_ITEM(blocks, l, b);
        PyList_SET_ITEM(policies, l, s);
    }
    const pxt_cond_plan *q = &p->cond;
    return Py_BuildValue(
        "{s:n,s:n,s:n,s:n,s:n,s:n,s:N,s:N,s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:i,s:i,s:i,"
        "s:i,s:n,s:n,s:s,s:i,s:z,s:n,s:n,s:n,s:n,s:n,s:n,s:n}",
        "parameters", (Py_ssize_t)param_bytes, "gradients", (Py_ssize_t)grad_bytes, "optimizer",
        (Py_ssize_t)opt_bytes, "inputs", (Py_ssize_t)p->inputs_bytes, "residuals",
        (Py_ssize_t)p->resid_bytes, "final_norms", (Py_ssize_t)p->final_bytes, "saved_per_block",
        blocks, "policies", policies, "work", (Py_ssize_t)p->work_bytes, "attention_workspace",
        (Py_ssize_t)p->attn_ws_bytes, "logits", (Py_ssize_t)p->logits_bytes, "gemm_workspace",
        (Py_ssize_t)p->gemm_ws_bytes, "activation_gradients", (Py_ssize_t)p->grad_bytes, "saved",
        (Py_ssize_t)p->saved_bytes, "scratch", (Py_ssize_t)p->scratch_bytes, "arena",
        (Py_ssize_t)p->arena_bytes, "total", (Py_ssize_t)total, "allocator_rounding",
        (Py_ssize_t)(total - param_bytes - grad_bytes - p->arena_bytes - opt_bytes),
        "sequence_length", (Py_ssize_t)p->T, "batch_size", p->B, "logits_rows", p->logits_rows,
        "train", p->train, "n_layers", p->L, "head_casts", (Py_ssize_t)p->head_cast_bytes,
        "reduce_workspace", (Py_ssize_t)p->reduce_ws_bytes, "precision", pxt_py_precision_name(dt),
        "cond_frames", q->S, "conditioning_policy", q->S ? pxt_py_ckpt_names[q->policy] : NULL,
        "conditioning_inputs", (Py_ssize_t)q->inputs_bytes, "conditioning_saved",
        (Py_ssize_t)q->saved_bytes, "conditioning_scratch", (Py_ssize_t)q->scratch_bytes,
        "parameter_count", (Py_ssize_t)count, "host_optimizer", (Py_ssize_t)host_bytes,
        "host_pinned", (Py_ssize_t)(pinned ? host_bytes : 0), "host_pageable",
        (Py_ssize_t)(pinned ? 0 : host_bytes));
}

/* The arena's budget from a budget argument: what is left of it once the
 * parameters, gradients and optimizer state are counted (negative: 0). */
static size_t budget_left(long long budget, size_t fixed) {
    return (size_t)(budget > 0 ? budget : 0) > fixed ? (size_t)budget - fixed : 0;
}

/* estimate_memory(batch_size, text_len, audio_len, cond_len=None, checkpointing=None,
 *                 train=True, budget=None, optimizer=None, cond_frames=0,
 *                 offload=False) -> dict
 * optimizer: None counts the optimizer state attached to this model (0 without
 * one), True that or else a default AdamW's (offload: its state in the host pool),
 * False none. */
static PyObject *gpt_estimate(PyObject *op, PyObject *args, PyObject *kwargs) {
    static char *kw[] = {"batch_size",    "text_len", "audio_len", "cond_len",
                         "checkpointing", "train",    "budget",    "optimizer",
                         "cond_frames",   "offload",  NULL};
    pxt_gpt *m = ready(op);
    if (!m) {
        return NULL;
    }
    pxt_py_int B = PXT_PY_INT("batch_size", INT_MIN, INT_MAX);
    pxt_py_int Lt = PXT_PY_INT("text_len", INT_MIN, INT_MAX);
    pxt_py_int La = PXT_PY_INT("audio_len", INT_MIN, INT_MAX);
    pxt_py_int Nc = PXT_PY_INT_OPT("cond_len", INT_MIN, INT_MAX, m->cfg.n_cond);
    pxt_py_choice ckpt = PXT_PY_CHOICE_OPT("checkpointing", pxt_py_ckpt_names, m->ckpt);
    pxt_py_int budget = PXT_PY_INT_OPT("budget", LLONG_MIN, LLONG_MAX, 0);
    pxt_py_int S = PXT_PY_INT_OPT("cond_frames", INT_MIN, INT_MAX, 0);
    PyObject *opt_arg = Py_None;
    pxt_py_bool train = PXT_PY_BOOL_DFLT("train", 1);
    pxt_py_bool offload = PXT_PY_BOOL_DFLT("offload", 0);
    if (!PyArg_ParseTupleAndKeywords(
            args, kwargs, "O&O&O&|O&O&O&O&OO&O&:estimate_memory", kw, pxt_py_int_converter, &B,
            pxt_py_int_converter, &Lt, pxt_py_int_converter, &La, pxt_py_int_converter, &Nc,
            pxt_py_choice_converter, &ckpt, pxt_py_bool_converter, &train, pxt_py_int_converter,
            &budget, &opt_arg, pxt_py_int_converter, &S, pxt_py_bool_converter, &offload)) {
        return NULL;
    }
    const pxt_flat *f = &m->flat;
    int want = -1; /* optimizer=None: what is attached */
    if (opt_arg != Py_None && (want = PyObject_IsTrue(opt_arg)) < 0) {
        return NULL;
    }
    int attached = f->optimizer_bytes || f->optimizer_host_bytes;
    /* what exists is read off its blocks; what a step adds is replayed through
     * copies of the allocators it would come from */
    pxt_gpt_blocks b = {pxt_block_size(f->params->block), pxt_block_size(f->grads->block),
                        f->optimizer_bytes, f->optimizer_host_bytes, 0};
    pxt_allocator *dev = pxt_alloc_plan_new(pxt_allocator_get(f->device)), *host = NULL;
    int rc = dev ? PXT_OK : PXT_ERR_OOM;
    if (rc == PXT_OK && want == 1 && !attached) { /* a default AdamW's */
        pxt_adamw_placement where = {.offload = offload.value};
        pxt_adamw_bytes o = {0, 0};
        if (offload.value && !(host = pxt_alloc_plan_new(pxt_host_pool(f->device)))) {
            rc = PXT_ERR_OOM;
        }
        if (rc == PXT_OK) {
            rc = pxt_adamw_plan(dev, host, f->layout.numel, f->layout.count, f->dt, 0, &where, &o);
        }
        b.opt = o.device;
        b.opt_host = o.host;
    }
    if (want == 0 || !train.value) {
        b.opt = b.opt_host = 0;
    }
    /* without a budget, parameters and gradients are already allocated: the arena gets the rest */
    size_t avail = budget.a.given ? budget_left(budget.value, pxt_gpt_fixed_bytes(&b, 1))
                                  : pxt_gpt_arena_budget(m);
    pxt_plan p;
    if (rc == PXT_OK) {
        rc = pxt_gpt_plan(&p, &m->cfg, f->be, f->dt, (int)B.value, (int)Lt.value, (int)La.value,
                          (int)Nc.value, (int)S.value, ckpt.index, train.value, avail);
        if (rc == PXT_OK && (rc = pxt_gpt_plan_arena(m, dev, &p, &b.arena)) != PXT_OK) {
            pxt_plan_free(&p);
        }
    }
    pxt_alloc_plan_free(dev);
    pxt_alloc_plan_free(host);
    if (rc != PXT_OK) {
        return pxt_raise(rc);
    }
    PyObject *d = plan_dict(f->layout.numel, pxt_flat_num_parameters(f), f->dt, &p, &b,
                            pxt_host_pool_pinned(f->device));
    pxt_plan_free(&p);
    return d;
}

/* plan_memory(n_layers, ..., max_attention_sequence_length, batch_size, text_len,
 *             audio_len, cond_len=None, checkpointing="none", train=True, budget=None,
 *             device="cpu", optimizer=False, precision="fp32", cond_frames=0,
 *             offload=False) -> dict: a plan without a model (nothing is allocated);
 * offload: a default AdamW's state in the host pool. */
static PyObject *py_plan_memory(PyObject *mod, PyObject *args, PyObject *kwargs) {
    (void)mod;
    static char *kw[] = {CONFIG_KW,       "batch_size",  "text_len", "audio_len", "cond_len",
                         "checkpointing", "train",       "budget",   "device",    "optimizer",
                         "precision",     "cond_frames", "offload",  NULL};
    config_args ca = config_args_make();
    pxt_py_int B = PXT_PY_INT("batch_size", INT_MIN, INT_MAX);
    pxt_py_int Lt = PXT_PY_INT("text_len", INT_MIN, INT_MAX);
    pxt_py_int La = PXT_PY_INT("audio_len", INT_MIN, INT_MAX);
    pxt_py_int Nc = PXT_PY_INT_OPT("cond_len", INT_MIN, INT_MAX, -1);
    pxt_py_choice ckpt = PXT_PY_CHOICE("checkpointing", pxt_py_ckpt_names);
    pxt_py_int budget = PXT_PY_INT_OPT("budget", LLONG_MIN, LLONG_MAX, 0);
    pxt_py_device dev = PXT_PY_DEVICE_OPT("device", 0);
    pxt_py_choice prec = PXT_PY_CHOICE("precision", pxt_py_precision_names);
    pxt_py_int S = PXT_PY_INT_OPT("cond_frames", INT_MIN, INT_MAX, 0);
    pxt_py_bool train = PXT_PY_BOOL_DFLT("train", 1);
    pxt_py_bool offload = PXT_PY_BOOL_DFLT("offload", 0);
    int optimizer = 0; /* the Python layer passes bool(optimizer): an AdamW counts as True */
    if (!PyArg_ParseTupleAndKeywords(
            args, kwargs, CONFIG_FMT "O&O&O&|O&O&O&O&O&pO&O&O&:plan_memory", kw, CONFIG_ARGS(ca),
            pxt_py_int_converter, &B, pxt_py_int_converter, &Lt, pxt_py_int_converter, &La,
            pxt_py_int_converter, &Nc, pxt_py_choice_converter, &ckpt, pxt_py_bool_converter,
            &train, pxt_py_int_converter, &budget, pxt_py_device_converter, &dev, &optimizer,
            pxt_py_choice_converter, &prec, pxt_py_int_converter, &S, pxt_py_bool_converter,
            &offload)) {
        return NULL;
    }
    pxt_dtype dt = pxt_py_precision_dtype(prec.index);
    pxt_gpt_config c = config_of(&ca);
    int rc = pxt_gpt_config_check(&c);
    if (rc != PXT_OK) {
        return pxt_raise(rc);
    }
    /* a plan for a card needs the CUDA backend's sizes only: every build has them */
    const pxt_backend *be = pxt_backend_plan_for(dev.value.type);
    if (!be) {
        return PyErr_Format(PyExc_ValueError, "device: this build has no such backend");
    }
    pxt_param_layout layout;
    if ((rc = pxt_param_layout_init(&layout, &c)) != PXT_OK) {
        return pxt_raise(rc);
    }
    size_t n_params = layout.numel, count = 0;
    for (int i = 0; i < layout.count; i++) {
        count += layout.params[i].numel;
    }
    /* a model not yet built, in allocators that hold nothing yet: its requests
     * replayed in order (parameters, gradients, optimizer state, the arena) */
    pxt_gpt_blocks b = {0, 0, 0, 0, 0};
    pxt_allocator *pd = pxt_alloc_plan_new(NULL), *ph = pxt_alloc_plan_new(NULL);
    rc = pd && ph ? pxt_flat_plan(pd, n_params, dt, &b.params, &b.grads) : PXT_ERR_OOM;
    if (rc == PXT_OK && optimizer && train.value) {
        pxt_adamw_placement where = {.offload = offload.value};
        pxt_adamw_bytes o = {0, 0};
        rc = pxt_adamw_plan(pd, ph, n_params, layout.count, dt, 0, &where, &o);
        b.opt = o.device;
        b.opt_host = o.host;
    }
    pxt_param_layout_free(&layout);
    size_t avail = budget.a.given ? budget_left(budget.value, pxt_gpt_fixed_bytes(&b, train.value))
                                  : (size_t)-1;
    pxt_plan p;
    if (rc == PXT_OK) {
        rc = pxt_gpt_plan(&p, &c, be, dt, (int)B.value, (int)Lt.value, (int)La.value,
                          Nc.a.given ? (int)Nc.value : c.n_cond, (int)S.value, ckpt.index,
                          train.value, avail);
        if (rc == PXT_OK && (rc = pxt_alloc_plan_take(pd, p.arena_bytes, &b.arena)) != PXT_OK) {
            pxt_plan_free(&p);
        }
    }
    pxt_alloc_plan_free(pd);
    pxt_alloc_plan_free(ph);
    if (rc != PXT_OK) {
        return pxt_raise(rc);
    }
    PyObject *d = plan_dict(n_params, count, dt, &p, &b, pxt_host_pool_pinned(dev.value));
    pxt_plan_free(&p);
    return d;
}

PyMethodDef pxt_py_gpt_methods[] = {
    {"plan_memory", PXT_PY_KW(py_plan_memory),
     "The memory plan of a step for a config, without building the model."},
    {"check_model_config", PXT_PY_KW(py_check_model_config),
     "check_model_config(**fields): the rules of a ModelConfig (ValueError naming the field)."},
    {NULL, NULL, 0, NULL},
};

/* ---- the step ------------------------------------------------------------------------ */

/* Borrowed data pointer of a C-contiguous array of dtype and size, else NULL. */
static const void *arr_data(PyObject *obj, const char *name, int npy_type, npy_intp count) {
    if (!PyArray_Check(obj) || PyArray_TYPE((PyArrayObject *)obj) != npy_type ||
        !PyArray_IS_C_CONTIGUOUS((PyArrayObject *)obj) ||
        PyArray_SIZE((PyArrayObject *)obj) != count) {
        PyErr_Format(PyExc_TypeError,
                     "_step: %s must be a C-contiguous array of %zd elements "
                     "of NumPy type %d",
                     name, (Py_ssize_t)count, npy_type);
        return NULL;
    }
    return PyArray_DATA((PyArrayObject *)obj);
}

/* Borrowed data of cond: C-contiguous, count elements, of the model's dtype. */
static const void *cond_data(PyObject *obj, pxt_dtype dt, npy_intp count) {
    PyObject *descr = pxt_dtype_to_descr(dt);
    if (!descr) {
        return NULL;
    }
    int ok = PyArray_Check(obj) &&
             PyArray_EquivTypes(PyArray_DESCR((PyArrayObject *)obj), (PyArray_Descr *)descr) &&
             PyArray_IS_C_CONTIGUOUS((PyArrayObject *)obj) &&
             PyArray_SIZE((PyArrayObject *)obj) == count;
    Py_DECREF(descr);
    if (!ok) {
        PyErr_Format(PyExc_TypeError,
                     "_step: cond must be a C-contiguous array of %zd elements "
                     "of the model's dtype (%s)",
                     (Py_ssize_t)count, pxt_dtype_name(dt));
        return NULL;
    }
    return PyArray_DATA((PyArrayObject *)obj);
}

/* Borrowed data of mels: None (NULL, *S = 0), or C-contiguous (B, 80, S) of the
 * model's dtype. */
static int mels_data(PyObject *obj, pxt_dtype dt, npy_intp B, const void **data, npy_intp *S) {
    *data = NULL;
    *S = 0;
    if (obj == Py_None) {
        return 0;
    }
    if (!PyArray_Check(obj) || PyArray_NDIM((PyArrayObject *)obj) != 3 ||
        PyArray_DIM((PyArrayObject *)obj, 0) != B ||
        PyArray_DIM((PyArrayObject *)obj, 1) != PXT_MEL_CHANNELS ||
        PyArray_DIM((PyArrayObject *)obj, 2) < 1 ||
        PyArray_DIM((PyArrayObject *)obj, 2) > INT_MAX) {
        PyErr_Format(PyExc_TypeError, "_step: mels must be None or a (%zd, %d, S >= 1) array",
                     (Py_ssize_t)B, PXT_MEL_CHANNELS);
        return -1;
    }
    npy_intp s = PyArray_DIM((PyArrayObject *)obj, 2);
    if (!(*data = cond_data(obj, dt, B * PXT_MEL_CHANNELS * s))) {
        return -1;
    }
    *S = s;
    return 0;
}

/* The step's pxt_grads_done_fn for a Python callable: called with the GIL taken
 * back (the step runs without it); its exception is kept for the caller. */
typedef struct {
    PyObject *fn;
    int failed;
    pxt_py_pending exc; /* the callable's exception when failed */
} grads_hook;

static int call_grads_hook(void *ctx, size_t offset, size_t count) {
    grads_hook *h = ctx;
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *r = PyObject_CallFunction(h->fn, "nn", (Py_ssize_t)offset, (Py_ssize_t)count);
    int rc = PXT_OK;
    if (r) {
        Py_DECREF(r);
    } else {
        pxt_py_pending_take(&h->exc);
        h->failed = 1;
        rc = PXT_ERR_VALUE; /* stops the step; the binding raises h->exc instead */
    }
    PyGILState_Release(g);
    return rc;
}

/* _step(text_ids, audio_ids, text_tgt, audio_tgt, text_pos, audio_pos, key_mask,
 *       text_len, audio_len, cond, n_text, n_audio, train, loss_scale=1.0, mels=None,
 *       dropout_seed=0, dropout_step=0, sample0=0, zero_grad=False, keep_larger=False,
 *       on_gradients=None, reserve_only=False) -> (text_sum, audio_sum)
 * Arrays come validated from pyxtts.XTTSGPT (int32, uint8 mask, cond and mels
 * in the model's dtype). Losses are sums of -log p over valid targets. The
 * dropout masks of a training step are keyed by (dropout_seed, dropout_step)
 * and the samples numbered from sample0. zero_grad: the gradients are zeroed once
 * the arena is reserved, so a step that does not fit leaves them as they were;
 * keep_larger: see pxt_gpt_reserve. on_gradients: None or a callable, called
 * (offset, count) in a training step's backward as each group of gradients is
 * done (pxt_grads_done_fn); an exception it raises stops the step and is raised.
 * reserve_only: the arena is reserved for this batch and nothing runs (None). */
static PyObject *gpt_step(PyObject *op, PyObject *args) {
    pxt_gpt *m = ready(op);
    if (!m) {
        return NULL;
    }
    PyObject *a[10], *mels = Py_None;
    pxt_py_real n_text = PXT_PY_NUMBER("n_text", 0.0), n_audio = PXT_PY_NUMBER("n_audio", 0.0);
    pxt_py_real loss_scale = PXT_PY_NUMBER("loss_scale", 1.0);
    pxt_py_u64 dropout_seed = PXT_PY_U64_OPT("dropout_seed", 0);
    pxt_py_u64 dropout_step = PXT_PY_U64_OPT("dropout_step", 0);
    pxt_py_int sample0 = PXT_PY_INT_OPT("sample_offset", 0, UINT32_MAX, 0);
    int train, zero_grad = 0, keep_larger = 0, reserve_only = 0;
    grads_hook hook = {.fn = Py_None};
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOO&O&p|O&OO&O&O&ppOp:_step", &a[0], &a[1], &a[2], &a[3],
                          &a[4], &a[5], &a[6], &a[7], &a[8], &a[9], pxt_py_real_converter, &n_text,
                          pxt_py_real_converter, &n_audio, &train, pxt_py_real_converter,
                          &loss_scale, &mels, pxt_py_u64_converter, &dropout_seed,
                          pxt_py_u64_converter, &dropout_step, pxt_py_int_converter, &sample0,
                          &zero_grad, &keep_larger, &hook.fn, &reserve_only)) {
        return NULL;
    }
    if (hook.fn != Py_None && !PyCallable_Check(hook.fn)) {
        return PyErr_Format(PyExc_TypeError, "on_gradients: expected None or a callable, got %R",
                            hook.fn);
    }
    if (m->flat.busy) {
        return PyErr_Format(PyExc_RuntimeError,
                            "this model is already running a step (in "
                            "another thread); steps of one model must not overlap");
    }
    for (int i = 0; i < 7; i++) {
        if (!PyArray_Check(a[i]) || PyArray_NDIM((PyArrayObject *)a[i]) != 2) {
            return PyErr_Format(PyExc_TypeError, "_step: argument %d must be a 2-d array", i);
        }
    }
    npy_intp B = PyArray_DIM((PyArrayObject *)a[0], 0), Lt = PyArray_DIM((PyArrayObject *)a[0], 1);
    npy_intp La = PyArray_DIM((PyArrayObject *)a[1], 1);
    npy_intp Nc = a[9] == Py_None ? 0
                  : PyArray_Check(a[9]) && PyArray_NDIM((PyArrayObject *)a[9]) == 3
                      ? PyArray_DIM((PyArrayObject *)a[9], 1)
                      : -1;
    if (Nc < 0) {
        return PyErr_Format(PyExc_TypeError, "_step: cond must be None or a 3-d array");
    }
    if (mels != Py_None) { /* the conditioning path makes the latents */
        if (a[9] != Py_None) {
            return PyErr_Format(PyExc_TypeError, "_step: cond and mels are exclusive");
        }
        Nc = m->cfg.n_cond;
    }
    if (B > INT_MAX || Lt > INT_MAX || La > INT_MAX || Nc > INT_MAX) {
        return PyErr_Format(PyExc_ValueError, "_step: the batch is too large");
    }
    npy_intp T = Nc + Lt + La;
    pxt_gpt_batch in = {.B = (int)B, .Lt = (int)Lt, .La = (int)La, .Nc = (int)Nc};
    if (!(in.text_ids = arr_data(a[0], "text_ids", NPY_INT32, B * Lt)) ||
        !(in.audio_ids = arr_data(a[1], "audio_ids", NPY_INT32, B * La)) ||
        !(in.text_tgt = arr_data(a[2], "text_tgt", NPY_INT32, B * Lt)) ||
        !(in.audio_tgt = arr_data(a[3], "audio_tgt", NPY_INT32, B * La)) ||
        !(in.text_pos = arr_data(a[4], "text_pos", NPY_INT32, B * Lt)) ||
        !(in.audio_pos = arr_data(a[5], "audio_pos", NPY_INT32, B * La)) ||
        !(in.key_mask = arr_data(a[6], "key_mask", NPY_UINT8, B * T)) ||
        !(in.text_len = arr_data(a[7], "text_len", NPY_INT32, B)) ||
        !(in.audio_len = arr_data(a[8], "audio_len", NPY_INT32, B)) ||
        (a[9] != Py_None && Nc &&
         !(in.cond = cond_data(a[9], m->flat.dt, B * Nc * m->cfg.d_model)))) {
        return NULL;
    }
    const void *mel_data = NULL;
    npy_intp S = 0;
    if (mels_data(mels, m->flat.dt, B, &mel_data, &S) < 0) {
        return NULL;
    }
    in.mels = mel_data;
    in.S = (int)S;
    in.n_text = n_text.value;
    in.n_audio = n_audio.value;
    in.loss_scale = loss_scale.value;
    in.dropout_seed = dropout_seed.value;
    in.dropout_step = dropout_step.value;
    in.sample0 = (uint32_t)sample0.value;
    if (hook.fn != Py_None && train) {
        in.grads_done = call_grads_hook;
        in.grads_done_ctx = &hook;
    }
    int rc = pxt_gpt_check_batch(m, &in, train);
    if (rc != PXT_OK) {
        return pxt_raise(rc);
    }
    pxt_plan p;
    rc = pxt_gpt_plan(&p, &m->cfg, m->flat.be, m->flat.dt, in.B, in.Lt, in.La, in.Nc, in.S, m->ckpt,
                      train, pxt_gpt_arena_budget(m));
    if (rc == PXT_OK) {
        rc = pxt_gpt_reserve(m, &p, keep_larger);
    }
    if (rc == PXT_OK && reserve_only) {
        Py_RETURN_NONE;
    }
    if (rc == PXT_OK &&
        zero_grad) { /* after the only allocation: a step that fails changes nothing */
        rc = pxt_flat_zero_grad(&m->flat);
    }
    if (rc != PXT_OK) {
        return pxt_raise(rc);
    }
    pxt_gpt_losses out = {0};
    pxt_flat_set_busy(&m->flat, 1);
    Py_BEGIN_ALLOW_THREADS
    rc = pxt_gpt_step(m, &in, &out);
    Py_END_ALLOW_THREADS
    pxt_flat_set_busy(&m->flat, 0);
    if (hook.failed) {
        pxt_py_pending_restore(&hook.exc);
        return NULL;
    }
    if (rc != PXT_OK) {
        return pxt_raise(rc);
    }
    return Py_BuildValue("(dd)", out.text_sum, out.audio_sum);
}

static PyObject *gpt_release_arena(PyObject *op, PyObject *unused) {
    (void)unused;
    pxt_gpt *m = ready(op);
    if (!m) {
        return NULL;
    }
    if (m->flat.busy) {
        return PyErr_Format(PyExc_RuntimeError,
                            "release_arena: a step of this model is running "
                            "(in another thread); its arena cannot be freed now");
    }
    return PyLong_FromSize_t(pxt_gpt_release_arena(m));
}

/* ---- attributes ------------------------------------------------------------------------ */

static PyObject *gpt_get_device(PyObject *op, void *c) {
    (void)c;
    pxt_gpt *m = ready(op);
    return m ? pxt_py_device_str(m->flat.device) : NULL;
}

static PyObject *gpt_get_dtype(PyObject *op, void *c) {
    (void)c;
    pxt_gpt *m = ready(op);
    return m ? Py_NewRef(pxt_dtype_object(m->flat.dt)) : NULL;
}

static PyObject *gpt_get_ckpt(PyObject *op, void *c) {
    (void)c;
    pxt_gpt *m = ready(op);
    return m ? PyUnicode_FromString(pxt_py_ckpt_names[m->ckpt]) : NULL;
}

static int gpt_set_ckpt(PyObject *op, PyObject *v, void *c) {
    (void)c;
    pxt_gpt *m = ready(op);
    if (!m) {
        return -1;
    }
    if (!v) {
        PyErr_SetString(PyExc_TypeError, "checkpointing: cannot be deleted");
        return -1;
    }
    pxt_py_choice ckpt = PXT_PY_CHOICE("checkpointing", pxt_py_ckpt_names);
    if (!pxt_py_choice_converter(v, &ckpt)) {
        return -1;
    }
    if (m->flat.busy) {
        PyErr_SetString(PyExc_RuntimeError, "checkpointing: a step of this model is running (in "
                                            "another thread); set it between steps");
        return -1;
    }
    m->ckpt = ckpt.index;
    return 0;
}

static PyObject *gpt_get_num_parameters(PyObject *op, void *c) {
    (void)c;
    pxt_gpt *m = ready(op);
    return m ? PyLong_FromSize_t(pxt_flat_num_parameters(&m->flat)) : NULL;
}

static PyObject *gpt_get_arena_bytes(PyObject *op, void *c) {
    (void)c;
    pxt_gpt *m = ready(op);
    return m ? PyLong_FromSize_t(m->arena ? m->arena->nbytes : 0) : NULL;
}

static PyObject *gpt_get_graphs(PyObject *op, void *c) {
    (void)c;
    pxt_gpt *m = ready(op);
    return m ? PyBool_FromLong(m->graphs) : NULL;
}

static int gpt_set_graphs(PyObject *op, PyObject *v, void *c) {
    (void)c;
    pxt_gpt *m = ready(op);
    if (!m) {
        return -1;
    }
    if (!v || !PyBool_Check(v)) {
        PyErr_Format(PyExc_TypeError, "cuda_graphs: expected True or False, got %s",
                     v ? Py_TYPE(v)->tp_name : "deletion");
        return -1;
    }
    char dname[32];
    if (v == Py_True && !m->flat.be->graph_begin) {
        PyErr_Format(PyExc_ValueError,
                     "cuda_graphs: graphs need a CUDA device; this model is on %s",
                     pxt_device_str(m->flat.device, dname, sizeof dname));
        return -1;
    }
    if (m->flat.busy) {
        PyErr_SetString(PyExc_RuntimeError, "cuda_graphs: a step of this model is running (in "
                                            "another thread); set it between steps");
        return -1;
    }
    if (v == Py_False) {
        pxt_gpt_free_graphs(m);
    }
    m->graphs = v == Py_True;
    return 0;
}

static PyObject *gpt_get_graph_stats(PyObject *op, void *c) {
    (void)c;
    pxt_gpt *m = ready(op);
    if (!m) {
        return NULL;
    }
    int cached = 0;
    for (int i = 0; i < PXT_GPT_GRAPHS; i++) {
        cached += m->graph[i].graph != NULL;
    }
    const pxt_gpt_graph_stats *st = &m->graph_stats;
    return Py_BuildValue("{sKsKsKsKsisiss}", "recorded", (unsigned long long)st->recorded,
                         "replayed", (unsigned long long)st->replayed, "evicted",
                         (unsigned long long)st->evicted, "failed", (unsigned long long)st->failed,
                         "cached", cached, "capacity", PXT_GPT_GRAPHS, "error", st->error);
}

static PyGetSetDef gpt_getset[] = {
    {"device", gpt_get_device, NULL, "'cpu' or 'cuda:N'", NULL},
    {"dtype", gpt_get_dtype, NULL, "dtype of parameters and activations", NULL},
    {"checkpointing", gpt_get_ckpt, gpt_set_ckpt, "'none', 'selective', 'full' or 'auto'", NULL},
    {"num_parameters", gpt_get_num_parameters, NULL, "number of parameters", NULL},
    {"arena_bytes", gpt_get_arena_bytes, NULL, "bytes of the cached step arena", NULL},
    {"_flat", gpt_flat_handle, NULL, "the handle of the flat state (what AdamW steps)", NULL},
    {"cuda_graphs", gpt_get_graphs, gpt_set_graphs,
     "record the step's forward and backward as CUDA graphs per shape and replay them", NULL},
    {"graph_stats", gpt_get_graph_stats, NULL,
     "graphs recorded, replayed, evicted, failed records, cached, capacity, last error", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef gpt_methods[] = {
    {"parameters", gpt_parameters, METH_NOARGS, "name -> Tensor view of the flat parameters"},
    {"gradients", gpt_gradients, METH_NOARGS, "name -> Tensor view of the flat fp32 gradients"},
    {"flat_gradients", gpt_flat_gradients, METH_NOARGS,
     "the whole flat fp32 gradient buffer (padding included) as one 1-D Tensor view"},
    {"zero_grad", gpt_zero_grad, METH_NOARGS, "set every gradient to 0"},
    {"_write", gpt_write, METH_VARARGS,
     "_write(which, arrays): write parameters or gradients, all or none (see pyxtts.XTTSGPT)"},
    {"estimate_memory", PXT_PY_KW(gpt_estimate), "the memory plan of a step, by component (bytes)"},
    {"_step", gpt_step, METH_VARARGS, "run a validated step (see pyxtts.XTTSGPT)"},
    {"release_arena", gpt_release_arena, METH_NOARGS, "free the cached step arena; bytes freed"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject gpt_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "pyxtts._C.GPT",
    .tp_basicsize = sizeof(pxt_py_gpt),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "Native core of pyxtts.XTTSGPT.",
    .tp_new = PyType_GenericNew,
    .tp_init = gpt_init,
    .tp_dealloc = gpt_dealloc,
    .tp_methods = gpt_methods,
    .tp_getset = gpt_getset,
};

int pxt_py_gpt_init_type(PyObject *module) {
    return PyModule_AddType(module, &gpt_type); /* readies it; the name after the last dot */
}

#undef CONFIG_KW
#undef CONFIG_FMT
#undef CONFIG_INT
#undef CONFIG_ARGS
