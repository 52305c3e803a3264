/* elementwise.cu: the residual add (csrc/cpu/gelu.c holds the CPU's). */
#include "elem.cuh"

/* out, a, b (n); out may alias a or b: each element is read, then written, by one thread */
template <typename T> __global__ static void add_kernel(T *out, const T *a, const T *b, size_t n) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        out[i] = stf<T>(ldf(a[i]) + ldf(b[i]));
    }
}

int pxt_cuda_add(int index, void *out, const void *a, const void *b, size_t n, pxt_dtype dt) {
    PXT_CUDA_ENTER(index);
    PXT_TRY(pxt_cuda_dispatch(dt, "add", [&](auto tag) {
        using T = decltype(tag);
        if (n) {
            add_kernel<T><<<pxt_ew_grid(n), PXT_EW_BLOCK, 0, pxt_cuda_stream(index)>>>(
                (T *)out, (const T *)a, (const T *)b, n);
        }
    }));
    PXT_CUDA_CHECK_LAUNCH("add");
    return PXT_OK;
}
