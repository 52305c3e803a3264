/* embedding.c: table lookup forward, scatter-add backward.
 *
 * The backward is a scatter: several rows of dout may hit the same table row
 * (repeated tokens, every sample's position 0). No atomics: the additions
 * follow backend.h's two stages of PXT_EMB_CHUNK rows, which the CUDA kernels
 * run in parallel, so both give the same bits. Here the rows of each id are
 * linked in index order (head, next in the workspace) and walked once per
 * column slice: an id's chunk sum restarts where its rows cross into the next
 * chunk. A task owns a slice of the C columns of every table row, so the bits
 * do not depend on the number of threads. */
#include "engine/backend.h"
#include "cpu.h"
#include "elem.h"

int pxt_cpu_embedding_forward(int index, void *out, const int32_t *ids, const void *table, int N,
                              int C, int accumulate, pxt_dtype dt) {
    (void)index;
    int rc = pxt_cpu_check_float(dt, "embedding_forward");
    if (rc != PXT_OK) {
        return rc;
    }
    if (N < 0 || C < 0) {
        return pxt_error(PXT_ERR_VALUE, "embedding_forward: negative size N=%d C=%d", N, C);
    }
    /* out (N, C); ids (N) in [0, V) (the caller checked: V is not passed in);
     * table (V, C) */
#pragma omp parallel for schedule(static) if ((size_t)N * C >= PXT_OMP_MIN_WORK)
    for (int i = 0; i < N; i++) {
        size_t row = (size_t)i * C, trow = (size_t)ids[i] * C;
        for (int j = 0; j < C; j++) {
            float v = pxt_ld(table, trow + j, dt);
            pxt_st(out, row + j, dt, accumulate ? pxt_ld(out, row + j, dt) + v : v);
        }
    }
    return PXT_OK;
}

size_t pxt_cpu_embedding_workspace(int N, int C, int V) {
    (void)C;
    return ((size_t)(N > 0 ? N : 0) + (size_t)(V > 0 ? V : 0)) * sizeof(int32_t);
}

int pxt_cpu_embedding_backward(int index, float *dtable, const void *dout, const int32_t *ids,
                               int N, int C, int V, pxt_dtype dt, void *workspace) {
    (void)index;
    int rc = pxt_cpu_check_float(dt, "embedding_backward");
    if (rc != PXT_OK) {
        return rc;
    }
    int empty;
    PXT_TRY(pxt_embedding_backward_check(N, C, V, workspace, &empty));
    if (empty) {
        return PXT_OK;
    }
    /* dtable (V, C) fp32 +=; dout (N, C); ids (N) in [0, V) */
    int32_t *head = workspace; /* (V) first row of each id, -1 if none */
    int32_t *next = head + V;  /* (N) the id's next row, -1 after its last */
    for (int v = 0; v < V; v++) {
        head[v] = -1;
    }
    for (int i = N - 1; i >= 0; i--) {
        next[i] = head[ids[i]];
        head[ids[i]] = i;
    }
    int nslices = (C + PXT_COL_SLICE - 1) / PXT_COL_SLICE;
#pragma omp parallel for schedule(static) if ((size_t)N * C >= PXT_OMP_MIN_WORK)
    for (int s = 0; s < nslices; s++) {
        int c0 = s * PXT_COL_SLICE, w = C - c0 < PXT_COL_SLICE ? C - c0 : PXT_COL_SLICE;
        double tot[PXT_COL_SLICE], part[PXT_COL_SLICE]; /* (w) */
        for (int v = 0; v < V; v++) {
            if (head[v] < 0) {
                continue;
            }
            int chunk = head[v] / PXT_EMB_CHUNK;
            for (int j = 0; j < w; j++) {
                tot[j] = part[j] = 0.0;
            }
            for (int r = head[v]; r >= 0; r = next[r]) {
                if (r / PXT_EMB_CHUNK != chunk) { /* stage 2: the finished chunk joins */
                    for (int j = 0; j < w; j++) {
                        tot[j] += part[j];
                        part[j] = 0.0;
                    }
                    chunk = r / PXT_EMB_CHUNK;
                }
                size_t row = (size_t)r * C + c0; /* stage 1: this chunk's rows in order */
                for (int j = 0; j < w; j++) {
                    part[j] += pxt_ld(dout, row + j, dt);
                }
            }
            float *drow = dtable + (size_t)v * C + c0; /* (w) */
            for (int j = 0; j < w; j++) {
                drow[j] = (float)(drow[j] + (tot[j] + part[j]));
            }
        }
    }
    return PXT_OK;
}
