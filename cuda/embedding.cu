/* embedding.cu: table lookup forward, scatter-add backward
 * (csrc/cpu/embedding.c is the reference).
 *
 * The backward is a scatter in which several rows of dout may hit one table
 * row (repeated tokens). No atomics (their order varies from run to run):
 * one thread per column j walks all N ids in order, so every dtable element
 * receives its additions in index order, exactly as on the CPU (its bits). */
#include "elem.cuh"

/* out (N, C) (+)= table (V, C)[ids (N)]; ids in [0, V), checked by the caller */
template <typename T>
__global__ static void embedding_forward_kernel(T *out, const int32_t *ids, const T *table, int N,
                                                int C, int accumulate) {
    size_t n = (size_t)N * C, stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        size_t row = i / C, j = i % C;
        float v = ldf(table[(size_t)ids[row] * C + j]);
        out[i] = stf<T>(accumulate ? ldf(out[i]) + v : v);
    }
}

/* dtable (V, C) fp32 += dout (N, C) scattered by ids (N): a thread per column */
template <typename T>
__global__ static void embedding_backward_kernel(float *dtable, const T *dout, const int32_t *ids,
                                                 int N, int C) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= C) {
        return;
    }
    for (int i = 0; i < N; i++) {
        dtable[(size_t)ids[i] * C + j] += ldf(dout[(size_t)i * C + j]);
    }
}

int pxt_cuda_embedding_forward(int index, void *out, const int32_t *ids, const void *table, int N,
                               int C, int accumulate, pxt_dtype dt) {
    if (N < 0 || C < 0) {
        return pxt_error(PXT_ERR_VALUE, "embedding_forward: negative size N=%d C=%d", N, C);
    }
    PXT_CUDA_CHECK(cudaSetDevice(index));
    size_t n = (size_t)N * C;
    PXT_TRY(pxt_cuda_dispatch(dt, "embedding_forward", [&](auto tag) {
        using T = decltype(tag);
        if (n) {
            embedding_forward_kernel<T>
                <<<pxt_ew_grid(n), PXT_EW_BLOCK, 0, pxt_cuda_stream(index)>>>(
                    (T *)out, ids, (const T *)table, N, C, accumulate);
        }
    }));
    PXT_CUDA_CHECK_LAUNCH("embedding_forward");
    return PXT_OK;
}

int pxt_cuda_embedding_backward(int index, float *dtable, const void *dout, const int32_t *ids,
                                int N, int C, pxt_dtype dt) {
    if (N < 0 || C < 0) {
        return pxt_error(PXT_ERR_VALUE, "embedding_backward: negative size N=%d C=%d", N, C);
    }
    PXT_CUDA_CHECK(cudaSetDevice(index));
    PXT_TRY(pxt_cuda_dispatch(dt, "embedding_backward", [&](auto tag) {
        using T = decltype(tag);
        if (N && C) {
            embedding_backward_kernel<T><<<(C + 127) / 128, 128, 0, pxt_cuda_stream(index)>>>(
                dtable, (const T *)dout, ids, N, C);
        }
    }));
    PXT_CUDA_CHECK_LAUNCH("embedding_backward");
    return PXT_OK;
}
