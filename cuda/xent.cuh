/* xent.cuh: the kernel of the fused softmax cross-entropy, forward and, in place,
 * backward (csrc/cpu/xent.c is the reference; xent.cu launches it, one block a row).
 *
 * The max, then sum(exp(x - max)) in double (a fixed tree: the same bits every run),
 * loss = (max - x[t]) + log(sum) in double, then with backward the row is overwritten by
 * scale * (exp(x - max) / sum - onehot(t)). The softmax never materialises. x is the
 * logit plus the bias where one is given: the heads' bias add runs here rather than as a
 * pass of its own. The sums add in a tree, not in the CPU's order, so the results are
 * the CPU's within rounding, not its bits.
 *
 * Kernels only: the includer provides the CUDA runtime (cuda_common.h on the GPU, the
 * host emulator of tests/cuda_emu on the CPU, which runs this source). */
#ifndef PXT_CUDA_XENT_CUH
#define PXT_CUDA_XENT_CUH

#include <stdint.h>

#define PXT_XENT_BLOCK 256 /* threads a row: a constant, part of the result's bits */

/* logits (N, V) fp32, rows ld apart, dlogits in place with backward (zeros in
 * columns V..ld-1); bias (V) fp32 or NULL, added to each logit in fp32 first;
 * losses (N); targets (N) */
__global__ static void __launch_bounds__(PXT_XENT_BLOCK)
    pxt_softmax_xent_kernel(float *logits, int ld, const float *bias, float *losses,
                            const int32_t *targets, int V, float scale, int backward) {
    __shared__ float shm[PXT_XENT_BLOCK];
    __shared__ double shs[PXT_XENT_BLOCK];
    const int tid = threadIdx.x;
    float *x = logits + (size_t)blockIdx.x * ld; /* (ld) */
    const int t = targets[blockIdx.x];
    if (backward) {
        for (int j = V + tid; j < ld; j += PXT_XENT_BLOCK) {
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
            for (int j = tid; j < V; j += PXT_XENT_BLOCK) {
                x[j] = fill;
            }
        }
        return;
    }
    float mx = -INFINITY;
    for (int j = tid; j < V; j += PXT_XENT_BLOCK) {
        mx = fmaxf(mx, bias ? x[j] + bias[j] : x[j]);
    }
    shm[tid] = mx;
    __syncthreads();
    for (int s = PXT_XENT_BLOCK / 2; s > 0; s >>= 1) {
        if (tid < s) {
            shm[tid] = fmaxf(shm[tid], shm[tid + s]);
        }
        __syncthreads();
    }
    mx = shm[0];
    double sum = 0.0;
    for (int j = tid; j < V; j += PXT_XENT_BLOCK) {
        sum += expf((bias ? x[j] + bias[j] : x[j]) - mx);
    }
    shs[tid] = sum;
    __syncthreads();
    for (int s = PXT_XENT_BLOCK / 2; s > 0; s >>= 1) {
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
        for (int j = tid; j < V; j += PXT_XENT_BLOCK) {
            const float l = bias ? x[j] + bias[j] : x[j];
            x[j] = scale * (expf(l - mx) * inv - (j == t ? 1.0f : 0.0f));
        }
    }
}

#endif /* PXT_CUDA_XENT_CUH */
