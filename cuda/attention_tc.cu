/* attention_tc.cu: exact attention on the tensor cores (FlashAttention-2 style)
 * for 16-bit inputs, forward and backward. cuda/attention.cu is the general
 * fallback (fp32 on the CUDA cores, any D <= 128) and the entry point: it asks
 * pxt_cuda_attention_tc_select whether this path runs and calls it.
 *
 * When it runs: dt is bfloat16 or float16, D is 64 or 128, the device is sm_80
 * or newer (and this build has sm_80+ code for it), every pointer is 16-byte
 * aligned and every stride a multiple of 8 elements (16-byte cp.async rows), and
 * scale * log2(e) is finite in float (scale <= 2.36e38).
 * The environment variable PYXTTS_CUDA_ATTENTION, read once per process:
 *   unset / "" / "auto"  the tensor-core path where eligible, else the fallback
 *   "simple"             always the fallback (A/B, or to rule this path out)
 *   "tc"                 the tensor-core path; a call it cannot take fails with
 *                        NotImplementedError (so a test knows which path ran)
 * pxt_cuda_attention_last_path() says which path the last call took.
 *
 * The kernels, their arithmetic and their launches are in attention_tc.cuh; this
 * file is the switch, the eligibility check and the dispatch to the instances. */
#include <atomic>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attention.cuh"

/* ---- host: the switch, eligibility, launches ---------------------------------------- */

enum {
    TC_MODE_UNREAD = -2,
    TC_MODE_BAD = -1,
    TC_MODE_AUTO = 0,
    TC_MODE_SIMPLE = 1,
    TC_MODE_TC = 2
};
static std::atomic<int> tc_mode{TC_MODE_UNREAD};
static std::atomic<int> tc_last{-1};
/* per device: 0 not checked yet, 1 no tensor-core path, 2 yes */
static std::atomic<int> tc_device_ok[PXT_MAX_DEVICES];

static int read_mode(void) {
    int m = tc_mode.load(std::memory_order_relaxed);
    if (m != TC_MODE_UNREAD) {
        return m;
    }
    const char *s = getenv("PYXTTS_CUDA_ATTENTION"); /* read once: a racing reader agrees */
    m = !s || !*s || !strcmp(s, "auto") ? TC_MODE_AUTO
        : !strcmp(s, "simple")          ? TC_MODE_SIMPLE
        : !strcmp(s, "tc")              ? TC_MODE_TC
                                        : TC_MODE_BAD;
    tc_mode.store(m, std::memory_order_relaxed);
    return m;
}

/* sm_80+ and this binary runs sm_80+ code of the kernels there: a build for
 * sm_75 alone (SASS or PTX JIT-compiled for the device) has the trapping
 * bodies, and its ptxVersion says so */
static int device_ok(int index) {
    if (index < 0 || index >= PXT_MAX_DEVICES) {
        return 0;
    }
    int ok = tc_device_ok[index].load(std::memory_order_relaxed);
    if (ok) {
        return ok == 2;
    }
    int major = 0;
    cudaFuncAttributes fa;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, index) != cudaSuccess ||
        attn_tc_fwd_attributes<pxt_bf16, 64>(&fa) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0; /* not cached: the next call asks again */
    }
    ok = major >= 8 && fa.binaryVersion >= 80 && fa.ptxVersion >= 80 ? 2 : 1;
    tc_device_ok[index].store(ok, std::memory_order_relaxed);
    return ok == 2;
}

static bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }
static bool strides8(const pxt_strides &s) { return s.b % 8 == 0 && s.h % 8 == 0 && s.t % 8 == 0; }

extern "C" int pxt_cuda_attention_tc_select(int index, const pxt_attn_args *a,
                                            const void *const *ptrs, int nptrs, int *use_tc) {
    *use_tc = 0;
    const int mode = read_mode();
    if (mode == TC_MODE_BAD) {
        return pxt_error(PXT_ERR_VALUE, "PYXTTS_CUDA_ATTENTION=%s: expected simple, tc or auto",
                         getenv("PYXTTS_CUDA_ATTENTION"));
    }
    if (mode == TC_MODE_SIMPLE) {
        tc_last.store(0, std::memory_order_relaxed);
        return PXT_OK;
    }
    const char *why = NULL;
    if (a->dt != PXT_BFLOAT16 && a->dt != PXT_FLOAT16) {
        why = "the dtype is not bfloat16 or float16";
    } else if (a->D != 64 && a->D != 128) {
        why = "the head dim is not 64 or 128";
    } else if (!strides8(a->q) || !strides8(a->k) || !strides8(a->v) || !strides8(a->o)) {
        why = "a stride is not a multiple of 8 elements";
    } else if (!isfinite(a->scale * 1.4426950408889634f)) {
        /* the kernels score in base 2 (TC_LOG2E, attention_tc.cuh): a scale past
         * FLT_MAX / log2 e = 2.36e38 makes scale * log2 e inf, and a score the fallback
         * keeps finite (s * scale in range) would be inf or NaN there */
        why = "scale * log2(e) overflows float (scale > 2.36e38)";
    }
    for (int i = 0; !why && i < nptrs; i++) {
        if (!aligned16(ptrs[i])) {
            why = "a pointer is not 16-byte aligned";
        }
    }
    if (!why && !device_ok(index)) {
        why = "the device is older than sm_80 (or this build has no sm_80+ code for it)";
    }
    if (why && mode == TC_MODE_TC) {
        return pxt_error(PXT_ERR_NOT_IMPLEMENTED,
                         "attention: PYXTTS_CUDA_ATTENTION=tc but the tensor-core path cannot "
                         "run: %s (dt=%s, D=%d)",
                         why, pxt_dtype_name(a->dt), a->D);
    }
    *use_tc = !why;
    tc_last.store(*use_tc, std::memory_order_relaxed);
    return PXT_OK;
}

extern "C" int pxt_cuda_attention_last_path(void) {
    return tc_last.load(std::memory_order_relaxed);
}

/* the caller (attention.cu) checked the arguments, chose this path and set the device */
extern "C" int pxt_cuda_attention_tc_forward(int index, const pxt_attn_args *a, void *out,
                                             float *lse, const void *q, const void *k,
                                             const void *v) {
    cudaStream_t stream = pxt_cuda_stream(index);
    if (a->dt == PXT_BFLOAT16) {
        return a->D == 64 ? attn_tc_fwd_launch<pxt_bf16, 64>(a, out, lse, q, k, v, stream)
                          : attn_tc_fwd_launch<pxt_bf16, 128>(a, out, lse, q, k, v, stream);
    }
    return a->D == 64 ? attn_tc_fwd_launch<pxt_f16, 64>(a, out, lse, q, k, v, stream)
                      : attn_tc_fwd_launch<pxt_f16, 128>(a, out, lse, q, k, v, stream);
}

/* Di (B, H, Tq) is already in the workspace (attention.cu's kernel) */
extern "C" int pxt_cuda_attention_tc_backward(int index, const pxt_attn_args *a, void *dq, void *dk,
                                              void *dv, const void *dout, const void *q,
                                              const void *k, const void *v, const float *lse,
                                              const float *Di) {
    cudaStream_t stream = pxt_cuda_stream(index);
    if (a->dt == PXT_BFLOAT16) {
        return a->D == 64
                   ? attn_tc_bwd_launch<pxt_bf16, 64>(a, dq, dk, dv, dout, q, k, v, lse, Di, stream)
                   : attn_tc_bwd_launch<pxt_bf16, 128>(a, dq, dk, dv, dout, q, k, v, lse, Di,
                                                       stream);
    }
    return a->D == 64
               ? attn_tc_bwd_launch<pxt_f16, 64>(a, dq, dk, dv, dout, q, k, v, lse, Di, stream)
               : attn_tc_bwd_launch<pxt_f16, 128>(a, dq, dk, dv, dout, q, k, v, lse, Di, stream);
}
