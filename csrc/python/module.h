/* module.h: what the binding files define for module.c to gather (method
 * tables, type initialisers), and what one binding needs of another. Errors
 * (errors.h) and argument conversion (convert.h) come with it. */
#ifndef PXT_PY_MODULE_H
#define PXT_PY_MODULE_H

#include "convert.h"
#include "engine/flat.h"

/* device.c */
PyObject *pxt_py_cuda_available(PyObject *m, PyObject *unused);
PyObject *pxt_py_device_count(PyObject *m, PyObject *args, PyObject *kwargs);
PyObject *pxt_py_device_info(PyObject *m, PyObject *args, PyObject *kwargs);
PyObject *pxt_py_synchronize(PyObject *m, PyObject *args, PyObject *kwargs);

/* memory.c */
PyObject *pxt_py_memory_stats(PyObject *m, PyObject *args, PyObject *kwargs);
PyObject *pxt_py_memory_allocated(PyObject *m, PyObject *args, PyObject *kwargs);
PyObject *pxt_py_memory_reserved(PyObject *m, PyObject *args, PyObject *kwargs);
PyObject *pxt_py_max_memory_allocated(PyObject *m, PyObject *args, PyObject *kwargs);
PyObject *pxt_py_max_memory_reserved(PyObject *m, PyObject *args, PyObject *kwargs);
PyObject *pxt_py_reset_peak_memory_stats(PyObject *m, PyObject *args, PyObject *kwargs);
PyObject *pxt_py_empty_cache(PyObject *m, PyObject *args, PyObject *kwargs);
PyObject *pxt_py_set_memory_limit(PyObject *m, PyObject *args, PyObject *kwargs);
PyObject *pxt_py_set_memory_fraction(PyObject *m, PyObject *args, PyObject *kwargs);
PyObject *pxt_py_inject_oom(PyObject *m, PyObject *args, PyObject *kwargs);

/* bench.c */
PyObject *pxt_py_bench_alloc(PyObject *m, PyObject *args, PyObject *kwargs);

/* Method tables of the files that add Python functions (NULL-terminated). */
extern PyMethodDef pxt_py_ops_methods[];       /* ops.c: _op_* kernel bindings for tests */
extern PyMethodDef pxt_py_ops_cond_methods[];  /* ops_cond.c: the conditioning path's, dropout */
extern PyMethodDef pxt_py_attention_methods[]; /* attention.c: attention_forward/backward */
extern PyMethodDef pxt_py_gpt_methods[];       /* gpt.c: plan_memory, check_model_config */

/* gpt.c: pyxtts._C.GPT (its `_flat` is the handle of its flat state) */
int pxt_py_gpt_init_type(PyObject *module);

/* flat_handle.c: the handle of a model's flat state. A model type exposes it as
 * `_flat`; an optimizer keeps it, and with it the model, for its lifetime. */
PyObject *pxt_py_flat_handle(PyObject *owner, pxt_flat *f);
/* obj._flat, or obj._core._flat (a Python model over a native one): the handle (new
 * reference) and *out its flat state, else NULL with no exception set. */
PyObject *pxt_py_flat_handle_of(PyObject *obj, pxt_flat **out);
/* adamw.c: pyxtts._C.AdamW */
int pxt_py_adamw_init_type(PyObject *module);
/* block.c: pyxtts.Block */
int pxt_py_block_init_type(PyObject *module);

/* A method-table entry of a function taking (args, kwargs). */
#define PXT_PY_KW(f) (PyCFunction)(void (*)(void))(f), METH_VARARGS | METH_KEYWORDS

#endif /* PXT_PY_MODULE_H */
