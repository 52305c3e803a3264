/* backend_cuda.cu: the CUDA backend table, entry for entry the CPU's
 * (csrc/cpu/backend_cpu.c), and each device's state: its stream, its cuBLAS
 * and cuBLASLt handles, its pinned staging for copies from host memory.
 *
 * What waits for the device (the sync points): a copy into host memory
 * (PXT_COPY_D2H, and so Tensor.numpy(), `sum`, `grad_sumsq`), `synchronize`,
 * cudaFree (inside empty_cache). Everything else is queued on the device's
 * stream and returns: memsets, device copies, casts, kernels, products, and
 * copies from host memory, which go through pinned staging (see h2d below). */
#include <atomic>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "cuda_common.h"

/* ---- per-device state ----------------------------------------------------------
 * Made once, on the first entry that needs the device, under one lock; never
 * destroyed: at exit the runtime may already be gone, and the driver frees
 * everything with the process. */

/* Pinned staging of host-to-device copies: a ring of STAGE_SLOTS slots of
 * STAGE_SLOT bytes. A copy fills a slot on the host and queues its DMA; the
 * slot's event says when the DMA has read it, and a slot is refilled only
 * after that: so the caller's memory is free at return, and nothing waits
 * unless the ring has come round to a slot still in flight. */
#define STAGE_SLOT ((size_t)1 << 20)
#define STAGE_SLOTS 8

typedef struct {
    cublasHandle_t blas;
    cublasLtHandle_t lt;
    pthread_mutex_t blas_lock; /* the cuBLAS handle's workspace, math mode and call */
    pthread_mutex_t stage_lock;
    char *stage; /* (STAGE_SLOTS * STAGE_SLOT) pinned host bytes, or NULL */
    cudaEvent_t stage_done[STAGE_SLOTS];
    int stage_next;
    cudaEvent_t fences[PXT_FENCES]; /* fence_record / fence_wait */
    int major, minor;               /* compute capability */
} device_state;

cudaStream_t pxt_cuda_streams[PXT_MAX_DEVICES];
static device_state devs[PXT_MAX_DEVICES];
static std::atomic<int> ready[PXT_MAX_DEVICES];
static pthread_mutex_t ready_lock = PTHREAD_MUTEX_INITIALIZER;

/* Stream, handles and staging of the current device (= index). */
static int device_make(int index) {
    device_state *d = &devs[index];
    cudaStream_t stream;
    PXT_CUDA_CHECK(cudaDeviceGetAttribute(&d->major, cudaDevAttrComputeCapabilityMajor, index));
    PXT_CUDA_CHECK(cudaDeviceGetAttribute(&d->minor, cudaDevAttrComputeCapabilityMinor, index));
    PXT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamDefault));
    PXT_CUBLAS_CHECK(cublasCreate(&d->blas)); /* a handle belongs to the current device */
    PXT_CUBLAS_CHECK(cublasSetStream(d->blas, stream));
    PXT_CUBLAS_CHECK(cublasLtCreate(&d->lt));
    pthread_mutex_init(&d->blas_lock, NULL);
    pthread_mutex_init(&d->stage_lock, NULL);
    /* pinned staging is an optimisation: without it, copies from host memory wait */
    if (cudaHostAlloc((void **)&d->stage, STAGE_SLOTS * STAGE_SLOT, cudaHostAllocDefault) !=
        cudaSuccess) {
        (void)cudaGetLastError();
        d->stage = NULL;
    }
    for (int i = 0; d->stage && i < STAGE_SLOTS; i++) {
        PXT_CUDA_CHECK(cudaEventCreateWithFlags(&d->stage_done[i], cudaEventDisableTiming));
    }
    for (int i = 0; i < PXT_FENCES; i++) {
        PXT_CUDA_CHECK(cudaEventCreateWithFlags(&d->fences[i], cudaEventDisableTiming));
    }
    pxt_cuda_streams[index] = stream;
    return PXT_OK;
}

int pxt_cuda_device_ready(int index) {
    if (ready[index].load(std::memory_order_acquire)) {
        return PXT_OK;
    }
    pthread_mutex_lock(&ready_lock);
    int rc = PXT_OK;
    if (!ready[index].load(std::memory_order_relaxed)) {
        rc = device_make(index); /* a failure leaves it unready: the next entry tries again */
        if (rc == PXT_OK) {
            ready[index].store(1, std::memory_order_release);
        }
    }
    pthread_mutex_unlock(&ready_lock);
    return rc;
}

cublasLtHandle_t pxt_cuda_lt(int index) { return devs[index].lt; }

int pxt_cuda_bf16_check(int index, const char *what) {
    const device_state *d = &devs[index];
    if (d->major >= 8) {
        return PXT_OK;
    }
    /* Turing (7.5) has no bfloat16 arithmetic: refuse here, with the way out, rather
     * than leave it to whatever cuBLAS does with a bf16 product there */
    return pxt_error(PXT_ERR_NOT_IMPLEMENTED,
                     "%s: bfloat16 needs a GPU of compute capability 8.0 or newer (Ampere and "
                     "later) and cuda:%d is %d.%d: use float16 (precision='fp16', trained with a "
                     "dynamic loss scale) or float32",
                     what, index, d->major, d->minor);
}

int pxt_cuda_launch_error(const char *what, cudaError_t err) {
    int dev = -1, major = 0, minor = 0;
    const bool no_code =
        err == cudaErrorNoKernelImageForDevice || err == cudaErrorInvalidDeviceFunction;
    if (no_code && cudaGetDevice(&dev) == cudaSuccess &&
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess) {
        /* a card the build has no code for (a Turing card under the default sm_80 / sm_90
         * build): say how to build for it */
        return pxt_error(PXT_ERR_DEVICE,
                         "%s: kernel launch failed: %s: this build of pyxtts has no code for "
                         "cuda:%d (compute capability %d.%d); reinstall it with "
                         "PYXTTS_CUDA_ARCHS=%d%d (docs/install.md; build_info()['cuda_archs'] "
                         "lists what it has)",
                         what, cudaGetErrorString(err), dev, major, minor, major, minor);
    }
    (void)cudaGetLastError(); /* a failed query above must not linger */
    return pxt_error(PXT_ERR_DEVICE, "%s: kernel launch failed: %s", what, cudaGetErrorString(err));
}

pxt_cuda_blas::pxt_cuda_blas(int i) : index(i), h(devs[i].blas) {
    pthread_mutex_lock(&devs[i].blas_lock);
}

pxt_cuda_blas::~pxt_cuda_blas() { pthread_mutex_unlock(&devs[index].blas_lock); }

/* ---- the entries ------------------------------------------------------------------ */

static int cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) { /* no driver or no device: 0 devices */
        (void)cudaGetLastError();
        return 0;
    }
    return n < PXT_MAX_DEVICES ? n : PXT_MAX_DEVICES;
}

static int cuda_device_props(int index, pxt_device_props *out) {
    cudaDeviceProp p;
    PXT_CUDA_CHECK(cudaGetDeviceProperties(&p, index));
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "%s", p.name);
    out->total_memory = p.totalGlobalMem;
    out->major = p.major;
    out->minor = p.minor;
    out->multiprocessors = p.multiProcessorCount;
    return PXT_OK;
}

static int cuda_mem_info(int index, size_t *free_bytes, size_t *total_bytes) {
    PXT_CUDA_ENTER(index);
    PXT_CUDA_CHECK(cudaMemGetInfo(free_bytes, total_bytes));
    return PXT_OK;
}

static int cuda_raw_alloc(int index, size_t nbytes, void **ptr) {
    PXT_CUDA_ENTER(index);
    cudaError_t err = cudaMalloc(ptr, nbytes); /* 256-byte aligned at least */
    if (err == cudaSuccess) {
        return PXT_OK;
    }
    (void)cudaGetLastError(); /* OOM is not sticky: the device stays usable */
    if (err == cudaErrorMemoryAllocation) {
        return pxt_error(PXT_ERR_OOM, "cuda:%d: allocation of %zu bytes failed: out of memory",
                         index, nbytes);
    }
    return pxt_error(PXT_ERR_DEVICE, "cudaMalloc(%zu bytes) on cuda:%d failed: %s", nbytes, index,
                     cudaGetErrorString(err));
}

static void cuda_raw_free(int index, void *ptr) {
    /* nothing to report to: a failure here (e.g. at exit, once the runtime is
     * unloading) must not leave an error behind for the next checked call.
     * cudaFree waits for the device: memory queued work still uses is safe */
    pxt_cuda_scope scope(index);
    if (scope.rc != PXT_OK || cudaFree(ptr) != cudaSuccess) {
        (void)cudaGetLastError();
    }
}

int pxt_cuda_h2d(int index, void *dst, const void *src, size_t n) {
    device_state *d = &devs[index];
    cudaStream_t stream = pxt_cuda_stream(index);
    if (!d->stage || n > STAGE_SLOTS * STAGE_SLOT) {
        /* no staging, or a bulk copy (loading weights) that would only cycle the
         * ring: straight from the caller's memory, waited for so it may be reused */
        PXT_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, stream));
        PXT_CUDA_CHECK(cudaStreamSynchronize(stream));
        return PXT_OK;
    }
    pthread_mutex_lock(&d->stage_lock);
    int rc = PXT_OK;
    for (size_t done = 0; done < n && rc == PXT_OK;) {
        size_t len = n - done < STAGE_SLOT ? n - done : STAGE_SLOT;
        int slot = d->stage_next;
        d->stage_next = (slot + 1) % STAGE_SLOTS;
        char *buf = d->stage + (size_t)slot * STAGE_SLOT;
        cudaError_t err = cudaEventSynchronize(d->stage_done[slot]); /* its last DMA has read it */
        if (err == cudaSuccess) {
            memcpy(buf, (const char *)src + done, len);
            err = cudaMemcpyAsync((char *)dst + done, buf, len, cudaMemcpyHostToDevice, stream);
        }
        if (err == cudaSuccess) {
            err = cudaEventRecord(d->stage_done[slot], stream);
        }
        if (err != cudaSuccess) {
            (void)cudaGetLastError();
            rc = pxt_error(PXT_ERR_DEVICE, "copy to cuda:%d through pinned staging failed: %s",
                           index, cudaGetErrorString(err));
        }
        done += len;
    }
    pthread_mutex_unlock(&d->stage_lock);
    return rc;
}

static int cuda_copy(int index, void *dst, const void *src, size_t nbytes, pxt_copy_kind kind) {
    if (nbytes == 0) {
        return PXT_OK;
    }
    PXT_CUDA_ENTER(index);
    cudaStream_t stream = pxt_cuda_stream(index);
    switch (kind) {
    case PXT_COPY_H2D: return pxt_cuda_h2d(index, dst, src, nbytes);
    case PXT_COPY_D2H: /* into host memory: the caller reads it next, so wait */
        PXT_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToHost, stream));
        PXT_CUDA_CHECK(cudaStreamSynchronize(stream));
        return PXT_OK;
    default: /* ordered on the stream like any kernel */
        PXT_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, stream));
        return PXT_OK;
    }
}

/* ---- host memory for transfers, queued copies, fences ------------------------------ */

static int cuda_host_alloc(int index, size_t nbytes, void **ptr, int *pinned) {
    PXT_CUDA_ENTER(index); /* the context the pages are locked under: the caller's device */
    cudaError_t err = cudaHostAlloc(ptr, nbytes, cudaHostAllocPortable);
    if (err == cudaSuccess) {
        *pinned = 1;
        return PXT_OK;
    }
    (void)cudaGetLastError();
    *ptr = NULL;
    if (err == cudaErrorMemoryAllocation) {
        return pxt_error(PXT_ERR_OOM, "page-locked host allocation of %zu bytes failed", nbytes);
    }
    return pxt_error(PXT_ERR_DEVICE, "cudaHostAlloc(%zu bytes) under cuda:%d failed: %s", nbytes,
                     index, cudaGetErrorString(err));
}

static void cuda_host_free(int index, void *ptr) {
    pxt_cuda_scope scope(index); /* waits for the copies still reading or writing it */
    if (scope.rc != PXT_OK || cudaFreeHost(ptr) != cudaSuccess) {
        (void)cudaGetLastError();
    }
}

static int cuda_copy_async(int index, void *dst, const void *src, size_t nbytes,
                           pxt_copy_kind kind) {
    if (nbytes == 0) {
        return PXT_OK;
    }
    PXT_CUDA_ENTER(index);
    cudaMemcpyKind k = kind == PXT_COPY_H2D   ? cudaMemcpyHostToDevice
                       : kind == PXT_COPY_D2H ? cudaMemcpyDeviceToHost
                                              : cudaMemcpyDeviceToDevice;
    PXT_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, k, pxt_cuda_stream(index)));
    return PXT_OK;
}

static int fence_check(int f) {
    if (f < 0 || f >= PXT_FENCES) {
        return pxt_error(PXT_ERR_VALUE, "fence %d out of range [0, %d)", f, PXT_FENCES);
    }
    return PXT_OK;
}

static int cuda_fence_record(int index, int f) {
    PXT_TRY(fence_check(f));
    PXT_CUDA_ENTER(index);
    PXT_CUDA_CHECK(cudaEventRecord(devs[index].fences[f], pxt_cuda_stream(index)));
    return PXT_OK;
}

static int cuda_fence_wait(int index, int f) {
    PXT_TRY(fence_check(f));
    PXT_CUDA_ENTER(index);
    PXT_CUDA_CHECK(cudaEventSynchronize(devs[index].fences[f]));
    return PXT_OK;
}

static int cuda_memset_zero(int index, void *dst, size_t nbytes) {
    if (nbytes == 0) {
        return PXT_OK;
    }
    PXT_CUDA_ENTER(index);
    PXT_CUDA_CHECK(cudaMemsetAsync(dst, 0, nbytes, pxt_cuda_stream(index)));
    return PXT_OK;
}

static int cuda_synchronize(int index) {
    PXT_CUDA_ENTER(index);
    PXT_CUDA_CHECK(cudaDeviceSynchronize());
    return PXT_OK;
}

/* ---- the table ------------------------------------------------------------------- */
/* designated initializers (C++20): the kernels this backend lacks stay NULL */
/* "13.0" from 13000: CUDA's version numbers are 1000 * major + 10 * minor. */
static void cuda_version_str(int v, char *buf, size_t len) {
    if (v > 0) {
        snprintf(buf, len, "%d.%d", v / 1000, (v % 1000) / 10);
    } else {
        buf[0] = '\0';
    }
}

static void cuda_info(pxt_backend_info *out) {
    memset(out, 0, sizeof *out);
    int runtime = 0, driver = 0, major = 0, minor = 0, patch = 0;
    if (cudaRuntimeGetVersion(&runtime) != cudaSuccess) {
        (void)cudaGetLastError();
        runtime = 0;
    }
    if (cudaDriverGetVersion(&driver) != cudaSuccess) { /* 0 when no driver */
        (void)cudaGetLastError();
        driver = 0;
    }
    cuda_version_str(runtime, out->runtime, sizeof out->runtime);
    cuda_version_str(driver, out->driver, sizeof out->driver);
    if (cublasGetProperty(MAJOR_VERSION, &major) == CUBLAS_STATUS_SUCCESS &&
        cublasGetProperty(MINOR_VERSION, &minor) == CUBLAS_STATUS_SUCCESS &&
        cublasGetProperty(PATCH_LEVEL, &patch) == CUBLAS_STATUS_SUCCESS) {
        snprintf(out->library, sizeof out->library, "%d.%d.%d", major, minor, patch);
    }
}

static const pxt_backend cuda_backend = {
    .name = "cuda",
    .info = cuda_info,
    .device_count = cuda_device_count,
    .device_props = cuda_device_props,
    .mem_info = cuda_mem_info,
    .raw_alloc = cuda_raw_alloc,
    .raw_free = cuda_raw_free,
    .copy = cuda_copy,
    .memset_zero = cuda_memset_zero,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .copy_async = cuda_copy_async,
    .fence_record = cuda_fence_record,
    .fence_wait = cuda_fence_wait,
    .cast = pxt_cuda_cast,
    .synchronize = cuda_synchronize,
    .graph_begin = pxt_cuda_graph_begin,
    .graph_end = pxt_cuda_graph_end,
    .graph_abort = pxt_cuda_graph_abort,
    .graph_launch = pxt_cuda_graph_launch,
    .graph_free = pxt_cuda_graph_free,
    .gemm = pxt_cuda_gemm,
    .gemm_ld = pxt_cuda_gemm_ld,
    .gemm_workspace = pxt_cuda_gemm_workspace,
    .add_bias = pxt_cuda_add_bias,
    .bias_backward = pxt_cuda_bias_backward,
    .colsum_workspace = pxt_cuda_colsum_workspace,
    .gemm_fused = pxt_cuda_gemm_fused,
    .gemm_fused_workspace = pxt_cuda_gemm_fused_workspace,
    .layernorm_forward = pxt_cuda_layernorm_forward,
    .layernorm_backward = pxt_cuda_layernorm_backward,
    .gelu_forward = pxt_cuda_gelu_forward,
    .gelu_backward = pxt_cuda_gelu_backward,
    .add = pxt_cuda_add,
    .embedding_forward = pxt_cuda_embedding_forward,
    .embedding_backward = pxt_cuda_embedding_backward,
    .embedding_workspace = pxt_cuda_embedding_workspace,
    .softmax_xent = pxt_cuda_softmax_xent,
    .sum = pxt_cuda_sum,
    .attention_forward = pxt_cuda_attention_forward,
    .attention_backward = pxt_cuda_attention_backward,
    .attention_workspace = pxt_cuda_attention_workspace,
    .attention_dropout = 1, /* both attention paths draw dropout.h's masks */
    .dropout_forward = pxt_cuda_dropout_forward,
    .dropout_backward = pxt_cuda_dropout_backward,
    .groupnorm_forward = pxt_cuda_groupnorm_forward,
    .groupnorm_backward = pxt_cuda_groupnorm_backward,
    .rmsnorm_forward = pxt_cuda_rmsnorm_forward,
    .rmsnorm_backward = pxt_cuda_rmsnorm_backward,
    .geglu_forward = pxt_cuda_geglu_forward,
    .geglu_backward = pxt_cuda_geglu_backward,
    .grad_sumsq = pxt_cuda_grad_sumsq,
    .adamw = pxt_cuda_adamw,
    .swap = pxt_cuda_swap,
};

const pxt_backend *pxt_cuda_backend(void) { return &cuda_backend; }

#undef STAGE_SLOT
#undef STAGE_SLOTS
