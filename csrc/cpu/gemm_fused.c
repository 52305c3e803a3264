/* gemm_fused.c: the fused GEMM entry on the CPU, the composition of the
 * unfused ops (backend.c's pxt_gemm_fused_composed): the reference the CUDA
 * backend's cuBLASLt epilogues are tested against. Every epilogue gives exactly
 * the bits of the ops it stands for, called one after the other. */
#include "engine/backend.h"
#include "cpu.h"

size_t pxt_cpu_gemm_fused_workspace(const pxt_gemm_args *g) {
    return pxt_cpu_gemm_workspace(g->M, g->N, g->K, g->dt_ab);
}

int pxt_cpu_gemm_fused(int index, const pxt_gemm_args *g, void *workspace) {
    /* the column sums need no workspace on the CPU */
    return pxt_gemm_fused_composed(pxt_cpu_backend(), index, g, workspace, NULL);
}
