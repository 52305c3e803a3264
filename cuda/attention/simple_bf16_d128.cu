/* the general attention kernels for bfloat16, 64 < D <= 128 (attention_simple.cuh) */
#include "../attention_simple.cuh"

PXT_ATTN_SIMPLE_INSTANCE(pxt_bf16, 128)
