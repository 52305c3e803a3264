"""Shared memory per block against the cards the build targets, without a GPU
(tests/bench/check_smem.py does the full sweep: every source, sm_75 and sm_86).

- Every kernel launch asks for no dynamic shared memory but the tensor-core attention's,
  and only attention_tc.cuh opts in to more than 48 KiB: a source scan, instant. Static
  shared memory needs no per-card check: nvcc refuses more than 48 KiB of it, which
  every GPU grants.
- The tensor-core attention's largest instance (float16, D = 128), compiled for sm_86 by
  nvcc with the build's flags: its kernels' static shared memory, which ptxas reports,
  plus the dynamic size attention_tc_plan.h asks for, fits an RTX 30xx/40xx (99 KiB), and
  the plan keeps the tensor-core path there; on sm_75 (64 KiB, no sm_80 code) it takes
  the general kernels. One nvcc call, about 10 s; skipped without nvcc or cuBLAS headers.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _load():
    spec = importlib.util.spec_from_file_location("check_smem", ROOT / "tests" / "bench" / "check_smem.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["check_smem"] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


check_smem = _load()


def test_only_the_tensor_core_attention_asks_for_dynamic_shared_memory():
    assert check_smem.launch_problems() == []


def test_the_scan_sees_a_launch_that_asks_for_shared_memory(tmp_path, monkeypatch):
    (tmp_path / "cuda").mkdir()
    (tmp_path / "cuda" / "k.cu").write_text(
        "k<<<dim3(a, b), 256, 0, s>>>(x);\nk<<<g, 128, 4096 * sizeof(float), s>>>(x);\n"
        "cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, n);\n")
    monkeypatch.setattr(check_smem, "ROOT", tmp_path)
    problems = check_smem.launch_problems()
    assert len(problems) == 2 and "k.cu:2:" in problems[0] and "4096 * sizeof(float)" in problems[0], problems


@pytest.mark.slow
@pytest.mark.skipif(check_smem.toolkit() is None, reason="needs nvcc and the cuBLAS headers")
def test_tensor_core_attention_fits_an_rtx_30_and_40_card(tmp_path):
    rows, problems = check_smem.check(["86"], [ROOT / "cuda" / "attention" / "tc_f16_d128.cu"], jobs=1,
                                      workdir=tmp_path)
    assert problems == [], problems
    tc = [r for r in rows if r.kernel.name.startswith("attn_tc_") and "reduce" not in r.kernel.name]
    # forward, dK/dV, dQ, one-pass backward; with and without dropout
    assert len(tc) == 8, [r.kernel.name for r in rows]
    assert all(r.dynamic > 48 << 10 and r.fits for r in tc), check_smem.table(rows)
    reduce = [r for r in rows if r.kernel.name.startswith("attn_tc_dq_reduce")]
    assert len(reduce) == 1 and reduce[0].dynamic == 0 and reduce[0].fits, check_smem.table(rows)
    # the same kernels on a Turing card: the plan takes the general kernels
    answer = check_smem.plan(tmp_path, "75", max(r.kernel.static for r in tc))
    assert all(why != "tc" for _, why in answer.values()), answer
