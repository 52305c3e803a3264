/* the general attention kernels for float32, 64 < D <= 128 (attention_simple.cuh) */
#include "../attention_simple.cuh"

PXT_ATTN_SIMPLE_INSTANCE(float, 128)
