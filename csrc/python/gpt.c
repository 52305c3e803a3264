/* gpt.c: pyxtts._C.GPT, the XTTS GPT's native core.
 *
 * Owns the flat parameter and gradient buffers and the step arena; runs the
 * forward, the fused heads + cross-entropy and the backward through the
 * backend table. The Python class pyxtts.XTTSGPT validates batches (vectorised
 * NumPy) and calls _step with contiguous int32 arrays; the checks here repeat
 * the cheap ones so nothing unchecked reaches a kernel. */
#include "module.h"

#include <math.h>
#include <string.h>

#define NO_IMPORT_ARRAY
#define PY_ARRAY_UNIQUE_SYMBOL pxt_ARRAY_API
#define NPY_NO_DEPRECATED_API NPY_2_0_API_VERSION
#include <numpy/arrayobject.h>

#include "engine/block.h"

enum { CKPT_AUTO = 3 };

typedef struct {
    PyObject_HEAD
    pxt_gpt_config cfg;
    pxt_param_layout layout;
    pxt_device device;
    const pxt_backend *be;
    pxt_dtype dt;
    int ckpt;            /* PXT_CKPT_* or CKPT_AUTO */
    pxt_tensor *params;  /* (layout.numel) dt */
    pxt_tensor *grads;   /* (layout.numel) fp32 */
    pxt_tensor *arena;   /* uint8, plan.arena_bytes; NULL until the first step */
    pxt_plan plan;       /* the arena's plan */
    int busy;            /* a step is running (the GIL is released during it) */
    size_t opt_bytes;    /* optimizer state attached (pyxtts._C.AdamW), allocator bytes */
} pxt_gpt;

static PyTypeObject gpt_type;

/* ---- helpers ---------------------------------------------------------------- */

static char *param_ptr(pxt_gpt *m, int i) {
    return m->params->data + m->layout.params[i].offset * pxt_dtype_size(m->dt);
}

static float *grad_ptr(pxt_gpt *m, int i) {
    return (float *)m->grads->data + m->layout.params[i].offset;
}

static void block_views(pxt_gpt *m, int layer, pxt_block_params *p, pxt_block_grads *g) {
    int first = m->layout.block0 + layer * PXT_BLOCK_TENSORS;
    for (int j = 0; j < PXT_BLOCK_TENSORS; j++) {
        p->w[j] = param_ptr(m, first + j);
        g->g[j] = grad_ptr(m, first + j);
    }
}

/* Block l's activations: where its policy saves them, else in the work area
 * (recomputed there in backward). l < 0: everything in the work area. */
static pxt_block_acts block_acts(char *base, const pxt_plan *p, int l) {
    pxt_block_acts a = {0};
    pxt_block_offsets saved = l >= 0 ? p->blocks[l] : p->work, work = p->work;
    for (int act = 0; act < PXT_ACT_PLAIN; act++) {
        int keep = l >= 0 && pxt_block_saves(p->policy[l], act);
        pxt_block_acts_set(&a, act, base + *pxt_plan_slot(keep ? &saved : &work, act));
    }
    return a;
}

static int parse_ckpt(const char *s, int *out) {
    if (!strcmp(s, "none")) *out = PXT_CKPT_NONE;
    else if (!strcmp(s, "selective")) *out = PXT_CKPT_SELECTIVE;
    else if (!strcmp(s, "full")) *out = PXT_CKPT_FULL;
    else if (!strcmp(s, "auto")) *out = CKPT_AUTO;
    else {
        PyErr_Format(PyExc_ValueError, "checkpointing: expected 'none', 'selective', 'full' or "
                     "'auto', got '%s'", s);
        return -1;
    }
    return 0;
}

/* "fp32" | "bf16" | "fp16" -> the dtype of parameters and activations. */
static int parse_precision(const char *s, pxt_dtype *out) {
    if (!strcmp(s, "fp32")) *out = PXT_FLOAT32;
    else if (!strcmp(s, "bf16")) *out = PXT_BFLOAT16;
    else if (!strcmp(s, "fp16")) *out = PXT_FLOAT16;
    else {
        PyErr_Format(PyExc_ValueError, "precision: '%s' is not one of 'fp32', 'bf16', 'fp16'", s);
        return -1;
    }
    return 0;
}

static const char *ckpt_name(int c) {
    static const char *names[] = {"none", "selective", "full", "auto"};
    return names[c];
}

/* ---- init ------------------------------------------------------------------- */


static int gpt_init(PyObject *op, PyObject *args, PyObject *kwargs) {
    pxt_gpt *m = (pxt_gpt *)op;
    static char *kw[] = {"n_layers", "d_model", "n_heads", "text_vocab_size", "audio_vocab_size",
                         "max_text_tokens", "max_audio_tokens", "n_cond_latents",
                         "layer_norm_eps", "text_loss_weight", "audio_loss_weight",
                         "max_attention_sequence_length", "device", "precision",
                         "checkpointing", "seed", NULL};
    pxt_gpt_config c;
    PyObject *dev_arg = Py_None;
    const char *precision = "fp32", *ckpt = "none";
    unsigned long long seed = 0;
    if (m->params) {
        PyErr_SetString(PyExc_RuntimeError, "GPT.__init__ called twice");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iiiiiiiifffi|OssK:GPT", kw, &c.n_layers,
                                     &c.d_model, &c.n_heads, &c.text_vocab, &c.audio_vocab,
                                     &c.max_text, &c.max_audio, &c.n_cond, &c.eps, &c.text_w,
                                     &c.audio_w, &c.max_seq, &dev_arg, &precision, &ckpt, &seed))
        return -1;
    int rc = pxt_gpt_config_check(&c);
    if (rc != PXT_OK) {
        pxt_raise(rc);
        return -1;
    }
    pxt_dtype dt;
    if (parse_precision(precision, &dt) < 0)
        return -1;
    if (parse_ckpt(ckpt, &m->ckpt) < 0)
        return -1;
    m->device = (pxt_device){PXT_CPU, 0};
    if (dev_arg != Py_None && pxt_parse_device(dev_arg, &m->device, "device", 1) < 0)
        return -1;
    m->be = pxt_backend_for(m->device.type);
    char dname[32];
    rc = pxt_ctx_check_ops(m->be, pxt_device_str(m->device, dname, sizeof dname));
    if (rc != PXT_OK) {
        pxt_raise(rc);
        return -1;
    }
    m->cfg = c;
    m->dt = dt;
    if (pxt_param_layout_init(&m->layout, &c) != PXT_OK) {
        pxt_raise(PXT_ERR_OOM);
        return -1;
    }
    int64_t n = (int64_t)m->layout.numel;
    m->params = (pxt_tensor *)pxt_tensor_empty(m->device, m->dt, 1, &n);
    if (!m->params)
        return -1;
    m->grads = (pxt_tensor *)pxt_tensor_empty(m->device, PXT_FLOAT32, 1, &n);
    if (!m->grads)
        return -1;
    rc = m->be->memset_zero(m->device.index, m->grads->data, m->grads->nbytes);
    if (rc != PXT_OK) {
        pxt_raise(rc);
        return -1;
    }
    return pxt_flat_init(&m->layout, m->params, seed, 0.02f / sqrtf(2.0f * (float)c.n_layers));
}

static void gpt_dealloc(PyObject *op) {
    pxt_gpt *m = (pxt_gpt *)op;
    Py_CLEAR(m->params);
    Py_CLEAR(m->grads);
    Py_CLEAR(m->arena);
    pxt_plan_free(&m->plan);
    pxt_param_layout_free(&m->layout);
    Py_TYPE(op)->tp_free(op);
}

/* ---- views ------------------------------------------------------------------ */


static PyObject *gpt_parameters(PyObject *op, PyObject *unused) {
    (void)unused;
    pxt_gpt *m = (pxt_gpt *)op;
    return pxt_flat_views(&m->layout, m->params);
}

static PyObject *gpt_gradients(PyObject *op, PyObject *unused) {
    (void)unused;
    pxt_gpt *m = (pxt_gpt *)op;
    return pxt_flat_views(&m->layout, m->grads);
}

static PyObject *gpt_zero_grad(PyObject *op, PyObject *unused) {
    (void)unused;
    pxt_gpt *m = (pxt_gpt *)op;
    int rc = m->be->memset_zero(m->device.index, m->grads->data, m->grads->nbytes);
    if (rc != PXT_OK)
        return pxt_raise(rc);
    Py_RETURN_NONE;
}

/* ---- the plan ------------------------------------------------------------------ */

/* Available bytes for an arena: the budget (limit, else the device's total)
 * minus what is allocated besides our own current arena. */
static size_t arena_budget(pxt_gpt *m) {
    pxt_allocator *a = pxt_allocator_get(m->device);
    pxt_alloc_stats s;
    pxt_get_stats(a, &s);
    size_t cap = s.limit_bytes != PXT_NO_LIMIT ? s.limit_bytes : pxt_allocator_device_total(a);
    size_t used = s.allocated_bytes - (m->arena ? m->arena->nbytes : 0);
    return cap > used ? cap - used : 0;
}

/* Plans with a fixed policy, or for "auto" the fewest recomputed blocks that
 * fit: blocks turn selective one by one, then full one by one. */
static int plan_for(const pxt_gpt_config *cfg, const pxt_backend *be, pxt_dtype dt, pxt_plan *p,
                    int B, int Lt, int La, int Nc, int ckpt, int train, size_t budget) {
    int L = cfg->n_layers;
    memset(p, 0, sizeof *p); /* the auto loop frees the previous try */
    pxt_ckpt *pol = PyMem_RawMalloc(sizeof *pol * (size_t)L);
    if (!pol)
        return pxt_error(PXT_ERR_OOM, "out of host memory for the memory plan");
    int rc;
    if (ckpt != CKPT_AUTO || !train) {
        for (int l = 0; l < L; l++) pol[l] = ckpt == CKPT_AUTO ? PXT_CKPT_NONE : (pxt_ckpt)ckpt;
        rc = pxt_plan_make(p, cfg, be, B, Lt, La, Nc, dt, pol, train);
    } else {
        rc = PXT_OK;
        for (int step = 0; step <= 2 * L; step++) {
            /* step k: the first min(k, L) blocks selective, the first k - L full */
            for (int l = 0; l < L; l++)
                pol[l] = l < step - L ? PXT_CKPT_FULL : l < step ? PXT_CKPT_SELECTIVE : PXT_CKPT_NONE;
            pxt_plan_free(p);
            rc = pxt_plan_make(p, cfg, be, B, Lt, La, Nc, dt, pol, train);
            if (rc != PXT_OK || p->arena_bytes <= budget)
                break;
        } /* nothing fits: the all-full plan stands, and the step reports the shortfall */
    }
    PyMem_RawFree(pol);
    return rc;
}

static int make_plan(pxt_gpt *m, pxt_plan *p, int B, int Lt, int La, int Nc, int ckpt, int train,
                     size_t budget) {
    return plan_for(&m->cfg, m->be, m->dt, p, B, Lt, La, Nc, ckpt, train, budget);
}

static PyObject *plan_dict(size_t n_params, pxt_dtype dt, const pxt_plan *p, size_t opt_bytes) {
    size_t param_bytes = n_params * pxt_dtype_size(dt);
    size_t grad_bytes = p->train ? n_params * sizeof(float) : 0;
    /* what the allocator will count: each buffer as a block of a fresh segment
     * (opt_bytes is already in allocator blocks: pxt_adamw_state_bytes) */
    size_t total = pxt_alloc_block_size(param_bytes) + pxt_alloc_block_size(p->arena_bytes) +
                   (p->train ? pxt_alloc_block_size(grad_bytes) : 0) + opt_bytes;
    PyObject *blocks = PyList_New(p->L), *policies = PyList_New(p->L);
    if (!blocks || !policies) {
        Py_XDECREF(blocks);
        Py_XDECREF(policies);
        return NULL;
    }
    for (int l = 0; l < p->L; l++) {
        PyList_SET_ITEM(blocks, l, PyLong_FromSize_t(p->block_saved_bytes[l]));
        PyList_SET_ITEM(policies, l, PyUnicode_FromString(ckpt_name(p->policy[l])));
    }
    return Py_BuildValue(
        "{s:n,s:n,s:n,s:n,s:n,s:n,s:N,s:N,s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:i,s:i,s:i,s:i,"
        "s:n,s:s}",
        "parameters", (Py_ssize_t)param_bytes, "gradients", (Py_ssize_t)grad_bytes,
        "optimizer", (Py_ssize_t)opt_bytes, "inputs", (Py_ssize_t)p->inputs_bytes,
        "residuals", (Py_ssize_t)p->resid_bytes, "final_norms", (Py_ssize_t)p->final_bytes,
        "saved_per_block", blocks, "policies", policies,
        "work", (Py_ssize_t)p->work_bytes, "attention_workspace", (Py_ssize_t)p->attn_ws_bytes,
        "logits", (Py_ssize_t)p->logits_bytes, "gemm_workspace", (Py_ssize_t)p->gemm_ws_bytes,
        "activation_gradients", (Py_ssize_t)p->grad_bytes, "saved", (Py_ssize_t)p->saved_bytes,
        "scratch", (Py_ssize_t)p->scratch_bytes, "arena", (Py_ssize_t)p->arena_bytes,
        "total", (Py_ssize_t)total, "allocator_rounding",
        (Py_ssize_t)(total - param_bytes - grad_bytes - p->arena_bytes - opt_bytes),
        "sequence_length", (Py_ssize_t)p->T, "batch_size", p->B, "logits_rows", p->logits_rows,
        "train", p->train, "n_layers", p->L, "head_casts", (Py_ssize_t)p->head_cast_bytes,
        "precision", dt == PXT_BFLOAT16 ? "bf16" : dt == PXT_FLOAT16 ? "fp16" : "fp32");
}

/* estimate_memory(batch_size, text_len, audio_len, cond_len=None, checkpointing=None,
 *                 train=True, budget=None, optimizer=None) -> dict
 * optimizer: None counts the optimizer state attached to this model (0 without
 * one), True that or else a default AdamW's, False none. */
static PyObject *gpt_estimate(PyObject *op, PyObject *args, PyObject *kwargs) {
    pxt_gpt *m = (pxt_gpt *)op;
    static char *kw[] = {"batch_size", "text_len", "audio_len", "cond_len", "checkpointing",
                         "train", "budget", "optimizer", NULL};
    int B, Lt, La, train = 1;
    PyObject *nc_arg = Py_None, *budget_arg = Py_None, *opt_arg = Py_None;
    const char *ckpt_s = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iii|OzpOO:estimate_memory", kw, &B, &Lt, &La,
                                     &nc_arg, &ckpt_s, &train, &budget_arg, &opt_arg))
        return NULL;
    size_t opt_bytes = m->opt_bytes; /* optimizer=None: what is attached */
    if (opt_arg != Py_None) {
        int want = PyObject_IsTrue(opt_arg);
        if (want < 0)
            return NULL;
        opt_bytes = !want ? 0
                    : m->opt_bytes ? m->opt_bytes
                                   : pxt_adamw_state_bytes(m->layout.numel, m->layout.count, m->dt, 0);
    }
    if (!train)
        opt_bytes = 0;
    int Nc = m->cfg.n_cond;
    if (nc_arg != Py_None && (Nc = (int)PyLong_AsLong(nc_arg)) == -1 && PyErr_Occurred())
        return NULL;
    int ckpt = m->ckpt;
    if (ckpt_s && parse_ckpt(ckpt_s, &ckpt) < 0)
        return NULL;
    size_t budget;
    if (budget_arg == Py_None) {
        /* parameters and gradients are already allocated: the arena gets the rest */
        budget = arena_budget(m);
    } else {
        long long b = PyLong_AsLongLong(budget_arg);
        if (b == -1 && PyErr_Occurred())
            return NULL;
        size_t fixed = m->layout.numel * (pxt_dtype_size(m->dt) + sizeof(float)) + opt_bytes;
        budget = (size_t)(b > 0 ? b : 0) > fixed ? (size_t)b - fixed : 0;
    }
    pxt_plan p;
    int rc = make_plan(m, &p, B, Lt, La, Nc, ckpt, train, budget);
    if (rc != PXT_OK)
        return pxt_raise(rc);
    PyObject *d = plan_dict(m->layout.numel, m->dt, &p, opt_bytes);
    pxt_plan_free(&p);
    return d;
}

/* plan_memory(n_layers, ..., max_attention_sequence_length, batch_size, text_len,
 *             audio_len, cond_len=None, checkpointing="none", train=True, budget=None,
 *             device="cpu") -> dict: a plan without a model (nothing is allocated). */
static PyObject *py_plan_memory(PyObject *mod, PyObject *args, PyObject *kwargs) {
    (void)mod;
    static char *kw[] = {"n_layers", "d_model", "n_heads", "text_vocab_size", "audio_vocab_size",
                         "max_text_tokens", "max_audio_tokens", "n_cond_latents",
                         "layer_norm_eps", "text_loss_weight", "audio_loss_weight",
                         "max_attention_sequence_length", "batch_size", "text_len", "audio_len",
                         "cond_len", "checkpointing", "train", "budget", "device", "optimizer",
                         "precision", NULL};
    pxt_gpt_config c;
    int B, Lt, La, train = 1, optimizer = 0;
    PyObject *nc_arg = Py_None, *budget_arg = Py_None, *dev_arg = Py_None;
    const char *ckpt_s = "none", *prec_s = "fp32";
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iiiiiiiifffiiii|OspOOps:plan_memory", kw,
                                     &c.n_layers, &c.d_model, &c.n_heads, &c.text_vocab,
                                     &c.audio_vocab, &c.max_text, &c.max_audio, &c.n_cond, &c.eps,
                                     &c.text_w, &c.audio_w, &c.max_seq, &B, &Lt, &La, &nc_arg,
                                     &ckpt_s, &train, &budget_arg, &dev_arg, &optimizer, &prec_s))
        return NULL;
    pxt_dtype dt;
    if (parse_precision(prec_s, &dt) < 0)
        return NULL;
    int rc = pxt_gpt_config_check(&c);
    if (rc != PXT_OK)
        return pxt_raise(rc);
    int ckpt, Nc = c.n_cond;
    if (parse_ckpt(ckpt_s, &ckpt) < 0)
        return NULL;
    if (nc_arg != Py_None && (Nc = (int)PyLong_AsLong(nc_arg)) == -1 && PyErr_Occurred())
        return NULL;
    pxt_device dev = {PXT_CPU, 0};
    if (dev_arg != Py_None && pxt_parse_device(dev_arg, &dev, "device", 0) < 0)
        return NULL;
    const pxt_backend *be = pxt_backend_for(dev.type);
    if (!be)
        return PyErr_Format(PyExc_ValueError, "device: this build has no %s backend",
                            dev.type == PXT_CUDA ? "CUDA" : "such");
    pxt_param_layout layout;
    if (pxt_param_layout_init(&layout, &c) != PXT_OK)
        return pxt_raise(PXT_ERR_OOM);
    size_t n_params = layout.numel;
    size_t opt_bytes = optimizer && train
                           ? pxt_adamw_state_bytes(n_params, layout.count, dt, 0) : 0;
    pxt_param_layout_free(&layout);
    size_t fixed = n_params * (pxt_dtype_size(dt) + (train ? sizeof(float) : 0)) + opt_bytes;
    size_t budget = (size_t)-1;
    if (budget_arg != Py_None) {
        long long b = PyLong_AsLongLong(budget_arg);
        if (b == -1 && PyErr_Occurred())
            return NULL;
        budget = (size_t)(b > 0 ? b : 0) > fixed ? (size_t)b - fixed : 0;
    }
    pxt_plan p;
    rc = plan_for(&c, be, dt, &p, B, Lt, La, Nc, ckpt, train, budget);
    if (rc != PXT_OK)
        return pxt_raise(rc);
    PyObject *d = plan_dict(n_params, dt, &p, opt_bytes);
    pxt_plan_free(&p);
    return d;
}

PyMethodDef pxt_model_methods[] = {
    {"plan_memory", (PyCFunction)(void (*)(void))py_plan_memory, METH_VARARGS | METH_KEYWORDS,
     "The memory plan of a step for a config, without building the model."},
    {NULL, NULL, 0, NULL},
};

/* ---- the step --------------------------------------------------------------- */

static int same_plan(const pxt_plan *a, const pxt_plan *b) {
    if (a->B != b->B || a->Lt != b->Lt || a->La != b->La || a->Nc != b->Nc ||
        a->train != b->train || a->L != b->L || !a->policy || !b->policy)
        return 0;
    for (int l = 0; l < a->L; l++)
        if (a->policy[l] != b->policy[l])
            return 0;
    return 1;
}

/* Makes the arena match plan p (takes ownership of p on success). On failure
 * the previous arena is gone (it is a cache) and nothing else has changed. */
static int ensure_arena(pxt_gpt *m, pxt_plan *p) {
    if (m->arena && same_plan(&m->plan, p) && m->plan.arena_bytes == p->arena_bytes) {
        pxt_plan_free(p);
        return 0;
    }
    Py_CLEAR(m->arena);
    pxt_plan_free(&m->plan);
    int64_t n = (int64_t)p->arena_bytes;
    m->arena = (pxt_tensor *)pxt_tensor_empty(m->device, PXT_UINT8, 1, &n);
    if (!m->arena) {
        pxt_plan_free(p);
        return -1;
    }
    m->plan = *p; /* arrays move over */
    memset(p, 0, sizeof *p);
    return 0;
}

typedef struct {
    const int32_t *text_ids, *audio_ids, *text_tgt, *audio_tgt, *text_pos, *audio_pos;
    const uint8_t *key_mask;
    const char *cond;          /* (B, Nc, C) host, model dtype, or NULL */
    const int32_t *text_len, *audio_len; /* (B) host */
    double n_text, n_audio;    /* normalisers of the mean losses */
    double loss_scale;         /* multiplies the loss gradient (1: none) */
} step_inputs;

typedef struct {
    double text_sum, audio_sum;
} step_losses;


/* Copies the batch into the arena's input region. */
static int upload(pxt_gpt *m, const pxt_plan *p, char *base, const step_inputs *in) {
    const pxt_backend *be = m->be;
    int d = m->device.index;
    pxt_copy_kind k = m->device.type == PXT_CPU ? PXT_COPY_D2D : PXT_COPY_H2D;
    size_t bt = (size_t)p->B * p->Lt * 4, ba = (size_t)p->B * p->La * 4;
    PXT_TRY(be->copy(d, base + p->text_ids, in->text_ids, bt, k));
    PXT_TRY(be->copy(d, base + p->audio_ids, in->audio_ids, ba, k));
    PXT_TRY(be->copy(d, base + p->text_tgt, in->text_tgt, bt, k));
    PXT_TRY(be->copy(d, base + p->audio_tgt, in->audio_tgt, ba, k));
    PXT_TRY(be->copy(d, base + p->text_pos, in->text_pos, bt, k));
    PXT_TRY(be->copy(d, base + p->audio_pos, in->audio_pos, ba, k));
    PXT_TRY(be->copy(d, base + p->key_mask, in->key_mask, (size_t)p->N, k));
    return be->memset_zero(d, base + p->losses, (size_t)p->B * (p->Lt + p->La) * sizeof(float));
}

/* x0 (N, C) = [cond | text emb + text pos | audio emb + audio pos] per sample. */
static int embed(pxt_gpt *m, const pxt_plan *p, char *base, const step_inputs *in, char *x0) {
    const pxt_backend *be = m->be;
    int d = m->device.index, C = p->C, T = p->T;
    size_t es = pxt_dtype_size(m->dt), row = (size_t)C * es;
    pxt_copy_kind k = m->device.type == PXT_CPU ? PXT_COPY_D2D : PXT_COPY_H2D;
    for (int b = 0; b < p->B; b++) {
        char *xb = x0 + (size_t)b * T * row;
        if (p->Nc)
            PXT_TRY(be->copy(d, xb, in->cond + (size_t)b * p->Nc * row, (size_t)p->Nc * row, k));
        char *xt = xb + (size_t)p->Nc * row, *xa = xt + (size_t)p->Lt * row;
        const int32_t *ti = (const int32_t *)(base + p->text_ids) + (size_t)b * p->Lt;
        const int32_t *tp = (const int32_t *)(base + p->text_pos) + (size_t)b * p->Lt;
        const int32_t *ai = (const int32_t *)(base + p->audio_ids) + (size_t)b * p->La;
        const int32_t *ap = (const int32_t *)(base + p->audio_pos) + (size_t)b * p->La;
        PXT_TRY(be->embedding_forward(d, xt, ti, param_ptr(m, m->layout.text_emb), p->Lt, C, 0, m->dt));
        PXT_TRY(be->embedding_forward(d, xt, tp, param_ptr(m, m->layout.text_pos), p->Lt, C, 1, m->dt));
        PXT_TRY(be->embedding_forward(d, xa, ai, param_ptr(m, m->layout.mel_emb), p->La, C, 0, m->dt));
        PXT_TRY(be->embedding_forward(d, xa, ap, param_ptr(m, m->layout.mel_pos), p->La, C, 1, m->dt));
    }
    return PXT_OK;
}

static int embed_backward(pxt_gpt *m, const pxt_plan *p, char *base, const char *dx0) {
    const pxt_backend *be = m->be;
    int d = m->device.index, C = p->C, T = p->T;
    size_t row = (size_t)C * pxt_dtype_size(m->dt);
    for (int b = 0; b < p->B; b++) {
        const char *dt_ = dx0 + ((size_t)b * T + p->Nc) * row, *da = dt_ + (size_t)p->Lt * row;
        const int32_t *ti = (const int32_t *)(base + p->text_ids) + (size_t)b * p->Lt;
        const int32_t *tp = (const int32_t *)(base + p->text_pos) + (size_t)b * p->Lt;
        const int32_t *ai = (const int32_t *)(base + p->audio_ids) + (size_t)b * p->La;
        const int32_t *ap = (const int32_t *)(base + p->audio_pos) + (size_t)b * p->La;
        PXT_TRY(be->embedding_backward(d, grad_ptr(m, m->layout.text_emb), dt_, ti, p->Lt, C, m->dt));
        PXT_TRY(be->embedding_backward(d, grad_ptr(m, m->layout.text_pos), dt_, tp, p->Lt, C, m->dt));
        PXT_TRY(be->embedding_backward(d, grad_ptr(m, m->layout.mel_emb), da, ai, p->La, C, m->dt));
        PXT_TRY(be->embedding_backward(d, grad_ptr(m, m->layout.mel_pos), da, ap, p->La, C, m->dt));
    }
    return PXT_OK;
}

/* One head over one sample's segment of valid rows, chunk by chunk: logits,
 * cross-entropy and (train) dh2 rows, dW, db, without the full logits. */
static int head_segment(pxt_gpt *m, const pxt_plan *p, char *base, const pxt_ctx *x, int head_w,
                        int head_b, const float *bias32, int V, size_t row0, int rows,
                        const int32_t *tgt, float *losses, float scale) {
    const pxt_backend *be = m->be;
    int d = m->device.index, C = p->C;
    size_t es = pxt_dtype_size(m->dt);
    float *logits = (float *)(base + p->logits);
    int wide = m->dt == PXT_FLOAT32;
    /* the gemms' A and B share one dtype: a 16-bit model feeds them a dt copy of
     * dlogits (the fp32 logits chunk stays for the bias gradient) */
    void *dlog = wide ? (void *)logits : (void *)(base + p->dlogits16);
    for (int r = 0; r < rows; r += p->logits_rows) {
        int n = rows - r < p->logits_rows ? rows - r : p->logits_rows;
        const char *h = base + p->h2 + (row0 + (size_t)r) * C * es;
        PXT_TRY(be->gemm(d, 0, 1, n, V, C, 1.0f, h, param_ptr(m, head_w), 0.0f, logits, m->dt,
                     PXT_FLOAT32, x->gemm_ws));
        PXT_TRY(be->add_bias(d, logits, wide ? (const void *)param_ptr(m, head_b) : bias32, n, V,
                             PXT_FLOAT32));
        PXT_TRY(be->softmax_xent(d, logits, losses + r, tgt + r, n, V, scale, p->train));
        if (!p->train)
            continue;
        char *dh = base + p->dB + (row0 + (size_t)r) * C * es;
        if (!wide)
            PXT_TRY(be->cast(d, dlog, m->dt, logits, PXT_FLOAT32, (size_t)n * V));
        PXT_TRY(be->gemm(d, 0, 0, n, C, V, 1.0f, dlog, param_ptr(m, head_w), 0.0f, dh, m->dt,
                     m->dt, x->gemm_ws));
        PXT_TRY(be->gemm(d, 1, 0, V, C, n, 1.0f, dlog, h, 1.0f, grad_ptr(m, head_w), m->dt,
                     PXT_FLOAT32, x->gemm_ws));
        PXT_TRY(be->bias_backward(d, grad_ptr(m, head_b), logits, n, V, PXT_FLOAT32));
    }
    return PXT_OK;
}

static int run_step(pxt_gpt *m, const step_inputs *in, step_losses *out) {
    const pxt_plan *p = &m->plan;
    const pxt_backend *be = m->be;
    int d = m->device.index, L = p->L, N = p->N, C = p->C;
    size_t es = pxt_dtype_size(m->dt), NC = (size_t)N * C;
    char *base = m->arena->data;
    pxt_ctx x = {
        .be = be, .dev = d, .dt = m->dt, .B = p->B, .T = p->T, .C = C, .H = p->H,
        .eps = m->cfg.eps, .key_mask = (const uint8_t *)(base + p->key_mask),
        .attn_ws = base + p->attn_ws, .gemm_ws = base + p->gemm_ws,
    };
    PXT_TRY(upload(m, p, base, in));
    /* forward: block l reads resid[l], writes resid[l + 1] (evaluation ping-pongs two) */
    char *resid = base + p->resid;
    PXT_TRY(embed(m, p, base, in, resid));
    pxt_block_acts work = block_acts(base, p, -1);
    for (int l = 0; l < L; l++) {
        pxt_block_params bp;
        pxt_block_grads bg;
        block_views(m, l, &bp, &bg);
        pxt_block_acts a = block_acts(base, p, l);
        size_t in_slot = p->train ? (size_t)l : (size_t)(l % 2);
        size_t out_slot = p->train ? (size_t)l + 1 : (size_t)((l + 1) % 2);
        PXT_TRY(pxt_block_forward(&x, &bp, &a, resid + in_slot * NC * es, resid + out_slot * NC * es));
    }
    char *top = resid + (p->train ? (size_t)L : (size_t)(L % 2)) * NC * es;
    PXT_TRY(be->layernorm_forward(d, base + p->hf, (float *)(base + p->hf_mean),
                              (float *)(base + p->hf_rstd), top, param_ptr(m, m->layout.ln_f_w),
                              param_ptr(m, m->layout.ln_f_b), N, C, m->cfg.eps, m->dt));
    PXT_TRY(be->layernorm_forward(d, base + p->h2, (float *)(base + p->h2_mean),
                              (float *)(base + p->h2_rstd), base + p->hf,
                              param_ptr(m, m->layout.fnorm_w), param_ptr(m, m->layout.fnorm_b), N,
                              C, m->cfg.eps, m->dt));
    /* heads on each sample's valid rows only; padding rows keep loss 0 and dh2 0 */
    if (p->train)
        PXT_TRY(be->memset_zero(d, base + p->dB, NC * es));
    float *tl = (float *)(base + p->losses), *al = tl + (size_t)p->B * p->Lt;
    /* loss_scale (fp16 training) scales only the gradient; the losses stay unscaled */
    float ts = in->n_text > 0 ? (float)(m->cfg.text_w * in->loss_scale / in->n_text) : 0.0f;
    float as = in->n_audio > 0 ? (float)(m->cfg.audio_w * in->loss_scale / in->n_audio) : 0.0f;
    float *tb32 = NULL, *ab32 = NULL;
    if (m->dt != PXT_FLOAT32) { /* add_bias takes out and bias of one dtype: fp32 biases */
        tb32 = (float *)(base + p->head_bias32);
        ab32 = tb32 + p->text_vocab;
        PXT_TRY(be->cast(d, tb32, PXT_FLOAT32, param_ptr(m, m->layout.text_head_b), m->dt,
                         (size_t)p->text_vocab));
        PXT_TRY(be->cast(d, ab32, PXT_FLOAT32, param_ptr(m, m->layout.mel_head_b), m->dt,
                         (size_t)p->audio_vocab));
    }
    for (int b = 0; b < p->B; b++) {
        size_t row = (size_t)b * p->T + p->Nc;
        PXT_TRY(head_segment(m, p, base, &x, m->layout.text_head_w, m->layout.text_head_b, tb32,
                         p->text_vocab, row, in->text_len[b],
                         (const int32_t *)(base + p->text_tgt) + (size_t)b * p->Lt,
                         tl + (size_t)b * p->Lt, ts));
        PXT_TRY(head_segment(m, p, base, &x, m->layout.mel_head_w, m->layout.mel_head_b, ab32,
                         p->audio_vocab, row + p->Lt, in->audio_len[b],
                         (const int32_t *)(base + p->audio_tgt) + (size_t)b * p->La,
                         al + (size_t)b * p->La, as));
    }
    PXT_TRY(be->sum(d, &out->text_sum, tl, (size_t)p->B * p->Lt));
    PXT_TRY(be->sum(d, &out->audio_sum, al, (size_t)p->B * p->La));
    if (!p->train)
        return PXT_OK;
    /* backward: final_norm, ln_f, then the blocks top-down; dres carries dx */
    char *dres = base + p->dres, *dA = base + p->dA, *dB = base + p->dB;
    PXT_TRY(be->memset_zero(d, dA, NC * es));
    PXT_TRY(be->layernorm_backward(d, dA, grad_ptr(m, m->layout.fnorm_w),
                               grad_ptr(m, m->layout.fnorm_b), dB, base + p->hf,
                               param_ptr(m, m->layout.fnorm_w), (float *)(base + p->h2_mean),
                               (float *)(base + p->h2_rstd), N, C, m->dt));
    PXT_TRY(be->memset_zero(d, dres, NC * es));
    PXT_TRY(be->layernorm_backward(d, dres, grad_ptr(m, m->layout.ln_f_w),
                               grad_ptr(m, m->layout.ln_f_b), dA, top,
                               param_ptr(m, m->layout.ln_f_w), (float *)(base + p->hf_mean),
                               (float *)(base + p->hf_rstd), N, C, m->dt));
    for (int l = L - 1; l >= 0; l--) {
        pxt_block_params bp;
        pxt_block_grads bg;
        block_views(m, l, &bp, &bg);
        pxt_block_acts saved = block_acts(base, p, l);
        PXT_TRY(pxt_block_backward(&x, &bp, &bg, &saved, &work, p->policy[l],
                               resid + (size_t)l * NC * es, dres, dA, dB));
    }
    return embed_backward(m, p, base, dres);
}

/* Borrowed data pointer of a C-contiguous array of dtype and size, else -1. */
static const void *arr_data(PyObject *obj, const char *name, int npy_type, npy_intp count) {
    if (!PyArray_Check(obj) || PyArray_TYPE((PyArrayObject *)obj) != npy_type ||
        !PyArray_IS_C_CONTIGUOUS((PyArrayObject *)obj) ||
        PyArray_SIZE((PyArrayObject *)obj) != count) {
        PyErr_Format(PyExc_TypeError, "_step: %s must be a C-contiguous array of %zd elements "
                     "of NumPy type %d", name, (Py_ssize_t)count, npy_type);
        return NULL;
    }
    return PyArray_DATA((PyArrayObject *)obj);
}

/* Borrowed data of cond: C-contiguous, count elements, of the model's dtype. */
static const void *cond_data(PyObject *obj, pxt_dtype dt, npy_intp count) {
    PyObject *descr = pxt_dtype_to_descr(dt);
    if (!descr)
        return NULL;
    int ok = PyArray_Check(obj) && PyArray_EquivTypes(PyArray_DESCR((PyArrayObject *)obj),
                                                      (PyArray_Descr *)descr) &&
             PyArray_IS_C_CONTIGUOUS((PyArrayObject *)obj) &&
             PyArray_SIZE((PyArrayObject *)obj) == count;
    Py_DECREF(descr);
    if (!ok) {
        PyErr_Format(PyExc_TypeError, "_step: cond must be a C-contiguous array of %zd elements "
                     "of the model's dtype (%s)", (Py_ssize_t)count, pxt_dtype_name(dt));
        return NULL;
    }
    return PyArray_DATA((PyArrayObject *)obj);
}

/* _step(text_ids, audio_ids, text_tgt, audio_tgt, text_pos, audio_pos, key_mask,
 *       text_len, audio_len, cond, n_text, n_audio, train, loss_scale=1.0)
 *       -> (text_sum, audio_sum)
 * Arrays come validated from pyxtts.XTTSGPT (int32, uint8 mask, cond in the
 * model's dtype). Losses are sums of -log p over valid targets. */
static PyObject *gpt_step(PyObject *op, PyObject *args) {
    pxt_gpt *m = (pxt_gpt *)op;
    PyObject *a[10];
    double n_text, n_audio, loss_scale = 1.0;
    int train;
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOddp|d:_step", &a[0], &a[1], &a[2], &a[3], &a[4], &a[5],
                          &a[6], &a[7], &a[8], &a[9], &n_text, &n_audio, &train, &loss_scale))
        return NULL;
    if (!(loss_scale > 0.0) || !isfinite(loss_scale))
        return PyErr_Format(PyExc_ValueError, "loss_scale: must be a finite number > 0, got %g",
                            loss_scale);
    if (m->busy)
        return PyErr_Format(PyExc_RuntimeError, "this model is already running a step (in "
                            "another thread); steps of one model must not overlap");
    for (int i = 0; i < 7; i++)
        if (!PyArray_Check(a[i]) || PyArray_NDIM((PyArrayObject *)a[i]) != 2)
            return PyErr_Format(PyExc_TypeError, "_step: argument %d must be a 2-d array", i);
    npy_intp B = PyArray_DIM((PyArrayObject *)a[0], 0), Lt = PyArray_DIM((PyArrayObject *)a[0], 1);
    npy_intp La = PyArray_DIM((PyArrayObject *)a[1], 1);
    npy_intp Nc = a[9] == Py_None ? 0 : PyArray_Check(a[9]) && PyArray_NDIM((PyArrayObject *)a[9]) == 3
                                              ? PyArray_DIM((PyArrayObject *)a[9], 1) : -1;
    if (Nc < 0)
        return PyErr_Format(PyExc_TypeError, "_step: cond must be None or a 3-d array");
    npy_intp T = Nc + Lt + La;
    step_inputs in = {0};
    if (!(in.text_ids = arr_data(a[0], "text_ids", NPY_INT32, B * Lt)) ||
        !(in.audio_ids = arr_data(a[1], "audio_ids", NPY_INT32, B * La)) ||
        !(in.text_tgt = arr_data(a[2], "text_tgt", NPY_INT32, B * Lt)) ||
        !(in.audio_tgt = arr_data(a[3], "audio_tgt", NPY_INT32, B * La)) ||
        !(in.text_pos = arr_data(a[4], "text_pos", NPY_INT32, B * Lt)) ||
        !(in.audio_pos = arr_data(a[5], "audio_pos", NPY_INT32, B * La)) ||
        !(in.key_mask = arr_data(a[6], "key_mask", NPY_UINT8, B * T)) ||
        !(in.text_len = arr_data(a[7], "text_len", NPY_INT32, B)) ||
        !(in.audio_len = arr_data(a[8], "audio_len", NPY_INT32, B)) ||
        (Nc && !(in.cond = cond_data(a[9], m->dt, B * Nc * m->cfg.d_model))))
        return NULL;
    /* the kernels trust ids and lengths: the last line of defence is here */
    for (npy_intp b = 0; b < B; b++)
        if (in.text_len[b] < 0 || in.text_len[b] > Lt || in.audio_len[b] < 0 || in.audio_len[b] > La)
            return PyErr_Format(PyExc_ValueError, "_step: lengths of sample %zd out of range",
                                (Py_ssize_t)b);
    for (npy_intp i = 0; i < B * Lt; i++)
        if (in.text_ids[i] < 0 || in.text_ids[i] >= m->cfg.text_vocab || in.text_tgt[i] < -1 ||
            in.text_tgt[i] >= m->cfg.text_vocab || in.text_pos[i] < 0 ||
            in.text_pos[i] >= m->cfg.max_text)
            return PyErr_Format(PyExc_ValueError, "_step: text id, target or position out of range");
    for (npy_intp i = 0; i < B * La; i++)
        if (in.audio_ids[i] < 0 || in.audio_ids[i] >= m->cfg.audio_vocab || in.audio_tgt[i] < -1 ||
            in.audio_tgt[i] >= m->cfg.audio_vocab || in.audio_pos[i] < 0 ||
            in.audio_pos[i] >= m->cfg.max_audio)
            return PyErr_Format(PyExc_ValueError, "_step: audio id, target or position out of range");
    in.n_text = n_text;
    in.n_audio = n_audio;
    in.loss_scale = loss_scale;
    pxt_plan p;
    int rc = make_plan(m, &p, (int)B, (int)Lt, (int)La, (int)Nc, m->ckpt, train, arena_budget(m));
    if (rc != PXT_OK)
        return pxt_raise(rc);
    if (ensure_arena(m, &p) < 0)
        return NULL;
    step_losses out = {0};
    m->busy = 1;
    Py_BEGIN_ALLOW_THREADS rc = run_step(m, &in, &out);
    Py_END_ALLOW_THREADS
    m->busy = 0;
    if (rc != PXT_OK)
        return pxt_raise(rc);
    return Py_BuildValue("(dd)", out.text_sum, out.audio_sum);
}

static PyObject *gpt_release_arena(PyObject *op, PyObject *unused) {
    (void)unused;
    pxt_gpt *m = (pxt_gpt *)op;
    if (m->busy)
        return PyErr_Format(PyExc_RuntimeError, "release_arena: a step of this model is running "
                            "(in another thread); its arena cannot be freed now");
    size_t n = m->arena ? m->arena->nbytes : 0;
    Py_CLEAR(m->arena);
    pxt_plan_free(&m->plan);
    return PyLong_FromSize_t(n);
}

/* ---- the optimizer's access (pyxtts._C.AdamW, csrc/optim.c) -------------------- */

int pxt_gpt_view_of(PyObject *obj, pxt_gpt_view *out) {
    if (!PyObject_TypeCheck(obj, &gpt_type) || !((pxt_gpt *)obj)->params)
        return -1;
    pxt_gpt *m = (pxt_gpt *)obj;
    *out = (pxt_gpt_view){.params = m->params, .grads = m->grads, .layout = &m->layout,
                          .device = m->device, .be = m->be, .dt = m->dt, .busy = &m->busy};
    return 0;
}

void pxt_gpt_add_optimizer_bytes(PyObject *obj, Py_ssize_t delta) {
    pxt_gpt *m = (pxt_gpt *)obj;
    m->opt_bytes = (size_t)((Py_ssize_t)m->opt_bytes + delta);
}

/* ---- attributes ----------------------------------------------------------- */

static PyObject *gpt_get_device(PyObject *op, void *c) {
    (void)c;
    return pxt_device_pystr(((pxt_gpt *)op)->device);
}

static PyObject *gpt_get_dtype(PyObject *op, void *c) {
    (void)c;
    return Py_NewRef(pxt_dtype_object(((pxt_gpt *)op)->dt));
}

static PyObject *gpt_get_ckpt(PyObject *op, void *c) {
    (void)c;
    return PyUnicode_FromString(ckpt_name(((pxt_gpt *)op)->ckpt));
}

static int gpt_set_ckpt(PyObject *op, PyObject *v, void *c) {
    (void)c;
    if (!v || !PyUnicode_Check(v)) {
        PyErr_SetString(PyExc_TypeError, "checkpointing: expected a string");
        return -1;
    }
    return parse_ckpt(PyUnicode_AsUTF8(v), &((pxt_gpt *)op)->ckpt);
}

static PyObject *gpt_get_num_parameters(PyObject *op, void *c) {
    (void)c;
    pxt_gpt *m = (pxt_gpt *)op;
    size_t n = 0;
    for (int i = 0; i < m->layout.count; i++) n += m->layout.params[i].numel;
    return PyLong_FromSize_t(n);
}

static PyObject *gpt_get_arena_bytes(PyObject *op, void *c) {
    (void)c;
    pxt_gpt *m = (pxt_gpt *)op;
    return PyLong_FromSize_t(m->arena ? m->arena->nbytes : 0);
}

static PyGetSetDef gpt_getset[] = {
    {"device", gpt_get_device, NULL, "'cpu' or 'cuda:N'", NULL},
    {"dtype", gpt_get_dtype, NULL, "dtype of parameters and activations", NULL},
    {"checkpointing", gpt_get_ckpt, gpt_set_ckpt, "'none', 'selective', 'full' or 'auto'", NULL},
    {"num_parameters", gpt_get_num_parameters, NULL, "number of parameters", NULL},
    {"arena_bytes", gpt_get_arena_bytes, NULL, "bytes of the cached step arena", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef gpt_methods[] = {
    {"parameters", gpt_parameters, METH_NOARGS, "name -> Tensor view of the flat parameters"},
    {"gradients", gpt_gradients, METH_NOARGS, "name -> Tensor view of the flat fp32 gradients"},
    {"zero_grad", gpt_zero_grad, METH_NOARGS, "set every gradient to 0"},
    {"estimate_memory", (PyCFunction)(void (*)(void))gpt_estimate, METH_VARARGS | METH_KEYWORDS,
     "the memory plan of a step, by component (bytes)"},
    {"_step", gpt_step, METH_VARARGS, "run a validated step (see pyxtts.XTTSGPT)"},
    {"release_arena", gpt_release_arena, METH_NOARGS, "free the cached step arena; bytes freed"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject gpt_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "pyxtts._C.GPT",
    .tp_basicsize = sizeof(pxt_gpt),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "Native core of pyxtts.XTTSGPT.",
    .tp_new = PyType_GenericNew,
    .tp_init = gpt_init,
    .tp_dealloc = gpt_dealloc,
    .tp_methods = gpt_methods,
    .tp_getset = gpt_getset,
};

int pxt_gpt_init_type(PyObject *module) {
    return PyModule_AddType(module, &gpt_type); /* readies it; the name after the last dot */
}
