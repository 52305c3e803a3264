/* convert.h: the argument converters of every entry point, in NumPy's O& style
 * (numpy/_core/src/multiarray/conversion_utils.c).
 *
 * A converter is `int pxt_py_<kind>_converter(PyObject *obj, void *arg)`: it
 * fills *arg and returns 1, or sets a TypeError/ValueError and returns 0, so it
 * serves PyArg_ParseTupleAndKeywords' "O&" and direct calls alike. Its target
 * is a small struct whose header names the argument, so every message reads
 * "name: expected <what>, got <what came>", integers out of range included
 * (never a bare OverflowError), strings with NUL or lone surrogates included
 * (never a UnicodeEncodeError):
 *
 *     pxt_py_int heads = PXT_PY_INT("n_heads", 1, INT_MAX);
 *     pxt_py_device dev = PXT_PY_DEVICE_OPT("device", 1);
 *     if (!PyArg_ParseTupleAndKeywords(args, kw, "O&|O&", names, pxt_py_int_converter,
 *                                      &heads, pxt_py_device_converter, &dev)) ...
 *
 * An optional argument accepts None and keeps the default its struct was made
 * with; `given` tells whether a value came. Tensor arguments (new references)
 * and the checks of tensors that came are below, with the same messages. */
#ifndef PXT_PY_CONVERT_H
#define PXT_PY_CONVERT_H

#include "tensor.h"

typedef struct {
    const char *name; /* as the caller spells it */
    int optional;     /* None accepted: the value keeps its default */
    int given;        /* set by the converter: a value (not None) came */
} pxt_py_arg;

/* ---- numbers ------------------------------------------------------------------ */

/* An integer (int or __index__, not bool) in [lo, hi]. */
typedef struct {
    pxt_py_arg a;
    long long lo, hi, value;
} pxt_py_int;
#define PXT_PY_INT(name, lo, hi) {{(name), 0, 0}, (lo), (hi), 0}
#define PXT_PY_INT_OPT(name, lo, hi, dflt) {{(name), 1, 0}, (lo), (hi), (dflt)}
int pxt_py_int_converter(PyObject *obj, void *arg);

/* A bool (True or False; NumPy's bool too), not an int. */
typedef struct {
    pxt_py_arg a;
    int value;
} pxt_py_bool;
#define PXT_PY_BOOL(name) {{(name), 0, 0}, 0}
#define PXT_PY_BOOL_DFLT(name, dflt) {{(name), 0, 0}, (dflt)}
int pxt_py_bool_converter(PyObject *obj, void *arg);

/* An integer in [0, 2**64) (seeds). */
typedef struct {
    pxt_py_arg a;
    unsigned long long value;
} pxt_py_u64;
#define PXT_PY_U64(name) {{(name), 0, 0}, 0}
#define PXT_PY_U64_OPT(name, dflt) {{(name), 1, 0}, (dflt)}
int pxt_py_u64_converter(PyObject *obj, void *arg);

/* A byte count: an integer >= 0, one past 2**63 meaning "no limit"
 * (SIZE_MAX), or with optional None. */
typedef struct {
    pxt_py_arg a;
    size_t value;
} pxt_py_bytes;
#define PXT_PY_BYTES_OPT(name, dflt) {{(name), 1, 0}, (dflt)}
int pxt_py_bytes_converter(PyObject *obj, void *arg);

/* A real number (int or float, not bool or str), finite, in the range
 * lo < v (lo_open) or lo <= v, and v < hi (hi_open) or v <= hi; `rule` says
 * so in words ("a finite number >= 0"). f32: also finite once rounded to float. */
typedef struct {
    pxt_py_arg a;
    double lo, hi;
    int lo_open, hi_open, f32;
    const char *rule;
    double value;
} pxt_py_real;
#define PXT_PY_REAL(name, lo, lo_open, hi, hi_open, rule)                                          \
    {{(name), 0, 0}, (lo), (hi), (lo_open), (hi_open), 0, (rule), 0.0}
#define PXT_PY_REAL_OPT(name, lo, lo_open, hi, hi_open, rule, dflt)                                \
    {{(name), 1, 0}, (lo), (hi), (lo_open), (hi_open), 0, (rule), (dflt)}
/* Any real number, inf and NaN included (the caller's checks come after). */
#define PXT_PY_NUMBER(name, dflt) {{(name), 0, 0}, 0.0, 0.0, 0, 0, 0, NULL, (dflt)}
int pxt_py_real_converter(PyObject *obj, void *arg);

/* ---- strings ------------------------------------------------------------------ */

/* A str without NUL, encodable as UTF-8 (no lone surrogates); value borrows
 * the object's UTF-8 (valid while the argument is). */
typedef struct {
    pxt_py_arg a;
    const char *value;
} pxt_py_str;
#define PXT_PY_STR_OPT(name, dflt) {{(name), 1, 0}, (dflt)}
int pxt_py_str_converter(PyObject *obj, void *arg);

/* One of the NULL-terminated `choices`: index is its position. */
typedef struct {
    pxt_py_arg a;
    const char *const *choices;
    int index;
} pxt_py_choice;
#define PXT_PY_CHOICE(name, choices) {{(name), 0, 0}, (choices), 0}
#define PXT_PY_CHOICE_OPT(name, choices, dflt) {{(name), 1, 0}, (choices), (dflt)}
int pxt_py_choice_converter(PyObject *obj, void *arg);

/* The choice lists of the engine's enums, in enum order. */
extern const char *const pxt_py_ckpt_names[];       /* none, selective, full, auto (pxt_ckpt) */
extern const char *const pxt_py_block_ckpt_names[]; /* none, selective, full */
extern const char *const pxt_py_precision_names[];  /* fp32, bf16, fp16 */
/* The dtype of precision choice i. */
pxt_dtype pxt_py_precision_dtype(int i);
const char *pxt_py_precision_name(pxt_dtype dt);

/* ---- devices and dtypes ---------------------------------------------------------- */

/* "cpu", "cuda", "cuda:N", an int N (cuda:N) or a torch.device; must_exist: the
 * device is there too (its allocator can be made). */
typedef struct {
    pxt_py_arg a;
    int must_exist;
    pxt_device value;
} pxt_py_device;
#define PXT_PY_DEVICE_OPT(name, must_exist) {{(name), 1, 0}, (must_exist), {PXT_CPU, 0}}
int pxt_py_device_converter(PyObject *obj, void *arg);
/* 0 when dev is there (its allocator can be made), else -1 with ValueError
 * "name: <why not>" (no such device, or no CUDA backend in this build). */
int pxt_py_check_device_exists(pxt_device dev, const char *name);
/* The device functions' default: cuda:0 when a GPU is present, else cpu. */
pxt_device pxt_py_default_device(void);
/* "cpu" or "cuda:N" (new reference). */
PyObject *pxt_py_device_str(pxt_device d);

/* A pyxtts dtype, a name ("bf16", "torch.float16"), a torch or NumPy dtype. */
typedef struct {
    pxt_py_arg a;
    pxt_dtype value;
} pxt_py_dtype;
#define PXT_PY_DTYPE_OPT(name, dflt) {{(name), 1, 0}, (dflt)}
int pxt_py_dtype_converter(PyObject *obj, void *arg);

/* An int or a sequence of at most PXT_MAX_DIMS ints (sizes are checked by
 * whatever is made of the shape). */
typedef struct {
    pxt_py_arg a;
    int ndim;
    int64_t shape[PXT_MAX_DIMS];
} pxt_py_shape;
#define PXT_PY_SHAPE(name) {{(name), 0, 0}, 0, {0}}
int pxt_py_shape_converter(PyObject *obj, void *arg);

/* ---- tensors ---------------------------------------------------------------------- */

/* A Tensor argument, or anything NumPy can view (copied to a CPU tensor, or to
 * like's device when like is given). New reference, or NULL with TypeError. */
PyObject *pxt_py_tensor_arg(PyObject *obj, const char *name, const pxt_tensor *like);
/* Checks of a tensor that came: 0, or -1 with ValueError/TypeError naming it. */
int pxt_py_check_dtype(const pxt_tensor *t, const char *name, pxt_dtype want);
int pxt_py_check_float(const pxt_tensor *t, const char *name); /* float32, float16, bfloat16 */
/* "name: expected shape (B, *, C), got (...)"; a negative size in want accepts
 * any size there. Works on raw shapes, so NumPy arrays are checked alike. */
int pxt_py_check_dims(const char *name, int ndim, const int64_t *shape, int want_ndim,
                      const int64_t *want);
int pxt_py_check_shape(const pxt_tensor *t, const char *name, int ndim, const int64_t *dims);
int pxt_py_check_device(const pxt_tensor *t, const char *name, pxt_device want);
int pxt_py_check_writable(const pxt_tensor *t, const char *name);

/* The device's backend when it has `op` (a table entry), else NotImplementedError. */
const pxt_backend *pxt_py_backend_with(pxt_device dev, const void *op, const char *op_name);
#define PXT_BACKEND_OP(dev, field)                                                                 \
    pxt_py_backend_with(                                                                           \
        (dev),                                                                                     \
        pxt_backend_for((dev).type) ? (const void *)pxt_backend_for((dev).type)->field : NULL,     \
        #field)

#endif /* PXT_PY_CONVERT_H */
