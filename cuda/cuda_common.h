/* cuda_common.h: what the CUDA backend's files share: error checks, the
 * stream every call queues on, the cuBLAS handle, the kernels' entry points.
 * Internal to cuda/: code above backend.h never includes it. */
#ifndef PXT_CUDA_COMMON_H
#define PXT_CUDA_COMMON_H

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "backend.h"

/* Turns a failed CUDA call into `return pxt_error(PXT_ERR_DEVICE, ...)`.
 * The failed call also set the runtime's last error; clear it so a later
 * cudaGetLastError() after a kernel launch does not report it again. */
#define PXT_CUDA_CHECK(call)                                                                   \
    do {                                                                                       \
        cudaError_t err_ = (call);                                                             \
        if (err_ != cudaSuccess) {                                                             \
            (void)cudaGetLastError();                                                          \
            return pxt_error(PXT_ERR_DEVICE, "%s failed: %s", #call, cudaGetErrorString(err_)); \
        }                                                                                      \
    } while (0)

#define PXT_CUBLAS_CHECK(call)                                                                 \
    do {                                                                                       \
        cublasStatus_t st_ = (call);                                                           \
        if (st_ != CUBLAS_STATUS_SUCCESS)                                                      \
            return pxt_error(PXT_ERR_DEVICE, "%s failed: %s (%s)", #call,                      \
                             cublasGetStatusName(st_), cublasGetStatusString(st_));            \
    } while (0)

/* The stream all work on device `index` is queued on. The legacy default
 * stream for now: it orders everything, so no event bookkeeping is needed.
 * Per-device streams later change only this function. */
static inline cudaStream_t pxt_cuda_stream(int index) {
    (void)index;
    return (cudaStream_t)0;
}

#ifdef __cplusplus
extern "C" {
#endif

/* The device's cuBLAS handle, created on first use, bound to pxt_cuda_stream. */
int pxt_cuda_cublas(int index, cublasHandle_t *out);

/* cast.cu: the backend's `cast` entry (see backend.h). */
int pxt_cuda_cast(int index, void *dst, pxt_dtype dt, const void *src, pxt_dtype st, size_t n);

#ifdef __cplusplus
}
#endif
#endif /* PXT_CUDA_COMMON_H */
