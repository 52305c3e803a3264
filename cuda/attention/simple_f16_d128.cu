/* the general attention kernels for float16, 64 < D <= 128 (attention_simple.cuh) */
#include "../attention_simple.cuh"

PXT_ATTN_SIMPLE_INSTANCE(pxt_f16, 128)
