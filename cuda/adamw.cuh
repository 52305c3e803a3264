/* adamw.cuh: the kernel of the fused AdamW step over the flat buffers (csrc/cpu/optim.c
 * is the reference, backend.h the contract; optim.cu launches it).
 *
 * Elementwise with the CPU's float expressions in the CPU's order; -fmad=false keeps
 * every product and sum separately rounded, and sqrtf and division are IEEE on the GPU,
 * so the update reproduces the CPU's bits. Grid (x blocks, y): blockIdx.y picks a
 * segment, striding by gridDim.y (its descriptor is in device memory: the host does not
 * know the sizes without a copy), the x blocks stride through it. Small segments
 * (biases) finish at once. Elements outside every segment are never touched.
 *
 * Kernels only: the includer provides ldf(), stf<T>() and the 16-bit storage types
 * (elem.cuh on the GPU, tests/cuda_emu's emulator on the CPU). */
#ifndef PXT_CUDA_ADAMW_CUH
#define PXT_CUDA_ADAMW_CUH

#include "engine/backend.h"

#define PXT_ADAMW_BLOCK 256

template <typename T, bool HAS_EMA>
__global__ static void __launch_bounds__(PXT_ADAMW_BLOCK)
    pxt_adamw_kernel(pxt_adamw_args a, float *master, float *m, float *v, float *ema, T *params,
                     const float *grads, int write_params) {
    const float gs = a.grad_scale, w1 = a.one_minus_beta1, b2 = a.beta2;
    const float w2 = a.one_minus_beta2, nss = a.neg_step_size;
    const float bc2 = a.bias_correction2_sqrt, eps = a.eps;
    const float ed = a.ema_decay, w3 = a.one_minus_ema_decay;
    for (int s = blockIdx.y; s < a.n_segments; s += gridDim.y) {
        const pxt_adamw_segment seg = a.segments[s];
        /* 1 (exact) outside decay segments, as torch's wd = 0 */
        const float df = seg.decay ? a.decay_factor : 1.0f;
        const size_t end = seg.offset + seg.numel, stride = (size_t)gridDim.x * blockDim.x;
        for (size_t i = seg.offset + (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < end;
             i += stride) {
            float g = grads[i] * gs;
            float p = master[i] * df;
            float mi = m[i] + w1 * (g - m[i]); /* torch's lerp, weight < 0.5 */
            float vi = v[i] * b2 + w2 * g * g;
            float denom = sqrtf(vi) / bc2 + eps;
            p = p + nss * (mi / denom);
            m[i] = mi;
            v[i] = vi;
            master[i] = p;
            if (HAS_EMA) {
                ema[i] = ed * ema[i] + w3 * p;
            }
            if (write_params) { /* the compute-precision copy */
                params[i] = stf<T>(p);
            }
        }
    }
}

#endif /* PXT_CUDA_ADAMW_CUH */
