/* the tensor-core attention kernels for float16, D = 128 (attention_tc.cuh) */
#include "../attention_tc.cuh"

PXT_ATTN_TC_INSTANCE(pxt_f16, 128)
