"""tests/bench/gpu_check.sh, the GPU session's two runs, checked where no GPU is: its
syntax, both runs' structure in dry-run mode (every step named, summarised, logged into
the output folder) and its time limits (a step that runs out is killed and reported)."""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
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
               "xtts-pyxtts_none", "xtts-pyxtts_full", "attention"],
         "ONE": ["build", "kernel-tests", "device-tests", "xtts-torch_eager", "xtts-pyxtts_full", "xtts-pyxtts_none",
                 "xtts-pyxtts_none-one-pass", "xtts-pyxtts_none-lt-bgrad", "graphs", "graphs-recipe", "offload", "ddp", "run-vs-step", "xtts-torch_compile", "ops-cold", "attention", "attention-dropout",
                 "memcheck", "memcheck-alone", "profile-core", "profile-recipe"]}


def test_syntax():
    subprocess.run([BASH, "-n", str(SCRIPT)], check=True)


def dry_run(out: Path, run: str) -> str:
    """The log of ``gpu_check.sh OUT RUN`` in dry-run mode (every step's command, none run)."""
    p = subprocess.run([BASH, str(SCRIPT), str(out), run], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYXTTS_GPU_CHECK_DRY": "1"})
    assert p.returncode == 0, p.stdout + p.stderr
    return (out / f"run_{run}.log").read_text()


@pytest.mark.parametrize("run", ["A", "B", "ONE"])
def test_dry_run_structure(tmp_path, run):
    out = tmp_path / "out"
    log = dry_run(out, run)
    summary = (out / f"summary_{run}.txt").read_text().splitlines()
    assert [line.split()[0] for line in summary] == STEPS[run]
    assert all(" exit 0 " in line for line in summary)
    assert f"gpu_check.sh run {run}" in log and f"=== summary of run {run}" in log
    # every script a step runs is in the tree
    for script in re.findall(r"tests/bench/[\w.]+\.(?:py|sh)", log):
        assert (SCRIPT.parents[2] / script).is_file(), script


def test_the_run_benchmark_of_run_one_works_on_the_cpu(tmp_path):
    """Run ONE's bench_run.py command as the GPU will run it, but on the CPU with the tiny
    model (the later options win): the script, its options and its JSON, checked where no
    GPU is, so that the GPU's minutes are not lost to a typo."""
    line = next(x for x in dry_run(tmp_path / "out", "ONE").splitlines() if x.startswith("=== [run-vs-step]"))
    args = shlex.split(line.split(": ", 1)[1])
    assert args[1] == "tests/bench/bench_run.py"
    out = tmp_path / "run.json"
    args = args[1:] + ["--json", str(out), "--device", "cpu", "--config", "tiny", "--steps", "4", "--warmup", "2",
                         "--threads", "1,2", "--repeats", "2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, *args], cwd=SCRIPT.parents[2], env=env, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    r = json.loads(out.read_text())
    assert "goal run >= 0.95 x step" in p.stdout and r["command"].startswith("python tests/bench/bench_run.py")
    assert r["complete"] is True and r["config"] == "tiny" and r["device"] == "cpu" and r["batch"] == 8
    assert r["positions_per_sample"] == 32 + 40 + 80  # latents, framed text and audio
    d = r["data_side"]
    assert d["ms_per_sample"] > 0 and d["cpu_ms_per_sample"] > 0 and d["mel_frames"] == 64
    assert [x["threads"] for x in r["scaling"]] == [1, 2] and all(x["batches_per_s"] > 0 for x in r["scaling"])
    assert r["step"]["steps"] == 4 and r["step"]["step_ms_median"] > 0 and r["step_tokens_per_s"] > 0
    assert [x["workers"] for x in r["runs"]] == [2, 4]  # run ONE's
    for x in r["runs"]:
        assert x["steps"] == 4 and x["positions"] == 4 * 8 * r["positions_per_sample"]
        assert 0 < x["ratio"] < 10 and x["tokens_per_s"] > 0 and 0 <= x["wait_share"] < 1
        assert 0 <= x["wait_ms_mean"] <= x["wait_ms_max"] and x["step_ms_median"] > 0
        # the collations ran on the run's worker threads, one per batch taken or prefetched
        assert 1 <= x["collating_threads"] <= x["workers"] and x["collations"] >= 2 + 4
        assert x["collate_ms_per_batch"] > 0 and x["collate_cpu_ms_per_batch"] > 0
    assert r["best_ratio"] == max(x["ratio"] for x in r["runs"]) and isinstance(r["goal_met"], bool)
    assert r["workers_needed"] in (None, 1, 2)


def test_usage_error(tmp_path):
    p = subprocess.run([BASH, str(SCRIPT), str(tmp_path), "C"], capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and "usage:" in p.stderr


def test_a_step_past_its_limit_is_killed_and_reported(tmp_path):
    summary = tmp_path / "s.txt"
    code = f'source "{SCRIPT}"; SUMMARY="{summary}"; step slow 1 sleep 30; echo "rc=$?"'
    p = subprocess.run([BASH, "-c", code], capture_output=True, text=True, timeout=30)
    assert "rc=124" in p.stdout and "ran out of its 1s" in p.stdout, p.stdout + p.stderr
    assert summary.read_text().split()[:3] == ["slow", "exit", "124"]


def test_run_one_cuts_each_limit_to_its_budget_and_skips_what_has_none(tmp_path):
    """Run ONE's budget: a step gets at most what is left of it (here 12 s of a 30 s limit:
    killed at 12), and one with under 10 s left is reported as not run, not started."""
    summary = tmp_path / "s.txt"
    code = (f'source "{SCRIPT}"; SUMMARY="{summary}"; DEADLINE=$((SECONDS + 12)); '
            'step first 30 sleep 30; echo "rc=$?"; step second 30 echo ran; echo "rc=$?"')
    p = subprocess.run([BASH, "-c", code], capture_output=True, text=True, timeout=60)
    assert "ran out of its 12s" in p.stdout and "rc=124" in p.stdout, p.stdout + p.stderr
    assert "=== [second] not run" in p.stdout and "rc=125" in p.stdout and "\nran\n" not in p.stdout
    lines = summary.read_text().splitlines()
    assert lines[0].split()[:3] == ["first", "exit", "124"] and lines[1].split()[:3] == ["second", "not", "run"]


def test_pack_puts_every_json_into_one_tar(tmp_path):
    """A remote runner may bring back as few as 8 files: run ONE's JSON travel in one tar."""
    import tarfile
    res, out = tmp_path / "res", tmp_path / "out"
    res.mkdir()
    out.mkdir()
    for name in ("a.json", "b.json"):
        (res / name).write_text("{}")
    code = f'source "{SCRIPT}"; OUTDIR="{out}"; pack "{res}"; (cd "{res}" && echo 1 > c.json); pack "{res}"'
    subprocess.run([BASH, "-c", code], check=True, timeout=30)
    with tarfile.open(out / "results.tar") as t:
        assert sorted(t.getnames()) == ["./a.json", "./b.json", "./c.json"]
    assert sorted(p.name for p in out.iterdir()) == ["results.tar"]
    # in a run, only what it wrote: the committed results are older than its summary
    summary = tmp_path / "summary.txt"
    code = (f'source "{SCRIPT}"; OUTDIR="{out}"; sleep 0.05; SUMMARY="{summary}"; : > "$SUMMARY"; sleep 0.05; '
            f'(cd "{res}" && echo 2 > d.json); pack "{res}"')
    subprocess.run([BASH, "-c", code], check=True, timeout=30)
    with tarfile.open(out / "results.tar") as t:
        assert t.getnames() == ["./d.json"]


def test_profile_diff_compares_kernel_families_across_runs(tmp_path):
    """tests/bench/profile_diff.py, the next GPU session's first reading of a new profile:
    on the committed H200 profiles it shows run 3's LayerNorm dinp kernel replacing run 2's,
    and a kernel renamed into the pxt_ prefix (adamw_kernel, xent) stays one family."""
    results = SCRIPT.parent / "results"
    script = SCRIPT.parent / "profile_diff.py"
    old, new = results / "profile_xtts_gpu_h200_run2.json", results / "profile_xtts_gpu_h200_run3.json"
    out = subprocess.run([sys.executable, str(script), str(old), str(new), "--top", "80"], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    assert re.search(r"-4\.995 +4\.995 +0\.000 +62->0  layernorm_dinp_kernel<pxt_bf16>", out), out
    assert re.search(r"\+0\.720 +0\.000 +0\.720 +0->62  ln_dinp_kernel<pxt_bf16, 8>", out), out
    data = json.loads(new.read_text())
    for k in data["recipe"]["kernels"]:  # the names this tree's kernels have now
        k["name"] = k["name"].replace("void adamw_kernel<", "void pxt_adamw_kernel<")
    renamed = tmp_path / "renamed.json"
    renamed.write_text(json.dumps(data))
    out = subprocess.run([sys.executable, str(script), str(new), str(renamed), "--top", "200"], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    assert re.search(r"\+0\.000 +3\.679 +3\.679 +1  adamw_kernel<pxt_bf16, false>", out), out
    assert "pxt_adamw" not in out, out
    bad = subprocess.run([sys.executable, str(script), str(new), str(results / "xtts_gpu_h200_run3.json")],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "no 'recipe' profile in it" in bad.stderr, bad.stderr
