/* geglu.cuh: the kernels of GEGLU, the perceiver's gated feed-forward
 * (csrc/cpu/geglu.c is the reference and has the formulas):
 *
 *   out = a * gelu(g), [a | g] the two halves of a row of inp;
 *   gelu(g) = g Phi(g), Phi the normal CDF by erff (exact, not tanh)
 *
 * Elementwise: a grid-stride loop over vectors of V elements of the (N, F)
 * output (F % V == 0, so a vector never straddles rows). The same float
 * expressions as the CPU (without contraction, -fmad=false): only erff and
 * expf may differ from glibc's by an ulp or two.
 *
 * Kernels only: the includer provides ldf(), stf<T>() and the 16-bit storage
 * types (elem.cuh on the GPU, tests/cuda_emu's emulator on the CPU). */
#ifndef PXT_CUDA_GEGLU_CUH
#define PXT_CUDA_GEGLU_CUH

#include "vec.cuh"

#define PXT_GEGLU_SQRT1_2 0.70710678118654752440f
#define PXT_GEGLU_INV_SQRT_2PI 0.39894228040143267794f

/* out (N, F) = a * gelu(g); inp (N, 2F) = [a | g] */
template <typename T, int V>
__global__ static void pxt_geglu_forward_kernel(T *out, const T *inp, int N, int F) {
    const int fv = F / V; /* vectors per row */
    const size_t n = (size_t)N * fv, stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const size_t r = i / fv;
        const int j = (int)(i - r * fv) * V;
        const T *a = inp + r * 2 * F + j; /* (V); the gate F further */
        float av[V], gv[V];
        pxt_vload<T, V>(av, a);
        pxt_vload<T, V>(gv, a + F);
        for (int q = 0; q < V; q++) {
            float g = gv[q];
            float gelu = g * 0.5f * (1.0f + erff(g * PXT_GEGLU_SQRT1_2));
            av[q] = av[q] * gelu;
        }
        pxt_vstore<T, V>(out + r * F + j, av);
    }
}

/* dinp (N, 2F) = [dout gelu(g) | dout a gelu'(g)] (written),
 * gelu'(g) = Phi(g) + g phi(g); dout (N, F) */
template <typename T, int V>
__global__ static void pxt_geglu_backward_kernel(T *dinp, const T *inp, const T *dout, int N,
                                                 int F) {
    const int fv = F / V;
    const size_t n = (size_t)N * fv, stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const size_t r = i / fv;
        const int j = (int)(i - r * fv) * V;
        const size_t a0 = r * 2 * F + j; /* a's vector in inp and dinp; g's is F further */
        float av[V], gv[V], dy[V];
        pxt_vload<T, V>(av, inp + a0);
        pxt_vload<T, V>(gv, inp + a0 + F);
        pxt_vload<T, V>(dy, dout + r * F + j);
        for (int q = 0; q < V; q++) {
            float a = av[q], g = gv[q];
            float cdf = 0.5f * (1.0f + erff(g * PXT_GEGLU_SQRT1_2));
            float pdf = PXT_GEGLU_INV_SQRT_2PI * expf(-0.5f * g * g);
            av[q] = dy[q] * g * cdf;
            gv[q] = dy[q] * a * (cdf + g * pdf);
        }
        pxt_vstore<T, V>(dinp + a0, av);
        pxt_vstore<T, V>(dinp + a0 + F, gv);
    }
}

#endif /* PXT_CUDA_GEGLU_CUH */
