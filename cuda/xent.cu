/* xent.cu: the launch of the fused softmax cross-entropy (its kernel in xent.cuh)
 * and the deterministic sum of the per-token losses (csrc/cpu/xent.c is the
 * reference). */
#include <math.h>
#include <pthread.h>

#include "cuda_common.h"
#include "reduce.cuh"
#include "xent.cuh"

int pxt_cuda_softmax_xent(int index, float *logits, int ld, const float *bias, float *losses,
                          const int32_t *targets, int N, int V, float scale, int backward) {
    if (N < 0 || V <= 0 || ld < V) {
        return pxt_error(PXT_ERR_VALUE, "softmax_xent: bad size N=%d V=%d (rows %d apart)", N, V,
                         ld);
    }
    if (N == 0) {
        return PXT_OK;
    }
    PXT_CUDA_ENTER(index);
    /* targets live on the device: the callers check them ([-1, V)) on the host
     * side; the kernel turns any other value into NaN rather than reading out of
     * the row */
    pxt_softmax_xent_kernel<<<N, PXT_XENT_BLOCK, 0, pxt_cuda_stream(index)>>>(
        logits, ld, bias, losses, targets, V, scale, backward);
    PXT_CUDA_CHECK_LAUNCH("softmax_xent");
    return PXT_OK;
}

/* ---- sum ------------------------------------------------------------------------- */
/* sum has no workspace argument: its 256 partial sums live in a module
 * variable (one per device, made with the module), used under a lock */
#define SUM_PARTS 256
__device__ static double sum_parts[SUM_PARTS];
static pthread_mutex_t sum_lock = PTHREAD_MUTEX_INITIALIZER;

static int sum_locked(int index, double *out, const float *x, size_t n) {
    cudaStream_t stream = pxt_cuda_stream(index);
    double *parts;
    PXT_CUDA_CHECK(cudaGetSymbolAddress((void **)&parts, sum_parts));
    parts_sum_kernel<false><<<SUM_PARTS, PXT_PARTS_BLOCK, 0, stream>>>(parts, x, n, SUM_PARTS);
    PXT_CUDA_CHECK_LAUNCH("sum");
    double host[SUM_PARTS]; /* (SUM_PARTS) */
    PXT_CUDA_CHECK(cudaMemcpyAsync(host, parts, sizeof host, cudaMemcpyDeviceToHost, stream));
    PXT_CUDA_CHECK(cudaStreamSynchronize(stream));
    double total = 0.0;
    for (int p = 0; p < SUM_PARTS; p++) { /* in order, on the host */
        total += host[p];
    }
    *out = total;
    return PXT_OK;
}

int pxt_cuda_sum(int index, double *out, const float *x, size_t n) {
    if (n == 0) {
        *out = 0.0;
        return PXT_OK;
    }
    PXT_CUDA_ENTER(index);
    pthread_mutex_lock(&sum_lock);
    int rc = sum_locked(index, out, x, n);
    pthread_mutex_unlock(&sum_lock);
    return rc;
}

#undef SUM_PARTS
