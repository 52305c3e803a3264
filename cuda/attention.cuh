/* attention.cuh: what the attention entry points (attention.cu, attention_tc.cu)
 * and the kernel instances (the files of cuda/attention/) share: the general kernels'
 * block shapes and the launch of each instance. An instance is one storage type
 * T and one head-dim bound, compiled in its own file so that a build compiles
 * them in parallel; its file explicitly instantiates the templates below from
 * attention_simple.cuh or attention_tc.cuh. */
#ifndef PXT_ATTENTION_CUH
#define PXT_ATTENTION_CUH

#include "attention_common.cuh"
#include "elem.cuh"

#define ATTN_THREADS 128
#define FWD_BR 32 /* query rows of a forward block */
#define FWD_BC 32 /* keys of a forward tile */
#define KV_BC 32  /* keys of a dK/dV block */
#define KV_BR 8   /* query rows of a dK/dV tile */
#define DQ_BR 32  /* query rows of a dQ block */
#define DQ_BC 8   /* keys of a dQ tile */

/* blocks of a grid of B*H heads x `per` tiles each, within the 1-d grid limit */
static inline int attn_grid(const pxt_attn_args *a, int per, unsigned int *grid) {
    int64_t n = (int64_t)a->B * a->H * per;
    if (n > INT32_MAX) {
        return pxt_error(PXT_ERR_VALUE, "attention: %lld blocks are more than one grid holds",
                         (long long)n);
    }
    *grid = (unsigned int)n;
    return PXT_OK;
}

/* the general kernels (attention_simple.cuh), D <= DMAX; the caller checks the launch */
template <typename T, int DMAX>
void attn_fwd_launch(unsigned int grid, cudaStream_t stream, const pxt_attn_args &a, T *out,
                     float *lse, const T *q, const T *k, const T *v, int nqb);
template <typename T, int DMAX>
void attn_bwd_kv_launch(unsigned int grid, cudaStream_t stream, const pxt_attn_args &a, T *dk,
                        T *dv, const T *dout, const T *q, const T *k, const T *v, const float *lse,
                        const float *Di, int nkb);
template <typename T, int DMAX>
void attn_bwd_q_launch(unsigned int grid, cudaStream_t stream, const pxt_attn_args &a, T *dq,
                       const T *dout, const T *q, const T *k, const T *v, const float *lse,
                       const float *Di, int nqb);

/* the tensor-core kernels (attention_tc.cuh), D = 64 or 128; launched and checked */
template <typename T, int D>
int attn_tc_fwd_launch(const pxt_attn_args *a, void *out, float *lse, const void *q, const void *k,
                       const void *v, cudaStream_t stream);
template <typename T, int D>
int attn_tc_bwd_launch(const pxt_attn_args *a, void *dq, void *dk, void *dv, const void *dout,
                       const void *q, const void *k, const void *v, const float *lse,
                       const float *Di, float *dqp, cudaStream_t stream);
/* the instance's kernels on the current device: the forward's attributes (which code
 * of it this binary runs there) and the most static shared memory of the nine kernels */
template <typename T, int D>
cudaError_t attn_tc_attributes(cudaFuncAttributes *fwd, size_t *static_smem);

#endif /* PXT_ATTENTION_CUH */
