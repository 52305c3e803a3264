/* ops_py.c: Python bindings of single backend kernels (_op_*), so the tests can
 * check each op against float64 NumPy and finite differences. */
#include "module.h"

PyMethodDef pxt_ops_methods[] = {
    {NULL, NULL, 0, NULL},
};
