"""Finds the CUDA toolkit, cuBLAS and the GPU architectures to build for
(shared by setup.py and the build backend, which must agree on whether the
CUDA backend is built and whether cuBLAS must be installed to build it)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Cuda:
    home: Path
    nvcc: Path
    version: tuple[int, int]
    cublas_include: Path | None  # None: headers not found yet (wheel not installed)
    cublas_lib: Path | None
    cublas_from_wheel: bool


def mode() -> str:
    """PYXTTS_CUDA: '0' forces CPU-only, '1' requires CUDA, unset: auto."""
    value = os.environ.get("PYXTTS_CUDA", "").strip()
    if value not in ("", "0", "1"):
        raise SystemExit(f"PYXTTS_CUDA must be 0, 1 or unset, got {value!r}")
    return value


def find_nvcc() -> Path | None:
    candidates = []
    if os.environ.get("CUDA_HOME"):
        candidates.append(Path(os.environ["CUDA_HOME"]) / "bin" / "nvcc")
    candidates.append(Path("/usr/local/cuda/bin/nvcc"))
    which = shutil.which("nvcc")
    if which:
        candidates.append(Path(which))
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return c.resolve()
    return None


def nvcc_version(nvcc: Path) -> tuple[int, int]:
    out = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, check=True).stdout
    m = re.search(r"release (\d+)\.(\d+)", out)
    if not m:
        raise SystemExit(f"cannot read the CUDA version from `{nvcc} --version`:\n{out}")
    return int(m.group(1)), int(m.group(2))


def cublas_wheel_requirement(major: int) -> str:
    return f"nvidia-cublas>={major},<{major + 1}" if major >= 13 else f"nvidia-cublas-cu{major}"


def site_dirs() -> list[str]:
    """Where an installed nvidia-cublas wheel may be: sys.path, then the site
    folders of this interpreter's environment. During an isolated pip build the
    latter is the environment being installed into, whose wheel (from an
    earlier install) spares the build a 440 MB download."""
    paths = sysconfig.get_paths()
    return [*sys.path, paths["platlib"], paths["purelib"]]


def _find_cublas(home: Path, major: int) -> tuple[Path | None, Path | None, bool]:
    if (home / "include" / "cublas_v2.h").is_file():
        for lib in ("lib64", "lib"):
            if list((home / lib).glob("libcublas.so*")):
                return home / "include", home / lib, False
    # the nvidia-cublas wheel: nvidia/cu13/{include,lib} (or nvidia/cublas/ for CUDA 12)
    for entry in site_dirs():
        for sub in (f"nvidia/cu{major}", "nvidia/cublas"):
            root = Path(entry) / sub
            if (root / "include" / "cublas_v2.h").is_file() and list((root / "lib").glob("libcublas.so*")):
                return root / "include", root / "lib", True
    return None, None, True


def find() -> Cuda | None:
    """The toolkit to build with, or None for a CPU-only build."""
    m = mode()
    if m == "0":
        return None
    nvcc = find_nvcc()
    if nvcc is None:
        if m == "1":
            raise SystemExit(
                "PYXTTS_CUDA=1 but nvcc was not found in $CUDA_HOME/bin, /usr/local/cuda/bin or PATH")
        return None
    home = nvcc.parent.parent
    version = nvcc_version(nvcc)
    inc, lib, from_wheel = _find_cublas(home, version[0])
    return Cuda(home, nvcc, version, inc, lib, from_wheel)


# Without a visible GPU: machine code for Ampere (which also runs on sm_86 and on
# Ada's sm_89) and Hopper, plus Hopper's PTX, which newer GPUs compile at load.
# Turing (sm_75) is built when such a GPU is visible or named in PYXTTS_CUDA_ARCHS:
# each architecture adds about 90 s of compiler CPU time (tests/bench/RESULTS.md).
DEFAULT_ARCHS = ["80", "90"]
_ARCH = re.compile(r"(\d{2,3})([af]?)")


def supported_archs(nvcc: Path) -> list[str]:
    """The sm_XX this nvcc compiles for, as "XX"."""
    out = subprocess.run([str(nvcc), "--list-gpu-code"], capture_output=True, text=True, check=True).stdout
    return sorted({m[1] for m in re.finditer(r"sm_(\d+)", out)}, key=int)


def visible_archs() -> list[str]:
    """Compute capabilities of the GPUs that nvidia-smi sees ("90" for 9.0); [] when
    there is none or nvidia-smi is missing or fails."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        res = subprocess.run([smi, "--query-gpu=compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return []
    if res.returncode != 0:
        return []
    found = {f"{m[1]}{m[2]}" for m in re.finditer(r"^\s*(\d+)\.(\d+)\s*$", res.stdout, re.M)}
    return sorted(found, key=int)


def choose_archs(nvcc: Path) -> tuple[list[str], str]:
    """The architectures to build for and why: PYXTTS_CUDA_ARCHS (e.g. "80 90",
    "90a"), else the visible GPUs', else DEFAULT_ARCHS; each kept only where this
    nvcc supports it. A GPU newer than the toolkit gets the newest it has (its PTX
    is compiled at load)."""
    supported = supported_archs(nvcc)
    env = os.environ.get("PYXTTS_CUDA_ARCHS", "").replace(";", " ").replace(",", " ").split()
    if env:
        for a in env:
            m = _ARCH.fullmatch(a.removeprefix("sm_"))
            if not m or m[1] not in supported:
                raise SystemExit(f"PYXTTS_CUDA_ARCHS: expected architectures among {' '.join(supported)} "
                                 f"(optionally with an a or f suffix, e.g. \"80 90\"), got {a!r}")
        archs = sorted({a.removeprefix("sm_") for a in env}, key=lambda a: (int(_ARCH.fullmatch(a)[1]), a))
        return archs, "PYXTTS_CUDA_ARCHS"
    visible = visible_archs()
    if visible:
        newest = supported[-1]
        archs = sorted({a if a in supported else newest for a in visible if int(a) >= int(supported[0])},
                       key=int)
        if archs:
            return archs, "the visible GPUs"
    return [a for a in DEFAULT_ARCHS if a in supported] or supported[-1:], "no GPU visible: the default list"


def gencode(archs: list[str]) -> list[str]:
    """nvcc's -gencode flags: machine code for each, PTX for the last (newest)."""
    flags = []
    for a in archs[:-1]:
        flags += ["-gencode", f"arch=compute_{a},code=sm_{a}"]
    last = archs[-1]
    return flags + ["-gencode", f"arch=compute_{last},code=[sm_{last},compute_{last}]"]
