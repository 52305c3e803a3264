/* gelu.cuh: the kernels of GELU (GPT-2's tanh approximation), forward and
 * backward (csrc/cpu/gelu.c is the reference and explains the formulas):
 *
 *   gelu(x) = 0.5 x (1 + tanh(u)) = x / (1 + exp(-2u)),  u = sqrt(2/pi) (x + 0.044715 x^3)
 *
 * Elementwise: a grid-stride loop over vectors of V elements (n % V == 0), so
 * a 16-bit tensor moves 16 bytes per access. The same float expressions as the
 * CPU per element, evaluated without contraction (-fmad=false): only expf may
 * differ from glibc's by an ulp. They run where cuBLASLt's GELU epilogues do
 * not: fc's GELU gradient at XTTS v2's sizes (no DGELU_BGRAD kernel there),
 * selective recomputation, PYXTTS_CUDA_GEMM_FUSED=composed.
 *
 * Kernels only: the includer provides ldf(), stf<T>() and the 16-bit storage
 * types (elem.cuh on the GPU, tests/cuda_emu's emulator on the CPU). */
#ifndef PXT_CUDA_GELU_CUH
#define PXT_CUDA_GELU_CUH

#include "vec.cuh"

#define PXT_GELU_K 0.7978845608028654f /* sqrt(2 / pi) */
#define PXT_GELU_A 0.044715f

/* out, inp (n) */
template <typename T, int V>
__global__ static void pxt_gelu_forward_kernel(T *out, const T *inp, size_t n) {
    const size_t nv = n / V, stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < nv; i += stride) {
        float x[V];
        pxt_vload<T, V>(x, inp + i * V);
        for (int q = 0; q < V; q++) {
            float u = PXT_GELU_K * (x[q] + PXT_GELU_A * x[q] * x[q] * x[q]);
            x[q] = x[q] / (1.0f + expf(-2.0f * u));
        }
        pxt_vstore<T, V>(out + i * V, x);
    }
}

/* dinp, inp, dout (n): dinp = gelu'(inp) dout. dinp may be dout: each vector
 * is read, then written, by one thread. */
template <typename T, int V>
__global__ static void pxt_gelu_backward_kernel(T *dinp, const T *inp, const T *dout, size_t n) {
    const size_t nv = n / V, stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < nv; i += stride) {
        float x[V], dy[V];
        pxt_vload<T, V>(x, inp + i * V);
        pxt_vload<T, V>(dy, dout + i * V);
        for (int q = 0; q < V; q++) {
            float u = PXT_GELU_K * (x[q] + PXT_GELU_A * x[q] * x[q] * x[q]);
            /* clamping x changes nothing where s (1 - s) > 0 and keeps x du finite */
            float xc = x[q] < 100.0f ? x[q] : 100.0f; /* the CPU's selects: NaN -> 100 */
            xc = xc > -100.0f ? xc : -100.0f;
            float du = PXT_GELU_K * (1.0f + 3.0f * PXT_GELU_A * xc * xc);
            float e = expf(-2.0f * u);
            float s = 1.0f / (1.0f + e);
            float es = e * s;
            float sm = es < 1.0f ? es : 1.0f; /* 1 - s; NaN (e = inf) -> 1, as the CPU */
            float grad = s + 2.0f * xc * (s * sm) * du;
            dy[q] = grad * dy[q];
        }
        pxt_vstore<T, V>(dinp + i * V, dy);
    }
}

#undef PXT_GELU_K
#undef PXT_GELU_A
#endif /* PXT_CUDA_GELU_CUH */
