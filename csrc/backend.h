/* backend.h: the table of function pointers every backend fills.
 *
 * Code above this table (allocator, tensors, engine) never names a device API;
 * it asks pxt_backend_for(type) and calls through the table. The CPU backend is
 * the reference; the CUDA backend mirrors it entry for entry. Every entry
 * returns a PXT_* status and, on failure, has set the thread's error message.
 * Pointers passed in are device pointers of the backend's own device. */
#ifndef PXT_BACKEND_H
#define PXT_BACKEND_H

#include "pxt.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    PXT_COPY_H2D = 0, /* host -> device */
    PXT_COPY_D2H = 1, /* device -> host */
    PXT_COPY_D2D = 2, /* device -> same device */
} pxt_copy_kind;

typedef struct {
    char name[256];
    size_t total_memory;       /* bytes: device memory, or physical RAM on the CPU */
    int major, minor;          /* compute capability (0, 0 on the CPU) */
    int multiprocessors;       /* SMs, or online CPU cores */
} pxt_device_props;

typedef struct pxt_backend {
    const char *name; /* "cpu", "cuda" */

    /* Devices. device_count never fails: a missing driver is 0 devices. */
    int (*device_count)(void);
    int (*device_props)(int index, pxt_device_props *out);
    /* Free and total bytes right now, as the driver sees them. */
    int (*mem_info)(int index, size_t *free_bytes, size_t *total_bytes);

    /* Raw memory under the caching allocator: 256-byte aligned at least.
     * raw_alloc returns PXT_ERR_OOM when the device is full. */
    int (*raw_alloc)(int index, size_t nbytes, void **ptr);
    void (*raw_free)(int index, void *ptr);

    /* Copies finish before they return (host memory may be reused at once). */
    int (*copy)(int index, void *dst, const void *src, size_t nbytes, pxt_copy_kind kind);
    int (*memset_zero)(int index, void *dst, size_t nbytes);
    /* dst[i] = (dst_dtype) src[i] for n elements; floats round to nearest even. */
    int (*cast)(int index, void *dst, pxt_dtype dst_dtype, const void *src, pxt_dtype src_dtype,
                size_t n);
    /* Waits for all queued work on the device. */
    int (*synchronize)(int index);
} pxt_backend;

/* The backend of a device type, or NULL when this build has none (CPU-only). */
const pxt_backend *pxt_backend_for(pxt_device_type type);

/* Filled by csrc/cpu/backend_cpu.c and cuda/backend_cuda.cu. */
const pxt_backend *pxt_cpu_backend(void);
#ifdef PXT_WITH_CUDA
const pxt_backend *pxt_cuda_backend(void);
/* Version strings for build_info(): "13.0", cuBLAS "13.0.2". */
void pxt_cuda_versions(int *runtime, int *driver, int *cublas);
#endif

#ifdef __cplusplus
}
#endif
#endif /* PXT_BACKEND_H */
