"""tests/bench/gpu_check.sh, the GPU session's two runs, checked where no GPU is: its
syntax, both runs' structure in dry-run mode (every step named, summarised, logged into
the output folder) and its time limits (a step that runs out is killed and reported)."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent / "bench" / "gpu_check.sh"
BASH = shutil.which("bash")
pytestmark = pytest.mark.skipif(not (BASH and shutil.which("timeout")), reason="needs bash and timeout")

# run A builds through tests/bench/gpu_build.sh where the tree has it, else by itself
BUILD = (["build"] if (SCRIPT.parent / "gpu_build.sh").exists() else
         ["versions", "wheels", "build", "imports-pyxtts-first", "imports-torch-first", "copy-extension"])
STEPS = {"A": BUILD + ["kernel-tests", "memcheck", "device-tests"],
         "B": ["versions", "wheels", "extension", "ops", "xtts-torch_eager", "xtts-torch_compile",
               "xtts-pyxtts_none", "xtts-pyxtts_full", "attention"]}


def test_syntax():
    subprocess.run([BASH, "-n", str(SCRIPT)], check=True)


@pytest.mark.parametrize("run", ["A", "B"])
def test_dry_run_structure(tmp_path, run):
    out = tmp_path / "out"
    p = subprocess.run([BASH, str(SCRIPT), str(out), run], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYXTTS_GPU_CHECK_DRY": "1"})
    assert p.returncode == 0, p.stdout + p.stderr
    summary = (out / f"summary_{run}.txt").read_text().splitlines()
    assert [line.split()[0] for line in summary] == STEPS[run]
    assert all(" exit 0 " in line for line in summary)
    log = (out / f"run_{run}.log").read_text()
    assert f"gpu_check.sh run {run}" in log and f"=== summary of run {run}" in log


def test_usage_error(tmp_path):
    p = subprocess.run([BASH, str(SCRIPT), str(tmp_path), "C"], capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and "usage:" in p.stderr


def test_a_step_past_its_limit_is_killed_and_reported(tmp_path):
    summary = tmp_path / "s.txt"
    code = f'source "{SCRIPT}"; SUMMARY="{summary}"; step slow 1 sleep 30; echo "rc=$?"'
    p = subprocess.run([BASH, "-c", code], capture_output=True, text=True, timeout=30)
    assert "rc=124" in p.stdout and "ran out of its 1s" in p.stdout, p.stdout + p.stderr
    assert summary.read_text().split()[:3] == ["slow", "exit", "124"]
