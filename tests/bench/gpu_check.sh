#!/usr/bin/env bash
# gpu_check.sh OUTDIR A|B [EXTENSION_DIR]: everything a GPU machine must run for pyxtts,
# in two runs of under 10 minutes each. Output is tee'd into OUTDIR; every step runs
# under `timeout` and a failing step does not stop the next (the summary lists each
# step's exit status and seconds).
#
#   A  the device build: tests/bench/gpu_build.sh where it exists (versions, the wheels
#      carried in the tree, setup.py build_ext --inplace for sm_90 alone, pyxtts then
#      torch and torch then pyxtts with a matmul in each, the extension copied into
#      OUTDIR), else the same steps here; then the CUDA kernel tests with
#      CUDA_LAUNCH_BLOCKING=1; compute-sanitizer memcheck on a short selection; the
#      CUDA and attention tests and every device-parametrised test (engine, optimizer,
#      trainer, memory, DLPack) on cuda:0.
#   B  with run A's extension (EXTENSION_DIR, else OUTDIR): per-op timings at XTTS sizes
#      against torch; the XTTS v2 step against torch eager (SDPA, autocast bf16, fused
#      AdamW) and torch.compile at batch 8, with the largest batch; attention against
#      SDPA flash at T = 490, 1024, 2048, 4096. JSON in tests/bench/results/ and OUTDIR.
#
# Budget (H100 machine, 16 cores; estimates, not yet measured there):
#   A  build 330 s max (gpu_build.sh: versions, wheels, ~1-2 min of parallel nvcc for
#      sm_90, two import checks; without it, setup.py's serial nvcc ~4 min) | kernel
#      tests 100 | memcheck 70 | CUDA, attention and device tests 150 (pytest-xdist,
#      8 workers)                                                      => <= 580 s
#   B  versions 10 | ops 70 | eager 100 | compile 150 | pyxtts none 90 | full 80 |
#      attention 70                                                   => <= 570 s
# The step limits below add up to these; a step that runs out is killed and reported.
#
# On a GPU machine without network access (nothing is fetched there: the wheels travel
# with the tree):
#   once, here:  echo /.whl/ >> .git/info/exclude; echo /.gpu/ >> .git/info/exclude
#                python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#                  --implementation cp --platform manylinux_2_28_x86_64 \
#                  --platform manylinux2014_x86_64 -d .whl scipy-openblas32==0.3.34.481.3 \
#                  threadpoolctl==3.8.0   # (pure Python: bench_run.py's NumPy BLAS-threads comparison)
#   run A:       bash tests/bench/gpu_check.sh $OUT A          (carry .whl)
#   then copy the returned _C.*.so into .gpu/ here, and
#   run B:       bash tests/bench/gpu_check.sh $OUT B .gpu     (carry .whl and .gpu)
# PYXTTS_GPU_CHECK_DRY=1 prints each step's command instead of running it (checks the
# script itself where no GPU is; tests/test_gpu_check.py does, and sources the script to
# check that `step` kills a command at its limit).
set -uo pipefail

PY=${PYTHON:-python3}
# a test module whose optional imports the machine lacks (nbformat, ...) must not stop the rest
PYTEST=("$PY" -m pytest -q -p no:cacheprovider -rfEs --continue-on-collection-errors)
KERNEL_FILES=(tests/test_cuda.py tests/test_cuda_kernels.py tests/test_reductions.py tests/test_gemm_fused.py)
# the GPU cases of the kernel files (their CPU cases ran in CI)
KERNEL_SELECTION=("${KERNEL_FILES[@]}" -k "cuda or gpu")
# every other test whose id names cuda: the device-parametrised ones (attention, blocks,
# trainer, allocator, memory API, DLPack, tensors, casts, config) and test_cuda_attention_tc.py;
# not the emulators (CPU work CI does) nor the kernel files (their own step)
DEVICE_SELECTION=(tests --ignore=tests/test_cuda_emu.py --ignore=tests/test_cuda_emu_cond.py -k cuda)
for f in "${KERNEL_FILES[@]}"; do DEVICE_SELECTION+=(--ignore="$f"); done
# the new kernels at small sizes (the file imports no torch: quick to start under the sanitizer)
MEMCHECK_SELECTION=(tests/test_reductions.py tests/test_cond_ops.py -k "(cuda or gpu) and not 3920 and not 6681")

# step NAME LIMIT_S CMD...: runs CMD (a program or one of the functions below) under
# timeout, logs it and appends its exit status and seconds to $SUMMARY
step() {
    local name=$1 limit=$2
    shift 2
    if [ -n "${DEADLINE:-}" ]; then # run ONE's whole budget: cut the limit to what is left
        local left=$((DEADLINE - SECONDS))
        if [ "$left" -lt 10 ]; then
            echo "=== [$name] not run: ${left}s of the run's budget left"
            printf '%-24s not run (budget spent)\n' "$name" >> "$SUMMARY"
            return 125
        fi
        [ "$left" -lt "$limit" ] && limit=$left
    fi
    echo "=== [$name] $(date +%T) limit ${limit}s: $*"
    local t0=$SECONDS rc=0
    if [ "${PYXTTS_GPU_CHECK_DRY:-0}" = 1 ]; then
        echo "(dry run)"
    elif declare -F "$1" > /dev/null; then
        timeout -k 10 "$limit" bash -c '"$@"' step "$@"
        rc=$?
    else
        timeout -k 10 "$limit" "$@"
        rc=$?
    fi
    { [ "$rc" = 124 ] || [ "$rc" = 137 ]; } && echo "=== [$name] ran out of its ${limit}s"
    echo "=== [$name] exit $rc after $((SECONDS - t0))s"
    printf '%-24s exit %-4s %5ss (limit %ss)\n' "$name" "$rc" "$((SECONDS - t0))" "$limit" >> "$SUMMARY"
    return "$rc"
}

versions() {
    nvidia-smi
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
    command -v nvcc && nvcc --version
    "$PY" -c "import sys, numpy; print('python', sys.version.split()[0], 'numpy', numpy.__version__)"
    "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU for torch')"
    command -v compute-sanitizer || echo "no compute-sanitizer"
}

# the carried wheels (what the machine lacks: scipy-openblas32) into a private site dir,
# the one gpu_build.sh uses
SITE=${PYXTTS_WHEEL_SITE:-/tmp/pyxtts-wheels}
wheels() {
    local dir=${PYXTTS_WHEELS:-.whl}
    if ls "$dir"/*.whl > /dev/null 2>&1; then
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$SITE" "$dir"/*.whl
    else
        echo "no wheels in $dir: using what is installed"
    fi
}

# the build without gpu_build.sh
build() {
    PYXTTS_CUDA=1 PYXTTS_CUDA_ARCHS=90 "$PY" setup.py build_ext --inplace -j "$(nproc)"
}

# pyxtts and torch in one process, in the given import order, each multiplying on the GPU
imports() {
    "$PY" - "$1" << 'PYEOF'
import sys
import numpy as np
order = sys.argv[1].split(",")
mods = {name: __import__(name) for name in order}
pyxtts, torch = mods["pyxtts"], mods["torch"]
from pyxtts import _C
print("build:", pyxtts.build_info())
rng = np.random.default_rng(0)
a, b = rng.standard_normal((512, 384), np.float32), rng.standard_normal((384, 256), np.float32)
want = a.astype(np.float64) @ b
mag = np.abs(a).astype(np.float64) @ np.abs(b)
got = _C._op_gemm(pyxtts.tensor(a, device="cuda:0"), pyxtts.tensor(b, device="cuda:0")).numpy()
tt = (torch.tensor(a, device="cuda") @ torch.tensor(b, device="cuda")).cpu().numpy()
for name, x in (("pyxtts", got), ("torch", tt)):
    err = float(np.max(np.abs(x - want) / (mag + 1e-30)))
    print(f"{name} matmul on the GPU: max error / magnitude {err:.2e}")
    assert err < 1e-3, name  # torch may use TF32 (~1e-3); pyxtts's fp32 is ~1e-6
print("torch's current device after pyxtts:", torch.cuda.current_device())
PYEOF
}

copy_extension() {
    cp pyxtts/_C*.so "$OUTDIR"/ && ls -l "$OUTDIR"/_C*.so
}

use_extension() {
    local so
    so=$(ls "$EXTDIR"/_C*.so 2> /dev/null | head -1)
    if [ -z "$so" ]; then
        echo "no _C*.so in $EXTDIR: run A first and pass its extension"
        return 1
    fi
    cp "$so" pyxtts/ && "$PY" -c "import pyxtts; print(pyxtts.build_info()); assert pyxtts.cuda_available()"
}

run_a() {
    if [ -f tests/bench/gpu_build.sh ]; then
        # versions, wheels, the sm_90 build, both import orders, the extension into OUTDIR
        step build 330 env PYXTTS_GPU_BUILD_TIMEOUT=270 PYXTTS_WHEEL_SITE="$SITE" \
            bash tests/bench/gpu_build.sh "$OUTDIR" 90 || return
    else
        step versions 30 versions
        step wheels 60 wheels
        step build 270 build || return
        step imports-pyxtts-first 30 imports pyxtts,torch
        step imports-torch-first 30 imports torch,pyxtts
        step copy-extension 30 copy_extension
    fi
    step kernel-tests 100 env CUDA_LAUNCH_BLOCKING=1 "${PYTEST[@]}" "${KERNEL_SELECTION[@]}"
    step memcheck 70 compute-sanitizer --tool memcheck --error-exitcode 9 "${PYTEST[@]}" \
        "${MEMCHECK_SELECTION[@]}"
    step device-tests 150 "${PYTEST[@]}" -n 8 "${DEVICE_SELECTION[@]}"
}

run_b() {
    local R=tests/bench/results run
    mkdir -p $R
    step versions 30 versions
    step wheels 60 wheels
    step extension 30 use_extension || return
    step ops 70 "$PY" tests/bench/bench_ops_gpu.py --repeats 30 --json $R/ops_gpu.json
    for run in torch_eager:100 torch_compile:150 pyxtts_none:90 pyxtts_full:80; do
        step "xtts-${run%%:*}" "${run##*:}" "$PY" tests/bench/bench_xtts_gpu.py --batch 8 --steps 6 \
            --only "${run%%:*}" --json $R/xtts_gpu.json
    done
    step attention 70 "$PY" tests/bench/bench_attention_gpu.py --T 490 1024 2048 4096 \
        --paths tc torch --repeats 10 --json $R/attention_gpu.json
    cp $R/ops_gpu.json $R/xtts_gpu.json $R/attention_gpu.json "$OUTDIR"/ 2> /dev/null
}

# ONE: A's essentials and B's headline in one call, for a lease of 15 minutes all told
# (start included; on an H200 the first such run took 232 s, the second 384 s, of which
# torch.compile ran out of its then 100 s compiling the 30 layers as one graph; it now
# compiles block by block, once for the 30 identical blocks: bench_xtts_gpu.py --compile).
# Steps in order of value: the build, the kernel tests, the device tests, the XTTS v2 step
# against torch eager with the largest batch, the optimizer's state in host memory, world
# size 1 over NCCL, the whole run against the step, torch.compile (these four first ran in
# the H200's runs 3 and 4), the memory-bound ops with a cold cache, attention against SDPA,
# memcheck, then where the step's GPU time goes. Run 3 took 465 s for all of it; the steps
# added since (the one-pass backward's step, the step with cuBLASLt's bias gradients,
# graphs, graphs-recipe, a third attention path) should add 70-95 s.
# PYXTTS_GPU_CHECK_BUDGET (s, default 585) is the whole run's: each step's limit is cut to
# what is left, and a step with under 10 s left is reported as not run, so the summary is
# written before a remote runner's limit of 600 s a command stops everything.
# Such a runner may bring back as few as 8 files: the log, the summary, results.tar (every
# JSON, packed again after each step, so a run stopped early still has what it measured).
run_one() {
    local R=tests/bench/results run
    mkdir -p $R
    DEADLINE=$((SECONDS + ${PYXTTS_GPU_CHECK_BUDGET:-585}))
    # gpu_build.sh's own files stay out of OUTDIR (their text is in this log)
    step build 150 env PYXTTS_GPU_BUILD_TIMEOUT=120 PYXTTS_WHEEL_SITE="$SITE" \
        bash tests/bench/gpu_build.sh /tmp/pyxtts-gpu-build 90
    # the import checks may fail (two cuBLAS copies, say) with a usable extension (a dry run
    # built nothing and goes on, to list every step)
    [ "${PYXTTS_GPU_CHECK_DRY:-0}" = 1 ] || ls pyxtts/_C*.so > /dev/null 2>&1 || return
    step kernel-tests 80 env CUDA_LAUNCH_BLOCKING=1 "${PYTEST[@]}" -n 4 "${KERNEL_SELECTION[@]}"
    step device-tests 75 "${PYTEST[@]}" -n 8 "${DEVICE_SELECTION[@]}"
    for run in torch_eager:75:search pyxtts_full:75:search pyxtts_none:30:no; do
        IFS=: read -r name limit search <<< "$run"
        step "xtts-$name" "$limit" "$PY" tests/bench/bench_xtts_gpu.py --batch 8 --steps 5 \
            $([ "$search" = search ] && echo "--search $name" || echo --no-search) --only "$name" \
            --json $R/xtts_gpu.json
    done
    # the same step with the attention backward's one-pass schedule (its own JSON)
    step xtts-pyxtts_none-one-pass 30 env PYXTTS_CUDA_ATTENTION_BWD=one-pass "$PY" \
        tests/bench/bench_xtts_gpu.py --batch 8 --steps 5 --no-search --only pyxtts_none \
        --json $R/xtts_gpu_one_pass.json
    # the same step with the weight gradients' bias gradients in cuBLASLt's epilogue, as
    # before the default left bgrad_b to the column sums (gemm_fused.cu says why): which is faster
    step xtts-pyxtts_none-lt-bgrad 30 env PYXTTS_CUDA_LT_EPILOGUES=bias,bias_gelu,dgelu_bgrad,bgrad_b "$PY" \
        tests/bench/bench_xtts_gpu.py --batch 8 --steps 5 --no-search --only pyxtts_none \
        --json $R/xtts_gpu_lt_bgrad.json
    # the step's forward and backward replayed as CUDA graphs against the step as it comes,
    # at batch 8, 3 and 1, then Coqui's recipe (dropout, 517-frame mels) at its micro-batch
    # of 3: speed, the losses' bits (new masks each replay), the graphs' own device memory
    step graphs 30 "$PY" tests/bench/bench_graphs_gpu.py --batches 1 3 8 --steps 8 \
        --json $R/graphs_gpu.json
    step graphs-recipe 20 "$PY" tests/bench/bench_graphs_gpu.py --recipe --batches 3 --steps 8 \
        --json $R/graphs_gpu_recipe.json
    pack $R
    # the optimizer's state in host memory: its extra time per step, its share of an
    # optimizer cycle at accumulation 84 and 1, its bits against the on-device step
    step offload 90 "$PY" tests/bench/bench_offload_gpu.py --steps 3 --json $R/offload_gpu.json
    pack $R
    # several processes: world size 1 over NCCL on cuda:0 (the DLPack hand-off, the step's bits
    # against the single-process step) and the flat gradients' all-reduce against the step
    step ddp 60 "$PY" tests/bench/bench_ddp.py --gpus 1 --steps 3 --json $R/ddp_gpu.json
    pack $R
    # the whole run against that step: Trainer.fit on generated shards with 6 s reference
    # slices (their mels computed by the collating threads) at 2 and 4 workers, in positions/s
    # against the step on one batch, with the waits for data and the threads' scaling
    # (estimated ~20 s: a model, ~80 steps, the data side)
    step run-vs-step 40 "$PY" tests/bench/bench_run.py --device cuda --steps 16 --warmup 3 --workers 2,4 \
        --repeats 4 --json $R/run_gpu.json
    pack $R
    step xtts-torch_compile 150 "$PY" tests/bench/bench_xtts_gpu.py --batch 8 --steps 5 --no-search \
        --only torch_compile --json $R/xtts_gpu.json
    pack $R
    # the step's memory-bound ops with the L2 cache evicted first, as in a step
    step ops-cold 40 "$PY" tests/bench/bench_ops_gpu.py --repeats 10 --cold \
        --only layernorm "gelu forward" "gelu backward" dgelu bias_backward groupnorm rmsnorm embedding \
        adamw --json $R/ops_gpu.json
    pack $R
    # the backward's two schedules side by side (tc: two kernels; tc-one-pass: one kernel, dQ
    # through split partials); the kernel tests ran both
    step attention 35 "$PY" tests/bench/bench_attention_gpu.py --T 490 1024 2048 4096 \
        --paths tc tc-one-pass torch --repeats 5 --json $R/attention_gpu.json
    pack $R
    step attention-dropout 25 "$PY" tests/bench/bench_attention_gpu.py --T 490 2048 \
        --paths tc tc-one-pass torch --repeats 3 --dropout 0.1
    step memcheck 30 compute-sanitizer --tool memcheck --error-exitcode 9 "${PYTEST[@]}" \
        "${MEMCHECK_SELECTION[@]}"
    # the two tests that left 512 and 768 bytes allocated under memcheck in the second H200
    # run (not in the plain run), alone: does it depend on the order, and what is alive
    step memcheck-alone 25 compute-sanitizer --tool memcheck --error-exitcode 9 "${PYTEST[@]}" \
        tests/test_cond_ops.py -k "cuda and (test_groupnorm_finite_differences or test_rmsnorm_zero_row)"
    step profile-core 40 "$PY" tests/bench/profile_xtts_gpu.py --json $R/profile_xtts_gpu.json
    step profile-recipe 45 "$PY" tests/bench/profile_xtts_gpu.py --recipe --json $R/profile_xtts_gpu.json
    pack $R
}

# pack DIR: the JSON in DIR written by this run (newer than its summary; every one without
# a summary) into OUTDIR/results.tar, replacing the last one
pack() {
    [ "${PYXTTS_GPU_CHECK_DRY:-0}" = 1 ] && return 0
    local newer=()
    [ -n "${SUMMARY:-}" ] && [ -f "$SUMMARY" ] && newer=(-newer "$SUMMARY")
    (cd "$1" && mapfile -t files < <(find . -maxdepth 1 -name '*.json' "${newer[@]}" | sort) &&
        [ "${#files[@]}" -gt 0 ] && tar -cf "$OUTDIR/results.tar.tmp" "${files[@]}" &&
        mv "$OUTDIR/results.tar.tmp" "$OUTDIR/results.tar") || true
}

main() {
    if [ $# -lt 2 ] || { [ "$2" != A ] && [ "$2" != B ] && [ "$2" != ONE ]; }; then
        echo "usage: $0 OUTDIR A|B|ONE [EXTENSION_DIR]" >&2
        return 2
    fi
    local run=$2
    OUTDIR=$1
    EXTDIR=${3:-$1}
    ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
    cd "$ROOT" || return 2
    mkdir -p "$OUTDIR" "$EXTDIR" || return 2
    OUTDIR=$(cd "$OUTDIR" && pwd)
    EXTDIR=$(cd "$EXTDIR" && pwd)
    SUMMARY="$OUTDIR/summary_$run.txt"
    : > "$SUMMARY"
    export OUTDIR EXTDIR ROOT SUMMARY PY SITE PYTHONUNBUFFERED=1
    export PYTHONPATH=$SITE:$ROOT${PYTHONPATH:+:$PYTHONPATH}
    export -f versions wheels build imports copy_extension use_extension
    exec > >(tee -a "$OUTDIR/run_$run.log") 2>&1
    echo "gpu_check.sh run $run, $(date -u +%FT%TZ), tree $(git rev-parse --short HEAD 2> /dev/null || echo '?')"
    case $run in
        A) run_a ;;
        B) run_b ;;
        ONE) run_one ;;
    esac
    echo "=== summary of run $run"
    cat "$SUMMARY"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    main "$@"
fi
