"""The command line: `pyxtts train` (the demo with no config, a config with data,
resume, refusals) and `pyxtts memtest` (plan vs a real step, verdicts, exit codes)."""
from __future__ import annotations

import json
import os
import time

import pytest

import pyxtts
import pyxtts.cli
from conftest import run_python
from pyxtts import SyntheticDataset, XTTSConfig, write_shards
from pyxtts.memtest import run_memtest

pytestmark = pytest.mark.usefixtures("no_limit_no_fault")

SMALL = {"model": {"n_layers": 2, "d_model": 64, "n_heads": 4, "text_vocab_size": 64, "audio_vocab_size": 97,
                   "max_text_tokens": 24, "max_audio_tokens": 48, "n_cond_latents": 0,
                   "conditioning": False},
         "training": {"learning_rate": 3e-3, "lr_schedule": "constant", "max_steps": 6, "epochs": None,
                      "checkpoint_interval": 3, "eval_interval": 3, "device": "cpu"},
         "data": {"batch_size": 4}}


def small_config(tmp_path, **training):
    d = json.loads(json.dumps(SMALL))
    d["training"].update(checkpoint_dir=str(tmp_path / "ckpt"), **training)
    path = tmp_path / "small.yaml"
    XTTSConfig.from_dict(d).save(path)
    return path


def train_log(folder):
    return [json.loads(line) for line in (folder / "train_log.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_demo_trains_in_under_3_minutes_and_the_loss_falls(tmp_path):
    """`python -m pyxtts` with no arguments: cpu_demo.yaml on the synthetic set."""
    t0 = time.perf_counter()
    r = run_python("import runpy; runpy.run_module('pyxtts', run_name='__main__')", timeout=600,
                   cwd=str(tmp_path))
    wall = time.perf_counter() - t0
    assert r.returncode == 0, r.stderr[-3000:]
    log = train_log(tmp_path / "checkpoints" / "cpu_demo")
    evals = [x["loss"] for x in log if x["type"] == "eval"]
    steps = [x for x in log if x["type"] == "train"]
    assert len(steps) == 600 and steps[-1]["step"] == 600
    assert evals[-1] < 0.1 * evals[0], evals  # ~7.0 (chance) -> ~0.03 measured
    assert "eval loss" in r.stderr and "trained 600 steps" in r.stdout
    assert (tmp_path / "checkpoints" / "cpu_demo" / "step_00000600.safetensors").exists()
    if not os.environ.get("PYXTTS_SANITIZED"):
        assert wall < 180, f"the demo took {wall:.0f} s"


def test_train_with_a_config_resume_and_refusals(tmp_path, capsys):
    cfg = small_config(tmp_path)
    ck = tmp_path / "ckpt"
    assert pyxtts.cli.main(["train", "--config", str(cfg), "--synthetic", "24", "--no-progress"]) == 0
    assert "trained 6 steps" in capsys.readouterr().out
    assert [x["step"] for x in train_log(ck) if x["type"] == "train"] == list(range(1, 7))
    # a second fresh run would overwrite the first: refused, with the way out named
    assert pyxtts.cli.main(["train", "--config", str(cfg), "--synthetic", "24", "--no-progress"]) == 2
    assert "--resume" in capsys.readouterr().err
    assert pyxtts.cli.main(["train", "--config", str(cfg), "--synthetic", "24", "--no-progress", "--resume",
                            "--max-steps", "9"]) == 0
    assert "trained 9 steps" in capsys.readouterr().out
    assert [x["step"] for x in train_log(ck) if x["type"] == "train"] == list(range(1, 10))
    # no data at all
    assert pyxtts.cli.main(["train", "--config", str(cfg), "--overwrite", "--no-progress"]) == 2
    assert "no training data" in capsys.readouterr().err
    assert pyxtts.cli.main(["train", "--config", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml" in capsys.readouterr().err
    assert pyxtts.cli.main(["train", "--config", str(cfg), "--synthetic", "8", "--max-steps", "0"]) == 2
    assert "max_steps" in capsys.readouterr().err


def test_train_from_shards(tmp_path, capsys):
    cfg = small_config(tmp_path, max_steps=3)
    model = XTTSConfig.load(cfg).model
    write_shards(SyntheticDataset(model, 20, seed=1).samples, tmp_path / "shards", samples_per_shard=8)
    write_shards(SyntheticDataset(model, 6, seed=2).samples, tmp_path / "eval", samples_per_shard=8)
    assert pyxtts.cli.main(["train", "--config", str(cfg), "--data", str(tmp_path / "shards"),
                            "--eval-data", str(tmp_path / "eval"), "--log", str(tmp_path / "log.jsonl")]) == 0
    out = capsys.readouterr()
    assert "eval loss" in out.out and "step 3: eval loss" in out.err
    log = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [x["step"] for x in log if x["type"] == "eval"] == [0, 3]
    # a sample over the model's maxima: refused before training, nothing truncated
    long = SyntheticDataset(model.__class__(**{**SMALL["model"], "max_text_tokens": 40, "max_audio_tokens": 80}),
                            4, min_text=30)
    write_shards(long.samples, tmp_path / "long")
    assert pyxtts.cli.main(["train", "--config", str(cfg), "--data", str(tmp_path / "long"), "--overwrite"]) == 2
    assert "never truncates" in capsys.readouterr().err


def test_memtest_plan_matches_a_real_step():
    report = run_memtest(XTTSConfig.load("cpu_demo"), batch_size=6, verbose=True)
    assert report.verdict == "fits"
    # the step's one arena is planned to the byte: measured == planned
    assert report.measured_peak == report.plan.total, (report.measured_peak, report.plan.total)
    assert "block   1" in report.text and "real step: peak allocated" in report.text
    assert pyxtts.memory_stats("cpu")["limit_bytes"] is None  # the budget was a temporary limit


def test_memtest_cli_verdicts(capsys):
    assert pyxtts.cli.main(["memtest", "--config", "cpu_demo"]) == 0
    out = capsys.readouterr().out
    assert "verdict: FITS" in out and "advice:" in out
    for row in ("parameters", "gradients (fp32)", "optimizer state", "saved activations", "total"):
        assert row in out
    # 20 MiB x max_memory_fraction 0.5 is under the plan: no step, exit 1, advice
    assert pyxtts.cli.main(["memtest", "--config", "cpu_demo", "--memory", "20MiB"]) == 1
    out = capsys.readouterr().out
    assert "DOES NOT FIT" in out and "real step: not run" in out and "advice: optimize_config" in out
    # the XTTS v2 GPT planned for a 12 GiB GPU, plan only (no step on this CPU)
    rc = pyxtts.cli.main(["memtest", "--config", "memory_optimized", "--memory", "12GiB", "--no-step",
                          "--device", "cpu"])
    out = capsys.readouterr().out
    assert rc == 0 and "30 layers x d 1024" in out and "real step" not in out
    # a budget the plan fits but a real step under it does not: the OOM is the verdict
    tight = run_memtest(XTTSConfig.load("cpu_demo"), memory=2 * 40 * 2**20, step=True)
    assert tight.verdict in ("fits", "tight")
    assert pyxtts.cli.main(["memtest", "--config", "nonexistent-tier"]) == 2
    assert "nonexistent-tier" in capsys.readouterr().err
    assert pyxtts.cli.main(["memtest", "--config", "cpu_demo", "--batch-size", "0"]) == 2
    assert "batch_size" in capsys.readouterr().err
