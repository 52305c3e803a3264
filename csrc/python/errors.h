/* errors.h: the extension's exceptions: engine status codes into Python ones.
 *
 * Every binding turns a PXT_* status (and the thread's message, pxt.h) into an
 * exception with pxt_raise; out of memory becomes pyxtts.OutOfMemoryError,
 * a subclass of MemoryError and RuntimeError carrying the allocator's numbers. */
#ifndef PXT_PY_ERRORS_H
#define PXT_PY_ERRORS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "engine/pxt.h"

extern PyObject *pxt_OutOfMemoryError;

/* Creates the exception types and adds them to the module; -1 with an exception. */
int pxt_py_errors_init(PyObject *module);
/* Sets the exception of status code (PXT_ERR_*) from the thread's message;
 * returns NULL, so a binding can `return pxt_raise(rc);`. */
PyObject *pxt_raise(int code);
/* pxt_raise for functions that return an int: -1. */
int pxt_raise_int(int code);
/* Replaces the exception being raised, a refusal by someone else's code (NumPy's, a
 * DLPack producer's) that names no argument, with one of `type` whose message is
 * "<prefix>: <the original message>"; returns NULL. */
PyObject *pxt_reraise_named(PyObject *type, const char *prefix);

/* An exception taken out of the thread (so other Python code can run) and given
 * back later: PyErr_Fetch's three objects before 3.12, the exception after. */
typedef struct {
    PyObject *type, *value, *tb;
} pxt_py_pending;
/* Takes the thread's exception (none: all NULL) and clears it. */
void pxt_py_pending_take(pxt_py_pending *p);
/* Sets it back as the thread's exception (consumes it); none: clears nothing. */
void pxt_py_pending_restore(pxt_py_pending *p);

#endif /* PXT_PY_ERRORS_H */
