/* embedding.cuh: the kernels of embedding_backward's two-stage scatter
 * (backend.h: chunks of PXT_EMB_CHUNK rows; per chunk and id, the id's rows in
 * order; per id, the chunk sums in chunk order; added to the table once).
 *
 *   flags   a warp per row: is it the first of its id in its chunk (bit 0, a
 *           "chunk leader"), and in all rows (bit 1, a "global leader")? Is a
 *           chunk leader the only row of its id in its chunk (bit 2, "alone")?
 *   parts   a warp per chunk leader not alone and 32 columns: the sum of its
 *           chunk's rows of that id, in order, into parts (N, C) at its row
 *   sum     a warp per global leader and 32 columns: the chunk sums of its id,
 *           found chunk by chunk (a ballot over the chunk's ids), in order; then
 *           the table row += total, written by this warp alone. An alone
 *           leader's chunk sum is its own row (0.0 + x is x exactly in double),
 *           so it is read from dout and never goes through parts: for most rows
 *           (a batch's audio codes and text tokens, each sample's positions) no
 *           8 bytes a column are written to parts and read back
 *
 * Kernels only: the includer provides ldf(), the 16-bit storage types and the
 * warp intrinsics (elem.cuh on the GPU, the host emulator of tests/cuda_emu on
 * the CPU, which runs this very source). */
#ifndef PXT_CUDA_EMBEDDING_CUH
#define PXT_CUDA_EMBEDDING_CUH

#define PXT_EMB_WARPS 8 /* warps (rows) per block */
#define PXT_EMB_FULL 0xffffffffu

/* The first row in [lo, hi) holding id v, or -1: the warp scans 32 rows at a
 * time; every lane returns the same row. */
__device__ static inline int pxt_emb_first(const int32_t *ids, int lo, int hi, int32_t v) {
    const int lane = threadIdx.x % 32;
    for (int s0 = lo; s0 < hi; s0 += 32) {
        const int s = s0 + lane;
        const unsigned int hit = __ballot_sync(PXT_EMB_FULL, s < hi && ids[s] == v);
        if (hit) {
            return s0 + __ffs(hit) - 1;
        }
    }
    return -1;
}

/* flags (N): bit 0 chunk leader, bit 1 global leader. Grid ceil(N / WARPS). */
__global__ static void pxt_emb_flags_kernel(uint8_t *flags, const int32_t *ids, int N) {
    const int r = blockIdx.x * PXT_EMB_WARPS + threadIdx.x / 32;
    if (r >= N) {
        return; /* whole warps: r is the same on every lane */
    }
    const int32_t v = ids[r];
    const int c0 = r / PXT_EMB_CHUNK * PXT_EMB_CHUNK;
    const int c1 = N - c0 < PXT_EMB_CHUNK ? N : c0 + PXT_EMB_CHUNK;
    uint8_t f = 0;
    if (pxt_emb_first(ids, c0, r, v) < 0) { /* none before r in its chunk */
        f = pxt_emb_first(ids, 0, c0, v) < 0 ? 3 : 1;
        f |= pxt_emb_first(ids, r + 1, c1, v) < 0 ? 4 : 0; /* none after it either */
    }
    if (threadIdx.x % 32 == 0) {
        flags[r] = f;
    }
}

/* parts (N, C) double at the chunk leaders' rows. Grid (ceil(C / 32), up to
 * nchunks); blocks stride over the chunks, warps over a chunk's rows. */
template <typename T>
__global__ static void pxt_emb_parts_kernel(double *parts, const uint8_t *flags, const T *dout,
                                            const int32_t *ids, int N, int C) {
    const int j = blockIdx.x * 32 + threadIdx.x % 32, warp = threadIdx.x / 32;
    const int nchunks = (N + PXT_EMB_CHUNK - 1) / PXT_EMB_CHUNK;
    for (int c = blockIdx.y; c < nchunks; c += gridDim.y) {
        const int end = N - c * PXT_EMB_CHUNK < PXT_EMB_CHUNK ? N : (c + 1) * PXT_EMB_CHUNK;
        for (int r = c * PXT_EMB_CHUNK + warp; r < end; r += PXT_EMB_WARPS) {
            if ((flags[r] & 5) != 1) { /* not a leader, or alone: sum reads its row */
                continue;
            }
            const int32_t v = ids[r];
            double acc = 0.0;
            for (int s = r; s < end; s++) {
                if (ids[s] == v && j < C) {
                    acc += ldf(dout[(size_t)s * C + j]);
                }
            }
            if (j < C) {
                parts[(size_t)r * C + j] = acc;
            }
        }
    }
}

/* dtable (V, C) += each id's total. Grid (ceil(C / 32), up to ceil(N / WARPS));
 * blocks stride over the rows. */
template <typename T>
__global__ static void pxt_emb_sum_kernel(float *dtable, const double *parts, const uint8_t *flags,
                                          const T *dout, const int32_t *ids, int N, int C) {
    const int j = blockIdx.x * 32 + threadIdx.x % 32;
    for (int r0 = blockIdx.y * PXT_EMB_WARPS; r0 < N; r0 += gridDim.y * PXT_EMB_WARPS) {
        const int r = r0 + threadIdx.x / 32;
        if (r >= N || !(flags[r] & 2)) {
            continue; /* warp-uniform */
        }
        const int32_t v = ids[r];
        double acc = 0.0;
        for (int c0 = r / PXT_EMB_CHUNK * PXT_EMB_CHUNK; c0 < N; c0 += PXT_EMB_CHUNK) {
            const int end = N - c0 < PXT_EMB_CHUNK ? N : c0 + PXT_EMB_CHUNK;
            const int lead = pxt_emb_first(ids, c0, end, v); /* its chunk leader, if any */
            if (lead >= 0 && j < C) {
                const size_t k = (size_t)lead * C + j;
                acc += flags[lead] & 4 ? (double)ldf(dout[k]) : parts[k];
            }
        }
        if (j < C) {
            float *d = dtable + (size_t)v * C + j;
            *d = (float)(*d + acc);
        }
    }
}

#endif /* PXT_CUDA_EMBEDDING_CUH */
