"""The CUDA kernels' own source, run on the CPU by a host emulator (tests/cuda_emu/).

CI never has a GPU. These tests compile kernel source from cuda/ with g++ against
tests/cuda_emu/emu.h, which emulates a thread block (fibers, __syncthreads, warp shuffles
and ballots, ldmatrix, mma.m16n8k16, cp.async; poisoned shared memory; guard pages after
device buffers), and check:

- the deterministic reductions (cuda/colsum.cuh, cuda/embedding.cuh): bit for bit the CPU
  backend's results (csrc/cpu/ is linked in), tiny to XTTS v2 sizes, every dtype;
- the loss's and the optimizer's kernels (cuda/xent.cuh, cuda/adamw.cuh): AdamW bit for bit
  the CPU backend's (csrc/cpu/optim.c, linked in), the softmax cross-entropy within its
  bound of float64, its pad columns, ignored and stray targets and bias exactly;
- the index math of the fused GEMM (cuda/lt_map.h): through a float64 model of cuBLASLt's
  documented column-major semantics, against backend.h's row-major definition;
- the attention kernels (cuda/attention_tc.cuh's tensor-core path, cuda/attention_simple.cuh's
  general one, extracted verbatim but for the dynamic shared-memory declaration):
  against float64, with masks, lengths, odd sizes and XTTS shapes, the backward both as the
  dK/dV and dQ kernels and as the one-pass kernel with its split dQ partials; with dropout of the
  probabilities ("drop"), against float64 with dropout.h's masks and against the CPU
  backend (csrc/cpu/attention.c, linked in) on the same arguments, the masks read back
  exactly by probe inputs (tests/cuda_emu/attn_main.cpp says how); with a scale of 3e38
  ("overflow"), the NaN rows of scores that overflow float, element by element the CPU
  backend's NaN, zeros and values, forward and backward;
- the choice of attention path on consumer and data-centre cards ("limits"): the
  decision of cuda/attention_tc_plan.h, given each card's numbers (sm_80+ code or not,
  the per-block shared-memory limit: 64 KiB sm_75, 99 KiB sm_86/sm_89, 163 KiB sm_80,
  227 KiB sm_90), picks the expected path, which then runs under that limit (a launch over
  it fails in the emulator, as on the card) and matches float64.

What they cannot show: speed, and anything of cuBLAS itself. The build is cached by the
hash of its inputs (in the temp folder), so a second run only runs.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from conftest import SEED

ROOT = Path(__file__).resolve().parent.parent
EMU = ROOT / "tests" / "cuda_emu"
CC, CXX = shutil.which("gcc"), shutil.which("g++")

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not (CC and CXX), reason="the emulator needs gcc and g++")]

# the CPU backend files the reductions are compared with, and what they need
C_SOURCES = ["csrc/engine/common.c", "csrc/engine/half.c", "csrc/cpu/bias.c",
             "csrc/cpu/layernorm.c", "csrc/cpu/embedding.c", "csrc/cpu/gelu.c", "csrc/cpu/optim.c",
             "csrc/cpu/attention.c"]  # attention last: attn_emu links objs[0], [1] and [-1]
CXXFLAGS = ["-O2", "-std=c++17", "-U_FORTIFY_SOURCE", "-Wall", "-Wextra", "-Wno-unknown-pragmas",
            "-Werror", "-Icsrc", "-Icuda"]

# the attention kernels: (file, first line of the region, the line after it)
TC_REGION = ("cuda/attention_tc.cuh", "/* an output pair (cols d, d+1 of one row)",
             "/* ---- host: launches")
FB_CONSTS = ("cuda/attention.cuh", "#define ATTN_THREADS 128", "/* blocks of a grid")
FB_REGION = ("cuda/attention_simple.cuh", "/* ---- helpers: lengths", "/* ---- launches")
DI_REGION = ("cuda/attention.cu", "/* ---- backward: Di = rowsum", "/* ---- the table entries")
DYNAMIC_SMEM = "extern __shared__ __align__(16) uint16_t smem[];"


def region(spec: tuple[str, str, str]) -> str:
    path, first, after = spec
    text = (ROOT / path).read_text()
    i, j = text.find(first), text.find(after)
    assert 0 <= i < j, (f"{path}: the kernels are no longer between {first!r} and {after!r}; "
                        "update the markers in tests/test_cuda_emu.py")
    return text[i:j]


def extracted() -> dict[str, str]:
    """The attention kernels' source as the emulator includes it."""
    tc_kernels = region(TC_REGION)
    assert DYNAMIC_SMEM in tc_kernels, "cuda/attention_tc.cuh: the dynamic shared memory changed"
    return {"tc_kernels.inc": tc_kernels.replace(DYNAMIC_SMEM, "uint16_t *smem = (uint16_t *)emu_smem;"),
            "fb_kernels.inc": "\n".join(map(region, (FB_CONSTS, FB_REGION, DI_REGION)))}


def inputs_hash(generated: dict[str, str]) -> str:
    h = hashlib.sha256()
    files = sorted(EMU.glob("*")) + sorted((ROOT / "cuda").glob("*.cuh")) + sorted((ROOT / "cuda").glob("*.h"))
    files += [ROOT / p for p in C_SOURCES] + sorted((ROOT / "csrc" / "engine").glob("*.h"))
    files += sorted((ROOT / "csrc" / "cpu").glob("*.h"))
    for f in files:
        h.update(str(f.relative_to(ROOT)).encode() + b"\0" + f.read_bytes())
    for name, text in sorted(generated.items()):
        h.update(name.encode() + b"\0" + text.encode())
    for tool in (CC, CXX):
        h.update(subprocess.run([tool, "--version"], capture_output=True, text=True).stdout.encode())
    return h.hexdigest()[:16]


def run_all(cmds: list[list[str]], cwd: Path) -> None:
    """Runs compile commands two at a time (the CI machine's cores); fails on the first error."""
    pending = list(cmds)
    while pending:
        batch, pending = pending[:2], pending[2:]
        procs = [subprocess.Popen(c, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for c in batch]
        for c, p in zip(batch, procs):
            out = p.communicate()[0]
            assert p.returncode == 0, f"{' '.join(c)}\n{out}"


def compile_objects(out: Path, sources: list[str]) -> tuple[list[str], str]:
    """The CPU backend's C files (the references) and the emulator into objects in out:
    (their paths, emu.o's)."""
    objs, cmds = [], []
    for src in sources:
        obj = out / (src.replace("/", "_") + ".o")
        cmds.append([CC, "-O2", "-std=c11", "-fopenmp", "-Wall", "-Wextra", "-Werror", "-Icsrc",
                     "-c", src, "-o", str(obj)])
        objs.append(str(obj))
    emu_o = str(out / "emu.o")
    cmds.append([CXX, *CXXFLAGS, "-c", str(EMU / "emu.cpp"), "-o", emu_o])
    run_all(cmds, ROOT)
    return objs, emu_o


def cached_build(name: str, digest: str, build_into) -> Path:
    """The folder pyxtts-cuda-emu-{name}{digest} of the temp folder (or PYXTTS_EMU_CACHE),
    made by build_into(folder) unless a run made it already."""
    cache = Path(os.environ.get("PYXTTS_EMU_CACHE") or tempfile.gettempdir())
    final = cache / f"pyxtts-cuda-emu-{name}{digest}"
    if not final.exists():
        work = Path(tempfile.mkdtemp(prefix=f"pyxtts-cuda-emu-{name}build-", dir=cache))
        try:
            build_into(work)
            try:
                work.rename(final)  # atomic: a concurrent run that built it too wins
            except OSError:
                pass
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return final


def build(out: Path, generated: dict[str, str]) -> None:
    for name, text in generated.items():
        (out / name).write_text(text)
    objs, emu_o = compile_objects(out, C_SOURCES)
    reduce_objs = [o for o in objs if "attention" not in o and "optim" not in o]
    step_objs = [o for o in objs if "engine" in o or "optim" in o]
    run_all([
        [CXX, *CXXFLAGS, f"-I{out}", str(EMU / "reduce_main.cpp"), emu_o, *reduce_objs, "-fopenmp",
         "-o", str(out / "reduce_emu")],
        [CXX, *CXXFLAGS, str(EMU / "step_main.cpp"), emu_o, *step_objs, "-fopenmp",
         "-o", str(out / "step_emu")],
        [CXX, *CXXFLAGS, str(EMU / "lt_main.cpp"), "-o", str(out / "lt_emu")],
        [CXX, *CXXFLAGS, "-Wno-unused-parameter", "-Wno-unused-variable", f"-I{out}",
         str(EMU / "attn_main.cpp"), emu_o, objs[0], objs[1], objs[-1], "-fopenmp", "-o",
         str(out / "attn_emu")],
    ], ROOT)


@pytest.fixture(scope="module")
def emu() -> Path:
    generated = extracted()
    return cached_build("", inputs_hash(generated), lambda out: build(out, generated))


def check(cmd: list[str], timeout: float) -> str:
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    out = p.stdout + p.stderr
    assert p.returncode == 0 and "failures: 0" in out, out[-6000:]
    return out


def test_reductions_give_the_cpus_bits(emu):
    out = check([str(emu / "reduce_emu"), str(SEED)], timeout=600)
    assert out.count(" OK") >= 20, out


def test_loss_and_optimizer_kernels(emu):
    """cuda/adamw.cuh bit for bit the CPU's AdamW; cuda/xent.cuh within its bound of
    float64, with the pads, ignored and stray targets and the bias exactly as stated
    (tests/cuda_emu/step_main.cpp)."""
    out = check([str(emu / "step_emu"), str(SEED)], timeout=300)
    assert out.count(" OK") >= 25 and "V=6681 ld=6688" in out, out


def test_fused_gemm_index_math(emu):
    out = check([str(emu / "lt_emu"), str(SEED)], timeout=120)
    assert "160 cases" in out, out


@pytest.mark.parametrize("which", ["tcquick", "fb", "odd", "xtts", "drop", "overflow"])
def test_attention_kernels_against_float64(emu, which):
    out = check([str(emu / "attn_emu"), which], timeout=900)
    assert " OK" in out and " FAIL" not in out, out
    if which in ("tcquick", "xtts", "drop"):  # 16-bit, D 64 / 128: Di 16 bytes a lane
        assert " di8" in out, out


# (mode, splits): 1, 2 and 3 splits put several key blocks in one split (its first block
# writes the dQ partial, later ones add), -1 is pxt_tc_splits's count (one key block each
# at these sizes); the partials are poisoned, so a row the reduction reads unwritten is NaN
ONE_PASS = [("tc", "2"), ("tcquick", "1"), ("tcquick", "-1"), ("xtts", "3"), ("drop", "3"),
            ("overflow", "1")]


@pytest.mark.parametrize("which,splits", ONE_PASS)
def test_attention_one_pass_backward_against_float64(emu, which, splits):
    """The tensor-core backward's one-pass schedule (PYXTTS_CUDA_ATTENTION_BWD=one-pass):
    the same cases and bounds as the two kernels, dropout and overflow included, and its dK
    and dV the dK/dV kernel's bits (both run bwd_kv_tile), element for element."""
    out = check([str(emu / "attn_emu"), which, splits], timeout=900)
    assert "tensor-core backward: one pass" in out and " OK" in out and " FAIL" not in out, out
    assert "kv-bits-differ 0" in out, out


@pytest.mark.parametrize("splits", ["0", "-1"])
def test_attention_path_fits_each_cards_shared_memory(emu, splits):
    """Each card's path runs under its limit and matches float64; a launch over the limit
    is refused (so a tile that outgrows a card cannot pass unnoticed). With the one-pass
    backward (splits -1) its 65,600 bytes at D = 64 count too."""
    p = subprocess.run([str(emu / "attn_emu"), "limits", splits], capture_output=True, text=True,
                       timeout=600)
    out = p.stdout + p.stderr
    assert p.returncode == 0 and "failures: 0" in out, out[-6000:]
    assert "refused OK" in out and "over the device's 65536" in out, out[-6000:]
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith(("tc ", "fb "))]
    assert len(lines) == 7 * 2 * 2 + 1, out[-6000:]  # cards x cases x (D 64, D 128), the forced one
    assert any(ln.startswith("tc ") and "sm_86/89" in ln and "D=128" in ln for ln in lines), out
    assert all(ln.startswith("fb ") for ln in lines if "sm_75" in ln), out
    small = [ln for ln in lines if "64KiB (no such card)" in ln and "D=64" in ln]
    assert small and all(ln.startswith("fb " if splits != "0" else "tc ") for ln in small), out
