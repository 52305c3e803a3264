/* geglu.cu: GEGLU on the GPU, forward and backward (csrc/cpu/geglu.c is the
 * reference; the kernels are in geglu.cuh, where the emulator of
 * tests/cuda_emu runs them too). Elementwise grid-stride kernels over vectors
 * of up to 16 bytes where F and the pointers allow it (XTTS v2's F = 2730 is
 * even: pairs). */
#include "elem.cuh"

#include "geglu.cuh"

static int check(int N, int F, const char *op) {
    if (N < 0 || F < 1) {
        return pxt_error(PXT_ERR_VALUE, "%s: bad size N=%d F=%d", op, N, F);
    }
    return PXT_OK;
}

int pxt_cuda_geglu_forward(int index, void *out, const void *inp, int N, int F, pxt_dtype dt) {
    PXT_TRY(check(N, F, "geglu_forward"));
    PXT_CUDA_ENTER(index);
    /* out (N, F); inp (N, 2F) */
    PXT_TRY(pxt_cuda_dispatch(dt, "geglu_forward", [&](auto tag) {
        using T = decltype(tag);
        const void *ptrs[] = {out, inp};
        pxt_vec_dispatch<T>(pxt_vec_width(sizeof(T), F, ptrs, 2), [&](auto v) {
            constexpr int V = decltype(v)::value;
            const size_t n = (size_t)N * (size_t)(F / V); /* vectors */
            if (n) {
                pxt_geglu_forward_kernel<T, V>
                    <<<pxt_ew_grid(n), PXT_EW_BLOCK, 0, pxt_cuda_stream(index)>>>(
                        (T *)out, (const T *)inp, N, F);
            }
        });
    }));
    PXT_CUDA_CHECK_LAUNCH("geglu_forward");
    return PXT_OK;
}

int pxt_cuda_geglu_backward(int index, void *dinp, const void *inp, const void *dout, int N, int F,
                            pxt_dtype dt) {
    PXT_TRY(check(N, F, "geglu_backward"));
    PXT_CUDA_ENTER(index);
    /* dinp, inp (N, 2F); dout (N, F) */
    PXT_TRY(pxt_cuda_dispatch(dt, "geglu_backward", [&](auto tag) {
        using T = decltype(tag);
        const void *ptrs[] = {dinp, inp, dout};
        pxt_vec_dispatch<T>(pxt_vec_width(sizeof(T), F, ptrs, 3), [&](auto v) {
            constexpr int V = decltype(v)::value;
            const size_t n = (size_t)N * (size_t)(F / V);
            if (n) {
                pxt_geglu_backward_kernel<T, V>
                    <<<pxt_ew_grid(n), PXT_EW_BLOCK, 0, pxt_cuda_stream(index)>>>(
                        (T *)dinp, (const T *)inp, (const T *)dout, N, F);
            }
        });
    }));
    PXT_CUDA_CHECK_LAUNCH("geglu_backward");
    return PXT_OK;
}
