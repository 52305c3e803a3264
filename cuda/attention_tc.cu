/* attention_tc.cu: exact attention on the tensor cores (FlashAttention-2 style)
 * for 16-bit inputs, forward and backward. cuda/attention.cu is the general
 * fallback (fp32 on the CUDA cores, any D <= 128) and the entry point: it asks
 * pxt_cuda_attention_tc_select whether this path runs and calls it.
 *
 * When it runs (pxt_tc_why_not, attention_tc_plan.h): dt is bfloat16 or float16, D
 * is 64 or 128, every pointer is 16-byte aligned and every stride a multiple of 8
 * elements (16-byte cp.async rows), scale * log2(e) is finite in float (scale <=
 * 2.36e38), the device is sm_80 or newer (and this build has sm_80+ code for it),
 * and the device's per-block shared-memory limit (its opt-in attribute, not its
 * architecture number) holds the kernels of that D.
 * The environment variable PYXTTS_CUDA_ATTENTION, read once per process:
 *   unset / "" / "auto"  the tensor-core path where eligible, else the fallback
 *   "simple"             always the fallback (A/B, or to rule this path out)
 *   "tc"                 the tensor-core path; a call it cannot take fails with
 *                        NotImplementedError (so a test knows which path ran)
 * pxt_cuda_attention_last_path() says which path the last call took.
 *
 * The tensor-core backward has two schedules, chosen by PYXTTS_CUDA_ATTENTION_BWD (read
 * once per process):
 *   unset / "" / "two-kernel"  the dK/dV kernel and the dQ kernel (7 products per tile
 *                              pair; the schedule the GPU runs have verified)
 *   "one-pass"                 FlashAttention-2's deterministic one: one kernel, 5
 *                              products, dQ through per-split fp32 partials in the
 *                              workspace and their reduction in a fixed order
 * Both are deterministic; their dQ differ in the order of fp32 sums (within the path's
 * stated tolerance), dK and dV are the same bits.
 *
 * The kernels, their arithmetic and their launches are in attention_tc.cuh; this
 * file is the switch, the eligibility check and the dispatch to the instances. */
#include <atomic>
#include <mutex>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attention.cuh"
#include "attention_tc_plan.h"

/* ---- host: the switch, eligibility, launches ---------------------------------------- */

static std::atomic<int> tc_last{-1};

/* per device, made once: 0 not yet, 1 made (tc_dev holds it) */
static std::atomic<int> tc_dev_made[PXT_MAX_DEVICES];
static pxt_tc_device tc_dev[PXT_MAX_DEVICES];
static std::mutex tc_dev_lock;

/* the most static shared memory of the four instances' kernels; *fa the bf16 D = 64
 * forward's attributes (which code of the kernels runs here) */
static cudaError_t instances(cudaFuncAttributes *fa, size_t *static_smem) {
    cudaFuncAttributes other;
    size_t s[4] = {0, 0, 0, 0};
    cudaError_t e = attn_tc_attributes<pxt_bf16, 64>(fa, &s[0]);
    e = e == cudaSuccess ? attn_tc_attributes<pxt_bf16, 128>(&other, &s[1]) : e;
    e = e == cudaSuccess ? attn_tc_attributes<pxt_f16, 64>(&other, &s[2]) : e;
    e = e == cudaSuccess ? attn_tc_attributes<pxt_f16, 128>(&other, &s[3]) : e;
    *static_smem = s[0];
    for (int i = 1; i < 4; i++) {
        *static_smem = s[i] > *static_smem ? s[i] : *static_smem;
    }
    return e;
}

/* What the decision needs of device `index` (current): sm_80+ with this binary's
 * sm_80+ code of the kernels there (a build for sm_75 alone, SASS or PTX compiled
 * for the device, has the trapping bodies, and its ptxVersion says so), its per-block
 * opt-in shared memory and the kernels' static shared memory. A failed query is not
 * kept (the next call asks again) and counts as no tensor-core path. */
static pxt_tc_device device_caps(int index) {
    pxt_tc_device none = {0, 0, 0, 0};
    if (index < 0 || index >= PXT_MAX_DEVICES) {
        return none;
    }
    if (tc_dev_made[index].load(std::memory_order_acquire)) {
        return tc_dev[index];
    }
    std::lock_guard<std::mutex> hold(tc_dev_lock);
    if (tc_dev_made[index].load(std::memory_order_relaxed)) {
        return tc_dev[index];
    }
    int major = 0, optin = 0;
    cudaFuncAttributes fa;
    pxt_tc_device d = {0, 0, 0, pxt_cuda_attention_bwd_mode() == PXT_TC_BWD_ONE};
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, index) != cudaSuccess ||
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, index) !=
            cudaSuccess ||
        instances(&fa, &d.smem_static) != cudaSuccess) {
        (void)cudaGetLastError();
        return none;
    }
    d.sm80 = major >= 8 && fa.binaryVersion >= 80 && fa.ptxVersion >= 80;
    d.smem_optin = (size_t)optin;
    tc_dev[index] = d;
    tc_dev_made[index].store(1, std::memory_order_release);
    return d;
}

extern "C" int pxt_cuda_attention_tc_select(int index, const pxt_attn_args *a,
                                            const void *const *ptrs, int nptrs, int *use_tc) {
    *use_tc = 0;
    const int mode = pxt_cuda_attention_mode();
    if (mode == PXT_TC_MODE_BAD) {
        return pxt_error(PXT_ERR_VALUE, "PYXTTS_CUDA_ATTENTION=%s: expected simple, tc or auto",
                         getenv("PYXTTS_CUDA_ATTENTION"));
    }
    if (mode == PXT_TC_MODE_SIMPLE) {
        tc_last.store(0, std::memory_order_relaxed);
        return PXT_OK;
    }
    const pxt_tc_device dev = device_caps(index);
    char buf[160];
    const char *why = pxt_tc_why_not(a, ptrs, nptrs, &dev, buf, sizeof buf);
    if (why && mode == PXT_TC_MODE_TC) {
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

/* Di (B, H, Tq) is already in the workspace (attention.cu's kernel); extra: the workspace
 * after it, what sizes.c counts for the one-pass dQ partials (pxt_tc_split_bytes) */
extern "C" int pxt_cuda_attention_tc_backward(int index, const pxt_attn_args *a, void *dq, void *dk,
                                              void *dv, const void *dout, const void *q,
                                              const void *k, const void *v, const float *lse,
                                              const float *Di, void *extra) {
    const int bwd = pxt_cuda_attention_bwd_mode();
    if (bwd == PXT_TC_BWD_BAD) {
        return pxt_error(PXT_ERR_VALUE,
                         "PYXTTS_CUDA_ATTENTION_BWD=%s: expected two-kernel or one-pass",
                         getenv("PYXTTS_CUDA_ATTENTION_BWD"));
    }
    float *dqp = bwd == PXT_TC_BWD_ONE ? (float *)extra : NULL;
    cudaStream_t stream = pxt_cuda_stream(index);
    if (a->dt == PXT_BFLOAT16) {
        return a->D == 64 ? attn_tc_bwd_launch<pxt_bf16, 64>(a, dq, dk, dv, dout, q, k, v, lse, Di,
                                                             dqp, stream)
                          : attn_tc_bwd_launch<pxt_bf16, 128>(a, dq, dk, dv, dout, q, k, v, lse, Di,
                                                              dqp, stream);
    }
    return a->D == 64
               ? attn_tc_bwd_launch<pxt_f16, 64>(a, dq, dk, dv, dout, q, k, v, lse, Di, dqp, stream)
               : attn_tc_bwd_launch<pxt_f16, 128>(a, dq, dk, dv, dout, q, k, v, lse, Di, dqp,
                                                  stream);
}
