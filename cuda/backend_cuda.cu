/* backend_cuda.cu: the CUDA backend table, entry for entry the CPU's
 * (csrc/cpu/backend_cpu.c). Every call is queued on pxt_cuda_stream(index)
 * and, where backend.h says the work finishes before return, waited for. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "cuda_common.h"

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
    PXT_CUDA_CHECK(cudaSetDevice(index));
    PXT_CUDA_CHECK(cudaMemGetInfo(free_bytes, total_bytes));
    return PXT_OK;
}

static int cuda_raw_alloc(int index, size_t nbytes, void **ptr) {
    PXT_CUDA_CHECK(cudaSetDevice(index));
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
     * unloading) must not leave an error behind for the next checked call */
    if (cudaSetDevice(index) != cudaSuccess || cudaFree(ptr) != cudaSuccess) {
        (void)cudaGetLastError();
    }
}

static int cuda_copy(int index, void *dst, const void *src, size_t nbytes, pxt_copy_kind kind) {
    if (nbytes == 0) {
        return PXT_OK;
    }
    cudaMemcpyKind k = kind == PXT_COPY_H2D   ? cudaMemcpyHostToDevice
                       : kind == PXT_COPY_D2H ? cudaMemcpyDeviceToHost
                                              : cudaMemcpyDeviceToDevice;
    PXT_CUDA_CHECK(cudaSetDevice(index));
    /* async + sync rather than cudaMemcpy: cudaMemcpy returns before a D2D
     * copy (or a pageable H2D DMA) is done, and the stream is the one place
     * that orders it after queued kernels once streams are per device */
    cudaStream_t stream = pxt_cuda_stream(index);
    PXT_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, k, stream));
    PXT_CUDA_CHECK(cudaStreamSynchronize(stream));
    return PXT_OK;
}

static int cuda_memset_zero(int index, void *dst, size_t nbytes) {
    if (nbytes == 0) {
        return PXT_OK;
    }
    PXT_CUDA_CHECK(cudaSetDevice(index));
    cudaStream_t stream = pxt_cuda_stream(index);
    PXT_CUDA_CHECK(cudaMemsetAsync(dst, 0, nbytes, stream));
    PXT_CUDA_CHECK(cudaStreamSynchronize(stream));
    return PXT_OK;
}

static int cuda_synchronize(int index) {
    PXT_CUDA_CHECK(cudaSetDevice(index));
    PXT_CUDA_CHECK(cudaDeviceSynchronize());
    return PXT_OK;
}

/* ---- cuBLAS: one handle per device, made on first use -------------------------
 * Never destroyed: at exit the runtime may already be gone, and the driver
 * frees everything with the process. */
static cublasHandle_t cublas_handles[PXT_MAX_DEVICES];
static pthread_mutex_t cublas_lock = PTHREAD_MUTEX_INITIALIZER;

static int cublas_create(int index, cublasHandle_t *out) {
    cublasHandle_t h;
    PXT_CUDA_CHECK(cudaSetDevice(index)); /* a handle belongs to the current device */
    PXT_CUBLAS_CHECK(cublasCreate(&h));
    cublasStatus_t st = cublasSetStream(h, pxt_cuda_stream(index));
    if (st != CUBLAS_STATUS_SUCCESS) {
        (void)cublasDestroy(h); /* the SetStream failure is what gets reported */
        PXT_CUBLAS_CHECK(st);
    }
    *out = h;
    return PXT_OK;
}

int pxt_cuda_cublas(int index, cublasHandle_t *out) {
    if (index < 0 || index >= PXT_MAX_DEVICES) {
        return pxt_error(PXT_ERR_VALUE, "cuda:%d: device index out of range", index);
    }
    /* kernels run with the GIL released, so two threads may get here at once */
    pthread_mutex_lock(&cublas_lock);
    int rc = PXT_OK;
    if (!cublas_handles[index]) {
        rc = cublas_create(index, &cublas_handles[index]);
    }
    *out = cublas_handles[index];
    pthread_mutex_unlock(&cublas_lock);
    return rc;
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
    .cast = pxt_cuda_cast,
    .synchronize = cuda_synchronize,
    .gemm = pxt_cuda_gemm,
    .gemm_workspace = pxt_cuda_gemm_workspace,
    .add_bias = pxt_cuda_add_bias,
    .bias_backward = pxt_cuda_bias_backward,
    .layernorm_forward = pxt_cuda_layernorm_forward,
    .layernorm_backward = pxt_cuda_layernorm_backward,
    .gelu_forward = pxt_cuda_gelu_forward,
    .gelu_backward = pxt_cuda_gelu_backward,
    .add = pxt_cuda_add,
    .embedding_forward = pxt_cuda_embedding_forward,
    .embedding_backward = pxt_cuda_embedding_backward,
    .softmax_xent = pxt_cuda_softmax_xent,
    .sum = pxt_cuda_sum,
    .attention_forward = pxt_cuda_attention_forward,
    .attention_backward = pxt_cuda_attention_backward,
    .attention_workspace = pxt_cuda_attention_workspace,
    .grad_sumsq = pxt_cuda_grad_sumsq,
    .adamw = pxt_cuda_adamw,
    .swap = pxt_cuda_swap,
};

const pxt_backend *pxt_cuda_backend(void) { return &cuda_backend; }
