#!/usr/bin/env bash
# bench_build.sh: how long pip takes to build and install pyxtts, as a new user
# would: a copy of the committed tree in a fresh folder, fresh virtual
# environments, an empty pip cache and an empty pyxtts object cache.
#
#   bash tests/bench/bench_build.sh OUTDIR [REV]      (REV: the commit to copy, default HEAD)
#
# Scenarios, each timed with /usr/bin/time (wall, and the CPU of pip and every
# compiler it ran), `uptime` before and after each (the machine may be shared):
#   cuda        pip install .   (CUDA backend when nvcc is found; torch and the test
#               extra's packages are installed first, untimed, so that only the build
#               and pyxtts's own dependencies count)
#   reinstall   pip install "torch==2.13.0" ".[test]"   (README's test command, right after;
#               the test extra's packages are already there, so this times pyxtts alone)
#   cpu-after   PYXTTS_CUDA=0 pip install .   (same environment: must give a CPU-only module)
#   cpu         PYXTTS_CUDA=0 pip install .   (another fresh environment and caches)
# OUTDIR gets summary.txt and a -v log per scenario (one progress line per compile unit).
set -euo pipefail

out=${1:?usage: bash tests/bench/bench_build.sh OUTDIR [REV]}
rev=${2:-HEAD}
repo=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
src="$work/pyxtts"
mkdir -p "$src"
git -C "$repo" archive "$rev" | tar -x -C "$src"
summary="$out/summary.txt"
{
    echo "bench_build.sh $rev ($(git -C "$repo" rev-parse --short "$rev")) $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "$(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
    echo "nvcc: $(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null || echo none)"
} | tee "$summary"

fresh_env() {  # $1: venv folder; pip's and pyxtts's caches empty for what follows
    python3 -m venv "$1"
    "$1/bin/pip" install -q --upgrade pip
    export PIP_CACHE_DIR="$work/pip-cache-$(basename "$1")" PYXTTS_CACHE_DIR="$work/obj-cache-$(basename "$1")"
}

timed() {  # $1: scenario name; the rest: the command, run in the copied tree
    local name=$1
    shift
    echo "$name: load before: $(uptime | sed 's/.*load average: //')" | tee -a "$summary"
    (cd "$src" && /usr/bin/time -f "$name: %e s wall, %U s user + %S s sys CPU" -a -o "$summary" "$@") \
        > "$out/$name.log" 2>&1 || { tail -30 "$out/$name.log"; echo "$name FAILED" | tee -a "$summary"; exit 1; }
    grep -E "^ *pyxtts: [0-9]+ units in" "$out/$name.log" | sed "s/^ */$name: /" >> "$summary" || true
    echo "$name: load after: $(uptime | sed 's/.*load average: //')" | tee -a "$summary"
}

check() {  # $1: venv; $2: what build_info()["cuda"] must be (True, False or any)
    (cd / && "$1/bin/python" -c "import sys, pyxtts; i = pyxtts.build_info(); print(i)
assert sys.argv[1] == 'any' or str(i['cuda']) == sys.argv[1], 'unexpected build'" "$2") >> "$summary" 2>&1
}

fresh_env "$work/venv-cuda"
# the test extra's packages, read from pyproject.toml, so that "reinstall" times pyxtts alone
mapfile -t extra < <(python3 -c 'import sys, tomllib
print("\n".join(tomllib.load(open(sys.argv[1], "rb"))["project"]["optional-dependencies"]["test"]))' "$src/pyproject.toml")
"$work/venv-cuda/bin/pip" install -q "torch==2.13.0" "${extra[@]}"
timed cuda "$work/venv-cuda/bin/pip" install -v .
check "$work/venv-cuda" any
timed reinstall "$work/venv-cuda/bin/pip" install -v "torch==2.13.0" ".[test]"
timed cpu-after env PYXTTS_CUDA=0 "$work/venv-cuda/bin/pip" install -v .
check "$work/venv-cuda" "False"

fresh_env "$work/venv-cpu"
timed cpu env PYXTTS_CUDA=0 "$work/venv-cpu/bin/pip" install -v .
check "$work/venv-cpu" "False"
cat "$summary"
