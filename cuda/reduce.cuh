/* reduce.cuh: the fixed-partition double reduction of `sum` (xent.cu) and
 * `grad_sumsq` (optim.cu).
 *
 * x (n) is cut into `nparts` contiguous parts of ceil(n / nparts) elements, as
 * on the CPU; block p sums part p in double (threads stride the part, then a
 * fixed tree in shared memory) into parts[p]; the host adds the parts in
 * order. Part bounds, block size and tree are constants, so the bits depend on
 * n alone (not on the GPU); they differ from the CPU's only in the order of
 * the double additions inside a part. */
#ifndef PXT_CUDA_REDUCE_CUH
#define PXT_CUDA_REDUCE_CUH

#include "cuda_common.h"

#define PXT_PARTS_BLOCK 256 /* threads per part: a constant, part of the result's bits */

/* parts (nparts) = per-part sums of x, or of x^2 with SQUARE */
template <bool SQUARE>
__global__ static void __launch_bounds__(PXT_PARTS_BLOCK)
    parts_sum_kernel(double *parts, const float *x, size_t n, int nparts) {
    __shared__ double sh[PXT_PARTS_BLOCK];
    size_t len = (n + nparts - 1) / nparts;
    size_t lo = (size_t)blockIdx.x * len < n ? (size_t)blockIdx.x * len : n;
    size_t hi = n - lo < len ? n : lo + len;
    double a = 0.0;
    for (size_t i = lo + threadIdx.x; i < hi; i += PXT_PARTS_BLOCK) {
        double v = x[i];
        a += SQUARE ? v * v : v;
    }
    sh[threadIdx.x] = a;
    __syncthreads();
    for (int s = PXT_PARTS_BLOCK / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) {
            sh[threadIdx.x] += sh[threadIdx.x + s];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        parts[blockIdx.x] = sh[0];
    }
}

#endif
