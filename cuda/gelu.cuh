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

/* gelu'(x) dy, formed as the CPU's gelu_backward forms it. */
__device__ static inline float pxt_gelu_grad(float x, float dy) {
    float u = PXT_GELU_K * (x + PXT_GELU_A * x * x * x);
    /* clamping x changes nothing where s (1 - s) > 0 and keeps x du finite */
    float xc = x < 100.0f ? x : 100.0f; /* the CPU's selects: NaN -> 100 */
    xc = xc > -100.0f ? xc : -100.0f;
    float du = PXT_GELU_K * (1.0f + 3.0f * PXT_GELU_A * xc * xc);
    float e = expf(-2.0f * u);
    float s = 1.0f / (1.0f + e);
    float es = e * s;
    float sm = es < 1.0f ? es : 1.0f; /* 1 - s; NaN (e = inf) -> 1, as the CPU */
    float grad = s + 2.0f * xc * (s * sm) * du;
    return grad * dy;
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
            dy[q] = pxt_gelu_grad(x[q], dy[q]);
        }
        pxt_vstore<T, V>(dinp + i * V, dy);
    }
}

/* fc's GELU gradient with its bias gradient in one pass over the rows (gemm_fused's
 * DGELU_BGRAD where cuBLASLt has no kernel): a column-sum functor (colsum.cuh) whose
 * terms store d = gelu'(pre) d over the product d, as pxt_gelu_backward_kernel does,
 * and give the stored values back, as bias_backward would read them: the composed
 * path's bits, d read and written once instead of written, then read again. Each
 * element is visited once by stage 1 of the column sums. */
template <typename T> struct pxt_colsum_dgelu {
    static constexpr int NV = 1;
    using elem = T;
    T *d;         /* (rows, cols): the product in, gelu'(pre) * product out */
    const T *pre; /* (rows, cols) */
    int cols;
    static constexpr int NL = 2; /* pre, d */
    template <int V> __device__ void load(int i, int j, float (&a)[NL][V]) const {
        pxt_vload<T, V>(a[0], pre + (size_t)i * cols + j);
        pxt_vload<T, V>(a[1], d + (size_t)i * cols + j);
    }
    template <int V>
    __device__ void terms(int i, int j, const float (&a)[NL][V], double (&v)[NV][V]) const {
        float dy[V];
#pragma unroll
        for (int q = 0; q < V; q++) {
            dy[q] = ldf(stf<T>(pxt_gelu_grad(a[0][q], a[1][q]))); /* the value stored */
            v[0][q] = dy[q];
        }
        pxt_vstore<T, V>(d + (size_t)i * cols + j, dy); /* no rounding more: T's values */
    }
    int width(int n) const {
        const void *p[] = {d, pre};
        return pxt_vec_width(sizeof(T), n, p, 2);
    }
};

#undef PXT_GELU_K
#undef PXT_GELU_A
#endif /* PXT_CUDA_GELU_CUH */
