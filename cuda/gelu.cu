/* gelu.cu: GELU (GPT-2's tanh approximation) on the GPU, forward and backward
 * (csrc/cpu/gelu.c is the reference; the kernels are in gelu.cuh, where the
 * emulator of tests/cuda_emu runs them too). Grid-stride kernels over vectors
 * of up to 16 bytes where n and the pointers allow it. */
#include "elem.cuh"

#include "gelu.cuh"

/* pxt_vec_width asks only whether n divides by each width: n mod 16 answers that */
static int width(size_t esize, size_t n, const void *const *ptrs, int nptrs) {
    return pxt_vec_width(esize, (int)(n % 16), ptrs, nptrs);
}

int pxt_cuda_gelu_forward(int index, void *out, const void *inp, size_t n, pxt_dtype dt) {
    PXT_CUDA_ENTER(index);
    /* out, inp (n) */
    PXT_TRY(pxt_cuda_dispatch(dt, "gelu_forward", [&](auto tag) {
        using T = decltype(tag);
        const void *ptrs[] = {out, inp};
        pxt_vec_dispatch<T>(width(sizeof(T), n, ptrs, 2), [&](auto v) {
            constexpr int V = decltype(v)::value;
            if (n) {
                pxt_gelu_forward_kernel<T, V>
                    <<<pxt_ew_grid(n / V), PXT_EW_BLOCK, 0, pxt_cuda_stream(index)>>>(
                        (T *)out, (const T *)inp, n);
            }
        });
    }));
    PXT_CUDA_CHECK_LAUNCH("gelu_forward");
    return PXT_OK;
}

int pxt_cuda_gelu_backward(int index, void *dinp, const void *inp, const void *dout, size_t n,
                           pxt_dtype dt) {
    PXT_CUDA_ENTER(index);
    /* dinp, inp, dout (n) */
    PXT_TRY(pxt_cuda_dispatch(dt, "gelu_backward", [&](auto tag) {
        using T = decltype(tag);
        const void *ptrs[] = {dinp, inp, dout};
        pxt_vec_dispatch<T>(width(sizeof(T), n, ptrs, 3), [&](auto v) {
            constexpr int V = decltype(v)::value;
            if (n) {
                pxt_gelu_backward_kernel<T, V>
                    <<<pxt_ew_grid(n / V), PXT_EW_BLOCK, 0, pxt_cuda_stream(index)>>>(
                        (T *)dinp, (const T *)inp, (const T *)dout, n);
            }
        });
    }));
    PXT_CUDA_CHECK_LAUNCH("gelu_backward");
    return PXT_OK;
}
