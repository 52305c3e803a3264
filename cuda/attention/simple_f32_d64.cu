/* the general attention kernels for float32, D <= 64 (attention_simple.cuh) */
#include "../attention_simple.cuh"

PXT_ATTN_SIMPLE_INSTANCE(float, 64)
