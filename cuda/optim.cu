/* optim.cu: the optimizer's passes over the flat buffers: the deterministic
 * sum of squares of the gradients, the fused AdamW step, the EMA swap
 * (csrc/cpu/optim.c is the reference, backend.h the contract).
 *
 * AdamW is elementwise with the CPU's float expressions in the CPU's order;
 * -fmad=false keeps every product and sum separately rounded and sqrtf and
 * division are IEEE on the GPU, so the update reproduces the CPU's bits. */
#include <math.h>

#include "elem.cuh"
#include "cuda_common.h"
#include "adamw.cuh"
#include "reduce.cuh"

int pxt_cuda_grad_sumsq(int index, double *sumsq, int *nonfinite, const float *g, size_t n,
                        void *workspace) {
    if (!workspace) {
        return pxt_error(PXT_ERR_VALUE, "grad_sumsq: no workspace (%d doubles), got NULL",
                         PXT_SUMSQ_PARTS);
    }
    PXT_CUDA_ENTER(index);
    cudaStream_t stream = pxt_cuda_stream(index);
    double *parts = (double *)workspace; /* (PXT_SUMSQ_PARTS) on the device */
    parts_sum_kernel<true>
        <<<PXT_SUMSQ_PARTS, PXT_PARTS_BLOCK, 0, stream>>>(parts, g, n, PXT_SUMSQ_PARTS);
    PXT_CUDA_CHECK_LAUNCH("grad_sumsq");
    double host[PXT_SUMSQ_PARTS]; /* (PXT_SUMSQ_PARTS) */
    PXT_CUDA_CHECK(cudaMemcpyAsync(host, parts, sizeof host, cudaMemcpyDeviceToHost, stream));
    PXT_CUDA_CHECK(cudaStreamSynchronize(stream));
    double total = 0.0;
    for (int p = 0; p < PXT_SUMSQ_PARTS; p++) { /* the parts in order */
        total += host[p];
    }
    /* squares of finite floats are < 1.2e77: only inf or NaN inputs make this non-finite */
    *sumsq = total;
    *nonfinite = !isfinite(total);
    return PXT_OK;
}

/* ---- AdamW: the kernel in adamw.cuh ----------------------------------------------
 * Grid (ADAMW_BLOCKS_X, segments, capped): the y blocks pick segments, the x
 * blocks stride through each. */
#define ADAMW_BLOCKS_X 64
#define ADAMW_MAX_GRID_Y 65535

int pxt_cuda_adamw(int index, const pxt_adamw_args *a, float *master, float *m, float *v,
                   float *ema, void *params, const float *grads) {
    if ((void *)master == params && a->dt != PXT_FLOAT32) {
        return pxt_error(PXT_ERR_VALUE, "adamw: params may alias master only when float32");
    }
    if (a->n_segments < 0) {
        return pxt_error(PXT_ERR_VALUE, "adamw: negative segment count %d", a->n_segments);
    }
    PXT_CUDA_ENTER(index);
    int write_params = (void *)master != params;
    dim3 grid(ADAMW_BLOCKS_X, a->n_segments < ADAMW_MAX_GRID_Y ? a->n_segments : ADAMW_MAX_GRID_Y);
    PXT_TRY(pxt_cuda_dispatch(a->dt, "adamw (params)", [&](auto tag) {
        using T = decltype(tag);
        if (a->n_segments == 0) {
            return;
        }
        if (ema) {
            pxt_adamw_kernel<T, true><<<grid, PXT_ADAMW_BLOCK, 0, pxt_cuda_stream(index)>>>(
                *a, master, m, v, ema, (T *)params, grads, write_params);
        } else {
            pxt_adamw_kernel<T, false><<<grid, PXT_ADAMW_BLOCK, 0, pxt_cuda_stream(index)>>>(
                *a, master, m, v, NULL, (T *)params, grads, write_params);
        }
    }));
    PXT_CUDA_CHECK_LAUNCH("adamw");
    return PXT_OK;
}

/* ---- swap ------------------------------------------------------------------------------ */
/* a (n) <-> b (n) as raw words of the element size: no conversion, every bit kept */
template <typename W> __global__ static void swap_kernel(W *a, W *b, size_t n) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        W t = a[i];
        a[i] = b[i];
        b[i] = t;
    }
}

int pxt_cuda_swap(int index, void *a, void *b, size_t n, pxt_dtype dt) {
    size_t esz = pxt_dtype_size(dt);
    if (n == 0 || esz == 0) {
        return PXT_OK;
    }
    PXT_CUDA_ENTER(index);
    cudaStream_t stream = pxt_cuda_stream(index);
    unsigned int grid = pxt_ew_grid(n);
    switch (esz) {
    case 8: swap_kernel<<<grid, PXT_EW_BLOCK, 0, stream>>>((uint64_t *)a, (uint64_t *)b, n); break;
    case 4: swap_kernel<<<grid, PXT_EW_BLOCK, 0, stream>>>((uint32_t *)a, (uint32_t *)b, n); break;
    case 2: swap_kernel<<<grid, PXT_EW_BLOCK, 0, stream>>>((uint16_t *)a, (uint16_t *)b, n); break;
    default:
        swap_kernel<<<pxt_ew_grid(n * esz), PXT_EW_BLOCK, 0, stream>>>((uint8_t *)a, (uint8_t *)b,
                                                                       n * esz);
        break;
    }
    PXT_CUDA_CHECK_LAUNCH("swap");
    return PXT_OK;
}

#undef ADAMW_BLOCKS_X
#undef ADAMW_MAX_GRID_Y
