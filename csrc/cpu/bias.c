/* bias.c: the bias add and its backward, a two-stage column sum.
 *
 * bias_backward follows backend.h's chunking exactly (rows cut into chunks of
 * pxt_colsum_chunk_rows(M, N); a column's sum per chunk in double, rows in
 * order; the chunk sums added in order; the total added once), which is what
 * the CUDA kernels do in parallel, so both give the same bits. Here a task
 * owns a slice of columns and runs both stages for it: the bits do not
 * depend on the number of threads either. */
#include "engine/backend.h"
#include "cpu.h"
#include "elem.h"

/* out (M, N) += bias (N): each row is independent. */
int pxt_cpu_add_bias(int index, void *out, const void *bias, int M, int N, pxt_dtype dt) {
    (void)index;
    int rc = pxt_cpu_check_float(dt, "add_bias");
    if (rc != PXT_OK) {
        return rc;
    }
    if (M < 0 || N < 0) {
        return pxt_error(PXT_ERR_VALUE, "add_bias: negative size M=%d N=%d", M, N);
    }
#pragma omp parallel for schedule(static) if ((size_t)M * N >= PXT_OMP_MIN_WORK)
    for (int i = 0; i < M; i++) {
        size_t row = (size_t)i * N;
        for (int j = 0; j < N; j++) {
            pxt_st(out, row + j, dt, pxt_ld(out, row + j, dt) + pxt_ld(bias, j, dt));
        }
    }
    return PXT_OK;
}

size_t pxt_cpu_colsum_workspace(int rows, int cols) {
    (void)rows, (void)cols;
    return 0; /* a task keeps its slice's chunk sums on its stack */
}

void pxt_cpu_colsum(int rows, int cols, pxt_cpu_colsum_row row, const void *ctx, float *out0,
                    float *out1) {
    const int R = pxt_colsum_chunk_rows(rows, cols), nv = out1 ? 2 : 1;
    const int nslices = (cols + PXT_COL_SLICE - 1) / PXT_COL_SLICE;
    float *out[2] = {out0, out1};
#pragma omp parallel for schedule(static) if ((size_t)rows * cols >= PXT_OMP_MIN_WORK)
    for (int s = 0; s < nslices; s++) {
        int c0 = s * PXT_COL_SLICE, w = cols - c0 < PXT_COL_SLICE ? cols - c0 : PXT_COL_SLICE;
        double tot[2][PXT_COL_SLICE] = {{0}}, part[2][PXT_COL_SLICE]; /* (nv, w) */
        for (int i0 = 0; i0 < rows; i0 += R) {
            int i1 = rows - i0 < R ? rows : i0 + R;
            for (int v = 0; v < nv; v++) {
                for (int j = 0; j < w; j++) {
                    part[v][j] = 0.0;
                }
            }
            for (int i = i0; i < i1; i++) { /* stage 1: the chunk, rows in order */
                row(ctx, i, c0, w, part);
            }
            for (int v = 0; v < nv; v++) { /* stage 2: chunks in order */
                for (int j = 0; j < w; j++) {
                    tot[v][j] += part[v][j];
                }
            }
        }
        for (int v = 0; v < nv; v++) {
            for (int j = 0; j < w; j++) {
                out[v][c0 + j] = (float)(out[v][c0 + j] + tot[v][j]);
            }
        }
    }
}

typedef struct {
    const void *dout; /* (M, N), rows ld apart */
    int ld;
    pxt_dtype dt;
} bias_terms;

static void bias_row(const void *ctx, int i, int c0, int w, double part[2][PXT_COL_SLICE]) {
    const bias_terms *t = ctx;
    size_t row = (size_t)i * t->ld + c0;
    for (int j = 0; j < w; j++) {
        part[0][j] += pxt_ld(t->dout, row + j, t->dt);
    }
}

/* dbias (N) += column sums of dout (M, N), its rows ld apart. */
int pxt_cpu_bias_backward(int index, float *dbias, const void *dout, int M, int N, int ld,
                          pxt_dtype dt, void *workspace) {
    (void)index, (void)workspace;
    int rc = pxt_cpu_check_float(dt, "bias_backward");
    if (rc != PXT_OK) {
        return rc;
    }
    if (M < 0 || N < 0) {
        return pxt_error(PXT_ERR_VALUE, "bias_backward: negative size M=%d N=%d", M, N);
    }
    if (ld < N) {
        return pxt_error(PXT_ERR_VALUE, "bias_backward: rows %d apart, fewer than N=%d", ld, N);
    }
    bias_terms t = {dout, ld, dt};
    pxt_cpu_colsum(M, N, bias_row, &t, dbias, NULL);
    return PXT_OK;
}
