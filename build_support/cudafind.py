"""Finds the CUDA toolkit and cuBLAS for the build (shared by setup.py and the
build backend, which must agree on whether the CUDA backend is built)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
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


def _find_cublas(home: Path, major: int) -> tuple[Path | None, Path | None, bool]:
    if (home / "include" / "cublas_v2.h").is_file():
        for lib in ("lib64", "lib"):
            if list((home / lib).glob("libcublas.so*")):
                return home / "include", home / lib, False
    # the nvidia-cublas wheel: nvidia/cu13/{include,lib} (or nvidia/cublas/ for CUDA 12)
    for entry in sys.path:
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
