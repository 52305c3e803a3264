/* embedding.cu: table lookup forward, scatter-add backward
 * (csrc/cpu/embedding.c is the reference).
 *
 * The backward is a scatter in which several rows of dout may hit one table
 * row (repeated tokens, a position of every sample). No atomics (their order
 * varies from run to run): backend.h's two stages, whose kernels are in
 * embedding.cuh, give the CPU's bits with every row and column in parallel;
 * a repeated id is summed in pieces of at most PXT_EMB_CHUNK rows. */
#include "elem.cuh"

#include "embedding.cuh"

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

int pxt_cuda_embedding_forward(int index, void *out, const int32_t *ids, const void *table, int N,
                               int C, int accumulate, pxt_dtype dt) {
    if (N < 0 || C < 0) {
        return pxt_error(PXT_ERR_VALUE, "embedding_forward: negative size N=%d C=%d", N, C);
    }
    PXT_CUDA_ENTER(index);
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

#define EMB_MAX_GRID_Y 65535

static size_t align256(size_t n) { return (n + 255) / 256 * 256; }

int pxt_cuda_embedding_backward(int index, float *dtable, const void *dout, const int32_t *ids,
                                int N, int C, int V, pxt_dtype dt, void *workspace) {
    int empty;
    PXT_TRY(pxt_embedding_backward_check(N, C, V, workspace, &empty));
    if (empty) {
        return PXT_OK;
    }
    PXT_CUDA_ENTER(index);
    cudaStream_t stream = pxt_cuda_stream(index);
    double *parts = (double *)workspace;                                              /* (N, C) */
    uint8_t *flags = (uint8_t *)workspace + align256((size_t)N * C * sizeof(double)); /* (N) */
    const int nchunks = (N + PXT_EMB_CHUNK - 1) / PXT_EMB_CHUNK;
    const int rowblocks = (N + PXT_EMB_WARPS - 1) / PXT_EMB_WARPS;
    const unsigned int gx = (unsigned int)((C + 31) / 32);
    pxt_emb_flags_kernel<<<rowblocks, 32 * PXT_EMB_WARPS, 0, stream>>>(flags, ids, N);
    PXT_CUDA_CHECK_LAUNCH("embedding_backward (leaders)");
    PXT_TRY(pxt_cuda_dispatch(dt, "embedding_backward", [&](auto tag) {
        using T = decltype(tag);
        dim3 grid(gx, nchunks < EMB_MAX_GRID_Y ? nchunks : EMB_MAX_GRID_Y);
        pxt_emb_parts_kernel<T>
            <<<grid, 32 * PXT_EMB_WARPS, 0, stream>>>(parts, flags, (const T *)dout, ids, N, C);
    }));
    PXT_CUDA_CHECK_LAUNCH("embedding_backward (chunk sums)");
    PXT_TRY(pxt_cuda_dispatch(dt, "embedding_backward", [&](auto tag) {
        using T = decltype(tag);
        dim3 grid(gx, rowblocks < EMB_MAX_GRID_Y ? rowblocks : EMB_MAX_GRID_Y);
        pxt_emb_sum_kernel<T><<<grid, 32 * PXT_EMB_WARPS, 0, stream>>>(dtable, parts, flags,
                                                                       (const T *)dout, ids, N, C);
    }));
    PXT_CUDA_CHECK_LAUNCH("embedding_backward (totals)");
    return PXT_OK;
}

#undef EMB_MAX_GRID_Y
