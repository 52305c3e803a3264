"""Builds pyxtts._C: the C core always, the CUDA backend when nvcc is found.

Environment:
  PYXTTS_CUDA=0|1        force CPU-only / require CUDA (default: CUDA when nvcc is found)
  PYXTTS_CUDA_ARCHS      e.g. "80 90" (default: every architecture the toolkit supports
                         from Turing on, plus PTX for the newest, so newer GPUs JIT it)
  PYXTTS_SANITIZE=1      build the C code with -fsanitize=address,undefined
  PYXTTS_DEBUG=1         -O0 -g
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "build_support"))
import cudafind  # noqa: E402

VERSION = "0.1.0"
# Turing to Hopper as machine code; newer GPUs JIT the PTX of the last one
DEFAULT_ARCHS = {13: ["75", "80", "86", "89", "90"], 12: ["70", "75", "80", "86", "89", "90"]}


def flag(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0")


def openblas():
    import scipy_openblas32 as ob

    return ob.get_include_dir(), ob.get_lib_dir(), ob.get_library()


def archs(cuda: cudafind.Cuda) -> list[str]:
    env = os.environ.get("PYXTTS_CUDA_ARCHS", "").replace(";", " ").replace(",", " ").split()
    return env or DEFAULT_ARCHS.get(cuda.version[0], ["75", "80", "86", "89", "90"])


cuda = cudafind.find()
if cuda is None:
    print("pyxtts: building the CPU-only module ("
          + ("PYXTTS_CUDA=0" if cudafind.mode() == "0" else "nvcc not found in $CUDA_HOME, /usr/local/cuda or PATH")
          + ")", flush=True)

sanitize = flag("PYXTTS_SANITIZE")
debug = flag("PYXTTS_DEBUG")
blas_inc, blas_lib, blas_name = openblas()

c_sources = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "csrc").rglob("*.c"))
cu_sources = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "cuda").glob("*.cu")) if cuda else []

opt = ["-O0", "-g"] if debug else ["-O2", "-g1"]
san = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer"] if sanitize else []
compile_args = ["-std=c11", "-Wall", "-Wextra", "-Werror", "-fvisibility=hidden", "-fopenmp", *opt, *san]
link_args = [*san, "-fopenmp", "-Wl,-rpath,$ORIGIN/../scipy_openblas32/lib", f"-Wl,-rpath,{blas_lib}"]
install_requires = ["numpy>=2.0", "ml-dtypes>=0.4", "scipy-openblas32>=0.3.27", "safetensors>=0.4", "pyyaml>=6",
                    "tqdm>=4.60"]
if cuda and cuda.cublas_from_wheel:
    install_requires.append(cudafind.cublas_wheel_requirement(cuda.version[0]))


def configure_cuda(ext: Extension) -> None:
    """Adds the CUDA backend to the extension. Runs at build time: when cuBLAS comes
    from its wheel, the wheel is only installed once the build requirements are."""
    global cuda
    if cuda.cublas_include is None:
        cuda = cudafind.find()
    if cuda.cublas_include is None:
        raise SystemExit(
            f"pyxtts: nvcc {cuda.version[0]}.{cuda.version[1]} found but no cuBLAS headers in {cuda.home}/include "
            f"nor in an installed wheel; `pip install '{cudafind.cublas_wheel_requirement(cuda.version[0])}'` "
            "or set PYXTTS_CUDA=0 for a CPU-only build")
    arch_list = archs(cuda)
    ext.define_macros += [("PXT_WITH_CUDA", "1"),
                          ("PXT_CUDA_ARCHS", '"' + " ".join(f"sm_{a}" for a in arch_list) + '"')]
    ext.include_dirs.append(str(cuda.cublas_include))
    # the CUDA objects join as extra_objects, which build_ext's up-to-date check ignores:
    # name their sources so a changed .cu relinks the module
    ext.depends += cu_sources + sorted(str(p.relative_to(ROOT)) for p in (ROOT / "cuda").glob("*.cuh"))
    ext.depends += sorted(str(p.relative_to(ROOT)) for p in (ROOT / "cuda").glob("*.h"))
    libdir = cuda.home / "lib64" if (cuda.home / "lib64").is_dir() else cuda.home / "lib"
    # cudart statically (no runtime dependency on a toolkit); cuBLAS and cuBLASLt from their
    # wheel or the toolkit (wheels ship no unversioned .so); nvcc's launch stubs need libstdc++
    ext.extra_objects.append(str(libdir / "libcudart_static.a"))
    ext.extra_link_args += [f"-L{cuda.cublas_lib}", f"-l:libcublas.so.{cuda.version[0]}",
                            f"-l:libcublasLt.so.{cuda.version[0]}", "-lrt", "-ldl",
                            "-lpthread", "-lstdc++", f"-Wl,-rpath,{cuda.cublas_lib}"]
    if cuda.cublas_from_wheel:
        ext.extra_link_args.append(f"-Wl,-rpath,$ORIGIN/../nvidia/cu{cuda.version[0]}/lib")
    print(f"pyxtts: building with CUDA {cuda.version[0]}.{cuda.version[1]} ({cuda.nvcc}) for "
          + ", ".join(f"sm_{a}" for a in arch_list), flush=True)


class BuildExt(build_ext):
    """Compiles cuda/*.cu with nvcc first; their objects join the extension."""

    def build_extension(self, ext):
        if cuda:
            configure_cuda(ext)
            ext.extra_objects = self.compile_cuda() + ext.extra_objects
        super().build_extension(ext)

    def compile_cuda(self) -> list[str]:
        out_dir = Path(self.build_temp) / "cuda"
        out_dir.mkdir(parents=True, exist_ok=True)
        arch_list = archs(cuda)
        gencode = []
        for a in arch_list:
            gencode += ["-gencode", f"arch=compute_{a},code=sm_{a}"]
        gencode += ["-gencode", f"arch=compute_{arch_list[-1]},code=compute_{arch_list[-1]}"]
        # the backend table is filled with designated initializers; absent ops stay
        # NULL on purpose, which g++ (unlike gcc) reports as missing initializers
        host = ["-fPIC", "-Wall", "-Wextra", "-Werror", "-fvisibility=hidden", "-Wno-missing-field-initializers"]
        objects = []
        for src in cu_sources:
            obj = out_dir / (Path(src).stem + ".o")
            # -fmad=false: a * b + c rounds twice, as in the CPU backend's C11 code, so the
            # elementwise kernels and AdamW reproduce its bits; hot loops use fmaf() explicitly
            cmd = [str(cuda.nvcc), "-std=c++20", "-O3", "-lineinfo", "-fmad=false", "-Werror", "all-warnings",
                   "-Xcompiler", ",".join(host), "-DPXT_WITH_CUDA=1", "-Icsrc", f"-I{cuda.cublas_include}",
                   *gencode, "-c", src, "-o", str(obj)]
            print("pyxtts: nvcc", src, flush=True)
            subprocess.run(cmd, check=True, cwd=ROOT)
            objects.append(str(obj))
        return objects


setup(
    version=VERSION,
    install_requires=install_requires,
    ext_modules=[Extension(
        "pyxtts._C",
        sources=c_sources,
        include_dirs=["csrc", blas_inc, numpy.get_include()],
        define_macros=[("PXT_VERSION", f'"{VERSION}"')],
        libraries=[blas_name],
        library_dirs=[blas_lib],
        extra_compile_args=compile_args,
        extra_link_args=link_args,
    )],
    cmdclass={"build_ext": BuildExt},
    package_data={"pyxtts": ["configs/*.yaml", "py.typed"]},
)
