/* backend_cpu.c: the CPU backend table: host memory, memcpy, casts.
 * The reference backend: every other backend is tested against it. */
#define _GNU_SOURCE /* sysconf page counts */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cblas.h> /* scipy-openblas32: symbols carry a scipy_ prefix */

#include "engine/backend.h"
#include "cpu.h"

static int cpu_device_count(void) { return 1; }

static size_t phys_bytes(int name) {
    long pages = sysconf(name), page = sysconf(_SC_PAGESIZE);
    return (pages > 0 && page > 0) ? (size_t)pages * (size_t)page : 0;
}

static int cpu_device_props(int index, pxt_device_props *out) {
    (void)index;
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "cpu");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) { /* "model name	: Intel(R) Xeon(R) ..." */
        char line[512];
        while (fgets(line, sizeof line, f)) {
            char *colon = strchr(line, ':');
            if (strncmp(line, "model name", 10) == 0 && colon) {
                colon += 2;
                colon[strcspn(colon, "\n")] = 0;
                snprintf(out->name, sizeof out->name, "%s", colon);
                break;
            }
        }
        fclose(f);
    }
    out->total_memory = phys_bytes(_SC_PHYS_PAGES);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    out->multiprocessors = cores > 0 ? (int)cores : 1;
    return PXT_OK;
}

/* Free host memory as the kernel judges what a new allocation can get: MemAvailable
 * (free pages plus the caches it would drop), else the free pages alone. */
static size_t available_bytes(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    unsigned long long kib = 0;
    int found = 0;
    if (f) {
        char line[256];
        while (!found && fgets(line, sizeof line, f)) {
            found = sscanf(line, "MemAvailable: %llu kB", &kib) == 1;
        }
        fclose(f);
    }
    return found ? (size_t)kib * 1024 : phys_bytes(_SC_AVPHYS_PAGES);
}

static int cpu_mem_info(int index, size_t *free_bytes, size_t *total_bytes) {
    (void)index;
    *free_bytes = available_bytes();
    *total_bytes = phys_bytes(_SC_PHYS_PAGES);
    return PXT_OK;
}

static int cpu_raw_alloc(int index, size_t nbytes, void **ptr) {
    (void)index;
    void *p = NULL;
    /* page alignment for segments (they are 2 MiB or more), 256 is the contract */
    size_t align = nbytes >= 4096 ? 4096 : 256;
    if (posix_memalign(&p, align, nbytes) != 0 || p == NULL) {
        return pxt_error(PXT_ERR_OOM, "host allocation of %zu bytes failed", nbytes);
    }
    *ptr = p;
    return PXT_OK;
}

static void cpu_raw_free(int index, void *ptr) {
    (void)index;
    free(ptr);
}

/* Large copies split over the cores in 1 MiB pieces: one thread does not reach the
 * machine's memory bandwidth (on the 2-core development machine 11 GB/s of 35). */
#define COPY_PIECE ((size_t)1 << 20)

static int cpu_copy(int index, void *dst, const void *src, size_t nbytes, pxt_copy_kind kind) {
    (void)index;
    (void)kind;
    if (nbytes < 4 * COPY_PIECE) {
        if (nbytes) {
            memcpy(dst, src, nbytes);
        }
        return PXT_OK;
    }
    size_t pieces = (nbytes + COPY_PIECE - 1) / COPY_PIECE;
#pragma omp parallel for schedule(static)
    for (size_t p = 0; p < pieces; p++) {
        size_t lo = p * COPY_PIECE, len = nbytes - lo < COPY_PIECE ? nbytes - lo : COPY_PIECE;
        memcpy((char *)dst + lo, (const char *)src + lo, len);
    }
    return PXT_OK;
}

#undef COPY_PIECE

/* Host memory for transfers is ordinary memory here: the CPU copies with memcpy,
 * and a copy_async is done when it returns, so fences have nothing to wait for. */
static int cpu_host_alloc(int index, size_t nbytes, void **ptr, int *pinned) {
    *pinned = 0;
    return cpu_raw_alloc(index, nbytes, ptr);
}

static int cpu_fence(int index, int f) {
    (void)index;
    if (f < 0 || f >= PXT_FENCES) {
        return pxt_error(PXT_ERR_VALUE, "fence %d out of range [0, %d)", f, PXT_FENCES);
    }
    return PXT_OK;
}

static int cpu_memset_zero(int index, void *dst, size_t nbytes) {
    (void)index;
    if (nbytes) {
        memset(dst, 0, nbytes);
    }
    return PXT_OK;
}

static int cpu_synchronize(int index) {
    (void)index;
    return PXT_OK;
}

/* OpenBLAS keeps its own thread pool, whose idle threads spin; beside OpenMP's
 * on the same cores that made steps up to 25x slower. The engine threads with
 * OpenMP alone and OpenBLAS runs inside its panels (matmul.c). */
static void cpu_init(void) { scipy_openblas_set_num_threads(1); }

static void cpu_info(pxt_backend_info *out) {
    memset(out, 0, sizeof *out);
    snprintf(out->library, sizeof out->library, "%s", scipy_openblas_get_config());
}

static int cpu_kernel_isa(const char *name, const char **active) {
    if (name) {
        PXT_TRY(pxt_cpu_attention_set_isa(name));
    }
    *active = pxt_cpu_attention_isa();
    return PXT_OK;
}

static const pxt_backend cpu_backend = {
    .name = "cpu",
    .init = cpu_init,
    .info = cpu_info,
    .kernel_isa = cpu_kernel_isa,
    .device_count = cpu_device_count,
    .device_props = cpu_device_props,
    .mem_info = cpu_mem_info,
    .raw_alloc = cpu_raw_alloc,
    .raw_free = cpu_raw_free,
    .copy = cpu_copy,
    .memset_zero = cpu_memset_zero,
    .host_alloc = cpu_host_alloc,
    .host_free = cpu_raw_free,
    .copy_async = cpu_copy,
    .fence_record = cpu_fence,
    .fence_wait = cpu_fence,
    .cast = pxt_cpu_cast,
    .synchronize = cpu_synchronize,
    .gemm = pxt_cpu_gemm,
    .gemm_ld = pxt_cpu_gemm_ld,
    .gemm_workspace = pxt_cpu_gemm_workspace,
    .add_bias = pxt_cpu_add_bias,
    .bias_backward = pxt_cpu_bias_backward,
    .colsum_workspace = pxt_cpu_colsum_workspace,
    .gemm_fused = pxt_cpu_gemm_fused,
    .gemm_fused_workspace = pxt_cpu_gemm_fused_workspace,
    .layernorm_forward = pxt_cpu_layernorm_forward,
    .layernorm_backward = pxt_cpu_layernorm_backward,
    .gelu_forward = pxt_cpu_gelu_forward,
    .gelu_backward = pxt_cpu_gelu_backward,
    .add = pxt_cpu_add,
    .embedding_forward = pxt_cpu_embedding_forward,
    .embedding_backward = pxt_cpu_embedding_backward,
    .embedding_workspace = pxt_cpu_embedding_workspace,
    .softmax_xent = pxt_cpu_softmax_xent,
    .sum = pxt_cpu_sum,
    .attention_forward = pxt_cpu_attention_forward,
    .attention_backward = pxt_cpu_attention_backward,
    .attention_workspace = pxt_cpu_attention_workspace,
    .attention_dropout = 1,
    .dropout_forward = pxt_cpu_dropout_forward,
    .dropout_backward = pxt_cpu_dropout_backward,
    .groupnorm_forward = pxt_cpu_groupnorm_forward,
    .groupnorm_backward = pxt_cpu_groupnorm_backward,
    .rmsnorm_forward = pxt_cpu_rmsnorm_forward,
    .rmsnorm_backward = pxt_cpu_rmsnorm_backward,
    .geglu_forward = pxt_cpu_geglu_forward,
    .geglu_backward = pxt_cpu_geglu_backward,
    .grad_sumsq = pxt_cpu_grad_sumsq,
    .adamw = pxt_cpu_adamw,
    .swap = pxt_cpu_swap,
};

const pxt_backend *pxt_cpu_backend(void) { return &cpu_backend; }
