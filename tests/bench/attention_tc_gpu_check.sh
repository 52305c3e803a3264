#!/bin/sh
# One GPU session's checks of the tensor-core attention path (cuda/attention_tc.cu):
# build for this GPU, the new tests, the attention suites in both paths, then the
# A/B benchmark. Usage (repository root): sh tests/bench/attention_tc_gpu_check.sh [ARCH]
# ARCH defaults to 90 (H100 / H200). Output goes to $OUT when set, else /tmp.
set -u
ARCH=${1:-90}
OUTDIR=${OUT:-/tmp}
PYXTTS_CUDA_ARCHS=$ARCH python setup.py build_ext --inplace -t /tmp/build-attn-$ARCH \
    > "$OUTDIR/build.log" 2>&1 || { tail -30 "$OUTDIR/build.log"; exit 1; }
# 1. the tensor-core path against float64 and the fallback (children force each path)
python -m pytest -q -rs tests/test_cuda_attention_tc.py 2>&1 | tail -15
# 2. the attention suites with the default switch (auto: 16-bit D 64/128 -> tensor cores)
python -m pytest -q tests/test_attention.py tests/test_cuda_kernels.py 2>&1 | tail -5
# 3. the same suites on the fallback only (the old guarantees, e.g. 16-bit = fp32 rounded)
PYXTTS_CUDA_ATTENTION=simple python -m pytest -q tests/test_attention.py tests/test_cuda_kernels.py 2>&1 | tail -5
# 4. speed: tensor cores vs fallback vs torch SDPA (flash), causal, D = 64 and 128
python tests/bench/bench_attention_gpu.py --json "$OUTDIR/bench_d64.json" 2>&1 | tail -12
python tests/bench/bench_attention_gpu.py --D 128 --H 8 --paths tc torch --json "$OUTDIR/bench_d128.json" 2>&1 | tail -8
