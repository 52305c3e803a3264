/* gelu.cu: GELU (GPT-2's tanh approximation), forward and backward
 * (csrc/cpu/gelu.c is the reference and explains the formulas).
 *
 *   gelu(x) = 0.5 x (1 + tanh(u)) = x / (1 + exp(-2u)),  u = sqrt(2/pi) (x + 0.044715 x^3)
 *
 * The sigmoid form keeps full relative precision for negative x. The same
 * float expressions as the CPU, evaluated without contraction (-fmad=false);
 * only expf may differ from glibc's by an ulp. */
#include "elem.cuh"

#define GELU_K 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_A 0.044715f

template <typename T> __global__ static void gelu_forward_kernel(T *out, const T *inp, size_t n) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float x = ldf(inp[i]);
        float u = GELU_K * (x + GELU_A * x * x * x);
        out[i] = stf<T>(x / (1.0f + expf(-2.0f * u)));
    }
}

/* dinp may alias dout: element i is read before it is written, by one thread */
template <typename T>
__global__ static void gelu_backward_kernel(T *dinp, const T *inp, const T *dout, size_t n) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float x = ldf(inp[i]);
        float u = GELU_K * (x + GELU_A * x * x * x);
        /* clamping x changes nothing where s (1 - s) > 0 and keeps x du finite */
        float xc = x < 100.0f ? x : 100.0f; /* the CPU's selects: NaN -> 100, as there */
        xc = xc > -100.0f ? xc : -100.0f;
        float du = GELU_K * (1.0f + 3.0f * GELU_A * xc * xc);
        float e = expf(-2.0f * u);
        float s = 1.0f / (1.0f + e);
        float es = e * s;
        float sm = es < 1.0f ? es : 1.0f; /* 1 - s; NaN (e = inf) -> 1, as the CPU */
        float grad = s + 2.0f * xc * (s * sm) * du;
        dinp[i] = stf<T>(grad * ldf(dout[i]));
    }
}

int pxt_cuda_gelu_forward(int index, void *out, const void *inp, size_t n, pxt_dtype dt) {
    PXT_CUDA_ENTER(index);
    PXT_TRY(pxt_cuda_dispatch(dt, "gelu_forward", [&](auto tag) {
        using T = decltype(tag);
        if (n) {
            gelu_forward_kernel<T><<<pxt_ew_grid(n), PXT_EW_BLOCK, 0, pxt_cuda_stream(index)>>>(
                (T *)out, (const T *)inp, n);
        }
    }));
    PXT_CUDA_CHECK_LAUNCH("gelu_forward");
    return PXT_OK;
}

int pxt_cuda_gelu_backward(int index, void *dinp, const void *inp, const void *dout, size_t n,
                           pxt_dtype dt) {
    PXT_CUDA_ENTER(index);
    PXT_TRY(pxt_cuda_dispatch(dt, "gelu_backward", [&](auto tag) {
        using T = decltype(tag);
        if (n) {
            gelu_backward_kernel<T><<<pxt_ew_grid(n), PXT_EW_BLOCK, 0, pxt_cuda_stream(index)>>>(
                (T *)dinp, (const T *)inp, (const T *)dout, n);
        }
    }));
    PXT_CUDA_CHECK_LAUNCH("gelu_backward");
    return PXT_OK;
}

#undef GELU_K
#undef GELU_A
