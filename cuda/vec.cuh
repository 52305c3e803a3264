/* vec.cuh: what the conditioning path's kernels (groupnorm.cuh, rmsnorm.cuh,
 * geglu.cuh) share: loads and stores of V consecutive elements at once (up to
 * 16 bytes, one LDG.128 / STG.128), the host's choice of V, and the double
 * sums of a warp and of a block in a fixed order.
 *
 * Kernels and helpers only: the includer provides ldf(), stf<T>() and the
 * 16-bit storage types (elem.cuh on the GPU, the host emulator of
 * tests/cuda_emu on the CPU, which runs this very source). */
#ifndef PXT_CUDA_VEC_CUH
#define PXT_CUDA_VEC_CUH

#include <stddef.h>
#include <stdint.h>

#include <type_traits>

/* A vector access at a misaligned address faults on a GPU; the host emulator
 * (tests/cuda_emu) defines this to count it as an error, which x86 would not. */
#ifndef PXT_VEC_CHECK_ALIGNED
#define PXT_VEC_CHECK_ALIGNED(p, bytes) ((void)0)
#endif

/* V elements of storage type T, aligned to their size: one memory access. */
template <typename T, int V> struct alignas(sizeof(T) * V) pxt_vec {
    T v[V];
};

/* f (V) = the V elements at p, as floats; p is aligned to V elements. */
template <typename T, int V> __device__ static inline void pxt_vload(float (&f)[V], const T *p) {
    PXT_VEC_CHECK_ALIGNED(p, sizeof(T) * V);
    const pxt_vec<T, V> w = *reinterpret_cast<const pxt_vec<T, V> *>(p);
#pragma unroll
    for (int k = 0; k < V; k++) {
        f[k] = ldf(w.v[k]);
    }
}

/* p[0..V) = f, each rounded once to T; p is aligned to V elements. */
template <typename T, int V> __device__ static inline void pxt_vstore(T *p, const float (&f)[V]) {
    pxt_vec<T, V> w;
#pragma unroll
    for (int k = 0; k < V; k++) {
        w.v[k] = stf<T>(f[k]);
    }
    PXT_VEC_CHECK_ALIGNED(p, sizeof(T) * V);
    *reinterpret_cast<pxt_vec<T, V> *>(p) = w;
}

/* Host: the widest V (elements of esize bytes, at most 16 bytes) that divides
 * n and to which each of the nptrs pointers is aligned: rows of n elements
 * starting at those pointers are then whole vectors. */
static inline int pxt_vec_width(size_t esize, int n, const void *const *ptrs, int nptrs) {
    for (int v = (int)(16 / esize); v > 1; v /= 2) {
        int ok = n % v == 0;
        for (int i = 0; ok && i < nptrs; i++) {
            ok = (uintptr_t)ptrs[i] % (esize * (size_t)v) == 0;
        }
        if (ok) {
            return v;
        }
    }
    return 1;
}

/* Host: calls f(std::integral_constant<int, V>{}) for the width V of
 * pxt_vec_width, instantiating only the widths that fit 16 bytes of T. */
template <typename T, typename F> static inline void pxt_vec_dispatch(int v, F &&f) {
    switch (v) {
    case 8:
        if constexpr (sizeof(T) * 8 <= 16) {
            f(std::integral_constant<int, 8>{});
        }
        break;
    case 4: f(std::integral_constant<int, 4>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    default: f(std::integral_constant<int, 1>{}); break;
    }
}

/* The sum of v over a warp's 32 lanes: a fixed butterfly, so every lane holds
 * the same bits. */
__device__ static inline double pxt_warp_sumd(double v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, o);
    }
    return v;
}

/* v[i] = the sum of v[i] over the THREADS threads of the block, the same bits
 * in every thread: each warp's butterfly, then the warps' sums added in warp
 * order. Every thread of the block must call it (it syncs twice). */
template <int THREADS, int NV> __device__ static inline void pxt_block_sumd(double (&v)[NV]) {
    static_assert(THREADS % 32 == 0 && THREADS <= 1024, "whole warps");
    __shared__ double sh[NV][THREADS / 32];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
    for (int i = 0; i < NV; i++) {
        v[i] = pxt_warp_sumd(v[i]);
        if (lane == 0) {
            sh[i][warp] = v[i];
        }
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < NV; i++) {
        double s = 0.0;
        for (int w = 0; w < THREADS / 32; w++) {
            s += sh[i][w];
        }
        v[i] = s;
    }
    __syncthreads(); /* sh is free for the next call */
}

#endif /* PXT_CUDA_VEC_CUH */
