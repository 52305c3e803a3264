"""The build's own tools (build_support/): the object cache with real gcc
compiles, the compile pool, the choice of GPU architectures, and the messages
of a module that does not load (pyxtts/_origin.py)."""
from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SUPPORT = ROOT / "build_support"


def load(name: str):
    """A build_support module, by path: the suite imports the installed pyxtts,
    whose wheel has no build_support/."""
    sys.path.insert(0, str(SUPPORT))  # units imports objcache by name, as setup.py arranges
    try:
        spec = importlib.util.spec_from_file_location(name, SUPPORT / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod  # dataclasses look their module up there
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(SUPPORT))


objcache = load("objcache")
units = load("units")
cudafind = load("cudafind")
GCC = shutil.which("gcc")
needs_gcc = pytest.mark.skipif(GCC is None, reason="no gcc on PATH")


# ---- depfiles ------------------------------------------------------------------------

def test_parse_depfile_gcc_and_nvcc_styles():
    gcc = "obj/a.o: src/a.c /usr/include/stdio.h \\\n  inc/my\\ header.h\n"
    assert objcache.parse_depfile(gcc) == ["src/a.c", "/usr/include/stdio.h", "inc/my header.h"]
    nvcc = "/tmp/b.o : cuda/b.cu \\\n    /usr/local/cuda/bin/../targets/x86_64-linux/include/cuda_runtime.h \\\n    cuda/b.cuh\n"
    assert objcache.parse_depfile(nvcc) == [
        "cuda/b.cu", "/usr/local/cuda/bin/../targets/x86_64-linux/include/cuda_runtime.h", "cuda/b.cuh"]


# ---- the object cache, with gcc ---------------------------------------------------------

@pytest.fixture
def project(tmp_path, monkeypatch, seed):
    """A checkout with two sources and a header in an include folder outside it
    (as a build environment's numpy headers are), and a cache folder."""
    root = tmp_path / "checkout"
    (root / "src").mkdir(parents=True)
    inc = tmp_path / "env-1" / "include"
    inc.mkdir(parents=True)
    (inc / "value.h").write_text(f"#define VALUE {seed % 1000}\n")
    (root / "src" / "a.c").write_text('#include "value.h"\nint a(void) { return VALUE; }\n')
    (root / "src" / "b.c").write_text("int b(int x) { return x * 3; }\n")
    monkeypatch.setenv("PYXTTS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("PYXTTS_CACHE", raising=False)
    return root, inc


def gcc_units(root: Path, inc: Path, build: Path, flags=("-O2",)) -> list:
    identity = units.compiler_identity(GCC)
    return [units.Unit("cc", [GCC], ["-fPIC", *flags], [str(inc)], root / "src" / f"{n}.c",
                       build / f"{n}.o", identity) for n in ("a", "b")]


def build(root, inc, build_dir, capsys, flags=("-O2",)) -> dict[str, str]:
    """Runs the pool; returns {source name: "cc" | "cached"} from its progress lines."""
    cache = objcache.ObjectCache(objcache.default_dir())
    units.Pool(root, 2, cache, None).run(gcc_units(root, inc, build_dir, flags))
    out = capsys.readouterr().out
    how = {Path(m[2]).stem: m[1] for m in re.finditer(r"^pyxtts: \[[ \d]+/\d+\] (\S+)\s+(\S+)  [\d.]+ s$", out, re.M)}
    assert set(how) == {"a", "b"}, out
    return how


def fresh_object(root, inc, flags, name, tmp_path) -> bytes:
    """What gcc gives for one unit without any cache."""
    out = tmp_path / f"fresh-{name}.o"
    u = next(u for u in gcc_units(root, inc, tmp_path / "unused", flags) if u.source.stem == name)
    subprocess.run([*u.compiler, *u.flags, f"-I{inc}", "-c", str(u.source), "-o", str(out)], cwd=root,
                   check=True)
    return out.read_bytes()


@needs_gcc
def test_cache_hits_only_when_sources_headers_and_flags_are_the_same(project, tmp_path, capsys):
    root, inc = project
    b1 = tmp_path / "build1"
    assert build(root, inc, b1, capsys) == {"a": "cc", "b": "cc"}
    first_a = (b1 / "a.o").read_bytes()
    assert first_a == fresh_object(root, inc, ("-O2",), "a", tmp_path)

    # another build folder (pip's, or a variant's): both from the cache, the same bytes
    b2 = tmp_path / "build2"
    assert build(root, inc, b2, capsys) == {"a": "cached", "b": "cached"}
    assert (b2 / "a.o").read_bytes() == first_a

    # a header's bytes change: only its includer compiles, to what gcc gives now
    original = (inc / "value.h").read_text()
    (inc / "value.h").write_text("#define VALUE -7\n")
    assert build(root, inc, tmp_path / "build3", capsys) == {"a": "cc", "b": "cached"}
    assert (tmp_path / "build3" / "a.o").read_bytes() == fresh_object(root, inc, ("-O2",), "a", tmp_path)
    assert (tmp_path / "build3" / "a.o").read_bytes() != first_a

    # the header back as it was: the first object again, from the cache
    (inc / "value.h").write_text(original)
    assert build(root, inc, tmp_path / "build4", capsys) == {"a": "cached", "b": "cached"}
    assert (tmp_path / "build4" / "a.o").read_bytes() == first_a

    # other flags (another variant: CUDA / CPU-only, sanitizers): nothing is reused
    assert build(root, inc, tmp_path / "build5", capsys, flags=("-O0",)) == {"a": "cc", "b": "cc"}
    assert (tmp_path / "build5" / "a.o").read_bytes() == fresh_object(root, inc, ("-O0",), "a", tmp_path)


@needs_gcc
def test_cache_survives_a_moved_include_folder(project, tmp_path, capsys):
    """pip's isolated builds put numpy's headers in a new temporary folder each time."""
    root, inc = project
    assert build(root, inc, tmp_path / "b1", capsys) == {"a": "cc", "b": "cc"}
    moved = tmp_path / "env-2" / "include"
    shutil.copytree(inc, moved)
    shutil.rmtree(inc)
    assert build(root, moved, tmp_path / "b2", capsys) == {"a": "cached", "b": "cached"}
    # same path, other bytes under it: a miss
    (moved / "value.h").write_text("#define VALUE 12345\n")
    assert build(root, moved, tmp_path / "b3", capsys)["a"] == "cc"


@needs_gcc
def test_cache_recompiles_when_an_object_was_pruned(project, tmp_path, capsys):
    root, inc = project
    build(root, inc, tmp_path / "b1", capsys)
    cache_dir = objcache.default_dir()
    objects = list((cache_dir / "objects").glob("*/*.o"))
    assert len(objects) == 2
    for p in objects:
        p.unlink()
    assert build(root, inc, tmp_path / "b2", capsys) == {"a": "cc", "b": "cc"}
    objcache.ObjectCache(cache_dir).prune(max_bytes=0)  # drops everything
    assert not list((cache_dir / "objects").glob("*/*.o"))


@needs_gcc
def test_an_unwritable_cache_costs_hits_not_the_build(project, tmp_path, capsys):
    root, inc = project
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    cache = objcache.ObjectCache(blocker / "cache")  # under a file: every write fails
    units.Pool(root, 2, cache, None).run(gcc_units(root, inc, tmp_path / "b1"))
    out = capsys.readouterr().out
    assert out.count("pyxtts: not cached (") == 2, out
    assert (tmp_path / "b1" / "a.o").read_bytes() == fresh_object(root, inc, ("-O2",), "a", tmp_path)


def test_cache_location_and_switch(monkeypatch, tmp_path):
    monkeypatch.delenv("PYXTTS_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("PYXTTS_CACHE", raising=False)
    assert objcache.default_dir() == tmp_path / "xdg" / "pyxtts"
    monkeypatch.setenv("PYXTTS_CACHE_DIR", str(tmp_path / "mine"))
    assert objcache.default_dir() == tmp_path / "mine"
    monkeypatch.setenv("PYXTTS_CACHE", "0")
    assert objcache.default_dir() is None


@needs_gcc
def test_pool_reports_the_failing_unit_and_its_output(tmp_path, capsys):
    root = tmp_path / "checkout"
    (root / "src").mkdir(parents=True)
    (root / "src" / "bad.c").write_text("int broken(void) { return undeclared_name; }\n")
    (root / "src" / "ok.c").write_text("int fine(void) { return 1; }\n")
    identity = units.compiler_identity(GCC)
    todo = [units.Unit("cc", [GCC], ["-Werror"], [], root / "src" / f"{n}.c", tmp_path / f"{n}.o", identity)
            for n in ("bad", "ok")]
    with pytest.raises(units.CompileError, match=r"(?s)cc failed on src/bad\.c.*undeclared_name"):
        units.Pool(root, 1, None, None).run(todo)


def test_jobs_from_the_environment(monkeypatch):
    monkeypatch.setenv("PYXTTS_BUILD_JOBS", "3")
    assert units.jobs() == 3
    monkeypatch.delenv("PYXTTS_BUILD_JOBS")
    assert units.jobs() == len(os.sched_getaffinity(0))
    for bad in ("0", "-2", "two"):
        monkeypatch.setenv("PYXTTS_BUILD_JOBS", bad)
        with pytest.raises(SystemExit, match=f"PYXTTS_BUILD_JOBS must be a positive integer, got '{bad}'"):
            units.jobs()


def test_weight_counts_a_template_header_once_per_include(tmp_path):
    (tmp_path / "tile.h").write_text("x" * 1000)
    (tmp_path / "guarded.h").write_text("y" * 100)
    src = tmp_path / "a.c"
    src.write_text('#include "tile.h"\n#include "tile.h"\n#include "guarded.h"\n#include <stdio.h>\n')
    assert units.weight(src, []) == len(src.read_text()) + 2 * 1000 + 100


# ---- GPU architectures ----------------------------------------------------------------

SUPPORTED = ["75", "80", "86", "87", "89", "90", "100", "120"]


@pytest.fixture
def toolkit(monkeypatch):
    monkeypatch.setattr(cudafind, "supported_archs", lambda nvcc: list(SUPPORTED))
    monkeypatch.delenv("PYXTTS_CUDA_ARCHS", raising=False)
    return Path("/nonexistent/nvcc")


def test_archs_from_the_environment(toolkit, monkeypatch):
    monkeypatch.setattr(cudafind, "visible_archs", lambda: ["86"])
    monkeypatch.setenv("PYXTTS_CUDA_ARCHS", "90;80, sm_75")
    assert cudafind.choose_archs(toolkit) == (["75", "80", "90"], "PYXTTS_CUDA_ARCHS")
    monkeypatch.setenv("PYXTTS_CUDA_ARCHS", "90a")
    assert cudafind.choose_archs(toolkit)[0] == ["90a"]
    for bad in ("70", "9.0", "ninety", "90x"):
        monkeypatch.setenv("PYXTTS_CUDA_ARCHS", bad)
        with pytest.raises(SystemExit, match=f"PYXTTS_CUDA_ARCHS: expected architectures among 75 80 .*got '{bad}'"):
            cudafind.choose_archs(toolkit)


def test_archs_of_the_visible_gpus(toolkit, monkeypatch):
    monkeypatch.setattr(cudafind, "visible_archs", lambda: ["90", "86"])
    assert cudafind.choose_archs(toolkit) == (["86", "90"], "the visible GPUs")
    # newer than the toolkit: its newest, whose PTX the driver compiles at load
    monkeypatch.setattr(cudafind, "visible_archs", lambda: ["130"])
    assert cudafind.choose_archs(toolkit)[0] == ["120"]
    # older than the toolkit supports: nothing for it, the default list
    monkeypatch.setattr(cudafind, "visible_archs", lambda: ["70"])
    assert cudafind.choose_archs(toolkit) == (cudafind.DEFAULT_ARCHS, "no GPU visible: the default list")


def test_default_archs_without_a_gpu(toolkit, monkeypatch):
    monkeypatch.setattr(cudafind, "visible_archs", lambda: [])
    archs, why = cudafind.choose_archs(toolkit)
    assert archs == cudafind.DEFAULT_ARCHS and "90" in archs and why.startswith("no GPU visible")


def test_gencode_embeds_ptx_of_the_newest():
    assert cudafind.gencode(["80", "90"]) == ["-gencode", "arch=compute_80,code=sm_80",
                                              "-gencode", "arch=compute_90,code=[sm_90,compute_90]"]
    assert cudafind.gencode(["90"]) == ["-gencode", "arch=compute_90,code=[sm_90,compute_90]"]


def fake_smi(tmp_path, monkeypatch, script: str) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    smi = bindir / "nvidia-smi"
    smi.write_text("#!/bin/sh\n" + script)
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")


def test_visible_archs_reads_nvidia_smi(tmp_path, monkeypatch):
    fake_smi(tmp_path, monkeypatch, 'echo "9.0"; echo "8.6"; echo "9.0"\n')
    assert cudafind.visible_archs() == ["86", "90"]
    fake_smi(tmp_path, monkeypatch, 'echo "NVIDIA-SMI has failed" >&2; exit 9\n')
    assert cudafind.visible_archs() == []
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert cudafind.visible_archs() == []


# ---- a module that does not load ----------------------------------------------------------

@pytest.fixture
def origin(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("pyxtts_origin_under_test", ROOT / "pyxtts" / "_origin.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    pkg = tmp_path / "site" / "pyxtts"
    pkg.mkdir(parents=True)
    monkeypatch.setattr(mod, "PACKAGE", pkg)
    monkeypatch.setattr(sys, "path", [str(tmp_path / "nothing-here")])
    return mod, pkg


def make_checkout(pkg: Path) -> None:
    (pkg.parent / "setup.py").write_text("")
    (pkg.parent / "csrc").mkdir()


def test_load_error_names_the_missing_library(origin):
    mod, pkg = origin
    (pkg / ("_C" + importlib.machinery.EXTENSION_SUFFIXES[0])).write_bytes(b"")
    err = mod.load_error(ImportError("libcublas.so.13: cannot open shared object file: No such file or directory"))
    text = str(err)
    assert "did not load: libcublas.so.13: cannot open shared object file" in text
    assert "pip install 'nvidia-cublas>=13,<14'" in text and "PYXTTS_CUDA=0" in text
    assert "not built" not in text


def test_load_error_in_a_checkout_points_to_the_installed_copy(origin, tmp_path, monkeypatch):
    mod, pkg = origin
    make_checkout(pkg)
    text = str(mod.load_error(ImportError("No module named 'pyxtts._C'")))
    assert "source folder, with no C extension built in it" in text and "build_ext --inplace" in text
    installed = tmp_path / "venv-site"
    (installed / "pyxtts").mkdir(parents=True)
    (installed / "pyxtts" / "__init__.py").write_text("")
    monkeypatch.setattr(sys, "path", [str(pkg.parent), str(installed)])
    assert f"an installed pyxtts is at {installed / 'pyxtts'}" in str(mod.load_error(ImportError("x")))


def test_load_error_of_an_incomplete_install(origin):
    mod, pkg = origin
    text = str(mod.load_error(ImportError("x")))
    assert f"missing from {pkg}" in text and "reinstall" in text


def test_checkout_build_shadowing_an_installed_copy_warns(origin, tmp_path, monkeypatch):
    mod, pkg = origin
    make_checkout(pkg)
    with_warnings = []
    monkeypatch.setattr(mod.warnings, "warn", lambda msg, stacklevel=1: with_warnings.append(msg))
    mod.warn_if_shadowing()
    assert with_warnings == []  # no other copy: nothing to confuse it with
    installed = tmp_path / "venv-site"
    (installed / "pyxtts").mkdir(parents=True)
    (installed / "pyxtts" / "__init__.py").write_text("")
    monkeypatch.setattr(sys, "path", ["", str(installed)])
    monkeypatch.chdir(pkg.parent)  # "" on sys.path is the checkout itself
    mod.warn_if_shadowing()
    assert len(with_warnings) == 1 and f"not from the installed copy at {installed / 'pyxtts'}" in with_warnings[0]
