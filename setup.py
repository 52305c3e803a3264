"""Builds pyxtts._C: the C core always, the CUDA backend when nvcc is found.

Environment (docs/install.md has the details and the build times):
  PYXTTS_CUDA=0|1        force CPU-only / require CUDA (default: CUDA when nvcc is found)
  PYXTTS_CUDA_ARCHS      e.g. "80 90" (default: the architectures of the GPUs nvidia-smi
                         sees, else cudafind.DEFAULT_ARCHS); PTX of the newest is embedded
                         so that newer GPUs compile it at load
  PYXTTS_BUILD_JOBS      compile jobs at once (default: the cores this process may use)
  PYXTTS_CACHE=0         no object cache; PYXTTS_CACHE_DIR moves it (build_support/objcache.py)
  PYXTTS_CCACHE=0        do not use ccache even when it is on PATH
  PYXTTS_SANITIZE=1      build the C code with -fsanitize=address,undefined
  PYXTTS_DEBUG=1         -O0 -g
  PYXTTS_WERROR=0        warnings stay warnings (a compiler newer than CI's may warn anew)

Every build compiles every unit through the object cache (or ccache), whose keys
are the bytes of the sources and headers read and the exact flags, never file
times: a build of another variant (CPU-only after CUDA, sanitizers, other
architectures) cannot reuse an object or a module built for the last one.
"""
from __future__ import annotations

import os
import sys
import sysconfig
from pathlib import Path

import numpy
from setuptools import Extension, setup
from setuptools._distutils.ccompiler import gen_preprocess_options
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "build_support"))
import cudafind  # noqa: E402
import objcache  # noqa: E402
import units  # noqa: E402

VERSION = "0.1.0"
INCLUDE_DIRS = ["csrc"]  # the project's own headers, for the C and the CUDA sources


def flag(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0")


def openblas():
    import scipy_openblas32 as ob

    return ob.get_include_dir(), ob.get_lib_dir(), ob.get_library()


cuda = cudafind.find()
if cuda is None:
    print("pyxtts: building the CPU-only module ("
          + ("PYXTTS_CUDA=0" if cudafind.mode() == "0" else "nvcc not found in $CUDA_HOME, /usr/local/cuda or PATH")
          + ")", flush=True)

sanitize = flag("PYXTTS_SANITIZE")
debug = flag("PYXTTS_DEBUG")
# CI builds with -Werror; a user's newer compiler may add warnings CI never saw
werror = ["-Werror"] if os.environ.get("PYXTTS_WERROR", "1").strip() != "0" else []
blas_inc, blas_lib, blas_name = openblas()


def files(folder: str, *patterns: str) -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for pat in patterns for p in (ROOT / folder).rglob(pat))


# cuda/*.c: the CUDA backend's plain-C part (its workspace sizes), in every build
c_sources = files("csrc", "*.c") + files("cuda", "*.c")
cu_sources = files("cuda", "*.cu") if cuda else []

opt = ["-O0", "-g"] if debug else ["-O2", "-g1"]
# -fno-wrapv: CPython's own flags carry -fwrapv, which defines signed overflow and so hides it
# from UBSan; ours come later on the command line and win
san = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer",
       "-fno-wrapv"] if sanitize else []
# -fno-math-errno: nothing reads errno after sqrtf, and with it set GCC keeps every sqrtf
# a possible library call, which stops loops with one from vectorising (AdamW's update);
# sqrt stays the IEEE instruction either way, so no result changes
compile_args = ["-std=c11", "-Wall", "-Wextra", *werror, "-fvisibility=hidden", "-fopenmp", "-fno-math-errno", *opt,
                *san]
link_args = [*san, "-fopenmp"]
install_requires = ["numpy>=2.0", "ml-dtypes>=0.4", "scipy-openblas32>=0.3.27", "safetensors>=0.4", "pyyaml>=6",
                    "tqdm>=4.60"]
if cuda and cuda.cublas_from_wheel:
    install_requires.append(cudafind.cublas_wheel_requirement(cuda.version[0]))


def runpath(inplace: bool) -> list[str]:
    """Where the module finds its shared libraries at run time, in this order:
    the wheels installed beside it (site-packages/pyxtts/../), then, for a build
    in the source tree only, this environment's copies by absolute path. A wheel
    never records a path of the (temporary) build environment.

    cuBLAS: the nvidia-cublas wheel of the environment comes before the toolkit's
    library, so that pyxtts and PyTorch (whose CUDA wheels depend on it) load the
    same libcublas.so.N whichever is imported first."""
    dirs = ["$ORIGIN/../scipy_openblas32/lib"]
    if inplace:
        dirs.append(blas_lib)
    if cuda:
        wheel = f"nvidia/cu{cuda.version[0]}/lib" if cuda.version[0] >= 13 else "nvidia/cublas/lib"
        dirs.append(f"$ORIGIN/../{wheel}")
        if inplace:
            dirs.append(str(Path(sysconfig.get_paths()["platlib"]) / wheel))
        if not cuda.cublas_from_wheel:
            dirs.append(str(cuda.cublas_lib))
    return dirs


def configure_cuda(ext: Extension) -> list[str]:
    """Adds the CUDA backend's flags to the extension and returns nvcc's flags.
    Runs at build time: when cuBLAS comes from its wheel, the wheel is only
    installed once the build requirements are."""
    global cuda
    if cuda.cublas_include is None:
        cuda = cudafind.find()
    if cuda.cublas_include is None:
        raise SystemExit(
            f"pyxtts: nvcc {cuda.version[0]}.{cuda.version[1]} found but no cuBLAS headers in {cuda.home}/include "
            f"nor in an installed wheel; `pip install '{cudafind.cublas_wheel_requirement(cuda.version[0])}'` "
            "or set PYXTTS_CUDA=0 for a CPU-only build")
    archs, why = cudafind.choose_archs(cuda.nvcc)
    ext.define_macros += [("PXT_WITH_CUDA", "1"),
                          ("PXT_CUDA_ARCHS", '"' + " ".join(f"sm_{a}" for a in archs) + '"')]
    ext.include_dirs.append(str(cuda.cublas_include))
    libdir = cuda.home / "lib64" if (cuda.home / "lib64").is_dir() else cuda.home / "lib"
    # cudart statically (no runtime dependency on a toolkit); cuBLAS and cuBLASLt from their
    # wheel or the toolkit (wheels ship no unversioned .so); nvcc's launch stubs need libstdc++
    ext.extra_objects.append(str(libdir / "libcudart_static.a"))
    ext.extra_link_args += [f"-L{cuda.cublas_lib}", f"-l:libcublas.so.{cuda.version[0]}",
                            f"-l:libcublasLt.so.{cuda.version[0]}", "-lrt", "-ldl", "-lpthread",
                            "-lstdc++"]
    print(f"pyxtts: building with CUDA {cuda.version[0]}.{cuda.version[1]} ({cuda.nvcc}) for "
          + ", ".join(f"sm_{a}" for a in archs) + f" + PTX {archs[-1]} ({why})", flush=True)
    # the backend table is filled with designated initializers; absent ops stay
    # NULL on purpose, which g++ (unlike gcc) reports as missing initializers
    host = ["-fPIC", "-Wall", "-Wextra", *werror, "-fvisibility=hidden", "-Wno-missing-field-initializers"]
    # -fmad=false: a * b + c rounds twice, as in the CPU backend's C11 code, so the
    # elementwise kernels and AdamW reproduce its bits; hot loops use fmaf() explicitly
    return ["-std=c++20", "-O3", "-lineinfo", "-fmad=false", *(["-Werror", "all-warnings"] if werror else []),
            "-Xcompiler", ",".join(host), "-DPXT_WITH_CUDA=1", *cudafind.gencode(archs)]


class BuildExt(build_ext):
    """Compiles the C and CUDA sources as one pool of units (build_support/units.py)
    through the object cache, then links as setuptools does."""

    def finalize_options(self):
        super().finalize_options()
        self.force = True  # the cache, not file times, decides what is compiled
        # setuptools' run() clears inplace while it builds (it copies the module after)
        self.into_source = bool(self.inplace)

    def build_extension(self, ext):
        self._cuda_units = []
        rpath = runpath(self.into_source)
        if cuda:
            nvcc_flags = configure_cuda(ext)
            identity = units.compiler_identity(str(cuda.nvcc), "gcc")
            include = [str(ROOT / d) for d in INCLUDE_DIRS] + [str(cuda.cublas_include)]
            for src in cu_sources:
                obj = (Path(self.build_temp) / src).with_suffix(".o").resolve()
                self._cuda_units.append(units.Unit("nvcc", [str(cuda.nvcc)], nvcc_flags, include,
                                                   ROOT / src, obj, identity))
            ext.extra_objects = [str(u.obj) for u in self._cuda_units] + ext.extra_objects
        ext.extra_link_args += [f"-Wl,-rpath,{d}" for d in rpath]
        self.compiler.compile = self.compile_units  # setuptools calls it once, with the C sources
        super().build_extension(ext)

    def compile_units(self, sources, output_dir=None, macros=None, include_dirs=None, debug=0,
                      extra_preargs=None, extra_postargs=None, depends=None):
        """CCompiler.compile's contract (returns the C objects), run as units
        together with the CUDA ones."""
        cc = self.compiler
        flags = [*gen_preprocess_options([*cc.macros, *(macros or [])], []), *(["-g"] if debug else []),
                 *(extra_preargs or []), *(extra_postargs or [])]
        include = [str(Path(d).resolve()) for d in [*(include_dirs or []), *cc.include_dirs]]
        identity = units.compiler_identity(cc.compiler_so[0])
        objects = [Path(o).resolve() for o in cc.object_filenames(sources, output_dir=output_dir)]
        c_units = [units.Unit("cc", list(cc.compiler_so), flags, include, (ROOT / s).resolve(), o, identity)
                   for s, o in zip(sources, objects)]
        cache_dir = objcache.default_dir()
        launcher = units.ccache()
        cache = objcache.ObjectCache(cache_dir) if cache_dir and not launcher else None
        print(f"pyxtts: compiling {len(c_units)} C and {len(self._cuda_units)} CUDA units, "
              + (f"cached by {launcher}" if launcher else f"cache {cache_dir}" if cache else "no cache"),
              flush=True)
        units.Pool(ROOT, units.jobs(), cache, launcher).run([*self._cuda_units, *c_units])
        return [str(o) for o in objects]


setup(
    version=VERSION,
    install_requires=install_requires,
    ext_modules=[Extension(
        "pyxtts._C",
        sources=c_sources,
        include_dirs=[*(str(ROOT / d) for d in INCLUDE_DIRS), blas_inc, numpy.get_include()],
        define_macros=[("PXT_VERSION", f'"{VERSION}"')],
        libraries=[blas_name],
        library_dirs=[blas_lib],
        extra_compile_args=compile_args,
        extra_link_args=link_args,
    )],
    cmdclass={"build_ext": BuildExt},
    package_data={"pyxtts": ["py.typed"], "pyxtts.configs": ["*.yaml"]},
)
