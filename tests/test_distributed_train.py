"""``torchrun ... -m pyxtts train`` on CPUs (gloo): the run of N processes is the run of
one, it resumes on another number of processes, SIGTERM on every process and Ctrl-C (on
torchrun, pressed once or twice, or on one worker) save one checkpoint at the same step,
and a process killed mid-step ends the others within a minute with the last checkpoint
intact."""
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
  checkpoint_interval: {checkpoint_interval}
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
# torchrun runs each worker as `python RECORD_EXIT STATUSES -m pyxtts ...` when a test
# needs the workers' exit statuses, which torchrun does not report once a signal stopped it
RECORD_EXIT = Path(__file__).parent / "helpers" / "record_exit.py"
# torchrun's wait for its workers after forwarding a signal, before it SIGKILLs them
# (--shutdown-timeout's default)
GRACE_S = 30


def config(folder: Path, max_steps: int, checkpoint_interval: int = 3) -> Path:
    path = folder / f"c{max_steps}_{checkpoint_interval}.yaml"
    path.write_text(CONFIG.format(max_steps=max_steps, checkpoint_interval=checkpoint_interval), encoding="utf-8")
    return path


def train_cmd(n: int, cfg: Path, run: Path, *extra: str, statuses: Path | None = None) -> list[str]:
    """``pyxtts train`` on ``n`` processes; with ``statuses``, each worker's exit status is
    written there (``RECORD_EXIT``)."""
    through = [] if statuses is None else [str(RECORD_EXIT), str(statuses)]
    head = [sys.executable, "-m", "pyxtts"] if n == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}", *through, "-m",
        "pyxtts"]
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
    """rank -> the worker processes torchrun started (their environment says the rank), the
    pyxtts processes themselves, not ``RECORD_EXIT`` around them."""
    out = {}
    for child in agent.children(recursive=True):
        try:
            rank, command = child.environ().get("RANK"), " ".join(child.cmdline())
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if rank is not None and "pyxtts" in command and RECORD_EXIT.name not in command:
            out[int(rank)] = child
    return out


def kill_all(proc: subprocess.Popen) -> None:
    """SIGKILL to torchrun and every process under it: its workers live in sessions of their
    own and would outlast it (training on) if only torchrun were killed."""
    try:
        below = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        below = []
    proc.kill()
    for p in below:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    proc.wait()


def wait_for_step(run: Path, step: int, proc: subprocess.Popen, limit: float = 120) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        if (run / "train_log.jsonl").exists() and any(r["type"] == "train" and r["step"] >= step for r in log(run)):
            return
        assert proc.poll() is None, "the run ended early"
        time.sleep(0.2)
    raise AssertionError(f"no step {step} within {limit} s")


def long_run(tmp_path: Path, checkpoint_interval: int = 3,
             statuses: Path | None = None) -> tuple[Path, subprocess.Popen]:
    """Two processes training far beyond the test, started and past step 4. torchrun leads
    a session of its own, as a terminal starts it (its workers lead their own); its stderr
    is ``tmp_path / "stderr.txt"``, readable while it runs."""
    run = tmp_path / "run"
    with open(tmp_path / "stderr.txt", "w") as err:
        proc = subprocess.Popen(train_cmd(2, config(tmp_path, 100000, checkpoint_interval), run, statuses=statuses),
                                env=ENV, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=err,
                                start_new_session=True)
    try:
        wait_for_step(run, 4, proc)
    except BaseException:
        kill_all(proc)
        raise
    return run, proc


def test_sigterm_on_every_process_saves_one_checkpoint_at_the_same_step(tmp_path):
    run, proc = long_run(tmp_path)
    try:
        for w in workers(psutil.Process(proc.pid)).values():  # a cluster's preemption: every process
            w.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    finally:
        kill_all(proc)
    err = (tmp_path / "stderr.txt").read_text()
    assert err.count("interrupted by SIGTERM") == 1, err  # rank 0 says it, once
    newest = sorted(run.glob("step_*.safetensors"))[-1]
    step = int(newest.stem.split("_")[1])
    assert f"interrupted by SIGTERM at step {step}: saved" in err, err
    meta, _ = read_checkpoint(newest)  # complete and readable
    assert meta["step"] == step
    # and it resumes
    p = train(2, config(tmp_path, step + 3), run, "--resume")
    assert f"trained 3 steps, {step + 1}-{step + 3}, after resuming at step {step}" in p.stdout


def wait_for_text(path: Path, text: str, proc: subprocess.Popen, limit: float = 60) -> None:
    t0 = time.monotonic()
    while text not in path.read_text():
        assert proc.poll() is None and time.monotonic() - t0 < limit, f"no {text!r} within {limit} s"
        time.sleep(0.02)


def exit_statuses(path: Path) -> dict[int, int]:
    """rank -> exit status, as ``RECORD_EXIT`` wrote them."""
    lines = path.read_text().splitlines() if path.exists() else []
    return {int(rank): int(status) for rank, status in (line.split() for line in lines)}


def the_stop_checkpoint(run: Path, err: str) -> int:
    """The step of the run's one checkpoint, written on the stop that rank 0 reports once:
    complete, the step of its last log record (where every process stopped), and no
    temporary file left beside it."""
    saved = sorted(run.glob("step_*.safetensors"))
    assert len(saved) == 1, saved
    step = int(saved[0].stem.split("_")[1])
    assert err.count("interrupted by SIGINT") == 1, err[-4000:]
    assert f"interrupted by SIGINT at step {step}: saved" in err, err[-4000:]
    meta, _ = read_checkpoint(saved[0])
    assert meta["step"] == step == max(r["step"] for r in log(run) if r["type"] == "train")
    assert not list(run.glob("*.tmp-*"))
    return step


@pytest.mark.parametrize("presses", [1, 2])
def test_ctrl_c_on_torchrun_saves_one_checkpoint_at_the_same_step(presses, tmp_path):
    """A terminal's Ctrl-C is SIGINT to its foreground process group: torchrun's, which
    holds torchrun alone. torchrun sends SIGINT to every worker; a second press makes it
    send SIGTERM while it waits. Every process stops at the same step boundary, rank 0
    saves once, every rank exits with 130 (128 + SIGINT; after a second press, one that had
    saved may die of the SIGTERM), and the run resumes from there."""
    statuses = tmp_path / "statuses"
    run, proc = long_run(tmp_path, checkpoint_interval=1000, statuses=statuses)  # no checkpoint but the stop's
    try:
        os.killpg(proc.pid, signal.SIGINT)
        t0 = time.monotonic()
        if presses == 2:
            wait_for_text(tmp_path / "stderr.txt", "closing signal SIGINT", proc)
            assert not statuses.exists()  # the workers are stopping, torchrun waits for them
            os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=120)
        took = time.monotonic() - t0
    finally:
        kill_all(proc)
    err = (tmp_path / "stderr.txt").read_text()
    assert "closing signal SIGINT" in err, err[-4000:]  # torchrun forwards it to the workers
    if presses == 2:
        assert "closing signal SIGTERM" in err, err[-4000:]
    assert took < GRACE_S, took  # every worker ended before torchrun's SIGKILL
    # the second press's SIGTERM kills a worker that has saved and is leaving fit
    ends = {130} if presses == 1 else {130, -signal.SIGTERM}
    codes = exit_statuses(statuses)
    assert codes.keys() == {0, 1} and set(codes.values()) <= ends, (codes, err[-4000:])
    step = the_stop_checkpoint(run, err)
    if presses == 1:  # (the checkpoint is the same kind either way: one resume is enough)
        p = train(2, config(tmp_path, step + 3), run, "--resume")
        assert f"trained 3 steps, {step + 1}-{step + 3}, after resuming at step {step}" in p.stdout


def signal_worker(proc: subprocess.Popen, rank: int, signum: int, timeout: float) -> float:
    """Sends ``signum`` to torchrun's worker ``rank`` and waits for torchrun to end; the
    seconds that took. Every worker is gone afterwards, whatever happened."""
    try:
        workers(psutil.Process(proc.pid))[rank].send_signal(signum)
        t0 = time.monotonic()
        proc.wait(timeout=timeout)
        return time.monotonic() - t0
    finally:
        kill_all(proc)


def test_ctrl_c_on_one_worker_stops_every_process_at_the_same_step(tmp_path):
    """SIGINT to rank 1 alone (kill -INT of its pid): the processes agree on it at the next
    step boundary, and rank 0 saves and names SIGINT. Both stop with 130 where they can; the
    first to exit makes torchrun end the other with SIGTERM, which that one notes while in fit
    (130) or dies of after it (rank 0's checkpoint written either way). Which exits first is
    the machine's timing: under load rank 0 can (seen once in a full suite run)."""
    statuses = tmp_path / "statuses"
    run, proc = long_run(tmp_path, checkpoint_interval=1000, statuses=statuses)
    took = signal_worker(proc, 1, signal.SIGINT, 120)
    err = (tmp_path / "stderr.txt").read_text()
    assert took < GRACE_S, took
    codes = exit_statuses(statuses)
    assert 130 in codes.values() and set(codes.values()) <= {130, -signal.SIGTERM}, (codes, err[-4000:])
    the_stop_checkpoint(run, err)


def test_a_process_killed_mid_run_ends_the_others_and_the_checkpoint_stays(tmp_path):
    run, proc = long_run(tmp_path)
    saved = {p.name: p.read_bytes() for p in run.glob("step_*.safetensors")}
    took = signal_worker(proc, 1, signal.SIGKILL, 90)
    assert saved
    err = (tmp_path / "stderr.txt").read_text()
    assert proc.returncode != 0 and took < 60, (proc.returncode, took)
    # rank 0 says why it stopped; torchrun names the process that was killed
    assert "pyxtts train (rank 0 of 2): stopped because a step with the other processes failed" in err, err
    assert "exitcode: -9) local_rank: 1" in err, err
    for name, data in saved.items():  # the checkpoints written before are as they were
        assert (run / name).read_bytes() == data
    for path in run.glob("step_*.safetensors"):  # and every one on disk is whole
        read_checkpoint(path)


@pytest.mark.parametrize("samples, batch, says", [
    (49, 3, "dataset: its 49 samples leave a last batch of 1 sample each epoch (the effective batch is 6), which 2 "
            "processes cannot share: each takes at least one sample of every batch; remove 1 sample or add 1, "
            "change data.batch_size x gradient_accumulation_steps, or train on fewer processes"),
    (48, 0, "the effective batch, data.batch_size x gradient_accumulation_steps = 1, cannot be shared by 2 "
            "processes: each takes at least one sample of every batch; raise it to 2 or more, or train on fewer "
            "processes")])
def test_a_batch_the_processes_cannot_share_is_refused_before_anything_is_written(samples, batch, says, tmp_path):
    """Each process takes at least one sample of every batch: an effective batch below the
    number of processes, or a dataset whose size leaves a last batch of one sample for two
    processes, is refused on every process before the run writes anything (it failed at
    the epoch's start, after the evaluation of step 0 had written the log and a best
    checkpoint, and said to raise a batch that was large enough)."""
    cfg = config(tmp_path, 6)
    if batch == 0:  # one sample a step
        cfg.write_text(cfg.read_text().replace("gradient_accumulation_steps: 2", "gradient_accumulation_steps: 1")
                       .replace("batch_size: 3", "batch_size: 1"), encoding="utf-8")
    run = tmp_path / "run"
    cmd = train_cmd(2, cfg, run)
    cmd[cmd.index("--synthetic") + 1] = str(samples)
    p = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert p.returncode != 0
    for rank in (0, 1):
        assert f"pyxtts train (rank {rank}): {says}" in p.stderr, p.stderr[-4000:]
    assert not run.exists()


# the recipe on the small Coqui checkpoints' GPT (fixtures_xtts), a global batch of 2
RECIPE = """\
base: xtts_v2_finetune
training:
  max_steps: 2
  epochs: null
  device: cpu
  distributed_timeout_s: 60
data:
  batch_size: 2
  num_workers: 0
"""


def test_init_and_continue_into_a_folder_in_use_write_nothing_there(tmp_path):
    """`--init` imports into the run's folder, `--continue` writes its first checkpoint there:
    into a folder another run holds (here this process, as a run that has just started),
    both are refused on every process before anything is written, naming the holder, and
    that run's files stay as they were."""
    from fixtures_xtts import write_gpt_trainer_checkpoint, write_xtts_folder  # skips without coqui-tts

    from pyxtts._files import lock_folder

    xtts = write_xtts_folder(tmp_path / "XTTS-v2", 5)
    coqui_run = write_gpt_trainer_checkpoint(tmp_path / "coqui-run", 6)
    (tmp_path / "recipe.yaml").write_text(RECIPE, encoding="utf-8")
    run = tmp_path / "run"
    run.mkdir()
    (run / "init_xtts.safetensors").write_bytes(b"the running run's import")
    lock = lock_folder(run)
    try:
        for extra in (["--init", str(xtts), "--overwrite"], ["--init", str(coqui_run), "--continue"]):
            p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                                "-m", "pyxtts", "train", "--config", str(tmp_path / "recipe.yaml"), "--synthetic",
                                "8", "--checkpoint-dir", str(run), "--no-progress", *extra],
                               env=ENV, capture_output=True, text=True, timeout=600, cwd=tmp_path)
            assert p.returncode != 0, p.stderr[-4000:]
            for rank in (0, 1):
                assert (f"pyxtts train (rank {rank}): {str(run)!r} is in use by another training run (process "
                        f"{os.getpid()})") in p.stderr, p.stderr[-4000:]
            assert [f.name for f in run.iterdir()] == ["init_xtts.safetensors"], extra
            assert (run / "init_xtts.safetensors").read_bytes() == b"the running run's import", extra
    finally:
        os.close(lock)


def test_gpus_runs_torchrun_with_the_same_arguments(tmp_path, capsys):
    import pyxtts.cli

    command, env = pyxtts.cli.torchrun_command("0,1", ["train", "--gpus", "0,1", "--config", "gpu_8gb", "--data",
                                                       "shards"])
    assert command[1:] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "pyxtts",
                           "train", "--config", "gpu_8gb", "--data", "shards"]
    # the workers' Ctrl-C hint is the command that started them, --gpus included
    assert env == {"CUDA_VISIBLE_DEVICES": "0,1",
                   "PYXTTS_COMMAND": "pyxtts train --gpus 0,1 --config gpu_8gb --data shards"}
    assert pyxtts.cli.torchrun_command("3", ["train", "--gpus=3"])[0][-1] == "train"
    for bad in ("0,x", "0,0", "", "-1"):
        assert pyxtts.cli.main(["train", "--gpus", bad, "--synthetic", "8", "--checkpoint-dir", str(tmp_path)]) == 2
        assert "--gpus: expected distinct GPU numbers" in capsys.readouterr().err

    if pyxtts.device_count() < 8:  # a GPU the machine lacks: refused before torchrun starts
        assert pyxtts.cli.main(["train", "--gpus", "0,7", "--synthetic", "8", "--checkpoint-dir",
                                str(tmp_path)]) == 2
        assert "--gpus 0,7: GPU 7 is not in this machine" in capsys.readouterr().err


def test_gpus_leaves_ctrl_c_to_torchrun(tmp_path):
    """``pyxtts train --gpus`` waits for torchrun in the terminal's process group, so Ctrl-C
    reaches both. It leaves the signal to torchrun, which forwards it to the workers and
    ends once they have saved, and returns torchrun's status then; it does not kill
    torchrun. Here a stand-in for torchrun takes a second to stop and exits 7."""
    # os.write: the handler may run while print's buffer is still held
    stand_in = ("import os, signal, sys, time\n"
                "signal.signal(signal.SIGINT, lambda *_: (time.sleep(1), os.write(1, b'stopped\\n'), sys.exit(7)))\n"
                "time.sleep(0.5)\n"  # (the parent ignores SIGINT from the moment this started)
                "os.write(1, b'started\\n')\n"
                "time.sleep(60)\n")
    parent = f"import sys, pyxtts.cli; sys.exit(pyxtts.cli.run_torchrun([sys.executable, '-c', {stand_in!r}], {{}}))"
    proc = subprocess.Popen([sys.executable, "-c", parent], env=ENV, cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout.readline() == "started\n"
        os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C
        out, err = proc.communicate(timeout=60)
    finally:
        kill_all(proc)
    assert (proc.returncode, out) == (7, "stopped\n"), err
