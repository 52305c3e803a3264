"""The CUDA kernels of the conditioning path's ops, their own source run on the CPU by the
host emulator of tests/cuda_emu/ (see test_cuda_emu.py for what it emulates).

tests/cuda_emu/cond_main.cpp runs cuda/groupnorm.cuh, cuda/rmsnorm.cuh, cuda/geglu.cuh and
their weight gradients (cuda/colsum.cuh's pxt_colsum_gn, pxt_colsum_rms), the MLP's
GELU (cuda/gelu.cuh), LayerNorm's forward and dinp (cuda/layernorm.cuh) and the dropout of
rows (cuda/dropout.cuh), with the .cu files' launches (grids, block sizes, vector widths)
against the CPU backend (csrc/cpu/groupnorm.c, rmsnorm.c, geglu.c, gelu.c, layernorm.c,
dropout.c, linked in): GEGLU, GELU, dropout and the weight gradients bit for bit, the rest
within bounds its header states; every dtype, tiny,
ragged, misaligned and XTTS v2 sizes. The build is cached by the hash of its inputs (in the temp folder)."""
from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest
from conftest import SEED
from test_cuda_emu import CC, CXX, CXXFLAGS, EMU, ROOT, cached_build, check, compile_objects, run_all

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not (CC and CXX), reason="the emulator needs gcc and g++")]

# bias.c: pxt_cpu_colsum, the norms' weight-gradient sums
C_SOURCES = ["csrc/engine/common.c", "csrc/engine/half.c", "csrc/cpu/bias.c", "csrc/cpu/groupnorm.c",
             "csrc/cpu/rmsnorm.c", "csrc/cpu/geglu.c", "csrc/cpu/gelu.c", "csrc/cpu/layernorm.c",
             "csrc/cpu/dropout.c"]


def inputs_hash() -> str:
    h = hashlib.sha256()
    files = [EMU / "emu.h", EMU / "emu_check.h", EMU / "emu.cpp", EMU / "cond_main.cpp"]
    files += sorted((ROOT / "cuda").glob("*.cuh")) + [ROOT / p for p in C_SOURCES]
    files += sorted((ROOT / "csrc" / "engine").glob("*.h")) + sorted((ROOT / "csrc" / "cpu").glob("*.h"))
    for f in files:
        h.update(str(f.relative_to(ROOT)).encode() + b"\0" + f.read_bytes())
    for tool in (CC, CXX):
        h.update(subprocess.run([tool, "--version"], capture_output=True, text=True).stdout.encode())
    return h.hexdigest()[:16]


def build(out: Path) -> None:
    objs, emu_o = compile_objects(out, C_SOURCES)
    run_all([[CXX, *CXXFLAGS, str(EMU / "cond_main.cpp"), emu_o, *objs, "-fopenmp",
              "-o", str(out / "cond_emu")]], ROOT)


@pytest.fixture(scope="module")
def cond_emu() -> Path:
    return cached_build("cond-", inputs_hash(), build) / "cond_emu"


def test_cond_kernels_against_the_cpu_backend(cond_emu):
    out = check([str(cond_emu), str(SEED)], timeout=300)
    # 3 dtypes x (9 GroupNorm x 2 + 6 RMS x 2 + 6 GEGLU + 5 GELU + 5 dropout + 6 LayerNorm
    # forward + 5 LayerNorm dinp) small cases, 14 at XTTS v2 sizes
    assert out.count(" OK") == 3 * (18 + 12 + 6 + 5 + 5 + 6 + 5) + 14, out
