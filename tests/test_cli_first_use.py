"""The command line as a new user meets it: each test runs ``pyxtts`` in a child
process (as a shell would) on a tiny config or a few steps of the CPU demo, and checks
the exit status, what is said and what is left on disk."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import run_python

CLI = "import sys, pyxtts.cli; sys.exit(pyxtts.cli.main(sys.argv[1:]))"


def pyxtts_cli(cwd: Path, *args: str, timeout: float = 180, env: dict | None = None):
    """``pyxtts ARGS`` in a fresh interpreter, working directory ``cwd``."""
    return run_python(CLI, *args, cwd=str(cwd), timeout=timeout, env=env)


def train_steps(folder: Path) -> list[int]:
    log = folder / "train_log.jsonl"
    return [r["step"] for r in map(json.loads, log.read_text().splitlines()) if r["type"] == "train"]


def test_demo_with_fewer_steps_than_its_warmup_scales_the_warmup(tmp_path):
    """cpu_demo warms up for 20 of 600 steps; `--max-steps 10` used to be refused
    ("warmup_steps: must be < max_steps=10, got 20")."""
    r = pyxtts_cli(tmp_path, "train", "--max-steps", "10", "--no-progress")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "warmup_steps 20 does not fit max_steps 10: scaled to 1" in r.stderr
    assert "trained 10 steps" in r.stdout
    log = [json.loads(x) for x in (tmp_path / "checkpoints/cpu_demo/train_log.jsonl").read_text().splitlines()]
    lrs = [x["lr"] for x in log if x["type"] == "train"]
    # warmup of 1 step (rate 0 at step 0), then the cosine from 2e-3 down to 1e-4 at step 10
    assert lrs[0] == 0.0 and lrs[1] == pytest.approx(2e-3) and 1e-4 < lrs[-1] < lrs[1]


def test_set_max_steps_keeps_a_warmup_that_fits_and_refuses_nonsense():
    from pyxtts import XTTSConfig

    t = XTTSConfig.load("cpu_demo").training
    assert t.set_max_steps(100) is None and (t.max_steps, t.warmup_steps) == (100, 20)
    assert t.set_max_steps(1) is not None and (t.max_steps, t.warmup_steps) == (1, 0)
    with pytest.raises(ValueError, match="max_steps"):
        t.set_max_steps(0)
    assert (t.max_steps, t.warmup_steps) == (1, 0)  # a refusal changes nothing


def test_a_second_plain_run_is_refused_and_deletes_nothing(tmp_path):
    """`pyxtts train` twice: the second used to delete the first run's checkpoints and
    log without a word; docs/cli.md promises a refusal, in the command line's words."""
    ck = tmp_path / "checkpoints" / "cpu_demo"
    assert pyxtts_cli(tmp_path, "train", "--max-steps", "2", "--no-progress").returncode == 0
    before = {p.name: p.read_bytes() for p in ck.iterdir()}
    assert "step_00000002.safetensors" in before
    r = pyxtts_cli(tmp_path, "train", "--max-steps", "2", "--no-progress")
    assert r.returncode == 2, r.stderr[-2000:]
    assert "holds checkpoints of an earlier run (newest: step_00000002.safetensors)" in r.stderr
    assert "--resume" in r.stderr and "--overwrite" in r.stderr and "--checkpoint-dir" in r.stderr
    assert "resume=True" not in r.stderr and "overwrite=True" not in r.stderr
    assert {p.name: p.read_bytes() for p in ck.iterdir()} == before
    # --resume on the finished run: nothing to do, said plainly (it used to be a traceback)
    r = pyxtts_cli(tmp_path, "train", "--max-steps", "2", "--no-progress", "--resume")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    assert "nothing to train: the run is at step 2, its end (max_steps)" in r.stdout
    assert train_steps(ck) == [1, 2]
    # --overwrite starts over, as documented
    r = pyxtts_cli(tmp_path, "train", "--max-steps", "1", "--no-progress", "--overwrite")
    assert r.returncode == 0, r.stderr[-2000:]
    # the best checkpoint (the demo evaluates) and TensorBoard's event file (where the
    # package is installed) are the new run's too
    assert sorted(p.name for p in ck.iterdir() if not p.name.startswith("events.out.tfevents.")) == \
        ["best.safetensors", "step_00000001.safetensors", "train_log.jsonl"]
    assert len([p for p in ck.iterdir() if p.name.startswith("events.out.tfevents.")]) <= 1
    assert train_steps(ck) == [1]


TINY = """\
model: {{n_layers: 1, d_model: 32, n_heads: 2, text_vocab_size: 32, audio_vocab_size: 40,
        max_text_tokens: 12, max_audio_tokens: 24, n_cond_latents: 0}}
training:
  learning_rate: {lr}
  weight_decay: {wd}
  lr_schedule: constant
  max_steps: {steps}
  epochs: null
  checkpoint_dir: {ckpt}
  checkpoint_interval: {interval}
  eval_interval: 1000
  device: cpu
data:
  batch_size: 2
  num_workers: 0
"""


def tiny_config(folder: Path, name: str = "tiny.yaml", *, lr: float = 1e-3, steps: int = 4,
                ckpt: str = "ckpt", interval: int = 1000, extra: str = "", wd: float = 0.01) -> Path:
    """A one-layer model that takes a step in milliseconds; written as a user writes YAML
    (its paths relative to the file's folder)."""
    path = folder / name
    path.write_text(TINY.format(lr=lr, steps=steps, ckpt=ckpt, interval=interval, wd=wd) + extra)
    return path


def test_optimize_config_output_in_a_missing_folder_is_an_error_not_a_traceback(tmp_path):
    r = pyxtts_cli(tmp_path, "optimize-config", "--config", "cpu_demo", "--output", "missing_dir/x.yaml",
                   "--memory", "1GiB", "--device", "cpu")
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert "pyxtts optimize-config: --output: cannot write 'missing_dir/x.yaml': No such file or directory" \
        in r.stderr


@pytest.mark.parametrize("command", ["train", "memtest", "optimize-config"])
def test_a_misspelled_config_name_gets_the_shipped_one_suggested(tmp_path, command):
    """It used to be "[Errno 2] No such file or directory: 'extreme_memory_optimised'"."""
    from pyxtts.config import shipped_configs

    extra = ["--output", "x.yaml"] if command == "optimize-config" else []
    r = pyxtts_cli(tmp_path, command, "--config", "extreme_memory_optimised", *extra)
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.strip() == (f"pyxtts {command}: --config: 'extreme_memory_optimised' is neither a file nor a "
                                "shipped config's name; did you mean 'extreme_memory_optimized'?")
    r = pyxtts_cli(tmp_path, command, "--help")
    assert r.returncode == 0, r.stderr[-2000:]
    assert all(name in r.stdout for name in shipped_configs()), r.stdout


def test_optimize_config_writes_one_yaml_style(tmp_path):
    """Every mapping in block style (the model and data sections used to come out as flow
    mappings wrapped over lines), lists on one line."""
    from pyxtts import XTTSConfig

    r = pyxtts_cli(tmp_path, "optimize-config", "--config", "cpu_demo", "--output", "x.yaml",
                   "--memory", "1GiB", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    text = (tmp_path / "x.yaml").read_text()
    assert "{" not in text
    lines = text.splitlines()
    assert lines[0] == "model:" and "  n_layers: 2" in lines and "data:" in lines and "  batch_size: 4" in lines
    assert "  betas: [0.9, 0.96]" in lines
    new = XTTSConfig.load(tmp_path / "x.yaml")
    # written relative to x.yaml: the same folder as the demo's from the working directory
    assert new.training.checkpoint_dir == str(tmp_path / "checkpoints/cpu_demo")
    new.training.checkpoint_dir = "checkpoints/cpu_demo"
    assert new == XTTSConfig.load("cpu_demo")


def test_train_is_the_default_command_and_version(tmp_path):
    import pyxtts

    cfg = tiny_config(tmp_path, steps=1)
    r = pyxtts_cli(tmp_path, "--config", str(cfg), "--synthetic", "4", "--no-progress")
    assert r.returncode == 0, r.stderr  # was: "argument command: invalid choice: ..."
    assert "trained 1 step (" in r.stdout
    r = pyxtts_cli(tmp_path, "--version")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"pyxtts {pyxtts.__version__} (")
    assert ("CPU-only build" in r.stdout) != pyxtts.build_info()["cuda"]


def test_divergence_says_what_was_saved(tmp_path):
    """A learning rate of 1e30 (without weight decay: AdamW refuses lr * weight_decay > 1)
    makes the parameters overflow after the first step, so every later step has
    non-finite gradients and is skipped."""
    cfg = tiny_config(tmp_path, lr=1e30, steps=30, wd=0.0)
    r = pyxtts_cli(tmp_path, "train", "--config", str(cfg), "--synthetic", "8", "--no-progress")
    assert r.returncode == 1, r.stderr
    assert "training diverged: 10 optimizer steps in a row had non-finite gradients (the last at step 11" \
        in r.stderr
    assert "the model in memory holds the parameters of step 1" in r.stderr
    assert "no checkpoint of this run was written (the first was due at step 1000)" in r.stderr
    # the evaluation before the first step wrote the best checkpoint: the step-0 weights
    assert f"the weights of the lowest eval loss are in {tmp_path}/ckpt/best.safetensors" in r.stderr
    assert [p.name for p in (tmp_path / "ckpt").glob("*.safetensors")] == ["best.safetensors"]
    cfg = tiny_config(tmp_path, lr=1e30, steps=30, ckpt="ckpt2", interval=1, wd=0.0)
    r = pyxtts_cli(tmp_path, "train", "--config", str(cfg), "--synthetic", "8", "--no-progress")
    assert r.returncode == 1, r.stderr
    assert f"the newest checkpoint is {tmp_path}/ckpt2/step_00000010.safetensors" in r.stderr


def test_sigterm_saves_and_exits_like_ctrl_c(tmp_path):
    """What a cluster scheduler sends before it kills a job: the run ends its step, saves
    a checkpoint and exits 143 (128 + SIGTERM); `--resume` then goes on from there.
    It used to die at once (exit 143 too, but nothing saved)."""
    import os
    import signal
    import subprocess
    import sys

    import pyxtts
    from helpers.processes import reaped, wait_until_training

    cfg = tiny_config(tmp_path, steps=100_000)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(Path(pyxtts.__file__).resolve().parent.parent), os.environ.get("PYTHONPATH", "")])}
    child = subprocess.Popen([sys.executable, "-c", CLI, "train", "--config", str(cfg), "--synthetic", "8",
                              "--no-progress"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    log = tmp_path / "ckpt" / "train_log.jsonl"
    with reaped(child):
        wait_until_training(child, log)
        child.send_signal(signal.SIGTERM)
        out, err = child.communicate(timeout=120)
    assert child.returncode == 128 + signal.SIGTERM, err[-2000:]
    steps = train_steps(tmp_path / "ckpt")
    last = steps[-1]
    assert steps == list(range(1, last + 1)) and last < 100_000
    assert f"interrupted by SIGTERM at step {last}: saved {tmp_path}/ckpt/step_{last:08d}.safetensors" in err
    # the command that continues it: this one with --resume (a bare `pyxtts train --resume` trained the demo)
    assert f"; continue with pyxtts train --config {cfg} --synthetic 8 --no-progress --resume\n" in err, err[-2000:]
    assert [p.name for p in (tmp_path / "ckpt").glob("step_*.safetensors")] == [f"step_{last:08d}.safetensors"]
    r = pyxtts_cli(tmp_path, "train", "--config", str(cfg), "--synthetic", "8", "--no-progress", "--resume",
                   "--max-steps", str(last + 2))
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"trained 2 steps, {last + 1}-{last + 2}, after resuming at step {last}" in r.stdout
    assert train_steps(tmp_path / "ckpt") == list(range(1, last + 3))


def test_paths_in_a_config_are_relative_to_it_and_errors_name_the_field(tmp_path):
    """`pyxtts train --config exp/run.yaml` from another folder: the data and checkpoints
    the file names are found beside it; a missing one is named by its field."""
    from pyxtts import ModelConfig, SyntheticDataset, write_shards

    exp = tmp_path / "exp"
    exp.mkdir()
    model = ModelConfig(n_layers=1, d_model=32, n_heads=2, text_vocab_size=32, audio_vocab_size=40,
                        max_text_tokens=12, max_audio_tokens=24, n_cond_latents=0)
    write_shards(SyntheticDataset(model, 6, seed=0), exp / "shards")
    cfg = tiny_config(exp, "run.yaml", steps=2, extra="  train_metadata: shards\n")
    (tmp_path / "elsewhere").mkdir()
    r = pyxtts_cli(tmp_path / "elsewhere", "train", "--config", "../exp/run.yaml", "--no-progress")
    assert r.returncode == 0, r.stderr[-2000:]
    assert train_steps(exp / "ckpt") == [1, 2]
    assert not (tmp_path / "elsewhere" / "ckpt").exists()
    # a missing file: the field, the path looked for, and why there
    cfg.write_text(cfg.read_text() + "  eval_metadata: eval.jsonl\n")
    r = pyxtts_cli(tmp_path / "elsewhere", "train", "--config", "../exp/run.yaml", "--no-progress",
                   "--overwrite")
    assert r.returncode == 2
    assert ("pyxtts train: data.eval_metadata: cannot read '../exp/eval.jsonl': No such file or directory "
            "(a path in a config file is relative to the file's folder)") in r.stderr
    cfg.write_text(cfg.read_text().replace("  eval_metadata: eval.jsonl\n", "")
                   .replace("  device: cpu\n", "  device: cpu\n  init_checkpoint: base.safetensors\n"))
    r = pyxtts_cli(tmp_path / "elsewhere", "train", "--config", "../exp/run.yaml", "--no-progress",
                   "--overwrite")
    assert r.returncode == 2
    assert "pyxtts train: training.init_checkpoint: ../exp/base.safetensors: no such checkpoint file" in r.stderr


def test_train_takes_the_output_folder_of_prepare(tmp_path):
    """`pyxtts prepare --out shards` then `pyxtts train --data shards` used to stop at
    "shards: no .npz shards found": the shards are in shards/train and shards/eval."""
    from pyxtts import ModelConfig, SyntheticDataset, write_shards

    model = ModelConfig(n_layers=1, d_model=32, n_heads=2, text_vocab_size=32, audio_vocab_size=40,
                        max_text_tokens=12, max_audio_tokens=24, n_cond_latents=0)
    write_shards(SyntheticDataset(model, 6, seed=0), tmp_path / "shards" / "train")
    cfg = tiny_config(tmp_path, steps=2)
    run = ("train", "--config", str(cfg), "--no-progress", "--data", "shards")
    r = pyxtts_cli(tmp_path, *run)
    assert r.returncode == 0, r.stderr[-2000:]
    # prepared without --eval-fraction (Coqui's recipe holds 1% out by default): said, as is what it costs
    assert ("pyxtts train: --data shards is an output folder of pyxtts prepare: training on shards/train; it has no "
            "eval/ (prepare --eval-fraction holds clips out), so there is no evaluation and no best checkpoint; "
            "--eval-data gives one\n") in r.stderr
    assert "trained 2 steps" in r.stdout and "eval loss" not in r.stdout
    write_shards(SyntheticDataset(model, 4, seed=1), tmp_path / "shards" / "eval")
    r = pyxtts_cli(tmp_path, *run, "--overwrite")
    assert r.returncode == 0, r.stderr[-2000:]
    assert ("pyxtts train: --data shards is an output folder of pyxtts prepare: training on shards/train, "
            "evaluating on shards/eval\n") in r.stderr
    assert "eval loss" in r.stdout
    # --eval-data wins over shards/eval
    r = pyxtts_cli(tmp_path, *run, "--overwrite", "--eval-data", "missing")
    assert r.returncode == 2
    assert "training on shards/train\n" in r.stderr and "pyxtts train: --eval-data: cannot read 'missing'" in r.stderr
    # an eval/ whose every clip prepare dropped (an earlier prepare left a shard of 0 samples)
    for f in (tmp_path / "shards" / "eval").glob("*.npz"):
        f.unlink()
    np.savez(tmp_path / "shards" / "eval" / "shard-00000.npz")
    r = pyxtts_cli(tmp_path, *run, "--overwrite")
    assert r.returncode == 0, r.stderr[-2000:]
    assert ("training on shards/train; its eval/ holds no sample (every held-out clip was dropped: "
            "shards/report.tsv says why), so there is no evaluation; --eval-data gives one\n") in r.stderr
    assert "eval loss" not in r.stdout


def test_resume_refuses_other_data_or_batch_settings(tmp_path):
    """Resuming used to accept anything: another data set or batch size continued at
    "epoch 3, batch 50" of an epoch that now had 25 batches."""
    cfg = tiny_config(tmp_path, steps=3)
    run = ("train", "--config", str(cfg), "--no-progress")
    assert pyxtts_cli(tmp_path, *run, "--synthetic", "8").returncode == 0
    r = pyxtts_cli(tmp_path, *run, "--synthetic", "12", "--resume", "--max-steps", "5")
    assert r.returncode == 2
    assert "was saved by a run on other data or batch settings" in r.stderr
    assert "changed: number of training samples: 8 then, 12 now" in r.stderr
    r = pyxtts_cli(tmp_path, *run, "--synthetic", "8", "--resume", "--max-steps", "5", "--batch-size", "4")
    assert r.returncode == 2
    assert "changed: effective batch (data.batch_size x gradient_accumulation_steps): 2 then, 4 now" in r.stderr
    assert "training.init_checkpoint: " in r.stderr  # the way to train those weights on other data
    assert train_steps(tmp_path / "ckpt") == [1, 2, 3]  # nothing changed
    # the same samples in the same number, one id changed
    from pyxtts import XTTSConfig
    from pyxtts.data import Sample, SyntheticDataset, TTSDataset, write_shards
    from pyxtts.trainer import _data_fingerprint

    c = XTTSConfig.load(cfg)
    data = SyntheticDataset(c.model, 6, seed=0)
    other = TTSDataset([Sample(s.text.copy(), s.audio.copy()) for s in data])
    other.samples[5].audio[-1] = (other.samples[5].audio[-1] + 1) % c.model.audio_vocab_size
    write_shards(data, tmp_path / "a")
    write_shards(other, tmp_path / "b")
    assert _data_fingerprint(data.samples, c)["digest"] != _data_fingerprint(other.samples, c)["digest"]
    run = ("train", "--config", str(cfg), "--no-progress", "--checkpoint-dir", str(tmp_path / "c2"))
    assert pyxtts_cli(tmp_path, *run, "--data", "a").returncode == 0
    r = pyxtts_cli(tmp_path, *run, "--data", "b", "--resume", "--max-steps", "4")
    assert r.returncode == 2
    assert "the training samples' contents differ (same number of samples)" in r.stderr
    r = pyxtts_cli(tmp_path, *run, "--data", "a", "--resume", "--max-steps", "4")
    assert r.returncode == 0, r.stderr[-2000:]


def test_resume_falls_back_past_a_corrupt_newest_checkpoint(tmp_path):
    cfg = tiny_config(tmp_path, steps=3, interval=1)
    run = ("train", "--config", str(cfg), "--no-progress", "--synthetic", "8")
    assert pyxtts_cli(tmp_path, *run).returncode == 0
    ck = tmp_path / "ckpt"
    newest = ck / "step_00000003.safetensors"
    newest.write_bytes(newest.read_bytes()[:200])  # cut short, as by a full disk
    r = pyxtts_cli(tmp_path, *run, "--resume", "--max-steps", "5")
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"resume: {newest} cannot be used (" in r.stderr
    assert "falling back to the previous checkpoint" in r.stderr
    assert "resuming from step_00000002.safetensors, the newest usable checkpoint (1 newer one(s)" in r.stderr
    assert train_steps(ck) == [1, 2, 3, 4, 5]  # step 3 taken again
    # none usable: an error listing each, nothing trained
    for p in ck.glob("*.safetensors"):
        p.write_bytes(b"not a checkpoint")
    r = pyxtts_cli(tmp_path, *run, "--resume", "--max-steps", "6")
    assert r.returncode == 2
    assert "resume: none of the 3 checkpoints in" in r.stderr and "Traceback" not in r.stderr


def test_conditioning_latents_of_the_wrong_count_are_refused_with_the_data(tmp_path):
    """A sample with 3 latents for a model of n_cond_latents=2 used to pass validation and
    fail mid-training (in a batch beside a sample with 2), with no file or line."""
    cfg = tiny_config(tmp_path, steps=2)
    cfg.write_text(cfg.read_text().replace("n_cond_latents: 0", "n_cond_latents: 2"))
    lines = [{"text": [1, 2, 3], "audio": [4, 5, 6], "cond": [[0.5] * 32] * n} for n in (2, 2, 3, 2)]
    (tmp_path / "m.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    r = pyxtts_cli(tmp_path, "train", "--config", str(cfg), "--data", "m.jsonl", "--no-progress")
    assert r.returncode == 2
    assert "m.jsonl:3: cond has 3 conditioning latents, expected n_cond_latents=2" in r.stderr
    assert not (tmp_path / "ckpt").exists() or not list((tmp_path / "ckpt").glob("*.safetensors"))
    lines[2]["cond"] = [[0.5] * 32] * 2
    (tmp_path / "m.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    r = pyxtts_cli(tmp_path, "train", "--config", str(cfg), "--data", "m.jsonl", "--no-progress")
    assert r.returncode == 0, r.stderr[-2000:]


MEMTEST_OOM = """
import sys
import pyxtts.cli, pyxtts.model, pyxtts.testing
real = pyxtts.model.XTTSGPT._run  # every step and reservation of a model goes through it
fired = []
def run(self, batch, *args, **kwargs):
    if not fired:  # the first allocation of the step's first micro-batch fails, as on a full device
        fired.append(1)
        pyxtts.testing.inject_oom(0, "cpu")
    return real(self, batch, *args, **kwargs)
pyxtts.model.XTTSGPT._run = run
sys.exit(pyxtts.cli.main(sys.argv[1:]))
"""


def test_memtest_out_of_memory_in_the_real_step_does_not_fit(tmp_path):
    """memtest's real step used to halve the micro-batch on an out-of-memory error and
    report FITS with the smaller batch's peak as "measured"."""
    r = run_python(MEMTEST_OOM, "memtest", "--config", "cpu_demo", "--batch-size", "4", cwd=str(tmp_path))
    assert r.returncode == 1, r.stdout + r.stderr
    assert ("real step: out of memory under the budget: micro-batch 4 ran out of memory; the step went "
            "through only split into micro-batches of 2") in r.stdout
    assert "verdict: DOES NOT FIT: the real step ran out of memory under the budget" in r.stdout
    assert "peak allocated" not in r.stdout
    assert "advice: the plan fits the budget but the device ran out" in r.stdout
    assert ("advice: micro-batches of 2 went through: data.batch_size 2 x gradient_accumulation_steps 2 keeps "
            "the effective batch 4") in r.stdout
    # the same command without the injected error: FITS, measured equal to the plan
    r = pyxtts_cli(tmp_path, "memtest", "--config", "cpu_demo", "--batch-size", "4")
    assert r.returncode == 0 and "verdict: FITS" in r.stdout and "real step: peak allocated" in r.stdout


REPO = Path(__file__).resolve().parent.parent


def test_api_quickstart_runs_without_torch(tmp_path):
    """`pip install .` does not install PyTorch; the Quickstart (docs/api.md, once the
    README's) used to import it."""
    text = (REPO / "docs" / "api.md").read_text()
    quick = text[text.index("## Quickstart"):]
    code = quick[quick.index("```python\n") + len("```python\n"):quick.index("```\n", quick.index("```python"))]
    r = run_python("import sys\nsys.modules['torch'] = None  # as when it is not installed\n" + code,
                   cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr[-2000:]


# what torchrun puts in each process's environment (here for a process of which it starts none)
TORCHRUN_ENV = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
TOO_OLD = ("training on several processes needs torch >= 2.4, and this is torch 2.3.1+cu121; install a newer one "
           "with: pip install 'torch>=2.4' (what pip install 'pyxtts[distributed]' asks for)")


def test_a_torch_too_old_for_several_processes_is_named_with_the_version_that_is_needed(tmp_path):
    """The [distributed] extra asks for torch >= 2.4; an older one (installed before pyxtts)
    went on into torch.distributed and failed there, or waited for the other processes.
    Under torchrun each process says so in one line; `train --gpus` says it before
    starting torchrun."""
    from pyxtts.distributed import check_torch_version

    for fine in ("2.4.0", "2.13.0+cpu", "10.0", "nightly"):
        check_torch_version(fine)
    with pytest.raises(ImportError, match=r"needs torch >= 2\.4, and this is torch 1\.13\.1;"):
        check_torch_version("1.13.1")
    old_torch = "import torch\ntorch.__version__ = '2.3.1+cu121'\n"
    for command in (["train", "--synthetic", "8", "--checkpoint-dir", str(tmp_path / "run")],
                    ["memtest", "--config", "cpu_demo", "--no-step"]):
        r = run_python(old_torch + CLI, *command, env=TORCHRUN_ENV, cwd=str(tmp_path), timeout=60)
        assert r.returncode == 2, r.stderr[-2000:]
        assert r.stderr.splitlines()[-1] == f"pyxtts {command[0]}: {TOO_OLD}", r.stderr[-2000:]
    assert not (tmp_path / "run").exists()
    old_metadata = "import importlib.metadata\nimportlib.metadata.version = lambda name: '2.3.1+cu121'\n"
    r = run_python(old_metadata + CLI, "train", "--gpus", "0,1", "--synthetic", "8", cwd=str(tmp_path), timeout=60)
    assert r.returncode == 2 and r.stderr.splitlines()[-1] == f"pyxtts train: --gpus: {TOO_OLD}", r.stderr[-2000:]


def test_memtest_under_torchrun_without_torch_says_what_to_install(tmp_path):
    """It raised the ImportError with its traceback."""
    r = run_python("import sys\nsys.modules['torch'] = None\n" + CLI, "memtest", "--config", "cpu_demo",
                   "--no-step", env=TORCHRUN_ENV, cwd=str(tmp_path), timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert r.stderr.splitlines()[-1].startswith("pyxtts memtest: training on several processes needs "
                                                "torch.distributed, which is not installed"), r.stderr[-2000:]
    assert r.stderr.splitlines()[-1].endswith("install it with: pip install 'pyxtts[distributed]'")


def test_checkpoints_get_the_mode_of_any_new_file(tmp_path):
    """They were written 0600 (safetensors' choice), unreadable to a group sharing a run."""
    cfg = tiny_config(tmp_path, steps=1)
    code = "import os, sys\nos.umask(0o022)\n" + CLI
    r = run_python(code, "train", "--config", str(cfg), "--synthetic", "4", "--no-progress", cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr[-2000:]
    (ck,) = (tmp_path / "ckpt").glob("step_*.safetensors")
    assert ck.stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "ckpt" / "best.safetensors").stat().st_mode & 0o777 == 0o644
    code = "import os, sys\nos.umask(0o077)\n" + CLI
    r = run_python(code, "train", "--config", str(cfg), "--synthetic", "4", "--no-progress", "--overwrite",
                   cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr[-2000:]
    assert ck.stat().st_mode & 0o777 == 0o600


def test_run_folders_are_ignored_by_git():
    """`pyxtts train` in the repository writes checkpoints/, the notebook notebooks/runs/."""
    lines = (REPO / ".gitignore").read_text().splitlines()
    assert "checkpoints/" in lines and "notebooks/runs/" in lines


def test_tokens_per_second_shown_is_averaged(tmp_path):
    """One step's rate swung from 473 to 6,853 tokens/s; the bar and the log lines show the
    rate over the last 20 steps (the JSONL log keeps both)."""
    from pyxtts.trainer import RATE_WINDOW

    cfg = tiny_config(tmp_path, steps=30)
    cfg.write_text(cfg.read_text().replace("  device: cpu\n", "  device: cpu\n  log_interval: 10\n"))
    r = pyxtts_cli(tmp_path, "train", "--config", str(cfg), "--synthetic", "8")
    assert r.returncode == 0, r.stderr[-2000:]
    log = [json.loads(x) for x in (tmp_path / "ckpt/train_log.jsonl").read_text().splitlines()]
    steps = [x for x in log if x["type"] == "train"]
    for i, x in enumerate(steps):
        w = steps[max(0, i + 1 - RATE_WINDOW):i + 1]
        want = sum(y["text_tokens"] + y["audio_tokens"] for y in w) / sum(y["step_time_s"] for y in w)
        assert x["tokens_per_s_avg"] == pytest.approx(want, rel=1e-12)
    shown = [line for line in r.stderr.splitlines() if line.startswith("step ") and "tok/s" in line]
    assert len(shown) == 3
    for line, x in zip(shown, steps[9::10]):
        assert f"{x['tokens_per_s_avg']:,.0f} tok/s" in line, (line, x)


def anchors(text: str) -> set[str]:
    """The anchors GitHub gives a page's headings (lower case, punctuation dropped, spaces
    to hyphens)."""
    import re

    return {re.sub(r"[^a-z0-9 _-]", "", h.lower()).replace(" ", "-") for h in re.findall(r"^#+ (.+)$", text, flags=re.M)}


def test_readme_and_docs_links_resolve_and_their_commands_exist():
    """The design link pointed outside the repository; every relative link of the README and
    of docs/ must resolve inside it (a page's #anchor included), and every `pyxtts` command
    they show must be one the CLI has."""
    import re

    import pyxtts.cli

    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    shell = []
    for page in pages:
        text = page.read_text()
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if target.startswith(("http://", "https://")):
                continue
            file, _, anchor = target.partition("#")
            path = (page.parent / file).resolve() if file else page
            assert path.is_relative_to(REPO) and path.exists(), f"{page.name}: {target}"
            if anchor and path.suffix == ".md":
                assert anchor in anchors(path.read_text()), f"{page.name}: {target}"
        shell += re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    shown = set(re.findall(r"(?:^|&& )pyxtts ([a-z-]+)", "\n".join(shell), flags=re.M))
    assert {"train", "prepare", "export", "memtest", "optimize-config", "gpu-info"} <= shown
    r = run_python("import pyxtts.cli, sys; pyxtts.cli.main(['--help'])")
    commands = set(re.search(r"\{([a-z,-]+)\}", r.stdout).group(1).split(","))
    assert shown <= commands, shown - commands


def test_readme_is_a_front_page_with_the_ci_test_command():
    """The README was 1,178 lines of reference; it is the front page now (what pyxtts is,
    the two commands, the fine-tuning path, the figures), the rest in docs/, every page of
    which it or the docs index links. CI runs the README's test command verbatim: the two
    must stay the same command."""
    import re

    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    at = next(i for i, line in enumerate(ci) if "the README's test command, verbatim" in line)
    command = next(line.strip() for line in ci[at + 1:] if not line.lstrip().startswith("#"))
    assert command.startswith("pip install") and "pytest tests" in command
    bash = "\n".join(re.findall(r"```bash\n(.*?)```", text, flags=re.S))
    assert command in bash.splitlines(), command
    for step in ("pyxtts prepare ", "pyxtts train ", "--init XTTS-v2", "pyxtts export "):
        assert step in bash, step
    assert "huggingface.co/coqui/XTTS-v2" in text and "Coqui Public Model License" in text
    linked = set(re.findall(r"\]\(docs/([^)#\s]+)", text))
    linked |= set(re.findall(r"\]\(([a-z-]+\.md)", (REPO / "docs" / "README.md").read_text()))
    pages = {p.name for p in (REPO / "docs").glob("*.md")} - {"README.md"}
    assert pages <= linked, pages - linked


def test_the_demo_time_is_the_same_in_its_config_and_the_readme():
    """cpu_demo.yaml's header quoted "26 s wall" (2026-11-28) where the README said 17-19 s
    (2026-11-29) for the same command: the header's wall and CPU times, load and date are
    the README's, in its demo line and its figures table."""
    import re

    header = "\n".join(line.lstrip("# ") for line in
                       (REPO / "pyxtts" / "configs" / "cpu_demo.yaml").read_text().splitlines()
                       if line.startswith("#"))
    found = re.search(r"\((\d+-\d+) s wall, (\d+-\d+) s CPU .*? at load\s+(\d\.\d-\d\.\d), "
                      r"`(/usr/bin/time -v pyxtts train --no-progress)`, (\d{4}-\d\d-\d\d)\)", header, flags=re.S)
    assert found, header
    wall, cpu, load, command, date = found.groups()
    readme = (REPO / "README.md").read_text()
    demo = re.search(r"- \*\*The demo\*\*(.*?)\n- ", readme, flags=re.S)
    row = next((line for line in readme.splitlines() if line.startswith("| CPU demo |")), None)
    assert demo and row, "the README's demo line and its figures row"
    line = " ".join(demo.group(1).split())
    assert f"{wall} s wall and {cpu} s of CPU time at load average {load}" in line, line
    assert f"`{command}`, {date})" in line, line
    assert f"{wall} s wall, {cpu} s CPU" in row and f"{date}, 2-core AMD EPYC, load {load}" in row, row


def shown_commands(text: str) -> list[tuple[str, str]]:
    """(command, its arguments) of every `pyxtts COMMAND ...` a page shows: inline code and
    the lines of its code blocks (continuations joined, comments dropped)."""
    import re

    shown = re.findall(r"`pyxtts ([a-z][a-z-]*)([^`]*)`", text)
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            for part in line.split("#")[0].split("&&"):
                shown += re.findall(r"pyxtts ([a-z][a-z-]*)(.*)", part)
    return shown


def test_the_docs_show_the_flags_each_command_has(capsys):
    """cli.md's lines for memtest and export left out --vocab, --checkpoint-dir and --config,
    which the commands take and the text below them describes. Each command's line in
    cli.md lists every flag it has, and every `pyxtts COMMAND --flag` of the README and
    docs/ is one COMMAND has."""
    import re

    import pyxtts.cli

    with pytest.raises(SystemExit):
        pyxtts.cli.main(["--version"])  # builds the parsers, then prints the version
    capsys.readouterr()
    flags = {cmd: set(by_dest.values()) - {"--help"} for cmd, by_dest in pyxtts.cli.CLI_FLAGS.items()}
    assert {"train", "prepare", "export", "memtest", "optimize-config", "gpu-info"} <= set(flags)
    cli = (REPO / "docs" / "cli.md").read_text()
    for cmd, have in flags.items():
        line = re.search(rf"^- `pyxtts {cmd}( [^`]*)?`", cli, flags=re.M)
        assert line, f"cli.md has no line for pyxtts {cmd}"
        listed = set(re.findall(r"--[a-z][a-z-]*", line.group(1) or ""))
        assert listed == have, (cmd, "not listed:", have - listed, "no such flag:", listed - have)
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for cmd, args in shown_commands(page.read_text()):
            if cmd in flags:
                unknown = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", args)) - flags[cmd] - {"--help"}
                assert not unknown, (page.name, f"pyxtts {cmd}", unknown)


def test_install_md_names_every_extra():
    """install.md's list of extras left out tensorboard and distributed."""
    import re

    project = (REPO / "pyproject.toml").read_text()
    section = project[project.index("[project.optional-dependencies]"):]
    section = section[:section.index("\n[", 1)]
    extras = set(re.findall(r"^([a-z]+) = \[", section, flags=re.M))
    assert {"prepare", "test", "distributed"} <= extras
    listed = set(re.findall(r"`'\.\[([a-z]+)\]'`", (REPO / "docs" / "install.md").read_text()))
    assert listed == extras, (extras - listed, listed - extras)


def test_the_docs_download_xtts_v2_with_a_command_huggingface_hub_has():
    """The README, coqui.md and the notebook said `huggingface-cli download`, which
    huggingface_hub deprecated for `hf` and no longer ships since 1.0: a new user's
    download failed. They say `hf download ... --local-dir`, which the CLI has."""
    import re

    pytest.importorskip("huggingface_hub")
    for path in (REPO / "README.md", REPO / "docs" / "coqui.md", REPO / "notebooks" / "MyXTTSTrain.ipynb"):
        text = path.read_text()
        assert "huggingface-cli" not in text, path.name
        assert re.search(r"hf download coqui/XTTS-v2 --local-dir XTTS-v2\b", text), path.name
    r = run_python("import sys\nfrom huggingface_hub.cli.hf import main\nsys.argv = ['hf', 'download', '--help']\nmain()")
    assert r.returncode == 0 and "--local-dir" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]


def test_eval_data_takes_the_output_folder_of_prepare(tmp_path):
    """`--eval-data more` (another prepare's output folder) was refused with a hint to load
    its train/; it takes its eval/ when it has one, else all its samples (recordings
    prepared for evaluation alone), and says which."""
    from pyxtts import ModelConfig, SyntheticDataset, write_shards

    model = ModelConfig(n_layers=1, d_model=32, n_heads=2, text_vocab_size=32, audio_vocab_size=40,
                        max_text_tokens=12, max_audio_tokens=24, n_cond_latents=0)
    write_shards(SyntheticDataset(model, 6, seed=0), tmp_path / "shards" / "train")
    write_shards(SyntheticDataset(model, 3, seed=2), tmp_path / "more" / "train")
    cfg = tiny_config(tmp_path, steps=2)
    run = ("train", "--config", str(cfg), "--no-progress", "--data", "shards", "--eval-data", "more")
    r = pyxtts_cli(tmp_path, *run)
    assert r.returncode == 0, r.stderr[-2000:]
    assert ("pyxtts train: --eval-data more is an output folder of pyxtts prepare: evaluating on more/train (it has "
            "no held-out split: all its samples)\n") in r.stderr and "eval loss" in r.stdout
    write_shards(SyntheticDataset(model, 2, seed=3), tmp_path / "more" / "eval")
    r = pyxtts_cli(tmp_path, *run, "--overwrite")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "evaluating on more/eval (its held-out split)\n" in r.stderr
