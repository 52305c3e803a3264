#!/usr/bin/env bash
# gpu_build.sh: build pyxtts on a GPU machine without network access and prove
# that the module and PyTorch both multiply matrices on the GPU in one process.
#
#   bash tests/bench/gpu_build.sh OUTDIR [ARCHS]     (from anywhere; ARCHS default 90)
#
# Steps, each under `timeout`, output tee'd into OUTDIR (versions.txt, wheels.log,
# build.log, smoke.log), the built extension copied there so that a later run can
# reuse it instead of rebuilding:
#   1. versions: GPU, driver, nvcc, gcc, Python, torch, numpy;
#   2. the wheels carried in .whl/ installed with --no-index into a folder put on
#      PYTHONPATH (nothing is fetched);
#   3. `setup.py build_ext --inplace` for ARCHS only, with PYXTTS_CUDA=1 (no silent
#      CPU-only fallback), in parallel over the machine's cores;
#   4. in one process: import pyxtts, then torch; a float32 matmul in each, checked
#      against float64 NumPy; which libcublas.so the process mapped (exactly one
#      copy), then the same with torch imported first.
#
# The wheels: what pyxtts imports at build or run time that the machine lacks.
# The H100/H200 image has numpy, ml-dtypes, safetensors, pyyaml, tqdm, setuptools
# and pytest but not scipy-openblas32 (OpenBLAS for the CPU backend, imported by
# setup.py and loaded by the module). On a machine with network access, from the
# repository root (.whl/ is git-ignored; the GPU session carries it):
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
#     --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl scipy-openblas32
# Add any other missing package the same way (one version of each).
#
# cuBLAS: the module's RUNPATH lists the nvidia-cublas wheel of the Python
# environment first (the copy PyTorch loads), then the toolkit's library, so a
# process loads one libcublas.so whichever of the two is imported first; step 4
# checks this and prints the path.
set -euo pipefail

out=${1:?usage: bash tests/bench/gpu_build.sh OUTDIR [ARCHS]}
archs=${2:-90}
root=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$root"
py=${PYTHON:-python3}

echo "== 1. versions"
{
    date -u +%Y-%m-%dT%H:%M:%SZ
    uname -srm
    nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv,noheader || true
    { command -v nvcc >/dev/null && nvcc --version || /usr/local/cuda/bin/nvcc --version; } | tail -n 2 || true
    gcc --version | head -n 1
    "$py" --version
    "$py" -c "import numpy, torch; print('numpy', numpy.__version__, '| torch', torch.__version__, 'CUDA', torch.version.cuda)" \
        || true
    echo "cores: $(nproc)"
} 2>&1 | tee "$out/versions.txt"

echo "== 2. wheels from .whl/ (no index)"
site=${PYXTTS_WHEEL_SITE:-/tmp/pyxtts-wheels}
rm -rf "$site"
if compgen -G ".whl/*.whl" >/dev/null; then
    timeout 300 "$py" -m pip install --no-index --no-deps --no-compile --no-cache-dir --target "$site" .whl/*.whl \
        2>&1 | tee "$out/wheels.log"
else
    echo "no .whl/*.whl here: see this script's header" | tee "$out/wheels.log"
fi
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"

echo "== 3. build for sm_$archs (setup.py build_ext --inplace)"
start=$(date +%s)
# ~1 min on 16 cores; PYXTTS_GPU_BUILD_TIMEOUT (s) for slower machines
build() {
    PYXTTS_CUDA=1 PYXTTS_CUDA_ARCHS="$archs" timeout "${PYXTTS_GPU_BUILD_TIMEOUT:-600}" "$py" setup.py build_ext \
        --inplace 2>&1 | tee -a "$out/build.log"
}
: > "$out/build.log"
# a compiler newer than CI's may warn where CI's does not: the log keeps the warnings,
# and the retry (the object cache keeps what compiled) builds with them as warnings
if ! build; then
    echo "build: failed with -Werror; again with PYXTTS_WERROR=0 (the warnings above are to fix)" \
        | tee -a "$out/build.log"
    PYXTTS_WERROR=0 build
fi
echo "build: $(($(date +%s) - start)) s" | tee -a "$out/build.log"
cp pyxtts/_C*.so "$out/"

echo "== 4. pyxtts then torch, a matmul in each, one libcublas"
smoke=$(cat <<'PY'
import sys

import numpy as np


def check(name, got, a, b):
    ref = a.astype(np.float64) @ b.astype(np.float64)
    # fp32 products of K = 512 terms: |error| <= K * 2^-24 * sum|a||b| ~ 3e-5 of the
    # largest |ref|; TF32 (10-bit mantissa) would be ~1e-3 and fail
    err = float(np.max(np.abs(got - ref)) / np.max(np.abs(ref)))
    print(f"{name}: max |error| / max |ref| = {err:.2e}")
    assert np.isfinite(got).all() and err < 1e-4, f"{name}: matmul error {err}"


def cublas_paths():
    with open("/proc/self/maps") as f:
        return sorted({line.split()[-1] for line in f if "libcublas" in line and "/" in line})


rng = np.random.default_rng(20261121)
a = rng.standard_normal((384, 512), dtype=np.float32)
b = rng.standard_normal((512, 256), dtype=np.float32)
first = sys.argv[1]
if first == "pyxtts":
    import pyxtts
    import torch
else:
    import torch
    import pyxtts
info = pyxtts.build_info()
print("pyxtts", info["version"], "CUDA", info["cuda_version"], "cuBLAS", info["cublas_version"], info["cuda_archs"],
      "from", pyxtts.__file__)
assert info["cuda"] and pyxtts.cuda_available(), "pyxtts sees no GPU"
c = pyxtts._C._op_gemm(pyxtts.tensor(a, device="cuda"), pyxtts.tensor(b, device="cuda"))
check("pyxtts", c.numpy(), a, b)
t = torch.from_numpy(a).cuda() @ torch.from_numpy(b).cuda()
check("torch ", t.cpu().numpy(), a, b)
paths = cublas_paths()
print("libcublas mapped:", *paths, sep="\n  ")
names = [p.rsplit("/", 1)[-1] for p in paths]
assert len(names) == len(set(names)), f"two copies of one cuBLAS library in the process: {paths}"
print(f"OK ({first} imported first)")
PY
)
for first in pyxtts torch; do
    timeout 300 "$py" -c "$smoke" "$first" 2>&1 | tee -a "$out/smoke.log"
done
echo "== gpu_build.sh passed; extension in $out"
