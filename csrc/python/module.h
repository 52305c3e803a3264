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

/* gpt.c: pyxtts._C.GPT */
int pxt_py_gpt_init_type(PyObject *module);
/* The flat state of an initialised pyxtts._C.GPT (borrowed: obj keeps it),
 * else NULL (no exception set). */
pxt_flat *pxt_py_gpt_flat(PyObject *obj);
/* Marks f (and its parameter and gradient buffers, whose Tensor views then refuse
 * copy_) as used by a step running without the GIL, or no longer. */
static inline void pxt_py_flat_busy(pxt_flat *f, int busy) {
    f->busy = f->params->busy = f->grads->busy = busy;
}
/* adamw.c: pyxtts._C.AdamW */
int pxt_py_adamw_init_type(PyObject *module);
/* block.c: pyxtts.Block */
int pxt_py_block_init_type(PyObject *module);

/* A method-table entry of a function taking (args, kwargs). */
#define PXT_PY_KW(f) (PyCFunction)(void (*)(void))(f), METH_VARARGS | METH_KEYWORDS

#endif /* PXT_PY_MODULE_H */
