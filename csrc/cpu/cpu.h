/* cpu.h: the CPU backend's kernels, shared between its files. */
#ifndef PXT_CPU_H
#define PXT_CPU_H

#include "../pxt.h"

int pxt_cpu_cast(int index, void *dst, pxt_dtype dt, const void *src, pxt_dtype st, size_t n);

/* OpenBLAS's build configuration string, for build_info(). */
const char *pxt_cpu_blas_config(void);

#endif
