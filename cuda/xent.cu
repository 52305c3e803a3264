/* xent.cu: fused softmax cross-entropy (forward and, in place, backward) and
 * the deterministic sum of the per-token losses (csrc/cpu/xent.c is the
 * reference).
 *
 * One block per row: the max, then sum(exp(x - max)) in double (a fixed tree:
 * the same bits every run), loss = (max - x[t]) + log(sum) in double, then with
 * backward the row is overwritten by scale * (exp(x - max) / sum - onehot(t)).
 * The softmax never materialises. x is the logit plus the bias where one is
 * given: the heads' bias add runs here rather than as a pass of its own. */
#include <math.h>
#include <pthread.h>

#include "cuda_common.h"
#include "reduce.cuh"

#define XENT_BLOCK 256

/* logits (N, V) fp32, rows ld apart, dlogits in place with backward (zeros in
 * columns V..ld-1); bias (V) fp32 or NULL, added to each logit in fp32 first;
 * losses (N); targets (N) */
__global__ static void __launch_bounds__(XENT_BLOCK)
    softmax_xent_kernel(float *logits, int ld, const float *bias, float *losses,
                        const int32_t *targets, int V, float scale, int backward) {
    __shared__ float shm[XENT_BLOCK];
    __shared__ double shs[XENT_BLOCK];
    const int tid = threadIdx.x;
    float *x = logits + (size_t)blockIdx.x * ld; /* (ld) */
    const int t = targets[blockIdx.x];
    if (backward) {
        for (int j = V + tid; j < ld; j += XENT_BLOCK) {
            x[j] = 0.0f;
        }
    }
    if (t < 0 || t >= V) { /* -1: ignored, no loss, no gradient */
        /* another value slipped past the caller's check: NaN, never a stray read */
        float fill = t == -1 ? 0.0f : NAN;
        if (tid == 0) {
            losses[blockIdx.x] = fill;
        }
        if (backward) {
            for (int j = tid; j < V; j += XENT_BLOCK) {
                x[j] = fill;
            }
        }
        return;
    }
    float mx = -INFINITY;
    for (int j = tid; j < V; j += XENT_BLOCK) {
        mx = fmaxf(mx, bias ? x[j] + bias[j] : x[j]);
    }
    shm[tid] = mx;
    __syncthreads();
    for (int s = XENT_BLOCK / 2; s > 0; s >>= 1) {
        if (tid < s) {
            shm[tid] = fmaxf(shm[tid], shm[tid + s]);
        }
        __syncthreads();
    }
    mx = shm[0];
    double sum = 0.0;
    for (int j = tid; j < V; j += XENT_BLOCK) {
        sum += expf((bias ? x[j] + bias[j] : x[j]) - mx);
    }
    shs[tid] = sum;
    __syncthreads();
    for (int s = XENT_BLOCK / 2; s > 0; s >>= 1) {
        if (tid < s) {
            shs[tid] += shs[tid + s];
        }
        __syncthreads();
    }
    sum = shs[0];
    if (tid == 0) {
        const float lt = bias ? x[t] + bias[t] : x[t];
        losses[blockIdx.x] = (float)(((double)mx - lt) + log(sum));
    }
    if (backward) {
        __syncthreads(); /* x[t] is read above before any thread overwrites it */
        float inv = (float)(1.0 / sum);
        for (int j = tid; j < V; j += XENT_BLOCK) {
            const float l = bias ? x[j] + bias[j] : x[j];
            x[j] = scale * (expf(l - mx) * inv - (j == t ? 1.0f : 0.0f));
        }
    }
}

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
    softmax_xent_kernel<<<N, XENT_BLOCK, 0, pxt_cuda_stream(index)>>>(logits, ld, bias, losses,
                                                                      targets, V, scale, backward);
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

#undef XENT_BLOCK
#undef SUM_PARTS
