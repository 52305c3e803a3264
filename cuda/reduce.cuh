/* reduce.cuh: the fixed-partition double reduction of `sum` (xent.cu) and
 * `grad_sumsq` (optim.cu).
 *
 * x (n) is cut into `nparts` contiguous parts of ceil(n / nparts) elements, as
 * on the CPU; block p sums part p in double (thread t adds elements t, t + 256,
 * t + 512, ... of the part in that order, then a fixed tree in shared memory)
 * into parts[p]; the host adds the parts in order. Part bounds, block size and
 * tree are constants, so the bits depend on n alone (not on the GPU); they
 * differ from the CPU's only in the order of the double additions inside a part.
 *
 * Kernels only: the includer provides the CUDA runtime (cuda_common.h on the
 * GPU, the host emulator of tests/cuda_emu on the CPU, which runs this source). */
#ifndef PXT_CUDA_REDUCE_CUH
#define PXT_CUDA_REDUCE_CUH

#define PXT_PARTS_BLOCK 256 /* threads per part: a constant, part of the result's bits */
#define PXT_PARTS_AHEAD 8   /* loads a thread has in flight before their adds */

/* parts (nparts) = per-part sums of x, or of x^2 with SQUARE */
template <bool SQUARE>
__global__ static void __launch_bounds__(PXT_PARTS_BLOCK)
    parts_sum_kernel(double *parts, const float *x, size_t n, int nparts) {
    __shared__ double sh[PXT_PARTS_BLOCK];
    size_t len = (n + nparts - 1) / nparts;
    size_t lo = (size_t)blockIdx.x * len < n ? (size_t)blockIdx.x * len : n;
    size_t hi = n - lo < len ? n : lo + len;
    double a = 0.0;
    size_t i = lo + threadIdx.x;
    /* AHEAD loads issued before their adds, which stay in order: the bits of one
     * load at a time, with the memory kept busy (that loop ran the H200's gradient
     * norm at 2.0 TB/s, under half its bandwidth: 256 blocks are a quarter of the
     * threads the GPU holds, so each must keep more loads in flight) */
    for (; i + (PXT_PARTS_AHEAD - 1) * PXT_PARTS_BLOCK < hi;
         i += PXT_PARTS_AHEAD * PXT_PARTS_BLOCK) {
        float v[PXT_PARTS_AHEAD];
#pragma unroll
        for (int u = 0; u < PXT_PARTS_AHEAD; u++) {
            v[u] = x[i + (size_t)u * PXT_PARTS_BLOCK];
        }
#pragma unroll
        for (int u = 0; u < PXT_PARTS_AHEAD; u++) {
            const double d = v[u];
            a += SQUARE ? d * d : d;
        }
    }
    for (; i < hi; i += PXT_PARTS_BLOCK) { /* the part's last elements */
        const double d = x[i];
        a += SQUARE ? d * d : d;
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
