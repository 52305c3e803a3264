"""The build: build_info, the CLI, and how setup finds (or refuses) CUDA."""
from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

import pyxtts
from conftest import run_python

ROOT = Path(__file__).resolve().parent.parent


def load_cudafind():
    spec = importlib.util.spec_from_file_location("cudafind", ROOT / "build_support" / "cudafind.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["cudafind"] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def test_build_info_fields():
    info = pyxtts.build_info()
    assert set(info) >= {"cuda", "cuda_version", "cuda_archs", "blas", "compiler", "version"}
    assert isinstance(info["cuda"], bool)
    assert info["version"] == pyxtts.__version__
    assert "OpenBLAS" in info["blas"]
    if info["cuda"]:
        assert info["cuda_version"].count(".") == 1
        assert info["cuda_archs"] and all(a.startswith("sm_") for a in info["cuda_archs"])
        if pyxtts.cuda_available():
            # built for the visible GPU: machine code of its major version and no newer
            # minor one, or, for a GPU newer than every built one, the newest's PTX
            major, minor = pyxtts.device_info("cuda:0")["capability"]
            built = [tuple(map(int, re.fullmatch(r"sm_(\d+)(\d)[af]?", a).groups())) for a in info["cuda_archs"]]
            assert any(M == major and m <= minor for M, m in built) or (major, minor) > max(built), (
                f"no code for sm_{major}{minor} among {info['cuda_archs']}")
    else:
        assert info["cuda_version"] is None and info["cuda_archs"] == []


def test_cuda_available_matches_device_count():
    assert pyxtts.cuda_available() == (pyxtts.device_count() > 0)
    assert pyxtts.device_count("cpu") == 1
    with pytest.raises(ValueError, match="kind"):
        pyxtts.device_count("tpu")


def test_device_info_cpu():
    info = pyxtts.device_info("cpu")
    assert info["device"] == "cpu" and info["type"] == "cpu"
    assert info["total_memory"] > info["free_memory"] > 0
    assert info["multiprocessors"] >= 1


def test_cli_gpu_info_runs():
    res = run_python("from pyxtts.cli import main; main(['gpu-info', '--json'])")
    assert res.returncode == 0, res.stderr
    out = res.stdout
    data = json.loads(out)
    assert data["build"]["version"] == pyxtts.__version__
    assert data["devices"][0]["device"] == "cpu"
    text = run_python("from pyxtts.cli import main; main(['gpu-info'])").stdout
    assert "devices:" in text and "cpu" in text and "BLAS" in text


def test_cudafind_modes(monkeypatch):
    cf = load_cudafind()
    monkeypatch.setenv("PYXTTS_CUDA", "0")
    assert cf.find() is None
    monkeypatch.setenv("PYXTTS_CUDA", "1")
    monkeypatch.setattr(cf, "find_nvcc", lambda: None)
    with pytest.raises(SystemExit, match="PYXTTS_CUDA=1 but nvcc was not found"):
        cf.find()
    monkeypatch.delenv("PYXTTS_CUDA")
    assert cf.find() is None  # auto mode without nvcc: CPU-only, no error
    monkeypatch.setenv("PYXTTS_CUDA", "yes")
    with pytest.raises(SystemExit, match="PYXTTS_CUDA must be 0, 1 or unset"):
        cf.find()


def test_cublas_requirement_matches_toolkit_major():
    cf = load_cudafind()
    assert cf.cublas_wheel_requirement(13) == "nvidia-cublas>=13,<14"
    assert cf.cublas_wheel_requirement(12) == "nvidia-cublas-cu12"
