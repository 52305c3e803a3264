/* module.h: Python-callable functions defined across files, gathered by module.c. */
#ifndef PXT_MODULE_H
#define PXT_MODULE_H

#include "tensor.h"
#include "engine/layout.h"

extern PyObject *pxt_OutOfMemoryError;

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

/* pyargs.c: argument checks (ValueError/TypeError naming the argument, -1) */
PyObject *pxt_arg_tensor(PyObject *obj, const char *name, const pxt_tensor *like);
int pxt_check_dtype(const pxt_tensor *t, const char *name, pxt_dtype want);
int pxt_check_shape(const pxt_tensor *t, const char *name, int ndim, const int64_t *dims);
int pxt_check_dims(const char *name, int ndim, const int64_t *shape, int want_ndim,
                   const int64_t *want);
int pxt_check_device(const pxt_tensor *t, const char *name, pxt_device want);
int pxt_check_writable(const pxt_tensor *t, const char *name);
/* The device's backend when it has `op` (a table entry), else NotImplementedError. */
const pxt_backend *pxt_backend_with(pxt_device dev, const void *op, const char *op_name);
#define PXT_BACKEND_OP(dev, field) \
    pxt_backend_with((dev), pxt_backend_for((dev).type) ? (const void *)pxt_backend_for((dev).type)->field : NULL, #field)

/* Method tables of the files that add Python functions (NULL-terminated). */
extern PyMethodDef pxt_ops_methods[];       /* ops_py.c: _op_* kernel bindings for tests */
extern PyMethodDef pxt_attention_methods[]; /* attention.c: attention_forward/backward */
extern PyMethodDef pxt_model_methods[];     /* model.c: plan_memory */

/* flat_state.c: GPT-2 initialisation and named views of flat parameter buffers */
int pxt_flat_init(const pxt_param_layout *l, pxt_tensor *params, uint64_t seed, float resid_std);
PyObject *pxt_flat_views(const pxt_param_layout *l, pxt_tensor *flat);

/* model.c: pyxtts._C.GPT */
int pxt_gpt_init_type(PyObject *module);
/* What pyxtts._C.AdamW needs of a GPT: its flat buffers (borrowed), layout,
 * device, backend, parameter dtype and step flag. 0, or -1 (no exception set)
 * when obj is not an initialised GPT. */
typedef struct {
    pxt_tensor *params, *grads; /* (layout->numel) dt, fp32 */
    const pxt_param_layout *layout;
    pxt_device device;
    const pxt_backend *be;
    pxt_dtype dt;
    int *busy; /* set while a step of the model (or its optimizer) runs */
} pxt_gpt_view;
int pxt_gpt_view_of(PyObject *obj, pxt_gpt_view *out);
/* Adds delta to the optimizer bytes the model's plans count (AdamW's constructor
 * and destructor). */
void pxt_gpt_add_optimizer_bytes(PyObject *obj, Py_ssize_t delta);

/* optim.c: pyxtts._C.AdamW */
int pxt_adamw_init_type(PyObject *module);
/* Allocator bytes of an AdamW's state for a flat buffer of numel elements in
 * n_tensors tensors, parameters of dtype dt, with or without an EMA. */
size_t pxt_adamw_state_bytes(size_t numel, int n_tensors, pxt_dtype dt, int ema);
/* block_py.c: pyxtts._C.Block */
int pxt_block_init_type(PyObject *module);

/* bench.c */
PyObject *pxt_py_bench_alloc(PyObject *m, PyObject *args, PyObject *kwargs);

#endif
