"""``torchrun ... -m pyxtts train`` on CPUs (gloo): the run of N processes is the run of
one, it resumes on another number of processes, SIGTERM on every process saves one
checkpoint at the same step, and a process killed mid-step ends the others within a minute
with the last checkpoint intact."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from pyxtts.checkpoint import read_checkpoint

pytest.importorskip("torch.distributed")
psutil = pytest.importorskip("psutil")
# Under the sanitizers (CI's second pass) these minutes of whole runs are left to the plain
# pass: the C they reach is the step's, which tests/test_distributed.py runs there.
pytestmark = pytest.mark.skipif(bool(os.environ.get("PYXTTS_SANITIZED")),
                                reason="whole torchrun runs: in CI's plain pass; the sanitized pass runs "
                                       "tests/test_distributed.py's steps")

# cpu_demo's model with dropout, a global batch of 6 = 3 x 2 accumulation: 2 processes take
# 3 rows each (one micro-batch), 3 processes 2 rows each
CONFIG = """\
base: cpu_demo
model:
  dropout: 0.1
training:
  gradient_accumulation_steps: 2
  max_steps: {max_steps}
  checkpoint_interval: 3
  eval_interval: 3
  log_interval: 3
  warmup_steps: 2
  keep_checkpoints: null
  distributed_timeout_s: 60
data:
  batch_size: 3
  num_workers: 0
"""
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}


def config(folder: Path, max_steps: int) -> Path:
    path = folder / f"c{max_steps}.yaml"
    path.write_text(CONFIG.format(max_steps=max_steps), encoding="utf-8")
    return path


def train_cmd(n: int, cfg: Path, run: Path, *extra: str) -> list[str]:
    head = [sys.executable, "-m", "pyxtts"] if n == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}", "-m", "pyxtts"]
    return head + ["train", "--config", str(cfg), "--synthetic", "48", "--checkpoint-dir", str(run), "--no-progress",
                   *extra]


def train(n: int, cfg: Path, run: Path, *extra: str) -> subprocess.CompletedProcess:
    p = subprocess.run(train_cmd(n, cfg, run, *extra), env=ENV, capture_output=True, text=True, timeout=600,
                       cwd=run.parent)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    return p


def params(path: Path) -> dict[str, np.ndarray]:
    _, tensors = read_checkpoint(path)
    return {k: v for k, v in tensors.items() if k.startswith("model.")}


def log(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "train_log.jsonl").read_text().splitlines()]


def assert_same_run(a: Path, b: Path, step: int) -> None:
    """Two runs' checkpoints at ``step``: the parameters up to the fp32 sums' order (Adam
    turns last-bit differences of near-zero gradients into parameter differences of a small
    fraction of the learning rate, 2e-3), the losses of every step and evaluation to 1e-5."""
    pa, pb = params(a / f"step_{step:08d}.safetensors"), params(b / f"step_{step:08d}.safetensors")
    assert pa.keys() == pb.keys()
    worst = max(float(np.abs(pa[k] - pb[k]).max()) for k in pa)
    assert worst <= 1e-4, worst
    la, lb = log(a), log(b)
    for kind in ("train", "eval"):
        xa = [(r["step"], r["loss"]) for r in la if r["type"] == kind and r["step"] <= step]
        xb = [(r["step"], r["loss"]) for r in lb if r["type"] == kind and r["step"] <= step]
        assert [s for s, _ in xa] == [s for s, _ in xb]
        np.testing.assert_allclose([v for _, v in xa], [v for _, v in xb], rtol=1e-5, err_msg=kind)


@pytest.mark.parametrize("world", [2, 3])
def test_n_processes_train_the_run_of_one(world, tmp_path):
    cfg = config(tmp_path, 6)
    train(1, cfg, tmp_path / "one")
    p = train(world, cfg, tmp_path / "many")
    assert p.stdout.count("trained 6 steps") == 1  # rank 0 reports, the others are silent
    assert_same_run(tmp_path / "one", tmp_path / "many", 6)
    meta, _ = read_checkpoint(tmp_path / "many" / "step_00000006.safetensors")
    assert meta["extra"]["world_size"] == world and meta["extra"]["data"]["effective_batch"] == 6
    assert len([r for r in log(tmp_path / "many") if r["type"] == "train"]) == 6  # one log, one writer


@pytest.mark.parametrize("before, after", [(2, 1), (1, 3)])
def test_a_run_resumes_on_another_number_of_processes(before, after, tmp_path):
    train(1, config(tmp_path, 6), tmp_path / "straight")
    run = tmp_path / "run"
    train(before, config(tmp_path, 3), run)
    train(after, config(tmp_path, 6), run, "--resume")
    assert_same_run(tmp_path / "straight", run, 6)


def workers(agent: psutil.Process) -> dict[int, psutil.Process]:
    """rank -> the worker processes torchrun started (their environment says the rank)."""
    out = {}
    for child in agent.children(recursive=True):
        try:
            rank = child.environ().get("RANK")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if rank is not None and "pyxtts" in " ".join(child.cmdline()):
            out[int(rank)] = child
    return out


def wait_for_step(run: Path, step: int, proc: subprocess.Popen, limit: float = 120) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        if (run / "train_log.jsonl").exists() and any(r["type"] == "train" and r["step"] >= step for r in log(run)):
            return
        assert proc.poll() is None, "the run ended early"
        time.sleep(0.2)
    raise AssertionError(f"no step {step} within {limit} s")


def long_run(tmp_path: Path) -> tuple[Path, subprocess.Popen]:
    """Two processes training far beyond the test, started and past step 4."""
    run = tmp_path / "run"
    proc = subprocess.Popen(train_cmd(2, config(tmp_path, 100000), run), env=ENV, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_step(run, 4, proc)
    except BaseException:
        proc.kill()
        raise
    return run, proc


def test_sigterm_on_every_process_saves_one_checkpoint_at_the_same_step(tmp_path):
    run, proc = long_run(tmp_path)
    try:
        for w in workers(psutil.Process(proc.pid)).values():  # a cluster's preemption: every process
            w.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert err.count("interrupted by SIGTERM") == 1, err  # rank 0 says it, once
    newest = sorted(run.glob("step_*.safetensors"))[-1]
    step = int(newest.stem.split("_")[1])
    assert f"interrupted by SIGTERM at step {step}: saved" in err, err
    meta, _ = read_checkpoint(newest)  # complete and readable
    assert meta["step"] == step
    # and it resumes
    p = train(2, config(tmp_path, step + 3), run, "--resume")
    assert f"trained {step + 3} steps" in p.stdout


def test_a_process_killed_mid_run_ends_the_others_and_the_checkpoint_stays(tmp_path):
    run, proc = long_run(tmp_path)
    try:
        saved = {p.name: p.read_bytes() for p in run.glob("step_*.safetensors")}
        assert saved
        workers(psutil.Process(proc.pid))[1].kill()
        t0 = time.monotonic()
        _, err = proc.communicate(timeout=90)
        took = time.monotonic() - t0
    finally:
        proc.kill()
    assert proc.returncode != 0 and took < 60, (proc.returncode, took)
    # rank 0 says why it stopped; torchrun names the process that was killed
    assert "pyxtts train (rank 0 of 2): stopped because a step with the other processes failed" in err, err
    assert "exitcode: -9) local_rank: 1" in err, err
    for name, data in saved.items():  # the checkpoints written before are as they were
        assert (run / name).read_bytes() == data
    for path in run.glob("step_*.safetensors"):  # and every one on disk is whole
        read_checkpoint(path)


def test_gpus_runs_torchrun_with_the_same_arguments(tmp_path, capsys):
    import pyxtts.cli

    command, env = pyxtts.cli.torchrun_command("0,1", ["train", "--gpus", "0,1", "--config", "gpu_8gb", "--data",
                                                       "shards"])
    assert command[1:] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "pyxtts",
                           "train", "--config", "gpu_8gb", "--data", "shards"]
    assert env == {"CUDA_VISIBLE_DEVICES": "0,1"}
    assert pyxtts.cli.torchrun_command("3", ["train", "--gpus=3"])[0][-1] == "train"
    for bad in ("0,x", "0,0", "", "-1"):
        assert pyxtts.cli.main(["train", "--gpus", bad, "--synthetic", "8", "--checkpoint-dir", str(tmp_path)]) == 2
        assert "--gpus: expected distinct GPU numbers" in capsys.readouterr().err

    if pyxtts.device_count() < 8:  # a GPU the machine lacks: refused before torchrun starts
        assert pyxtts.cli.main(["train", "--gpus", "0,7", "--synthetic", "8", "--checkpoint-dir",
                                str(tmp_path)]) == 2
        assert "--gpus 0,7: GPU 7 is not in this machine" in capsys.readouterr().err
