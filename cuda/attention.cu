/* attention.cu: the entry points of exact attention on the GPU (backend.h's
 * attention_forward / attention_backward / attention_workspace). The general
 * kernels (fp32 arithmetic on the CUDA cores, any D <= 128) are described in
 * attention_simple.cuh; bfloat16 / float16 with D = 64 or 128 on sm_80+, where the
 * device's shared memory per block holds them (attention_tc_plan.h), go to the
 * tensor-core kernels of attention_tc.cuh instead (the entries below ask
 * attention_tc.cu; the switch PYXTTS_CUDA_ATTENTION=simple|tc|auto is described
 * there). Each kernel instance is compiled in its own file under cuda/attention/. */
#include "attention.cuh"
#include "vec.cuh"

/* ---- backward: Di = rowsum(dO * O) ---------------------------------------------------- */

/* Di (B, H, Tq): a warp per row, 0 past q_length; a fixed butterfly */
template <typename T>
__global__ static void attn_di_kernel(pxt_attn_args a, float *Di, const T *dout, const T *out) {
    const int64_t rows = (int64_t)a.B * a.H * a.Tq;
    const int64_t row = (int64_t)blockIdx.x * (ATTN_THREADS / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) {
        return;
    }
    const int bh = (int)(row / a.Tq), i = (int)(row % a.Tq), b = bh / a.H, h = bh % a.H;
    float acc = 0.0f;
    if (i < q_len(a, b)) {
        const T *dO = row_ptr(dout, a.o, b, h, i), *O = row_ptr(out, a.o, b, h, i);
        for (int d = lane; d < a.D; d += 32) {
            acc = fmaf(ldf(dO[d]), ldf(O[d]), acc);
        }
    }
    for (int s = 16; s > 0; s >>= 1) {
        acc += __shfl_xor_sync(0xffffffffu, acc, s);
    }
    if (lane == 0) {
        Di[row] = acc;
    }
}

/* Di as above, 16 bytes a lane (a warp per row read 4 bytes a lane of a 128-byte row): a
 * row is L = D / 8 lanes, a warp 32 / L rows; a lane's 8 products in order, then a fixed
 * butterfly over the row's lanes. For D = 64, 128 with rows 16-byte aligned (di8_fits). */
template <typename T, int D>
__global__ static void attn_di8_kernel(pxt_attn_args a, float *Di, const T *dout, const T *out) {
    constexpr int L = D / 8, RW = 32 / L;
    const int64_t rows = (int64_t)a.B * a.H * a.Tq;
    const int lane = threadIdx.x % 32;
    const int64_t row =
        ((int64_t)blockIdx.x * (ATTN_THREADS / 32) + threadIdx.x / 32) * RW + lane / L;
    float acc = 0.0f;
    if (row < rows) { /* every lane reaches the shuffles below */
        const int bh = (int)(row / a.Tq), i = (int)(row % a.Tq), b = bh / a.H, h = bh % a.H;
        if (i < q_len(a, b)) {
            const int d0 = (lane % L) * 8;
            float x[8], y[8];
            pxt_vload<T, 8>(x, row_ptr(dout, a.o, b, h, i) + d0);
            pxt_vload<T, 8>(y, row_ptr(out, a.o, b, h, i) + d0);
#pragma unroll
            for (int k = 0; k < 8; k++) {
                acc = fmaf(x[k], y[k], acc);
            }
        }
    }
#pragma unroll
    for (int s = L / 2; s > 0; s >>= 1) {
        acc += __shfl_xor_sync(0xffffffffu, acc, s);
    }
    if (row < rows && lane % L == 0) {
        Di[row] = acc;
    }
}

/* whether attn_di8_kernel takes these arguments: D 64 or 128, 16-bit, the o layout's
 * strides multiples of 8 elements and both pointers 16-byte aligned */
static inline bool di8_fits(const pxt_attn_args *a, const void *dout, const void *out) {
    return (a->D == 64 || a->D == 128) && (a->dt == PXT_BFLOAT16 || a->dt == PXT_FLOAT16) &&
           a->o.b % 8 == 0 && a->o.h % 8 == 0 && a->o.t % 8 == 0 && (uintptr_t)dout % 16 == 0 &&
           (uintptr_t)out % 16 == 0;
}

/* ---- the table entries ------------------------------------------------------------------- */

static int check_args(const pxt_attn_args *a) {
    if (!a) {
        return pxt_error(PXT_ERR_VALUE, "attention: no arguments");
    }
    if (a->B < 0 || a->H < 0 || a->Tq < 0 || a->Tk < 0 || a->D < 1) {
        return pxt_error(PXT_ERR_VALUE,
                         "attention: expected B, H, Tq, Tk >= 0 and D >= 1, got B=%d H=%d Tq=%d "
                         "Tk=%d D=%d",
                         a->B, a->H, a->Tq, a->Tk, a->D);
    }
    if (a->D > 128) {
        return pxt_error(PXT_ERR_NOT_IMPLEMENTED,
                         "attention: head dim D=%d: the CUDA kernels support D <= 128", a->D);
    }
    if (a->dt != PXT_FLOAT32 && a->dt != PXT_FLOAT16 && a->dt != PXT_BFLOAT16) {
        return pxt_error(PXT_ERR_TYPE,
                         "attention: expected dtype float32, float16 or bfloat16, got %s",
                         pxt_dtype_name(a->dt));
    }
    if (!(a->drop.p >= 0.0f && a->drop.p < 1.0f)) {
        return pxt_error(PXT_ERR_VALUE, "attention: dropout probability must be in [0, 1), got %g",
                         (double)a->drop.p);
    }
    return PXT_OK;
}

int pxt_cuda_attention_forward(int index, const pxt_attn_args *a, void *out, float *lse,
                               const void *q, const void *k, const void *v, void *workspace) {
    (void)workspace; /* the forward needs none */
    PXT_TRY(check_args(a));
    const int nqb = (a->Tq + FWD_BR - 1) / FWD_BR;
    unsigned int grid = 0;
    PXT_TRY(attn_grid(a, nqb, &grid));
    if (grid == 0) {
        return PXT_OK;
    }
    PXT_CUDA_ENTER(index);
    const void *ptrs[] = {out, q, k, v};
    int use_tc = 0; /* attention_tc.cu: 16-bit, D = 64 / 128, sm_80+ (PYXTTS_CUDA_ATTENTION) */
    PXT_TRY(pxt_cuda_attention_tc_select(index, a, ptrs, 4, &use_tc));
    if (use_tc) {
        return pxt_cuda_attention_tc_forward(index, a, out, lse, q, k, v);
    }
    cudaStream_t stream = pxt_cuda_stream(index);
    PXT_TRY(pxt_cuda_dispatch(a->dt, "attention_forward", [&](auto tag) {
        using T = decltype(tag);
        if (a->D <= 64) {
            attn_fwd_launch<T, 64>(grid, stream, *a, (T *)out, lse, (const T *)q, (const T *)k,
                                   (const T *)v, nqb);
        } else {
            attn_fwd_launch<T, 128>(grid, stream, *a, (T *)out, lse, (const T *)q, (const T *)k,
                                    (const T *)v, nqb);
        }
    }));
    PXT_CUDA_CHECK_LAUNCH("attention_forward");
    return PXT_OK;
}

int pxt_cuda_attention_backward(int index, const pxt_attn_args *a, void *dq, void *dk, void *dv,
                                const void *dout, const void *q, const void *k, const void *v,
                                const void *out, const float *lse, void *workspace) {
    PXT_TRY(check_args(a));
    const int nqb = (a->Tq + DQ_BR - 1) / DQ_BR, nkb = (a->Tk + KV_BC - 1) / KV_BC;
    unsigned int qgrid = 0, kgrid = 0;
    PXT_TRY(attn_grid(a, nqb, &qgrid));
    PXT_TRY(attn_grid(a, nkb, &kgrid));
    if (qgrid + kgrid == 0) {
        return PXT_OK;
    }
    if (!workspace) {
        return pxt_error(PXT_ERR_VALUE, "attention_backward: no workspace (attention_workspace "
                                        "bytes), got NULL");
    }
    PXT_CUDA_ENTER(index);
    cudaStream_t stream = pxt_cuda_stream(index);
    float *Di = (float *)(((uintptr_t)workspace + 255) & ~(uintptr_t)255); /* (B, H, Tq) */
    const int64_t rows = (int64_t)a->B * a->H * a->Tq;
    const bool di8 = di8_fits(a, dout, out);
    /* rows a block: a warp per row, or 32 / (D / 8) a warp (attn_di8_kernel) */
    const int64_t per = ATTN_THREADS / 32 * (di8 ? 256 / a->D : 1);
    const unsigned int dgrid = (unsigned int)((rows + per - 1) / per);
    PXT_TRY(pxt_cuda_dispatch(a->dt, "attention_backward", [&](auto tag) {
        using T = decltype(tag);
        if (!dgrid) {
            return;
        }
        if constexpr (!std::is_same_v<T, float>) {
            if (di8) {
                if (a->D == 64) {
                    attn_di8_kernel<T, 64><<<dgrid, ATTN_THREADS, 0, stream>>>(
                        *a, Di, (const T *)dout, (const T *)out);
                } else {
                    attn_di8_kernel<T, 128><<<dgrid, ATTN_THREADS, 0, stream>>>(
                        *a, Di, (const T *)dout, (const T *)out);
                }
                return;
            }
        }
        attn_di_kernel<T>
            <<<dgrid, ATTN_THREADS, 0, stream>>>(*a, Di, (const T *)dout, (const T *)out);
    }));
    PXT_CUDA_CHECK_LAUNCH("attention_backward (Di)");
    const void *ptrs[] = {dq, dk, dv, dout, q, k, v};
    int use_tc = 0; /* the tensor-core kernels read the same Di */
    PXT_TRY(pxt_cuda_attention_tc_select(index, a, ptrs, 7, &use_tc));
    if (use_tc) {
        return pxt_cuda_attention_tc_backward(index, a, dq, dk, dv, dout, q, k, v, lse, Di,
                                              (char *)Di + pxt_cuda_attention_di_bytes(a));
    }
    PXT_TRY(pxt_cuda_dispatch(a->dt, "attention_backward", [&](auto tag) {
        using T = decltype(tag);
        if (!kgrid) {
            return;
        }
        if (a->D <= 64) {
            attn_bwd_kv_launch<T, 64>(kgrid, stream, *a, (T *)dk, (T *)dv, (const T *)dout,
                                      (const T *)q, (const T *)k, (const T *)v, lse, Di, nkb);
        } else {
            attn_bwd_kv_launch<T, 128>(kgrid, stream, *a, (T *)dk, (T *)dv, (const T *)dout,
                                       (const T *)q, (const T *)k, (const T *)v, lse, Di, nkb);
        }
    }));
    PXT_CUDA_CHECK_LAUNCH("attention_backward (dk, dv)");
    PXT_TRY(pxt_cuda_dispatch(a->dt, "attention_backward", [&](auto tag) {
        using T = decltype(tag);
        if (!qgrid) {
            return;
        }
        if (a->D <= 64) {
            attn_bwd_q_launch<T, 64>(qgrid, stream, *a, (T *)dq, (const T *)dout, (const T *)q,
                                     (const T *)k, (const T *)v, lse, Di, nqb);
        } else {
            attn_bwd_q_launch<T, 128>(qgrid, stream, *a, (T *)dq, (const T *)dout, (const T *)q,
                                      (const T *)k, (const T *)v, lse, Di, nqb);
        }
    }));
    PXT_CUDA_CHECK_LAUNCH("attention_backward (dq)");
    return PXT_OK;
}
